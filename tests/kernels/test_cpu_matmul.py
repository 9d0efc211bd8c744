"""The CPU matmul kernel's small 2-D path (np.dot) equals NumPy's matmul bit for
bit on every layout and dtype it takes: it is a shortcut past the checks, not
another product.  (Operands BLAS cannot read in place are made contiguous
first, by both paths.)"""
import numpy as np
import pytest

from pyflow.kernels.registry import get


def _layout(x, how):
    if how == "T":
        return np.ascontiguousarray(x.T).T
    if how == "strided":
        return np.repeat(x, 2, axis=1)[:, ::2]
    return x


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.bool_])
@pytest.mark.parametrize("la", ["C", "T", "strided"])
@pytest.mark.parametrize("lb", ["C", "T", "strided"])
@pytest.mark.parametrize("m,k,n", [(16, 16, 16), (1, 7, 3), (33, 5, 64), (0, 4, 2), (3, 0, 2)])
def test_small_2d_product_equals_numpy_matmul(dtype, la, lb, m, k, n):
    rng = np.random.default_rng(0)
    a = _layout((rng.standard_normal((m, k)) * 4).astype(dtype), la)
    b = _layout((rng.standard_normal((k, n)) * 4).astype(dtype), lb)
    got = get("matmul", "cpu")(a, b)
    want = np.matmul(np.ascontiguousarray(a) if la == "strided" else a,
                     np.ascontiguousarray(b) if lb == "strided" else b)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
