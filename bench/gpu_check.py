"""One command for a machine with a GPU: what the GPU says about pyflow's CUDA
path, in one table, within the few minutes a lent GPU lasts.

    bench/gpu_check                    # on a GPU machine; installs nothing
    bench/gpu_check --sim              # anywhere: the same code path in numba's simulator
    bench/gpu_check --skip kernel-checks --part-timeout dlperf=240

The run is a list of parts, each in its own process with its own time limit
(``PARTS``; the whole default run stays under ``BUDGET`` = 285 s, each part
getting at most what is left).  A part that fails, hangs or is killed prints
its row saying so, and the other parts still print theirs; the exit status is
non-zero when any part failed.  In order:

1. ``versions``: Python, NumPy, numba, numba-cuda, CuPy, cuda-core and PyTorch
   versions, the GPU and its compute capability, whether pyflow can use it.
2. ``memory-bound``: device-to-device copy bandwidth (the ceiling) and each
   memory-bound kernel's bandwidth as a fraction of it (elementwise, broadcast,
   reduction, softmax, layer_norm), softmax and layer_norm against PyTorch, and
   the launch overhead of a 1-element add.
3. ``gemm``: the numba GEMM at 4096^3 FP32, against cuBLAS FP32 (TF32 off), TF32
   and BF16 through PyTorch.
4. ``graph-step``: a compiled training step with CUDA graphs off and on, and the
   replayed step's time per node (an upper bound of the host time per kernel).
5. ``kernel-checks``: the per-family kernel check scripts
   (``tests/kernels/cudasim_*.py``) on the GPU (``PYFLOW_KERNEL_CHECKS=gpu``:
   device inputs, host results, the CPU kernels as reference), one process each,
   as many as the part's time allows.
6. ``graph-tests``: graph against eager and the runtime's CUDA events, the
   pytest files, with every tensor on the GPU.
7. ``dlperf``: one round of ``bench/dlperf.py --preset cuda-small`` (DLPerf's
   models cut to fit: docs/cuda.md), its table written to
   ``$OUT/dlperf_cuda.md`` when ``OUT`` is set (else /tmp).

Under ``--sim`` every number is host time of numba's simulator at tiny sizes:
it only proves the script runs end to end, and ``dlperf`` is skipped (hours
there).  tests/test_gpu_check.py runs it so.  How to read the table:
docs/cuda.md.
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGETS = {"memory-bound": 0.80, "sgemm vs cublas fp32": 0.50, "vs torch": 1.0,
           "host us per node": 2.0}
BUDGET = 285.0                        # seconds for the whole default run
ROW = "GPU_CHECK_ROW "                # how a part's process hands a row to the parent


def emit(*row):
    """A row of the table: (measurement, value, fraction / ratio, target)."""
    print(ROW + json.dumps([str(c) for c in row]), flush=True)


# ------------------------------------------------------------------ parts (child side)
def part_versions(sim):
    import importlib.metadata as md
    import platform
    for dist in ("numpy", "numba", "numba-cuda", "cupy-cuda12x", "cupy-cuda13x", "cupy",
                 "cuda-core", "cuda-bindings", "torch"):
        try:
            emit(f"version: {dist}", md.version(dist), "", "")
        except md.PackageNotFoundError:
            pass
    emit("version: Python", platform.python_version(), "", "")
    import pyflow.cuda
    reason = pyflow.cuda.unavailable_reason()
    emit("pyflow cuda device", "usable" if reason is None else f"not usable: {reason}", "", "")
    if sim:
        emit("GPU", "numba's CUDA simulator", "", "")
        return
    from numba import cuda
    device = cuda.get_current_device()
    name = device.name.decode() if isinstance(device.name, bytes) else device.name
    cc = device.compute_capability
    emit("GPU", f"{name}, compute capability {cc[0]}.{cc[1]}, "
                f"{device.MULTIPROCESSOR_COUNT} multiprocessors", "", "")


def part_kernel_checks(sim, seconds):
    """The kernel check scripts, one process each, until the part's time runs out."""
    env = dict(os.environ)
    if sim:
        env["NUMBA_ENABLE_CUDASIM"] = "1"
    else:
        env.pop("NUMBA_ENABLE_CUDASIM", None)
        env["PYFLOW_KERNEL_CHECKS"] = "gpu"
    deadline = time.perf_counter() + seconds - 5
    failed = False
    # On a GPU every kernel is compiled at its first launch (0.1-1 s each), so the part
    # may not get through all scripts: the GEMM/conv and row kernels first, the
    # elementwise script (hundreds of op/dtype/layout kernels) last.
    first = ("cudasim_linalg_conv.py", "cudasim_rows.py", "cudasim_reduce.py")
    scripts = sorted(glob.glob(os.path.join(ROOT, "tests", "kernels", "cudasim_*.py")),
                     key=lambda path: (os.path.basename(path) not in first,
                                       os.path.basename(path) == "cudasim_elementwise.py",
                                       os.path.basename(path)))
    for script in scripts:
        name = f"kernel checks: {os.path.basename(script)}"
        left = deadline - time.perf_counter()
        if left < 10:
            emit(name, "not run", "", "the part's time ran out")
            continue
        t0 = time.perf_counter()
        try:
            proc = subprocess.run([sys.executable, "-W", "ignore", script], env=env,
                                  capture_output=True, text=True, timeout=left)
        except subprocess.TimeoutExpired:
            emit(name, f"timed out after {left:.0f} s", "", "FAILED")
            failed = True
            continue
        last = (proc.stdout.strip().splitlines() or ["no output"])[-1]
        ok = proc.returncode == 0
        emit(name, last, f"{time.perf_counter() - t0:.1f} s", "ok" if ok else "FAILED")
        if not ok:
            failed = True
            sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
    return failed


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


def _device_maker():
    import numpy as np
    from pyflow.kernels.cuda import _memory as mem
    return lambda a: mem.to_device(np.ascontiguousarray(a))


def part_memory_bound(sim):
    import numpy as np
    from pyflow.kernels.registry import get
    timer, dev = Timer(sim), _device_maker()
    rng = np.random.default_rng(0)
    n = 1 << 8 if sim else 1 << 28                   # elements for bandwidth tests
    rows, cols = (2, 32) if sim else (65536, 4096)   # row kernels
    x, y = dev(rng.standard_normal(n, dtype=np.float32)), dev(rng.standard_normal(n, dtype=np.float32))
    ms = timer(lambda: x.copy())
    ceiling = 2 * 4 * n / ms / 1e6                   # GB/s (read + write)
    emit("device copy (ceiling)", f"{ceiling:,.0f} GB/s", "1.00", "")

    def bw(name, fn, nbytes, target=TARGETS["memory-bound"]):
        t = timer(fn)
        gbs = nbytes / t / 1e6
        emit(name, f"{gbs:,.0f} GB/s", f"{gbs / ceiling:.2f}",
             "" if sim else ("met" if gbs / ceiling >= target else "not met"))
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
    launch = timer(lambda: get("add", "cuda")(x[:1], y[:1]), repeat=200) * 1e3
    emit("launch overhead (1-element add)", f"{launch:.1f} us", "", "")
    if sim:
        return
    import torch
    tr = torch.as_tensor(r, device="cuda")
    tw, tb = torch.as_tensor(w, device="cuda"), torch.as_tensor(b, device="cuda")
    ts = timer(lambda: torch.softmax(tr, 1))
    tl = timer(lambda: torch.nn.functional.layer_norm(tr, (cols,), tw, tb))
    for label, ours, theirs in (("softmax vs torch", t_soft, ts), ("layer_norm vs torch", t_ln, tl)):
        emit(label, f"{ours:.3f} vs {theirs:.3f} ms", f"{theirs / ours:.2f}x",
             "met" if theirs / ours >= TARGETS["vs torch"] else "not met")


def part_gemm(sim):
    import numpy as np
    from pyflow.kernels.registry import get
    timer, dev = Timer(sim), _device_maker()
    rng = np.random.default_rng(0)
    g = 16 if sim else 4096
    a = dev(rng.standard_normal((g, g), dtype=np.float32))
    c = dev(rng.standard_normal((g, g), dtype=np.float32))
    flops = 2 * g ** 3
    t = timer(lambda: get("matmul", "cuda")(a, c), repeat=5)
    numba_tflops = flops / t / 1e9
    emit(f"numba GEMM {g}^3 fp32", f"{numba_tflops:.1f} TFLOP/s", "", "")
    if sim:
        return
    import torch
    ta, tc = torch.as_tensor(a, device="cuda"), torch.as_tensor(c, device="cuda")
    for label, tf32, dtype in (("cuBLAS fp32 (TF32 off)", False, torch.float32),
                               ("cuBLAS TF32", True, torch.float32),
                               ("cuBLAS BF16", False, torch.bfloat16)):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        p, q = ta.to(dtype), tc.to(dtype)
        tt = timer(lambda: torch.matmul(p, q), repeat=5)
        ratio = numba_tflops / (flops / tt / 1e9)
        target = ""
        if label.startswith("cuBLAS fp32"):
            target = "met" if ratio >= TARGETS["sgemm vs cublas fp32"] else "not met"
        emit(f"numba GEMM / {label}", f"{flops / tt / 1e9:.1f} TFLOP/s", f"{ratio:.2f}", target)


def part_graph_step(sim, steps=30):
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
    emit("graph step, CUDA graphs off", f"{times[False]:.3f} ms", "", "")
    emit("graph step, CUDA graphs on", f"{times[True]:.3f} ms",
         f"{times[False] / times[True]:.2f}x", "")
    emit(f"step time per node, replayed ({nodes} nodes)", f"{per_node:.2f} us", "",
         "" if sim else ("met" if per_node <= TARGETS["host us per node"] else "not met"))


def part_graph_tests(sim, seconds):
    """Graph mode on the real GPU: graph against eager, and the runtime's CUDA
    events between actor streams (pyflow/runtime/device.py), which only a GPU
    exercises for real (the simulator's kernels finish before their launch
    returns).  Under --sim, ``make test-cuda-sim`` runs these tests already."""
    import importlib.util
    name = "graph tests on the device (pytest)"
    if sim:
        emit(name, "skipped", "", "make test-cuda-sim runs them")
        return False
    if importlib.util.find_spec("pytest") is None or importlib.util.find_spec("hypothesis") is None:
        emit(name, "not run", "", "pytest and hypothesis are not installed here")
        return False
    tests = ["tests/runtime/test_device_events.py", "tests/graph/test_graph_vs_eager.py"]
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-m", "not cpu_only", *tests], cwd=ROOT, capture_output=True,
                          text=True, env=dict(os.environ, PYFLOW_TEST_DEVICE="cuda"),
                          timeout=max(5, seconds - 5))
    last = (proc.stdout.strip().splitlines() or ["no output"])[-1]
    emit(name, last, "", "ok" if proc.returncode == 0 else "FAILED")
    if proc.returncode:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
    return proc.returncode != 0


def part_dlperf(sim, seconds):
    """One round of the reduced DLPerf GPU preset; True when it failed."""
    if sim:
        emit("DLPerf (cuda-small)", "skipped", "", "hours in the simulator")
        return False
    out = os.path.join(os.environ.get("OUT") or "/tmp", "dlperf_cuda.md")
    # each of the 6 runs (3 models x PyTorch, pyflow eager, pyflow graph) gets a share
    per_run = max(20, int((seconds - 10) / 6))
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "dlperf.py"),
                           "--device", "cuda", "--preset", "cuda-small", "--rounds", "1",
                           "--steps", "10", "--warmup", "3", "--timeout", str(per_run),
                           "--out", out], capture_output=True, text=True,
                          timeout=max(5, seconds - 5))
    if proc.returncode == 0 and os.path.exists(out):
        emit("DLPerf (cuda-small)", f"table in {out}", "", "")
        print(open(out).read(), file=sys.stderr)
        return False
    emit("DLPerf (cuda-small)", f"exit status {proc.returncode}", "", "FAILED")
    sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
    return True


# name: (function, seconds allowed, whether it takes its seconds)
PARTS = {
    "versions": (part_versions, 60, False),
    "memory-bound": (part_memory_bound, 60, False),
    "gemm": (part_gemm, 45, False),
    "graph-step": (part_graph_step, 45, False),
    "kernel-checks": (part_kernel_checks, 90, True),
    "graph-tests": (part_graph_tests, 40, True),
    "dlperf": (part_dlperf, 150, True),
}


def run_part(name, sim, seconds):
    """The part in a child process: (rows, status), status "ok", "failed" or
    "timed out after N s"; rows printed as they come."""
    env = dict(os.environ)
    if sim:
        env["NUMBA_ENABLE_CUDASIM"] = "1"          # must be set before numba loads
    else:
        env.pop("NUMBA_ENABLE_CUDASIM", None)
    command = [sys.executable, os.path.abspath(__file__), "--part", name,
               "--seconds", str(seconds)] + (["--sim"] if sim else [])
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        out, err = proc.communicate(timeout=seconds)
        status = "ok" if proc.returncode == 0 else "failed"
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        status = f"timed out after {seconds:.0f} s"
    rows = [json.loads(line[len(ROW):]) for line in out.splitlines() if line.startswith(ROW)]
    rest = [line for line in out.splitlines() if not line.startswith(ROW)]
    if status != "ok":
        tail = (err.strip().splitlines() or ["no error output"])[-1]
        rows.append([f"part {name}", status, "", tail[:200]])
        sys.stderr.write("\n".join(rest[-40:]) + "\n" + err[-4000:])
    elif err.strip():
        sys.stderr.write(err[-6000:])
    return rows, status


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sim", action="store_true", help="run in numba's CUDA simulator, tiny sizes")
    ap.add_argument("--skip", nargs="*", default=[], choices=list(PARTS),
                    help="parts not to run")
    ap.add_argument("--part-timeout", nargs="*", default=[], metavar="PART=SECONDS",
                    help="a part's time limit instead of its default")
    ap.add_argument("--budget", type=float, default=BUDGET,
                    help="seconds for the whole run (each part gets at most what is left)")
    ap.add_argument("--part", choices=list(PARTS), help=argparse.SUPPRESS)
    ap.add_argument("--seconds", type=float, default=60.0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    sys.path.insert(0, ROOT)
    if args.part:                                   # the child: one part
        fn, _, takes_seconds = PARTS[args.part]
        failed = fn(args.sim, args.seconds) if takes_seconds else fn(args.sim)
        sys.exit(1 if failed else 0)

    limits = {name: seconds for name, (_, seconds, _) in PARTS.items()}
    for item in args.part_timeout:
        name, _, value = item.partition("=")
        if name not in PARTS or not value:
            ap.error(f"--part-timeout takes PART=SECONDS with PART one of {', '.join(PARTS)}, "
                     f"got {item!r}")
        limits[name] = float(value)
    t0 = time.perf_counter()
    failed = False
    print(f"bench/gpu_check: {'SIMULATOR (timings are meaningless)' if args.sim else 'GPU'}, "
          f"budget {args.budget:.0f} s\n", flush=True)
    # rows are printed as each part ends, so a run cut short still shows what it measured
    print("| measurement | value | fraction / ratio | target |\n|---|---|---|---|", flush=True)
    for name in PARTS:
        if name in args.skip:
            continue
        left = args.budget - (time.perf_counter() - t0)
        seconds = min(limits[name], left)
        if seconds < 1:
            rows, status = [[f"part {name}", "not run", "", "the run's time budget ran out"]], "-"
        else:
            started = time.perf_counter()
            rows, status = run_part(name, args.sim, seconds)
            print(f"  ({name}: {status} in {time.perf_counter() - started:.0f} s)",
                  file=sys.stderr, flush=True)
        failed = failed or status != "ok"
        for row in rows:
            print("| " + " | ".join(row) + " |", flush=True)
    print(f"\n{time.perf_counter() - t0:.0f} s in all")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
