"""Checks every CUDA row kernel (softmax, normalization, loss) in numba's CUDA simulator.

Run by ``test_cuda_rows.py`` in its own process, because
``NUMBA_ENABLE_CUDASIM=1`` must be set before numba is first imported::

    NUMBA_ENABLE_CUDASIM=1 python tests/kernels/cudasim_rows.py

Each registered CUDA kernel is called on tiny inputs (rows of <= 40
elements, so blocks of 32 or 64 threads: one warp, and two warps for the
cross-warp step of the block reductions) and compared with the CPU kernel of
the same name on the same inputs upcast to float64, for float32 and float64:
contiguous and non-contiguous inputs, every path of softmax over a non-last
dim, optional weight/bias, ignore_index, label smoothing, broadcasting in
bce_with_logits, -inf/NaN rows, large-mean data, empty inputs, and bad input.
Prints one line per failure and ``N checks, F failures``; exits 1 on failure.

The simulator runs one Python thread per CUDA thread and the manager polls
them; a short GIL switch interval makes its barriers ~5x faster.
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tests.kernels.check_target import select  # noqa: E402

TARGET = select()      # the simulator, or a real GPU for bench/gpu_check
sys.setswitchinterval(1e-4)

import numpy as np  # noqa: E402
from numba import config  # noqa: E402

import pyflow.kernels.cpu.loss  # noqa: E402,F401  (registers the CPU references)
import pyflow.kernels.cpu.normalization  # noqa: E402,F401
import pyflow.kernels.cpu.softmax  # noqa: E402,F401
import pyflow.kernels.cuda.loss  # noqa: E402,F401
import pyflow.kernels.cuda.normalization as cuda_norm  # noqa: E402
import pyflow.kernels.cuda.softmax as cuda_softmax  # noqa: E402
from pyflow.kernels import registry  # noqa: E402
from pyflow.kernels.cuda._memory import to_host  # noqa: E402

assert config.ENABLE_CUDASIM or TARGET == "gpu", "numba did not pick up NUMBA_ENABLE_CUDASIM=1"

DTYPES = (np.float32, np.float64)
TOL = {np.float32: (3e-5, 3e-6), np.float64: (1e-12, 1e-13)}
rng = np.random.default_rng(0)
failures = []
count = 0


def rand(shape, dtype, scale=2.0, shift=0.0):
    return (rng.uniform(-scale, scale, shape) + shift).astype(dtype)


def transposed(a):
    """A non-contiguous view holding the values of ``a`` (2-D or more)."""
    return np.swapaxes(np.ascontiguousarray(np.swapaxes(a, -1, -2)), -1, -2)


def upcast(v):
    if isinstance(v, np.ndarray) and v.dtype.kind == "f":
        return v.astype(np.float64)
    return v


def check(name, label, args, dtype, tol=None, cpu_args=None):
    """Compare registry.get(name, 'cuda')(*args) with the CPU kernel on float64 inputs."""
    global count
    count += 1
    label = f"{name} {np.dtype(dtype).name} {label}"
    try:
        got = registry.get(name, "cuda")(*args)
        got = (tuple(None if g is None else to_host(g) for g in got) if isinstance(got, tuple)
               else to_host(got))
    except Exception as e:  # report every kernel, not only the first failure
        failures.append(f"{label}: raised {type(e).__name__}: {e}")
        return None
    want = registry.get(name, "cpu")(*[upcast(a) for a in (cpu_args or args)])
    got_t = got if isinstance(got, tuple) else (got,)
    want_t = want if isinstance(want, tuple) else (want,)
    rtol, atol = tol or TOL[dtype]
    for k, (g, w) in enumerate(zip(got_t, want_t)):
        g = np.asarray(g)
        if g.shape != w.shape or g.dtype != np.dtype(dtype):
            failures.append(f"{label} output {k}: got {g.shape} {g.dtype}, want {w.shape} "
                            f"{np.dtype(dtype)}")
        elif not np.allclose(g.astype(np.float64), w, rtol=rtol, atol=atol, equal_nan=True):
            err = np.nanmax(np.abs(g - w)) if g.size else 0
            failures.append(f"{label} output {k}: max error {err}\n  got  {g.tolist()}\n"
                            f"  want {w.tolist()}")
    return got


def expect_error(label, call, exc, text):
    global count
    count += 1
    try:
        call()
    except exc as e:
        if text not in str(e):
            failures.append(f"{label}: message {str(e)!r} lacks {text!r}")
    except Exception as e:
        failures.append(f"{label}: raised {type(e).__name__}: {e}, want {exc.__name__}")
    else:
        failures.append(f"{label}: expected {exc.__name__} containing {text!r}")


# ------------------------------------------------------------------ softmax
def check_softmax(dtype):
    for name in ("softmax", "log_softmax"):
        check(name, "rows (3, 40)", [rand((3, 40), dtype), 1], dtype)
        check(name, "transposed input, last dim", [transposed(rand((2, 5, 3), dtype)), 2], dtype)
        special = rand((3, 6), dtype)
        special[0, [1, 4]] = -np.inf          # masked logits
        special[1, :] = -np.inf               # a fully masked row: NaN, as on the CPU
        special[2, 3] = np.nan
        check(name, "-inf and NaN", [special, 1], dtype)
        for shape, scale in (((2, 5, 40), 0.3), ((7, 3), -0.7)):   # attention's fused form
            check(name, f"scale {scale}, causal {shape}", [rand(shape, dtype), len(shape) - 1,
                                                           scale, True], dtype)
        check(name, "scale 2, no mask", [rand((3, 9), dtype), 1, 2.0, False], dtype)
        expect_error(f"{name} causal over dim 0", lambda: registry.get(name, "cuda")(
            rand((4, 3), dtype), 0, 1.0, True), ValueError, "causal mask needs (..., L, S)")
        check(name, "dim 1 of (2, 4, 3), transpose path", [rand((2, 4, 3), dtype), 1], dtype)
        check(name, "dim 0 of (5, 3), transpose path", [rand((5, 3), dtype), 0], dtype)
        cuda_softmax.COLUMN_KERNEL_MIN_COLUMNS = 1
        check(name, "dim 1 of (2, 4, 3), column kernel", [rand((2, 4, 3), dtype), 1], dtype)
        cuda_softmax.COLUMN_KERNEL_MIN_COLUMNS = 2048
    for name, fwd in (("softmax_backward", "softmax"), ("log_softmax_backward", "log_softmax")):
        for shape, dim, label in (((3, 40), 1, "rows"), ((2, 4, 3), 1, "transpose path"),
                                  ((2, 4, 3), 1, "column kernel")):
            x = rand(shape, dtype)
            y = registry.get(fwd, "cpu")(x, dim)
            g = rand(shape, dtype)
            if label == "column kernel":
                cuda_softmax.COLUMN_KERNEL_MIN_COLUMNS = 1
            check(name, label, [g, y, dim], dtype)
            cuda_softmax.COLUMN_KERNEL_MIN_COLUMNS = 2048
        x = rand((2, 5), dtype)
        check(name, "transposed g", [transposed(rand((3, 2, 5), dtype))[0],
                                     registry.get(fwd, "cpu")(x, 1), 1], dtype)
        for shape, scale in (((2, 5, 40), 0.3), ((7, 3), -0.7)):
            extra = (scale, name == "softmax_backward")      # causal softmax, scaled both
            y = registry.get(fwd, "cpu")(rand(shape, dtype), len(shape) - 1, *extra)
            check(name, f"scale {scale}, causal {extra[1]} {shape}",
                  [rand(shape, dtype), y, len(shape) - 1, *extra], dtype)


# ------------------------------------------------------------------ normalization
def check_normalization(dtype):
    x = rand((3, 40), dtype)
    w, b = rand(40, dtype), rand(40, dtype)
    check("layer_norm", "weight and bias", [x, w, b, 1e-5], dtype)
    check("layer_norm", "no weight, transposed x", [transposed(rand((2, 7), dtype)), None, None,
                                                      1e-3], dtype)
    # Welford: a large mean must not cost precision (float32: relative to the spread)
    tol = (1e-4, 2e-4) if dtype == np.float32 else (1e-11, 1e-11)
    check("layer_norm", "mean 1000", [rand((2, 37), dtype, 1.0, 1000.0), None, b[:37], 1e-5],
          dtype, tol)

    cpu_out = registry.get("layer_norm", "cpu")(x.astype(np.float64), w.astype(np.float64),
                                                b.astype(np.float64), 1e-5)
    mean, rstd = cpu_out[1].astype(dtype), cpu_out[2].astype(dtype)
    g = rand((3, 40), dtype)
    check("layer_norm_backward", "weight", [g, x, mean, rstd, w], dtype)
    cuda_norm.ROWS_PER_CHUNK = 2       # several row chunks for dweight/dbias
    x7 = rand((7, 5), dtype)
    _, m7, r7 = registry.get("layer_norm", "cpu")(x7, None, None, 1e-5)
    check("layer_norm_backward", "no weight, 3 row chunks", [transposed(rand((7, 5), dtype)),
                                                             x7, m7, r7, None], dtype)
    cuda_norm.ROWS_PER_CHUNK = 64

    xb = rand((3, 2, 5), dtype, 1.0, 3.0)
    check("batch_norm_stats", "(3, 2, 5)", [xb], dtype)
    check("batch_norm_stats", "(6, 3, 1) transposed", [transposed(rand((3, 6), dtype))[..., None]],
          dtype)
    mean_b, var_b = registry.get("batch_norm_stats", "cpu")(xb)
    rstd_b = (1.0 / np.sqrt(var_b + 1e-5)).astype(dtype)
    wc, bc = rand(2, dtype), rand(2, dtype)
    check("batch_norm_apply", "weight and bias", [xb, mean_b, rstd_b, wc, bc], dtype)
    check("batch_norm_apply", "no weight", [xb, mean_b, rstd_b, None, None], dtype)
    gb = rand((3, 2, 5), dtype)
    for training in (True, False):
        check("batch_norm_backward", f"training={training}",
              [gb, xb, mean_b, rstd_b, wc, training], dtype)
    check("batch_norm_backward", "no weight", [gb, xb, mean_b, rstd_b, None, True], dtype)


# ------------------------------------------------------------------ losses
def check_losses(dtype):
    x = rand((4, 7), dtype)
    t = np.array([2, -100, 0, 6], np.int64)
    wc = rand(7, dtype, 1.0, 1.5)
    for w in (None, wc):
        for smoothing in (0.0, 0.2):
            label = f"w={'yes' if w is not None else 'no'} smoothing={smoothing}"
            got = check("cross_entropy", label, [x, t, w, -100, smoothing], dtype)
            lse = got[1] if got else registry.get("cross_entropy", "cpu")(x, t, w, -100,
                                                                         smoothing)[1]
            check("cross_entropy_backward", label,
                  [rand(4, dtype), x, t, w, -100, smoothing, lse], dtype)
    x40 = rand((2, 40), dtype)
    t40 = np.array([39, 3], np.int32)                 # int32 targets are cast
    check("cross_entropy", "(2, 40) int32 targets", [transposed(rand((2, 40), dtype)), t40, None,
                                                      -100, 0.1], dtype)
    _, lse40 = registry.get("cross_entropy", "cpu")(x40, t40, None, -100, 0.0)
    check("cross_entropy_backward", "(2, 40)", [rand(2, dtype), x40, t40, None, -100, 0.0,
                                                lse40.astype(dtype)], dtype)

    logp = transposed(rand((4, 7), dtype))
    for w in (None, wc):
        label = f"transposed x, w={'yes' if w is not None else 'no'}"
        check("nll_loss", label, [logp, t, w, -100], dtype)
        check("nll_loss_backward", label, [rand(4, dtype), t, w, -100, 7], dtype)
    check("nll_loss", "reversed rows", [rand((4, 7), dtype)[::-1], np.array([2, 1, 0, 6]), None, 2],
          dtype)

    for xs, ys, pws, label in (((3, 4), (3, 4), None, "same shape"),
                               ((3, 4), (3, 4), (4,), "pos_weight (4,)"),
                               ((2, 3, 1), (1, 4), (4,), "broadcast x, y, pos_weight"),
                               ((), (), None, "0-d")):
        xv, yv = np.asarray(rand(xs, dtype, 3.0)), np.asarray(rng.uniform(0, 1, ys), dtype)
        pw = None if pws is None else rand(pws, dtype, 1.0, 2.0)
        check("bce_with_logits", label, [xv, yv, pw], dtype)
    check("bce_with_logits", "transposed x, large |x|",
          [transposed(rand((3, 4), dtype, 60.0)), rng.uniform(0, 1, (3, 4)).astype(dtype), None],
          dtype)


# ------------------------------------------------------------------ edges and errors
def check_edges():
    f32 = np.float32
    check("softmax", "empty", [np.ones((0, 3), f32), 1], f32)
    check("layer_norm", "no rows", [np.ones((0, 4), f32), None, None, 1e-5], f32)
    check("cross_entropy", "no rows", [np.ones((0, 3), f32), np.zeros(0, np.int64), None,
                                       -100, 0.0], f32)
    check("bce_with_logits", "empty", [np.ones((0, 3), f32), np.ones((0, 3), f32), None], f32)
    x = np.ones((2, 3), f32)
    cuda = lambda name: registry.get(name, "cuda")  # noqa: E731
    expect_error("softmax int", lambda: cuda("softmax")(np.ones((2, 3), np.int64), 1),
                 TypeError, "float32 or float64 x, got int64")
    expect_error("softmax dim", lambda: cuda("softmax")(x, 2), ValueError, "dim must be in [0, 2)")
    expect_error("softmax_backward y", lambda: cuda("softmax_backward")(x, x[:1], 1),
                 ValueError, "y must match g")
    expect_error("layer_norm 3-D", lambda: cuda("layer_norm")(x[None], None, None, 1e-5),
                 ValueError, "x must be 2-D")
    expect_error("layer_norm weight", lambda: cuda("layer_norm")(x, np.ones(4, f32), None, 1e-5),
                 ValueError, "weight must have 3 elements")
    expect_error("batch_norm_apply mean", lambda: cuda("batch_norm_apply")(
        x[:, :, None], np.ones(2, f32), np.ones(3, f32), None, None), ValueError,
        "mean must have shape (3,)")
    expect_error("cross_entropy target", lambda: cuda("cross_entropy")(
        x, np.zeros(3, np.int64), None, -100, 0.0), ValueError, "target must have shape (2,)")
    expect_error("cross_entropy float target", lambda: cuda("cross_entropy")(
        x, np.zeros(2, f32), None, -100, 0.0), TypeError, "integer class indices")
    expect_error("nll_loss weight", lambda: cuda("nll_loss")(
        x, np.zeros(2, np.int64), np.ones(2, f32), -100), ValueError, "weight must have shape (3,)")
    # a target the op failed to validate reads nothing outside the row: NaN
    loss = cuda("nll_loss")(x, np.array([0, 5]), None, -100)
    global count
    count += 1
    if not (loss[0] == -1.0 and np.isnan(loss[1])):
        failures.append(f"nll_loss out-of-range target: got {loss}")


def main():
    start = time.perf_counter()
    for dtype in DTYPES:
        check_softmax(dtype)
        check_normalization(dtype)
        check_losses(dtype)
    check_edges()
    for f in failures:
        print("FAIL", f)
    print(f"{count} checks, {len(failures)} failures, {time.perf_counter() - start:.1f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
