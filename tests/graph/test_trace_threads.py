"""Tracing is per thread: while one thread traces a graph, every other thread
runs eager code (and compiled graphs, and traces of its own) unchanged.

Each test stops a trace in the middle of build() (an Event) and runs code in
the main thread meanwhile, so the overlap is certain, not left to timing."""
import threading

import numpy as np
import pytest

import pyflow as pf
from pyflow.autograd import Function
from pyflow.graph import TracingError

WAIT = 60       # seconds: only reached when something is broken


class PausedGraph(pf.nn.Graph):
    """build() draws a random tensor, runs the model, then waits (mid-trace)
    until ``release`` is set, and draws again."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.config.set_executor("sequential")
        self.started, self.release = threading.Event(), threading.Event()

    def build(self, x):
        h = self.model(x) + pf.randn(x.shape)
        self.started.set()
        assert self.release.wait(WAIT)
        return h * pf.rand(x.shape)


class Tracing:
    """Compile ``graph`` on ``x`` in a thread; ``with`` waits until the trace is
    paused, and on exit lets it finish."""

    def __init__(self, graph, x):
        self.graph, self.x, self.error = graph, x, None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        try:
            self.graph(self.x)
        except BaseException as e:      # noqa: BLE001  (reported by the test)
            self.error = e
        finally:
            self.graph.started.set()

    def __enter__(self):
        self.thread.start()
        assert self.graph.started.wait(WAIT)
        assert self.error is None, self.error
        return self

    def __exit__(self, *exc):
        self.graph.release.set()
        self.thread.join(WAIT)
        assert not self.thread.is_alive()
        if exc[0] is None and self.error is not None:
            raise self.error


def _op_names(graph):
    return [n.op_name for n in graph.plans[0].stages[0][1].nodes]


def test_eager_code_in_another_thread_sees_no_trace():
    """Reading values, autograd, optimizer steps, in-place ops, creation ops,
    .data and detach in the main thread while another thread traces: all
    eager (``.item()`` raised TracingError, 3 of 42 calls in the issue's probe),
    and none of it lands in the other thread's graph."""
    pf.manual_seed(0)
    graph = PausedGraph(pf.nn.Linear(3, 3))
    with Tracing(graph, pf.randn(2, 3)):
        a = pf.tensor([1.5, -2.0])
        assert a.sum().item() == -0.5
        assert bool(a[0] > 0) and float(a[0]) == 1.5 and int(a[0]) == 1
        assert a.tolist() == [1.5, -2.0] and a.cpu().numpy().tolist() == [1.5, -2.0]
        model = pf.nn.Linear(2, 1)
        opt = pf.optim.SGD(model.parameters(), lr=0.1)
        w = model.weight.detach().clone()
        loss = model(a[None]).sum()
        loss.backward()
        opt.step()                              # refused only inside build()
        np.testing.assert_allclose(model.weight.detach().cpu().numpy(),
                                   (w - 0.1 * a[None]).cpu().numpy(), rtol=1e-6)
        b = pf.zeros(2)
        b.add_(a)
        b.data.mul_(2)
        assert b.tolist() == [3.0, -4.0] and (b > 0).tolist() == [True, False]
    assert _op_names(graph) == ["Linear", "randn", "Add", "rand", "Mul"]


def test_a_compiled_graph_runs_in_another_thread_meanwhile():
    """A graph's actors call the ops of its nodes on their own stream threads;
    a comparison is a recordable op, which a trace elsewhere recorded."""
    class Masked(pf.nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = pf.nn.Linear(3, 3)

        def build(self, x):
            h = self.model(x)
            return pf.where(h > 0, h, pf.zeros_like(h))
    pf.manual_seed(0)
    runner = Masked()
    x = pf.randn(4, 3)
    expected = runner(x)
    traced = PausedGraph(pf.nn.Linear(3, 3))
    with Tracing(traced, pf.randn(2, 3)):
        for _ in range(3):
            np.testing.assert_array_equal(runner(x).cpu().numpy(), expected.cpu().numpy())
    assert _op_names(traced) == ["Linear", "randn", "Add", "rand", "Mul"]


def test_a_trace_shifts_no_random_stream():
    """The trace draws from a private copy of the generator: another thread's
    draws continue the stream as if no graph were traced (the trace used to
    draw from it, and compile_plan then rewound it under the other thread).
    The graph's run after the trace draws as eager build() would."""
    x = pf.randn(2, 3)
    pf.manual_seed(123)
    expected = [pf.randn(3).tolist() for _ in range(2)]
    pf.randn(x.shape), pf.rand(x.shape)             # the graph's run
    expected.append(pf.randn(3).tolist())
    graph = PausedGraph(pf.nn.Linear(3, 3))
    with Tracing(graph, x):
        pf.manual_seed(123)
        got = [pf.randn(3).tolist() for _ in range(2)]
    got.append(pf.randn(3).tolist())
    assert got == expected


def test_two_threads_trace_at_once():
    pf.manual_seed(0)
    first = PausedGraph(pf.nn.Linear(3, 3))
    second = pf.nn.Sequential(pf.nn.Linear(3, 2), pf.nn.Tanh())

    class Plain(pf.nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = second

        def build(self, x):
            return self.model(x).sum(-1)
    x = pf.randn(4, 3)
    with Tracing(first, pf.randn(2, 3)):
        plain = Plain()
        np.testing.assert_allclose(plain(x).cpu().numpy(), second(x).sum(-1).detach().cpu().numpy(),
                                   rtol=1e-6)
    assert _op_names(plain) == ["Linear", "Tanh", "Sum"]
    assert _op_names(first) == ["Linear", "randn", "Add", "rand", "Mul"]


def test_hooks_are_removed_after_the_last_trace():
    apply, item = Function.__dict__["apply"], pf.Tensor.__dict__["item"]
    graph = PausedGraph(pf.nn.Linear(3, 3))
    with Tracing(graph, pf.randn(2, 3)):
        assert pf.Tensor.__dict__["item"] is not item      # installed while it traces
    assert Function.__dict__["apply"] is apply and pf.Tensor.__dict__["item"] is item


def test_nested_tracing_in_one_thread_is_refused():
    class Inner(pf.nn.Graph):
        def build(self, x):
            return x * 2

    class Outer(pf.nn.Graph):
        def __init__(self):
            super().__init__()
            self.inner = Inner()

        def build(self, x):
            return self.inner(x)
    with pytest.raises(TracingError, match="already being traced in this thread"):
        Outer()(pf.ones(2))
    assert pf.ones(2).sum().item() == 2.0          # and nothing is left installed
