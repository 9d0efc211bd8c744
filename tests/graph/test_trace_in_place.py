"""In-place writes inside build(): to its tensor arguments (done on every
call, as in eager mode), and the writes a trace cannot see (refused, instead
of a graph that silently differs from eager mode)."""
import re

import numpy as np
import pytest

import pyflow as pf
from pyflow.graph import TracingError

EXECUTORS = ["sequential", "actors"]


class FnGraph(pf.nn.Graph):
    def __init__(self, fn, executor="sequential", model=None):
        super().__init__()
        self.fn = fn
        self.model = model or pf.nn.Identity()
        self.config.set_executor(executor)

    def build(self, x, *rest):
        return self.fn(self, x, *rest)


def _eager_and_graph(fn, make_inputs, calls=3, executor="sequential", model=None):
    """Call ``fn`` eagerly and as a graph on equal fresh copies of the same
    inputs, ``calls`` times; every output and every input must agree."""
    g = FnGraph(fn, executor, model)
    eager_in, graph_in = make_inputs(), make_inputs()
    for _ in range(calls):
        e = fn(g, *eager_in)
        o = g(*graph_in)
        np.testing.assert_allclose(o.detach().cpu().numpy(), e.detach().cpu().numpy(), rtol=1e-6)
        for a, b in zip(graph_in, eager_in):
            np.testing.assert_allclose(a.detach().cpu().numpy(), b.detach().cpu().numpy(),
                                       rtol=1e-6)
    return g


@pytest.mark.parametrize("executor", EXECUTORS)
def test_an_in_place_write_to_an_input_happens_on_every_call(executor):
    """``x.add_(1)`` in build() used to happen once, at trace time, and the
    first call's result was even computed from x + 2."""
    def fn(self, x):
        y = x * 3               # reads the old value
        x.add_(1)
        return y + x
    g = _eager_and_graph(fn, lambda: (pf.zeros(3),), executor=executor)
    assert g.plans[0].graph.input_writes == (0,)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_several_writes_copy_and_a_second_input(executor):
    def fn(self, x, w):
        x.mul_(2)
        x.add_(w)
        w.copy_(x.sum().expand(2))           # float32 into float64: w keeps its dtype
        return x * w
    make = lambda: (pf.arange(2, dtype=pf.float32), pf.ones(2, dtype=pf.float64))  # noqa: E731
    g = _eager_and_graph(fn, make, executor=executor)
    assert g.plans[0].graph.input_writes == (0, 1)
    assert "write back" in str(g.plans[0].graph)


def test_an_input_written_with_a_model_and_backward():
    """The write-back comes after the whole run, backward included."""
    pf.manual_seed(0)
    model = pf.nn.Linear(3, 3)
    opt = pf.optim.SGD(model.parameters(), lr=0.1)

    class Step(pf.nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = model
            self.add_optimizer(opt)

        def build(self, x, total):
            loss = self.model(x).square().mean()
            loss.backward()
            with pf.no_grad():
                total.add_(loss)            # a running sum kept by the caller
            return loss
    g = Step()
    total = pf.zeros(())
    losses = [float(g(pf.randn(4, 3), total)) for _ in range(3)]
    assert abs(total.item() - sum(losses)) < 1e-5


def test_input_writes_with_gradient_accumulation_and_run_batches():
    def fn(self, x):
        x.mul_(2)
        return x.sum(-1)
    g = FnGraph(fn)
    g.config.set_gradient_accumulation_steps(2)
    x = pf.arange(8, dtype=pf.float32).reshape(4, 2)
    g(x)
    assert x.tolist() == (pf.arange(8, dtype=pf.float32).reshape(4, 2) * 2).tolist()
    g2 = FnGraph(fn)
    batches = [(pf.ones(2, 2) * k,) for k in range(3)]
    outs = g2.run_batches(batches)
    assert [o.tolist() for o in outs] == [[0.0, 0.0], [4.0, 4.0], [8.0, 8.0]]
    assert [b[0].tolist() for b in batches] == [[[2.0 * k] * 2] * 2 for k in range(3)]


# ------------------------------------------------------------------ refused
class Named(pf.nn.Graph):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def build(self, x):
        return self.fn(x)


def _set_first(t):
    t[0] = 0


WRITES = [_set_first, lambda t: t.fill_(0), lambda t: t.zero_()]


def _recorded_or_refused(fn, match):
    """``fn`` in build() either runs as in eager mode on every call, or is
    refused with a TracingError matching ``match``; never silently different.
    (t[i] = v and fill_ write storage directly today, which the trace refuses;
    should the ops record them while tracing, the graph must then agree.)"""
    try:
        g = Named(fn)
        for x0 in (pf.ones(3), pf.arange(1, 4, dtype=pf.float32)):
            xe, xg = x0.clone(), x0.clone()
            assert g(xg).tolist() == fn(xe).tolist()
            assert xg.tolist() == xe.tolist()
    except TracingError as e:
        assert re.search(match, str(e)), str(e)


@pytest.mark.parametrize("write", WRITES, ids=["setitem", "fill_", "zero_"])
def test_an_unrecorded_write_to_an_input(write):
    """``x[0] = 0`` on an argument happened once, at trace time."""
    def fn(x):
        write(x)
        return x * 2
    _recorded_or_refused(fn, "modified its argument 'x' \\(input 0\\) in place")


@pytest.mark.parametrize("write", WRITES, ids=["setitem", "fill_", "zero_"])
def test_an_unrecorded_write_to_an_intermediate(write):
    """``h[0] = 0`` on an intermediate: the graph returned h without it."""
    def fn(x):
        h = x * 2
        write(h)
        return h + 1
    _recorded_or_refused(fn, "modified the result of mul_0 in place")


def test_a_write_through_a_view_of_an_input_is_refused():
    def fn(x):
        x[0].add_(5)
        return x * 2
    with pytest.raises(TracingError, match="shares memory with its argument 'x'"):
        Named(fn)(pf.ones(3))


def test_reading_a_tensor_after_a_write_through_another_view_is_refused():
    def through_view(x):
        h = x * 2
        h[0].add_(5)            # writes h's memory
        return h
    with pytest.raises(TracingError, match="reads the result of mul_0 after an in-place write"):
        Named(through_view)(pf.ones(3))

    def view_of_input(x):
        v = x[0]
        x.add_(1)               # eager: v sees it; the graph computed v before
        return v * 1
    with pytest.raises(TracingError, match="reads the result of sliceview_0 after an in-place"):
        Named(view_of_input)(pf.ones(3))


def test_in_place_writes_the_graph_records_still_work():
    """The write is to the tensor itself, or to a view nothing reads again."""
    def fn(x):
        h = x * 2
        h.add_(1)
        v = h.view(3)
        v.mul_(2)               # h is not read again
        return v
    assert Named(fn)(pf.ones(3)).tolist() == [6.0, 6.0, 6.0]


@pytest.mark.parametrize("executor", EXECUTORS)
def test_two_writes_to_one_buffer_both_happen(executor):
    """The second write to a buffer used to be done once, at trace time: the
    tracer took the buffer for an intermediate after its first write."""
    class Counter(pf.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("n", pf.zeros(()))

        def forward(self, x):
            with pf.no_grad():
                self.n.add_(1)
                self.n.mul_(2)
            return x * self.n
    model = Counter()
    g = FnGraph(lambda self, x: self.model(x), executor, model)
    assert [g(pf.ones(1)).tolist() for _ in range(3)] == [[2.0], [6.0], [14.0]]
    assert model.n.item() == 14.0


def test_a_mask_read_from_a_tensor_is_refused_not_baked():
    """``h[h > 0] = 0`` on an activation that requires grad: autograd records
    it as IndexPut with the mask parsed into arrays, which the graph baked in
    (the second call used the first call's mask)."""
    class Clip(pf.nn.Graph):
        def __init__(self):
            super().__init__()
            self.lin = pf.nn.Linear(3, 3)

        def build(self, x):
            h = self.lin(x)
            h[h > 0] = 0.0
            loss = h.sum()
            loss.backward()
            return loss
    with pytest.raises(TracingError, match="IndexPut.apply received a raw array"):
        Clip()(pf.randn(2, 3))
