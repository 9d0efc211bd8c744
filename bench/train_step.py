"""Training-step throughput, pyflow vs PyTorch eager on the CPU: same model code
(``bench/models_both.py``), same data, same optimizer.

Each measurement runs in its own process, alternating pyflow and torch for
several rounds, and the ratio of median step times is printed.  Separate
processes because on a 2-core machine one framework's idle thread pool (torch's
spinning OpenMP workers, NumPy's OpenBLAS workers) steals the cores from the
other's next step; in one process whichever ran second would be penalised.

Targets (issue 2): MLP >= 0.8x PyTorch samples/s, small CNN >= 0.4x, transformer
block forward+backward >= 0.7x.  Run: python bench/train_step.py [--rounds 3]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CASES = {  # name: (model builder, batch, target ratio)
    "mlp": ("MLP 784-1024-1024-10, batch 128", 128, 0.8),
    "cnn": ("small CNN 28x28, batch 64", 64, 0.4),
    "block": ("transformer block d=256 T=128, batch 16 (fwd+bwd)", 16, 0.7),
}


def worker(lib_name, case, steps, warmup):
    """Time ``steps`` training steps of ``case`` in this process; print JSON."""
    sys.path.insert(0, ROOT)
    if lib_name == "torch":
        import torch as lib
    else:
        import pyflow as lib   # first: it sets NumPy's BLAS thread timeout (pyflow/__init__.py)
    import numpy as np
    from bench.models_both import mlp, small_cnn, transformer_block
    lib.manual_seed(0)
    rng = np.random.default_rng(0)
    build = {"mlp": mlp, "cnn": small_cnn, "block": transformer_block}[case]
    model = build(lib.nn)
    F = lib.nn.functional
    if case == "block":
        x = lib.tensor(rng.standard_normal((16, 128, 256)).astype(np.float32))

        def step():
            model(x).sum().backward()
    else:
        batch = CASES[case][1]
        x = lib.tensor(rng.standard_normal((batch, 1, 28, 28)).astype(np.float32))
        y = lib.tensor(rng.integers(0, 10, batch))
        opt = lib.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

        def step():
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    from bench.common import step_times
    print(json.dumps({"median": step_times(step, steps, warmup)}))


def measure(lib_name, case, steps, warmup):
    out = subprocess.run([sys.executable, __file__, "--worker", lib_name, "--case", case,
                          "--steps", str(steps), "--warmup", str(warmup)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["median"]


def run(rounds=3, steps=10, warmup=5, cases=tuple(CASES)):
    """Rows of (name, pyflow samples/s, torch samples/s, ratio, target, met)."""
    rows = []
    for case in cases:
        name, batch, target = CASES[case]
        tp, tt = [], []
        for _ in range(rounds):
            tp.append(measure("pyflow", case, steps, warmup))
            tt.append(measure("torch", case, steps, warmup))
        p, t = statistics.median(tp), statistics.median(tt)
        ratio = t / p
        rows.append([name, f"{batch / p:,.0f}", f"{batch / t:,.0f}", f"{ratio:.2f}x",
                     f"{target:.1f}x", "met" if ratio >= target else "not met"])
    return rows


HEADERS = ["training step", "pyflow samples/s", "torch samples/s", "pyflow/torch", "target", ""]

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", choices=["pyflow", "torch"])
    ap.add_argument("--case", choices=list(CASES))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args.case, args.steps, args.warmup)
    else:
        sys.path.insert(0, ROOT)
        from bench.common import machine, table
        print(machine())
        print(table(run(args.rounds, args.steps, args.warmup), HEADERS))
