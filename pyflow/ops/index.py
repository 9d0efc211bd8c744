"""Indexing: ``t[key]`` and ``t[key] = value``.

Basic keys (ints, slices, None, ...) give views (``shape.SliceView``);
advanced keys (bool masks, integer tensors) give copies, gather-style.
"""
from ..tensor import Tensor
from ._method import tensor_method
from .shape import SliceView

__all__ = []


def _is_basic(key):
    return all(k is None or k is Ellipsis or isinstance(k, (int, slice)) and not isinstance(k, bool)
               for k in key)


def _check_basic(t, key):
    shape = t._data.shape
    dim = 0
    n_real = sum(1 for k in key if k is not None and k is not Ellipsis)
    if n_real > len(shape):
        raise IndexError(f"too many indices for tensor of dimension {len(shape)}")
    for k in key:
        if k is Ellipsis:
            dim += len(shape) - n_real
        elif k is None:
            continue
        else:
            if isinstance(k, int) and not -shape[dim] <= k < shape[dim]:
                raise IndexError(f"index {k} is out of bounds for dimension {dim} with size "
                                 f"{shape[dim]}")
            if isinstance(k, slice) and k.step is not None and k.step <= 0:
                raise ValueError("step must be greater than zero")
            dim += 1


@tensor_method("__getitem__")
def getitem(self, key):
    key = key if isinstance(key, tuple) else (key,)
    if _is_basic(key):
        _check_basic(self, key)
        return SliceView.apply(self, key)
    raise TypeError(f"index: unsupported key {key!r}")
