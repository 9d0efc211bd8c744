"""The simulator's shared arrays, allocated under a lock (kernels/cuda/_simulator.py).

numba's simulator creates a block's shared array on first use, keyed by the
(file, line) that asks for it, without a lock: two threads of a block that ask
at once could each create one, and then not share memory (here: 18 of 200
trials of 64 threads starting together gave a block several arrays).  Runs in
the plain test process: the simulator's classes import without
NUMBA_ENABLE_CUDASIM; only ``install()`` is tied to it.
"""
import sys
import threading

import numpy as np
import pytest
from numba.cuda.simulator import kernelapi

from pyflow.kernels.cuda import _simulator


def arrays_one_block_got(array, threads=64):
    """How many distinct arrays ``threads`` threads, released together, get from
    one line asking a fresh block's shared memory for an array."""
    shared = kernelapi.FakeCUDAShared(0)
    start = threading.Barrier(threads)
    got = [None] * threads

    def thread(i):
        start.wait()
        got[i] = array(shared, (16,), np.float32)     # one source line for every thread

    workers = [threading.Thread(target=thread, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return len({id(a) for a in got})


@pytest.fixture
def frequent_thread_switches():
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


def test_every_thread_of_a_block_gets_the_same_shared_array(frequent_thread_switches):
    counts = [arrays_one_block_got(_simulator._locked_shared_array) for _ in range(200)]
    assert set(counts) == {1}, f"blocks with several shared arrays: {counts}"


def test_arrays_asked_for_on_different_lines_are_different():
    shared = kernelapi.FakeCUDAShared(0)
    a = _simulator._locked_shared_array(shared, (4,), np.float32)
    b = _simulator._locked_shared_array(shared, (4,), np.float64)
    assert a is not b and a.dtype == np.float32 and b.dtype == np.float64
    again = [_simulator._locked_shared_array(shared, (3,), np.int32) for _ in range(2)]
    assert again[0] is again[1]                       # one line asked twice: one array
    assert len(shared._allocations) == 3


def test_install_puts_the_locked_allocation_in_the_simulator(monkeypatch):
    monkeypatch.setattr(kernelapi.FakeCUDAShared, "array", kernelapi.FakeCUDAShared.array)
    _simulator._install_locked_shared_arrays()
    assert kernelapi.FakeCUDAShared.array is _simulator._locked_shared_array
