"""Eager per-op overhead on small tensors: microseconds per op, pyflow vs PyTorch.

Each op runs on 16x16 float32 tensors, without and with ``requires_grad`` (then
the op is recorded for autograd), and a recorded forward+backward: ``a.grad =
None; (a * b).sum().backward()`` with ``a`` requiring grad, what one tiny
training step's autograd costs.  Each library runs in its own child process
(bench/common.py says why; this parent imports neither), the two alternating
for ``--rounds`` rounds, the order flipped every round; within a child each
row is the median of ``--repeats`` timings of ``--number`` calls, and the
table shows the median over rounds and the pyflow/torch ratio of those
medians (in parentheses the range of the per-round ratios).

Targets (issue 16): pyflow eager at most 1.5x PyTorch's time per op for add,
mul by a scalar, relu, sum, view and matmul (judged with and without
``requires_grad``; transpose and index are shown without a target), and at
most 2x for the recorded forward+backward.

Run: python bench/op_overhead.py [--rounds 5] [--repeats 9] [--number 2000]
"""
import argparse
import math
import os
import statistics
import sys

# NumPy's OpenBLAS must not spin idle threads for long after each GEMM (see
# pyflow/_threads.py); torch does not use it, so this changes nothing for torch.
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "20")  # pyflow's own (pyflow/_threads.py)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.common import emit_result, machine_in_child, median_time, run_child, table  # noqa

# What every child inherits: the environment before anyone imported pyflow (which sets
# OMP_WAIT_POLICY at import) -- bench/run_all.py imports this module before its own
# machine() line imports both libraries.
ENV_AT_START = dict(os.environ)
LIBS = ("torch", "pyflow")
SHAPE = (16, 16)
OPS = ("add", "mul scalar", "relu", "sum", "view", "matmul", "transpose", "index [1:3]")
TARGETED = {"add", "mul scalar", "relu", "sum", "view", "matmul"}
FWD_BWD = "recorded forward+backward (a*b).sum().backward()"
OP_TARGET, FWD_BWD_TARGET = 1.5, 2.0
GRAD = " (requires_grad)"
HEADERS = ["op (16x16 float32)", "pyflow us", "torch us", "pyflow/torch time", "target", "met"]


# ------------------------------------------------------------------ the child
def cases(lib, requires_grad):
    """{row name: a call of one op} on 16x16 float32 tensors of ``lib``."""
    import numpy as np
    rng = np.random.default_rng(0)

    def mk():
        return lib.tensor(rng.standard_normal(SHAPE).astype(np.float32),
                          requires_grad=requires_grad)
    a, b, m = mk(), mk(), mk()
    ops = {
        "add": lambda: a + b,
        "mul scalar": lambda: a * 2.0,
        "relu": lambda: a.relu(),
        "sum": lambda: a.sum(),
        "view": lambda: a.view(SHAPE[0] * SHAPE[1]),
        "matmul": lambda: a @ m,
        "transpose": lambda: a.t(),
        "index [1:3]": lambda: a[1:3],
    }
    return {name + (GRAD if requires_grad else ""): fn for name, fn in ops.items()}


def forward_backward(lib):
    """One recorded forward and backward of a small mul+sum, as a training step
    does it (the gradient reset to None first, as ``zero_grad()`` does)."""
    import numpy as np
    rng = np.random.default_rng(1)
    a = lib.tensor(rng.standard_normal(SHAPE).astype(np.float32), requires_grad=True)
    b = lib.tensor(rng.standard_normal(SHAPE).astype(np.float32))

    def step():
        a.grad = None
        (a * b).sum().backward()
    return step


def worker(lib_name, repeats, number):
    """{"us": {row: median microseconds per call}} for one library, in this process."""
    if lib_name == "torch":
        import torch as lib
    else:
        import pyflow as lib    # first: it sets NumPy's BLAS thread timeout (pyflow/__init__.py)
    fns = {**cases(lib, False), **cases(lib, True)}
    out = {name: median_time(fn, repeats=repeats, number=number) * 1e6
           for name, fn in fns.items()}
    # a step costs ~20x an op: fewer calls per timing keep the child's time alike
    out[FWD_BWD] = median_time(forward_backward(lib), repeats=repeats,
                               number=max(1, number // 10)) * 1e6
    return {"us": out}


# ------------------------------------------------------------------ the parent
def measure(rounds=5, repeats=9, number=2000, log=None):
    """{lib: [per-round {row: us}]}, each library in its own child process,
    alternating (torch first in even rounds, pyflow first in odd ones)."""
    runs = {lib: [] for lib in LIBS}
    errors = []
    for r in range(rounds):
        for lib in (LIBS if r % 2 == 0 else LIBS[::-1]):
            res = run_child([os.path.abspath(__file__), "--worker", lib, "--repeats",
                             str(repeats), "--number", str(number)],
                            env=ENV_AT_START, what=f"the {lib} worker")
            if "error" in res:
                errors.append(res["error"])
            else:
                runs[lib].append(res["us"])
            if log:
                log(f"  round {r + 1}/{rounds} {lib:6s}: " +
                    (res["error"] if "error" in res else "done"))
    for lib in LIBS:
        if not runs[lib]:
            raise RuntimeError(f"op_overhead: every {lib} run failed: {errors[0]}")
    return runs


def _target(name):
    if name == FWD_BWD:
        return FWD_BWD_TARGET
    return OP_TARGET if name.removesuffix(GRAD) in TARGETED else None


def rows_of(runs):
    """Table rows [op, pyflow us, torch us, ratio, target, met] and the geometric
    mean of the per-op ratios (forward+backward excluded)."""
    names = list(runs["pyflow"][0])
    rows, op_ratios = [], []
    for name in names:
        pf = statistics.median(r[name] for r in runs["pyflow"])
        th = statistics.median(r[name] for r in runs["torch"])
        ratio = pf / th
        paired = [p[name] / t[name] for p, t in zip(runs["pyflow"], runs["torch"])]
        text = f"{ratio:.2f}x"
        if len(paired) > 1:
            text += f" ({min(paired):.2f}-{max(paired):.2f})"
        target = _target(name)
        rows.append([name, f"{pf:.2f}", f"{th:.2f}", text,
                     f"<= {target:.1f}x" if target else "-",
                     ("yes" if ratio <= target else "no") if target else "-"])
        if name != FWD_BWD:
            op_ratios.append(ratio)
    gm = math.exp(statistics.fmean(math.log(r) for r in op_ratios))
    rows.append(["geometric mean (ops)", "", "", f"{gm:.2f}x", "", ""])
    return rows, gm


def run(rounds=5, repeats=9, number=2000, log=None):
    """(rows, geometric mean of the per-op pyflow/torch ratios); see ``HEADERS``."""
    return rows_of(measure(rounds, repeats, number, log))


def summary(rows):
    """One line per target: how many of its rows meet it."""
    ops = [r for r in rows if r[4] == f"<= {OP_TARGET:.1f}x"]
    fb = [r for r in rows if r[0] == FWD_BWD]
    met_ops = sum(r[5] == "yes" for r in ops)
    return [f"target eager <= {OP_TARGET}x PyTorch per op (add, mul scalar, relu, sum, view, "
            f"matmul; with and without requires_grad): met on {met_ops} of {len(ops)} rows",
            f"target recorded forward+backward <= {FWD_BWD_TARGET}x PyTorch: " +
            ("met" if fb and fb[0][5] == "yes" else "not met") +
            (f" ({fb[0][3]})" if fb else "")]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5, help="child processes per library")
    ap.add_argument("--repeats", type=int, default=9, help="timings per op in a child (median)")
    ap.add_argument("--number", type=int, default=2000, help="calls per timing")
    ap.add_argument("--worker", choices=LIBS, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if min(args.rounds, args.repeats, args.number) < 1:
        ap.error("--rounds, --repeats and --number must be positive integers")
    if args.worker:
        return emit_result(lambda: worker(args.worker, args.repeats, args.number))
    print(machine_in_child(ENV_AT_START))
    print(f"each library in its own process, {args.rounds} alternating rounds; per row the "
          f"median over rounds of the median of {args.repeats} x {args.number} calls")
    rows, _ = run(args.rounds, args.repeats, args.number, log=print)
    print(table(rows, HEADERS))
    print()
    print("\n".join(summary(rows)))


if __name__ == "__main__":
    main()
