"""One fault on 2 ranks: ``faults_worker.py SCENARIO MARKER`` (test_faults.py).

The test names a unique ``MARKER`` (only there so that it can find every
process of the job in /proc afterwards).  Each scenario prints ``FAULT <unix
time>`` just before its fault, or ``WAIT <unix time>`` when rank 0 starts
waiting for a rank that stalls, and ``READY`` lines for the launcher test.
Rank 0 waits in an all_reduce of 4 floats unless the scenario says otherwise.
"""
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from mpi4py import MPI  # noqa: E402

import pyflow  # noqa: E402
import pyflow.comm as comm  # noqa: E402

SCENARIO = sys.argv[1]
W = comm.world()
RANK = W.rank


def say(text):
    print(f"{text} {time.time():.3f} rank {RANK}", flush=True)


def all_reduce():
    W.all_reduce(pyflow.ones(4))
    print(f"rank {RANK}: the all_reduce returned", flush=True)


def rank1_fails(fault):
    """Rank 0 waits in an all_reduce; rank 1 lets it start waiting, then fails."""
    W.barrier()
    if RANK == 0:
        all_reduce()
        return
    time.sleep(0.5)
    say("FAULT")
    fault()


def raise_error():
    raise ValueError("boom on rank 1")


def exit_then_rank0_enters():
    """Rank 1 runs off the end of the script; rank 0 works for 1.5 s, then calls
    an all_reduce that needs rank 1."""
    W.barrier()
    if RANK == 1:
        say("FAULT")
        return
    time.sleep(1.5)
    say("FAULT")            # the fault, for rank 0: a collective nobody else will join
    all_reduce()


def late_work():
    """A normal job: rank 1 is done, finalizes MPI itself and exits 0; rank 0
    still works for 3 s (a checkpoint) and exits 0.  Nothing may abort."""
    t = pyflow.ones(4)
    W.all_reduce(t)
    if RANK == 1:
        MPI.Finalize()      # pyflow.comm's exit steps first: no watchdog call races it
        sys.exit(0)
    time.sleep(3.0)
    print(f"rank 0: checkpoint written, all_reduce gave {t.tolist()}", flush=True)
    say("DONE")


def stall():
    W.barrier()
    if RANK == 0:
        say("WAIT")
        all_reduce()
    else:
        time.sleep(60)      # hangs (a stuck data loader, a deadlock in user code)


def mismatch(rank0, rank1):
    W.barrier()
    say("FAULT")
    (rank0 if RANK == 0 else rank1)()
    print(f"rank {RANK}: the mismatched call returned", flush=True)


def launcher_signal():
    W.barrier()
    say("READY")
    if RANK == 0:
        all_reduce()
    else:
        time.sleep(60)


SCENARIOS = {
    "raise": lambda: rank1_fails(raise_error),
    "exit0": lambda: rank1_fails(lambda: sys.exit(0)),
    "exit3": lambda: rank1_fails(lambda: sys.exit(3)),
    "raise_systemexit3": lambda: rank1_fails(lambda: exec("raise SystemExit(3)")),
    "kill": lambda: rank1_fails(lambda: os.kill(os.getpid(), signal.SIGKILL)),
    "exit_then_rank0_enters": exit_then_rank0_enters,
    "late_work": late_work,
    "stall": stall,
    "mismatch_shapes": lambda: mismatch(lambda: W.all_reduce(pyflow.ones(3)),
                                        lambda: W.all_reduce(pyflow.ones(2))),
    "mismatch_kinds": lambda: mismatch(W.barrier, lambda: W.broadcast(pyflow.ones(2), 0)),
    "launcher_signal": launcher_signal,
}

if __name__ == "__main__":
    SCENARIOS[SCENARIO]()
