"""Reduction kernels.  Sums use NumPy's pairwise summation (more accurate than a
naive loop, and SIMD); float32 inputs accumulate in float32 like PyTorch."""
import numpy as np

from ..registry import register


@register("sum", "cpu")
def sum_(x, dims, keepdim, out_dtype):
    return np.sum(x, axis=dims, keepdims=keepdim, dtype=out_dtype)


@register("mean", "cpu")
def mean(x, dims, keepdim):
    return np.mean(x, axis=dims, keepdims=keepdim)
