"""Global tensors: a local pyflow Tensor (this rank's piece) + placement + SBP.

Design (the simplest honest one): a global tensor *is* a pyflow ``Tensor``
whose data is this rank's piece, with ``_placement``, ``_sbp`` (a tuple, one
SBP per placement dimension) and ``_logical_shape`` set on the object.  So
every existing kernel runs on the piece unchanged, and:

* ``x.shape`` (and ``size()``, ``ndim``, ``numel()``) is the logical, global
  shape, as in OneFlow; ``x.to_local().shape`` is this rank's piece;
* an op on a global tensor (``x + 1``, ``x[0]``, ``x @ w``) is a global op:
  the SBP dispatch (``dispatch.py``) picks a signature from the op's
  ``sbp_rule``, boxes the inputs, runs the op on the pieces and returns a
  global tensor.

API (OneFlow's): ``t.to_global(placement, sbp)``, ``t.to_local()``,
``t.placement``, ``t.sbp``, ``t.is_global``, ``randn_global(...)``.

* **local -> global** interprets each rank's tensor as its piece: ``split(d)``
  concatenates the pieces along d, ``partial_sum`` sums them, ``broadcast``
  requires them to be equal.  Every rank's (dtype, shape) and, for broadcast,
  a CRC32 of the bytes are gathered (one small all_gather) and any difference
  raises ``ValueError`` on every rank, naming the ranks: pyflow never keeps
  rank 0's data and silently drops the others' (a top OneFlow complaint).  The
  check costs one pass over the data (and a host copy for device tensors);
  ``check=False`` skips the data CRC, not the shape check.  Equality is
  bitwise (0.0 and -0.0 differ, equal NaNs agree).
* **global -> global** (same placement) is eager boxing (``boxing.box``, N-D
  too); a new placement (other ranks, other order, other hierarchy) moves the
  data by send/recv (``placement_change.py``: box to broadcast on the source, then each
  destination rank that lacks the data receives only its piece).
* Both are differentiable: the logical value is unchanged, so the backward of
  ``src -> dst`` is the boxing ``dst -> src`` of the gradient, and the backward
  of local <-> global is the identity on the piece.
* ``numpy()``, ``tolist()``, ``item()`` and ``np.asarray`` of a global tensor
  **raise** and say to call ``x.to_global(sbp=pyflow.sbp.broadcast).to_local()``
  first.  OneFlow's ``numpy()`` gathers implicitly, but that hides a
  collective in a call people make on one rank (``if rank == 0: print(...)``),
  which hangs; an explicit conversion is visible in the code.
* Ranks outside the placement hold an empty piece (shape ``(0,)``).
"""
import zlib

import numpy as np

from pyflow import dtypes as _dt
from pyflow.autograd import Function, is_grad_enabled
from pyflow.ops._method import tensor_method
from pyflow.ops.creation import randn, tensor
from pyflow.tensor import Tensor

from . import boxing as _boxing
from .pieces import DTYPE_CODES, dual, empty_piece, label, local_alias
from .placement import placement as Placement
from .placement_change import PlacementChange, move_header
from .sbp import as_sbp_tuple, broadcast, partial_sum

_DESC_DIMS = 8               # shape dims compared exactly (the tail by its product)

__all__ = ["to_global", "to_local", "randn_global", "logical_shape", "distribute_like"]

# ---------------------------------------------------------------- autograd wrappers
# Gradients of global tensors follow dispatch.py's rule: a gradient is itself a
# global tensor, in whatever SBP the op that made it chose; ``dual`` gives the
# layout of a gradient computed on pieces (S -> S, B -> P, P -> B).
class LocalToGlobal(Function):
    """A local tensor becomes a global tensor's piece.  Backward: the gradient in
    the same layout (a partial-sum piece's gradient is the whole, replicated
    gradient), this rank's piece of it."""
    handles_global = True

    @staticmethod
    def forward(ctx, x, sbp):
        ctx.sbp = sbp
        return local_alias(x)

    @staticmethod
    def backward(ctx, grad):
        if grad._placement is not None:
            want = tuple(broadcast if s == partial_sum else s for s in ctx.sbp)
            if grad._sbp != want:
                grad = grad.to_global(sbp=want)
            grad = local_alias(grad)
        return grad, None


class ToLocal(Function):
    """A global tensor's piece as a local tensor.  Backward: the local gradients
    are the pieces of the dual layout (a replicated tensor used on every rank
    gets the sum of every rank's gradient)."""
    handles_global = True

    @staticmethod
    def forward(ctx, x):
        ctx.meta = (x._placement, x._sbp, x._logical_shape)
        return local_alias(x)

    @staticmethod
    def backward(ctx, grad):
        placement, sbp, shape = ctx.meta
        return label(Tensor._make(grad._data, grad.dtype, grad.device), placement,
                     tuple(dual(s) for s in sbp), shape)


class Boxing(Function):
    """Same logical value, new layout (``boxing.box``; the output is labelled here,
    so a static graph that replays this node gets a global tensor).  Backward:
    the identity on the logical gradient, which keeps whatever layout it has (the
    consumer boxes as it needs)."""
    handles_global = True

    @staticmethod
    def forward(ctx, x, placement, src, dst):
        ctx.meta = (placement, dst, x._logical_shape)
        return label(_boxing.box(local_alias(x), placement, src, dst), placement, dst,
                     x._logical_shape)

    @staticmethod
    def backward(ctx, grad):
        if grad._placement is None:      # a local gradient: the piece of the dual layout
            placement, dst, shape = ctx.meta
            grad = label(Tensor._make(grad._data, grad.dtype, grad.device), placement,
                         tuple(dual(s) for s in dst), shape)
        return grad, None, None, None


# ---------------------------------------------------------------- checks
def _descriptor(x, with_crc):
    """(dtype, ndim, shape..., crc) as int64: what every rank must agree on."""
    shape = tuple(x.shape)
    if len(shape) > _DESC_DIMS:
        shape = shape[:_DESC_DIMS - 1] + (int(np.prod(shape[_DESC_DIMS - 1:])),)
    desc = np.full(3 + _DESC_DIMS, -1, np.int64)
    desc[0], desc[1] = DTYPE_CODES[x.dtype.name], x.ndim
    desc[2:2 + len(shape)] = shape
    if with_crc:
        host = x._data if x.device.type == "cpu" else x.to("cpu")._data
        desc[-1] = zlib.crc32(np.ascontiguousarray(host).view(np.uint8).reshape(-1))
    return desc


def _check_pieces(x, comm, sbp, check, placement=None):
    """Raise ValueError on every rank of ``comm`` unless the pieces fit ``sbp`` (one
    SBP, or a tuple for ``placement``'s axes): same dtype and shape everywhere and,
    with ``check``, bitwise equal pieces along every broadcast axis (by CRC32)."""
    sbp = tuple(sbp) if isinstance(sbp, (tuple, list)) else (sbp,)
    hierarchy = placement.hierarchy if placement is not None else (comm.size,)
    ranks = placement.flat_ranks if placement is not None else list(range(comm.size))
    with_crc = check and broadcast in sbp
    table = comm.all_gather(tensor(_descriptor(x, with_crc)[None]), check=False)._data
    what = lambda row: f"{_dt.ALL[row[0]].name}{tuple(int(v) for v in row[2:2 + row[1]])}"  # noqa
    meta = table[:, :-1]
    shown = sbp[0] if len(sbp) == 1 else sbp
    if (meta != meta[0]).any():
        raise ValueError(
            f"to_global: the local tensors must have the same dtype and shape on every rank "
            f"for sbp {shown!r}, got " + ", ".join(f"rank {ranks[k]}: {what(row)}"
                                                   for k, row in enumerate(table)))
    if not with_crc:
        return
    crc = table[:, -1].reshape(hierarchy)
    pos = np.arange(len(ranks)).reshape(hierarchy)
    pairs = []              # (rank that differs, the rank it should equal)
    for axis, s in enumerate(sbp):
        if s == broadcast:
            first = np.take(crc, [0], axis=axis)
            head = np.broadcast_to(np.take(pos, [0], axis=axis), pos.shape)
            for k in np.flatnonzero(crc != first):
                pairs.append((ranks[k], ranks[head.reshape(-1)[k]]))
    if not pairs:
        return
    if len(sbp) == 1:
        differ = sorted({r for r, _ in pairs})
        raise ValueError(
            f"to_global: sbp broadcast needs the same local tensor on every rank, but the "
            f"tensors of ranks {differ} differ from rank {ranks[0]}'s. Convert with "
            f"partial_sum or split to keep every rank's data, or make them equal first")
    raise ValueError(
        f"to_global: sbp {shown!r} needs the same local tensor on the ranks of each broadcast "
        f"axis, but " + ", ".join(f"rank {r} differs from rank {h}" for r, h in pairs) +
        ". Convert with partial_sum or split to keep every rank's data, or make them equal")


# ---------------------------------------------------------------- the API
@tensor_method("to_global")
def to_global(self, placement=None, sbp=None, *, check=True):
    """A global tensor with ``placement`` and ``sbp`` (one SBP per placement axis).
    From a local tensor both are required and this rank's tensor is its piece;
    from a global tensor a missing argument keeps the current one, a new sbp
    means boxing (``boxing.box``) and a new placement a move by send/recv
    (``placement_change.py``).  Collective over the placement's ranks (both placements' for a
    move; and, the first time a placement is used, the world)."""
    if placement is not None and not isinstance(placement, Placement):
        raise TypeError(f"to_global: placement must be a pyflow.placement, got {placement!r}")
    if self._placement is None:
        if placement is None or sbp is None:
            raise ValueError("to_global: a local tensor needs both placement and sbp, got "
                             f"placement={placement!r}, sbp={sbp!r}")
        sbp = as_sbp_tuple(sbp, placement.ndim)
        comm = placement.comm
        x = self if self.device.type == placement.type else self.to(placement.type)
        if comm is None:
            return label(empty_piece(x), placement, sbp, ())
        shape = _boxing.logical_shape_of(x.shape, placement, sbp, "to_global")
        _check_pieces(x, comm, sbp, check, placement)
        return label(LocalToGlobal.apply(x, sbp), placement, sbp, shape)
    if placement is None or placement == self._placement:
        placement = self._placement
        sbp = self._sbp if sbp is None else as_sbp_tuple(sbp, placement.ndim)
        comm = placement.comm
        if comm is None:
            return label(empty_piece(self), placement, sbp, ())
        _boxing.local_shape(self._logical_shape, placement, sbp, fn="to_global")
        return Boxing.apply(self, placement, self._sbp, sbp)
    if placement.type != self._placement.type:
        raise NotImplementedError(
            f"to_global: changing the placement's device type ({self._placement!r} -> "
            f"{placement!r}) is not supported yet; use .to_local().to(device) and "
            f".to_global(...) again")
    if sbp is None and placement.ndim != self._placement.ndim:
        raise ValueError(f"to_global: moving to a placement with another number of dims "
                         f"({self._placement.hierarchy} -> {placement.hierarchy}) needs "
                         f"sbp, got sbp=None")
    sbp = self._sbp if sbp is None else as_sbp_tuple(sbp, placement.ndim)
    if self._placement.comm is not None:
        _boxing.local_shape(self._logical_shape, placement, sbp, fn="to_global")
    shape, dtype, needs_grad = move_header(self, placement,
                                            self.requires_grad and is_grad_enabled())
    x = self
    if needs_grad and not self.requires_grad and is_grad_enabled():
        # A destination rank outside the source: record the node here too, so the
        # backward (collective) runs on every rank that the forward involved.
        x = label(empty_piece(self).requires_grad_(), self._placement, self._sbp, ())
    return PlacementChange.apply(x, self._placement, self._sbp, placement, sbp, shape, dtype)


@tensor_method("to_local")
def to_local(self):
    """This rank's piece as a local tensor (differentiable; no communication)."""
    if self._placement is None:
        raise RuntimeError("to_local: the tensor is not global (it has no placement); "
                           "make one with to_global(placement, sbp)")
    return ToLocal.apply(self)


def logical_shape(t):
    """The shape of the logical (global) tensor; the piece's shape for a local one."""
    if t._placement is None:
        return tuple(t.shape)
    if t._placement.comm is None:
        raise RuntimeError("logical_shape: this rank is not in the tensor's placement "
                           f"{t._placement!r}, so it does not know the shape")
    return t._logical_shape


Tensor.placement = property(lambda t: t._placement,
                            doc="The placement of a global tensor (None for a local one).")
Tensor.sbp = property(lambda t: t._sbp,
                      doc="The SBP tuple of a global tensor (None for a local one).")
Tensor.is_global = property(lambda t: t._placement is not None)
Tensor.is_local = property(lambda t: t._placement is None)


def randn_global(*size, placement, sbp, generator=None, dtype=None, requires_grad=False):
    """``randn(*size)`` as a global tensor with the same values as the single-rank
    ``pyflow.randn(*size, generator=...)`` from the same seed: every rank draws
    the whole tensor and keeps its piece (``boxing.slice_piece``: costs the full
    draw on every rank, and advances every rank's generator the same way).  On a
    ``partial_sum`` axis coordinate 0 holds the values and the others zeros."""
    if not isinstance(placement, Placement):
        raise TypeError(f"randn_global: placement must be a pyflow.placement, got {placement!r}")
    sbp = as_sbp_tuple(sbp, placement.ndim, fn="randn_global")
    full = randn(*size, generator=generator, dtype=dtype, device=placement.type)
    comm = placement.comm
    if comm is None:
        piece = empty_piece(full)
    else:
        _boxing.local_shape(full.shape, placement, sbp, fn="randn_global")
        piece = full if all(s == broadcast for s in sbp) else \
            _boxing.slice_piece(full, placement, sbp, placement.coords())
    piece.requires_grad_(requires_grad)
    return label(piece, placement, sbp, () if comm is None else full.shape)


# ---------------------------------------------------------------- no implicit gathers
def _refuse(name, original):
    def method(self, *args, **kwargs):
        if self._placement is not None:
            raise RuntimeError(
                f"{name}() of a global tensor: this rank only holds a piece "
                f"(sbp {self._sbp}). Call x.to_global(sbp=pyflow.sbp.broadcast).to_local()."
                f"{name}() on every rank of the placement (a collective), or "
                f"x.to_local().{name}() for this rank's piece")
        return original(self, *args, **kwargs)
    method.__name__ = name
    method.__doc__ = original.__doc__
    return method


for _name, _shown in (("numpy", "numpy"), ("tolist", "tolist"), ("item", "item"),
                      ("__array__", "numpy")):
    tensor_method(_name)(_refuse(_shown, getattr(Tensor, _name)))
del _name, _shown


def distribute_like(t, like):
    """``t``, a local tensor holding the whole logical tensor (the same on every
    rank, e.g. read from a checkpoint), as a global tensor with ``like``'s
    placement and SBP: each rank keeps its piece.  Collective over the placement."""
    if tuple(t.shape) != tuple(like.shape):
        raise ValueError(f"distribute_like: the tensor has shape {tuple(t.shape)}, expected the "
                         f"logical shape {tuple(like.shape)} of the global tensor")
    whole = t.to_global(like._placement, (broadcast,) * like._placement.ndim, check=False)
    return whole.to_global(sbp=like._sbp)
