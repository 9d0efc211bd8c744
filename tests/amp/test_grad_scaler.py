"""GradScaler against torch.amp.GradScaler, and its unscale kernel against NumPy."""
import math

import numpy as np
import pytest

import pyflow as pf
from pyflow import nn
from pyflow.amp import GradScaler
from pyflow.kernels.registry import get
from pyflow.kernels.cpu.optim import TUPLE_WIDTH

unscale_check = get("amp_unscale_check", "cpu")

STEPS = 8
BAD_STEPS = {1: math.inf, 4: math.nan, 5: -math.inf}   # step -> value injected in a grad


def _data():
    rng = np.random.default_rng(0)
    return (rng.standard_normal((STEPS, 5, 3)).astype(np.float32),
            rng.standard_normal((STEPS, 5, 2)).astype(np.float32))


def _run_pyflow(weight, bias, growth_interval=2):
    xs, ys = _data()
    model = nn.Linear(3, 2)
    with pf.no_grad():
        model.weight.copy_(pf.tensor(weight))
        model.bias.copy_(pf.tensor(bias))
    opt = pf.optim.SGD(model.parameters(), lr=0.1)
    scaler = GradScaler("cpu", init_scale=2.0 ** 10, growth_interval=growth_interval)
    scales, skipped, params = [], [], []
    for step in range(STEPS):
        opt.zero_grad()
        loss = ((model(pf.tensor(xs[step])) - pf.tensor(ys[step])) ** 2).mean()
        scaler.scale(loss).backward()
        if step in BAD_STEPS:
            model.weight.grad._data[0, 1] = BAD_STEPS[step]
        before = model.weight.detach().numpy().copy()
        ret = scaler.step(opt)
        skipped.append(scaler.last_step_skipped)
        if scaler.last_step_skipped:
            assert ret is None
            np.testing.assert_array_equal(model.weight.detach().numpy(), before)
        scaler.update()
        scales.append(scaler.get_scale())
        params.append((model.weight.detach().numpy().copy(), model.bias.detach().numpy().copy()))
    return scales, skipped, params


def _run_torch(torch, weight, bias, growth_interval=2):
    xs, ys = _data()
    model = torch.nn.Linear(3, 2)
    with torch.no_grad():
        model.weight.copy_(torch.tensor(weight))
        model.bias.copy_(torch.tensor(bias))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10, growth_interval=growth_interval)
    scales, skipped, params = [], [], []
    for step in range(STEPS):
        opt.zero_grad()
        loss = ((model(torch.tensor(xs[step])) - torch.tensor(ys[step])) ** 2).mean()
        scaler.scale(loss).backward()
        if step in BAD_STEPS:
            model.weight.grad[0, 1] = BAD_STEPS[step]
        before = model.weight.detach().clone()
        scale_before = scaler.get_scale()
        scaler.step(opt)
        scaler.update()
        skipped.append(scaler.get_scale() < scale_before)
        assert not skipped[-1] or torch.equal(model.weight.detach(), before)
        scales.append(scaler.get_scale())
        params.append((model.weight.detach().numpy().copy(), model.bias.detach().numpy().copy()))
    return scales, skipped, params


def test_matches_torch_grad_scaler():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    weight = rng.standard_normal((2, 3)).astype(np.float32)
    bias = rng.standard_normal(2).astype(np.float32)
    p_scales, p_skipped, p_params = _run_pyflow(weight, bias)
    t_scales, t_skipped, t_params = _run_torch(torch, weight, bias)
    assert p_scales == t_scales
    assert p_skipped == t_skipped == [s in BAD_STEPS for s in range(STEPS)]
    assert any(b > a for a, b in zip(p_scales, p_scales[1:]))   # growth, not only backoff
    for (pw, pb), (tw, tb) in zip(p_params, t_params):
        np.testing.assert_allclose(pw, tw, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(pb, tb, rtol=1e-6, atol=1e-6)


# ----------------------------------------------------------------- the kernel
def _reference(arrays, inv_scale):
    """float64 NumPy: values times float32(inv_scale), and whether any was inf/nan."""
    inv = float(np.float32(inv_scale))
    found = any(not np.isfinite(a.astype(np.float64)).all() for a in arrays)
    return [np.asarray(a.astype(np.float64) * inv, a.dtype) for a in arrays], found


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_kernel_unscales_many_tensors_like_numpy(dtype):
    rng = np.random.default_rng(2)
    shapes = [(0,), (3, 4), (7,), ()] + [(i + 1,) for i in range(2 * TUPLE_WIDTH)]
    arrays = [np.asarray(rng.standard_normal(s) * 1000, dtype) for s in shapes]
    expect, found = _reference(arrays, 1 / 3)
    assert unscale_check(arrays, 1 / 3) is False and found is False
    for a, e in zip(arrays, expect):
        np.testing.assert_allclose(a, e, rtol=1e-3 if dtype == np.float16 else 1e-6)
    assert not np.array_equal(arrays[1], expect[1] * 3)     # values did change


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
@pytest.mark.parametrize("where", [0, TUPLE_WIDTH + 3, 2 * TUPLE_WIDTH + 1])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_kernel_finds_non_finite_in_any_tensor(bad, where, dtype):
    arrays = [np.full(5, 4.0, dtype) for _ in range(2 * TUPLE_WIDTH + 2)]
    arrays[where][2] = bad
    assert unscale_check(arrays, 0.25) is True
    # every tensor is still unscaled, the finite values exactly
    assert all(a[0] == 1.0 for a in arrays)
    assert np.isnan(arrays[where][2]) if np.isnan(bad) else arrays[where][2] == bad


def test_kernel_mixed_dtypes_and_non_contiguous():
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    view = base[:, ::2]                       # non-contiguous: the NumPy path
    f64 = np.ones(3, np.float64) * 8
    half = np.array([2.0, np.inf], np.float16)
    assert unscale_check([view, f64, half], 0.5) is True
    np.testing.assert_array_equal(base[:, ::2], np.arange(24).reshape(4, 6)[:, ::2] * 0.5)
    np.testing.assert_array_equal(base[:, 1::2], np.arange(24).reshape(4, 6)[:, 1::2])
    np.testing.assert_array_equal(f64, [4.0, 4.0, 4.0])
    assert half[0] == 1.0 and np.isinf(half[1])
    assert unscale_check([], 0.5) is False


def test_kernel_argument_errors():
    with pytest.raises(TypeError, match="grads\\[1\\].*uint16"):
        unscale_check([np.ones(2, np.float32), np.ones(2, np.uint16)], 0.5)
    readonly = np.ones(2, np.float32)
    readonly.flags.writeable = False
    with pytest.raises(ValueError, match="grads\\[0\\].*writeable"):
        unscale_check([readonly], 0.5)
    with pytest.raises(TypeError, match="'grads' must be a list"):
        unscale_check(np.ones(2, np.float32), 0.5)
    with pytest.raises(TypeError, match="inv_scale"):
        unscale_check([np.ones(2, np.float32)], "0.5")


# ----------------------------------------------------------------- the scaler
def _params(*values, dtype=pf.float32):
    return [pf.tensor(np.asarray(v, np.float32), dtype=dtype, requires_grad=True)
            for v in values]


def _set_grads(params, grads):
    for p, g in zip(params, grads):
        p.grad = pf.tensor(np.asarray(g, np.float32), dtype=p.dtype)


def test_unscale_skips_params_without_grad_and_bfloat16():
    ps = _params([1.0, 2.0], [3.0]) + _params([1.0, 1.0], dtype=pf.bfloat16)
    opt = pf.optim.SGD(ps, lr=1.0)
    scaler = GradScaler(init_scale=4.0)
    scaler.scale(pf.tensor(1.0))
    _set_grads([ps[0], ps[2]], [[8.0, 4.0], [12.0, 2.0]])      # ps[1] has no grad
    scaler.unscale_(opt)
    np.testing.assert_array_equal(ps[0].grad.numpy(), [2.0, 1.0])
    np.testing.assert_array_equal(ps[2].grad.float().numpy(), [3.0, 0.5])
    assert ps[2].grad.dtype is pf.bfloat16 and ps[1].grad is None
    with pytest.raises(RuntimeError, match="unscale_\\(\\) has already been called"):
        scaler.unscale_(opt)
    assert scaler.step(opt) is None and scaler.last_step_skipped is False
    np.testing.assert_array_equal(ps[0].detach().numpy(), [-1.0, 1.0])   # once unscaled
    with pytest.raises(RuntimeError, match="step\\(\\) has already been called"):
        scaler.step(opt)
    with pytest.raises(RuntimeError, match="after step"):
        scaler.unscale_(opt)


def test_bfloat16_inf_grad_skips_step():
    (p,) = _params([1.0, 2.0], dtype=pf.bfloat16)
    opt = pf.optim.SGD([p], lr=1.0)
    scaler = GradScaler(init_scale=8.0)
    scaler.scale(pf.tensor(1.0))
    _set_grads([p], [[np.inf, 1.0]])
    assert scaler.step(opt) is None and scaler.last_step_skipped is True
    np.testing.assert_array_equal(p.detach().float().numpy(), [1.0, 2.0])
    scaler.update()
    assert scaler.get_scale() == 4.0


def test_float16_grads_rejected_like_torch():
    (p,) = _params([1.0], dtype=pf.float16)
    opt = pf.optim.SGD([p], lr=1.0)
    scaler = GradScaler()
    scaler.scale(pf.tensor(1.0))
    _set_grads([p], [[1.0]])
    with pytest.raises(ValueError, match="FP16 gradients"):
        scaler.unscale_(opt)


def test_scale_nested_outputs_and_step_return_value():
    scaler = GradScaler(init_scale=3.0)
    a, b, c = pf.tensor([1.0, 2.0]), pf.tensor(2.0), pf.tensor([4.0], dtype=pf.float64)
    out = scaler.scale([a, (b, [c])])
    assert isinstance(out, list) and isinstance(out[1], tuple) and isinstance(out[1][1], list)
    np.testing.assert_array_equal(out[0].numpy(), [3.0, 6.0])
    assert out[1][0].item() == 6.0 and out[1][1][0].item() == 12.0
    assert out[1][1][0].dtype is pf.float64
    assert scaler.scale(pf.tensor(2.0, dtype=pf.float16)).dtype is pf.float32   # as torch
    with pytest.raises(ValueError, match="outputs must be a Tensor"):
        scaler.scale(3.0)

    class Opt(pf.optim.SGD):
        def step(self, closure=None):
            super().step()
            return "stepped"
    (p,) = _params([1.0])
    opt = Opt([p], lr=1.0)
    _set_grads([p], [[3.0]])
    assert scaler.step(opt) == "stepped" and scaler.last_step_skipped is False
    assert p.item() == 0.0


def test_update_growth_backoff_and_new_scale():
    (p,) = _params([1.0])
    opt = pf.optim.SGD([p], lr=0.0)
    scaler = GradScaler(init_scale=16.0, growth_factor=4.0, backoff_factor=0.25,
                        growth_interval=3)
    with pytest.raises(RuntimeError, match="_scale is None"):
        scaler.update()
    expected = []
    for grad in [1.0, 1.0, 1.0, np.nan, 1.0]:
        scaler.scale(pf.tensor(1.0))
        _set_grads([p], [[grad]])
        scaler.step(opt)
        scaler.update()
        expected.append(scaler.get_scale())
    assert expected == [16.0, 16.0, 64.0, 16.0, 16.0]
    assert scaler.state_dict()["_growth_tracker"] == 1
    with pytest.raises(RuntimeError, match="No inf checks"):
        scaler.update()
    scaler.update(new_scale=0.1)
    assert scaler.get_scale() == float(np.float32(0.1))
    scaler.update(new_scale=pf.tensor([5.0]))
    assert scaler.get_scale() == 5.0
    with pytest.raises(ValueError, match="new_scale"):
        scaler.update(new_scale=pf.tensor([1.0, 2.0]))
    with pytest.raises(TypeError, match="new_scale"):
        scaler.update(new_scale="2")


def test_growth_stops_at_float32_overflow():
    (p,) = _params([1.0])
    opt = pf.optim.SGD([p], lr=0.0)
    scaler = GradScaler(init_scale=2.0 ** 127, growth_interval=1)
    scaler.scale(pf.tensor(1.0))
    _set_grads([p], [[0.0]])
    scaler.step(opt)
    scaler.update()
    assert scaler.get_scale() == 2.0 ** 127 and scaler.state_dict()["_growth_tracker"] == 0


def test_state_dict_round_trip():
    a = GradScaler(init_scale=8.0, growth_factor=3.0, backoff_factor=0.125,
                   growth_interval=7)
    (p,) = _params([1.0])
    opt = pf.optim.SGD([p], lr=0.0)
    a.scale(pf.tensor(1.0))
    _set_grads([p], [[np.inf]])
    a.step(opt)
    a.update()
    sd = a.state_dict()
    assert sd == {"scale": 1.0, "growth_factor": 3.0, "backoff_factor": 0.125,
                  "growth_interval": 7, "_growth_tracker": 0}
    b = GradScaler()
    b.load_state_dict(sd)
    assert b.state_dict() == sd
    assert b.get_growth_factor() == 3.0 and b.get_backoff_factor() == 0.125
    assert b.get_growth_interval() == 7
    with pytest.raises(RuntimeError, match="state dict is empty"):
        b.load_state_dict({})
    with pytest.raises(ValueError, match="_growth_tracker"):
        b.load_state_dict({k: v for k, v in sd.items() if k != "_growth_tracker"})


def test_state_dict_keys_match_torch():
    torch = pytest.importorskip("torch")
    ours = GradScaler(init_scale=32.0, growth_interval=5).state_dict()
    theirs = torch.amp.GradScaler("cpu", init_scale=32.0, growth_interval=5).state_dict()
    assert ours == theirs


def test_disabled_is_pass_through():
    scaler = GradScaler(enabled=False, growth_factor=0.1)     # not checked when disabled
    assert not scaler.is_enabled()
    loss = pf.tensor(3.0)
    assert scaler.scale(loss) is loss
    (p,) = _params([1.0])
    opt = pf.optim.SGD([p], lr=1.0)
    _set_grads([p], [[np.inf]])
    scaler.unscale_(opt)
    scaler.step(opt)                       # steps even with an inf grad, as torch does
    assert np.isinf(p.item()) and scaler.last_step_skipped is False
    scaler.update()
    assert scaler.get_scale() == 1.0 and scaler.state_dict() == {}
    scaler.load_state_dict({})


@pytest.mark.parametrize("kwargs, name", [
    ({"growth_factor": 1.0}, "growth_factor"),
    ({"backoff_factor": 1.0}, "backoff_factor"),
    ({"backoff_factor": 0.0}, "backoff_factor"),
    ({"growth_interval": 0}, "growth_interval"),
    ({"growth_interval": 2.5}, "growth_interval"),
    ({"init_scale": -1.0}, "init_scale"),
    ({"device": "tpu"}, "device"),
])
def test_argument_errors_name_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        GradScaler(**kwargs)


def test_setters_check_their_argument():
    scaler = GradScaler()
    scaler.set_growth_factor(3.0)
    scaler.set_backoff_factor(0.25)
    scaler.set_growth_interval(10)
    assert (scaler.get_growth_factor(), scaler.get_backoff_factor(),
            scaler.get_growth_interval()) == (3.0, 0.25, 10)
    with pytest.raises(ValueError, match="growth_factor"):
        scaler.set_growth_factor(0.5)
    with pytest.raises(ValueError, match="backoff_factor"):
        scaler.set_backoff_factor(2.0)
    with pytest.raises(ValueError, match="growth_interval"):
        scaler.set_growth_interval(-1)


def test_unscale_before_scale_and_closure_errors():
    (p,) = _params([1.0])
    opt = pf.optim.SGD([p], lr=1.0)
    scaler = GradScaler()
    with pytest.raises(RuntimeError, match="scaler.scale"):
        scaler.unscale_(opt)
    scaler.scale(pf.tensor(1.0))
    with pytest.raises(RuntimeError, match="Closure"):
        scaler.step(opt, closure=lambda: None)


SIMULATED_CUDA = """
import numpy as np
from pyflow.kernels.registry import get
from pyflow.kernels.cuda._memory import to_device, to_host
cpu, gpu = get("amp_unscale_check", "cpu"), get("amp_unscale_check", "cuda")
rng = np.random.default_rng(3)
for bad in (None, np.inf, -np.inf, np.nan):
    host = [rng.standard_normal((4, 6)).astype(np.float32),
            rng.standard_normal(5).astype(np.float64), np.zeros(0, np.float32),
            rng.standard_normal(3).astype(np.float16)]
    if bad is not None:
        host[1][2] = bad
    dev = [to_device(a) for a in host]
    dev[0] = dev[0][:, ::2]                   # non-contiguous on both sides
    host[0] = host[0][:, ::2]
    assert gpu(dev, 1 / 3) == cpu(host, 1 / 3) == (bad is not None), bad
    for d, h in zip(dev, host):
        np.testing.assert_array_equal(to_host(d), h)
print("ok")
"""


def test_cuda_kernel_matches_cpu_in_the_simulator():
    import os
    import subprocess
    import sys
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    out = subprocess.run([sys.executable, "-c", SIMULATED_CUDA], capture_output=True,
                         text=True, env=env, timeout=120)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]
