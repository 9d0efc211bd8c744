"""Checks the CUDA GEMM, convolution and pooling kernels in numba's simulator.

Run by ``test_cuda_linalg_conv.py`` in its own process, because
``NUMBA_ENABLE_CUDASIM=1`` must be set before numba is first imported::

    NUMBA_ENABLE_CUDASIM=1 python tests/kernels/cudasim_linalg_conv.py

Every registered kernel (matmul, linear, conv2d, conv2d_backward, max_pool2d,
pool_scatter, pool_gather, avg_pool2d, avg_pool2d_backward) is compared with
the CPU kernel of the same name on tiny shapes: transposed, sliced, reversed
and expanded (stride 0) operands, broadcast batches, edge tiles, several tile
configurations, groups/stride/dilation/asymmetric padding, overlapping pooling
windows, NaN.  Prints one line per failure and ``N checks, F failures``.
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tests.kernels.check_target import select  # noqa: E402

TARGET = select()      # the simulator, or a real GPU for bench/gpu_check

import numpy as np  # noqa: E402
from numba import config  # noqa: E402

import pyflow.kernels.cpu.conv  # noqa: E402,F401  (registers the CPU references)
import pyflow.kernels.cpu.linalg  # noqa: E402,F401
import pyflow.kernels.cpu.pool  # noqa: E402,F401
import pyflow.kernels.cuda.conv  # noqa: E402,F401
import pyflow.kernels.cuda.linalg as cl  # noqa: E402
import pyflow.kernels.cuda.pool  # noqa: E402,F401
from pyflow import backends  # noqa: E402
from pyflow.kernels import registry  # noqa: E402
from pyflow.ops.conv import _avg_windows  # noqa: E402

assert config.ENABLE_CUDASIM or TARGET == "gpu", "numba did not pick up NUMBA_ENABLE_CUDASIM=1"

TOL = {np.dtype(np.float16): 2e-3, np.dtype(np.float32): 2e-5, np.dtype(np.float64): 1e-12}
rng = np.random.default_rng(0)
checks = []
failures = []


def cpu(name):
    return registry.get(name, "cpu")


def gpu(name):
    return registry.get(name, "cuda")


def data(shape, dtype=np.float64):
    dtype = np.dtype(dtype)
    if dtype.kind in "iu":
        return rng.integers(-4, 5, shape).astype(dtype)
    return rng.uniform(-1, 1, shape).astype(dtype)


def compare(label, got, want, exact=False):
    checks.append(label)
    got = [got] if not isinstance(got, tuple) else got
    want = [want] if not isinstance(want, tuple) else want
    for g, w in zip(got, want):
        if (g is None) != (w is None):
            failures.append(f"{label}: got {g is None and 'None'}, want {w is None and 'None'}")
            return
        if g is None:
            continue
        g, w = np.asarray(g), np.asarray(w)
        if g.shape != w.shape or g.dtype != w.dtype:
            failures.append(f"{label}: got {g.shape} {g.dtype}, want {w.shape} {w.dtype}")
            return
        if exact or g.dtype.kind in "iu":
            ok = np.array_equal(g, w, equal_nan=g.dtype.kind == "f")
        else:
            tol = TOL[g.dtype]
            ok = np.allclose(g.astype(np.float64), w.astype(np.float64), rtol=tol, atol=tol,
                             equal_nan=True)
        if not ok:
            failures.append(f"{label}:\n  got  {g.ravel()[:12].tolist()}\n"
                            f"  want {w.ravel()[:12].tolist()}")
            return


def guarded(label, fn):
    try:
        fn()
    except Exception as e:          # report every case, not just the first failure
        failures.append(f"{label}: raised {type(e).__name__}: {e}")


def expect_error(label, call, exc, text):
    checks.append(label)
    try:
        call()
    except exc as e:
        if text not in str(e):
            failures.append(f"{label}: message {str(e)!r} lacks {text!r}")
    except Exception as e:
        failures.append(f"{label}: raised {type(e).__name__}: {e}, want {exc.__name__}")
    else:
        failures.append(f"{label}: no {exc.__name__} raised")


# ------------------------------------------------------------------ GEMM
def check_gemm():
    def case(label, a, b):
        guarded(label, lambda: compare(f"matmul {label}", gpu("matmul")(a, b),
                                       cpu("matmul")(a, b)))

    for dtype in (np.float32, np.float64, np.float16, np.int32, np.int64):
        case(f"5x7@7x3 {np.dtype(dtype)}", data((5, 7), dtype), data((7, 3), dtype))
    a, b = data((17, 9)), data((9, 19))               # several blocks and K steps
    case("17x9@9x19 (several blocks)", a, b)
    case("transposed a", data((9, 17)).T, b)
    case("transposed b", a, data((19, 9)).T)
    case("both transposed", data((9, 17)).T, data((19, 9)).T)
    case("sliced and reversed", data((17, 20))[::-1, 1::2][:, :9], data((9, 40))[:, ::-2])
    case("expanded (stride 0) a", np.broadcast_to(data((1, 9)), (17, 9)), b)
    case("batched broadcast", data((2, 1, 3, 4)), data((3, 4, 5)))
    case("expanded batch", np.broadcast_to(data((1, 3, 4)), (4, 3, 4)), data((4, 4, 2)))
    case("transposed batch", data((3, 5, 2)).transpose(0, 2, 1), data((3, 5, 4)))
    case("batch strides that don't merge", data((2, 3, 4, 5)).transpose(1, 0, 2, 3),
         data((3, 2, 5, 2)))
    case("4 batch dims", data((2, 1, 2, 1, 3, 2)), data((2, 1, 2, 2, 3))[:, :, None])
    case("dot 1-D", data(7), data(7))
    case("1-D @ 2-D", data(7), data((7, 3)))
    case("2-D @ 1-D", data((5, 7)), data(7))
    case("1-D @ batch", data(4), data((2, 4, 3)))
    case("K = 0", data((3, 0)), data((0, 2)))
    case("M = 0", data((0, 4)), data((4, 2)))

    # other tile shapes through the module's gemm (the registered kernels pick SIM_TILE)
    for tile in (cl.Tile(8, 16, 4, 2, 4), cl.Tile(16, 8, 8, 4, 2), cl.Tile(4, 4, 2, 1, 1)):
        for label, a, b in (("11x13@13x6", data((11, 13), np.float32), data((13, 6), np.float32)),
                            ("transposed", data((13, 11)).T, data((6, 13)).T),
                            ("batched", data((2, 5, 3)), data((1, 3, 9)))):
            guarded(f"tile {tuple(tile)} {label}", lambda: compare(
                f"gemm tile {tuple(tile)} {label}", cl.gemm(a, b, tile=tile), a @ b))

    # too many column tiles for grid y: the launch computes C^T = B^T A^T instead
    saved = cl.MAX_GRID_Y
    cl.MAX_GRID_Y = 1
    try:
        x, w, bias = data((6, 5)), data((40, 5)), data(40)
        guarded("C^T launch", lambda: compare("linear computed as C^T (grid y limit)",
                                              gpu("linear")(x, w, bias), x @ w.T + bias))
        a, b = data((2, 3, 5)).transpose(0, 2, 1), data((1, 3, 37))
        guarded("C^T batched", lambda: compare("batched matmul computed as C^T",
                                               gpu("matmul")(a, b), a @ b))
    finally:
        cl.MAX_GRID_Y = saved

    def linear(label, x, w, bias):
        guarded(label, lambda: compare(f"linear {label}", gpu("linear")(x, w, bias),
                                       cpu("linear")(x, w, bias)))

    for dtype in (np.float32, np.float64):
        linear(f"bias {np.dtype(dtype)}", data((5, 7), dtype), data((3, 7), dtype),
               data(3, dtype))
    linear("no bias", data((5, 7)), data((3, 7)), None)
    linear("edge tiles", data((9, 10)), data((11, 10)), data(11))
    linear("transposed x, expanded bias", data((7, 5)).T, data((3, 7)),
           np.broadcast_to(data(1), (3,)))
    linear("transposed weight", data((5, 7)), data((7, 3)).T, data(3))


def check_gemm_errors():
    a = np.ones((2, 3), np.float32)
    expect_error("dtype mismatch", lambda: gpu("matmul")(a, np.ones((3, 2))), TypeError,
                 "share one dtype")
    expect_error("bool dtype", lambda: gpu("matmul")(a > 0, a.T > 0), TypeError,
                 "no CUDA GEMM for dtype bool")
    expect_error("K mismatch", lambda: gpu("matmul")(a, a), ValueError, "cannot be multiplied")
    expect_error("0-d", lambda: gpu("matmul")(np.float32(1) * np.ones((), np.float32), a),
                 ValueError, "at least 1-D")
    expect_error("linear weight", lambda: gpu("linear")(a, np.ones((4, 2), np.float32), None),
                 ValueError, "weight (N, K)")
    expect_error("bad tile", lambda: cl.gemm(a, a.T, tile=cl.Tile(8, 8, 4, 3, 2)), ValueError,
                 "multiple of TM")
    expect_error("backend value", lambda: setattr(backends.cuda, "matmul", "cudnn"),
                 ValueError, "must be one of ['numba', 'cublas']")
    expect_error("backend name", lambda: setattr(backends.cuda, "matmull", "numba"),
                 AttributeError, "no setting 'matmull'")
    backends.cuda.matmul = "cublas"
    try:
        expect_error("cublas in the simulator", lambda: gpu("matmul")(a, a.T), RuntimeError,
                     "needs a real GPU")
        expect_error("cublas linear in the simulator", lambda: gpu("linear")(a, a, None),
                     RuntimeError, "needs a real GPU")
    finally:
        backends.cuda.matmul = "numba"


# ------------------------------------------------------------------ convolution
CONVS = [  # (label, x shape, w shape, stride, padding (top, left), dilation, groups, out_hw)
    ("3x3 pad 1", (2, 3, 5, 5), (4, 3, 3, 3), (1, 1), (1, 1), (1, 1), 1, None),
    ("stride 2 dilation 2 groups 2", (1, 4, 7, 6), (4, 2, 2, 3), (2, 1), (1, 2), (2, 2), 2, None),
    ("same padding (odd pixel at the end)", (1, 2, 4, 4), (2, 2, 2, 2), (1, 1), (0, 0),
     (1, 1), 1, (4, 4)),
    ("1x1 depthwise", (2, 3, 3, 2), (3, 1, 1, 1), (1, 1), (0, 0), (1, 1), 3, None),
]


def conv_out_hw(x_shape, w_shape, stride, padding, dilation):
    return tuple((n + 2 * p - d * (k - 1) - 1) // s + 1 for n, k, s, p, d in
                 zip(x_shape[2:], w_shape[2:], stride, padding, dilation))


def check_conv():
    for dtype in (np.float32, np.float64):
        for label, xs, ws, stride, padding, dilation, groups, out_hw in CONVS:
            out_hw = out_hw or conv_out_hw(xs, ws, stride, padding, dilation)
            x, w, bias = data(xs, dtype), data(ws, dtype), data(ws[0], dtype)
            name = f"{label} {np.dtype(dtype)}"
            args = (stride, padding, dilation, groups, out_hw)

            def forward_and_backward():
                y, cols = gpu("conv2d")(x, w, bias, *args, True)
                want_y, want_cols = cpu("conv2d")(x, w, bias, *args, True)
                compare(f"conv2d {name}", (y, cols), (want_y, want_cols))
                gy = data(want_y.shape, dtype)
                geo = (xs, ws, stride, padding, dilation, groups)
                compare(f"conv2d_backward {name} (kept cols)",
                        gpu("conv2d_backward")(None, w, gy, cols, *geo, True, True, True),
                        cpu("conv2d_backward")(None, w, gy, want_cols, *geo, True, True, True))
                compare(f"conv2d_backward {name} (im2col again)",
                        gpu("conv2d_backward")(x, None, gy, None, *geo, False, True, False),
                        cpu("conv2d_backward")(x, None, gy, None, *geo, False, True, False))
            guarded(name, forward_and_backward)

    # strided views: a transposed input, a sliced weight, an expanded grad_out
    label, xs, ws, stride, padding, dilation, groups, _ = CONVS[0]
    x = data((2, 3, 5, 5)).transpose(0, 1, 3, 2)
    w = data((4, 3, 3, 6))[..., ::2]
    out_hw = conv_out_hw(xs, ws, stride, padding, dilation)
    args = (stride, padding, dilation, groups, out_hw)

    def strided():
        compare("conv2d strided input and weight, no bias",
                gpu("conv2d")(x, w, None, *args, False), cpu("conv2d")(x, w, None, *args, False))
        gy = np.broadcast_to(data((1, 4, 1) + out_hw[1:]), (2, 4) + out_hw)
        geo = (xs, ws, stride, padding, dilation, groups)
        compare("conv2d_backward expanded grad_out, strided weight",
                gpu("conv2d_backward")(x, w, gy, None, *geo, True, True, True),
                cpu("conv2d_backward")(x, w, gy, None, *geo, True, True, True))
        compare("conv2d_backward input grad only",
                gpu("conv2d_backward")(None, w, gy, None, *geo, True, False, False),
                cpu("conv2d_backward")(None, w, gy, None, *geo, True, False, False))
    guarded("conv strided", strided)
    expect_error("conv2d dtype", lambda: gpu("conv2d")(
        x.astype(np.float32), w, None, *args, False), TypeError, "share one dtype")


# ------------------------------------------------------------------ pooling
POOLS = [  # (label, x shape, kernel, stride, padding, dilation)
    ("2x2 stride 2", (2, 3, 4, 6), (2, 2), (2, 2), (0, 0), (1, 1)),
    ("overlapping 3x3 stride 1 pad 1", (1, 2, 5, 4), (3, 3), (1, 1), (1, 1), (1, 1)),
    ("dilated, ceil-mode edge", (1, 1, 7, 7), (3, 2), (2, 3), (1, 1), (2, 2)),
    ("unbatched (C, H, W)", (3, 5, 5), (2, 3), (1, 2), (1, 0), (1, 1)),
]


def pool_out(n, k, s, p, d):
    return (n + 2 * p - d * (k - 1) - 1) // s + 1


def check_pool():
    for dtype in (np.float32, np.float64):
        for label, xs, k, s, p, d in POOLS:
            name = f"{label} {np.dtype(dtype)}"
            x = data(xs, dtype)
            if x.size > 4:
                x.flat[3] = np.nan
            out_hw = tuple(pool_out(n, *a) for n, a in zip(xs[-2:], zip(k, s, p, d)))

            def run():
                got = gpu("max_pool2d")(x, k, s, p, d, out_hw)
                want = cpu("max_pool2d")(x, k, s, p, d, out_hw)
                compare(f"max_pool2d {name}", got, want)
                g = data(want[0].shape, dtype)
                compare(f"pool_scatter {name}", gpu("pool_scatter")(g, want[1], xs[-2:]),
                        cpu("pool_scatter")(g, want[1], xs[-2:]))
                compare(f"pool_gather {name}", gpu("pool_gather")(x, want[1]),
                        cpu("pool_gather")(x, want[1]))
                for include_pad in (True, False):
                    hs, he, hdiv = _avg_windows(xs[-2], k[0], p[0], s[0], out_hw[0], include_pad)
                    ws, we, wdiv = _avg_windows(xs[-1], k[1], p[1], s[1], out_hw[1], include_pad)
                    windows = (hs, he, ws, we, np.outer(hdiv, wdiv).astype(np.float64))
                    compare(f"avg_pool2d {name} count_include_pad={include_pad}",
                            gpu("avg_pool2d")(x, windows), cpu("avg_pool2d")(x, windows))
                    compare(f"avg_pool2d_backward {name} count_include_pad={include_pad}",
                            gpu("avg_pool2d_backward")(g, windows, xs[-2:]),
                            cpu("avg_pool2d_backward")(g, windows, xs[-2:]))
            guarded(name, run)

    def strided():
        x = data((3, 2, 6, 5)).transpose(1, 0, 3, 2)[..., ::-1]       # (2, 3, 5, 6) view
        args = ((2, 2), (1, 2), (1, 0), (1, 1), (4, 3))
        got, want = gpu("max_pool2d")(x, *args), cpu("max_pool2d")(x, *args)
        compare("max_pool2d strided input", got, want)
        g = np.broadcast_to(data((1, 3, 4, 1)), (2, 3, 4, 3))            # expanded gradient
        idx = np.ascontiguousarray(want[1].transpose(1, 0, 2, 3)).transpose(1, 0, 2, 3)
        compare("pool_scatter expanded grad, strided indices",
                gpu("pool_scatter")(g, idx, (5, 6)), cpu("pool_scatter")(g, idx, (5, 6)))
        compare("pool_gather strided input and indices", gpu("pool_gather")(x, idx),
                cpu("pool_gather")(x, idx))
        # adaptive windows (overlapping, uneven)
        i, j = np.arange(4), np.arange(3)
        hs, he = (i * 5) // 4, -((-(i + 1) * 5) // 4)
        ws, we = (j * 6) // 3, -((-(j + 1) * 6) // 3)
        windows = (hs, he, ws, we, np.outer(he - hs, we - ws).astype(np.float64))
        compare("adaptive avg_pool2d strided input", gpu("avg_pool2d")(x, windows),
                cpu("avg_pool2d")(x, windows))
        g2 = data((2, 3, 4, 3))[:, :, :, ::-1]
        compare("adaptive avg_pool2d_backward", gpu("avg_pool2d_backward")(g2, windows, (5, 6)),
                cpu("avg_pool2d_backward")(g2, windows, (5, 6)))
    guarded("pool strided", strided)
    x = data((1, 1, 4, 4))
    expect_error("pool int dtype", lambda: gpu("max_pool2d")(
        x.astype(np.int32), (2, 2), (2, 2), (0, 0), (1, 1), (2, 2)), TypeError, "dtype int32")
    expect_error("pool_scatter idx dtype", lambda: gpu("pool_scatter")(
        x, np.zeros((1, 1, 4, 4), np.int32), (4, 4)), TypeError, "indices of dtype int32")


def main():
    start = time.perf_counter()
    for part in (check_gemm, check_gemm_errors, check_conv, check_pool):
        t = time.perf_counter()
        part()
        print(f"{part.__name__}: {time.perf_counter() - t:.1f} s")
    for f in failures:
        print("FAIL", f)
    print(f"{len(checks)} checks, {len(failures)} failures, "
          f"{time.perf_counter() - start:.1f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
