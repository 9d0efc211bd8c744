"""One backend object per device kind (pyflow/device.py): ``backend_of(device)``
and ``backend_of_array(array)`` answer what an array is, where it lives and how
to make and copy another one there.

The cpu backend is checked in this process.  The simulated cuda backend needs
NUMBA_ENABLE_CUDASIM=1 before numba is imported, so this file is also the
simulator script: ``test_simulated_cuda_backend`` runs it in a child process
(``cudatools.run_in_simulator``), where ``__main__`` runs every check and
prints ``N checks, F failures``.
"""
import os
import subprocess
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


class _Span:
    """A raw device buffer as numba and CuPy see one: an object whose *instance*
    carries ``__cuda_array_interface__`` (kernels/cuda/elementwise.py makes such)."""

    def __init__(self):
        self.__cuda_array_interface__ = {"shape": (4,), "typestr": "<f4", "data": (0, False),
                                         "strides": None, "version": 3}


# ----------------------------------------------------------------------------- cpu, in process
def test_backend_of_accepts_what_device_accepts():
    import pyflow as pf
    from pyflow.device import backend_of
    cpu = backend_of("cpu")
    assert cpu is backend_of(pf.device("cpu")) is backend_of(None)
    assert cpu.type == "cpu" and not cpu.simulated and cpu.xp is np
    cuda = backend_of("cuda")
    assert cuda is backend_of("cuda:0") is backend_of(pf.device("cuda", 0)) is backend_of(0)
    assert cuda.type == "cuda"
    # the same object pyflow.cuda answers from
    assert pf.cuda.simulated() is cuda.simulated
    assert pf.cuda.unavailable_reason() == cuda.unavailable_reason()


def test_backend_of_refuses_what_is_not_a_device():
    from pyflow.device import backend_of
    with pytest.raises(ValueError, match="device: expected one of .*'tpu'"):
        backend_of("tpu")
    with pytest.raises(TypeError, match="device: expected a string"):
        backend_of(2.5)


def test_host_data_of_every_kind_is_the_cpu_backends():
    from pyflow.device import backend_of, backend_of_array
    cpu = backend_of("cpu")
    subclass = np.arange(3.0).view(np.recarray)            # host memory of an ndarray subclass
    for host in (np.zeros(3), np.float32(1.5), 2.0, 3, True, [1.0, 2.0], (1,), subclass):
        assert backend_of_array(host) is cpu, type(host)
    assert cpu.owns(np.zeros(2)) and cpu.owns(np.float64(1.0))
    assert not cpu.owns([1.0]) and not cpu.owns(2.0)    # host data, but not an array


def test_an_object_with_a_cuda_array_interface_is_cuda_memory():
    from pyflow.device import backend_of, backend_of_array
    span = _Span()
    assert backend_of_array(span) is backend_of("cuda")
    assert not backend_of("cpu").owns(span)


def test_cpu_backend_allocates_and_copies_host_memory():
    from pyflow.device import backend_of
    cpu = backend_of("cpu")
    before = (cpu.memory.allocated, cpu.memory.peak)
    e, z = cpu.empty((2, 3), np.float32), cpu.zeros(4, np.int64)
    assert type(e) is np.ndarray and e.shape == (2, 3) and e.dtype == np.float32
    assert type(z) is np.ndarray and z.tolist() == [0] * 4
    host = np.arange(6.0).reshape(2, 3)
    dev = cpu.to_device(host)
    back = cpu.to_host(dev)
    assert not np.shares_memory(dev, host) and not np.shares_memory(back, dev)
    assert back.tolist() == host.tolist()
    out = np.empty((2, 3))
    assert cpu.to_host(dev, out=out) is out and out.tolist() == host.tolist()
    target = np.zeros((3, 2)).T                     # a non-contiguous destination
    cpu.copy_from_host(host, target)
    assert target.tolist() == host.tolist()
    assert cpu.launch_stream() is None and cpu.new_stream() is None
    cpu.synchronize_stream()
    cpu.synchronize()
    assert (cpu.memory.allocated, cpu.memory.peak) == before   # the host is not counted


def test_memory_stats_count_until_garbage_collected():
    import gc

    from pyflow.device import MemoryStats
    stats = MemoryStats()
    a = stats.track(np.zeros(1000, np.float32))
    b = stats.track(np.zeros(250, np.float64))
    assert stats.allocated == stats.peak == 6000
    del a
    gc.collect()
    assert stats.allocated == 2000 and stats.peak == 6000
    stats.reset_peak()
    assert stats.peak == 2000
    del b
    gc.collect()
    assert stats.allocated == 0


def test_import_pyflow_loads_no_cuda_machinery():
    """A CPU-only process never imports numba.cuda, CuPy or the simulated arrays
    (the cuda backend is built on first use, and imports them lazily)."""
    code = ("import sys, pyflow; from pyflow.device import backend_of_array; "
            "x = pyflow.ones(3) * 2; backend_of_array(x._data); "
            "print(sorted(m for m in ('numba.cuda', 'cupy', 'pyflow._simarray') "
            "if m in sys.modules))")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


def test_device_module_imports_nothing_of_pyflow():
    """device.py is the lowest layer: it imports no pyflow module but its own
    simulated arrays and their capture (checked on the source, function bodies
    included)."""
    import ast
    tree = ast.parse(open(os.path.join(ROOT, "pyflow", "device.py")).read())
    ours = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith(
                "pyflow")):
            ours.update(f"{node.module or ''}.{a.name}".strip(".") for a in node.names)
        elif isinstance(node, ast.Import):
            ours.update(a.name for a in node.names if a.name.startswith("pyflow"))
    assert ours == {"_simarray", "_simcapture"}, ours


def test_simulated_cuda_backend():
    from tests.kernels.cudatools import run_in_simulator
    run_in_simulator(os.path.abspath(__file__))


# ----------------------------------------------------------------------------- child process
def main():
    sys.path.insert(0, ROOT)
    import gc

    from tests.kernels.cudatools import Checks
    check = Checks()

    import pyflow as pf
    from pyflow._simarray import SIM_NUMPY, SimulatedDeviceArray
    from pyflow.device import backend_of, backend_of_array
    from pyflow.kernels.cuda import _memory

    sim, cpu = backend_of("cuda"), backend_of("cpu")

    @check("the cuda backend is the simulator's, one object")
    def _():
        assert sim.type == "cuda" and sim.simulated and sim.xp is SIM_NUMPY
        assert backend_of(pf.device("cuda", 0)) is sim and backend_of("cuda:0") is sim
        assert pf.cuda.simulated() and pf.cuda.is_available() and pf.cuda.device_count() == 1
        assert sim.unavailable_reason() is None and sim.current_device() == 0

    @check("allocations are device arrays, recognised as the simulator's")
    def _():
        for a in (sim.empty((2, 3), np.float32), sim.zeros(4, np.int64),
                  sim.to_device(np.arange(3.0)), sim.to_device(2.5)):
            assert type(a) is SimulatedDeviceArray, type(a)
            assert backend_of_array(a) is sim and sim.owns(a) and not cpu.owns(a)
        assert sim.zeros(3, np.float64).tolist() == [0.0] * 3
        assert backend_of_array(np.zeros(3)) is cpu and not sim.owns(np.zeros(3))
        view = sim.zeros((4, 4), np.float32)[::2, 1:]           # views stay device arrays
        assert backend_of_array(view) is sim

    @check("host <-> device copies")
    def _():
        host = np.arange(6.0).reshape(2, 3)
        dev = sim.to_device(host)
        host[0, 0] = 99.0                                   # a copy, not a view of the host
        back = sim.to_host(dev)
        assert type(back) is np.ndarray and back.tolist() == [[0, 1, 2], [3, 4, 5]]
        out = np.empty((3, 2))
        assert sim.to_host(dev.T, out=out) is out and out.tolist() == [[0, 3], [1, 4], [2, 5]]
        target = sim.zeros((3, 2), np.float64).T            # a strided device destination
        sim.copy_from_host(np.ones((2, 3)), target)
        assert type(target) is SimulatedDeviceArray and target.tolist() == [[1.0] * 3] * 2
        assert type(sim.pinned_empty(64)) is np.ndarray

    @check("memory statistics are the backend's, as pyflow.cuda reports them")
    def _():
        gc.collect()
        base = sim.memory.allocated
        assert pf.cuda.memory_allocated() == base
        a = sim.empty(1000, np.float32)
        assert sim.memory.allocated == base + 4000 == pf.cuda.memory_allocated()
        assert pf.cuda.max_memory_allocated() >= base + 4000
        del a
        gc.collect()
        assert sim.memory.allocated == base
        pf.cuda.reset_peak_memory_stats()
        assert sim.memory.peak == base
        t = pf.ones(250, device="cuda")                      # tensors allocate through it too
        assert sim.memory.allocated == base + 1000
        del t
        gc.collect()
        assert sim.memory.allocated == base

    @check("streams: the default one, host-timed events")
    def _():
        assert sim.launch_stream() == 0 and _memory.stream() == 0
        assert sim.new_stream() is None and sim.new_event(True) is None
        sim.synchronize_stream()
        sim.synchronize()
        start, end = pf.cuda.Event(enable_timing=True), pf.cuda.Event(enable_timing=True)
        with pf.cuda.Stream():
            start.record()
            end.record()
        assert start.elapsed_time(end) >= 0.0

    @check("the kernels' memory helpers are the backend's")
    def _():
        assert _memory.simulated() and _memory.array_module() is SIM_NUMPY
        dev = _memory.empty(3, np.float32)
        assert backend_of_array(dev) is sim and _memory.is_device_array(dev)
        assert _memory.is_host_array(np.zeros(2)) and not _memory.is_host_array(dev)
        assert not _memory.is_host_array([1.0]) and not _memory.is_device_array([1.0])
        assert _memory.array_module(dev) is SIM_NUMPY and _memory.array_module(1.0) is np
        assert type(_memory.to_host(dev)) is np.ndarray

    return check.report()


if __name__ == "__main__":
    sys.exit(main())
