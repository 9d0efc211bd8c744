"""Eager per-op overhead on tiny tensors: microseconds per op, pyflow vs PyTorch.

Target (issue 2): pyflow within 4x of PyTorch eager.  Run: python bench/op_overhead.py
"""
import os
import sys

# NumPy's OpenBLAS must not spin idle threads for long after each GEMM (see
# pyflow/__init__.py); torch does not use it, so this changes nothing for torch.
# torch is imported before pyflow so its OpenMP runtime keeps its own default
# (active) wait policy; pyflow then sets a passive one for numba's runtime only.
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import pyflow as pf  # noqa: E402
from bench.common import interleaved, machine, table  # noqa: E402


def cases(lib, requires_grad):
    rng = np.random.default_rng(0)
    mk = (lambda s: lib.tensor(rng.standard_normal(s).astype(np.float32), requires_grad=requires_grad))
    a, b, m = mk((4, 4)), mk((4, 4)), mk((4, 4))
    return {
        "add": lambda: a + b,
        "mul scalar": lambda: a * 2.0,
        "relu": lambda: a.relu(),
        "sum": lambda: a.sum(),
        "matmul 4x4": lambda: a @ m,
        "view": lambda: a.view(16),
        "transpose": lambda: a.t(),
        "index [1:3]": lambda: a[1:3],
    }


def run(repeats=7, number=2000):
    rows, ratios = [], []
    for rg in (False, True):
        ours, theirs = cases(pf, rg), cases(torch, rg)
        for name in ours:
            tp, tt = interleaved([ours[name], theirs[name]], repeats=repeats, number=number)
            ratios.append(tp / tt)
            rows.append([name + (" (requires_grad)" if rg else ""), f"{tp * 1e6:.2f}",
                         f"{tt * 1e6:.2f}", f"{tp / tt:.2f}x"])
    gm = float(np.exp(np.mean(np.log(ratios))))
    rows.append(["geometric mean", "", "", f"{gm:.2f}x"])
    return rows, gm


if __name__ == "__main__":
    print(machine())
    rows, gm = run()
    print(table(rows, ["op (4x4 float32)", "pyflow us", "torch us", "pyflow/torch time"]))
    print(f"\nper-op overhead: pyflow takes {gm:.2f}x PyTorch's time (target <= 4x)")
