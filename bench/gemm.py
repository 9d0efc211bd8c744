"""CPU matrix products: pyflow's matmul kernel on each BLAS setting against
PyTorch's ``torch.matmul``, on the shapes the training benchmarks spend their
time in.  Settings (``PYFLOW_BLAS``): ``mkl`` (MKL above the built-in size
thresholds, NumPy's BLAS below), ``numpy`` (NumPy's OpenBLAS only) and
``auto`` (the thresholds measured on this machine and cached:
kernels/cpu/blas_tuning.py; the table's footer says what it chose).

Cases: the GEMMs of one GPT-2-small layer and an 8192-word head (1024 tokens,
forward and both backward products, the layouts autograd passes: ``x @ W.T``,
``g @ W``, ``g.T @ x``), attention's stacked per-head products of GPT-mini
(16 x 4 heads of 128x64), and the im2col GEMMs of ResNet-50's 3x3
convolutions on 64x64 images, batch 8 (forward, weight and input gradient of
one per stage).  Each library runs in its own process (their thread pools
would slow each other in one), alternating over rounds; the table gives median
milliseconds per pass over a case's products and ratios to torch.

Run: python bench/gemm.py [--rounds 3]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODES = ("mkl", "numpy", "auto", "torch")


def cases(rng):
    """{name: [(a, b), ...]} as float32 NumPy arrays (transposed views included)."""
    import numpy as np

    def mat(r, c):
        return rng.standard_normal((r, c)).astype(np.float32)
    layer = []
    for d_in, d_out in ((768, 2304), (768, 768), (768, 3072), (3072, 768), (768, 8192)):
        x, w, g = mat(1024, d_in), mat(d_out, d_in), mat(1024, d_out)
        layer += [(x, w.T), (g, w), (g.T, x)]       # forward, input grad, weight grad
    q, k = (rng.standard_normal((16, 4, 128, 64)).astype(np.float32) for _ in range(2))
    p = rng.standard_normal((16, 4, 128, 128)).astype(np.float32)
    heads = [(q, np.swapaxes(k, -1, -2)), (p, k), (np.swapaxes(p, -1, -2), q), (p, k)]
    convs = []
    for c, hw in ((64, 16 * 16), (128, 8 * 8), (256, 4 * 4), (512, 2 * 2)):
        w, cols, g = mat(c, 9 * c), mat(9 * c, 8 * hw), mat(c, 8 * hw)
        convs += [(w, cols), (g, cols.T), (w.T, g)]     # forward, weight grad, input grad
    return {"GPT-2 layer + head (1024 tokens)": layer, "attention heads (GPT-mini)": heads,
            "ResNet-50 3x3 convs (64x64, batch 8)": convs}


def worker(mode, repeats):
    sys.path.insert(0, ROOT)
    import numpy as np
    if mode == "torch":
        import torch

        def prepare(x):     # the same strides: a transposed view stays one
            t = torch.from_numpy(np.ascontiguousarray(np.swapaxes(x, -1, -2)))
            return t.transpose(-1, -2) if x.strides[-1] != x.itemsize else torch.from_numpy(x)
        product = torch.matmul
    else:
        os.environ["PYFLOW_BLAS"] = mode
        import pyflow  # noqa: F401  (BLAS thread settings, then the kernel registry)
        from pyflow.kernels import registry
        from pyflow.kernels.cpu import blas
        if mode != "auto":
            assert blas.backend() == mode, f"PYFLOW_BLAS={mode} gave {blas.backend()}"
        prepare, product = (lambda x: x), registry.get("matmul", "cpu")
    from bench.common import median_time
    out = {}
    for name, pairs in cases(np.random.default_rng(0)).items():
        pairs = [(prepare(a), prepare(b)) for a, b in pairs]
        # The warm-up calls run auto's measurement, if nothing is cached yet.
        out[name] = median_time(lambda: [product(a, b) for a, b in pairs], repeats=repeats)
    if mode == "auto":
        report = blas.report()
        out["_choice"] = (f"auto chose {report['library']} (single products: MKL "
                          f"{report['mkl_min_flops']}; stacks: {report['mkl_min_stack_flops']}; "
                          f"source: {report['source']})")
    print(json.dumps(out))


def available(mode):
    if mode == "mkl":
        import importlib.metadata
        try:
            importlib.metadata.version("mkl")
        except importlib.metadata.PackageNotFoundError:
            return False
    return True


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--worker", choices=MODES, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args.worker, args.repeats)
    modes = [m for m in MODES if available(m)]
    runs = {m: [] for m in modes}
    for _ in range(args.rounds):
        for m in modes:
            proc = subprocess.run([sys.executable, __file__, "--worker", m,
                                   "--repeats", str(args.repeats)],
                                  capture_output=True, text=True, check=True)
            runs[m].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    from bench.common import table
    rows = []
    for name in (n for n in runs["torch"][0] if not n.startswith("_")):
        ms = {m: statistics.median(r[name] for r in runs[m]) * 1e3 for m in modes}
        rows.append([name] + [f"{ms[m]:.1f}" for m in modes]
                    + [f"{ms['torch'] / ms[m]:.2f}x" for m in modes if m != "torch"])
    print(table(rows, ["case"] + [f"{m} ms" for m in modes]
                + [f"{m} speed / torch" for m in modes if m != "torch"]))
    from bench.common import cpu_model
    print(f"CPU: {cpu_model()}")
    if "auto" in modes:
        print(f"PYFLOW_BLAS={runs['auto'][0]['_choice']}")
    if "mkl" not in modes:
        print("(MKL not installed: pip install pyflow[mkl])")


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    main()
