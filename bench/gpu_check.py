"""One command for a machine with a GPU: run the CUDA kernel checks on the real
GPU, then measure and print one table (issue 3's targets).

    bench/gpu_check          # on a GPU machine (numba-cuda, cupy, torch installed there)
    bench/gpu_check --sim    # anywhere: the same code path in numba's simulator, tiny sizes

The checks also run the graph tests (graph against eager, and the actor
runtime's CUDA events between streams) on the GPU.

Measured: device-to-device copy bandwidth (the ceiling) and each memory-bound
kernel's bandwidth as a fraction of it (elementwise, broadcast, reduction,
softmax, layer_norm); numba GEMM TFLOP/s against cuBLAS FP32 (TF32 off), TF32
and BF16 at 4096^3; softmax and layer_norm against PyTorch; launch overhead.
Then (on a GPU only, unless --skip-dlperf) one round of ``bench/dlperf.py
--device cuda``: DLPerf's ResNet-50, BERT-base and GPT-2 configurations against
PyTorch on the same GPU, its table written to ``$OUT/dlperf_cuda.md`` when
``OUT`` is set (else /tmp).  Under --sim every number is host time of the
simulator: it only proves the script runs end to end (the DLPerf models would
take hours there, so --sim skips them).  Installs nothing.
"""
import argparse
import glob
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGETS = {"memory-bound": 0.80, "sgemm vs cublas fp32": 0.50, "vs torch": 1.0}


def run_kernel_checks(sim):
    """The per-family kernel check scripts, on the GPU (or in the simulator)."""
    env = dict(os.environ)
    if sim:
        env["NUMBA_ENABLE_CUDASIM"] = "1"
    else:
        env.pop("NUMBA_ENABLE_CUDASIM", None)
    rows = []
    for script in sorted(glob.glob(os.path.join(ROOT, "tests", "kernels", "cudasim_*.py"))):
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-W", "ignore", script], env=env,
                              capture_output=True, text=True)
        last = (proc.stdout.strip().splitlines() or ["no output"])[-1]
        rows.append((os.path.basename(script), "ok" if proc.returncode == 0 else "FAILED",
                     last, f"{time.perf_counter() - t0:.1f} s"))
        if proc.returncode:
            print(proc.stdout[-3000:], proc.stderr[-3000:])
    if not sim:
        rows.append(run_graph_checks(env))
    return rows


def run_graph_checks(env):
    """Graph mode on the real GPU: graph against eager, and the runtime's CUDA
    events between actor streams (pyflow/runtime/device.py), which only a GPU
    exercises for real (the simulator's kernels finish before their launch
    returns).  Under --sim, ``make test-cuda-sim`` runs these tests already."""
    import importlib.util
    if importlib.util.find_spec("pytest") is None or importlib.util.find_spec("hypothesis") is None:
        return ("graph tests on the GPU (pytest)", "not run",
                "pytest and hypothesis are not installed here", "0.0 s")
    tests = ["tests/runtime/test_device_events.py", "tests/graph/test_graph_vs_eager.py"]
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-m", "not cpu_only", *tests], cwd=ROOT, capture_output=True,
                          text=True, env=dict(env, PYFLOW_TEST_DEVICE="cuda"))
    last = (proc.stdout.strip().splitlines() or ["no output"])[-1]
    if proc.returncode:
        print(proc.stdout[-3000:], proc.stderr[-3000:])
    return ("graph tests on the GPU (pytest)", "ok" if proc.returncode == 0 else "FAILED", last,
            f"{time.perf_counter() - t0:.1f} s")


class Timer:
    """Median milliseconds of ``fn`` with CUDA events (host clock in the simulator)."""

    def __init__(self, sim):
        import pyflow
        self.cuda, self.sim = pyflow.cuda, sim

    def __call__(self, fn, repeat=20, warmup=3):
        if self.sim:            # the simulator's time means nothing: run just enough to check
            repeat, warmup = 1, 0
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(repeat):
            start, end = self.cuda.Event(True), self.cuda.Event(True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        times.sort()
        return times[len(times) // 2]


def measure(sim):
    import numpy as np
    from pyflow.kernels.cuda import _memory as mem
    from pyflow.kernels.registry import get
    timer = Timer(sim)
    rng = np.random.default_rng(0)
    n = 1 << 8 if sim else 1 << 28                   # elements for bandwidth tests
    rows, cols = (2, 32) if sim else (65536, 4096)   # row kernels
    g = 16 if sim else 4096                          # GEMM size

    def dev(a):
        return mem.to_device(np.ascontiguousarray(a))
    x, y = dev(rng.standard_normal(n, dtype=np.float32)), dev(rng.standard_normal(n, dtype=np.float32))
    table = []
    ms = timer(lambda: x.copy())
    ceiling = 2 * 4 * n / ms / 1e6                   # GB/s (read + write)
    table.append(("device copy (ceiling)", f"{ceiling:,.0f} GB/s", "1.00", ""))

    def bw(name, fn, nbytes, target=TARGETS["memory-bound"]):
        t = timer(fn)
        gbs = nbytes / t / 1e6
        table.append((name, f"{gbs:,.0f} GB/s", f"{gbs / ceiling:.2f}",
                      "" if sim else ("met" if gbs / ceiling >= target else "not met")))
        return t
    bw("elementwise add", lambda: get("add", "cuda")(x, y), 3 * 4 * n)
    m = dev(rng.standard_normal((n // cols, cols), dtype=np.float32))
    v = dev(rng.standard_normal(cols, dtype=np.float32))
    bw("broadcast add (rows + vector)", lambda: get("add", "cuda")(m, v), 2 * 4 * n)
    bw("sum reduction", lambda: get("sum", "cuda")(x, (0,), False, np.dtype(np.float32)), 4 * n)
    r = dev(rng.standard_normal((rows, cols), dtype=np.float32))
    w, b = dev(np.ones(cols, np.float32)), dev(np.zeros(cols, np.float32))
    t_soft = bw("softmax (rows)", lambda: get("softmax", "cuda")(r, 1), 2 * 4 * rows * cols)
    t_ln = bw("layer_norm (rows)", lambda: get("layer_norm", "cuda")(r, w, b, 1e-5),
              2 * 4 * rows * cols)

    a = dev(rng.standard_normal((g, g), dtype=np.float32))
    c = dev(rng.standard_normal((g, g), dtype=np.float32))
    flops = 2 * g ** 3
    t = timer(lambda: get("matmul", "cuda")(a, c), repeat=5)
    numba_tflops = flops / t / 1e9
    table.append((f"numba GEMM {g}^3 fp32", f"{numba_tflops:.1f} TFLOP/s", "", ""))
    launch = timer(lambda: get("add", "cuda")(x[:1], y[:1]), repeat=200) * 1e3
    table.append(("launch overhead (1-element add)", f"{launch:.1f} us", "", ""))

    if not sim:
        import torch
        ta, tc = torch.as_tensor(a, device="cuda"), torch.as_tensor(c, device="cuda")
        for label, tf32, dtype in (("cuBLAS fp32 (TF32 off)", False, torch.float32),
                                   ("cuBLAS TF32", True, torch.float32),
                                   ("cuBLAS BF16", False, torch.bfloat16)):
            torch.backends.cuda.matmul.allow_tf32 = tf32
            p, q = ta.to(dtype), tc.to(dtype)
            tt = timer(lambda: torch.matmul(p, q), repeat=5)
            ratio = numba_tflops / (flops / tt / 1e9)
            table.append((f"numba GEMM / {label}", f"{flops / tt / 1e9:.1f} TFLOP/s",
                          f"{ratio:.2f}", "met" if label.startswith("cuBLAS fp32") and
                          ratio >= TARGETS["sgemm vs cublas fp32"] else ""))
        tr = torch.as_tensor(r, device="cuda")
        tw, tb = torch.as_tensor(w, device="cuda"), torch.as_tensor(b, device="cuda")
        ts = timer(lambda: torch.softmax(tr, 1))
        tl = timer(lambda: torch.nn.functional.layer_norm(tr, (cols,), tw, tb))
        for label, ours, theirs in (("softmax vs torch", t_soft, ts), ("layer_norm vs torch", t_ln, tl)):
            table.append((label, f"{ours:.3f} vs {theirs:.3f} ms", f"{theirs / ours:.2f}x",
                          "met" if theirs / ours >= TARGETS["vs torch"] else "not met"))
    table += graph_step_rows(sim)
    return table


def graph_step_rows(sim, steps=30):
    """A compiled training step (an MLP block, MSE loss, one fused SGD update)
    with CUDA graphs off and on: wall time per step (synchronised), and that
    time per node of the step (every node launches at least one kernel, so it
    bounds the host time per kernel from above; issue 16's target: 2 us)."""
    import time as _time
    import numpy as np
    import pyflow
    import pyflow.nn as nn
    import pyflow.nn.functional as F
    from pyflow.device import backend_of
    d, rows = (8, 4) if sim else (256, 64)
    steps = 4 if sim else steps
    rng = np.random.default_rng(0)
    x = pyflow.tensor(rng.standard_normal((rows, d), dtype=np.float32), device="cuda")
    y = pyflow.tensor(rng.standard_normal((rows, d), dtype=np.float32), device="cuda")
    times, nodes = {}, 0
    for captured in (False, True):
        pyflow.manual_seed(0)
        net = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d), nn.LayerNorm(d),
                            nn.Linear(d, d)).to("cuda")

        class Step(nn.Graph):
            def __init__(self):
                super().__init__()
                self.net = net
                self.add_optimizer(pyflow.optim.SGD(net.parameters(), lr=1e-3))
                self.config.allow_fuse_model_update_ops(True)
                self.config.allow_cuda_graphs(captured)

            def build(self, a, b):
                loss = F.mse_loss(self.net(a), b)
                loss.backward()
                return loss
        step = Step()
        for _ in range(3):                      # warm-up, capture, first replay
            step(x, y)
        backend_of("cuda").synchronize()
        t0 = _time.perf_counter()
        for _ in range(steps):
            step(x, y)
        backend_of("cuda").synchronize()
        times[captured] = (_time.perf_counter() - t0) / steps * 1e3
        (plan,) = step._plans.values()
        nodes = len(plan.kernel_steps())
    per_node = times[True] * 1e3 / nodes
    return [("graph step, CUDA graphs off", f"{times[False]:.3f} ms", "", ""),
            ("graph step, CUDA graphs on", f"{times[True]:.3f} ms",
             f"{times[False] / times[True]:.2f}x", ""),
            (f"step time per node, replayed ({nodes} nodes)", f"{per_node:.2f} us", "",
             "" if sim else ("met" if per_node <= 2.0 else "not met"))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sim", action="store_true", help="run in numba's CUDA simulator, tiny sizes")
    ap.add_argument("--skip-checks", action="store_true", help="only the measurements")
    ap.add_argument("--skip-dlperf", action="store_true", help="no DLPerf model round")
    args = ap.parse_args()
    if args.sim and os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
        env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")   # must be set before numba loads
        sys.exit(subprocess.call([sys.executable] + sys.argv, env=env))
    sys.path.insert(0, ROOT)
    t0 = time.perf_counter()
    failed = False
    if not args.skip_checks:
        checks = run_kernel_checks(args.sim)
        failed = any(r[1] == "FAILED" for r in checks)
        print("| kernel checks | result | summary | time |\n|---|---|---|---|")
        for r in checks:
            print("| " + " | ".join(r) + " |")
    table = measure(args.sim)
    print(f"\n{'SIMULATOR: timings are meaningless' if args.sim else 'GPU'} "
          f"({time.perf_counter() - t0:.0f} s)")
    print("| measurement | value | fraction / ratio | target |\n|---|---|---|---|")
    for r in table:
        print("| " + " | ".join(r) + " |")
    if not (args.sim or args.skip_dlperf):
        failed = run_dlperf() or failed
    sys.exit(1 if failed else 0)


def run_dlperf():
    """One round of DLPerf's GPU configurations; True when it failed."""
    out = os.path.join(os.environ.get("OUT") or "/tmp", "dlperf_cuda.md")
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "dlperf.py"),
                           "--device", "cuda", "--rounds", "1", "--out", out])
    if proc.returncode == 0 and os.path.exists(out):
        print(open(out).read())
    return proc.returncode != 0


if __name__ == "__main__":
    main()
