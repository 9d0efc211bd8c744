"""nn.Graph mixed precision: ``config.enable_amp`` traces build() under autocast
(the plan holds the casts, float32 master weights and updates) and the
remove_redundant_casts pass drops casts that change nothing."""
import numpy as np
import pytest

import pyflow as pf
import pyflow.nn as nn
import pyflow.nn.functional as F
from pyflow.graph import trace
from pyflow.graph.passes import remove_redundant_casts
from pyflow.ops.shape import Cast
from tests.helpers import executors, to_numpy

# the test device's type (cpu, or cuda under the simulator): eager references
# autocast there, as the graph's enable_amp does on every device type
DEV = pf.get_default_device().type
LOWER = {"cpu": pf.bfloat16, "cuda": pf.float16}[DEV]      # autocast's default there


def _mlp(seed=0):
    pf.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 4))


def _data(seed=1):
    rng = np.random.default_rng(seed)
    return (pf.tensor(rng.standard_normal((6, 8)).astype(np.float32)),
            pf.tensor(rng.integers(0, 4, 6)))


class TrainStep(nn.Graph):
    def __init__(self, model, opt, dtype=None, amp=True):
        super().__init__()
        self.model = model
        self.add_optimizer(opt)
        if amp:
            self.config.enable_amp(True, dtype=dtype)

    def build(self, x, y):
        loss = F.cross_entropy(self.model(x), y)
        loss.backward()
        return loss


def _casts(graph_obj):
    return [n for n in graph_obj.plans[0].stages[-1][1].nodes
            if n.kind == "call" and n.target is Cast]


@pytest.mark.cpu_only      # on the simulated device the float16 scaler test below covers it
@pytest.mark.parametrize("executor", executors("sequential", "actors"))
@pytest.mark.parametrize("dtype", [pf.bfloat16, pf.float16])
def test_amp_graph_trains_as_eager_autocast(dtype, executor):
    x, y = _data()
    eager_model, graph_model = _mlp(), _mlp()
    eager_opt = pf.optim.AdamW(eager_model.parameters(), lr=1e-2)
    step = TrainStep(graph_model, pf.optim.AdamW(graph_model.parameters(), lr=1e-2), dtype)
    step.config.set_executor(executor)
    for _ in range(4):
        eager_opt.zero_grad()
        with pf.autocast(DEV, dtype=dtype):
            loss = F.cross_entropy(eager_model(x), y)
        loss.backward()
        eager_opt.step()
        graph_loss = step(x, y)
        assert graph_loss.dtype is pf.float32
        np.testing.assert_allclose(to_numpy(graph_loss), to_numpy(loss), rtol=1e-6, atol=1e-7)
    for p, q in zip(eager_model.parameters(), graph_model.parameters()):
        assert q.dtype is pf.float32                     # the master weights stay float32
        np.testing.assert_allclose(to_numpy(q), to_numpy(p), rtol=1e-5, atol=1e-6)


def test_amp_graph_runs_the_products_in_the_lower_dtype():
    model = _mlp()
    step = TrainStep(model, pf.optim.SGD(model.parameters(), lr=0.1))
    step(*_data())
    casts = _casts(step)
    assert {n.args[1] for n in casts} >= {LOWER, pf.float32}
    linears = [n for n in step.plans[0].stages[-1][1].nodes
               if n.kind == "call" and n.target.__name__ in ("Linear", "Addmm", "Matmul")]
    assert linears and all(n.outputs[0].dtype is LOWER for n in linears)


@pytest.mark.cpu_only      # compiling only: device-independent
def test_amp_off_records_no_cast_and_switching_recompiles():
    model = _mlp()
    step = TrainStep(model, pf.optim.SGD(model.parameters(), lr=0.1), amp=False)
    x, y = _data()
    step(x, y)
    assert _casts(step) == []
    step.config.enable_amp(True)
    step(x, y)
    assert len(step.plans) == 2


class _Infer(nn.Graph):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn
        self.config.enable_amp(True, dtype=pf.bfloat16)

    def build(self, *args):
        return self.fn(*args)


def test_a_weight_read_by_two_products_is_cast_once():
    rng = np.random.default_rng(0)
    a, b, w = (pf.tensor(rng.standard_normal((4, 4)).astype(np.float32)) for _ in range(3))

    def fn(a, b):
        return a @ w + b @ w

    g = _Infer(fn)
    out = g(a, b)
    with pf.autocast(DEV, dtype=pf.bfloat16):
        expected = fn(a, b)
    np.testing.assert_array_equal(to_numpy(out.float()), to_numpy(expected.float()))
    w_casts = [n for n in _casts(g) if n.args[0].kind == "state"]
    assert len(w_casts) == 1
    assert "removed 1 casts" in g.plans[0].stages[1][1].history[-1][1]


def test_a_cast_pair_that_cancels_is_removed_and_a_rounding_pair_kept():
    x = pf.tensor(np.random.default_rng(0).standard_normal(6).astype(np.float32))

    def fn(x):
        h = x.bfloat16()
        return h.float().bfloat16() * 2.0, h.float().double().float()

    cleaned = remove_redundant_casts(trace(fn, [x]))
    kept = [n for n in cleaned.nodes if n.kind == "call" and n.target is Cast]
    # x -> bf16 stays; bf16 -> f32 once (the repeat goes); f32 -> bf16 cancels;
    # f32 -> f64 -> f32 cancels (float64 holds every float32 exactly)
    assert [n.args[1] for n in kept] == [pf.bfloat16, pf.float32, pf.float64]
    out = _Infer(fn)(x)
    expected = fn(x)
    for a, e in zip(out, expected):
        assert a.dtype is e.dtype
        np.testing.assert_array_equal(to_numpy(a.float()), to_numpy(e.float()))


def test_a_narrowing_then_widening_pair_is_kept():
    x = pf.tensor(np.linspace(0, 1, 7, dtype=np.float32))
    graph = remove_redundant_casts(trace(lambda x: x.bfloat16().float(), [x]))
    assert len([n for n in graph.nodes if n.kind == "call" and n.target is Cast]) == 2


@pytest.mark.parametrize("kwargs, kind, match", [
    (dict(dtype=pf.float64), TypeError, "dtype must be pyflow.bfloat16 or pyflow.float16"),
    (dict(dtype="fp8"), TypeError, "dtype must be pyflow.bfloat16 or pyflow.float16"),
    (dict(mode=1), TypeError, "mode must be a bool"),
])
def test_enable_amp_refuses_bad_arguments(kwargs, kind, match):
    with pytest.raises(kind, match=match):
        nn.Graph().config.enable_amp(**kwargs)


# ------------------------------------------------------------------ loss scaling
class ScaledTrainStep(TrainStep):
    def __init__(self, model, opt, scaler):
        super().__init__(model, opt, pf.float16)
        self.set_grad_scaler(scaler)


def _scaler():
    return pf.amp.GradScaler(DEV, init_scale=2.0 ** 10, growth_interval=2)


@pytest.mark.filterwarnings("ignore:invalid value encountered")   # the overflowing step
@pytest.mark.parametrize("executor", executors("sequential", "actors"))
def test_float16_graph_with_a_scaler_trains_as_the_eager_loop(executor):
    """Four clean steps (the scale grows twice), then an input that overflows in
    float16: the step is skipped (parameters unchanged) and the scale backs off,
    in the graph as in eager mode."""
    x, y = _data()
    huge = x * 1e5              # float16 products overflow to inf
    eager_model, graph_model = _mlp(), _mlp()
    eager_opt = pf.optim.SGD(eager_model.parameters(), lr=0.1, momentum=0.9)
    eager_scaler, graph_scaler = _scaler(), _scaler()
    step = ScaledTrainStep(graph_model, pf.optim.SGD(graph_model.parameters(), lr=0.1,
                                                     momentum=0.9), graph_scaler)
    step.config.set_executor(executor)
    for inputs in [x, x, x, x, huge]:
        before = [to_numpy(p).copy() for p in graph_model.parameters()]
        eager_opt.zero_grad()
        with pf.autocast(DEV, dtype=pf.float16):
            loss = F.cross_entropy(eager_model(inputs), y)
        eager_scaler.scale(loss).backward()
        eager_scaler.step(eager_opt)
        eager_scaler.update()
        graph_loss = step(inputs, y)
        np.testing.assert_allclose(to_numpy(graph_loss), to_numpy(loss), rtol=1e-6, atol=1e-7)
        assert graph_scaler.get_scale() == eager_scaler.get_scale()
        assert graph_scaler.last_step_skipped == eager_scaler.last_step_skipped
        for p, q in zip(eager_model.parameters(), graph_model.parameters()):
            np.testing.assert_allclose(to_numpy(q), to_numpy(p), rtol=1e-5, atol=1e-6)
    assert graph_scaler.last_step_skipped
    assert graph_scaler.get_scale() == 2.0 ** 11          # 2^10, x2 after steps 2 and 4, /2
    for b, p in zip(before, graph_model.parameters()):
        np.testing.assert_array_equal(to_numpy(p), b)      # the skipped step changed nothing
    assert "loss-scaled update" in pf.explain(step)


def test_set_grad_scaler_refuses_a_non_scaler_and_a_graph_without_optimizer():
    with pytest.raises(TypeError, match="expected a pyflow.amp.GradScaler"):
        nn.Graph().set_grad_scaler(2.0 ** 16)
    g = _Infer(lambda x: x * 2.0)
    g.set_grad_scaler(_scaler())
    with pytest.raises(RuntimeError, match="no optimizer"):
        g(pf.ones(2))
