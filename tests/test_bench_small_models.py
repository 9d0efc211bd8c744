"""The machinery of bench/small_models.py and bench/op_overhead.py on toy runs:
both libraries build the same models from one file, pyflow's eager and graph
workers train the same thing, a child that fails is reported, and the target
verdicts follow the ratios.  The measurements are the benchmarks' job."""
import numpy as np
import pytest

import pyflow as pf
from bench import op_overhead, small_models
from bench.common import run_child
from tests.helpers import needs_torch, torch


# ------------------------------------------------------------------ small_models
@needs_torch
@pytest.mark.parametrize("model", list(small_models.CASES))
def test_torch_runs_the_same_model_file(model):
    ours, inputs, _, _ = small_models.build(pf, model)
    twin, twin_inputs, _, _ = small_models.build(torch, model)
    assert isinstance(twin, torch.nn.Module) and not isinstance(ours, torch.nn.Module)
    assert [(n, tuple(p.shape)) for n, p in ours.named_parameters()] == \
        [(n, tuple(p.shape)) for n, p in twin.named_parameters()]
    for a, b in zip(inputs, twin_inputs):           # the same synthetic batch
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_eager_and_graph_workers_train_the_same_gpt():
    eager = small_models.worker("eager", "gpt", steps=2, warmup=1)
    graph = small_models.worker("graph", "gpt", steps=2, warmup=1)
    assert len(eager["step_s"]) == len(graph["step_s"]) == 2
    assert eager["median_s"] == pytest.approx(np.median(eager["step_s"]))
    # three AdamW steps from the same seed: the same loss either way
    assert np.isfinite(eager["loss"]) and graph["loss"] == pytest.approx(eager["loss"], rel=1e-4)


def test_verdicts_follow_the_ratios_and_a_failed_mode_is_shown():
    ok = lambda rate: {"median": rate, "low": rate, "high": rate, "runs": 1,  # noqa: E731
                       "failed": 0, "error": None}
    rows, verdicts = small_models.rows_of({
        "gpt": {"torch": ok(100.0), "eager": ok(90.0), "graph": ok(140.0)},
        "resnet": {"torch": ok(10.0), "eager": ok(7.0), "graph": {"error": "boom"}}})
    assert rows[0][5:] == ["1.40x", "0.90x", "1.56x"]
    assert verdicts[:3] == ["gpt: graph/torch 1.40x >= 1.3x: met",
                            "gpt: graph/eager 1.56x >= 1.5x: met",
                            "gpt: eager/torch 0.90x >= 0.8x: met"]
    # ResNet has only the eager target; its failed graph column says why
    assert verdicts[3:] == ["resnet: eager/torch 0.70x >= 0.8x: NOT met"]
    assert rows[1][4] == "failed: boom" and rows[1][5] == "-"


def test_a_child_without_a_result_line_is_an_error():
    res = run_child(["-c", "import sys; print('no result'); sys.exit(3)"], what="the probe")
    assert res == {"error": "the probe exited with status 3: (no output)"}


# ------------------------------------------------------------------ op_overhead
def test_op_overhead_worker_times_every_row():
    us = op_overhead.worker("pyflow", repeats=1, number=2)["us"]
    names = [*op_overhead.OPS, *(n + op_overhead.GRAD for n in op_overhead.OPS),
             op_overhead.FWD_BWD]
    assert list(us) == names and all(t > 0 for t in us.values())


def test_op_overhead_judges_each_row_by_its_target():
    torch_us = {"add": 1.0, "view": 1.0, "transpose": 1.0, op_overhead.FWD_BWD: 10.0}
    pyflow_us = {"add": 1.4, "view": 1.6, "transpose": 9.0, op_overhead.FWD_BWD: 19.0}
    rows, gm = op_overhead.rows_of({"torch": [torch_us], "pyflow": [pyflow_us]})
    met = {r[0]: (r[3], r[4], r[5]) for r in rows}
    assert met["add"] == ("1.40x", "<= 1.5x", "yes")
    assert met["view"] == ("1.60x", "<= 1.5x", "no")
    assert met["transpose"] == ("9.00x", "-", "-")          # shown, no target
    assert met[op_overhead.FWD_BWD] == ("1.90x", "<= 2.0x", "yes")
    assert gm == pytest.approx((1.4 * 1.6 * 9.0) ** (1 / 3))
