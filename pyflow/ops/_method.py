"""Attach op functions to Tensor as methods, keeping tensor.py about the object."""
from ..tensor import Tensor


def tensor_method(*names):
    """``@tensor_method("sum")`` makes ``t.sum(...)`` call the decorated op with ``t`` first."""
    def deco(fn):
        for n in names or (fn.__name__,):
            setattr(Tensor, n, fn)
        return fn
    return deco
