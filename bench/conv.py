"""Convolution kernels layer by layer: pyflow's im2col + GEMM path, pyflow's
direct kernels (kernels/cpu/conv_direct.py) and PyTorch (oneDNN), float32,
on the convolutions of the small-model benchmarks (bench/small_model_defs.py):
ResNet-18 with the CIFAR stem at batch 16 (32x32) and the MNIST example CNN
at batch 64 (28x28).

For each layer: forward, input gradient and weight gradient alone, and the
layer's share of a training step (forward + the backward a step runs: the
im2col path reuses the forward's kept im2col matrix, one fused call computes
both gradients; the first layer of each network needs no input gradient).
Modes: ``im2col`` is that path with the default BLAS (MKL where
installed), ``openblas`` the same with ``PYFLOW_BLAS=numpy``, ``direct`` the
direct kernels for every layer and every gradient, ``pyflow`` what the CPU
conv2d kernels do by default (``conv.direct_ok`` chooses per layer, and a
short reduction's input gradient keeps col2im), ``torch`` PyTorch.  The last
column says which path pyflow takes for the layer.  Each mode runs in its own
process, the modes alternating over rounds; medians in milliseconds (of
``--repeats`` timings, then over rounds), and a step total weighting each
layer by its count in the network.

    python bench/conv.py --threads 1 --rounds 3
    python bench/conv.py --net mnist --threads 2 --modes im2col openblas direct pyflow torch
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODES = ("im2col", "openblas", "direct", "pyflow", "torch")
PARTS = ("fwd", "dx", "dw", "step")


def layers(net):
    """[(name, count in the network, N, C, O, H, W, k, stride, pad, bias, needs dx)]."""
    out = []
    if net in ("resnet", "all"):
        out += [("rn stem 3-64 32", 1, 16, 3, 64, 32, 32, 3, 1, 1, False, False),
                ("rn l1 64-64 32", 4, 16, 64, 64, 32, 32, 3, 1, 1, False, True),
                ("rn l2 64-128 32/s2", 1, 16, 64, 128, 32, 32, 3, 2, 1, False, True),
                ("rn l2 128-128 16", 3, 16, 128, 128, 16, 16, 3, 1, 1, False, True),
                ("rn l2 ds 1x1 32/s2", 1, 16, 64, 128, 32, 32, 1, 2, 0, False, True),
                ("rn l3 128-256 16/s2", 1, 16, 128, 256, 16, 16, 3, 2, 1, False, True),
                ("rn l3 256-256 8", 3, 16, 256, 256, 8, 8, 3, 1, 1, False, True),
                ("rn l3 ds 1x1 16/s2", 1, 16, 128, 256, 16, 16, 1, 2, 0, False, True),
                ("rn l4 256-512 8/s2", 1, 16, 256, 512, 8, 8, 3, 2, 1, False, True),
                ("rn l4 512-512 4", 3, 16, 512, 512, 4, 4, 3, 1, 1, False, True),
                ("rn l4 ds 1x1 8/s2", 1, 16, 256, 512, 8, 8, 1, 2, 0, False, True)]
    if net in ("mnist", "all"):
        out += [("mnist conv1 1-32 28", 1, 64, 1, 32, 28, 28, 3, 1, 0, True, False),
                ("mnist conv2 32-64 26", 1, 64, 32, 64, 26, 26, 3, 1, 0, True, True)]
    return out


def _out(size, k, s, p):
    return (size + 2 * p - k) // s + 1


def worker(mode, net, repeats):
    sys.path.insert(0, ROOT)
    import numpy as np
    if mode == "torch":
        import torch
    else:
        if mode == "openblas":
            os.environ["PYFLOW_BLAS"] = "numpy"
        import pyflow  # noqa: F401  (thread settings first, then the kernels)
        from pyflow.kernels.cpu import conv, conv_direct
        from pyflow.ops.conv import KEEP_COLS_BYTES
    from bench.common import median_time
    rng = np.random.default_rng(0)
    res = {}
    for name, _, N, C, O, H, W, k, s, p, has_bias, needs_dx in layers(net):
        out_hw = (_out(H, k, s, p), _out(W, k, s, p))
        x = rng.standard_normal((N, C, H, W)).astype(np.float32)
        w = (rng.standard_normal((O, C, k, k)) * 0.1).astype(np.float32)
        b = rng.standard_normal(O).astype(np.float32) if has_bias else None
        gy = rng.standard_normal((N, O) + out_hw).astype(np.float32)
        geo = ((s, s), (p, p), (1, 1))
        if mode == "torch":
            tx, tw, tgy = (torch.from_numpy(a) for a in (x, w, gy))
            tb = None if b is None else torch.from_numpy(b)
            bw = torch.ops.aten.convolution_backward
            args = (tgy, tx, tw, [O] if has_bias else None, [s, s], [p, p], [1, 1], False,
                    [0, 0], 1)
            fns = {"fwd": lambda: torch.nn.functional.conv2d(tx, tw, tb, s, p),
                   "dx": lambda: bw(*args, [True, False, False]),
                   "dw": lambda: bw(*args, [False, True, False])}
            fns["step"] = lambda: (fns["fwd"](), bw(*args, [needs_dx, True, has_bias]))
            with torch.no_grad():
                res[name] = {part: median_time(fn, repeats=repeats) for part, fn in fns.items()}
            continue
        if mode in ("im2col", "openblas", "pyflow"):
            keep = C * k * k * N * out_hw[0] * out_hw[1] * 4 <= KEEP_COLS_BYTES
            conv.DIRECT = mode == "pyflow"
            cols = conv.conv2d(x, w, b, *geo[:2], (1, 1), 1, out_hw, keep)[1]

            def backward(cols, need_x, need_w, need_b):
                return conv.conv2d_backward(None if cols is not None else x, w, gy, cols,
                                            x.shape, w.shape, *geo, 1, need_x, need_w, need_b)
            fns = {"fwd": lambda: conv.conv2d(x, w, b, *geo[:2], (1, 1), 1, out_hw, keep),
                   "dx": lambda: backward(None, True, False, False),
                   "dw": lambda: backward(cols, False, True, False)}
            fns["step"] = lambda: backward(fns["fwd"]()[1], needs_dx, True, has_bias)
        else:
            fns = {"fwd": lambda: conv_direct.forward(x, w, b, *geo, out_hw),
                   "dx": lambda: conv_direct.input_grad(gy, w, x.shape, *geo),
                   "dw": lambda: conv_direct.weight_grad(x, gy, w.shape, *geo)}
            fns["step"] = lambda: (fns["fwd"](), needs_dx and fns["dx"](), fns["dw"](),
                                   has_bias and gy.sum((0, 2, 3)))
        res[name] = {part: median_time(fn, repeats=repeats) for part, fn in fns.items()}
        if mode in ("direct", "pyflow"):
            res[name]["chosen"] = "direct" if conv.direct_ok(
                x.shape, w.shape, geo[0], geo[1], (1, 1), 1, out_hw, x.dtype) else "im2col"
    print(json.dumps(res))


def thread_env(threads):
    env = dict(os.environ)
    if threads:
        env.update({k: str(threads) for k in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS",
                                              "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")})
    return env


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--net", choices=("resnet", "mnist", "all"), default="all")
    ap.add_argument("--threads", type=int, default=0, help="every pool's threads (0: default)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--modes", nargs="+", choices=MODES, default=["im2col", "pyflow", "torch"])
    ap.add_argument("--worker", choices=MODES, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args.worker, args.net, args.repeats)
    runs = {m: [] for m in args.modes}
    for r in range(args.rounds):
        order = args.modes[r % len(args.modes):] + args.modes[:r % len(args.modes)]
        for m in order:
            proc = subprocess.run([sys.executable, __file__, "--worker", m, "--net", args.net,
                                   "--repeats", str(args.repeats)], capture_output=True,
                                  text=True, env=thread_env(args.threads), cwd=ROOT)
            if proc.returncode:
                sys.exit(f"{m} worker failed:\n{proc.stderr[-3000:]}")
            runs[m].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    sys.path.insert(0, ROOT)
    from bench.common import cpu_model, table
    print(f"{cpu_model()}, threads: {args.threads or 'default'}, rounds: {args.rounds}, "
          f"float32, medians in ms")
    modes, rows = args.modes, []
    totals = {m: 0.0 for m in modes}
    for name, count, *_ in layers(args.net):
        ms = {m: {part: statistics.median(r[name][part] for r in runs[m]) * 1e3
                  for part in PARTS} for m in modes}
        for m in modes:
            totals[m] += count * ms[m]["step"]
        chosen = next((runs[m][0][name]["chosen"] for m in ("pyflow", "direct") if m in runs),
                      "")
        rows.append([name, count] + [" / ".join(f"{ms[m][part]:.2f}" for part in PARTS)
                                     for m in modes] + [chosen])
    rows.append(["step total (x count)", ""] + [f"{totals[m]:.1f}" for m in modes] + [""])
    print(table(rows, ["layer", "n"] + [f"{m}: fwd / dx / dw / step" for m in modes]
                + ["pyflow takes"]))


if __name__ == "__main__":
    main()
