"""Optimizers against torch.optim: same params, same grads, several steps."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

import pyflow as pf
from pyflow.nn.parameter import Parameter
from tests.helpers import assert_close, needs_torch, shapes, torch

SHAPES = [(3, 4), (5,), (2, 1, 3)]
STEPS = 6


def _grads(seed, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return [[rng.standard_normal(s).astype(dtype) for s in SHAPES] for _ in range(STEPS)]


def _init(dtype=np.float32):
    rng = np.random.default_rng(0)
    return [rng.standard_normal(s).astype(dtype) for s in SHAPES]


def _run_pair(make_pf, make_torch, dtype=np.float32, steps=STEPS, groups=None):
    """Run both optimizers on identical params and gradient streams; return params."""
    init = _init(dtype)
    pps = [Parameter(pf.tensor(x)) for x in init]
    tps = [torch.tensor(x, requires_grad=True) for x in init]
    if groups is None:
        popt, topt = make_pf(pps), make_torch(tps)
    else:
        popt = make_pf([dict(g, params=[pps[i] for i in idx]) for idx, g in groups])
        topt = make_torch([dict(g, params=[tps[i] for i in idx]) for idx, g in groups])
    for grads in _grads(1, dtype)[:steps]:
        for p, t, g in zip(pps, tps, grads):
            p.grad = pf.tensor(g)
            t.grad = torch.tensor(g)
        popt.step()
        topt.step()
    return pps, tps, popt, topt


def _assert_same(pps, tps, rtol=1e-6, atol=1e-7):
    for i, (p, t) in enumerate(zip(pps, tps)):
        assert_close(p, t.detach().cpu().numpy(), rtol=rtol, atol=atol, msg=f"param {i}")


SGD_CASES = {
    "plain": dict(lr=0.1),
    "momentum": dict(lr=0.1, momentum=0.9),
    "dampening": dict(lr=0.05, momentum=0.8, dampening=0.3),
    "nesterov": dict(lr=0.1, momentum=0.9, nesterov=True),
    "weight_decay": dict(lr=0.1, momentum=0.5, weight_decay=0.01),
    "maximize": dict(lr=0.1, momentum=0.9, maximize=True, weight_decay=0.1),
}
ADAM_CASES = {
    "plain": dict(lr=0.01),
    "betas": dict(lr=0.02, betas=(0.8, 0.99), eps=1e-6),
    "weight_decay": dict(lr=0.01, weight_decay=0.1),
    "amsgrad": dict(lr=0.01, amsgrad=True),
    "maximize": dict(lr=0.01, maximize=True, amsgrad=True, weight_decay=0.05),
}


@needs_torch
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", sorted(SGD_CASES))
def test_sgd_matches_torch(case, dtype):
    kw = SGD_CASES[case]
    pps, tps, _, _ = _run_pair(lambda p: pf.optim.SGD(p, **kw),
                               lambda p: torch.optim.SGD(p, **kw), dtype)
    _assert_same(pps, tps, rtol=1e-6 if dtype == np.float32 else 1e-12)


@needs_torch
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("cls", ["Adam", "AdamW"])
@pytest.mark.parametrize("case", sorted(ADAM_CASES))
def test_adam_matches_torch(cls, case, dtype):
    kw = ADAM_CASES[case]
    pps, tps, popt, topt = _run_pair(lambda p: getattr(pf.optim, cls)(p, **kw),
                                     lambda p: getattr(torch.optim, cls)(p, **kw), dtype)
    _assert_same(pps, tps, rtol=1e-6 if dtype == np.float32 else 1e-12)
    for p, t in zip(pps, tps):
        ps, ts = popt.state[p], topt.state[t]
        assert sorted(ps) == sorted(ts)
        assert ps["step"].item() == ts["step"].item() == STEPS
        assert_close(ps["exp_avg_sq"], ts["exp_avg_sq"].cpu().numpy(), rtol=1e-6, atol=1e-12)


@needs_torch
@given(shape=shapes(0, 3, 1, 6), seed=st.integers(0, 2**16), name=st.sampled_from(
    ["SGD", "Adam", "AdamW"]), lr=st.floats(1e-4, 0.5), wd=st.sampled_from([0.0, 1e-3, 0.3]),
    flag=st.booleans(), maximize=st.booleans(), double=st.booleans())
def test_random_shapes_and_hyperparameters_match_torch(shape, seed, name, lr, wd, flag,
                                                       maximize, double):
    dtype = np.float64 if double else np.float32
    kw = dict(lr=lr, weight_decay=wd, maximize=maximize)
    if name == "SGD":
        kw.update(momentum=0.8, nesterov=flag)
    else:
        kw.update(amsgrad=flag, betas=(0.85, 0.995))
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(dtype)
    p, t = Parameter(pf.tensor(x)), torch.tensor(x, requires_grad=True)
    popt, topt = getattr(pf.optim, name)([p], **kw), getattr(torch.optim, name)([t], **kw)
    for _ in range(4):
        g = rng.standard_normal(shape).astype(dtype)
        p.grad, t.grad = pf.tensor(g), torch.tensor(g)
        popt.step()
        topt.step()
    assert_close(p, t.detach().cpu().numpy(), rtol=1e-5 if not double else 1e-12,
                 atol=1e-6 if not double else 1e-14)


@needs_torch
@pytest.mark.parametrize("name,kw", [("SGD", dict(momentum=0.9)), ("Adam", {}),
                                     ("AdamW", dict(weight_decay=0.1))])
def test_param_groups_with_different_options(name, kw):
    groups = [([0, 2], dict(lr=0.1)), ([1], dict(lr=0.01, weight_decay=0.2))]
    pps, tps, popt, topt = _run_pair(lambda g: getattr(pf.optim, name)(g, lr=0.5, **kw),
                                     lambda g: getattr(torch.optim, name)(g, lr=0.5, **kw),
                                     groups=groups)
    _assert_same([pps[0], pps[2], pps[1]], [tps[0], tps[2], tps[1]])
    assert popt.state_dict()["param_groups"][1]["params"] == [2]
    assert [g["lr"] for g in popt.param_groups] == [0.1, 0.01]


@needs_torch
def test_adamw_decoupled_differs_from_adam_l2():
    kw = dict(lr=0.01, weight_decay=0.5)
    a, _, _, _ = _run_pair(lambda p: pf.optim.Adam(p, **kw), lambda p: torch.optim.Adam(p, **kw))
    w, _, _, _ = _run_pair(lambda p: pf.optim.AdamW(p, **kw), lambda p: torch.optim.AdamW(p, **kw))
    assert not np.allclose(a[0].detach().cpu().numpy(), w[0].detach().cpu().numpy())


def test_params_without_grad_are_skipped_and_get_no_state():
    p, q = Parameter(pf.ones(3)), Parameter(pf.ones(3))
    opt = pf.optim.Adam([p, q], lr=0.1)
    p.grad = pf.ones(3)
    opt.step()
    assert q not in opt.state and len(opt.state[p]) == 3
    assert_close(q, np.ones(3))
    assert (p.detach().cpu().numpy() < 1).all()


def test_step_bumps_version_and_updates_in_place():
    p = Parameter(pf.ones(4))
    data_ptr, v0 = p.data_ptr(), p._version[0]
    opt = pf.optim.SGD([p], lr=0.5)
    p.grad = pf.ones(4)
    opt.step()
    assert p.data_ptr() == data_ptr and p._version[0] == v0 + 1
    assert_close(p, np.full(4, 0.5))


def test_closure_runs_with_grad_enabled_and_returns_loss():
    x = pf.tensor([1.0, 2.0])
    p = Parameter(pf.tensor([0.5, -0.5]))
    opt = pf.optim.SGD([p], lr=0.1)

    def closure():
        opt.zero_grad()
        loss = ((p * x) ** 2).sum()
        loss.backward()
        return loss

    with pf.no_grad():
        loss = opt.step(closure)
    assert_close(loss, 0.5 ** 2 + 1.0)
    assert_close(p, np.array([0.5, -0.5]) - 0.1 * 2 * np.array([0.5, -1.0]) * np.array([1, 2]))


def test_zero_grad():
    p = Parameter(pf.ones(3))
    opt = pf.optim.SGD([p], lr=0.1)
    p.grad = pf.ones(3)
    opt.zero_grad(set_to_none=False)
    assert p.grad is not None and (p.grad.cpu().numpy() == 0).all()
    opt.zero_grad()
    assert p.grad is None


@pytest.mark.parametrize("dtype", [pf.float16, pf.bfloat16])
def test_half_precision_params_and_noncontiguous_params(dtype):
    """Half params are updated through a float32 copy (state kept in float32)."""
    x = np.linspace(-1, 1, 6).reshape(2, 3)
    p = Parameter(pf.tensor(x, dtype=dtype))
    opt = pf.optim.SGD([p], lr=0.25, momentum=0.5)
    for _ in range(2):
        p.grad = pf.tensor(np.ones((2, 3)), dtype=dtype)
        opt.step()
    assert p.dtype is dtype and opt.state[p]["momentum_buffer"].dtype is pf.float32
    assert_close(p.float(), x - 0.25 * (1 + 1.5), rtol=1e-2, atol=1e-2)
    base = pf.tensor(np.arange(6.0).reshape(3, 2), dtype=pf.float32)
    view = Parameter(base.t())          # a transposed (non-contiguous) parameter
    opt = pf.optim.Adam([view], lr=0.1)
    view.grad = pf.ones(2, 3)
    opt.step()
    assert_close(view, np.arange(6.0).reshape(3, 2).T - 0.1, rtol=1e-5)


# ----------------------------------------------------------------- state dict
@needs_torch
@pytest.mark.parametrize("name,kw", [("SGD", dict(lr=0.1, momentum=0.9, nesterov=True)),
                                     ("Adam", dict(lr=0.01, amsgrad=True)),
                                     ("AdamW", dict(lr=0.01))])
def test_state_dict_round_trip_continues_like_an_uninterrupted_run(name, kw, tmp_path):
    grads = _grads(7)
    init = _init()

    def run(split):
        ps = [Parameter(pf.tensor(x)) for x in init]
        opt = getattr(pf.optim, name)(ps, **kw)
        for step, gs in enumerate(grads):
            if step == split:  # save, rebuild everything from the checkpoint, continue
                pf.save({"params": [p.detach() for p in ps], "optim": opt.state_dict(),
                         "step": step}, tmp_path / "ckpt")
                ck = pf.load(tmp_path / "ckpt")
                assert ck["step"] == split
                ps = [Parameter(t) for t in ck["params"]]
                opt = getattr(pf.optim, name)(ps, lr=123.0)  # lr comes from the checkpoint
                opt.load_state_dict(ck["optim"])
            for p, g in zip(ps, gs):
                p.grad = pf.tensor(g)
            opt.step()
        return ps

    straight, resumed = run(None), run(3)
    for a, b in zip(straight, resumed):
        np.testing.assert_array_equal(a.detach().cpu().numpy(), b.detach().cpu().numpy())
    # the layout is torch's: torch can load ours
    ps, tps = run(None), [torch.tensor(x, requires_grad=True) for x in init]
    opt = getattr(pf.optim, name)(ps, **kw)
    topt = getattr(torch.optim, name)(tps, **kw)
    sd = opt.state_dict()
    assert set(sd) == {"state", "param_groups"}
    assert sorted(sd["param_groups"][0]) == sorted(topt.state_dict()["param_groups"][0])


def test_load_state_dict_rejects_mismatched_groups():
    a, b, c = (Parameter(pf.ones(2)) for _ in range(3))
    sd = pf.optim.SGD([a, b], lr=0.1).state_dict()
    with pytest.raises(ValueError, match="different number of parameter groups"):
        pf.optim.SGD([{"params": [a]}, {"params": [b]}], lr=0.1).load_state_dict(sd)
    with pytest.raises(ValueError, match="doesn't match the size of optimizer's group"):
        pf.optim.SGD([a, b, c], lr=0.1).load_state_dict(sd)
    with pytest.raises(ValueError, match="'state' and 'param_groups'"):
        pf.optim.SGD([a], lr=0.1).load_state_dict({"state": {}})
    opt = pf.optim.SGD([a, b], lr=0.1, momentum=0.9)
    a.grad = b.grad = pf.ones(2)
    opt.step()
    with pytest.raises(ValueError, match=r"'momentum_buffer' of shape \(2,\) for parameter 0, "
                                         r"but that parameter has shape \(5,\)"):
        pf.optim.SGD([Parameter(pf.ones(5)), c], lr=0.1).load_state_dict(opt.state_dict())


def test_load_state_dict_copies_and_casts_state():
    p = Parameter(pf.ones(3, dtype=pf.float64))
    opt = pf.optim.Adam([p], lr=0.1)
    p.grad = pf.ones(3, dtype=pf.float64)
    opt.step()
    sd = opt.state_dict()
    sd["state"][0]["exp_avg"] = sd["state"][0]["exp_avg"].float()
    opt2 = pf.optim.Adam([p], lr=0.1)
    opt2.load_state_dict(sd)
    assert opt2.state[p]["exp_avg"].dtype is pf.float64
    assert opt2.state[p]["step"] is not opt.state[p]["step"]


# ----------------------------------------------------------------- bad input
@pytest.mark.parametrize("kw,match", [
    (dict(lr=-1.0), "Invalid learning rate: -1.0"),
    (dict(momentum=-0.1), "Invalid momentum value"),
    (dict(weight_decay=-1e-3), "Invalid weight_decay value"),
    (dict(nesterov=True), "Nesterov momentum requires a momentum and zero dampening"),
    (dict(nesterov=True, momentum=0.9, dampening=0.1), "zero dampening"),
])
def test_sgd_bad_arguments(kw, match):
    with pytest.raises(ValueError, match=match):
        pf.optim.SGD([Parameter(pf.ones(2))], **kw)


@pytest.mark.parametrize("kw,match", [
    (dict(lr=-0.1), "Invalid learning rate"),
    (dict(eps=-1.0), "Invalid epsilon value"),
    (dict(betas=(1.0, 0.999)), "Invalid beta parameter at index 0: 1.0"),
    (dict(betas=(0.9, -0.1)), "Invalid beta parameter at index 1"),
    (dict(betas=(0.9,)), "betas must be a pair"),
    (dict(weight_decay=-1.0), "Invalid weight_decay value"),
])
def test_adam_bad_arguments(kw, match):
    with pytest.raises(ValueError, match=match):
        pf.optim.Adam([Parameter(pf.ones(2))], **kw)


def test_bad_params():
    p = Parameter(pf.ones(2))
    with pytest.raises(TypeError, match="iterable of Tensors or dicts"):
        pf.optim.SGD(p)
    with pytest.raises(ValueError, match="empty parameter list"):
        pf.optim.SGD([])
    with pytest.raises(ValueError, match="more than one parameter group"):
        pf.optim.SGD([{"params": [p]}, {"params": [p]}], lr=0.1)
    with pytest.raises(ValueError, match="non-leaf"):
        pf.optim.SGD([p * 2])
    with pytest.raises(TypeError, match="can only optimize Tensors"):
        pf.optim.SGD([p, 3.0])
    with pytest.raises(TypeError, match="ordered collections"):
        pf.optim.SGD({p})


def test_lr_changed_to_invalid_after_construction_is_caught_by_the_kernel():
    p = Parameter(pf.ones(2))
    opt = pf.optim.Adam([p])
    opt.param_groups[0]["betas"] = (0.9, 1.5)
    p.grad = pf.ones(2)
    with pytest.raises(ValueError, match="Invalid beta parameter at index 1"):
        opt.step()


def test_grad_shape_mismatch_is_an_error():
    p = Parameter(pf.ones(2))
    opt = pf.optim.SGD([p], lr=0.1)
    p.grad = pf.ones(3)
    with pytest.raises(RuntimeError, match=r"grad of shape \(3,\) does not match"):
        opt.step()


def test_kernels_validate_arrays():
    from pyflow.ops._util import kernel
    adam = kernel("adam_step", "cpu")
    a = np.zeros(4, np.float32)
    with pytest.raises(TypeError, match="'grad' has dtype float64"):
        adam(a, np.zeros(4), a.copy(), a.copy(), step=1, lr=0.1, beta1=0.9, beta2=0.99, eps=1e-8)
    with pytest.raises(ValueError, match="'exp_avg' has 3 elements, expected 4"):
        adam(a, a.copy(), a[:3].copy(), a.copy(), step=1, lr=0.1, beta1=0.9, beta2=0.99, eps=1e-8)
    with pytest.raises(ValueError, match="step must be >= 1"):
        adam(a, a.copy(), a.copy(), a.copy(), step=0, lr=0.1, beta1=0.9, beta2=0.99, eps=1e-8)
    with pytest.raises(TypeError, match="float32 or float64"):
        kernel("sgd_step", "cpu")(np.zeros(3, np.int64), np.zeros(3, np.int64), lr=0.1)
    with pytest.raises(ValueError, match="flat C-contiguous"):
        kernel("sgd_step", "cpu")(np.zeros((4, 2))[:, 0], np.zeros(4), lr=0.1)


@needs_torch
def test_tensor_lr_and_plain_number_step_in_loaded_state():
    pps, tps, popt, topt = _run_pair(lambda p: pf.optim.Adam(p, lr=pf.tensor(0.01)),
                                     lambda p: torch.optim.Adam(p, lr=torch.tensor(0.01)))
    _assert_same(pps, tps)
    sd = popt.state_dict()
    sd["state"][0]["step"] = 6  # older checkpoints store the step as a number
    popt.load_state_dict(sd)
    pps[0].grad = pf.ones(*SHAPES[0])
    popt.step()
    assert popt.state[pps[0]]["step"].item() == 7


@pytest.mark.parametrize("name", ["SGD", "Adam", "AdamW"])
def test_training_a_linear_model_end_to_end(name):
    """Autograd + optimizer: least squares converges to the true weights."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 3))
    w_true = np.array([[1.5], [-2.0], [0.5]])
    X, Y = pf.tensor(x), pf.tensor(x @ w_true)
    w = Parameter(pf.zeros(3, 1, dtype=pf.float64))
    kw = dict(lr=0.1, momentum=0.9) if name == "SGD" else dict(lr=0.05, weight_decay=0.0)
    opt = getattr(pf.optim, name)([w], **kw)
    for _ in range(300):
        opt.zero_grad()
        loss = ((pf.matmul(X, w) - Y) ** 2).mean()
        loss.backward()
        opt.step()
    assert_close(w, w_true, rtol=1e-3, atol=1e-3)
