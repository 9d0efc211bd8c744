"""Training step in graph mode vs eager mode vs PyTorch eager, on the CPU.

Same model code (``bench/models_both.py``), data and optimizer (AdamW).  Each
measurement runs in its own process, alternating the three for several
rounds (see bench/train_step.py for why), and prints ratios of median step
times.  ``--executor`` picks the graph's executor (actors by default).
``--unfused-update`` also times graph mode with
``allow_fuse_model_update_ops(False)`` (one update node per parameter instead
of the default multi-tensor AdamW kernel) in the same alternating rounds.

Targets (issue 4): on the GPT-mini (4 layers, d=256, T=128, batch 16) graph
mode at least 1.3x pyflow eager and at least 1.0x PyTorch eager.
Run: python bench/graph_step.py [--rounds 3] [--case mlp gpt] [--unfused-update]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CASES = {"mlp": ("MLP 784-1024-1024-10, batch 128", 128),
         "gpt": ("GPT-mini 4x(d=256, T=128), batch 16", 16)}
MODES = ("graph", "eager", "torch")


def setup(lib, case):
    """(model, x, y, loss_of) of ``case`` built with ``lib`` (pyflow or torch),
    seeded alike: the same model code and data for every mode."""
    import numpy as np
    from bench.models_both import gpt_mini, mlp
    lib.manual_seed(0)
    rng = np.random.default_rng(0)
    F = lib.nn.functional
    if case == "mlp":
        model = mlp(lib.nn)
        x = lib.tensor(rng.standard_normal((128, 1, 28, 28)).astype(np.float32))
        y = lib.tensor(rng.integers(0, 10, 128))

        def loss_of(model, x, y):
            return F.cross_entropy(model(x), y)
    else:
        model = gpt_mini(lib.nn)
        x = lib.tensor(rng.integers(0, 512, (16, 128)))
        y = lib.tensor(rng.integers(0, 512, (16, 128)))

        def loss_of(model, x, y):
            return F.cross_entropy(model(x).reshape(-1, 512), y.reshape(-1))
    return model, x, y, loss_of


def worker(mode, case, steps, warmup, executor, fuse_update=None):
    sys.path.insert(0, ROOT)
    if mode == "torch":
        import torch as lib
    else:
        import pyflow as lib
    model, x, y, loss_of = setup(lib, case)
    opt = lib.optim.AdamW(model.parameters(), lr=1e-4)
    from bench.common import make_step, step_times
    step = make_step(lib, mode, model, (x, y), loss_of, opt,
                     executor=executor, fuse_update=fuse_update)
    print(json.dumps({"median": step_times(step, steps, warmup)}))


def measure(mode, case, steps, warmup, executor, fuse_update=None):
    out = subprocess.run([sys.executable, __file__, "--worker", mode, "--case", case,
                          "--steps", str(steps), "--warmup", str(warmup),
                          "--executor", executor] + (["--unfused-update"] if fuse_update is False
                                                     else []),
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["median"]


def run(rounds=3, steps=8, warmup=3, cases=tuple(CASES), executor="actors", unfused=False):
    rows = []
    for case in cases:
        name, batch = CASES[case]
        times = {m: [] for m in MODES}
        per_param = []
        for _ in range(rounds):
            for m in MODES:
                times[m].append(measure(m, case, steps, warmup, executor))
            if unfused:
                per_param.append(measure("graph", case, steps, warmup, executor, False))
        g, e, t = (statistics.median(times[m]) for m in MODES)
        rows.append([name, f"{batch / g:,.0f}", f"{batch / e:,.0f}", f"{batch / t:,.0f}",
                     f"{e / g:.2f}x", f"{t / g:.2f}x"])
        if unfused:
            f = statistics.median(per_param)
            rows.append([name + ", update per parameter", f"{batch / f:,.0f}", f"{batch / e:,.0f}",
                         f"{batch / t:,.0f}", f"{e / f:.2f}x", f"{t / f:.2f}x"])
    return rows


HEADERS = ["training step (AdamW)", "graph samples/s", "eager samples/s", "torch samples/s",
           "graph/eager", "graph/torch"]

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", choices=MODES)
    ap.add_argument("--case", choices=list(CASES), nargs="*", default=list(CASES))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--executor", choices=["actors", "sequential"], default="actors")
    ap.add_argument("--unfused-update", action="store_true",
                    help="also time graph mode with allow_fuse_model_update_ops(False)")
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args.case[0], args.steps, args.warmup, args.executor,
               False if args.unfused_update else None)
    else:
        sys.path.insert(0, ROOT)
        from bench.common import machine, table
        print(machine())
        print(table(run(args.rounds, args.steps, args.warmup, args.case, args.executor,
                        args.unfused_update), HEADERS))
