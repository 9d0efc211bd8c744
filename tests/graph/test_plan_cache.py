"""When nn.Graph compiles again, and when it must not: replaced modules,
parameters and buffers, inputs' requires_grad, NaN and -0.0 arguments, and the
bound on the plan cache."""
import warnings

import numpy as np
import pytest

import pyflow as pf

EXECUTORS = ["sequential", "actors"]


class FnGraph(pf.nn.Graph):
    """build() is a given function of (graph, *inputs); ``model`` is registered."""

    def __init__(self, fn, model, optimizer=None, executor="sequential"):
        super().__init__()
        self.fn = fn
        self.model = model
        if optimizer is not None:
            self.add_optimizer(optimizer)
        self.config.set_executor(executor)

    def build(self, *xs):
        return self.fn(self, *xs)


def forward(self, x):
    return self.model(x)


def _close(a, b, rtol=1e-5):
    np.testing.assert_allclose(a.detach().cpu().numpy(), b.detach().cpu().numpy(), rtol=rtol,
                               atol=1e-6)


# ------------------------------------------------------------------ replaced state
@pytest.mark.parametrize("executor", EXECUTORS)
def test_a_replaced_parameter_is_used(executor):
    """``m.weight = nn.Parameter(...)`` after the first call: the graph uses the
    new parameter (it used the old one), and drops the plan holding the old."""
    pf.manual_seed(0)
    model = pf.nn.Linear(4, 3)
    g = FnGraph(forward, model, executor=executor)
    x = pf.randn(2, 4)
    _close(g(x), model(x))
    old = model.weight
    model.weight = pf.nn.Parameter(pf.randn(3, 4))
    _close(g(x), model(x))
    assert len(g.plans) == 1
    assert all(v.tensor is not old for v in g.plans[0].graph.state)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_a_replaced_submodule_is_used(executor):
    """``seq[1] = nn.Identity()`` after the first call."""
    pf.manual_seed(0)
    model = pf.nn.Sequential(pf.nn.Linear(4, 4), pf.nn.ReLU(), pf.nn.Linear(4, 2))
    g = FnGraph(forward, model, executor=executor)
    x = pf.randn(8, 4)
    _close(g(x), model(x))
    model[1] = pf.nn.Identity()
    _close(g(x), model(x))
    model[1] = pf.nn.Tanh()         # and again: never an earlier plan
    _close(g(x), model(x))


def test_a_replaced_buffer_is_used():
    class Shift(pf.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("shift", pf.ones(3))

        def forward(self, x):
            return x + self.shift
    model = Shift()
    g = FnGraph(forward, model)
    x = pf.zeros(3)
    assert g(x).tolist() == [1.0, 1.0, 1.0]
    model.shift = pf.full((3,), 5.0)
    assert g(x).tolist() == [5.0, 5.0, 5.0]


def test_a_module_converted_by_to_recompiles():
    """``model.double()`` swaps each parameter's data (the same Parameter
    objects): the plan's fused kernel was made for float32 and refused it."""
    class Affine(pf.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = pf.nn.Parameter(pf.randn(4))
            self.b = pf.nn.Parameter(pf.randn(4))

        def forward(self, x):
            return ((x * self.w + self.b).tanh() * 3).sum(-1)
    pf.manual_seed(0)
    model = Affine()
    g = FnGraph(forward, model)
    x = pf.randn(2, 4)
    _close(g(x), model(x))
    model.double()
    out = g(x)
    assert out.dtype is pf.float64
    _close(out, model(x), rtol=1e-12)


def test_an_optimizer_added_after_the_first_call_runs():
    pf.manual_seed(0)
    model = pf.nn.Linear(4, 1)

    def step(self, x):
        loss = self.model(x).sum()
        loss.backward()
        return loss
    g = FnGraph(step, model)
    x = pf.randn(2, 4)
    g(x)
    before = model.weight.detach().clone()
    g.add_optimizer(pf.optim.SGD(model.parameters(), lr=0.5))
    g(x)
    expected = before - 0.5 * model.weight.grad
    _close(model.weight, expected)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_writes_into_parameters_need_no_recompilation(executor):
    """Optimizer steps, ``p.data.copy_`` and ``load_state_dict`` write the same
    objects: one plan all along, and the numbers follow the new values."""
    pf.manual_seed(0)
    model = pf.nn.Sequential(pf.nn.Linear(4, 8), pf.nn.ReLU(), pf.nn.Linear(8, 1))
    eager = pf.nn.Sequential(pf.nn.Linear(4, 8), pf.nn.ReLU(), pf.nn.Linear(8, 1))
    eager.load_state_dict(model.state_dict())
    opt = pf.optim.Adam(model.parameters(), lr=1e-2)
    eager_opt = pf.optim.Adam(eager.parameters(), lr=1e-2)

    def step(self, x):
        loss = self.model(x).square().mean()
        loss.backward()
        return loss
    g = FnGraph(step, model, opt, executor)
    x = pf.randn(16, 4)
    for _ in range(3):
        eager_opt.zero_grad()
        loss = eager(x).square().mean()
        loss.backward()
        eager_opt.step()
        _close(g(x), loss)
    with pf.no_grad():
        model[0].weight.data.copy_(pf.zeros(8, 4))
        eager[0].weight.data.copy_(pf.zeros(8, 4))
    _close(g(x), eager(x).square().mean())
    model.load_state_dict(eager.state_dict())
    _close(g(x), eager(x).square().mean())
    assert len(g.plans) == 1


def test_train_and_eval_keep_a_plan_each():
    pf.manual_seed(0)
    model = pf.nn.Sequential(pf.nn.Linear(4, 4), pf.nn.Dropout(0.5))
    g = FnGraph(forward, model)
    x = pf.randn(64, 4)
    g(x)
    model.eval()
    _close(g(x), model(x))
    model.train()
    g(x)
    assert len(g.plans) == 2


def test_freezing_a_parameter_after_the_first_call():
    """``requires_grad_(False)`` after the first call: no gradient, no update."""
    pf.manual_seed(0)
    model = pf.nn.Sequential(pf.nn.Linear(4, 4), pf.nn.Linear(4, 1))
    opt = pf.optim.SGD(model.parameters(), lr=0.1)

    def step(self, x):
        loss = self.model(x).sum()
        loss.backward()
        return loss
    g = FnGraph(step, model, opt)
    x = pf.randn(2, 4)
    g(x)
    model[0].requires_grad_(False)
    model[0].weight.grad = None
    frozen = model[0].weight.detach().clone()
    g(x)
    assert model[0].weight.grad is None
    _close(model[0].weight, frozen)


# ------------------------------------------------------------------ inputs
@pytest.mark.parametrize("executor", EXECUTORS)
def test_an_input_that_requires_grad_gets_its_gradient(executor):
    """The first call's input needs no grad, the second's does: a new plan,
    and ``x.grad`` is what eager's backward gives (it stayed None)."""
    pf.manual_seed(0)
    model = pf.nn.Linear(3, 2)

    def step(self, x):
        loss = self.model(x).tanh().sum()
        loss.backward()
        return loss
    g = FnGraph(step, model, executor=executor)
    g(pf.randn(4, 3))
    x = pf.randn(4, 3, requires_grad=True)
    g(x)
    assert len(g.plans) == 2
    xe = x.detach().clone().requires_grad_(True)
    model(xe).tanh().sum().backward()
    assert x.grad is not None
    _close(x.grad, xe.grad)
    g(x)                        # a leaf's gradient accumulates, as in eager mode
    _close(x.grad, 2 * xe.grad)


def test_input_gradient_with_gradient_accumulation():
    pf.manual_seed(0)
    model = pf.nn.Linear(3, 1)

    def step(self, x):
        loss = self.model(x).square().mean()
        loss.backward()
        return loss
    g = FnGraph(step, model)
    g.config.set_gradient_accumulation_steps(2)
    x = pf.randn(4, 3, requires_grad=True)
    g(x)
    xe = x.detach().clone().requires_grad_(True)
    model(xe).square().mean().backward()
    _close(x.grad, xe.grad)


def test_only_an_input_requires_grad():
    """No parameter needs a gradient, the input does: eager mode allows it."""
    model = pf.nn.Linear(3, 1).requires_grad_(False)

    def step(self, x):
        loss = self.model(x).sum()
        loss.backward()
        return loss
    x = pf.randn(2, 3, requires_grad=True)
    FnGraph(step, model)(x)
    _close(x.grad, model.weight.detach().expand(2, 3))


# ------------------------------------------------------------------ non-tensor arguments
def test_a_nan_argument_compiles_one_plan():
    """``float('nan')`` used to compile a new plan on every call (nan != nan)."""
    g = FnGraph(lambda self, x, c: x * (c[-1] if isinstance(c, tuple) else c),
                pf.nn.Identity())
    x = pf.ones(2)
    for _ in range(3):
        assert np.isnan(g(x, float("nan")).cpu().numpy()).all()
    g(x, np.float64("nan"))
    g(x, (1.0, float("nan")))
    g(x, (1.0, float("nan")))
    assert len(g.plans) == 3


@pytest.mark.filterwarnings("ignore:divide by zero")
def test_negative_zero_is_not_zero():
    """``-0.0 == 0.0``, but build() may divide by it."""
    g = FnGraph(lambda self, x, c: x / c, pf.nn.Identity())
    x = pf.ones(2)
    assert g(x, 0.0).tolist() == [np.inf, np.inf]
    assert g(x, -0.0).tolist() == [-np.inf, -np.inf]


def test_numbers_of_different_types_inside_a_tuple_are_different_keys():
    g = FnGraph(lambda self, x, t: x * t[0], pf.nn.Identity())
    x = pf.tensor([3])
    assert g(x, (2,)).dtype is pf.int64
    assert g(x, (2.0,)).dtype is pf.float32


# ------------------------------------------------------------------ the bound
def test_the_plan_cache_is_bounded_lru_and_warns_once():
    g = FnGraph(lambda self, x, c: x * c, pf.nn.Identity())
    g.config.set_plan_cache_size(3)
    x = pf.ones(2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for c in (1.0, 2.0, 3.0):
            g(x, c)
        g(x, 1.0)                   # 1.0 is now the most recently used
    assert len(g.plans) == 3
    with pytest.warns(RuntimeWarning, match="FnGraph: more input signatures than its plan "
                                            "cache holds \\(3 plans\\)") as record:
        g(x, 4.0)                   # drops 2.0's plan, the least recently used
        g(x, 5.0)                   # drops 3.0's: no second warning
    assert len(record) == 1
    assert len(g.plans) == 3
    kept = {key[0][1][2] for key in g._plans}
    assert kept == {1.0, 4.0, 5.0}
    assert g(x, 2.0).tolist() == [2.0, 2.0]      # compiled again, right numbers


def test_plan_cache_size_is_validated_and_defaults_to_64():
    config = pf.nn.Graph().config
    assert config.plan_cache_size == 64
    for bad in (0, -1, 2.5, True, "8"):
        with pytest.raises(ValueError, match="set_plan_cache_size: size must be an int >= 1"):
            config.set_plan_cache_size(bad)


def test_build_replacing_a_buffer_is_refused():
    """``self.count = self.count + 1`` in a forward: the graph kept reading the
    old tensor (1 on every call, eager mode 1, 2, 3)."""
    class Counter(pf.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("count", pf.zeros(()))

        def forward(self, x):
            self.count = self.count + 1
            return x * self.count
    g = FnGraph(forward, Counter())
    with pytest.raises(pf.graph.TracingError, match="build\\(\\) replaced a module, parameter "
                                                    "or buffer \\(model.count\\)"):
        g(pf.ones(1))
