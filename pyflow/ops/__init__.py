"""All ops.  Each family lives in its own module; ``from pyflow.ops import *``
re-exports their public functions (each module's ``__all__``)."""
from . import (attention, conv, creation, dropout, elementwise, embedding, index, join, linalg,
               loss, normalization, reduce, shape, softmax, transfer)

_MODULES = (creation, elementwise, shape, reduce, index, join, linalg, conv, softmax,
            normalization, loss, attention, dropout, embedding, transfer)
__all__ = []
for _m in _MODULES:
    for _name in _m.__all__:
        globals()[_name] = getattr(_m, _name)
        __all__.append(_name)
