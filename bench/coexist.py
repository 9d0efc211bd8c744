"""pyflow and PyTorch in one process: a small GPT training step on each
framework alone, and with the other framework imported (and training) in the
same process, with pyflow's thread guard on and off (``pyflow/_threads.py``).

A user comparing results, converting weights or feeding pyflow from a
torch-based data pipeline has both libraries loaded.  ``import torch`` first
imports NumPy, whose OpenBLAS threads then spin for 2^28 cycles after every
GEMM; ``import pyflow`` restarts that pool with a short timeout unless
``PYFLOW_THREAD_GUARD=0`` ("guard off" below: how it was before).

Each case runs in its own process; the cases alternate for ``--rounds``
rounds and the medians of the per-round median step times are printed, with
the ratio to the framework's step alone.  Run: python bench/coexist.py
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# name: (libraries imported, in order; libraries that train; PYFLOW_THREAD_GUARD)
CASES = {
    "pyflow alone": (("pyflow",), ("pyflow",), "1"),
    "pyflow, torch imported first, guard off": (("torch", "pyflow"), ("pyflow",), "0"),
    "pyflow, torch imported first": (("torch", "pyflow"), ("pyflow",), "1"),
    "torch alone": (("torch",), ("torch",), "1"),
    "both training, torch imported first, guard off": (("torch", "pyflow"), ("pyflow", "torch"), "0"),
    "both training, torch imported first": (("torch", "pyflow"), ("pyflow", "torch"), "1"),
    "both training, pyflow imported first": (("pyflow", "torch"), ("pyflow", "torch"), "1"),
}
VOCAB, BATCH, CONTEXT = 128, 8, 64


def worker(case, steps, warmup):
    """Time the case's training steps in this process; print JSON {library: median s}."""
    imports, trains, _ = CASES[case]
    sys.path.insert(0, ROOT)
    libs = {name: __import__(name) for name in imports}
    from bench.common import step_times
    from bench.models_both import gpt_mini

    def make_step(lib):
        lib.manual_seed(0)
        model = gpt_mini(lib.nn, vocab=VOCAB, layers=2, d=64, heads=4, context=CONTEXT)
        opt = lib.optim.AdamW(model.parameters(), lr=1e-3)
        idx = lib.randint(0, VOCAB, (BATCH, CONTEXT))
        target = lib.randint(0, VOCAB, (BATCH, CONTEXT))

        def step():
            loss = lib.nn.functional.cross_entropy(model(idx).view(-1, VOCAB), target.view(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
        return step

    steps_by_lib = {name: make_step(libs[name]) for name in trains}
    if len(trains) == 1:
        (name, step), = steps_by_lib.items()
        print(json.dumps({name: step_times(step, steps, warmup)}))
        return
    # Both train: alternate their steps, as a user comparing the two would.
    for _ in range(warmup):
        for step in steps_by_lib.values():
            step()
    import time
    times = {name: [] for name in trains}
    for _ in range(steps):
        for name, step in steps_by_lib.items():
            t0 = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - t0)
    print(json.dumps({name: statistics.median(t) for name, t in times.items()}))


def measure(case, steps, warmup):
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_WAIT_POLICY", "OPENBLAS_THREAD_TIMEOUT")}  # as a user's shell
    env["PYFLOW_THREAD_GUARD"] = CASES[case][2]
    out = subprocess.run([sys.executable, __file__, "--worker", case, "--steps", str(steps),
                          "--warmup", str(warmup)], capture_output=True, text=True, check=True,
                         env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run(rounds=3, steps=20, warmup=5):
    samples = {case: [] for case in CASES}
    for _ in range(rounds):
        for case in CASES:
            samples[case].append(measure(case, steps, warmup))
    medians = {case: {lib: statistics.median(s[lib] for s in runs) for lib in runs[0]}
               for case, runs in samples.items()}
    alone = {"pyflow": medians["pyflow alone"]["pyflow"], "torch": medians["torch alone"]["torch"]}
    rows = []
    for case, result in medians.items():
        for lib, t in result.items():
            rows.append([case, lib, f"{1e3 * t:.1f}", f"{t / alone[lib]:.2f}x"])
    return rows


HEADERS = ["case", "step of", "ms per step", "vs alone"]

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", choices=list(CASES))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args.steps, args.warmup)
    else:
        sys.path.insert(0, ROOT)
        from bench.common import machine, table
        print(machine())
        print(f"GPT 2 layers d=64 T={CONTEXT}, vocab {VOCAB}, batch {BATCH}, AdamW; "
              f"{args.rounds} rounds x {args.steps} steps")
        print(table(run(args.rounds, args.steps, args.warmup), HEADERS))
