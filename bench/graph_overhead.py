"""Per-op runtime overhead of graph mode: microseconds per actor firing (and
per step of the sequential executor) against eager dispatch of the same ops.

A chain of N tiny ops (``x = x * 1.0001 + 0.5``, alternating mul and add on a
4x4 float32 tensor, so the kernels cost next to nothing) runs three ways:
eagerly (under ``no_grad``), as an inference graph run by actors (one
chain actor for the compute stream, the default, and one actor per op,
``allow_fuse_actor_chains(False)``), and by the sequential executor.  Elementwise fusion is switched
off, or the chain would become one kernel.  Each is timed for N = 50 and
N = 200, alternating (bench/common.py); the per-op cost is the slope
(t(200) - t(50)) / 150, so the fixed cost of starting a run drops out, and
the intercept is printed as the per-run cost.  Medians of repeats.

Run: python bench/graph_overhead.py [--repeats 15]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pyflow as pf  # noqa: E402
from bench.common import interleaved, machine, table  # noqa: E402

LENGTHS = (50, 200)
MODES = ("eager", "actors (chains)", "actors (per op)", "sequential")


def chain(x, n):
    for i in range(n):
        x = x * 1.0001 if i % 2 == 0 else x + 0.5
    return x


class Chain(pf.nn.Graph):
    def __init__(self, n, executor):
        super().__init__()
        self.n = n
        self.config.set_executor("actors" if executor.startswith("actors") else executor)
        self.config.allow_fuse_actor_chains(executor != "actors (per op)")
        self.config.allow_fuse_elementwise(False)

    def build(self, x):
        return chain(x, self.n)


def runners(n, x):
    def eager():
        with pf.no_grad():
            chain(x, n)
    graphs = {e: Chain(n, e) for e in MODES[1:]}
    for g in graphs.values():
        g(x)                                    # compile outside the timing
    return {"eager": eager, **{e: (lambda g=g: g(x)) for e, g in graphs.items()}}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    x = pf.randn(4, 4)
    modes = MODES
    fns, keys = [], []
    for n in LENGTHS:
        r = runners(n, x)
        for m in modes:
            fns.append(r[m])
            keys.append((m, n))
    times = dict(zip(keys, interleaved(fns, repeats=args.repeats, number=3)))
    lo, hi = LENGTHS
    per_op = {m: (times[m, hi] - times[m, lo]) / (hi - lo) for m in modes}
    per_run = {m: times[m, lo] - lo * per_op[m] for m in modes}
    rows = [[m, f"{per_op[m] * 1e6:.1f}", f"{per_run[m] * 1e6:.0f}",
             f"{times[m, hi] * 1e3:.2f}", f"{per_op[m] / per_op['eager']:.2f}x"] for m in modes]
    print(machine())
    print(f"chain of tiny ops (4x4 float32 mul/add), slope between N={lo} and N={hi}, "
          f"median of {args.repeats}")
    print(table(rows, ["mode", "us per op", "us per run (fixed)", f"ms for N={hi}",
                       "per-op vs eager"]))


if __name__ == "__main__":
    main()
