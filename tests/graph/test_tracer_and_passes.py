"""The tracer's refusals (no silent wrong graphs), each pass on its own,
failure injection in the actor executor, explain and to_dot."""
import time

import numpy as np
import pytest

import pyflow as pf
from pyflow.graph import TracingError, passes, trace
from pyflow.runtime import ActorError


class Net(pf.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = pf.nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(x)


class FnGraph(pf.nn.Graph):
    """A graph whose build is a given function of (graph, *inputs)."""

    def __init__(self, fn, model=None, optimizer=None):
        super().__init__()
        self.fn = fn
        self.model = model or Net()
        if optimizer is not None:
            self.add_optimizer(optimizer)

    def build(self, *xs):
        return self.fn(self, *xs)


@pytest.mark.parametrize("read", [
    lambda h: h.sum().item(),
    lambda h: bool(h.sum() > 0),
    lambda h: float(h.mean()),
    lambda h: h.numpy(),
    lambda h: h.tolist(),
])
def test_reading_values_in_build_is_refused(read):
    g = FnGraph(lambda self, x: read(self.model(x)))
    with pytest.raises(TracingError, match="reads tensor values"):
        g(pf.randn(2, 4))


def test_optimizer_step_in_build_is_refused():
    model = Net()
    opt = pf.optim.SGD(model.parameters(), lr=0.1)

    def build(self, x):
        loss = self.model(x).sum()
        loss.backward()
        opt.step()
        return loss
    with pytest.raises(TracingError, match="add_optimizer"):
        FnGraph(build, model)(pf.randn(2, 4))
    assert opt.step is not None and model.fc.weight.grad is None   # nothing leaked


def test_backward_twice_and_data_dependent_shapes_are_refused():
    def twice(self, x):
        loss = self.model(x).sum()
        loss.backward()
        loss.backward()
    with pytest.raises(TracingError, match="twice"):
        FnGraph(twice)(pf.randn(2, 4))
    with pytest.raises(TracingError, match="output shape depends"):
        FnGraph(lambda self, x: (x > 0).nonzero())(pf.randn(2, 4))
    with pytest.raises(TracingError, match="one_hot"):
        FnGraph(lambda self, i: pf.nn.functional.one_hot(i))(pf.tensor([0, 2]))
    g = FnGraph(lambda self, i: pf.nn.functional.one_hot(i, 4) * 2)
    g(pf.tensor([0, 2]))
    assert g(pf.tensor([3, 1])).cpu().tolist() == [[0, 0, 0, 2], [0, 2, 0, 0]]


def test_raw_arrays_into_a_function_are_refused():
    class Scale(pf.autograd.Function):
        @staticmethod
        def forward(ctx, x, arr):
            return x * pf.tensor(arr)

        @staticmethod
        def backward(ctx, g):
            return g, None
    with pytest.raises(TracingError, match="raw array"):
        FnGraph(lambda self, x: Scale.apply(x, np.ones(4, np.float32)))(pf.randn(2, 4))


def test_hidden_in_place_write_to_a_parameter_is_an_error():
    model = Net()

    def build(self, x):
        self.model.fc.bias.data.fill_(0.0)      # fill_ writes storage the tracer cannot see
        return self.model(x)
    with pytest.raises(TracingError, match="in place"):
        FnGraph(build, model)(pf.randn(2, 4))


def test_copy_into_a_buffer_under_no_grad_is_an_assign():
    """``buffer.copy_(...)`` in build() under no_grad writes the buffer on every
    call, as in eager mode (it used to be refused as a hidden in-place write)."""
    class Counter(pf.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("total", pf.zeros(3))

        def forward(self, x):
            with pf.no_grad():
                self.total.copy_(self.total + x)
            return x * 2.0
    g = FnGraph(lambda self, x: self.model(x), Counter())
    for _ in range(3):
        g(pf.ones(3))
    np.testing.assert_array_equal(g.model.total.cpu().numpy(), [3.0, 3.0, 3.0])
    assert [n.kind for n in g.plans[0].graph.nodes].count("assign") == 1


def test_state_is_read_live_not_frozen():
    g = FnGraph(lambda self, x: self.model(x))
    x = pf.randn(3, 4)
    with pf.no_grad():
        a = g(x).cpu().numpy().copy()
        model_out = g.model(x).cpu().numpy()
        g.model.fc.bias.add_(1.0)
        b = g(x).cpu().numpy()
    np.testing.assert_allclose(a, model_out, rtol=1e-6)
    np.testing.assert_allclose(b, a + 1.0, rtol=1e-5)
    assert len(g.plans) == 1


# ------------------------------------------------------------------ passes
def _traced(fn, *inputs):
    return trace(fn, inputs)


def test_dead_code_elimination_removes_unused_nodes_only():
    def build(x):
        unused = x.exp() * 3.0           # noqa: F841
        return x + 1.0
    g = _traced(build, pf.randn(2, 3))
    assert len(g.nodes) == 3
    d = passes.dead_code_elimination(g)
    assert [n.op_name for n in d.nodes] == ["Add"]
    assert len(g.nodes) == 3             # the input graph is unchanged
    assert "removed 2 nodes" in d.history[-1][1]


def test_constant_folding_folds_shape_only_computations():
    def build(x):
        pos = pf.arange(3, dtype=pf.float32) * 2.0 + 1.0     # depends on no input
        return x + pos
    g = _traced(build, pf.randn(2, 3))
    f = passes.dead_code_elimination(passes.constant_folding(g))
    assert [n.op_name for n in f.nodes] == ["Add"]
    (const,) = [v for v in f.nodes[0].inputs if v.kind == "const"]
    np.testing.assert_array_equal(const.tensor.cpu().numpy(), [1.0, 3.0, 5.0])
    assert "folded 3 nodes" in f.history[-2][1]


def test_random_ops_are_not_folded():
    g = _traced(lambda x: x + pf.randn(3), pf.zeros(3))
    f = passes.dead_code_elimination(passes.constant_folding(g))
    assert [n.op_name for n in f.nodes] == ["randn", "Add"]


def test_autograd_pass_sums_gradients_of_reused_values():
    w = pf.nn.Parameter(pf.randn(3))

    def build(x):
        h = x * w
        loss = (h * h + h).sum()          # h read three times: three gradients, two sums
        loss.backward()
        return loss
    x = pf.randn(3)
    g = passes.autograd(_traced(build, x))
    kinds = [n.kind for n in g.nodes]
    assert kinds.count("backward") == 4 and kinds.count("set_grad") == 1   # mul, mul, add, sum
    assert any(n.name.startswith("grad_sum") for n in g.nodes)
    assert "+2 gradient sums" in g.history[-1][1]
    from pyflow.graph.executor import make_steps, run_sequential
    g = passes.plan_memory(passes.constant_folding(g))
    run_sequential(g, make_steps(g), [x], g.memory.release)
    graph_grad = w.grad.cpu().numpy().copy()
    w.grad = None
    build(x)                                   # eager
    np.testing.assert_allclose(graph_grad, w.grad.cpu().numpy(), rtol=1e-6)


def test_memory_plan_releases_values_after_last_use():
    layers = pf.nn.Sequential(*[pf.nn.Linear(64, 64) for _ in range(6)])
    g = passes.plan_memory(_traced(lambda x: layers(x), pf.randn(32, 64)))
    plan = g.memory
    one = 32 * 64 * 4
    assert plan.total_bytes == 6 * one
    assert plan.peak_bytes == 2 * one        # input of a layer and its output
    assert plan.arena_bytes <= 3 * one       # buffers are handed down the chain
    out = g.output_values()[0]
    assert all(out.id not in r for r in plan.release)


# ------------------------------------------------------------------ failures, explain
def test_an_actor_failing_mid_run_names_the_op_and_stops_quickly():
    emb = pf.nn.Embedding(5, 4)
    g = FnGraph(lambda self, idx: emb(idx).sum(-1) * 2.0)
    g(pf.tensor([0, 1, 4]))
    start = time.perf_counter()
    with pytest.raises(ActorError, match="embedding") as info:
        g(pf.tensor([0, 7, 1]))
    assert time.perf_counter() - start < 1.0
    assert isinstance(info.value.__cause__, IndexError)
    np.testing.assert_allclose(g(pf.tensor([2])).detach().cpu().numpy(),
                               emb(pf.tensor([2])).sum(-1).detach().cpu().numpy() * 2.0)


def test_explain_and_dot(tmp_path):
    model = Net()
    opt = pf.optim.SGD(model.parameters(), lr=0.1)

    def build(self, x):
        loss = self.model(x).relu().sum()
        loss.backward()
        return loss
    g = FnGraph(build, model, opt)
    assert "not compiled" in pf.explain(g)
    g(pf.randn(2, 4))
    text = pf.explain(g)
    for expected in ("autograd", "dead_code_elimination", "LinearBackward", "set_grad",
                     "update", "stream=compute", "registers=1", "peak"):
        assert expected in text, expected
    assert "passes:" in str(g)
    for kind in ("logical", "task"):
        path = g.to_dot(tmp_path / f"{kind}.dot", kind=kind)
        assert open(path).read().startswith("digraph")


def test_compiled_substitute_fills_like_substitute():
    """Steps fill their op's arguments with compile_substitute (the template's
    structure walked once); it must build what substitute builds, nested
    containers, namedtuples and live state included."""
    from collections import namedtuple

    from pyflow.graph.ir import Value, compile_substitute, substitute
    Pair = namedtuple("Pair", "a b")
    a, b = (Value((2,), pf.float32, pf.device("cpu"), "input") for _ in range(2))
    state = Value((2,), pf.float32, pf.device("cpu"), "state", tensor="w0")
    template = ((a, 3, [b, "k", (a,)], {"x": b, "y": 1.5}, Pair(state, None), pf.Size([2, 2])),
                {"alpha": a, "beta": 2})
    values = ["A", "B"]
    index = {a.id: 0, b.id: 1}

    def fetch(v):
        return (lambda vs: v.tensor) if v.kind == "state" else (lambda vs: vs[index[v.id]])
    fill = compile_substitute(template, fetch)
    lookup = (lambda v: v.tensor if v.kind == "state" else values[index[v.id]])
    assert fill(values) == substitute(template, lookup)
    assert type(fill(values)[0][4]) is Pair and type(fill(values)[0][5]) is pf.Size
    state.tensor = "w1"                     # state is read at fill time, not compile time
    assert fill(values)[0][4].a == "w1"
    assert fill(values)[0][2] is not fill(values)[0][2]     # a fresh list every call
