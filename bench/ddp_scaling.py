"""DDP weak scaling, 1 -> 2 ranks, pyflow against PyTorch, on the GPT-mini of
``bench/models_both.py`` (same code for both libraries).

Weak scaling: every rank trains on its own batch of the same size, so ideal
scaling keeps the time per step constant; the efficiency is (samples/s per
rank at 2 ranks) / (samples/s at 1 rank).  One thread per rank (on a 2-core
machine 2 ranks use both cores).  Both libraries run under ``mpirun`` with the
same launch: pyflow's ``DistributedDataParallel`` over ``pyflow.comm`` (MPI),
PyTorch's ``DistributedDataParallel`` over ``torch.distributed`` with gloo
(rank and world size taken from Open MPI's environment, a TCP rendezvous on
localhost).  The 1-rank runs use DDP too (a world of one), so the difference
is the gradient reduction and the contention for the machine, not the
wrapper.  The runs alternate (pyflow 1, pyflow 2, torch 1, torch 2) for
``--rounds`` rounds and the medians are kept.

A third row, "pyflow, no reduction", runs the same 1- and 2-rank jobs with
the model not wrapped in DDP: no gradient is reduced, so its efficiency is
what the machine alone allows (two ranks on two cores share caches, memory
bandwidth and clock headroom).  The gap between it and the DDP row is what
the gradient reduction costs.

Target (issue 5): pyflow's efficiency >= 90%.  Run:
``python bench/ddp_scaling.py [--rounds 2 --steps 8 --batch 4 --layers 4]``.
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


LIBS = ("pyflow", "pyflow-local", "torch")     # pyflow-local: no DDP, no reduction
LABELS = {"pyflow": "pyflow", "pyflow-local": "pyflow, no reduction", "torch": "torch"}


def worker(lib_name, steps, warmup, batch, layers):
    sys.path.insert(0, ROOT)
    import time

    import numpy as np
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    size = int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))
    if lib_name == "torch":
        import torch as lib
        import torch.distributed as dist
        lib.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{os.environ['BENCH_PORT']}",
                                rank=rank, world_size=size)
        DDP = lib.nn.parallel.DistributedDataParallel
        barrier = dist.barrier
    else:
        import pyflow as lib
        import pyflow.comm as comm
        if lib_name == "pyflow-local":
            def DDP(module):        # each rank trains alone: the machine's share only
                return module
        else:
            DDP = lib.nn.parallel.DistributedDataParallel
        barrier = comm.world().barrier
    from bench.models_both import gpt_mini
    lib.manual_seed(0)
    model = DDP(gpt_mini(lib.nn, layers=layers))
    opt = lib.optim.SGD(model.parameters(), lr=1e-3)
    rng = np.random.default_rng(rank)
    x = lib.tensor(rng.integers(0, 512, (batch, 128)))
    y = lib.tensor(rng.integers(0, 512, (batch, 128)))
    F = lib.nn.functional

    def step():
        loss = F.cross_entropy(model(x).reshape(-1, 512), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()

    for _ in range(warmup):
        step()
    times = []
    for _ in range(steps):
        barrier()
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    if rank == 0:
        print("RESULT " + json.dumps({"median": statistics.median(times)}), flush=True)
    if lib_name == "torch":
        dist.destroy_process_group()


def measure(lib_name, n, steps, warmup, batch, layers):
    """Median seconds per step on rank 0 of an ``n``-rank run."""
    sys.path.insert(0, ROOT)
    from pyflow.distributed.launch import build_command, find_mpirun
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PRTE_"))}
    env.update(NUMBA_NUM_THREADS="1", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               MKL_NUM_THREADS="1", PYTHONPATH=ROOT, BENCH_PORT=str(random.randint(20000, 60000)))
    cmd = build_command(find_mpirun(), n, __file__,
                        ["--worker", lib_name, "--steps", str(steps), "--warmup", str(warmup),
                         "--batch", str(batch), "--layers", str(layers)])
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    if out.returncode or not lines:
        sys.exit(f"{lib_name} on {n} ranks failed (rc {out.returncode}):\n{out.stdout[-3000:]}"
                 f"\n{out.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])["median"]


def run(rounds, steps, warmup, batch, layers):
    t = {(lib, n): [] for lib in LIBS for n in (1, 2)}
    for _ in range(rounds):
        for key in t:
            t[key].append(measure(*key, steps, warmup, batch, layers))
    med = {k: statistics.median(v) for k, v in t.items()}
    rows = []
    for lib in LIBS:
        one, two = batch / med[(lib, 1)], batch / med[(lib, 2)]
        rows.append([LABELS[lib], f"{med[(lib, 1)] * 1e3:.0f}", f"{one:.2f}", f"{med[(lib, 2)] * 1e3:.0f}",
                     f"{two:.2f}", f"{100 * two / one:.0f}%"])
    return rows, med


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", choices=LIBS)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch", type=int, default=4, help="sequences of 128 tokens per rank")
    ap.add_argument("--layers", type=int, default=4)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args.steps, args.warmup, args.batch, args.layers)
    else:
        sys.path.insert(0, ROOT)
        from bench.common import machine, table
        print(machine())
        rows, _ = run(args.rounds, args.steps, args.warmup, args.batch, args.layers)
        print(f"GPT-mini ({args.layers} layers, d=256, T=128), batch {args.batch} per rank, "
              f"SGD, DDP, 1 thread per rank; medians of {args.rounds} runs x {args.steps} steps")
        print(table(rows, ["library", "1 rank ms/step", "1 rank samples/s",
                           "2 ranks ms/step", "2 ranks samples/s per rank",
                           "weak-scaling efficiency"]))
        print("target: pyflow efficiency >= 90%")
