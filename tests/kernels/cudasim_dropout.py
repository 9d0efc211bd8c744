"""Dropout's device-drawn masks are the same on cpu and cuda: the CUDA kernels
(in numba's simulator) against the CPU kernels, and the op on both devices.

Run by ``test_cuda_dropout.py`` in its own process (``NUMBA_ENABLE_CUDASIM=1``
must be set before numba is imported)::

    NUMBA_ENABLE_CUDASIM=1 python tests/kernels/cudasim_dropout.py

Checks: Philox-4x32-10 known answers (Random123 ``tests/kat_vectors``) from the
device function; ``dropout_philox`` cuda == cpu, bit for bit, over dtypes,
layouts, seeds and offsets that use both 32-bit words, p = 0 / 0.3 / 1, odd
tails and an empty array, for any launch shape; ``pf.dropout`` on cuda and on
cpu under one ``manual_seed`` (same mask, gradient = mask * scale, bf16).
Tiny shapes.  Prints failures, then ``N checks, F failures``; exits 1 on any.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tests.kernels.check_target import select  # noqa: E402

TARGET = select()      # the simulator, or a real GPU for bench/gpu_check

import numpy as np  # noqa: E402
from numba import config  # noqa: E402

import pyflow as pf  # noqa: E402
from pyflow.kernels import registry  # noqa: E402
from pyflow.kernels.cuda import dropout as cudrop  # noqa: E402
from pyflow.kernels.cuda._memory import is_device_array, to_host  # noqa: E402

assert config.ENABLE_CUDASIM or TARGET == "gpu", "numba did not pick up NUMBA_ENABLE_CUDASIM=1"

KAT = [((0, 0, 0, 0), (0, 0), (0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8)),
       ((0xffffffff,) * 4, (0xffffffff,) * 2, (0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd)),
       ((0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344), (0xa4093822, 0x299f31d0),
        (0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1))]
rng = np.random.default_rng(0)
checks = 0
failures = []


def check(label, fn):
    """``fn`` returns (got, want) pairs that must be equal (same dtype, NaN == NaN)."""
    global checks
    checks += 1
    try:
        for got, want in fn():
            got, want = (to_host(a) if is_device_array(a) else np.asarray(a) for a in (got, want))
            if got.shape != want.shape or got.dtype != want.dtype:
                raise AssertionError(f"{got.shape} {got.dtype} != {want.shape} {want.dtype}")
            if not np.array_equal(got, want, equal_nan=got.dtype.kind == "f"):
                raise AssertionError(f"values differ:\n{got}\n{want}")
    except Exception as e:  # report every check, not just the first failure
        failures.append(f"{label}: {type(e).__name__}: {e}")


def layouts(shape, dtype):
    """(name, array): the same logical values contiguous, transposed, step-sliced."""
    v = rng.uniform(0.5, 2.0, shape).astype(dtype)
    yield "contiguous", v
    yield "transposed", np.ascontiguousarray(v.T).T
    big = np.zeros(shape[:-1] + (2 * shape[-1],), dtype)
    big[..., ::2] = v
    yield "sliced", big[..., ::2]


def kernel_checks():
    cpu, gpu = registry.get("dropout_philox", "cpu"), registry.get("dropout_philox", "cuda")
    for ctr, key, want in KAT:
        check(f"philox4x32-10 known answer {ctr[0]:#x}", lambda c=ctr, k=key, w=want: [
            (np.array(cudrop.philox4x32(c, k), np.uint64), np.array(w, np.uint64))])
    seeds = [(0, 0), (1234, 7), (2**64 - 1, 2**33 + 5), (0x1234_5678_9ABC, 2**64 - 1)]
    for dtype in (np.float32, np.float64, np.float16):
        for shape in [(1,), (7,), (3, 5)]:
            for name, x in layouts(shape, dtype):
                for seed, offset in seeds:
                    for p in (0.3,) if seed else (0.0, 0.3, 1.0):
                        def same(x=x, p=p, seed=seed, offset=offset):
                            out, keep = gpu(x, p, seed, offset)
                            want_out, want_keep = cpu(x, p, seed, offset)
                            return [(keep, want_keep), (out, want_out)]
                        check(f"dropout_philox cuda == cpu {np.dtype(dtype)} {shape} {name} "
                              f"seed={seed:#x} offset={offset:#x} p={p}", same)
    x = rng.uniform(-1, 1, (9, 13)).astype(np.float32)        # 117 = 29 groups of 4 + 1
    x[0, 0] = np.nan

    def any_launch():
        want = cpu(x, 0.5, 99, 3)
        return [pair for launch in [(1, 1), (1, 32), (4, 16)]
                for pair in zip(gpu(x, 0.5, 99, 3, launch=launch), want)]
    check("dropout_philox mask independent of the launch shape (NaN stays NaN)", any_launch)
    check("dropout_philox empty", lambda: [(gpu(np.zeros((0, 3), np.float32), 0.5, 1)[1],
                                            np.zeros((0, 3), bool))])

    def backward_kernel():       # the masked scaling the op applies to the gradient
        _, keep = gpu(x, 0.25, 5)
        g = rng.standard_normal(x.shape)
        return [(registry.get("dropout", "cuda")(g, keep, 1 / 0.75),
                 registry.get("dropout", "cpu")(g, cpu(x, 0.25, 5)[1], 1 / 0.75))]
    check("dropout(grad, device keep, scale) cuda == cpu", backward_kernel)


def op_checks():
    for dtype in (pf.float32, pf.float64, pf.bfloat16, pf.float16):
        def same_mask(dtype=dtype):
            pairs = []
            for p in (0.2, 0.5, 1.0):
                pf.manual_seed(42)
                host = pf.dropout(pf.ones(5, 7, dtype=dtype), p).float().numpy()
                pf.manual_seed(42)
                dev = pf.dropout(pf.ones(5, 7, dtype=dtype, device="cuda"), p)
                assert dev.device.type == "cuda" and dev.dtype is dtype, (dev.device, dev.dtype)
                pairs.append((dev.float().cpu().numpy(), host))
            return pairs
        check(f"pf.dropout same mask on cuda and cpu for one manual_seed, {dtype}", same_mask)

    def gradient():
        w = rng.standard_normal((4, 6))
        t = pf.tensor(w, device="cuda", requires_grad=True)
        out = pf.dropout(t, 0.3, generator=pf.Generator().manual_seed(8))
        g = rng.standard_normal((4, 6))
        (grad,) = pf.autograd.grad(out, t, pf.tensor(g, device="cuda"))
        keep = out.detach().cpu().numpy() != 0
        ref = pf.dropout(pf.tensor(w), 0.3, generator=pf.Generator().manual_seed(8)).numpy()
        return [(keep, ref != 0), (grad.cpu().numpy(), np.where(keep, g * (1 / (1 - 0.3)), 0.0))]
    check("pf.dropout on cuda: gradient = mask * scale, mask = cpu mask", gradient)

    def inplace():
        x = pf.ones(3, 5, device="cuda")
        pf.dropout(x, 0.5, inplace=True, generator=pf.Generator().manual_seed(1))
        ref = pf.dropout(pf.ones(3, 5), 0.5, generator=pf.Generator().manual_seed(1))
        return [(x.cpu().numpy(), ref.numpy())]
    check("pf.dropout inplace on cuda", inplace)


if __name__ == "__main__":
    kernel_checks()
    op_checks()
    for f in failures:
        print("FAIL", f)
    print(f"{checks} checks, {len(failures)} failures")
    sys.exit(1 if failures else 0)
