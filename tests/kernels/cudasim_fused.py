"""Checks the CUDA fused elementwise kernels in numba's CUDA simulator.

Run by ``tests/graph/test_fusion.py`` in its own process, because
``NUMBA_ENABLE_CUDASIM=1`` must be set before numba is first imported::

    NUMBA_ENABLE_CUDASIM=1 python tests/kernels/cudasim_fused.py

Every expression (value and the gradient kernel of each tensor operand), in
float32 and float64, over contiguous, broadcast (0-d and row operands),
transposed and step-sliced inputs, against the CPU kernel of the same
expression; then one fused op forward and backward on ``cuda`` tensors
against the same op on the CPU.  Tiny shapes.  Prints one line per failure.
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tests.kernels.check_target import select  # noqa: E402

TARGET = select()      # the simulator, or a real GPU for bench/gpu_check

import numpy as np  # noqa: E402

from pyflow.kernels import registry  # noqa: E402

TOL = {np.float32: (1e-5, 1e-6), np.float64: (1e-12, 1e-13)}
rng = np.random.default_rng(0)

EXPRESSIONS = [
    # gelu(x * w + b) * 0.5 + x
    ((("mul", (0, 1)), ("add", (4, 2)), ("gelu", (5,)), ("mul", (6, 3)), ("add", (7, 0))),
     (False, False, False, True)),
    # sigmoid(x) * x - maximum(x, y) / y
    ((("sigmoid", (0,)), ("mul", (2, 0)), ("maximum", (0, 1)), ("div", (4, 1)),
      ("sub", (3, 5))), (False, False)),
    # rsqrt(x) ** 1.5 + tanh(log(x))
    ((("rsqrt", (0,)), ("pow", (2, 1)), ("log", (0,)), ("tanh", (4,)), ("add", (3, 5))),
     (False, True)),
]
SCALAR_VALUES = {3: 0.5}


def operands(scalars, case, dtype):
    """Positive values (log, rsqrt) of the case's shapes and layouts."""
    full = (3, 4)
    out = []
    for k, s in enumerate(scalars):
        if s:
            out.append(SCALAR_VALUES.get(k, 1.5))
            continue
        shape = full if k == 0 else {"contiguous": full, "broadcast": (4,) if k == 1 else (),
                                     "transposed": full, "sliced": full}[case]
        v = rng.uniform(0.5, 2.0, shape).astype(dtype)
        if case == "transposed":
            v = np.ascontiguousarray(v.T).T
        elif case == "sliced":
            big = np.zeros(shape[:-1] + (2 * shape[-1],), dtype)
            big[..., ::2] = v
            v = big[..., ::2]
        out.append(v)
    return out


def check(expr, dtype, case, failures):
    cpu, cuda = registry.get("fused_elementwise", "cpu"), registry.get("fused_elementwise", "cuda")
    program, scalars = expr
    ins = operands(scalars, case, dtype)
    g = rng.standard_normal((3, 4)).astype(dtype)
    for wrt in [None] + [k for k, s in enumerate(scalars) if not s]:
        e = (program, scalars, wrt)
        args = ins if wrt is None else [g] + ins
        label = f"{'+'.join(op for op, _ in program)} d/da{wrt} {np.dtype(dtype)} {case}"
        try:
            got = np.asarray(cuda(e, *args))
        except Exception as exc:  # report every case, not only the first
            failures.append(f"{label}: raised {type(exc).__name__}: {exc}")
            continue
        want = cpu(e, *args)
        rtol, atol = TOL[dtype]
        if got.shape != want.shape or got.dtype != want.dtype or \
                not np.allclose(got, want, rtol=rtol, atol=atol):
            failures.append(f"{label}: got {got.tolist()}\n  want {want.tolist()}")


def check_fused_op(failures):
    """Forward and backward of a fused op on cuda tensors equal the CPU ones."""
    import pyflow as pf
    from pyflow.graph.passes.fusion import fused_function
    program, scalars = EXPRESSIONS[0]
    cls = fused_function(program, scalars)
    values = [rng.standard_normal(s) for s in ((3, 4), (4,), (1, 4))]
    results = []
    for device in ("cpu", "cuda"):
        ts = [pf.tensor(v, device=device, requires_grad=True) for v in values]
        out = cls.apply(*ts, 0.5)
        out.sum().backward()
        results.append([out.detach().cpu().numpy()] + [t.grad.cpu().numpy() for t in ts])
    for k, (a, b) in enumerate(zip(*results)):
        if a.shape != b.shape or not np.allclose(a, b, rtol=1e-12, atol=1e-13):
            failures.append(f"fused op on cuda tensors, result {k}: {b.tolist()} != {a.tolist()}")


def check_infinities(failures):
    """relu(x * s) of -inf is 0 and its gradient for an infinite g is 0; maximum's
    gradient gives the operand not picked 0 (PyTorch's values, not inf * 0 = NaN),
    on the CUDA and CPU kernels alike."""
    inf, nan = np.inf, np.nan
    relu = ((("mul", (0, 1)), ("relu", (2,))), (False, True))
    maxi = ((("maximum", (0, 1)), ("mul", (2, 3))), (False, False, True))
    cases = [  # (expr, wrt, args, expected)
        (relu, None, [[-inf, -1.0, -0.0, 2.0, nan], 1.0], [0.0, 0.0, -0.0, 2.0, nan]),
        (relu, 0, [[inf, inf, inf, 1.0, 1.0], [-inf, -1.0, -0.0, 2.0, nan], 1.0],
         [0.0, 0.0, 0.0, 1.0, 1.0]),
        (maxi, 0, [[inf, inf, inf], [1.0, 2.0, 3.0], [2.0, 2.0, 1.0], 1.0], [0.0, inf, inf]),
        (maxi, 1, [[inf, inf, inf], [1.0, 2.0, 3.0], [2.0, 2.0, 1.0], 1.0], [inf, inf, 0.0]),
    ]
    for (program, scalars), wrt, args, expected in cases:
        for dtype in (np.float32, np.float64):
            ins = [a if isinstance(a, float) else np.array(a, dtype) for a in args]
            want = np.array(expected, dtype)
            for device in ("cuda", "cpu"):
                got = np.asarray(registry.get("fused_elementwise", device)(
                    (program, scalars, wrt), *ins))
                if not (np.array_equal(got, want, equal_nan=True)
                        and np.array_equal(np.signbit(got), np.signbit(want))):
                    failures.append(f"{'+'.join(op for op, _ in program)} d/da{wrt} "
                                    f"{np.dtype(dtype)} on {device}: got {got.tolist()}, "
                                    f"want {expected}")


def check_errors(failures):
    cuda = registry.get("fused_elementwise", "cuda")
    a = np.ones((2, 3), np.float32)
    e = ((("add", (0, 1)),), (False, False), None)
    for call, exc, text in [
            (lambda: cuda(e, a, a.astype(np.float64)), TypeError, "share one dtype"),
            (lambda: cuda(e, a, np.ones(4, np.float32)), ValueError, "not broadcastable"),
            (lambda: cuda(e, a), TypeError, "takes 2 operands")]:
        try:
            call()
        except exc as err:
            if text not in str(err):
                failures.append(f"error message {str(err)!r} lacks {text!r}")
        else:
            failures.append(f"expected {exc.__name__} containing {text!r}")


def main():
    start = time.perf_counter()
    failures, count = [], 0
    for expr in EXPRESSIONS:
        for dtype in (np.float32, np.float64):
            for case in ("contiguous", "broadcast", "transposed", "sliced"):
                check(expr, dtype, case, failures)
                count += 1
    check_fused_op(failures)
    check_infinities(failures)
    check_errors(failures)
    for f in failures:
        print("FAIL", f)
    print(f"{count} expression/dtype/layout checks, {len(failures)} failures, "
          f"{time.perf_counter() - start:.1f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
