"""CUDA-event completion between streams (pyflow/runtime/device.py), checked
on a model of a GPU's asynchronous streams (async_device.py): every "kernel"
below returns before it has run, as a CUDA launch does.

The task graph, one stream per stage:

    caller's stream: a slow kernel fills the inputs before the run
    data:    source yields input i
    copy:    fill  -> writes input i into one buffer (the register's memory,
                      reused every iteration)
    compute: plus  -> buffer + 1   (the caller's own thread and stream)
    post:    times -> buffer * 10  (slow), read on the caller's stream after run()

Each wait the runtime places is needed for the right numbers: without the
start wait ``fill`` reads an input not yet written, without the ready wait
``plus`` reads the buffer too early, without the free wait ``fill`` overwrites
it before ``plus`` has read it, without the end wait the caller reads
``times`` too early.  The tests that drop the ready and free events show it.
"""
import time

import numpy as np
import pytest

import pyflow as pf
from pyflow.runtime import Actor, CudaCompletion, OutputRegisters, Runtime, TaskGraph, \
    completion_for
from pyflow.runtime.messages import RegisterFree

from .async_device import AsyncDevice

N = 6


@pytest.fixture
def device():
    dev = AsyncDevice()
    yield dev
    dev.close()


def kernel_stage(dev, compute, delay=0.0):
    """An actor function that launches ``out = compute(x)`` and returns ``out`` at once."""
    def fire(x):
        out = np.empty(3)

        def kernel():
            time.sleep(delay)
            out[:] = compute(x)
        dev.launch(kernel)
        return out
    return fire


def pipeline(dev, slow_fill=0.0, slow_plus=0.0):
    """The task graph above; its inputs are filled by a slow kernel on the caller's stream."""
    inputs = [np.zeros(3) for _ in range(N)]

    def fill_inputs():
        time.sleep(0.02)
        for i, x in enumerate(inputs):
            x[:] = i + 1
    dev.launch(fill_inputs)

    buffer = np.zeros(3)

    def fill(x):
        def kernel():
            time.sleep(slow_fill)
            buffer[:] = x
        dev.launch(kernel)
        return buffer

    g = TaskGraph()
    src = g.source("data", inputs, stream="data")
    a = g.actor("fill", fill, inputs=[src], stream="copy")
    b = g.actor("plus", kernel_stage(dev, lambda x: x + 1, slow_plus), inputs=[a],
                stream="compute")
    c = g.actor("times", kernel_stage(dev, lambda x: x * 10, 0.005), inputs=[a], stream="post")
    g.sink("plus_out", b, stream="compute")
    g.sink("times_out", c, stream="post")
    return g


def expected():
    return {"plus_out": [np.full(3, i + 2.0) for i in range(N)],
            "times_out": [np.full(3, (i + 1) * 10.0) for i in range(N)]}


def read_on_caller_stream(dev, result):
    """Copy the sinks' values by a kernel on the caller's stream, as later eager
    code would, and wait for that stream only."""
    snapshot = {}
    dev.launch(lambda: snapshot.update({k: [v.copy() for v in vs] for k, vs in result.items()}))
    dev.record(dev.current()).wait()
    return snapshot


def right(result):
    want = expected()
    return set(result) == set(want) and all(
        len(result[k]) == N and all(np.array_equal(g, w) for g, w in zip(result[k], want[k]))
        for k in want)


@pytest.mark.parametrize("slow", ["fill", "plus"])
def test_streams_linked_by_events_give_the_right_numbers(device, slow):
    g = pipeline(device, slow_fill=0.01 if slow == "fill" else 0.0,
                 slow_plus=0.01 if slow == "plus" else 0.0)
    result = Runtime(g, device=device).run(timeout=30)
    assert right(read_on_caller_stream(device, result))
    assert device.waits > 0


def test_without_ready_events_a_consumer_reads_too_early(device, monkeypatch):
    """The consumer of another stream's register must wait for its kernels."""
    write = OutputRegisters.write
    monkeypatch.setattr(OutputRegisters, "write",
                        lambda self, value, iteration, event=None: write(self, value, iteration))
    g = pipeline(device, slow_fill=0.02)
    result = Runtime(g, device=device).run(timeout=30)
    assert not right(read_on_caller_stream(device, result))


def test_without_free_events_a_producer_overwrites_unread_memory(device, monkeypatch):
    """The producer must not reuse a register's memory before the reader's kernels ran."""
    handle = Actor.handle

    def handle_without_free_events(self, msg):
        if type(msg) is RegisterFree:
            msg.event = None
        handle(self, msg)
    monkeypatch.setattr(Actor, "handle", handle_without_free_events)
    g = pipeline(device, slow_plus=0.02)
    result = Runtime(g, device=device).run(timeout=30)
    assert not right(read_on_caller_stream(device, result))


def test_one_stream_needs_no_events(device):
    g = TaskGraph()
    src = g.source("data", range(4), stream="compute")
    a = g.actor("double", lambda v: v * 2, inputs=[src], stream="compute")
    g.sink("out", a, stream="compute")
    assert Runtime(g, device=device).run(timeout=30)["out"] == [0, 2, 4, 6]
    assert device.waits == 0


def test_a_device_stream_per_actor_stream_is_kept_across_runs(device):
    g = pipeline(device)
    runtime = Runtime(g, device=device)
    runtime.run(timeout=30)
    streams = dict(device.streams)
    assert set(streams) == {"data", "copy", "post"}     # compute keeps the caller's stream
    runtime.run(timeout=30)
    assert device.streams == streams


def test_the_runtime_takes_cuda_events_only_on_a_real_gpu():
    assert completion_for({pf.device("cpu")}) is None
    gpu = pf.cuda.is_available() and not pf.cuda.simulated()
    got = completion_for({pf.device("cpu"), "cuda"})
    assert isinstance(got, CudaCompletion) if gpu else got is None


def test_a_device_object_without_the_protocol_is_refused():
    g = TaskGraph()
    g.sink("out", g.source("data", range(2)))
    with pytest.raises(TypeError, match=r"device=.*lacks \['record', 'wait'\]"):
        Runtime(g, device=type("Half", (), {"current": id, "stream": id, "use": id})())
