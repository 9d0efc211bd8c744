"""models/parallel_layout.py: the layout arithmetic of the trainer's
``--parallel dp|tp|hybrid``, seen from every rank, in one process (nothing is
moved here; the runs on 2 and 4 ranks in test_train.py move the tensors)."""
import pytest

import pyflow as pf
from pyflow.models import parallel_layout as pl
from pyflow.models.gpt import GPT, PRESETS

B, S = pf.sbp.broadcast, pf.sbp.split
FC_W, FC_B = "transformer.h.0.mlp.c_fc.weight", "transformer.h.0.mlp.c_fc.bias"
PROJ_W, PROJ_B = "transformer.h.0.mlp.c_proj.weight", "transformer.h.0.mlp.c_proj.bias"
ATTN_W = "transformer.h.0.attn.c_attn.weight"


@pytest.fixture(scope="module")
def gpt():
    return GPT(PRESETS["tiny"](vocab_size=11, block_size=8))


def test_megatron_sbp_splits_only_the_mlp():
    assert pl.megatron_sbp(FC_W) == S(0) and pl.megatron_sbp(FC_B) == S(0)
    assert pl.megatron_sbp(PROJ_W) == S(1)
    for name in (PROJ_B, ATTN_W, "transformer.wte.weight", "transformer.h.0.ln_1.weight"):
        assert pl.megatron_sbp(name) == B, name


def test_data_parallel_replicates_parameters_and_splits_the_batch(gpt):
    for rank in range(2):
        layout = pl.plan(gpt, "dp", "cpu", rank, 2, tp_size=2)
        assert list(layout.placement.ranks) == [0, 1]
        assert layout.batch == (S(0),)
        assert set(layout.params) == {name for name, _ in gpt.named_parameters()}
        assert all(sbp == (B,) for sbp in layout.params.values())
        assert (layout.dp_index, layout.dp_size) == (rank, 2)


def test_tensor_parallel_splits_the_mlp_and_replicates_the_batch(gpt):
    for rank in range(2):
        layout = pl.plan(gpt, "tp", "cpu", rank, 2, tp_size=2)
        assert list(layout.placement.ranks) == [0, 1]
        assert layout.batch == (B,)
        assert layout.params[FC_W] == (S(0),) and layout.params[PROJ_W] == (S(1),)
        assert layout.params[ATTN_W] == (B,)
        assert (layout.dp_index, layout.dp_size) == (0, 1)


def test_hybrid_puts_the_ranks_on_rows_of_tp_size(gpt):
    seen = []
    for rank in range(4):
        layout = pl.plan(gpt, "hybrid", "cpu", rank, 4, tp_size=2)
        assert [list(row) for row in layout.placement.ranks] == [[0, 1], [2, 3]]
        assert layout.batch == (S(0), B)
        assert layout.params[FC_W] == (B, S(0)) and layout.params[PROJ_W] == (B, S(1))
        assert layout.params[ATTN_W] == (B, B)
        seen.append((layout.dp_index, layout.dp_size))
    assert seen == [(0, 2), (0, 2), (1, 2), (1, 2)]     # a row shares one batch slice


def test_data_parallel_size_agrees_with_the_plan(gpt):
    for parallel, world, tp in (("dp", 1, 2), ("dp", 4, 2), ("tp", 4, 2), ("hybrid", 4, 2),
                                ("hybrid", 4, 4), ("hybrid", 6, 3)):
        layout = pl.plan(gpt, parallel, "cpu", 0, world, tp)
        assert pl.data_parallel_size(parallel, world, tp) == layout.dp_size, (parallel, world, tp)
    # the memory check asks before the grid is checked: never 0 slices
    assert pl.data_parallel_size("hybrid", 2, 4) == 1


def test_a_grid_that_does_not_fit_is_refused(gpt):
    assert pl.grid_fits(4, 2) and pl.grid_fits(4, 4) and not pl.grid_fits(6, 4)
    with pytest.raises(ValueError, match="6 ranks do not fill rows of tp_size=4"):
        pl.plan(gpt, "hybrid", "cpu", 0, 6, 4)
    with pytest.raises(ValueError, match="parallel must be 'dp', 'tp' or 'hybrid', got 'pp'"):
        pl.plan(gpt, "pp", "cpu", 0, 2, 2)


def test_local_state_keeps_local_tensors_and_the_nesting():
    t = pf.tensor([1.0, 2.0])
    state = {"a": t, "b": [t, {"c": 3}], "d": (t,)}
    out = pl.local_state(state)
    assert out["a"] is t and out["b"][0] is t and out["b"][1] == {"c": 3} and out["d"][0] is t
