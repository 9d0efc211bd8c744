"""Checks every CUDA elementwise kernel in numba's CUDA simulator (no GPU needed).

Run by ``test_cuda_elementwise.py`` in its own process, because
``NUMBA_ENABLE_CUDASIM=1`` must be set before numba is first imported::

    NUMBA_ENABLE_CUDASIM=1 python tests/kernels/cudasim_elementwise.py

For every op and every dtype it has a kernel for, on tiny shapes (<= 64
elements): same-shape contiguous inputs, broadcasting (including a 0-d
operand), transposed and step-sliced inputs, and a non-contiguous ``out``.
The reference is the CPU kernel of the op evaluated in float64 for float
dtypes (exact upcast of the inputs) and in the same dtype otherwise.  Prints
one line per failure and exits 1 if there was any.  Then infinities, NaN, signed
zeros and integer edge cases against PyTorch's values, stated in ``SPECIAL``.
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tests.kernels.check_target import select  # noqa: E402

TARGET = select()      # the simulator, or a real GPU for bench/gpu_check

import numpy as np  # noqa: E402
from numba import config  # noqa: E402

import pyflow.kernels.cpu.elementwise  # noqa: E402,F401  (registers the CPU references)
import pyflow.kernels.cuda.elementwise as ew  # noqa: E402
from pyflow.kernels.cuda._memory import to_host  # noqa: E402
from pyflow.kernels import registry  # noqa: E402

assert config.ENABLE_CUDASIM or TARGET == "gpu", "numba did not pick up NUMBA_ENABLE_CUDASIM=1"

TOL = {np.float16: (2e-3, 2e-3), np.float32: (2e-6, 1e-6), np.float64: (1e-12, 1e-13)}
rng = np.random.default_rng(0)


def values(name, position, shape, dtype):
    """Inputs that keep op ``name`` away from undefined results (x // 0, 0 ** -1)."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    if dtype.kind in "iu":
        if name == "pow":
            return rng.integers(-3, 4, shape).astype(dtype) if position == 0 else \
                rng.integers(0, 4, shape).astype(dtype)
        v = rng.integers(-5, 6, shape).astype(dtype)
        if name in ("floor_divide", "remainder") and position == 1:
            v[v == 0] = 3
        return v
    v = rng.uniform(-2.0, 2.0, shape)
    if name == "pow" and position == 0:
        v = rng.uniform(0.25, 2.0, shape)
    if name in ("div", "floor_divide", "remainder", "reciprocal") and \
            position == ew.OPS[name][2] - 1:
        v = np.where(np.abs(v) < 0.25, 0.5, v)
    if name in ("log", "sqrt", "rsqrt") and v.size > 2:
        v.flat[0], v.flat[1] = 0.0, -1.0          # the zero and negative branches
    if name == "silu" and v.size > 2:
        v.flat[0] = -40.0                         # the x < -30 branch
    return v.astype(dtype)


def operands(name, dtype, shapes, layout):
    """Input arrays of ``shapes`` laid out as asked."""
    kind = ew.OPS[name][1]
    out = []
    for k, shape in enumerate(shapes):
        dt = np.bool_ if kind == "select" and k == 0 else dtype
        if layout == "transposed" and len(shape) >= 2:
            base = values(name, k, shape[:-2] + shape[-1:] + shape[-2:-1], dt)
            out.append(np.swapaxes(base, -1, -2))
        elif layout == "sliced" and len(shape) >= 1:
            base = values(name, k, shape[:-1] + (2 * shape[-1] + 1,), dt)
            out.append(base[..., 1::2])
        elif layout == "reversed" and len(shape) >= 1:
            out.append(values(name, k, shape, dt)[..., ::-1])
        else:
            out.append(values(name, k, shape, dt))
    return out


def reference(name, inputs, dtype):
    cpu = registry.get(name, "cpu")
    if np.dtype(dtype).kind == "f":
        inputs = [a.astype(np.float64) if a.dtype.kind == "f" else a for a in inputs]
    return np.asarray(cpu(*inputs))


CASES = {  # layout name -> (shapes per arity, input layout, out layout)
    "contiguous": ({1: [(3, 5)], 2: [(3, 5)] * 2, 3: [(3, 5)] * 3}, "contiguous"),
    "broadcast": ({1: [(1, 4)], 2: [(3, 1, 4), (5, 1)], 3: [(2, 1, 3), (4, 1), (3,)]},
                  "contiguous"),
    "0-d operand": ({1: [()], 2: [(2, 3), ()], 3: [(2, 3), (), (3,)]}, "contiguous"),
    "transposed": ({1: [(4, 3)], 2: [(4, 3)] * 2, 3: [(2, 4, 3)] * 3}, "transposed"),
    "sliced": ({1: [(3, 4)], 2: [(3, 4), (4,)], 3: [(3, 4), (3, 4), (1, 4)]}, "sliced"),
    "reversed": ({1: [(5,)], 2: [(2, 5)] * 2, 3: [(5,)] * 3}, "reversed"),
}


def check(name, dtype, case, failures):
    nin = ew.OPS[name][2]
    shapes_by_arity, layout = CASES[case]
    shapes = shapes_by_arity[nin]
    inputs = operands(name, dtype, shapes, layout)
    if case == "broadcast" and nin == 1:
        inputs = [np.broadcast_to(inputs[0], (3, 4))]        # an expanded (stride 0) input
    kernel = registry.get(name, "cuda")
    label = f"{name} {np.dtype(dtype)} {case}"
    try:
        got = to_host(kernel(*inputs))
        if case == "transposed":                             # and a non-contiguous out
            shape = got.shape
            out = np.empty(shape[:-2] + shape[-1:] + shape[-2:-1], got.dtype)
            out = np.swapaxes(out, -1, -2)
            kernel(*inputs, out=out)
            if not np.array_equal(out, got, equal_nan=got.dtype.kind == "f"):
                failures.append(f"{label}: out= on a transposed view differs")
    except Exception as e:  # report every op, not just the first failure
        failures.append(f"{label}: raised {type(e).__name__}: {e}")
        return
    want = reference(name, inputs, dtype)
    if got.shape != want.shape or got.dtype != ew.result_dtype(name, dtype):
        failures.append(f"{label}: got {got.shape} {got.dtype}, want {want.shape} "
                        f"{ew.result_dtype(name, dtype)}")
        return
    if got.dtype.kind == "f":
        rtol, atol = TOL[got.dtype.type]
        ok = np.allclose(got.astype(np.float64), want, rtol=rtol, atol=atol, equal_nan=True)
    else:
        ok = np.array_equal(got, want.astype(got.dtype))
    if not ok:
        failures.append(f"{label}: inputs {[a.tolist() for a in inputs]}\n"
                        f"  got  {got.tolist()}\n  want {want.tolist()}")


def check_errors(failures):
    """Bad input gives a clear exception, not a simulator crash."""
    add = registry.get("add", "cuda")
    a = np.ones((2, 3), np.float32)
    expectations = [
        (lambda: add(a, np.ones((2, 3), np.float64)), TypeError, "share one dtype"),
        (lambda: add(a, np.ones((4,), np.float32)), ValueError, "broadcast"),
        (lambda: add(a, a, out=np.empty((2, 3), np.float64)), TypeError, "out must have dtype"),
        (lambda: add(a, a, out=np.empty((3, 3), np.float32)), ValueError, "out has shape"),
        (lambda: registry.get("exp", "cuda")(np.ones(3, np.int32)), TypeError, "no CUDA kernel"),
        (lambda: ew.launch("where", np.empty(3, np.float32), a[0], a[0], a[0]), TypeError,
         "condition must be bool"),
        (lambda: ew.launch("nope", a, a), ValueError, "unknown elementwise op"),
        (lambda: registry.get("neg", "cuda")(np.ones(3, np.bool_)), TypeError, "dtype bool"),
        (lambda: add(a, "x"), TypeError, "__cuda_array_interface__"),
    ]
    for call, exc, text in expectations:
        try:
            call()
        except exc as e:
            if text not in str(e):
                failures.append(f"error message {str(e)!r} lacks {text!r}")
        else:
            failures.append(f"expected {exc.__name__} containing {text!r}")


INF, NAN = np.inf, np.nan
I32_MIN, I64_MIN = -2**31, -2**63
FLOATS = (np.float16, np.float32, np.float64)
# (op, dtypes, inputs, expected): PyTorch's values, stated, not taken from the CPU
# kernels (relu(-inf) = 0 not inf * 0 = NaN, relu(-3) = +0.0, sign(NaN) = 0,
# rsqrt(-0.0) = -inf, abs(-0.0) = +0.0, int 0 ** -1 = 0, INT_MIN // -1 = INT_MIN)
SPECIAL = [
    ("relu", FLOATS,
     ([-INF, -3.0, -0.0, 0.0, 2.0, NAN, INF],), [0.0, 0.0, -0.0, 0.0, 2.0, NAN, INF]),
    ("relu_backward", FLOATS,
     ([INF, NAN, INF, -INF, 1.0, INF, NAN], [0.0, 0.0, -0.0, 0.0, 2.0, NAN, INF]),
     [0.0, 0.0, 0.0, 0.0, 1.0, INF, NAN]),
    ("relu", (np.int32, np.int64), ([-3, 0, 2],), [0, 0, 2]),
    ("sign", FLOATS, ([NAN, -0.0, -2.0, INF],), [0.0, 0.0, -1.0, 1.0]),
    ("rsqrt", FLOATS, ([-0.0, 0.0, -1.0, 4.0],), [-INF, INF, NAN, 0.5]),
    ("abs", FLOATS, ([-0.0, NAN, -INF],), [0.0, NAN, INF]),
    ("pow", (np.int32, np.int64), ([-1, 0, 1, 2, -2, 3, -1, 0], [-1, -2, -3, -1, -1, 0, -2, -1]),
     [-1, 0, 1, 0, 0, 1, 1, 0]),
    ("floor_divide", (np.int32,), ([I32_MIN, 7, -7, 7], [-1, -1, 2, 3]), [I32_MIN, -7, -4, 2]),
    ("floor_divide", (np.int64,), ([I64_MIN, 7, -7, 7], [-1, -1, 2, 3]), [I64_MIN, -7, -4, 2]),
]


def check_special_values(failures):
    """Infinities, NaN, signed zeros and integer edge cases give PyTorch's values, on
    the CUDA kernels and on the CPU kernels alike."""
    for name, dtypes, inputs, expected in SPECIAL:
        for dtype in dtypes:
            arrays = [np.array(v, dtype) for v in inputs]
            want = np.array(expected, dtype)
            # (the CPU has no float16 kernels: ops compute float16 in float32)
            for device in ("cuda",) if dtype == np.float16 else ("cuda", "cpu"):
                label = f"{name} {np.dtype(dtype)} special values on {device}"
                try:
                    got = np.asarray(to_host(registry.get(name, device)(*arrays)))
                except Exception as e:  # report every case, not just the first failure
                    failures.append(f"{label}: raised {type(e).__name__}: {e}")
                    continue
                same = np.array_equal(got, want, equal_nan=want.dtype.kind == "f") and \
                    (want.dtype.kind != "f" or np.array_equal(np.signbit(got), np.signbit(want)))
                if not same:
                    failures.append(f"{label}: inputs {inputs}\n  got  {got.tolist()}\n"
                                    f"  want {expected}")


def check_numbers_by_value(failures):
    """A number operand of a contiguous array (``x * 2.5``) goes to the kernel by
    value (elementwise._dense_launch), converted to the array's dtype as a 0-d
    device array would be: the result equals the CPU kernel's on that 0-d array,
    with the number on either side."""
    used = []
    real = ew._scalar_kernel

    def counting(*key):
        used.append(key)
        return real(*key)
    ew._scalar_kernel = counting
    try:
        for name in ("add", "mul", "sub", "div", "maximum", "lt", "pow"):
            for dtype in ew.supported_dtypes(name):
                x = (rng.uniform(0.5, 3.0, (3, 5)) * (1 if dtype != np.bool_ else 0)).astype(dtype)
                if dtype == np.bool_:
                    x = rng.random((3, 5)) > 0.5
                for number in (2, 2.5, True):
                    for number_first in (False, True):
                        args = (number, x) if number_first else (x, number)
                        ref = tuple(np.asarray(a, dtype) if a is number else a for a in args)
                        label = f"{name} {np.dtype(dtype)} with {number!r} by value " \
                                f"({'first' if number_first else 'second'})"
                        before = len(used)
                        try:
                            got = to_host(registry.get(name, "cuda")(*args))
                            # the CPU has no float16 kernels: compare with float32's, rounded
                            cpu = ref if dtype != np.float16 else \
                                tuple(a.astype(np.float32) for a in ref)
                            want = registry.get(name, "cpu")(*cpu)
                            if dtype == np.float16:
                                want = want.astype(got.dtype)
                        except Exception as e:  # report every case
                            failures.append(f"{label}: raised {type(e).__name__}: {e}")
                            continue
                        if len(used) == before:
                            failures.append(f"{label}: not launched with the number by value")
                        if not np.array_equal(got, want, equal_nan=got.dtype.kind == "f"):
                            failures.append(f"{label}: got {got.ravel()[:4]} want "
                                            f"{want.ravel()[:4]}")
    finally:
        ew._scalar_kernel = real


def check_empty(failures):
    got = registry.get("mul", "cuda")(np.ones((0, 3)), np.ones((1, 3)))
    if got.shape != (0, 3):
        failures.append(f"empty input: got shape {got.shape}")


def main():
    start = time.perf_counter()
    failures, count = [], 0
    for name in ew.OPS:
        op_failures = []
        for dtype in ew.supported_dtypes(name):
            for case in CASES:
                check(name, dtype, case, op_failures)
                count += 1
        failures += op_failures
    check_errors(failures)
    check_empty(failures)
    check_special_values(failures)
    check_numbers_by_value(failures)
    for f in failures:
        print("FAIL", f)
    print(f"{count} op/dtype/layout checks, {len(failures)} failures, "
          f"{time.perf_counter() - start:.1f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
