"""Failures surface in the caller (never a hang); the trace shows every firing and
that streams overlap."""
import json
import threading
import time
import traceback

import pytest

from pyflow.runtime import runtime as runtime_module
from pyflow.runtime import (ActorError, DeadlockError, Runtime, RunTimeoutError, TaskGraph,
                            Tracer)
from tests.runtime.conftest import stream_threads




def busy_graph(fail_at):
    """Three streams kept busy; 'matmul_3' raises at iteration `fail_at`."""
    raised = {}

    def matmul_3(v):
        if v == fail_at:
            raised["at"] = time.perf_counter()
            raise ZeroDivisionError("boom in the kernel")
        time.sleep(0.001)
        return v

    g = TaskGraph()
    x = g.source("data", range(1000), registers=2)
    a = g.actor("copy_in", lambda v: time.sleep(0.001) or v, inputs=[x], stream="copy",
                registers=2)
    b = g.actor("matmul_3", matmul_3, inputs=[a], stream="compute", registers=2)
    c = g.actor("allreduce", lambda v: time.sleep(0.001) or v, inputs=[b], stream="comm")
    g.sink("out", c)
    return g, raised


def test_actor_exception_stops_everything_and_names_the_actor():
    g, raised = busy_graph(fail_at=5)
    with pytest.raises(ActorError, match=r"actor 'matmul_3' \(stream 'compute'\) failed at "
                                         r"iteration 5: ZeroDivisionError: boom") as info:
        Runtime(g).run(timeout=30)
    caught = time.perf_counter()
    assert caught - raised["at"] < 1.0
    assert info.value.actor == "matmul_3"
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    # The original traceback is chained: it shows the line that raised.
    text = "".join(traceback.format_exception(info.value))
    assert 'raise ZeroDivisionError("boom in the kernel")' in text
    assert stream_threads() == []


def test_failing_data_source_is_reported():
    def loader():
        yield 1
        raise OSError("disk gone")

    g = TaskGraph()
    g.sink("out", g.source("loader", loader()))
    with pytest.raises(ActorError, match="actor 'loader'.*OSError: disk gone"):
        Runtime(g).run(timeout=10)


def test_wrong_number_of_outputs_is_an_actor_error():
    g = TaskGraph()
    x = g.source("data", range(3))
    g.actor("split", lambda v: v, inputs=[x], outputs=2)
    with pytest.raises(ActorError, match="'split' has 2 outputs.*got int") as info:
        Runtime(g).run(timeout=10)
    assert isinstance(info.value.__cause__, TypeError)


@pytest.mark.parametrize("timeout", [10, None])
def test_deadlock_is_reported_not_hung(timeout):
    """With a timeout a watchdog thread watches; without one (how graphs run)
    the caller's own loop looks whenever no message comes, and no thread
    named pyflow-watch-* runs."""
    g = TaskGraph()
    x = g.source("data", range(3), stream="data")
    g.actor("acc", lambda a, v: a + v, inputs=["acc", x], registers=1, initial=0)
    watchers = []
    real = runtime_module.run_pooled
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(runtime_module, "run_pooled",
                   lambda name, fn, role="stream": watchers.append(role) or real(name, fn, role))
        with pytest.raises(DeadlockError, match=r"acc: fired 0 times, waits for a free register"):
            Runtime(g, check=False).run(timeout=timeout)
    assert watchers == ([] if timeout is None else ["watch"])


@pytest.mark.parametrize("caller_stream", ["compute", None])
def test_timeout_stops_a_run_whose_actor_blocks(caller_stream):
    """The stuck actor is on the compute stream: run by the caller itself (the
    default, a watchdog thread notices the timeout) or by a pooled thread."""
    g = TaskGraph()
    x = g.source("data", range(100))
    g.actor("stuck", lambda v: time.sleep(0.05), inputs=[x], outputs=0)
    with pytest.raises(RunTimeoutError, match="within 0.2 s"):
        Runtime(g).run(timeout=0.2, caller_stream=caller_stream)


@pytest.mark.parametrize("caller_stream", ["compute", None])
def test_error_on_another_stream_stops_the_callers_compute_loop(caller_stream):
    g = TaskGraph()
    x = g.source("data", range(1000), stream="data")
    g.actor("slow", lambda v: time.sleep(0.001), inputs=[x], outputs=0)
    g.actor("bad", lambda v: 1 / (v - 5), inputs=[x], stream="copy", outputs=0)
    t0 = time.perf_counter()
    with pytest.raises(ActorError, match="actor 'bad' .*ZeroDivisionError"):
        Runtime(g).run(timeout=30, caller_stream=caller_stream)
    assert time.perf_counter() - t0 < 5     # stopped long before the 1000 items


# ------------------------------------------------------------------- tracing
def test_trace_has_one_event_per_firing(tmp_path):
    tracer = Tracer()
    g = TaskGraph()
    x = g.source("data", range(6), stream="data")
    y = g.actor("square", lambda v: v * v, inputs=[x], stream="compute", registers=2)
    g.sink("out", y)
    rt = Runtime(g)
    rt.run(tracer=tracer, timeout=10)
    trace = json.loads(open(tracer.write(tmp_path / "t.json")).read())
    firings = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(firings) == sum(rt.stats.firings.values()) == 18
    assert sorted(e["args"]["iteration"] for e in firings if e["name"] == "square") == \
        list(range(6))
    threads = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert threads == {"stream data", "stream compute"}
    assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in firings)


def test_pyflow_trace_env_var_writes_a_trace(tmp_path, monkeypatch):
    path = tmp_path / "env_trace.json"
    monkeypatch.setenv("PYFLOW_TRACE", str(path))
    g = TaskGraph()
    g.sink("out", g.actor("inc", lambda v: v + 1, inputs=[g.source("data", range(3))]))
    Runtime(g).run(timeout=10)
    events = json.loads(path.read_text())["traceEvents"]
    assert sorted(e["name"] for e in events if e["ph"] == "X") == \
        ["data"] * 3 + ["inc"] * 3 + ["out"] * 3


def test_streams_overlap_when_functions_release_the_gil():
    """Two actors on two streams both wait on one barrier, then sleep (GIL released).

    Neither can pass the barrier unless the other is running at the same time,
    so each firing interval contains the moment the barrier opened: the traced
    intervals must intersect.  No timing threshold is involved: serialized
    streams would break the barrier and fail the run instead.
    """
    barrier = threading.Barrier(2, timeout=10)

    def work(v):
        barrier.wait()
        time.sleep(0.002)
        return v

    tracer = Tracer()
    g = TaskGraph()
    x = g.source("data", range(3), stream="data")
    g.actor("left", work, inputs=[x], stream="compute", outputs=0)
    g.actor("right", work, inputs=[x], stream="copy", outputs=0)
    Runtime(g).run(tracer=tracer, timeout=30)
    left = {f["iteration"]: f for f in tracer.firings("left")}
    right = {f["iteration"]: f for f in tracer.firings("right")}
    assert sorted(left) == sorted(right) == [0, 1, 2]
    for i in range(3):
        a, b = left[i], right[i]
        assert a["stream"] != b["stream"]
        assert max(a["start_ns"], b["start_ns"]) < min(a["end_ns"], b["end_ns"])


def test_ctrl_c_in_the_callers_compute_loop_stays_a_keyboard_interrupt():
    """The caller's thread runs the compute stream: Ctrl-C arrives inside an
    actor there, and must reach the caller as itself, the other streams stopped."""
    def interrupted(v):
        if v == 2:
            raise KeyboardInterrupt
        return v
    g = TaskGraph()
    x = g.source("data", range(100), stream="data")
    g.actor("copy", lambda v: v, inputs=[x], stream="copy", outputs=0)
    g.actor("step", interrupted, inputs=[x], outputs=0)
    with pytest.raises(KeyboardInterrupt):
        Runtime(g).run(timeout=30)
    assert stream_threads() == []
