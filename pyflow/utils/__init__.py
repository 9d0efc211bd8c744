"""pyflow.utils: data loading (``utils.data``) and checkpoints (``utils.serialization``,
exposed as ``pyflow.save`` / ``pyflow.load``)."""
from . import data, serialization

__all__ = ["data", "serialization"]
