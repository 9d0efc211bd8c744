"""Host time of pyflow's eager ``cuda`` path per op, without a GPU: Python calls
and microseconds from the tensor call down to the kernel launch.

It runs on the simulated ``cuda`` device (numba's simulator, in a child process
with NUMBA_ENABLE_CUDASIM=1) with the simulator's kernel call replaced by a
no-op, so what is counted is pyflow's own host side: the autograd Function,
argument checks, output allocation, the kernel module's layout analysis and
launch configuration.  Not counted, because they need a real driver: numba's
dispatcher (argument typing and marshalling, about 12-18 us per array
argument on a GPU, issue 19) and the driver launch itself.  The simulated
device arrays are NumPy arrays where a GPU has CuPy ones, so the numbers are
of the same code with a different array type: a guide to pyflow's share, not
a GPU measurement.  Issue 19's target for the whole host path on a GPU is at
most 60 Python calls and 20 us per op.

Each op runs on 16x16 float32 tensors (the autograd row: ``a * b`` with ``a``
requiring grad).  Calls are counted by cProfile over ``--number`` calls;
microseconds are the median of ``--repeats`` timings without the profiler.

    python bench/cuda_host_path.py [--number 200] [--repeats 7]
"""
import argparse
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def ops(pf, F):
    import numpy as np
    rng = np.random.default_rng(0)

    def dev(shape, grad=False):
        t = pf.tensor(rng.standard_normal(shape).astype(np.float32), device="cuda")
        return t.requires_grad_() if grad else t
    a, b, v = dev((16, 16)), dev((16, 16)), dev((16,))
    w, bias = dev((16,)), dev((16,))
    g = dev((16, 16), grad=True)
    return {
        "add": lambda: a + b,
        "mul by a scalar": lambda: a * 2.0,
        "broadcast add (16x16 + 16)": lambda: a + v,
        "relu": lambda: F.relu(a),
        "matmul": lambda: a @ b,
        "softmax": lambda: F.softmax(a, dim=-1),
        "layer_norm": lambda: F.layer_norm(a, (16,), w, bias),
        "mul, recorded for autograd": lambda: g * b,
    }


def child(number, repeats):
    import cProfile
    import pstats
    import statistics
    import time

    from numba.cuda.simulator import kernel as simulated
    sys.path.insert(0, ROOT)
    import pyflow as pf
    import pyflow.nn.functional as F
    simulated.FakeCUDAKernel.__call__ = lambda self, *args: None   # launches cost nothing
    rows = []
    for label, fn in ops(pf, F).items():
        for _ in range(5):
            fn()
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(number):
            fn()
        profile.disable()
        calls = pstats.Stats(profile).total_calls / number
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            for _ in range(number):
                fn()
            times.append((time.perf_counter() - t0) / number * 1e6)
        rows.append((label, f"{calls:.0f}", f"{statistics.median(times):.1f}"))
    print("| op | Python calls per op | us per op |\n|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--number", type=int, default=200, help="calls per timing")
    ap.add_argument("--repeats", type=int, default=7, help="timings per op (median)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args.number, args.repeats)
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")      # before numba is imported
    print("pyflow's eager cuda host path (simulated device, kernel launches stubbed; numba's "
          "dispatcher and the driver not counted)")
    sys.exit(subprocess.call([sys.executable, os.path.abspath(__file__), "--child",
                              "--number", str(args.number), "--repeats", str(args.repeats)],
                             env=env))


if __name__ == "__main__":
    main()
