"""Elementwise fusion: a chain (or small DAG) of elementwise ops becomes one
``call`` node running one generated kernel, forward and backward.

Eager mode runs ``gelu(x * w + b) * 0.5 + x`` as four kernels, each reading
and writing a whole tensor, and its backward as several more.  Elementwise
work is memory-bound, so one pass over the data that computes the whole
expression in registers does the same math for a fraction of the traffic.

The pass runs on the traced forward graph, *before* the autograd pass: the
fused node is an ordinary ``call`` of an autograd ``Function``
(``FusedElementwise``, one subclass per expression shape, named like
``Fused[mul+add+gelu+mul+add]``), so the autograd pass gives it one
``backward`` node like any other op.

What fuses (``candidate``): ``call`` nodes of the elementwise Functions of
``pyflow/ops/elementwise.py`` that have a scalar definition
(add, sub, mul, div, pow with a number exponent, maximum, minimum and the
unary math/activations in ``kernels/cpu/fused.FORWARD_OPS``), on float32 or
float64 tensors, all of one dtype and device, with tensors of any
broadcastable shapes or Python numbers as operands.  float16/bfloat16 are
left alone: eager computes them in float32 with a rounding after every op,
which a fused kernel would not reproduce.

Groups (``find_groups``): walking the nodes backwards, a candidate joins the
group of its consumers when its output is read by nothing else (all its
readers are in that one group) and is not a graph output or the loss; groups
only grow by their producers, so each group has exactly one result, made by
its last node, and the fused node takes that node's place and output Value.
Groups of one node stay as they are.

The fused ``Function`` (``FusedElementwise`` in ``pyflow/ops/fused.py``, an op
like any other, which ``F.fused_bias_add_gelu`` calls in eager mode too): ``forward`` calls
``kernel("fused_elementwise", device)(expr, *operands)`` (the expression is a
hashable tuple, see ``kernels/cpu/fused.py``; numbers are operands too, so a
graph's constants do not compile kernels of their own).  It saves only the
external inputs; ``backward`` recomputes the intermediates inside one
generated gradient kernel per input that needs a gradient (reverse mode on
the expression, with the same derivative rules as the eager ops), then sums
broadcast dimensions (``unbroadcast``).  The backward is not differentiable
again: asking for it (``create_graph=True``) raises a clear error.
"""
from ... import dtypes as _dt
from ...ops import elementwise as _ew
from ...ops.fused import FusedElementwise, fused_function
from ..ir import Node, Value

__all__ = ["fuse_elementwise", "find_groups", "candidate", "FusedElementwise",
           "fused_function"]

_BINARY = {_ew.Add: "add", _ew.Sub: "sub", _ew.Mul: "mul", _ew.Div: "div",
           _ew.Maximum: "maximum", _ew.Minimum: "minimum", _ew.Pow: "pow"}
_UNARY = ("neg", "exp", "log", "sqrt", "rsqrt", "abs", "sin", "cos", "tanh", "sigmoid", "relu",
          "gelu", "gelu_tanh", "silu", "reciprocal")
_FLOATS = (_dt.float32, _dt.float64)


def _is_number(a):
    return type(a) in (int, float)       # bool and NumPy scalars may change the dtype


def candidate(node):
    """The op name of a fusable node, or None."""
    if node.kind != "call" or node.kwargs or len(node.outputs) != 1 \
            or node.attrs.get("tuple_output") or node.attrs.get("non_differentiable"):
        return None
    target = node.target
    if target in _BINARY:
        name = _BINARY[target]
        if len(node.args) != 2:
            return None
        if name in ("maximum", "minimum") and not all(isinstance(a, Value) for a in node.args):
            return None                  # their eager backward saves both as tensors
        if name == "pow" and not (isinstance(node.args[0], Value) and _is_number(node.args[1])):
            return None                  # a tensor exponent needs log(a) in the gradient
    elif isinstance(target, type) and issubclass(target, _ew._Unary) and target.name in _UNARY:
        name = target.name
        if len(node.args) != 1:
            return None
    else:
        return None
    out = node.outputs[0]
    if out.dtype not in _FLOATS:
        return None
    values = [a for a in node.args if isinstance(a, Value)]
    if not values or any(not isinstance(a, Value) and not _is_number(a) for a in node.args):
        return None
    if any(v.dtype is not out.dtype or v.device != out.device for v in values):
        return None
    return name


def find_groups(graph):
    """Groups of fusable nodes, each a list of nodes in program order whose
    last node makes the group's only result."""
    users = graph.consumers()
    escaping = {v.id for v in graph.output_values()}
    if graph.backward is not None:
        escaping.update(v.id for v in _values(graph.backward))
    group_of, groups = {}, {}
    for node in reversed(graph.nodes):
        if candidate(node) is None:
            continue
        out = node.outputs[0]
        readers = users.get(out.id, [])
        root = None
        if readers and out.id not in escaping:
            roots = {group_of.get(r.id) for r in readers}
            if len(roots) == 1 and None not in roots:
                root = roots.pop()
                head = groups[root][0]
                if (out.dtype is not head.outputs[0].dtype or out.device != head.outputs[0].device
                        or node.attrs.get("grad_enabled") != head.attrs.get("grad_enabled")):
                    root = None
        if root is None:
            root = node.id
            groups[root] = []
        group_of[node.id] = root
        groups[root].append(node)
    order = {n.id: i for i, n in enumerate(graph.nodes)}
    return [sorted(members, key=lambda n: order[n.id])
            for members in groups.values() if len(members) >= 2]


def _values(template):
    from ..ir import iter_values
    return iter_values(template)


def _program(members):
    """(program, scalars, args): the expression of a group and its operands
    (Values, each once, and numbers), as the fused node's arguments."""
    args, scalars, index = [], [], {}
    produced = {n.outputs[0].id: j for j, n in enumerate(members)}
    raw = []
    for node in members:
        refs = []
        for a in node.args:
            if isinstance(a, Value) and a.id in produced:
                refs.append(("t", produced[a.id]))
                continue
            key = ("v", a.id) if isinstance(a, Value) else None
            if key is None or key not in index:
                if key is not None:
                    index[key] = len(args)
                refs.append(("a", len(args)))
                args.append(a)
                scalars.append(not isinstance(a, Value))
            else:
                refs.append(("a", index[key]))
        raw.append((candidate(node), refs))
    nargs = len(args)
    program = tuple((op, tuple(i if kind == "a" else nargs + i for kind, i in refs))
                    for op, refs in raw)
    return program, tuple(scalars), args


def fuse_elementwise(graph):
    """IR -> IR: every group of ``find_groups`` replaced by one fused ``call`` node."""
    groups = find_groups(graph)
    g = graph.copy()
    replace, drop, lines = {}, set(), []
    for members in groups:
        program, scalars, args = _program(members)
        cls = fused_function(program, scalars)
        last = members[-1]
        node = Node("call", cls, tuple(args), {}, [last.outputs[0]],
                    dict(grad_enabled=last.attrs.get("grad_enabled"), non_differentiable=(),
                         tuple_output=False, fused=tuple(n.name for n in members)),
                    name=f"fused_{last.name}")
        replace[last.id] = node
        drop.update(n.id for n in members[:-1])
        lines.append(f"{node.name} = {cls.__name__}")
    g.nodes = [replace.get(n.id, n) for n in graph.nodes if n.id not in drop]
    n_fused = sum(len(m) for m in groups)
    g.history.append(("fuse_elementwise",
                      f"fused {n_fused} nodes into {len(groups)} kernels"
                      + (": " + ", ".join(lines[:6]) + (" ..." if len(lines) > 6 else "")
                         if lines else "")))
    return g
