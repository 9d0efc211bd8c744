"""pyflow.distributed: the job's layout (``env``) and the ``pyflow-run`` launcher.

``get_rank()``, ``get_world_size()`` and ``get_local_rank()`` are re-exported
here; the collectives themselves live in ``pyflow.comm``.
"""
import importlib

from . import env
from .env import get_local_rank, get_local_world_size, get_rank, get_world_size

__all__ = ["env", "get_rank", "get_world_size", "get_local_rank", "get_local_world_size"]

# Global tensors: placement, SBP, eager boxing (importing global_tensor attaches
# Tensor.to_global / to_local / placement / sbp / is_global).
from . import sbp  # noqa: E402
from .placement import placement  # noqa: E402

__all__ += ["placement", "sbp", "boxing", "randn_global", "logical_shape"]


# The modules that compute on global tensors (boxing, global_tensor, dispatch)
# sit above the ops, while ``sbp`` and ``signatures`` sit below them (an op
# declares its SBP rule where it is defined).  Importing ``pyflow.distributed.sbp``
# from an op module runs this file first, so it imports only what is below the
# ops, and loads the rest on first use (``pyflow/__init__.py`` imports them
# once the ops are in place).
def __getattr__(name):
    if name == "boxing":
        return importlib.import_module(f"{__name__}.boxing")
    if name in ("randn_global", "logical_shape"):
        return getattr(importlib.import_module(f"{__name__}.global_tensor"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
