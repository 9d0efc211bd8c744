"""Compiler passes: each takes a Graph and returns a new one (the input is
never modified) with a line appended to ``graph.history``."""
from .add_to_output import fuse_add_to_output
from .attention import fuse_attention
from .autograd import LossScale, autograd
from .casts import remove_redundant_casts
from .fusion import fuse_elementwise
from .in_place import in_place
from .memory import MemoryPlan, plan_memory
from .residual import fuse_batch_norm_relu, fuse_residual
from .model_update import add_update, fuse_model_update
from .sbp import insert_boxing
from .simplify import constant_folding, dead_code_elimination
from .slice_grad import accumulate_slice_grads

__all__ = ["fuse_add_to_output", "fuse_attention", "autograd", "fuse_elementwise", "add_update",
           "fuse_model_update", "constant_folding", "dead_code_elimination", "in_place",
           "plan_memory", "MemoryPlan", "accumulate_slice_grads", "insert_boxing",
           "remove_redundant_casts", "LossScale", "fuse_residual",
           "fuse_batch_norm_relu"]
