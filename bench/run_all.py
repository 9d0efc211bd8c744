"""Run every CPU benchmark and print the tables (medians, ratios against PyTorch)."""
import os
import sys

# NumPy's OpenBLAS must not spin idle threads for long after each GEMM (see
# pyflow/_threads.py); torch does not use it, so this changes nothing for torch.
# torch is imported before pyflow so its OpenMP runtime keeps its own default
# (active) wait policy; pyflow then sets a passive one for numba's runtime only.
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "20")  # pyflow's own (pyflow/_threads.py)

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# dlperf first: it keeps the environment as it was before pyflow's import for its children
from bench import dlperf  # noqa: E402
from bench import graph_step, op_overhead, train_step  # noqa: E402
from bench.common import machine, table  # noqa: E402

if __name__ == "__main__":
    print(machine())
    rows, gm = op_overhead.run()
    print(table(rows, op_overhead.HEADERS))
    print()
    print(table(train_step.run(), train_step.HEADERS))
    print()
    print(table(graph_step.run(), graph_step.HEADERS))
    print()
    # DLPerf-style ResNet-50 / BERT / GPT-2 throughput and DDP scaling, one quick round;
    # bench/dlperf.py alone takes the medians of 3 and writes bench/RESULTS.md.
    dlperf.main(["--rounds", "1", "--out", "-"])
