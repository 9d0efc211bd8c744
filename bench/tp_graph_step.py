"""A compiled 2-rank tensor-parallel GPT training step: its median time, and how
many times one step enters the eager SBP dispatch.

The model is one GPT block (d=256, 4 heads, T=64, vocab 256, batch 8) laid
out as the trainer's ``--parallel tp`` does (``models/parallel_layout.py``:
Megatron's MLP split, everything else replicated), trained by an ``nn.Graph``
with AdamW.  Each rank prints nothing; rank 0 prints one JSON line: the median
seconds of ``--steps`` steps after ``--warmup`` steps, and the calls per step
into ``dispatch.choose`` / ``forward_global`` / ``backward_global`` (the eager
SBP dispatch: deduction and boxing at run time; 0 once a compile-time pass
fixes the signatures and inserts box nodes).

Run (2 ranks): python -m pyflow.distributed.launch -n 2 bench/tp_graph_step.py
Options: --steps 20 --warmup 3 --executor actors|sequential --d 256 --layers 1
"""
import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

import pyflow  # noqa: E402
import pyflow.nn.functional as F  # noqa: E402
from models.gpt import GPT, GPTConfig  # noqa: E402
from models.parallel_layout import place_model, plan  # noqa: E402
from pyflow.distributed import dispatch, env  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--executor", choices=("actors", "sequential"), default="actors")
    ap.add_argument("--d", type=int, default=256)
    ap.add_argument("--layers", type=int, default=1)
    args = ap.parse_args()
    rank, world = env.get_rank(), env.get_world_size()
    config = GPTConfig(block_size=64, vocab_size=256, n_layer=args.layers, n_head=4,
                       n_embd=args.d, dropout=0.0)
    pyflow.manual_seed(0)
    model = GPT(config)
    layout = plan(model, "tp", "cpu", rank, world, world)
    place_model(model, layout)
    opt = pyflow.optim.AdamW(model.parameters(), lr=1e-4)

    class Step(pyflow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = model
            self.add_optimizer(opt)
            self.config.set_executor(args.executor)

        def build(self, x, y):
            logits = self.model(x)
            logits = logits[0] if isinstance(logits, tuple) else logits
            loss = F.cross_entropy(logits.reshape(-1, config.vocab_size), y.reshape(-1))
            loss.backward()
            return loss

    rng = np.random.default_rng(0)
    x = layout.place(pyflow.tensor(rng.integers(0, config.vocab_size, (8, 64))))
    y = layout.place(pyflow.tensor(rng.integers(0, config.vocab_size, (8, 64))))
    step = Step()
    for _ in range(args.warmup):
        step(x, y)

    calls = {"choose": 0, "forward_global": 0, "backward_global": 0}

    def counting(name):
        original = getattr(dispatch, name)

        def wrapper(*a, **k):
            calls[name] += 1
            return original(*a, **k)
        setattr(dispatch, name, wrapper)
    for name in calls:
        counting(name)
    from bench.common import step_times
    median = step_times(lambda: step(x, y), args.steps, 0)
    if rank == 0:
        print(json.dumps({"median_s": median, "executor": args.executor,
                          "dispatch_calls_per_step": {k: v / args.steps
                                                      for k, v in calls.items()}}))


if __name__ == "__main__":
    main()
