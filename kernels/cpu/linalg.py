"""GEMM on the CPU: NumPy's matmul, i.e. the BLAS it links (OpenBLAS in the
pip wheel).  A hand-written numba GEMM cannot match a tuned BLAS on the CPU;
the numba.cuda tiled GEMM is where pyflow writes its own.

``np.matmul`` passes a transposed 2-D view to BLAS with its ``trans`` flag
instead of copying it, so ``x @ weight.T`` and ``grad.T @ x`` cost no copy.
"""
import numpy as np

from ..registry import register


@register("matmul", "cpu")
def matmul(a, b):
    """(..., n, k) @ (..., k, m) with NumPy's batch broadcasting; 1-D x 1-D is a dot."""
    return np.asarray(np.matmul(a, b))


@register("linear", "cpu")
def linear(x, weight, bias):
    """x (M, K) @ weight (N, K).T + bias (N,): one GEMM, bias added in place."""
    out = np.matmul(x, weight.T)
    if bias is not None:
        out += bias
    return out
