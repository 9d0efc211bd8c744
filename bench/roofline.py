"""Roofline report: how close a DLPerf CPU preset's training step comes to this
machine's limits, PyTorch and pyflow side by side.

The machine, measured here (each in its own process): its SGEMM peak, the best
float32 GEMM rate of NumPy's BLAS, MKL (through pyflow's ctypes binding) and
PyTorch on a 2048^3 product; and its copy bandwidth (bytes read + written by a
256 MB copy).  The step, counted once by PyTorch on the same model file: its
FLOPs (``torch.utils.flop_counter``, forward + backward) and its bytes (every
op's inputs and outputs, as if nothing stayed in cache: an upper bound of the
memory traffic).  The step time of each mode comes from ``bench/dlperf.py``'s
workers (the same presets and method), so achieved GFLOP/s = FLOPs / median
step time, shown against the SGEMM peak and against the roofline bound
min(peak, intensity x bandwidth).

Issue 17's target: a ResNet-50 step at least 60% of the SGEMM peak.

    python bench/roofline.py                          # the three CPU presets, 1 round
    python bench/roofline.py --models resnet --rounds 3 --results bench/RESULTS.md
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from bench import dlperf  # noqa: E402  (imports neither library)
from bench.common import machine_in_child, write_section  # noqa: E402

RESULT = "RESULT "
SECTION = "## Roofline"


# ------------------------------------------------------------------ children
def gemm_worker(library, n="2048", repeats=5):
    """Best GFLOP/s of an n^3 float32 product in ``library``."""
    import time
    n = int(n)
    if library == "torch":
        import torch
        a, b = torch.randn(n, n), torch.randn(n, n)

        def run():
            return a @ b
    else:
        os.environ["PYFLOW_BLAS"] = "mkl" if library == "mkl" else "numpy"
        import numpy as np
        from pyflow.kernels.cpu import blas
        rng = np.random.default_rng(0)
        a = rng.standard_normal((n, n), dtype=np.float32)
        b = rng.standard_normal((n, n), dtype=np.float32)
        if library == "mkl" and blas.backend() != "mkl":
            return {"error": "MKL is not installed"}

        def run():
            return blas.matmul(a, b)
    run()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - t)
    return {"gflops": 2 * n ** 3 / best / 1e9}


def copy_worker(n=1 << 26, repeats=5):
    """Best GB/s (read + write) of a copy of n float32."""
    import time
    import numpy as np
    src = np.ones(n, np.float32)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t)
    return {"gbs": 2 * src.nbytes / best / 1e9}


def count_worker(preset, model):
    """FLOPs and bytes of one training step of the preset, counted by PyTorch."""
    import numpy as np
    import torch
    from torch.utils.flop_counter import FlopCounterMode
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten
    torch.manual_seed(0)
    p = dlperf.PRESETS[preset][model]
    net, inputs, loss_of, _ = dlperf.build(torch, p, p.batch, "cpu", np.random.default_rng(0))

    class Bytes(TorchDispatchMode):
        total = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in tree_flatten((args, kwargs, out))[0]:
                if isinstance(t, torch.Tensor):
                    Bytes.total += t.numel() * t.element_size()
            return out
    with FlopCounterMode(display=False) as flops, Bytes():
        loss_of(net, *inputs).backward()
    return {"flops": flops.get_total_flops(), "bytes": Bytes.total}


WORKERS = {"gemm": gemm_worker, "copy": copy_worker, "count": count_worker}


def child(kind, *args):
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", kind, *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(dlperf.ENV_AT_START),
                          timeout=1800)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT)]
    if not lines:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"error": f"{kind} worker exited with status {proc.returncode}: {tail}"}
    return json.loads(lines[-1][len(RESULT):])


# ------------------------------------------------------------------ the report
def measure(args, log=print):
    peaks = {lib: child("gemm", lib, str(args.gemm_size)) for lib in ("numpy", "mkl", "torch")}
    for lib, r in peaks.items():
        log(f"  SGEMM 2048^3 {lib}: " + (f"{r['gflops']:.1f} GFLOP/s" if "gflops" in r
                                          else r["error"]))
    peak = max(r["gflops"] for r in peaks.values() if "gflops" in r)
    bandwidth = child("copy")["gbs"]
    log(f"  copy bandwidth: {bandwidth:.1f} GB/s")
    rows = []
    for model in args.models:
        p = dlperf.PRESETS[args.preset][model]
        counts = child("count", args.preset, model)
        step = {}
        for mode in dlperf.MODES:
            runs = [dlperf.measure(args, mode, model, p.batch, args.timeout)
                    for _ in range(args.rounds)]
            ok = [r for r in runs if "error" not in r]
            step[mode] = (statistics.median(statistics.median(r["step_s"]) for r in ok)
                          if ok else None)
            log(f"  {model} {mode}: " + (f"{step[mode] * 1e3:.0f} ms a step" if ok
                                         else runs[0]["error"]))
        rows.append((p, counts, step))
    return peak, peaks, bandwidth, rows


def markdown(args, machine, peak, peaks, bandwidth, rows):
    lines = [SECTION, "",
             f"{machine}. SGEMM peak {peak:.1f} GFLOP/s (best of " +
             ", ".join(f"{lib} {r['gflops']:.1f}" for lib, r in peaks.items() if "gflops" in r) +
             f", {args.gemm_size}^3 float32); copy bandwidth {bandwidth:.1f} GB/s (read + write). "
             "FLOPs and bytes of one training step counted by PyTorch on the same model file "
             "(bytes: every op's inputs and outputs, an upper bound); achieved GFLOP/s = FLOPs / "
             "median step time, as a fraction of the SGEMM peak and of the roofline bound "
             "min(peak, intensity x bandwidth).", "",
             "| preset | GFLOP / step | GB / step | FLOP/B | bound GFLOP/s | PyTorch eager | "
             "pyflow eager | pyflow graph |",
             "|---|---|---|---|---|---|---|---|"]
    for p, counts, step in rows:
        if "error" in counts:
            lines.append(f"| {p.label} | {counts['error']} | | | | | | |")
            continue
        gflop, gb = counts["flops"] / 1e9, counts["bytes"] / 1e9
        intensity = gflop / gb
        bound = min(peak, intensity * bandwidth)
        cells = []
        for mode in dlperf.MODES:
            s = step[mode]
            if s is None:
                cells.append("failed")
                continue
            rate = gflop / s
            cells.append(f"{rate:.1f} ({rate / peak:.0%} of peak, {rate / bound:.0%} of bound)")
        lines.append(f"| {p.label} ({p.shape}, batch {p.batch}) | {gflop:.2f} | {gb:.2f} | "
                     f"{intensity:.1f} | {bound:.1f} | " + " | ".join(cells) + " |")
    lines += ["", "Issue 17's target: a ResNet-50 step at least 60% of the SGEMM peak.", ""]
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", choices=dlperf.MODELS, default=list(dlperf.MODELS))
    ap.add_argument("--preset", default="cpu", choices=["cpu", "tiny"],
                    help="dlperf.py's presets (tiny: a smoke test of this script)")
    ap.add_argument("--rounds", type=int, default=1, help="step-time runs per mode (median)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=1800)
    ap.add_argument("--gemm-size", type=int, default=2048, help="n of the n^3 peak GEMM")
    ap.add_argument("--results", help="also write the section into this Markdown file "
                                      "(bench/RESULTS.md)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args, rest = ap.parse_known_args(argv)
    if args.worker:
        try:
            out = WORKERS[args.worker](*rest)
        except Exception as e:  # noqa: BLE001 (reported in the table, not hidden)
            out = {"error": f"{type(e).__name__}: {e}"[:300]}
        print(RESULT + json.dumps(out), flush=True)
        return
    # dlperf's workers read these
    args.device, args.batch, args.threads = "cpu", None, None
    peak, peaks, bandwidth, rows = measure(args)
    text = markdown(args, machine_in_child(), peak, peaks, bandwidth, rows)
    print(text)
    if args.results:
        write_section(args.results, SECTION, text)


if __name__ == "__main__":
    main()
