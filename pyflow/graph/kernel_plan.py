"""Kernel-level plans: a compiled step as straight-line kernel calls on arrays.

``make_steps`` (executor.py) turns each node into a ``Step`` that calls the
op's ``Function`` on Tensors, as eager mode does: a Context, a Tensor per
output, the argument filling and the grad-mode switch, every step, for every
op.  For ops whose kernels are cheap that is most of the time a step takes.
``kernel_steps`` lowers what it can one level further: a node whose op has an
entry in ``kernel_ops.RULES`` becomes one plain function over arrays, its
backward node too; every other node keeps its Step behind an adapter that
wraps arrays in Tensors and unwraps the results (so everything a graph does
keeps working: global tensors and box nodes, random ops, ops recorded whole,
``set_grad``, the optimizer update).

Values travel as: a graph input, the caller's Tensor; a node output, its
array (a global Value's: this rank's piece).  A lowered op reads a
parameter's current array inline (``p._data``, the piece of a global one: the
optimizer may replace it between steps) and a folded constant's array as a
constant.

Global tensors.  A call on global tensors has its SBP signature fixed at
compile time and its inputs boxed by box nodes (passes/sbp.py), so the op
runs on the pieces as they are: when no candidate of its signature translates
shape arguments to the piece or scales the outputs (a mean over a split dim),
``piece_node`` gives the same node over local Values of the pieces' shapes,
and the op's rule lowers that.  Box nodes, and the rest, run their Steps
(which MPI needs in program order on every rank: the straight line keeps it).

Buffers.  A lowered forward writes its output into a buffer of the plan
(``out=``) when one is free: a buffer is an arena of bytes, reused across
steps, handed to the next output that fits once the values living in it are
dead.  Dead means past the last reader of the value and of every value that
may share its memory, and past the backward node when the forward's saved
arrays include it (what ``Lowered.keeps`` declares, as ``passes.memory``
does with what a Function's context keeps).  Anything whose memory might
outlive the step (build()'s outputs, a parameter's ``.grad``, a state write)
or whose aliasing is unknown (a Step's outputs, a backward's, which may be
its input gradient itself) never gets one and shares no buffer it could
clobber: such outputs are counted as views of every input.  Buffers need the
nodes to run in graph order, one iteration at a time: the sequential
executor, or one chain actor holding every node (``plan.py`` checks, and
builds the plan without buffers otherwise).

Why straight-line code.  The sequential executor and each chain actor run the
plan as one generated Python function (``runtime.chains.straight_line``):
locals for values, one call per op.  A graph step then costs about what its
kernels cost plus a call each.
"""
import numpy as np

from ..distributed.boxing import local_shape
from ..distributed.pieces import label
from ..runtime.chains import ChainMemberError, straight_line
from ..runtime.runtime import actor_error
from ..tensor import Tensor
from .ir import Node, Value, substitute
from .kernel_ops import rule_for
from .passes.memory import contexts, liveness

FOREVER = 1 << 62


class KernelStep:
    """One node of a kernel-level plan.  It has a Step's interface for
    lowering.py (``name``, ``node``, ``kind``, ``feeds``, ``emits_ctx``,
    ``wants_ctx``; calling it returns a tuple) and ``actor_fn``: the function
    of its fed values (plus the ctx) returning None, one value or a tuple, as
    an actor's function does, with ``inline = (fn, template)`` for the
    straight-line code."""

    def __init__(self, step, fn, template, lowered):
        self.step = step
        self.node = step.node
        self.kind = step.kind
        self.feeds = step.feeds
        self.emits_ctx = step.emits_ctx
        self.wants_ctx = step.wants_ctx
        self.lowered = lowered          # True: kernel_ops; False: the Step, adapted
        self.n_out = len(step.node.outputs) + (1 if step.emits_ctx else 0)
        # what it reads and writes, by key: Value ids, ("ctx", forward node id)
        self.reads = [v.id for v in step.feeds] + (
            [("ctx", step.node.attrs["forward"])] if step.wants_ctx else [])
        self.writes = [v.id for v in step.node.outputs] + (
            [("ctx", step.node.id)] if step.emits_ctx else [])
        self.fn, self.template = fn, template
        fill = [_filler(item) for item in template]

        def actor_fn(*values):
            return fn(*[f(values) for f in fill])
        actor_fn.inline = (fn, template)
        actor_fn.__name__ = step.name
        self.actor_fn = actor_fn

    @property
    def name(self):
        return self.node.name

    def __call__(self, *values):
        res = self.actor_fn(*values)
        if self.n_out == 0:
            return ()
        return (res,) if self.n_out == 1 else tuple(res)


def _filler(item):
    if type(item) is int:
        return lambda values: values[item]
    if item[0] == "data":
        k = item[1]
        return lambda values: values[k]._data
    if item[0] == "attr":
        obj, name = item[1], item[2]
        return lambda values: getattr(obj, name)
    value = item[1]
    return lambda values: value


# ------------------------------------------------------------------ adapters
def _adapted(step):
    """The Step as a function of arrays: node values are wrapped in Tensors for
    it (a global one labelled with its layout) and its Tensor results
    unwrapped to their arrays (a global one's piece)."""
    wraps = [_wrapper(v) if v.kind == "node" and v.device is not None else None
             for v in step.feeds]                                   # (a seed: no device)
    n_out = len(step.node.outputs) + (1 if step.emits_ctx else 0)
    wants = step.wants_ctx

    def run(*values):
        args = [a if w is None else w(a) for a, w in zip(values, wraps)]
        if wants:
            args.append(values[-1])
        res = step(*args)
        out = [r._data if isinstance(r, Tensor) else r for r in res[:len(step.node.outputs)]]
        if step.emits_ctx:
            out.append(res[-1])
        if n_out == 0:
            return None
        return out[0] if n_out == 1 else tuple(out)
    template = list(range(len(step.feeds) + (1 if wants else 0)))
    return run, template


def _wrapper(v):
    """The function wrapping an array of Value ``v`` in a Tensor (for a global
    Value: its piece, labelled with ``v``'s placement, SBP and logical shape)."""
    make, dtype, device = Tensor._make, v.dtype, v.device
    if v.placement is None:
        return lambda a: make(a, dtype, device)
    placement, sbp, shape = v.placement, v.sbp, tuple(v.shape)
    return lambda a: label(make(a, dtype, device), placement, sbp, shape)


def piece_node(node):
    """A node over the pieces: ``node`` (a call on global tensors whose signature
    is fixed) with every global Value replaced by a local Value of its piece's
    shape (the same id), when the op runs on the pieces as they are (no
    candidate translates shape arguments or scales the outputs); else None.
    A local node is returned as it is."""
    sig = node.attrs.get("signature")
    if sig is None:
        return node
    if sig[0] is not node.target or any(c.localize is not None or c.scale is not None
                                        for c in sig[2]):
        return None
    return _on_pieces(node)


def _on_pieces(node):
    def piece(v):
        if not isinstance(v, Value) or v.placement is None:
            return v
        return Value(local_shape(v.shape, v.placement, v.sbp), v.dtype, v.device, v.kind,
                     v.name, v.producer, v.tensor, v.requires_grad, id=v.id)
    attrs = {k: a for k, a in node.attrs.items() if k != "signature"}
    return Node(node.kind, node.target, substitute(node.args, piece),
                substitute(node.kwargs, piece), [piece(v) for v in node.outputs], attrs,
                node.name, node.id)


def _template(node, feeds, wants_ctx, args):
    """How each positional argument of a lowered function is read: the fed
    value (``._data`` of a graph input), a state tensor's current array, a
    constant's array; then the ctx."""
    index = {v.id: i for i, v in enumerate(feeds)}
    out = []
    for a in args:
        if a is None:
            out.append(("const", None))
        elif a.kind == "state":
            out.append(("attr", a.tensor, "_data"))
        elif a.kind == "const":
            out.append(("const", a.tensor._data))
        elif a.kind == "input":
            out.append(("data", index[a.id]))
        else:
            out.append(index[a.id])
    if wants_ctx:
        out.append(len(feeds))
    return out


# ------------------------------------------------------------------ buffers
class _Buffers:
    """The plan's arenas: byte arrays handed out best-fit to outputs whose
    holder (a root value) has died."""

    def __init__(self):
        self.arenas, self.holder, self.death = [], [], {}

    def offer(self, value, now):
        nbytes = value.nbytes
        free = [b for b, r in enumerate(self.holder) if self.death[r] < now
                and self.arenas[b].nbytes >= nbytes]
        if free:
            b = min(free, key=lambda k: self.arenas[k].nbytes)
        else:
            b = len(self.arenas)
            self.arenas.append(np.empty(nbytes, np.uint8))
            self.holder.append(None)
        self.holder[b] = value.id
        arr = self.arenas[b][:nbytes].view(value.dtype.storage).reshape(value.shape)
        return b, arr

    @property
    def nbytes(self):
        return sum(a.nbytes for a in self.arenas)


def _kept_by_lowered(node, low):
    ids = set()
    for k in low.keeps:
        if k.startswith("in"):
            ids.add(node.args[int(k[2:])].id)
        else:
            ids.add(node.outputs[int(k[3:])].id)
    return ids


def _no_buffer(i):
    return None


def kernel_steps(graph, steps, pool=True):
    """(KernelSteps, bytes of buffers) for ``steps`` (make_steps of ``graph``).
    ``pool``: lowered forwards write into the plan's reused buffers."""
    nodes = graph.nodes
    trial = {}                  # forward node id -> (rule, Lowered) without buffers
    pieces = {}                 # node id -> the node over the pieces (piece_node)
    for st in steps:
        node = st.node
        if node.kind not in ("call", "fn") or not node.outputs or node.attrs.get("replay"):
            continue
        node = piece_node(node)
        rule = rule_for(node) if node is not None else None
        low = rule(node, _no_buffer, st.emits_ctx) if rule is not None else None
        if low is not None and (not st.emits_ctx or low.backward is not None):
            trial[node.id] = (rule, low)
            pieces[node.id] = node

    kept = dict(contexts(graph))
    for nid, (_, low) in trial.items():
        kept[nid] = (_kept_by_lowered(pieces[nid], low), 0, {})
    last = liveness(graph, kept)
    for v in graph.output_values():
        last[v.id] = FOREVER
    for node in nodes:
        if node.kind in ("set_grad", "assign"):
            for v in node.inputs:
                last[v.id] = FOREVER

    buffers = _Buffers()
    roots = {}                  # value id -> ids of the values whose memory it may share
    lowered_fwd = {}            # forward node id -> its final Lowered
    out = []
    for i, st in enumerate(steps):
        node = pieces.get(st.node.id, st.node)
        pooled = set()
        if node.id in trial:
            rule = trial[node.id][0]

            def offer(j, node=node, i=i):
                v = node.outputs[j]
                if not pool or last.get(v.id, i) >= FOREVER or v.nbytes == 0:
                    return None
                b, arr = buffers.offer(v, i)
                pooled.add(j)
                return arr
            low = rule(node, offer, st.emits_ctx)
            lowered_fwd[node.id] = low
            args = [a for a in node.args if isinstance(a, Value)]
            ks = KernelStep(st, low.forward, _template(node, st.feeds, False, args), True)
        elif node.kind == "backward" and node.attrs["forward"] in lowered_fwd:
            low = lowered_fwd[node.attrs["forward"]]
            if any(v.placement is not None for v in node.outputs):
                node = _on_pieces(node)         # the gradients' pieces, as the forward's
            fn = low.backward(node, _no_buffer)
            ks = KernelStep(st, fn, _template(node, st.feeds, True, list(node.args)), True)
        else:
            fn, template = _adapted(st)
            ks = KernelStep(st, fn, template, False)
        fresh = node.id in trial and not getattr(trial[node.id][0], "views", False)
        for j, v in enumerate(node.outputs):
            if j in pooled or fresh:
                roots[v.id] = {v.id}
            else:
                roots[v.id] = {v.id}.union(*[roots.get(u.id, ()) for u in node.inputs])
            for r in roots[v.id]:
                buffers.death[r] = max(buffers.death.get(r, i), last.get(v.id, i))
        out.append(ks)
    return out, buffers.nbytes


# ------------------------------------------------------------------ running
def sequential_function(graph, units):
    """build()'s step as one straight-line function of the graph's input
    tensors, returning the arrays (or Tensors) of ``graph.output_values()``.
    ``units``: KernelSteps in order, or anything with their ``name``,
    ``actor_fn``, ``reads`` and ``writes`` (a CUDA graph's Segment)."""
    slot = {v.id: i for i, v in enumerate(graph.inputs)}
    n = len(slot)
    members, readers = [], {}
    for k, unit in enumerate(units):
        ins = [slot[key] for key in unit.reads]
        first = n if unit.writes else None
        for key in unit.writes:
            slot[key] = n
            n += 1
        for s in ins:
            readers[s] = k
        for s in range(first if first is not None else n, n):
            readers.setdefault(s, k)        # never read: dropped where it is made
        members.append([unit.name, unit.actor_fn, tuple(ins), first, len(unit.writes), ()])
    outs = tuple(slot[v.id] if v.kind in ("input", "node") else None
                 for v in graph.output_values())
    keep = set(outs)
    drops = {}
    for s, k in readers.items():
        if s not in keep:
            drops.setdefault(k, []).append(s)
    for k, m in enumerate(members):
        m[5] = tuple(drops.get(k, ()))
    live_outs = tuple(s for s in outs if s is not None)
    return straight_line([tuple(m) for m in members], len(graph.inputs), live_outs)


def as_tensor(v, x):
    """A graph value ``x`` of Value ``v`` as build() returns it: arrays of node
    values wrapped in Tensors (a global one's piece labelled); state and
    constants as their tensors."""
    if v.kind in ("state", "const"):
        return v.tensor
    if isinstance(x, Tensor) or v.device is None:
        return x
    return _wrapper(v)(x)


def outputs_of(graph, values):
    """build()'s outputs from the values of ``graph.output_values()`` (the
    entries for state and constant Values are ignored)."""
    env = {v.id: x for v, x in zip(graph.output_values(), values)}
    return substitute(graph.outputs, lambda v: as_tensor(v, env.get(v.id)))


def run_sequential(plan, inputs, as_actor_error=False):
    """One run of the kernel-level plan on ``inputs`` (the graph's input tensors).
    An op's exception comes out as it was raised or, with ``as_actor_error``
    (a plan of the actor executor run in order), as the actor runtime's
    ActorError naming the op."""
    fn = plan.sequential_function()
    try:
        res = fn(*inputs)
    except ChainMemberError as e:
        if as_actor_error:
            raise actor_error(e.op, "compute", e, 0) from e.exc
        raise e.exc.with_traceback(e.exc.__traceback__) from None
    graph = plan.graph
    values = [v for v in graph.output_values()]
    live = [v for v in values if v.kind in ("input", "node")]
    got = iter((res,) if len(live) == 1 else res)
    return outputs_of(graph, [next(got) if v.kind in ("input", "node") else None
                              for v in values])


def summary(plan):
    """What ``explain`` says about the kernel-level plan the task graph runs."""
    ksteps = plan.runnable_steps()
    low = [k for k in ksteps if k.lowered]
    rest = {}
    for k in ksteps:
        if not k.lowered:
            rest[k.node.op_name] = rest.get(k.node.op_name, 0) + 1
    kinds = sorted({k.node.op_name for k in low})
    text = (f"kernel plan: {len(low)} of {len(ksteps)} nodes run as kernels on arrays "
            f"({', '.join(kinds) or 'none'}); {plan.buffer_bytes:,} bytes of buffers reused "
            f"across steps")
    if rest:
        text += "\n  through their Tensor-level steps: " + ", ".join(
            f"{n} x{c}" if c > 1 else n for n, c in sorted(rest.items()))
    return text
