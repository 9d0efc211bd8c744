"""All ops.  Each family lives in its own module; ``from pyflow.ops import *``
re-exports their public functions (each module's ``__all__``)."""
from . import (attention, conv, creation, dropout, elementwise, embedding, index, indexing,
               inplace, join, linalg, loss, normalization, reduce, shape, softmax, transfer)

_MODULES = (creation, elementwise, shape, inplace, reduce, index, indexing, join, linalg, conv,
            softmax, normalization, loss, attention, dropout, embedding, transfer)
__all__ = []
for _m in _MODULES:
    for _name in _m.__all__:
        globals()[_name] = getattr(_m, _name)
        __all__.append(_name)

# The core's calls up to the ops (pyflow/_hooks.py): autograd's zero and one
# gradients, Tensor.to's conversions.
from .._hooks import HOOKS  # noqa: E402

HOOKS.provide(zeros=creation.zeros, ones_like=creation.ones_like, cast=shape.cast,
              to_device=transfer.to_device, clone=shape.clone)
