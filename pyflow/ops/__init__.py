"""All ops.  Each family lives in its own module; ``from pyflow.ops import *``
re-exports their public functions."""
from .creation import *  # noqa: F401,F403
from .elementwise import *  # noqa: F401,F403
from .shape import *  # noqa: F401,F403
from .reduce import *  # noqa: F401,F403
from . import creation, elementwise, shape, reduce  # noqa: F401

__all__ = [n for m in (creation, elementwise, shape, reduce) for n in m.__all__]
