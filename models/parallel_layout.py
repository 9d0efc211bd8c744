"""The trainer's parallel layouts: where a model's parameters and each batch
live when the ranks train one model as global tensors, and the way back to
whole local tensors.

``dp``      the ranks in one row; every parameter replicated (B), the batch
            split along dim 0 (S(0)); rank r keeps slice r of the batch.
``tp``      the ranks in one row; GPT's MLP split as Megatron does
            (``megatron_sbp``), everything else replicated; the batch
            replicated, so the one data-parallel group is all the ranks.
``hybrid``  the ranks on a (ranks / tp_size) x tp_size grid, rank r at row
            r // tp_size: data parallel along the first axis (the batch is
            (S(0), B)), tensor parallel along the second (parameters are
            (B, megatron_sbp)); each row keeps its own slice of the batch.

Checking the flags that choose a layout (and saying which flag is wrong) is
the trainer's part; this module only does the arithmetic and the moves.
"""
import pyflow

__all__ = ["Layout", "megatron_sbp", "data_parallel_size", "grid_fits", "plan",
           "place_model", "whole", "local_state"]


class Layout:
    """How a run lays out its global tensors: their ``placement``, the batch's
    SBP (``batch``), each parameter's SBP by name (``params``), and this rank's
    data-parallel group: ``dp_index`` of ``dp_size`` (which slice of the global
    batch it keeps)."""

    def __init__(self, placement, batch, params, dp_index, dp_size):
        self.placement, self.batch, self.params = placement, batch, params
        self.dp_index, self.dp_size = dp_index, dp_size

    def place(self, x):
        """This rank's slice of a batch (a local tensor) as the global batch."""
        return x.to_global(self.placement, self.batch)


def megatron_sbp(name):
    """Tensor parallel for GPT (Megatron's MLP): ``mlp.c_fc`` split by output
    features, ``mlp.c_proj`` by input features, everything else replicated.  The
    attention stays replicated: nanoGPT's fused ``c_attn`` splits into q, k, v
    along the features, which a feature split of the weight would cut across."""
    S, B = pyflow.sbp.split, pyflow.sbp.broadcast
    if ".mlp.c_fc." in name:
        return S(0)
    if name.endswith(".mlp.c_proj.weight"):
        return S(1)
    return B


def data_parallel_size(parallel, world_size, tp_size):
    """How many slices the global batch is cut into under ``parallel``; at
    least 1, also for a hybrid grid that does not fit (see ``grid_fits``)."""
    if parallel == "tp":
        return 1
    if parallel == "hybrid":
        return max(1, world_size // tp_size)
    return world_size


def grid_fits(world_size, tp_size):
    """Whether ``world_size`` ranks fill whole rows of ``tp_size`` ranks."""
    return world_size % tp_size == 0


def plan(model, parallel, device, rank, world_size, tp_size):
    """The Layout of ``model``'s parameters (by their names) for ``parallel``
    (``dp``, ``tp`` or ``hybrid``) over ``world_size`` ranks on ``device``, as
    seen by ``rank``.  Moves nothing."""
    B, S = pyflow.sbp.broadcast, pyflow.sbp.split
    names = [name for name, _ in model.named_parameters()]
    if parallel == "dp":
        placement = pyflow.placement(device, list(range(world_size)))
        return Layout(placement, (S(0),), {name: (B,) for name in names}, rank, world_size)
    if parallel == "tp":
        placement = pyflow.placement(device, list(range(world_size)))
        return Layout(placement, (B,), {name: (megatron_sbp(name),) for name in names}, 0, 1)
    if parallel != "hybrid":
        raise ValueError(f"plan: parallel must be 'dp', 'tp' or 'hybrid', got {parallel!r}")
    if not grid_fits(world_size, tp_size):
        raise ValueError(f"plan: {world_size} ranks do not fill rows of tp_size={tp_size}")
    grid = [list(range(r, r + tp_size)) for r in range(0, world_size, tp_size)]
    placement = pyflow.placement(device, grid)
    return Layout(placement, (S(0), B), {name: (B, megatron_sbp(name)) for name in names},
                  rank // tp_size, world_size // tp_size)


def place_model(model, layout):
    """Make ``model``'s parameters and buffers global tensors as ``layout``
    says, in place (the same Parameter objects, so an optimizer built later
    sees them).  Collective over the placement's ranks."""
    whole_sbp = (pyflow.sbp.broadcast,) * layout.placement.ndim
    for name, p in list(model.named_parameters()):
        # Every rank built the same model from the same seed: its local tensor
        # is the whole one, so it becomes a replicated global tensor as it is,
        # and the conversion to the target SBP keeps each rank's piece.
        g = p.detach().to_global(layout.placement, whole_sbp).to_global(sbp=layout.params[name])
        p.data = g
    for _, b in list(model.named_buffers()):
        b.data = b.to_global(layout.placement, whole_sbp)


def whole(t):
    """A global tensor gathered into a local tensor on every rank (collective)."""
    return t.to_global(sbp=(pyflow.sbp.broadcast,) * t.placement.ndim).to_local()


def local_state(state):
    """A state dict (nested dicts and lists) with every global tensor replaced
    by a local tensor holding the whole of it, split ones gathered (collective),
    so a checkpoint holds the same whole tensors whatever the layout."""
    if isinstance(state, dict):
        return {k: local_state(v) for k, v in state.items()}
    if isinstance(state, list):
        return [local_state(v) for v in state]
    if isinstance(state, pyflow.Tensor) and state.is_global:
        return whole(state)
    return state
