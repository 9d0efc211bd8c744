"""Automatic mixed precision helpers (``torch.amp``): autocast and dynamic
loss scaling.

See docs/amp.md, ``autocast`` and ``GradScaler``.
"""
from .autocast import autocast, get_autocast_dtype, is_autocast_enabled
from .grad_scaler import GradScaler, OptState

__all__ = ["GradScaler", "OptState", "autocast", "get_autocast_dtype", "is_autocast_enabled"]
