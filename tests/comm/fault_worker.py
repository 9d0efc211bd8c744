"""Run under ``mpirun -n N python fault_worker.py SCENARIO`` (N = 2 or 3).

``timeout`` (with ``PYFLOW_COMM_TIMEOUT`` set): first every rank runs a few
collectives on the timed path (values and a mismatch error must be right);
then the last rank skips every further call while the others call
all_reduce, barrier, iall_gather, recv, irecv and a sub-group all_reduce:
each must raise CollectiveTimeoutError naming the missing rank, after about
the timeout.  The last rank stays alive meanwhile, in a raw MPI barrier
polled with sleeps (a rank that exits is another fault: the watchdog aborts
the job when a rank waits for one, see tests/distributed/test_faults.py).
Ends with ``rank r: N checks, F failures``.

``raise``: the last rank raises while the others wait in an all_reduce with
no timeout; the job must stop (MPI abort) with that traceback.
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tests.rank_checks import RankChecks  # noqa: E402

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

import pyflow  # noqa: E402
import pyflow.comm as comm  # noqa: E402

SCENARIO = sys.argv[1]
W = comm.world()
RANK, SIZE = W.rank, W.size
LAST = SIZE - 1
check = RankChecks(RANK)


def times_out(fn, *needles):
    """``fn()`` raises CollectiveTimeoutError with every needle, after ~the timeout."""
    t0 = time.monotonic()
    try:
        fn()
    except comm.CollectiveTimeoutError as e:
        took = time.monotonic() - t0
        for needle in needles:
            assert needle in str(e), f"{needle!r} not in {e}"
        assert 0.9 * W.timeout <= took <= W.timeout + 5, f"took {took:.2f} s"
        print(f"rank {RANK}: timed out after {took:.2f} s: {e}", flush=True)
        return
    raise AssertionError("no CollectiveTimeoutError")


def timed_path_works():
    assert W.timeout is not None and W.timeout > 0
    t = pyflow.full((3,), float(RANK + 1))
    W.all_reduce(t)
    assert t.tolist() == [SIZE * (SIZE + 1) / 2] * 3
    got = W.iall_gather(pyflow.tensor([float(RANK)])).wait()
    assert got.tolist() == [float(r) for r in range(SIZE)]
    W.barrier()
    try:
        W.all_reduce(pyflow.ones(2 + (RANK == 0)))
    except comm.CollectiveMismatchError as e:
        assert "rank 0: all_reduce(shape=(3,)" in str(e) and "rank 1: all_reduce(shape=(2,)" \
            in str(e), str(e)
    else:
        raise AssertionError("no CollectiveMismatchError")
    W.all_reduce(t)                            # still usable after the mismatch
    assert t.tolist() == [SIZE * SIZE * (SIZE + 1) / 2] * 3


def meet_all():
    """Every rank meets in a raw MPI barrier on MPI.COMM_WORLD (still in step:
    the calls that timed out moved no data), polled with sleeps."""
    done = MPI.COMM_WORLD.Ibarrier()
    while not done.Test():
        time.sleep(0.02)


def timeout_scenario():
    pair = W.group([LAST, 0])                  # made by every rank (collective)
    check("timed path", timed_path_works)
    if RANK == LAST:                           # skips everything from here on
        meet_all()
        check.report_and_exit()
    missing = f"ranks [{LAST}] did not arrive"
    check("all_reduce", times_out, lambda: W.all_reduce(pyflow.ones(4)), missing,
          f"arrived: {list(range(LAST))}", f"on rank {RANK} of {SIZE}")
    check("barrier", times_out, W.barrier, "barrier: timed out", missing)
    check("iall_gather", times_out, lambda: W.iall_gather(pyflow.ones(2)), missing)
    check("recv", times_out, lambda: W.recv(pyflow.zeros(2), LAST, tag=5),
          f"got no message from rank {LAST} (tag 5)")
    check("irecv wait", times_out, lambda: W.irecv(pyflow.zeros(2), LAST, tag=6).wait(),
          f"irecv from rank {LAST} (tag 6): not finished after")
    if RANK == 0:                              # position 1 of the group; world rank 0
        check("sub-group names world ranks", times_out,
              lambda: pair.all_reduce(pyflow.ones(2)),
              f"ranks [0] (world ranks [{LAST}]) did not arrive")
    meet_all()
    check.report_and_exit()


def raise_scenario():
    if RANK == LAST:
        time.sleep(0.5)                        # the others are inside the all_reduce by now
        raise ValueError(f"boom on rank {RANK}")
    W.all_reduce(pyflow.ones(3))
    print(f"rank {RANK}: the all_reduce returned (it must not)", flush=True)


if __name__ == "__main__":
    np.seterr(all="raise")
    {"timeout": timeout_scenario, "raise": raise_scenario}[SCENARIO]()
