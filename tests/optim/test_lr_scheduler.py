"""LR schedulers: the lr (and momentum) sequence over 30 steps equals torch's."""
import math

import pytest

import pyflow as pf
from pyflow.nn.parameter import Parameter
from pyflow.optim import lr_scheduler as pf_sched
from tests.helpers import needs_torch, torch

N_STEPS = 30


def _optimizers(opt_name="SGD", **kw):
    """A pyflow and a torch optimizer with two param groups (lrs 0.1 and 0.02)."""
    kw = dict(kw)
    if opt_name == "SGD":
        kw.setdefault("momentum", 0.9)
    pp = [Parameter(pf.ones(2)), Parameter(pf.ones(2))]
    tp = [torch.ones(2, requires_grad=True), torch.ones(2, requires_grad=True)]
    groups = lambda ps: [{"params": [ps[0]], "lr": 0.1}, {"params": [ps[1]], "lr": 0.02}]
    return (getattr(pf.optim, opt_name)(groups(pp), **kw),
            getattr(torch.optim, opt_name)(groups(tp), **kw))


def _trace(opt, sched, n=N_STEPS):
    lrs, moms = [sched.get_last_lr()], []
    for _ in range(n):
        opt.step()
        sched.step()
        lrs.append(list(sched.get_last_lr()))
        moms.append([g["betas"][0] if "betas" in g else g.get("momentum")
                     for g in opt.param_groups])
    return lrs, moms


def _assert_seq_equal(a, b):
    assert len(a) == len(b)
    for step, (x, y) in enumerate(zip(a, b)):
        for u, v in zip(x, y):
            assert math.isclose(u, v, rel_tol=1e-12, abs_tol=1e-15), (step, x, y)


SCHEDULERS = {
    "StepLR": lambda m, o: m.StepLR(o, step_size=7, gamma=0.5),
    "MultiStepLR": lambda m, o: m.MultiStepLR(o, milestones=[3, 10, 10, 25], gamma=0.3),
    "CosineAnnealingLR": lambda m, o: m.CosineAnnealingLR(o, T_max=10, eta_min=0.001),
    "LambdaLR": lambda m, o: m.LambdaLR(o, lambda e: 0.95 ** e / (1 + e % 3)),
    "LambdaLR_list": lambda m, o: m.LambdaLR(o, [lambda e: 1 / (e + 1), lambda e: e + 1]),
    "LinearLR": lambda m, o: m.LinearLR(o, start_factor=0.1, end_factor=0.9, total_iters=12),
    "ConstantLR": lambda m, o: m.ConstantLR(o, factor=0.5, total_iters=4),
    "ExponentialLR": lambda m, o: m.ExponentialLR(o, gamma=0.9),
    "OneCycleLR_cos": lambda m, o: m.OneCycleLR(o, max_lr=[1.0, 0.5], total_steps=N_STEPS),
    "OneCycleLR_linear": lambda m, o: m.OneCycleLR(o, max_lr=0.3, total_steps=N_STEPS + 5,
                                                   anneal_strategy="linear", pct_start=0.25),
    "OneCycleLR_three_phase": lambda m, o: m.OneCycleLR(o, max_lr=0.8, epochs=3,
                                                        steps_per_epoch=11, three_phase=True,
                                                        div_factor=10.0),
    "OneCycleLR_no_momentum": lambda m, o: m.OneCycleLR(o, max_lr=0.8, total_steps=N_STEPS,
                                                        cycle_momentum=False),
    "SequentialLR": lambda m, o: m.SequentialLR(
        o, [m.LinearLR(o, start_factor=0.2, total_iters=5), m.CosineAnnealingLR(o, T_max=20)],
        milestones=[5]),
}


@needs_torch
@pytest.mark.parametrize("opt_name", ["SGD", "Adam"])
@pytest.mark.parametrize("name", sorted(SCHEDULERS))
def test_schedule_matches_torch(name, opt_name):
    popt, topt = _optimizers(opt_name)
    ps, ts = SCHEDULERS[name](pf_sched, popt), SCHEDULERS[name](torch.optim.lr_scheduler, topt)
    (plr, pm), (tlr, tm) = _trace(popt, ps), _trace(topt, ts)
    _assert_seq_equal(plr, tlr)
    _assert_seq_equal(pm, tm)  # OneCycleLR cycles SGD momentum / Adam beta1
    assert ps.last_epoch == ts.last_epoch == N_STEPS


@needs_torch
def test_step_with_epoch_uses_closed_form():
    popt, topt = _optimizers()
    ps = pf_sched.StepLR(popt, step_size=3, gamma=0.5)
    ts = torch.optim.lr_scheduler.StepLR(topt, step_size=3, gamma=0.5)
    popt.step()
    topt.step()
    with pytest.warns(UserWarning, match="epoch parameter"):
        ps.step(7)
    with pytest.warns(UserWarning):
        ts.step(7)
    assert ps.get_last_lr() == ts.get_last_lr()


@needs_torch
@pytest.mark.parametrize("name", ["StepLR", "CosineAnnealingLR", "OneCycleLR_cos", "SequentialLR"])
def test_state_dict_resume(name, tmp_path):
    """Stop after 12 steps, save optimizer + scheduler, rebuild, and continue: the
    sequence equals an uninterrupted one."""
    popt, _ = _optimizers()
    full, _ = _trace(popt, SCHEDULERS[name](pf_sched, popt))
    popt, _ = _optimizers()
    sched = SCHEDULERS[name](pf_sched, popt)
    first, _ = _trace(popt, sched, 12)
    pf.save({"optim": popt.state_dict(), "sched": sched.state_dict()}, tmp_path / "c")
    ck = pf.load(tmp_path / "c")
    popt, _ = _optimizers()
    sched = SCHEDULERS[name](pf_sched, popt)
    popt.load_state_dict(ck["optim"])
    sched.load_state_dict(ck["sched"])
    rest, _ = _trace(popt, sched, N_STEPS - 12)
    _assert_seq_equal(full, first + rest[1:])


def test_lambda_state_dict_keeps_callable_objects_state():
    class Warmup:
        def __init__(self, n):
            self.n = n

        def __call__(self, e):
            return min(1.0, (e + 1) / self.n)

    opt = pf.optim.SGD([Parameter(pf.ones(1))], lr=1.0)
    sd = pf_sched.LambdaLR(opt, Warmup(4)).state_dict()
    assert sd["lr_lambdas"] == [{"n": 4}]
    other = pf_sched.LambdaLR(pf.optim.SGD([Parameter(pf.ones(1))], lr=1.0), Warmup(10))
    other.load_state_dict(sd)
    assert other.lr_lambdas[0].n == 4
    assert pf_sched.LambdaLR(opt, lambda e: 1.0).state_dict()["lr_lambdas"] == [None]


def test_warns_when_scheduler_steps_before_optimizer():
    opt = pf.optim.SGD([Parameter(pf.ones(1))], lr=1.0)
    sched = pf_sched.StepLR(opt, 2)
    with pytest.warns(UserWarning, match="before `optimizer.step\\(\\)`"):
        sched.step()


def test_bad_arguments():
    opt = pf.optim.SGD([Parameter(pf.ones(1))], lr=1.0)
    with pytest.raises(TypeError, match="is not an Optimizer"):
        pf_sched.StepLR(object(), 3)
    with pytest.raises(ValueError, match="step_size must be a positive int"):
        pf_sched.StepLR(opt, 0)
    with pytest.raises(ValueError, match="Starting multiplicative factor"):
        pf_sched.LinearLR(opt, start_factor=0)
    with pytest.raises(ValueError, match="Expected 1 lr_lambdas, but got 2"):
        pf_sched.LambdaLR(opt, [lambda e: 1, lambda e: 1])
    with pytest.raises(ValueError, match="either total_steps OR"):
        pf_sched.OneCycleLR(opt, max_lr=1.0)
    with pytest.raises(ValueError, match="anneal_strategy must be one of"):
        pf_sched.OneCycleLR(opt, max_lr=1.0, total_steps=10, anneal_strategy="exp")
    with pytest.raises(ValueError, match="max_lr must have the same length"):
        pf_sched.OneCycleLR(opt, max_lr=[1.0, 2.0], total_steps=10)
    with pytest.raises(KeyError, match="initial_lr"):
        pf_sched.StepLR(pf.optim.SGD([Parameter(pf.ones(1))], lr=1.0), 3, last_epoch=4)
    sched = pf_sched.OneCycleLR(opt, max_lr=1.0, total_steps=2)
    opt.step()
    sched.step()
    sched.step()
    with pytest.raises(ValueError, match="Tried to step 3 times"):
        sched.step()
