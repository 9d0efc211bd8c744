"""pyflow.nn: modules, layers, losses, init and functional (PyTorch's ``torch.nn``)."""
from . import functional, init, parallel, utils
from .graph import Graph, GraphConfig
from .module import Module
from .modules import *  # noqa: F401,F403
from .modules import __all__ as _layers
from .parameter import Parameter

__all__ = ["Graph", "GraphConfig", "Module", "Parameter", "functional", "init", "parallel",
           "utils"] + list(_layers)
