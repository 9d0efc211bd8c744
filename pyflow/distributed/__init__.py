"""pyflow.distributed: the job's layout (``env``) and the ``pyflow-run`` launcher.

``get_rank()``, ``get_world_size()`` and ``get_local_rank()`` are re-exported
here; the collectives themselves live in ``pyflow.comm``.
"""
from . import env
from .env import get_local_rank, get_local_world_size, get_rank, get_world_size

__all__ = ["env", "get_rank", "get_world_size", "get_local_rank", "get_local_world_size"]

# Global tensors: placement, SBP, eager boxing (importing global_tensor attaches
# Tensor.to_global / to_local / placement / sbp / is_global).
from . import boxing, sbp  # noqa: E402
from .placement import placement  # noqa: E402
from .global_tensor import logical_shape, randn_global  # noqa: E402

__all__ += ["placement", "sbp", "boxing", "randn_global", "logical_shape"]
