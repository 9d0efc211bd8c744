"""Memory of one training step: the graph's planned peak vs its measured peak
vs eager mode's measured peak, for the MLP and the GPT-mini of
bench/graph_step.py (AdamW).

Measured peaks come from ``tracemalloc``: NumPy reports its array buffers to
it, so the traced peak during one step, minus the traced bytes before the
step (parameters, optimizer state, the previous gradients), is what the step
itself allocated at its worst moment.  Both modes start the step from the
same state (one warm-up step first) and free the previous gradients at the
start (eager: ``zero_grad()``; the graph does it itself).  The planned peak
is ``plan.graph.memory.peak_bytes`` (pyflow.graph.passes.memory): the most
bytes of Values alive at once, with what the autograd contexts keep.
Target (issue 4): planned peak <= eager peak.

Run: python bench/graph_memory.py [--case mlp gpt] [--executor sequential]
"""
import argparse
import os
import sys
import tracemalloc

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


import pyflow as pf  # noqa: E402
from bench.common import machine, table  # noqa: E402
from bench.graph_step import CASES, setup  # noqa: E402


def step_peak(step):
    """Bytes the call ``step()`` allocated at its peak, beyond what existed before."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        step()
        return tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()


def measure(model, x, y, loss_of, executor="sequential", in_place=True):
    """(eager peak, graph measured peak, graph planned peak) in bytes, each
    mode on its own copy of the model and optimizer from the same seed."""
    import copy
    eager_model = copy.deepcopy(model)
    opt = pf.optim.AdamW(eager_model.parameters(), lr=1e-4)

    def eager():
        opt.zero_grad()
        loss_of(eager_model, x, y).backward()
        opt.step()
    eager()
    eager_peak = step_peak(eager)

    graph_opt = pf.optim.AdamW(model.parameters(), lr=1e-4)

    class TrainGraph(pf.nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = model
            self.add_optimizer(graph_opt)
            self.config.set_executor(executor)
            self.config.allow_in_place(in_place)

        def build(self, x, y):
            loss = loss_of(self.model, x, y)
            loss.backward()
            return loss
    graph = TrainGraph()
    graph(x, y)
    graph_peak = step_peak(lambda: graph(x, y))
    return eager_peak, graph_peak, graph.plans[0].graph.memory.peak_bytes


def mib(n):
    return f"{n / 2 ** 20:.1f}"


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--case", choices=list(CASES), nargs="*", default=list(CASES))
    ap.add_argument("--executor", choices=["actors", "sequential"], default="sequential")
    args = ap.parse_args()
    print(machine())
    rows = []
    for case in args.case:
        for in_place in (True, False):
            e, g, p = measure(*setup(pf, case), executor=args.executor, in_place=in_place)
            rows.append([CASES[case][0] + ("" if in_place else ", in_place off"), mib(p), mib(g),
                         mib(e), f"{p / e:.3f}", f"{g / e:.3f}"])
    print(table(rows, ["training step (AdamW)", "planned MiB", f"graph ({args.executor}) MiB",
                       "eager MiB", "planned/eager", "graph/eager"]))
