"""Optimizer-update fusion (graph.config.allow_fuse_model_update_ops): one
multi-tensor update node per (optimizer, dtype, device) gives the numbers of
the per-parameter update nodes and of eager mode, over several steps, for
SGD with momentum (and Nesterov, weight decay) and AdamW, with parameters of
two dtypes; the multi-tensor kernels equal the single-tensor ones bit for bit
and refuse bad input clearly.  Runs on the default device (the cuda simulator
too: PYFLOW_TEST_DEVICE=cuda)."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

import pyflow as pf
from pyflow.graph.passes.model_update import MultiTensorUpdate, ParamUpdate
from pyflow.ops._util import kernel
from tests.helpers import executors


class TwoDtypes(pf.nn.Module):
    """A float32 path and a float64 path, so the optimizer holds parameters of
    both dtypes (two fused groups)."""

    def __init__(self):
        super().__init__()
        self.fc32 = pf.nn.Linear(6, 5)
        self.fc64 = pf.nn.Linear(6, 5).to(pf.float64)
        self.head = pf.nn.Linear(5, 3)

    def forward(self, x):
        h = self.fc32(x).relu() + self.fc64(x.double()).tanh().float()
        return self.head(h)


class TrainGraph(pf.nn.Graph):
    def __init__(self, model, optimizer, fuse, executor, scheduler=None):
        super().__init__()
        self.model = model
        self.add_optimizer(optimizer, lr_sch=scheduler)
        self.config.allow_fuse_model_update_ops(fuse)
        self.config.set_executor(executor)

    def build(self, x, y):
        loss = pf.nn.functional.cross_entropy(self.model(x), y)
        loss.backward()
        return loss


def _optimizer(name, params):
    if name == "sgd":
        return pf.optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=1e-3)
    if name == "nesterov":
        return pf.optim.SGD([{"params": params[:2], "lr": 0.02}, {"params": params[2:]}],
                            lr=0.05, momentum=0.8, nesterov=True)
    return pf.optim.AdamW(params, lr=3e-3, weight_decay=0.05)


def _batches(steps=3, seed=0):
    rng = np.random.default_rng(seed)
    return [(pf.tensor(rng.standard_normal((8, 6)).astype(np.float32)),
             pf.tensor(rng.integers(0, 3, 8))) for _ in range(steps)]


def _models(n):
    out = []
    for _ in range(n):
        pf.manual_seed(0)
        out.append(TwoDtypes())
    return out


def _host(t):
    return t.detach().cpu().numpy()


@pytest.mark.parametrize("executor", executors("sequential", "actors"))
@pytest.mark.parametrize("opt", ["sgd", "nesterov", "adamw"])
def test_fused_update_equals_unfused_and_eager(opt, executor):
    eager, plain, fused = _models(3)
    o_eager, o_plain, o_fused = (_optimizer(opt, list(m.parameters()))
                                 for m in (eager, plain, fused))
    g_plain = TrainGraph(plain, o_plain, False, executor)
    g_fused = TrainGraph(fused, o_fused, True, executor)
    for x, y in _batches():
        o_eager.zero_grad()
        loss = pf.nn.functional.cross_entropy(eager(x), y)
        loss.backward()
        o_eager.step()
        l_plain, l_fused = float(g_plain(x, y)), float(g_fused(x, y))
        assert l_fused == l_plain
        np.testing.assert_allclose(l_fused, float(loss), rtol=1e-6, atol=1e-7)
    for (name, p_eager), p_plain, p_fused in zip(eager.named_parameters(), plain.parameters(),
                                                  fused.parameters()):
        assert p_fused.dtype is p_eager.dtype
        np.testing.assert_array_equal(_host(p_fused), _host(p_plain), err_msg=name)
        np.testing.assert_allclose(_host(p_fused), _host(p_eager), rtol=1e-6, atol=1e-6,
                                   err_msg=name)
    for key in ("momentum_buffer", "exp_avg", "exp_avg_sq"):
        for p_plain, p_fused in zip(plain.parameters(), fused.parameters()):
            if key in o_plain.state[p_plain]:
                np.testing.assert_array_equal(_host(o_fused.state[p_fused][key]),
                                              _host(o_plain.state[p_plain][key]))


def test_one_update_node_per_optimizer_dtype_and_device_and_explain():
    (model,) = _models(1)
    opt = _optimizer("adamw", list(model.parameters()))
    graph = TrainGraph(model, opt, True, "sequential")
    graph(*_batches(1)[0])
    nodes = [n for n in graph.plans[0].graph.nodes if n.kind == "update"]
    assert len(nodes) == 2 and all(isinstance(n.target, MultiTensorUpdate) for n in nodes)
    assert sorted(len(n.target.slots) for n in nodes) == [2, 4]     # fc64; fc32 + head
    text = pf.explain(graph)
    assert "fuse_model_update      fused 6 update nodes into 2 multi-tensor update node(s)" \
        in text, text
    unfused = TrainGraph(_models(1)[0], opt, False, "sequential")
    unfused(*_batches(1)[0])
    nodes = [n for n in unfused.plans[0].graph.nodes if n.kind == "update"]
    assert len(nodes) == 6 and all(isinstance(n.target, ParamUpdate) for n in nodes)
    assert "fuse_model_update      off (graph.config)" in pf.explain(unfused)


def test_scheduler_steps_once_per_call_after_the_fused_update():
    results = []
    for fuse in (False, True):
        (model,) = _models(1)
        opt = pf.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        sched = pf.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        graph = TrainGraph(model, opt, fuse, "actors", sched)
        losses = [float(graph(x, y)) for x, y in _batches(3)]
        assert opt.param_groups[0]["lr"] == pytest.approx(0.1 * 0.5 ** 3)
        results.append((losses, [_host(p) for p in model.parameters()]))
    assert results[0][0] == results[1][0]
    for a, b in zip(results[0][1], results[1][1]):
        np.testing.assert_array_equal(a, b)


def test_a_custom_step_is_kept_whole():
    """An optimizer that overrides step() gets one node calling it, fused or not."""
    class Halving(pf.optim.SGD):
        def step(self, closure=None):
            self.calls = getattr(self, "calls", 0) + 1
            return super().step(closure)

    (model,) = _models(1)
    opt = Halving(model.parameters(), lr=0.1)
    graph = TrainGraph(model, opt, True, "sequential")
    graph(*_batches(1)[0])
    assert opt.calls == 1
    assert [n.name for n in graph.plans[0].graph.nodes if n.kind == "update"] == \
        ["optimizer_update_0"]


def test_gradient_accumulation_with_fused_update():
    eager, fused = _models(2)
    o_eager = _optimizer("adamw", list(eager.parameters()))
    o_fused = _optimizer("adamw", list(fused.parameters()))
    graph = TrainGraph(fused, o_fused, True, "sequential")
    graph.config.set_gradient_accumulation_steps(2)
    for x, y in _batches(2):
        o_eager.zero_grad()
        pf.nn.functional.cross_entropy(eager(x), y).backward()
        o_eager.step()
        graph(x, y)
    for p1, p2 in zip(eager.parameters(), fused.parameters()):
        np.testing.assert_allclose(_host(p2), _host(p1), rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ the kernels
def _device_arrays(values):
    return [pf.tensor(v)._data for v in values]


@given(sizes=st.lists(st.integers(1, 9), min_size=1, max_size=19),
       dtype=st.sampled_from([np.float32, np.float64]), amsgrad=st.booleans(),
       seed=st.integers(0, 2 ** 16))
def test_adam_multi_step_equals_adam_step(sizes, dtype, amsgrad, seed):
    """Past one chunk of TUPLE_WIDTH too; per-parameter hyperparameters and flags."""
    rng = np.random.default_rng(seed)
    dev = pf.tensor(0.0).device.type
    base = [[rng.standard_normal(n).astype(dtype) for n in sizes] for _ in range(2)] + \
        [[rng.random(n).astype(dtype) for n in sizes] for _ in range(2)]
    grads = _device_arrays([rng.standard_normal(n).astype(dtype) for n in sizes])
    single = [_device_arrays(b) for b in base]
    multi = [_device_arrays(b) for b in base]
    hparams = [(1.0 + i % 3, 1e-3 * (1 + i % 2), 0.9, 0.999, 1e-8, 0.01 * (i % 2))
               for i in range(len(sizes))]
    flags = [(amsgrad, i % 3 == 1, i % 2 == 0) for i in range(len(sizes))]
    for i, (h, f) in enumerate(zip(hparams, flags)):
        kernel("adam_step", dev)(single[0][i], grads[i], single[1][i], single[2][i],
                                 single[3][i], step=h[0], lr=h[1], beta1=h[2], beta2=h[3],
                                 eps=h[4], weight_decay=h[5], amsgrad=f[0], maximize=f[1],
                                 decoupled_weight_decay=f[2])
    kernel("adam_multi_step", dev)(multi[0], grads, multi[1], multi[2],
                                   multi[3] if amsgrad else [None] * len(sizes), hparams, flags)
    for a, b in zip(single, multi):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(pf.Tensor._make(y, pf.dtypes.from_numpy(y.dtype),
                                                          pf.tensor(0.0).device).cpu().numpy(),
                                          pf.Tensor._make(x, pf.dtypes.from_numpy(x.dtype),
                                                          pf.tensor(0.0).device).cpu().numpy())


@given(sizes=st.lists(st.integers(1, 9), min_size=1, max_size=19),
       dtype=st.sampled_from([np.float32, np.float64]), seed=st.integers(0, 2 ** 16))
def test_sgd_multi_step_equals_sgd_step(sizes, dtype, seed):
    rng = np.random.default_rng(seed)
    dev = pf.tensor(0.0).device.type
    base = [[rng.standard_normal(n).astype(dtype) for n in sizes] for _ in range(2)]
    grads = _device_arrays([rng.standard_normal(n).astype(dtype) for n in sizes])
    single, multi = [_device_arrays(b) for b in base], [_device_arrays(b) for b in base]
    hparams = [(0.1, 0.9 * (i % 3 > 0), 0.0, 0.01 * (i % 2)) for i in range(len(sizes))]
    flags = [(i % 3 == 2, i % 4 == 1, i % 5 == 0) for i in range(len(sizes))]
    for i, (h, f) in enumerate(zip(hparams, flags)):
        kernel("sgd_step", dev)(single[0][i], grads[i], single[1][i] if h[1] else None,
                                lr=h[0], momentum=h[1], dampening=h[2], weight_decay=h[3],
                                nesterov=f[0], maximize=f[1], first_step=f[2])
    kernel("sgd_multi_step", dev)(multi[0], grads,
                                  [b if h[1] else None for b, h in zip(multi[1], hparams)],
                                  hparams, flags)
    device = pf.tensor(0.0).device
    for a, b in zip(single, multi):
        for x, y in zip(a, b):
            to_host = lambda arr: pf.Tensor._make(arr, pf.dtypes.from_numpy(arr.dtype),  # noqa
                                                  device).cpu().numpy()
            np.testing.assert_array_equal(to_host(y), to_host(x))


def test_multi_step_kernels_refuse_bad_input():
    dev = pf.tensor(0.0).device.type
    f32 = lambda n: pf.zeros(n)._data                           # noqa: E731
    f64 = lambda n: pf.zeros(n, dtype=pf.float64)._data         # noqa: E731
    adam = kernel("adam_multi_step", dev)
    sgd = kernel("sgd_multi_step", dev)
    hp = (1.0, 1e-3, 0.9, 0.999, 1e-8, 0.0)
    with pytest.raises(ValueError, match="'grads' has 1 entries, expected 2"):
        adam([f32(3), f32(2)], [f32(3)], [f32(3), f32(2)], [f32(3), f32(2)], [None, None],
             [hp, hp], [(False,) * 3] * 2)
    with pytest.raises(ValueError, match=r"'grads\[0\]' has 4 elements, expected 3"):
        adam([f32(3)], [f32(4)], [f32(3)], [f32(3)], [None], [hp], [(False,) * 3])
    with pytest.raises(TypeError, match=r"'params\[1\]' has dtype float64, expected float32"):
        adam([f32(3), f64(3)], [f32(3), f64(3)], [f32(3), f64(3)], [f32(3), f64(3)],
             [None, None], [hp, hp], [(False,) * 3] * 2)
    with pytest.raises(ValueError, match="Invalid beta parameter at index 0: 1.5"):
        adam([f32(3)], [f32(3)], [f32(3)], [f32(3)], [None], [(1.0, 1e-3, 1.5, 0.9, 1e-8, 0)],
             [(False,) * 3])
    with pytest.raises(ValueError, match="amsgrad=True for parameter 0 needs"):
        adam([f32(3)], [f32(3)], [f32(3)], [f32(3)], [None], [hp], [(True, False, False)])
    with pytest.raises(ValueError, match="step of parameter 0 must be >= 1"):
        adam([f32(3)], [f32(3)], [f32(3)], [f32(3)], [None], [(0.0,) + hp[1:]], [(False,) * 3])
    with pytest.raises(ValueError, match="momentum != 0 for parameter 0 needs"):
        sgd([f32(3)], [f32(3)], [None], [(0.1, 0.9, 0.0, 0.0)], [(False,) * 3])
    with pytest.raises(ValueError, match="Nesterov momentum requires"):
        sgd([f32(3)], [f32(3)], [f32(3)], [(0.1, 0.9, 0.5, 0.0)], [(True, False, False)])
    with pytest.raises(TypeError, match="'params' must be a list of arrays"):
        sgd(f32(3), [f32(3)], [None], [(0.1, 0.0, 0.0, 0.0)], [(False,) * 3])
