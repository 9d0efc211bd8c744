"""What a global tensor is made of: a local Tensor object holding this rank's
piece, labelled with a placement, an SBP tuple and the logical shape.

The few helpers every module of ``pyflow.distributed`` uses on pieces live
here, below ``global_tensor.py`` (the API), ``placement_change.py`` (moves
between placements) and ``dispatch.py`` (ops on global tensors).
"""
from pyflow import dtypes as _dt
from pyflow.ops.creation import empty
from pyflow.tensor import Tensor

from .sbp import broadcast, partial_sum

__all__ = ["label", "local_alias", "dual", "empty_piece", "DTYPE_CODES"]

DTYPE_CODES = {d.name: i for i, d in enumerate(_dt.ALL)}   # a dtype as an int, in messages


def label(t, placement, sbp, logical_shape):
    """Mark ``t`` (a local Tensor object holding this rank's piece) as global."""
    t._placement, t._sbp, t._logical_shape = placement, tuple(sbp), tuple(logical_shape)
    return t


def local_alias(t):
    """A plain local tensor over ``t``'s piece (a view: same storage and version)."""
    return Tensor._make(t._data, t.dtype, t.device, base=t)


def dual(sbp):
    """The SBP of the gradient of a tensor with SBP ``sbp`` (S -> S, B -> P, P -> B)."""
    if sbp == broadcast:
        return partial_sum
    if sbp == partial_sum:
        return broadcast
    return sbp


def empty_piece(x):
    """The piece a rank outside the placement holds: empty, of ``x``'s dtype and device."""
    return empty(0, dtype=x.dtype, device=x.device)
