"""Automatic mixed precision helpers (``torch.amp``): dynamic loss scaling.

See docs/amp.md and ``GradScaler``.
"""
from .grad_scaler import GradScaler, OptState

__all__ = ["GradScaler", "OptState"]
