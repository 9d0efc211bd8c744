"""Global tensors: a local pyflow Tensor (this rank's piece) + placement + SBP.

Design (the simplest honest one): a global tensor *is* a pyflow ``Tensor``
whose data is this rank's piece, with ``_placement``, ``_sbp`` (a tuple, one
SBP per placement dimension) and ``_logical_shape`` set on the object.  So
every existing kernel runs on the piece unchanged; what the ops do not know
yet is SBP, which means, until ops declare their SBP signatures:

* ``x.shape`` is the shape of this rank's piece; ``logical_shape(x)`` is the
  global one (OneFlow's ``x.shape``);
* an op on a global tensor (``x + 1``, ``x[0]``, ``x.detach()``) computes on
  the piece and returns a *local* tensor.

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
* **global -> global** (same placement) is eager boxing (``boxing.py``);
  placement changes are not supported yet.
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
from pyflow.autograd import Function
from pyflow.ops._method import tensor_method
from pyflow.tensor import Tensor

from . import boxing as _boxing
from .placement import placement as Placement
from .sbp import as_sbp_tuple, broadcast, partial_sum

__all__ = ["to_global", "to_local", "randn_global", "logical_shape"]

_DESC_DIMS = 8               # shape dims compared exactly (the tail by its product)
_DTYPE_CODES = {d.name: i for i, d in enumerate(_dt.ALL)}

# Class-level defaults: a plain tensor is local (fast attribute lookups, no __dict__).
Tensor._placement = None
Tensor._sbp = None
Tensor._logical_shape = None


def _mark(t, placement, sbp, shape):
    t._placement, t._sbp, t._logical_shape = placement, sbp, tuple(shape)
    return t


def _alias(x):
    return Tensor._make(x._data, x.dtype, x.device, base=x)


# ---------------------------------------------------------------- autograd wrappers
class _LocalToGlobal(Function):
    """The piece becomes a global tensor's piece: identity both ways."""
    @staticmethod
    def forward(ctx, x):
        return _alias(x)

    @staticmethod
    def backward(ctx, grad):
        return grad


class _Boxing(Function):
    @staticmethod
    def forward(ctx, x, comm, src, dst):
        ctx.args = (comm, src, dst)
        return _boxing.boxing(x, src, dst, comm)

    @staticmethod
    def backward(ctx, grad):
        comm, src, dst = ctx.args
        return _boxing.boxing(grad, dst, src, comm), None, None, None


# ---------------------------------------------------------------- checks
def _descriptor(x, with_crc):
    """(dtype, ndim, shape..., crc) as int64: what every rank must agree on."""
    shape = tuple(x.shape)
    if len(shape) > _DESC_DIMS:
        shape = shape[:_DESC_DIMS - 1] + (int(np.prod(shape[_DESC_DIMS - 1:])),)
    desc = np.full(3 + _DESC_DIMS, -1, np.int64)
    desc[0], desc[1] = _DTYPE_CODES[x.dtype.name], x.ndim
    desc[2:2 + len(shape)] = shape
    if with_crc:
        host = x._data if x.device.type == "cpu" else x.to("cpu")._data
        desc[-1] = zlib.crc32(np.ascontiguousarray(host).view(np.uint8).reshape(-1))
    return desc


def _check_pieces(x, comm, sbp, check):
    """Raise ValueError on every rank of ``comm`` unless the pieces fit ``sbp``."""
    from pyflow.ops.creation import tensor
    with_crc = check and sbp == broadcast
    table = comm.all_gather(tensor(_descriptor(x, with_crc)[None]), check=False)._data
    what = lambda row: f"{_dt.ALL[row[0]].name}{tuple(int(v) for v in row[2:2 + row[1]])}"  # noqa
    meta = table[:, :-1]
    if (meta != meta[0]).any():
        raise ValueError(
            f"to_global: the local tensors must have the same dtype and shape on every rank "
            f"for sbp {sbp!r}, got " + ", ".join(f"rank {r}: {what(row)}"
                                                  for r, row in enumerate(table)))
    if with_crc and (table[:, -1] != table[0, -1]).any():
        differ = [r for r in range(len(table)) if table[r, -1] != table[0, -1]]
        raise ValueError(
            f"to_global: sbp broadcast needs the same local tensor on every rank, but the "
            f"tensors of ranks {differ} differ from rank 0's (placement ranks order). Convert "
            f"with partial_sum or split to keep every rank's data, or make them equal first")


# ---------------------------------------------------------------- the API
@tensor_method("to_global")
def to_global(self, placement=None, sbp=None, *, check=True):
    """A global tensor with ``placement`` and ``sbp``.  From a local tensor both are
    required and this rank's tensor is its piece; from a global tensor a missing
    argument keeps the current one and a new sbp means boxing.  Collective over
    the placement's ranks (and, the first time a placement is used, the world)."""
    if placement is not None and not isinstance(placement, Placement):
        raise TypeError(f"to_global: placement must be a pyflow.placement, got {placement!r}")
    if self._placement is None:
        if placement is None or sbp is None:
            raise ValueError("to_global: a local tensor needs both placement and sbp, got "
                             f"placement={placement!r}, sbp={sbp!r}")
        sbp = as_sbp_tuple(sbp)
        comm = placement.comm
        x = self if self.device.type == placement.type else self.to(placement.type)
        if comm is None:
            return _mark(_empty(x), placement, sbp, ())
        if sbp[0].is_split and sbp[0].dim >= x.ndim:
            raise ValueError(f"to_global: {sbp[0]!r} needs a tensor with more than "
                             f"{sbp[0].dim} dims, got shape {tuple(x.shape)}")
        _check_pieces(x, comm, sbp[0], check)
        shape = list(x.shape)
        if sbp[0].is_split:
            shape[sbp[0].dim] *= comm.size
        return _mark(_LocalToGlobal.apply(x), placement, sbp, shape)
    placement = self._placement if placement is None else placement
    if placement != self._placement:
        raise NotImplementedError(f"to_global: changing the placement ({self._placement!r} -> "
                                  f"{placement!r}) is not supported yet; same placement only")
    sbp = self._sbp if sbp is None else as_sbp_tuple(sbp)
    comm = placement.comm
    if comm is None:
        return _mark(_empty(self), placement, sbp, ())
    if sbp[0].is_split:
        _boxing.check_divisible(self._logical_shape, sbp[0].dim, comm.size, "to_global")
    out = _Boxing.apply(self, comm, self._sbp[0], sbp[0])
    return _mark(out, placement, sbp, self._logical_shape)


@tensor_method("to_local")
def to_local(self):
    """This rank's piece as a local tensor (differentiable; no communication)."""
    if self._placement is None:
        raise RuntimeError("to_local: the tensor is not global (it has no placement); "
                           "make one with to_global(placement, sbp)")
    return _LocalToGlobal.apply(self)


def logical_shape(t):
    """The shape of the logical (global) tensor; the piece's shape for a local one."""
    if t._placement is None:
        return tuple(t.shape)
    if t._placement.comm is None:
        raise RuntimeError("logical_shape: this rank is not in the tensor's placement "
                           f"{t._placement!r}, so it does not know the shape")
    return t._logical_shape


def _empty(x):
    from pyflow.ops.creation import empty
    return empty(0, dtype=x.dtype, device=x.device)


Tensor.placement = property(lambda t: t._placement,
                            doc="The placement of a global tensor (None for a local one).")
Tensor.sbp = property(lambda t: t._sbp,
                      doc="The SBP tuple of a global tensor (None for a local one).")
Tensor.is_global = property(lambda t: t._placement is not None)
Tensor.is_local = property(lambda t: t._placement is None)


def randn_global(*size, placement, sbp, generator=None, dtype=None, requires_grad=False):
    """``randn(*size)`` as a global tensor with the same values as the single-rank
    ``pyflow.randn(*size, generator=...)`` from the same seed: every rank draws
    the whole tensor and keeps its piece (costs the full draw on every rank, and
    advances every rank's generator the same way).  For ``partial_sum`` rank 0
    holds the values and the others zeros."""
    from pyflow.ops.creation import randn, zeros_like
    if not isinstance(placement, Placement):
        raise TypeError(f"randn_global: placement must be a pyflow.placement, got {placement!r}")
    sbp = as_sbp_tuple(sbp, fn="randn_global")
    full = randn(*size, generator=generator, dtype=dtype, device=placement.type)
    comm = placement.comm
    if comm is None:
        piece = _empty(full)
    elif sbp[0] == broadcast:
        piece = full
    elif sbp[0] == partial_sum:
        piece = full if comm.rank == 0 else zeros_like(full)
    else:
        _boxing.check_divisible(full.shape, sbp[0].dim, comm.size, "randn_global")
        piece = _boxing.b_to_s(full, comm, sbp[0].dim)
    piece.requires_grad_(requires_grad)
    return _mark(piece, placement, sbp, () if comm is None else full.shape)


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
