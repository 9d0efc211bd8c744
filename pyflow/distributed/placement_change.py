"""Moving a global tensor to another placement (other ranks, another order,
another hierarchy): ``to_global(placement=...)`` with a placement that is not
the tensor's own.

The source ranks box the tensor to broadcast, then each destination rank
that lacks the data receives only its piece from one source rank (``_move``);
``move_header`` first tells destination ranks outside the source the
logical shape and dtype.  ``PlacementChange`` makes the move differentiable:
its backward is the reverse move of the gradient.  Kept apart from
``global_tensor.py`` because it is point-to-point traffic on the world
communicator, not boxing within one placement.
"""
import numpy as np

from pyflow import dtypes as _dt
from pyflow.autograd import Function
from pyflow.ops.creation import tensor, zeros

from . import boxing as _boxing
from .pieces import DTYPE_CODES, dual, empty_piece, label, local_alias
from .sbp import broadcast, partial_sum

# Tags of the point-to-point messages of a placement change (world communicator).
_MOVE_META_TAG, _MOVE_DATA_TAG = 32001, 32002
_MOVE_META_LEN = 3 + 64


def _is_zero_piece(sbp, coords):
    return any(s == partial_sum and c != 0 for s, c in zip(sbp, coords))


def _senders(src, dst):
    """{destination rank outside ``src``: the source rank that feeds it} (round-robin)."""
    src_ranks = src.flat_ranks
    receivers = [r for r in dst.flat_ranks if r not in src_ranks]
    return {r: src_ranks[k % len(src_ranks)] for k, r in enumerate(receivers)}


def move_header(x, dst, requires_grad):
    """(logical shape, dtype, requires_grad) of global tensor ``x`` on every rank of
    its placement and of ``dst`` (a 67-int64 message to each destination rank
    outside the source); None elsewhere."""
    from pyflow.comm import world   # here, not at the top: importing MPI costs ~1 s
    src, me = x._placement, world().rank
    senders = _senders(src, dst)
    if src.comm is not None:
        shape = tuple(x._logical_shape)
        if len(shape) > _MOVE_META_LEN - 3:
            raise ValueError(f"to_global: a placement change supports up to "
                             f"{_MOVE_META_LEN - 3} dims, got shape {shape}")
        header = np.zeros(_MOVE_META_LEN, np.int64)
        header[:3] = DTYPE_CODES[x.dtype.name], requires_grad, len(shape)
        header[3:3 + len(shape)] = shape
        works = [world().isend(tensor(header), r, _MOVE_META_TAG)
                 for r, s in senders.items() if s == me]
        for w in works:
            w.wait()
        return shape, x.dtype, requires_grad
    if me in senders:
        header = world().recv(zeros(_MOVE_META_LEN, dtype=_dt.int64), senders[me],
                              _MOVE_META_TAG)._data
        return (tuple(int(v) for v in header[3:3 + header[2]]), _dt.ALL[int(header[0])],
                bool(header[1]))
    return None, None, False


def _move(x, src, src_sbp, dst, dst_sbp, shape, dtype):
    """Move a global tensor of logical ``shape`` and ``dtype`` from (``src``,
    ``src_sbp``) to (``dst``, ``dst_sbp``); ``x`` is this rank's piece as a
    *local* tensor.  Returns the new piece, or None on ranks outside ``dst``.

    1. On ``src``: box to broadcast on every axis, so each source rank holds the
       whole tensor (``describe_nd(src_sbp -> B...)`` bytes per source rank).
    2. A ``dst`` rank that is also in ``src`` cuts its piece out locally; every
       other ``dst`` rank receives *only its piece* (its local-shape bytes;
       nothing for a partial_sum zero piece) from one source rank, the source
       ranks taking the receivers round-robin (``isend``/``recv`` on the world).
    Collective over the ranks of both placements (and no one else)."""
    from pyflow.comm import world   # here, not at the top: importing MPI costs ~1 s
    w = world()
    me = w.rank
    senders = _senders(src, dst)
    full, works = None, []
    if src.comm is not None:
        full = _boxing.box(x, src, src_sbp, (broadcast,) * src.ndim)
        for r, s in senders.items():
            coords = dst.coords(r)
            if s == me and not _is_zero_piece(dst_sbp, coords):
                piece = _boxing.slice_piece(full, dst, dst_sbp, coords).contiguous()
                works.append(w.isend(piece, r, _MOVE_DATA_TAG))
    out = None
    if dst.comm is not None:
        coords = dst.coords(me)
        if full is not None:
            out = _boxing.slice_piece(full, dst, dst_sbp, coords)
        else:
            out = zeros(_boxing.local_shape(shape, dst, dst_sbp, fn="to_global"), dtype=dtype,
                        device=dst.type)
            if not _is_zero_piece(dst_sbp, coords):
                w.recv(out, senders[me], _MOVE_DATA_TAG)
    for work in works:
        work.wait()
    return out


class PlacementChange(Function):
    """Same logical value on another placement (and maybe another SBP).  Backward:
    the reverse change of the gradient, which arrives on ``dst`` in its own SBP (a
    local gradient is the piece of the dual layout) and leaves on ``src`` in the
    dual of ``src_sbp``.  Both directions are collective over both placements:
    every rank of them must run the backward (a rank whose piece is empty too;
    ``to_global`` gives a destination rank outside the source a stand-in input
    that requires grad, so it records this node when the source requires grad)."""
    handles_global = True

    @staticmethod
    def forward(ctx, x, src, src_sbp, dst, dst_sbp, shape, dtype):
        out = _move(local_alias(x), src, src_sbp, dst, dst_sbp, shape, dtype)
        ctx.meta = (src, src_sbp, dst, dst_sbp, shape, dtype)
        if out is None:
            return label(empty_piece(x), dst, dst_sbp, ())
        return label(out, dst, dst_sbp, shape)

    @staticmethod
    def backward(ctx, grad):
        src, src_sbp, dst, dst_sbp, shape, dtype = ctx.meta
        g_sbp = grad._sbp if grad._placement is not None else tuple(dual(s) for s in dst_sbp)
        want = tuple(dual(s) for s in src_sbp)
        g = _move(local_alias(grad), dst, g_sbp, src, want, shape, grad.dtype)
        nones = (None,) * 6
        if g is None:
            return (label(empty_piece(grad), src, want, ()),) + nones
        return (label(g, src, want, shape),) + nones
