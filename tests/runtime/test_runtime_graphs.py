"""Actor runtime on hand-built graphs: chains, diamonds, multi-output actors,
feedback loops, end of data, back-pressure, describe/to_dot."""
import itertools
import re
import threading

import numpy as np
import pytest

from pyflow.runtime import GraphError, Port, Runtime, TaskGraph




@pytest.mark.parametrize("registers", [1, 2, 3])
@pytest.mark.parametrize("streams", [("compute",) * 3, ("data", "compute", "copy")])
def test_linear_chain(registers, streams):
    g = TaskGraph()
    x = g.source("data", range(7), stream=streams[0], registers=registers)
    h = g.actor("double", lambda v: v * 2, inputs=[x], stream=streams[1], registers=registers)
    h = g.actor("inc", lambda v: v + 1, inputs=[h], stream=streams[2], registers=registers)
    g.sink("out", h)
    rt = Runtime(g)
    assert rt.run(timeout=10) == {"out": [2 * i + 1 for i in range(7)]}
    assert rt.stats.firings == {"data": 7, "double": 7, "inc": 7, "out": 7}
    assert all(1 <= n <= registers for n in rt.stats.max_in_flight.values())


@pytest.mark.parametrize("registers", [1, 2, 3])
def test_diamond_and_suggested_api(registers):
    g = TaskGraph()
    x = g.source("data", range(5), stream="data", registers=registers)
    left = g.actor("left", lambda v: v * 2, inputs=[x], stream="compute", registers=registers)
    right = g.actor("right", lambda v: v * v, inputs=[x], stream="copy", registers=registers)
    s = g.actor("join", lambda a, b, c: a + b - c, inputs=[left, right, x])
    g.sink("out", s)
    assert Runtime(g).run(timeout=10) == {"out": [2 * i + i * i - i for i in range(5)]}


def test_multi_output_actor_and_consumer_of_one_port_twice():
    g = TaskGraph()
    x = g.source("data", [3, 7, 10])
    q, r = g.actor("divmod", lambda v: divmod(v, 4), inputs=[x], outputs=2, registers=[1, 2])
    both = g.actor("sq", lambda a, b: a * b, inputs=[r, r])     # same port read by two edges
    g.sink("quot", q)
    g.sink("rem2", both)
    assert Runtime(g).run(timeout=10) == {"quot": [0, 1, 2], "rem2": [9, 9, 4]}


def test_actor_without_outputs_runs_for_side_effects():
    seen = []
    g = TaskGraph()
    x = g.source("data", range(4))
    g.actor("log", seen.append, inputs=[x], outputs=0)
    assert Runtime(g).run(timeout=10) == {}
    assert seen == [0, 1, 2, 3]


@pytest.mark.parametrize("registers", [2, 3])
def test_feedback_running_sum_equals_sequential(registers):
    data = [5, -2, 7, 1, 0, 4]
    g = TaskGraph()
    x = g.source("data", data)
    _, total = g.actor("acc", lambda prev, v: (prev + v, prev + v), inputs=["acc", x],
                       outputs=2, registers=[registers, 1], initial={0: 100})
    g.sink("out", total)
    assert Runtime(g).run(timeout=10) == {"out": list(100 + np.cumsum(data))}


def test_feedback_through_in_place_update_with_one_register():
    """A training-step shape: variable -> grad -> in-place update -> (control) variable."""
    targets = [np.array([1.0, 2.0]), np.array([0.0, -1.0]), np.array([3.0, 3.0])]
    lr = 0.5
    param = np.zeros(2)

    def update(p, grad):
        p -= lr * grad                     # in place: the next read of `variable` sees it

    g = TaskGraph()
    x = g.source("data", targets)
    v = g.actor("variable", lambda: param, control=["update"])
    grad = g.actor("grad", lambda p, t: p - t, inputs=[v, x])
    g.actor("update", update, inputs=[v, grad], initial=None)
    g.sink("grads", grad)
    grads = Runtime(g).run(timeout=10)["grads"]

    p = np.zeros(2)
    for t, got in zip(targets, grads, strict=True):
        np.testing.assert_allclose(got, p - t)
        p = p - lr * (p - t)
    np.testing.assert_allclose(param, p)


def test_sink_of_a_port_with_initial_value_sees_it_first():
    g = TaskGraph()
    x = g.source("data", [1, 2, 3])
    s = g.actor("acc", lambda a, v: a + v, inputs=["acc", x], registers=2, initial=10)
    g.sink("out", s)
    assert Runtime(g).run(timeout=10) == {"out": [10, 11, 13, 16]}


def test_source_of_unknown_length_ends_the_run():
    def batches():                          # a data loader whose length nobody knows
        n = 0
        while np.random.default_rng(n).random() < 0.8 or n < 3:
            yield n
            n += 1

    expected = list(batches())
    g = TaskGraph()
    x = g.source("loader", batches(), registers=2)
    g.sink("out", g.actor("id", lambda v: v, inputs=[x]))
    assert Runtime(g).run(timeout=10) == {"out": expected}


def test_shortest_source_ends_the_run_and_endless_source_stops():
    g = TaskGraph()
    endless = g.source("endless", itertools.count())
    short = g.source("short", range(3), stream="compute")
    g.sink("out", g.actor("add", lambda a, b: a + b, inputs=[endless, short]))
    rt = Runtime(g)
    assert rt.run(timeout=10) == {"out": [0, 2, 4]}
    assert rt.stats.firings["endless"] <= 3 + 2      # stopped by ConsumerDone, not exhausted


def test_iterations_caps_every_actor_and_runs_repeat():
    g = TaskGraph()
    x = g.source("data", range(1000), iterations=50)  # re-iterable: each run restarts
    s = g.actor("acc", lambda a, v: a + v, inputs=["acc", x], registers=2, initial=0)
    g.actor("sq", lambda v: v * v, inputs=[s], outputs=1)
    g.sink("out", "sq")
    rt = Runtime(g)
    first = rt.run(iterations=4, timeout=10)
    assert first == {"out": [0, 0, 1, 9]}
    assert rt.run(iterations=4, timeout=10) == first      # a fresh run, the same answer
    # the source's own cap: 50 sums, after the initial value
    assert len(rt.run(timeout=10)["out"]) == 1 + 50


def test_back_pressure_bounds_in_flight_values():
    """A fast producer before a slow consumer fills exactly its registers, never more."""
    import time
    g = TaskGraph()
    x = g.source("fast", range(6), registers=3)
    g.sink("out", g.actor("slow", lambda v: time.sleep(0.002) or v, inputs=[x]))
    rt = Runtime(g)
    assert rt.run(timeout=10) == {"out": list(range(6))}
    (edge,) = [e for e in rt.stats.max_in_flight if e.consumer == "slow"]
    assert rt.stats.max_in_flight[edge] <= 3


def test_control_input_orders_firings_without_passing_a_value():
    order = []
    g = TaskGraph()
    x = g.source("data", range(3))
    first = g.actor("first", lambda v: order.append(("first", v)), inputs=[x])
    g.actor("second", lambda v: order.append(("second", v)), inputs=[x], control=[first],
            stream="copy", outputs=0)
    Runtime(g).run(timeout=10)
    for i in range(3):
        assert order.index(("first", i)) < order.index(("second", i))


# -------------------------------------------------------------- build errors
def test_cycle_without_initial_value_is_a_build_error():
    g = TaskGraph()
    x = g.source("data", range(3))
    a = g.actor("a", lambda u, v: u + v, inputs=[x, "c"])
    b = g.actor("b", lambda u: u, inputs=[a])
    g.actor("c", lambda u: u, inputs=[b])
    with pytest.raises(GraphError, match=r"cycle without an initial value: a -> b -> c -> a"):
        Runtime(g)


def test_self_loop_with_one_register_is_a_build_error():
    g = TaskGraph()
    x = g.source("data", range(3))
    g.actor("acc", lambda a, v: a + v, inputs=["acc", x], registers=1, initial=0)
    with pytest.raises(GraphError, match=r"deadlock: actors \['acc'\].*registers=2"):
        Runtime(g)


@pytest.mark.parametrize("build, error, match", [
    (lambda g: g.actor("a", lambda v: v, inputs=["nope"]), GraphError, "no actor named 'nope'"),
    (lambda g: g.actor("a", lambda v: v, inputs=[Port("data", 1)]), GraphError,
     r"'data' has 1 output"),
    (lambda g: g.actor("data", lambda v: v), GraphError, "already exists"),
    (lambda g: g.actor("a", lambda v: v, registers=0), ValueError, "registers must be"),
    (lambda g: g.actor("a", lambda v: v, outputs=2, registers=[1]), ValueError,
     "registers must be"),
    (lambda g: g.actor("a", 3), TypeError, "fn must be callable"),
    (lambda g: g.actor("a", lambda: 0, outputs=2, initial=5), ValueError, "initial must be"),
    (lambda g: g.actor("a", lambda v: v, inputs=[3.0]), TypeError, "must be a Port"),
    (lambda g: g.actor("a", lambda: 0, stream=""), ValueError, "stream must be"),
    (lambda g: g.source("s", 5), TypeError, "must be iterable"),
])
def test_bad_graphs_raise_clear_errors(build, error, match):
    g = TaskGraph()
    g.source("data", range(2))
    with pytest.raises(error, match=match):
        build(g)
        Runtime(g)


def test_bad_run_arguments():
    g = TaskGraph()
    g.source("data", range(2))
    with pytest.raises(ValueError, match="iterations must be"):
        Runtime(g).run(iterations=-1)
    with pytest.raises(ValueError, match="timeout must be"):
        Runtime(g).run(timeout=0)
    with pytest.raises(TypeError, match="caller_stream must be a stream name"):
        Runtime(g).run(caller_stream=3)


@pytest.mark.parametrize("caller_stream, compute_on_caller",
                         [("compute", True), (None, False), ("nonexistent", False)])
def test_the_caller_runs_the_compute_stream(caller_stream, compute_on_caller):
    """By default the calling thread runs the compute stream's loop (one OpenMP team
    for eager and graph kernels, runtime.py); every other stream a pooled thread."""
    seen = {}

    def record(stream):
        def fn(v):
            seen.setdefault(stream, set()).add(threading.get_ident())
            return v
        return fn
    g = TaskGraph()
    x = g.source("data", range(4), stream="data", registers=2)
    h = g.actor("on_compute", record("compute"), inputs=[x], stream="compute", registers=2)
    h = g.actor("on_copy", record("copy"), inputs=[h], stream="copy", registers=2)
    g.sink("out", h)
    rt = Runtime(g)
    for _ in range(2):                  # twice: a run leaves nothing behind for the next
        assert rt.run(timeout=10, caller_stream=caller_stream) == {"out": [0, 1, 2, 3]}
    me = threading.get_ident()
    assert (seen["compute"] == {me}) is compute_on_caller
    assert me not in seen["copy"]


# -------------------------------------------------------------- looking at it
def test_describe_and_dot_list_actors_streams_and_registers():
    g = TaskGraph()
    x = g.source("data", range(2), stream="data", registers=2)
    s = g.actor("acc", lambda a, v: a + v, inputs=["acc", x], registers=3, initial=0)
    g.sink("out", s)
    text = str(Runtime(g))
    assert "3 actors on 2 streams (data, compute)" in text
    assert "acc:0 -> acc.in0" in text and "registers=3 initial" in text
    assert "data:0 -> acc.in1" in text and "registers=2" in text
    assert re.search(r"\n  out\s+sink\s+stream=compute\s+no outputs", text)
    dot = g.to_dot()
    assert dot.startswith("digraph taskgraph {") and dot.rstrip().endswith("}")
    assert '"acc" -> "acc" [label="0: r=3, initial", color=red];' in dot
    assert 'label="stream data"' in dot


def test_graph_without_sources_needs_iterations():
    g = TaskGraph()
    s = g.actor("count", lambda a: a + 1, inputs=["count"], registers=2, initial=0)
    g.sink("out", s)
    with pytest.raises(ValueError, match=r"\['count', 'out'\] would never end.*iterations=N"):
        Runtime(g).run(timeout=10)
    assert Runtime(g).run(iterations=3, timeout=10) == {"out": [0, 1, 2]}
    assert Runtime(TaskGraph()).run(timeout=10) == {}


def test_a_finished_run_keeps_no_input_or_output_value():
    """Actors and the run refer to each other, so only the cyclic collector frees
    a run; it must not hold the step's values meanwhile (runtime.py: _let_go)."""
    import gc
    import weakref

    class Batch:
        pass

    class Feed:                       # as pyflow.graph.lowering feeds a compiled graph
        items = []

        def __iter__(self):
            return iter(self.items)
    batch, feed = Batch(), Feed()
    g = TaskGraph()
    g.sink("out", g.actor("same", lambda v: v, inputs=[g.source("data", feed)]))
    gc.disable()
    try:
        rt = Runtime(g)
        feed.items = [batch]
        out = rt.run(timeout=10)
        feed.items = []
        assert out["out"] == [batch] and rt.stats.firings["same"] == 1
        alive = weakref.ref(batch)
        del batch, out
        assert alive() is None
    finally:
        gc.enable()
