"""In-place execution (``graph.config.allow_in_place``, on by default).

pyflow's kernels allocate their outputs.  When an elementwise node's tensor
operand dies at that node, the node can write its result into the operand's
buffer instead: no new allocation, one buffer fewer alive at the peak, and
the result lands in memory that is already in cache.  In a training step the
typical case is the gradient sums (``grad_sum_*``, a Value read by several
ops gets the sum of their gradients), where both parts die at the sum; in an
inference graph, residual adds and the like.

An operand ``x`` of node ``n`` may be overwritten when (checked here, at
compile time):

- ``n`` is an add/sub/mul/div (a ``call`` of the elementwise Function with no
  backward node, or the autograd pass's ``fn`` gradient sum), or the
  ``slice_add`` of ``passes.slice_grad`` (into its first operand), whose
  result has ``x``'s shape and dtype (float32/float64, so no rounding step is
  skipped), and whose other operand is a number or a tensor of that dtype;
- ``x`` is made by a node (not a graph input, parameter or constant), is not
  returned by ``build()`` nor the loss, is not stored by ``set_grad`` or
  ``assign``, is read by ``n`` alone, once (actors may run the nodes of a
  graph in any order its edges allow, so "the last reader in program order"
  would not do), and no autograd context keeps it for a later backward node
  (the liveness of ``passes.memory``);

and, when the node runs (``executor.Step``), ``x``'s array must be writeable,
C-contiguous and alone: nothing else references it or the array it is a view
of (``sys.getrefcount``), so another view of the same memory (the q, k, v
slices of one qkv product, a reshape kept by an autograd context) is never
written through.  Otherwise the node allocates as usual.
"""
from ... import dtypes as _dt
from ... import ops
from ...ops import elementwise as _ew
from ..ir import Value, iter_values
from .memory import liveness
from .slice_grad import slice_add

__all__ = ["in_place", "liveness", "IN_PLACE_OPS"]

# the Functions / functions a node may run in place, and the kernel name
IN_PLACE_OPS = {_ew.Add: "add", _ew.Sub: "sub", _ew.Mul: "mul", _ew.Div: "div", ops.add: "add"}
_FLOATS = (_dt.float32, _dt.float64)


def _op_of(node):
    if node.kind == "fn" and node.target is slice_add:
        return "slice_add"
    if node.kind == "call" and node.target in IN_PLACE_OPS and node.target is not ops.add:
        return IN_PLACE_OPS[node.target]
    if node.kind == "fn" and node.target is ops.add:
        return "add"
    return None


def in_place(graph):
    """IR -> IR: eligible nodes get ``attrs["in_place"]``, the argument
    position whose buffer they may take."""
    last = liveness(graph)
    pinned = {v.id for v in graph.output_values()}
    if graph.backward is not None:
        pinned.update(v.id for v in iter_values(graph.backward))
    for node in graph.nodes:
        if node.kind in ("set_grad", "assign"):
            pinned.update(v.id for v in node.inputs)
    with_backward = {n.attrs["forward"] for n in graph.nodes if n.kind == "backward"}
    readers = graph.consumers()
    g = graph.copy()
    nodes, chosen = [], []
    for i, node in enumerate(graph.nodes):
        op = _op_of(node)
        slot = None
        operands = node.args[:2]            # slice_add(acc, grad, key): the first two
        if (op is not None and node.id not in with_backward and not node.kwargs
                and len(node.args) == (3 if op == "slice_add" else 2)
                and len(node.outputs) == 1
                and all(_same_type(a, node.outputs[0]) for a in operands)):
            out = node.outputs[0]
            reads = [v.id for v in node.inputs]
            for k, a in enumerate(operands[:1] if op == "slice_add" else operands):
                if (isinstance(a, Value) and a.kind == "node" and a.id not in pinned
                        and reads.count(a.id) == 1 and len(readers[a.id]) == 1
                        and last.get(a.id) == i
                        and a.shape == out.shape and a.dtype is out.dtype
                        and out.dtype in _FLOATS and a.device == out.device):
                    slot = k
                    break
        if slot is None:
            nodes.append(node)
            continue
        new = _copy(node)
        new.attrs = dict(node.attrs, in_place=slot, in_place_op=op)
        nodes.append(new)
        chosen.append(node.name)
    g.nodes = nodes
    g.history.append(("in_place", f"{len(chosen)} nodes write into a dying input"
                      + (f": {', '.join(chosen[:6])}" + (" ..." if len(chosen) > 6 else "")
                         if chosen else "")))
    return g


def _same_type(a, out):
    """An operand that leaves the result's dtype alone: a tensor of that dtype
    and device, or a Python number."""
    if isinstance(a, Value):
        return a.dtype is out.dtype and a.device == out.device
    return type(a) in (int, float)


def _copy(node):
    import copy
    return copy.copy(node)
