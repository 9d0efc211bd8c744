"""pyflow.distributed: the job's layout (``env``) and the ``pyflow-run`` launcher.

``get_rank()``, ``get_world_size()`` and ``get_local_rank()`` are re-exported
here; the collectives themselves live in ``pyflow.comm``.
"""
from . import env
from .env import get_local_rank, get_local_world_size, get_rank, get_world_size

__all__ = ["env", "get_rank", "get_world_size", "get_local_rank", "get_local_world_size"]
