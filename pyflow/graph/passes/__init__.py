"""Compiler passes: each takes a Graph and returns a new one (the input is
never modified) with a line appended to ``graph.history``."""
from .add_to_output import fuse_add_to_output
from .autograd import autograd
from .fusion import fuse_elementwise
from .memory import MemoryPlan, plan_memory
from .simplify import constant_folding, dead_code_elimination

__all__ = ["fuse_add_to_output", "autograd", "fuse_elementwise", "constant_folding", "dead_code_elimination", "plan_memory",
           "MemoryPlan"]
