"""Ops on global tensors: deduce an SBP signature, box the inputs, run the op on
the pieces, label the outputs.

Eager mode does all four at every call (``forward_global``); a compiled
graph does the first two once, at compile time (``pyflow.graph.passes.sbp``:
the signature kept in the node, ``box`` nodes before it), and its steps run
only the last two (``forward_pieces``, and ``backward_pieces`` for the
backward).  Both paths share those functions, so there is one implementation
of running an op on pieces.

``Function.apply`` sends every call that has a global tensor argument here
(``apply_global``).  For each placement axis the op's rule
(``signatures.py``) lists the signatures it can run under; the one whose
input conversions send the fewest bytes wins (ties: the rule's order, which
puts splits first).  The inputs are converted with ``to_global`` (so the
conversions are recorded by autograd like any op), then ``_GlobalOp`` runs
the op's own ``forward`` on local aliases of the pieces and labels each
output with the signature's SBP and its logical shape.

Backward is the op's own ``backward`` on the pieces too, by a rule of SBP
algebra (OneFlow's): if the forward is valid under (ins -> outs), the
backward is valid with every SBP replaced by its *dual*, S(d) -> S(d),
B -> P, P -> B.  A replicated input's gradient comes out as a partial sum
(each rank's contribution), a partial-sum output's gradient must come in
replicated.  So ``_GlobalOp.backward`` boxes each incoming gradient to the
dual of its output's SBP, runs the op's backward on the pieces and labels
each input gradient with the dual of that input's SBP; the next op's
backward boxes again as it needs, and ``AccumulateGrad`` boxes a leaf's
gradient to the leaf's own SBP (``autograd._accumulate``).  Double backward
(``create_graph=True``) through global ops is not supported.

A local tensor among the arguments of a global op is taken as replicated
(the same on every rank): that is what the constants ops build inside
(masks, ``arange``) are.  A local tensor that requires grad is refused: its
gradient would have no SBP.
"""
import contextlib
import threading

from pyflow._hooks import HOOKS
from pyflow.autograd import Context, Function
from pyflow.ops.creation import zeros
from pyflow.ops.elementwise import mul
from pyflow.tensor import Tensor

from . import boxing as _boxing
from .global_tensor import dual, label, local_alias
from .sbp import broadcast
from .signatures import elementwise_rule, rule_for

__all__ = ["run_forward", "apply_global", "forward_global", "backward_global",
           "forward_pieces", "backward_pieces", "out_sbps", "GlobalContext", "dual", "label",
           "GlobalElementwise", "recording_signatures", "replaying"]


def _axis_sizes(placement):
    return tuple(placement.hierarchy)


def _logical_shape(piece_shape, sbp, sizes):
    shape = list(piece_shape)
    for s, n in zip(sbp, sizes):
        if s.is_split:
            shape[s.dim] *= n
    return tuple(shape)


# ---------------------------------------------------------------- deduction
def _cost(t, src, dst, n):
    if src == dst:
        return 0
    return _boxing.describe(src, dst, t.shape, t.dtype, n).bytes + 1   # +1: prefer no move


def _divisible(cand, tensors, n):
    for t, s in zip(tensors, cand.ins):
        if s.is_split and (s.dim >= t.ndim or t.shape[s.dim] % n):
            return False
    return True


_CHOSEN = {}          # (op, argument metadata, placement sizes) -> chosen candidates


def _key(fn_class, args, sbps, sizes):
    """A hashable description of a call (tensors by shape, dtype and SBP), or None."""
    parts, k = [fn_class, sizes], 0
    for a in args:
        if isinstance(a, Tensor):
            parts.append((tuple(a.shape), a.dtype, sbps[k]))
            k += 1
        else:
            parts.append(a)
    key = tuple(parts)
    try:
        hash(key)
    except TypeError:
        return None
    return key


def choose(fn_class, args, tensors, sbps, sizes):
    """Per placement axis, the cheapest candidate of ``fn_class``'s rule.  The
    choice depends only on the call's metadata, so it is cached: an op in a
    training loop deduces once."""
    key = _key(fn_class, args, sbps, sizes)
    chosen = _CHOSEN.get(key) if key is not None else None
    if chosen is None:
        chosen = deduce(fn_class, args, tensors, sbps, sizes)
        if key is not None and len(_CHOSEN) < 100_000:
            _CHOSEN[key] = chosen
    return chosen


def deduce(fn_class, args, tensors, sbps, sizes):
    cands = rule_for(fn_class)(args)
    chosen = []
    for axis, n in enumerate(sizes):
        best, best_cost = None, None
        for c in cands:
            if len(c.ins) != len(tensors) or not _divisible(c, tensors, n):
                continue
            cost = sum(_cost(t, s[axis], want, n) for t, s, want in zip(tensors, sbps, c.ins))
            if best is None or cost < best_cost:
                best, best_cost = c, cost
        if best is None:
            raise RuntimeError(f"{fn_class.__name__}: no SBP signature fits the inputs "
                               f"(shapes {[tuple(t.shape) for t in tensors]}, placement axis "
                               f"{axis} of size {n})")
        chosen.append(best)
    return chosen


# ---------------------------------------------------------------- the entry points
def run_forward(fn_class, args, kwargs):
    """``fn_class.forward`` once, not recorded by autograd: ``(out, ctx)``.  On
    the pieces under a deduced signature when an argument is global
    (``forward_global``, ctx a ``GlobalContext``), else plainly.  The graph's
    tracer and executor run every op through this one function; eager
    ``Function.apply`` makes the same test in its own loop over the arguments
    (its hot path) and comes here through ``apply_global``."""
    if not fn_class.handles_global:
        for a in args:
            if isinstance(a, Tensor) and a._placement is not None:
                return forward_global(fn_class, args, kwargs)
    ctx = Context()
    return fn_class.forward(ctx, *args, **kwargs), ctx


def apply_global(fn_class, args, kwargs):
    """``fn_class.apply(*args, **kwargs)`` where some argument is a global tensor:
    one autograd node (``_GlobalOp``) around ``forward_global``."""
    return _GlobalOp.apply(fn_class, kwargs, *args)


class GlobalContext:
    """What the backward of one op on global tensors needs: the op's own ctx
    (``inner``), the chosen signatures and the layouts.  The eager node keeps it,
    and a static graph passes it from the forward step to the backward step."""
    materialize_grads = False       # backward_global makes zeros of the piece shapes

    def __init__(self, fn, positions, chosen, placement, sizes):
        self.fn, self.positions, self.chosen = fn, positions, chosen
        self.placement, self.sizes = placement, sizes
        self.inner = self.in_sbps = self.in_shapes = self.out_sbps = self.out_pieces = None
        self.needs_input_grad = None
        self.non_differentiable = ()
        self.boxings = []               # (argument, from sbp, to sbp, shape, dtype)
        self.replayed = False           # run by a graph node under its recorded signature


def _placement_of(fn_class, args):
    placement = None
    for a in args:
        if isinstance(a, Tensor) and a._placement is not None:
            if placement is None:
                placement = a._placement
            elif a._placement != placement:
                raise RuntimeError(
                    f"{fn_class.__name__}: expected all global tensors on one placement, got "
                    f"{placement!r} and {a._placement!r}; move one with "
                    f".to_global(placement=...)")
    if placement.comm is None:
        raise RuntimeError(f"{fn_class.__name__}: this rank is not in the placement "
                           f"{placement!r} of its inputs")
    return placement


def _globals_of(fn_class, args):
    """``(placement, tensors, positions)`` of a call with a global argument: the
    tensor arguments (a local one labelled replicated, a view) and their positions."""
    placement = _placement_of(fn_class, args)
    whole = (broadcast,) * len(_axis_sizes(placement))
    tensors, positions = [], []
    for i, a in enumerate(args):
        if isinstance(a, Tensor):
            if a._placement is None:
                if a.requires_grad:
                    raise RuntimeError(
                        f"{fn_class.__name__}: argument {i} is a local tensor that requires "
                        f"grad, mixed with global tensors; make it global first with "
                        f".to_global(placement, sbp)")
                a = label(local_alias(a), placement, whole, a.shape)
            tensors.append(a)
            positions.append(i)
    return placement, tensors, positions


def forward_global(fn_class, args, kwargs):
    """The eager SBP dispatch: deduce (``choose``), box the inputs, then
    ``forward_pieces``.  Returns ``(outputs, GlobalContext)``.  The boxing is not
    recorded by autograd: it keeps the logical value, so the gradient that
    ``backward_global`` returns for a boxed input is a gradient of the original.
    A compiled graph does the first two at compile time (``passes.sbp``: the
    signature kept in the node, ``box`` nodes before it) and runs only
    ``forward_pieces``."""
    placement, tensors, positions = _globals_of(fn_class, args)
    chosen = choose(fn_class, args, tensors, [t._sbp for t in tensors], _axis_sizes(placement))
    if _REPLAY.recording is not None:       # a graph node recorded whole keeps the choice
        _REPLAY.recording.append((fn_class, placement, chosen))
    return _box_and_run(fn_class, args, kwargs, placement, chosen, tensors, positions)


def _box_and_run(fn_class, args, kwargs, placement, chosen, tensors, positions):
    local, boxings = list(args), []
    for j, (p, t) in enumerate(zip(positions, tensors)):
        want = tuple(c.ins[j] for c in chosen)
        if t._sbp != want:
            boxings.append((p, t._sbp, want, tuple(t.shape), t.dtype))
            t = t.to_global(sbp=want)
        local[p] = t
    out, g = forward_pieces(fn_class, local, kwargs, placement, chosen)
    g.boxings = boxings
    return out, g


def forward_pieces(fn_class, args, kwargs, placement, chosen):
    """``fn_class.forward`` on the pieces under the signature ``chosen`` (one
    candidate per placement axis), whose input SBPs the global arguments must
    already have (a local argument is a replicated one's piece): local aliases,
    the candidates' ``localize``, the op's forward, the mean's scale, and each
    output labelled with the signature's SBP and its logical shape.  No
    deduction, no boxing.  Returns ``(outputs, GlobalContext)``; the eager
    dispatch and a compiled graph's steps both run it."""
    sizes = _axis_sizes(placement)
    positions = [i for i, a in enumerate(args) if isinstance(a, Tensor)]
    g = GlobalContext(fn_class, positions, chosen, placement, sizes)
    g.n_args = len(args)
    local = list(args)
    g.in_sbps, g.in_shapes = [], []
    for j, p in enumerate(positions):
        t = args[p]
        want = tuple(c.ins[j] for c in chosen)
        if t._placement is not None and t._sbp != want:
            raise RuntimeError(f"{fn_class.__name__}: argument {p} has sbp {t._sbp}, but the "
                               f"fixed signature expects {want} (a compiled graph boxes it "
                               f"first: its box nodes and this node disagree)")
        g.in_sbps.append(want)
        g.in_shapes.append(tuple(t.shape))
        local[p] = local_alias(t)
    for c, n in zip(chosen, sizes):
        if c.localize is not None:
            local = list(c.localize(local, n))
    g.inner = inner = Context()
    out = fn_class.forward(inner, *local, **kwargs)
    single = not isinstance(out, tuple)
    outs = (out,) if single else out
    f = _scale(g)
    if f is not None:
        outs = tuple(_times(o, f) for o in outs)
    g.out_sbps = out_sbps(chosen, len(outs))
    g.out_pieces = [(o._data.shape, o.dtype, o.device) for o in outs]
    labelled = []
    for o, sbp in zip(outs, g.out_sbps):
        piece = local_alias(o)      # never label an object the op saved for backward
        labelled.append(label(piece, placement, sbp, _logical_shape(o._data.shape, sbp, sizes)))
    if inner.non_differentiable:
        g.non_differentiable = tuple(lo for lo, o in zip(labelled, outs)
                                     if any(o is n for n in inner.non_differentiable))
    return (labelled[0] if single else tuple(labelled)), g


def out_sbps(chosen, n_outputs):
    """The SBP of each of ``n_outputs`` outputs under the signature ``chosen``."""
    return [tuple(c.outs[min(k, len(c.outs) - 1)] for c in chosen) for k in range(n_outputs)]


def backward_global(g, grads):
    """The eager backward of a global op: each output gradient boxed to the dual
    of its output's SBP (a local gradient is taken as that piece already), then
    ``backward_pieces``.  Returns one entry per argument of the op (None for
    non-tensors)."""
    return backward_pieces(g, _box_grads(g, grads))


def _box_grads(g, grads):
    boxed = []
    for grad, sbp in zip(grads, g.out_sbps):
        if grad is not None and grad._placement is not None:
            want = tuple(dual(s) for s in sbp)
            if grad._sbp != want:
                grad = grad.to_global(sbp=want)
        boxed.append(grad)
    return boxed


def backward_pieces(g, grads):
    """The op's backward on the pieces, the gradients already in the dual of
    their outputs' SBP (a compiled graph's box nodes put them there; a local
    gradient is that piece): each input gradient labelled with the dual of its
    input's SBP.  No boxing.  Returns one entry per argument of the op."""
    local_grads = []
    for grad, sbp, (shape, dtype, device) in zip(grads, g.out_sbps, g.out_pieces):
        if grad is None:
            local_grads.append(zeros(shape, dtype=dtype, device=device)
                               if g.inner.materialize_grads else None)
            continue
        if grad._placement is not None:
            want = tuple(dual(s) for s in sbp)
            if grad._sbp != want:
                raise RuntimeError(f"{g.fn.__name__}: an output gradient has sbp {grad._sbp}, "
                                   f"its backward on the pieces expects {want}")
            grad = local_alias(grad)
        local_grads.append(grad)
    f = _scale(g)
    if f is not None:
        local_grads = [None if x is None else _times(x, f) for x in local_grads]
    n_args = g.n_args
    # needs_input_grad is per argument of the op (autograd's and the graph's alike)
    needs = tuple(g.needs_input_grad) if g.needs_input_grad is not None else (True,) * n_args
    g.inner.needs_input_grad = (needs + (False,) * n_args)[:n_args]
    res = g.fn.backward(g.inner, *local_grads)
    res = res if isinstance(res, tuple) else (res,)
    out = [None] * n_args
    for p, sbp, shape in zip(g.positions, g.in_sbps, g.in_shapes):
        r = res[p] if p < len(res) else None
        if r is not None:
            out[p] = label(Tensor._make(r._data, r.dtype, r.device), g.placement,
                           tuple(dual(s) for s in sbp), shape)
    return tuple(out)


def _scale(g):
    """The factor the outputs carry (1/n for a mean over a split dim), or None."""
    f = None
    for c, n in zip(g.chosen, g.sizes):
        if c.scale == "mean":
            f = (f or 1.0) / n
    return f


def _times(t, f):
    return mul(t, f)


class _GlobalOp(Function):
    """The eager autograd node of one op on global tensors:
    ``_GlobalOp.apply(fn_class, kwargs, *args)``."""
    handles_global = True

    @staticmethod
    def forward(ctx, fn_class, kwargs, *args):
        queue = _REPLAY.queue
        if queue is None:
            out, ctx.g = forward_global(fn_class, args, kwargs)
        else:
            out, ctx.g = _forward_replayed(queue, fn_class, args, kwargs)
        if ctx.g.non_differentiable:
            ctx.mark_non_differentiable(*ctx.g.non_differentiable)
        return out

    @staticmethod
    def backward(ctx, *grads):
        g = ctx.g
        g.needs_input_grad = ctx.needs_input_grad[2:]
        if g.replayed:      # a graph's node: its gradients come boxed by box nodes
            return (None, None) + backward_pieces(g, _box_grads(g, grads))
        return (None, None) + backward_global(g, grads)


# ---------------------------------------------------------------- replay
# A graph node recorded whole (``recordable``: embedding with its host-side
# index checks) calls ops inside it, which reach the dispatch through
# ``Function.apply``.  The trace records the signatures those calls chose
# (``recording_signatures``) and each run of the node replays them in order
# (``replaying``): ``forward_pieces`` under the recorded choice, no deduction.
# Its inputs and gradients arrive in the recorded layouts (the graph's box
# nodes put them there), so nothing is boxed; an input in another layout
# would be boxed eagerly, as the op did in the trace.
class _ReplayState(threading.local):
    recording = None        # the trace's list of (fn_class, placement, chosen)
    queue = None            # a graph step's recorded signatures, consumed in order


_REPLAY = _ReplayState()


@contextlib.contextmanager
def recording_signatures():
    """Collect ``(fn_class, placement, chosen)`` of every global op deduced inside."""
    saved, _REPLAY.recording = _REPLAY.recording, []
    try:
        yield _REPLAY.recording
    finally:
        _REPLAY.recording = saved


@contextlib.contextmanager
def replaying(signatures):
    """Run the global ops inside under ``signatures`` (as recorded), in order."""
    saved, _REPLAY.queue = _REPLAY.queue, list(reversed(signatures))
    try:
        yield
    finally:
        _REPLAY.queue = saved


def _forward_replayed(queue, fn_class, args, kwargs):
    if not queue or queue[-1][0] is not fn_class:
        raise RuntimeError(f"{fn_class.__name__}: a graph node replays the global ops its "
                           f"trace recorded, and this call was not among them (an op whose "
                           f"calls depend on data?)")
    _, placement, chosen = queue.pop()
    tensors_placement, tensors, positions = _globals_of(fn_class, args)
    if tensors_placement != placement:
        raise RuntimeError(f"{fn_class.__name__}: recorded on {placement!r}, now called on "
                           f"{tensors_placement!r}")
    out, g = _box_and_run(fn_class, args, kwargs, placement, chosen, tensors, positions)
    g.replayed = True
    return out, g


def box_gradient(g, like):
    """The gradient ``g`` of the global leaf ``like`` in ``like``'s SBP: a local
    ``g`` is taken as the piece of the dual layout."""
    if g._placement is None:
        g = label(Tensor._make(g._data, g.dtype, g.device), like._placement,
                  tuple(dual(s) for s in like._sbp), like.shape)
    if g._sbp != like._sbp:
        g = g.to_global(sbp=like._sbp)
    return g



class GlobalElementwise(Function):
    """A non-differentiable elementwise op that is not a Function (comparisons,
    ``isinf``...) called on global tensors: ``forward(ctx, fn, *args)`` runs
    ``fn`` on the pieces under the elementwise signatures (``_hooks.recordable``
    with ``elementwise=True`` sends such calls here)."""

    sbp_rule = elementwise_rule()

    @staticmethod
    def forward(ctx, fn, *args, **kwargs):
        return fn(*args, **kwargs)

    @staticmethod
    def backward(ctx, *grads):
        return (None,) * (len(grads) + 1)


# The core's calls up to the SBP dispatch (pyflow/_hooks.py).
def _global_elementwise(fn, *args, **kwargs):
    # ``GlobalElementwise.apply`` looked up at each call, not bound once here: a
    # graph's tracer replaces ``Function.apply`` while it records, and must see
    # this call (else it would record the ``_GlobalOp`` inside, whose step would
    # deduce and box on every run)
    return GlobalElementwise.apply(fn, *args, **kwargs)


HOOKS.provide(apply_global=apply_global, box_gradient=box_gradient,
              global_elementwise=_global_elementwise)
