"""The logical IR of a traced graph: Values and Nodes, in program order.

A ``Value`` is one tensor of the computation: a graph input, a captured
``state`` tensor (parameters, buffers and any other tensor that existed before
tracing: read live at every run, never frozen), a ``const`` (made at compile
time by constant folding) or the output of a ``Node``.  Values are SSA: an
in-place op on a tensor makes a new Value, and an ``assign`` node writes it
back when the tensor is state.

A ``Node`` is one call.  Its ``kind`` says how the executor runs it:

=============  =================================================================
``call``       ``target.forward(ctx, *args)`` of an autograd ``Function``; the
               ctx is kept for the node's backward
``fn``         a plain function (comparisons, creation ops, ...): not
               differentiable
``backward``   ``target.backward(ctx, *grads)`` with the ctx of the forward
               node ``attrs["forward"]`` (added by the autograd pass)
``seed``       draws a fresh seed from a generator (dropout), once per run
``assign``     copies a Value into a state tensor (in-place updates,
               BatchNorm's running statistics)
``set_grad``   stores a parameter's gradient (``.grad``), or accumulates
               the gradient of a graph input that requires grad
               (``attrs["input"]``) into the tensor passed, as eager mode
``update``     the optimizer step (and LR scheduler step) of ``add_optimizer``
``box``        one step of a global tensor's boxing (``passes.sbp``): the
               boxing table's conversion on one placement axis
               (``boxing.run_step``), ``attrs["step"]`` a ``BoxingStep`` with its
               collective and the bytes each rank sends; the output is the
               same logical tensor in the SBP ``attrs["dst"]``
=============  =================================================================

A Value of a global tensor carries its layout: ``placement`` and ``sbp``
(one SBP per placement axis; both None for a local tensor), set by the
tracer from the traced tensors and by the passes that add Values.  A
``call`` node on global Values has its signature fixed at compile time
(``attrs["signature"]``: the placement and the chosen candidates, one per
placement axis) and reads inputs already in that signature's SBP: the
``box`` nodes before it convert them.

``args`` is a template: Python values as they were passed, with every tensor
replaced by its ``Value`` (also inside lists and tuples).

An in-place write to a graph input (``x.add_(1)`` on an argument of build())
is SSA like any other: later ops read the new Value.  What the caller sees
is the input's last Value written back into the tensor it passed, after
each run (``Graph.input_writes``; ``Plan.run`` does the copy): that comes
after every reader of the old contents, in every executor, and is one copy
per input however many in-place ops wrote it.  Passes never
mutate a Graph: each returns a new one (``Graph.copy``) and appends a line
to ``history`` saying what it changed, which ``explain`` prints.
"""
import copy
import itertools
from dataclasses import dataclass, field

_ids = itertools.count()


@dataclass(eq=False)
class Value:
    shape: tuple
    dtype: object
    device: object
    kind: str                      # "input", "state", "const" or "node"
    name: str = ""
    producer: object = None        # the Node making it (kind "node")
    tensor: object = None          # the live tensor of "state", the folded one of "const"
    requires_grad: bool = False    # an "input" whose gradient build()'s backward computes
    placement: object = None       # a global tensor's placement (None: local)
    sbp: tuple = None              # a global tensor's SBP, one per placement axis
    id: int = field(default_factory=lambda: next(_ids))

    @property
    def nbytes(self):
        n = 1
        for s in self.shape:
            n *= s
        return n * self.dtype.itemsize

    def __repr__(self):
        return f"%{self.name or self.id}"

    def describe(self):
        dims = "x".join(str(s) for s in self.shape) or "scalar"
        layout = ""
        if self.sbp is not None:
            layout = "(" + ", ".join(sbp_text(s) for s in self.sbp) + ")"
        return f"{self!r}:{self.dtype.name}[{dims}]{layout}"


def sbp_text(sbp):
    """S(d), B or P: one SBP as explain writes it."""
    if sbp.is_split:
        return f"S({sbp.dim})"
    return "B" if sbp.kind == "broadcast" else "P"


@dataclass(eq=False)
class Node:
    kind: str
    target: object
    args: tuple
    kwargs: dict
    outputs: list
    attrs: dict = field(default_factory=dict)
    name: str = ""
    id: int = field(default_factory=lambda: next(_ids))

    @property
    def inputs(self):
        """Every Value the node reads, in argument order (duplicates kept)."""
        return [v for v in iter_values((self.args, self.kwargs))]

    @property
    def op_name(self):
        if self.kind in ("call", "backward"):
            name = self.target.__name__
            return name + "Backward" if self.kind == "backward" else name
        if self.kind == "fn":
            return getattr(self.target, "__name__", str(self.target))
        if self.kind == "box":
            st = self.attrs["step"]
            return f"box[{sbp_text(st.src)}->{sbp_text(st.dst)} {st.op}, {st.bytes:,} bytes]"
        return self.kind

    @property
    def has_side_effect(self):
        return (self.kind in ("seed", "assign", "set_grad", "update")
                or bool(self.attrs.get("random")) or bool(self.attrs.get("writes")))

    @property
    def writes(self):
        """State Values this node writes (in place, when it runs)."""
        if self.kind == "assign":
            return [self.attrs["state"]]
        return list(self.attrs.get("writes", ()))

    def __repr__(self):
        outs = ", ".join(v.describe() for v in self.outputs)
        ins = ", ".join(repr(v) for v in self.inputs)
        return f"{outs or '()'} = {self.op_name}({ins})"


def iter_values(template):
    """The Values inside an args template (nested lists, tuples, dicts)."""
    return iter_instances(template, Value)


def iter_instances(obj, kind):
    """Every instance of ``kind`` inside ``obj`` (nested lists, tuples, dicts)."""
    if isinstance(obj, kind):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            yield from iter_instances(o, kind)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from iter_instances(o, kind)


def substitute(template, lookup):
    """``template`` with every Value replaced by ``lookup(value)``."""
    if isinstance(template, Value):
        return lookup(template)
    if isinstance(template, list):
        return [substitute(t, lookup) for t in template]
    if isinstance(template, tuple):
        return rebuild_tuple(template, [substitute(t, lookup) for t in template])
    if isinstance(template, dict):
        return {k: substitute(t, lookup) for k, t in template.items()}
    return template


def compile_substitute(template, fetch):
    """``fill(values)``: ``template`` with every Value ``v`` replaced by
    ``fetch(v)(values)``, like ``substitute`` but with the walk over the
    template's structure done once, here, instead of at every call (a graph
    step fills its op's arguments once per run: ResNet-50, 760 of them).
    ``fetch(v)`` returns the function of ``values`` that gives ``v``."""
    if isinstance(template, Value):
        return fetch(template)
    if not any(True for _ in iter_values(template)):
        return lambda values: template
    if isinstance(template, dict):
        keys = list(template)
        parts = [compile_substitute(template[k], fetch) for k in keys]
        return lambda values: {k: p(values) for k, p in zip(keys, parts)}
    # a list or tuple: its constants copied, its Values (and nested templates) filled
    filled = [any(True for _ in iter_values(t)) for t in template]
    consts = [None if f else t for t, f in zip(template, filled)]
    slots = [(i, compile_substitute(t, fetch)) for i, (t, f) in enumerate(zip(template, filled))
             if f]

    def fill(values):
        items = consts.copy()
        for i, part in slots:
            items[i] = part(values)
        return items
    if isinstance(template, list):
        return fill
    if type(template) is tuple:
        return lambda values: tuple(fill(values))
    return lambda values: rebuild_tuple(template, fill(values))


def rebuild_tuple(original, items):
    """A tuple of ``items`` of ``original``'s type (namedtuples, pyflow.Size)."""
    kind = type(original)
    if kind is tuple:
        return tuple(items)
    if hasattr(kind, "_fields"):
        return kind(*items)
    return kind(items)


@dataclass
class Graph:
    """A traced program: nodes in an order that respects every dependency."""
    nodes: list
    inputs: list                   # Values of build()'s tensor arguments
    outputs: object                # build()'s return value as a template
    state: list                    # captured tensors (kind "state")
    backward: tuple = None         # (loss Value, grad Value or None) from loss.backward()
    history: list = field(default_factory=list)
    memory: object = None          # the MemoryPlan of passes.memory
    # positions in ``inputs`` that build() wrote in place; when not empty,
    # ``outputs`` is (build()'s return value, (their last Values, in order))
    input_writes: tuple = ()

    def copy(self):
        """A shallow copy: new node list, shared Values and Nodes (passes
        replace nodes rather than editing them)."""
        g = copy.copy(self)
        g.nodes = list(self.nodes)
        g.history = list(self.history)
        return g

    def output_values(self):
        return list(iter_values(self.outputs))

    def consumers(self):
        """{value id: [nodes reading it]}"""
        users = {}
        for n in self.nodes:
            for v in n.inputs:
                users.setdefault(v.id, []).append(n)
        return users

    def returned(self):
        """build()'s return value as a template (without the input write-backs)."""
        return self.outputs[0] if self.input_writes else self.outputs

    def __str__(self):
        lines = [f"graph(inputs: {', '.join(v.describe() for v in self.inputs) or 'none'})"]
        lines += [f"  {n!r}" for n in self.nodes]
        outs = ", ".join(repr(v) for v in iter_values(self.returned()))
        lines.append(f"  return {outs}")
        if self.input_writes:
            lines += [f"  write back {v!r} -> {self.inputs[i]!r}"
                      for i, v in zip(self.input_writes, self.outputs[1])]
        return "\n".join(lines)
