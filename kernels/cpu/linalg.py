"""GEMM on the CPU: NumPy's matmul, i.e. the BLAS it links (OpenBLAS in the
pip wheel).  A hand-written numba GEMM cannot match a tuned BLAS on the CPU;
the numba.cuda tiled GEMM is where pyflow writes its own."""
import numpy as np

from ..registry import register


@register("matmul", "cpu")
def matmul(a, b):
    return np.matmul(a, b)
