"""Elementwise fusion: ``gelu(x * w + b) * 0.5 + x`` eager vs one fused node.

x is 4096x1024 float32, w and b are rows (1024,), all requiring grad.  Each
variant runs forward and backward (``y.backward(g)``); eager runs 5 kernels
forward and about a dozen backward, the fused node one forward kernel and
one gradient kernel per input (then the broadcast sums of w and b).
PyTorch eager on the same chain is printed for reference.  Median of repeats,
timed alternately (bench/common.py).

Run: python bench/fusion.py [--repeats 7] [--rows 4096] [--cols 1024]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pyflow as pf  # noqa: E402  (before NumPy: it sets OpenBLAS's thread timeout)

import numpy as np  # noqa: E402,I001
from bench.common import interleaved, machine  # noqa: E402
from pyflow.graph.passes.fusion import fuse_elementwise, fused_function  # noqa: E402
from pyflow.graph import trace  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--cols", type=int, default=1024)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(s).astype(np.float32)
          for s in ((args.rows, args.cols), (args.cols,), (args.cols,))]
    gy = rng.standard_normal((args.rows, args.cols)).astype(np.float32)
    x, w, b = (pf.tensor(a, requires_grad=True) for a in xs)
    g = pf.tensor(gy)

    def chain(x, w, b):
        return pf.gelu(x * w + b) * 0.5 + x

    # the fused op exactly as the pass makes it
    (node,) = fuse_elementwise(trace(lambda x, w, b: chain(x, w, b), [x, w, b])).nodes
    fused = node.target
    assert fused is fused_function(fused.program, fused.scalars)

    def eager_step():
        for t in (x, w, b):
            t.grad = None
        chain(x, w, b).backward(g)

    def fused_step():
        for t in (x, w, b):
            t.grad = None
        fused.apply(x, w, b, 0.5).backward(g)

    def eager_forward():
        with pf.no_grad():
            chain(x, w, b)

    def fused_forward():
        with pf.no_grad():
            fused.apply(x, w, b, 0.5)

    fused_step()                               # compile the kernels outside the timing
    grads = [t.grad.numpy().copy() for t in (x, w, b)]
    eager_step()
    for got, want in zip(grads, (x.grad.numpy(), w.grad.numpy(), b.grad.numpy())):
        np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-2)

    fns = [eager_forward, fused_forward, eager_step, fused_step]
    try:
        import torch
        tx, tw, tb = (torch.tensor(a, requires_grad=True) for a in xs)
        tg = torch.tensor(gy)

        def torch_step():
            for t in (tx, tw, tb):
                t.grad = None
            (torch.nn.functional.gelu(tx * tw + tb) * 0.5 + tx).backward(tg)
        fns.append(torch_step)
    except ImportError:
        torch = None
    times = interleaved(fns, repeats=args.repeats)
    print(machine())
    print(f"gelu(x * w + b) * 0.5 + x, x {args.rows}x{args.cols} float32, {fused.__name__}")
    print(f"forward only:       eager {times[0] * 1e3:7.2f} ms   fused {times[1] * 1e3:7.2f} ms"
          f"   speedup {times[0] / times[1]:.2f}x")
    print(f"forward + backward: eager {times[2] * 1e3:7.2f} ms   fused {times[3] * 1e3:7.2f} ms"
          f"   speedup {times[2] / times[3]:.2f}x")
    if torch is not None:
        print(f"PyTorch eager forward + backward: {times[4] * 1e3:7.2f} ms "
              f"(fused pyflow / torch: {times[3] / times[4]:.2f}x the time)")


if __name__ == "__main__":
    main()
