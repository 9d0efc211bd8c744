"""The CUDA GEMM, convolution and pooling kernels.

The kernels themselves run in numba's simulator in a child process
(``cudasim_linalg_conv.py``: every registered kernel against the CPU kernel
of the same name).  The host-side pieces that need no simulator are tested
here directly: the backend switch, tile choice and validation, and the
layout analysis that lets kernels read strided views without copies.
"""
import numpy as np
import pytest

import pyflow
from pyflow import backends
from pyflow.kernels.cuda import conv, linalg, pool
from tests.kernels.cudatools import run_in_simulator


@pytest.mark.slow
def test_every_gemm_conv_pool_kernel_in_the_simulator():
    out = run_in_simulator("cudasim_linalg_conv.py")
    assert int(out.split(" checks,")[0].split()[-1]) >= 100, out


def test_matmul_backend_switch_is_validated():
    assert backends.cuda.matmul == "numba"
    assert pyflow.backends.cuda is backends.cuda
    try:
        backends.cuda.matmul = "cublas"
        assert backends.cuda.matmul == "cublas"
        with pytest.raises(ValueError, match=r"must be one of \['numba', 'cublas'\], got 'cuBLAS'"):
            backends.cuda.matmul = "cuBLAS"
        with pytest.raises(ValueError, match="got None"):
            backends.cuda.matmul = None
        assert backends.cuda.matmul == "cublas"           # a failed assignment changes nothing
    finally:
        backends.cuda.matmul = "numba"
    with pytest.raises(AttributeError, match="no setting 'matmul_precision'"):
        backends.cuda.matmul_precision = "high"
    assert "numba" in repr(backends.cuda)


def test_tiles():
    assert linalg.check_tile((32, 16, 8, 4, 2)) == linalg.Tile(32, 16, 8, 4, 2)
    with pytest.raises(ValueError, match="BM must be a multiple of TM"):
        linalg.check_tile((30, 16, 8, 4, 2))
    with pytest.raises(ValueError, match="2048 threads per block"):
        linalg.check_tile((64, 128, 8, 1, 4))
    # outside the simulator: big tiles only when they still fill the GPU
    assert linalg.choose_tile(4096, 4096, 1, np.float32) == linalg.LARGE_TILE
    assert linalg.choose_tile(128, 128, 1, np.float32) == linalg.SMALL_TILE
    assert linalg.choose_tile(128, 128, 1000, np.float32) == linalg.LARGE_TILE
    assert linalg.choose_tile(4096, 4096, 1, np.float64) == linalg.SMALL_TILE


def test_merged_stride_of_trailing_dims():
    assert conv._merged_stride((4, 3, 3, 3), (27, 9, 3, 1), 1) == 1
    assert conv._merged_stride((4, 3, 3, 3), (27, 9, 3, 1), 2) == 1
    assert conv._merged_stride((4, 3, 2, 3), (36, 12, 6, 2), 1) == 2   # every other element
    assert conv._merged_stride((4, 3, 2, 3), (54, 18, 6, 2), 1) is None  # a gap between channels
    assert conv._merged_stride((4, 3, 2, 3), (54, 18, 6, 2), 2) == 2
    assert conv._merged_stride((4, 3, 3, 3), (27, 9, 1, 3), 2) is None # transposed (H, W)
    assert conv._merged_stride((4, 3, 1, 1), (3, 1, 7, 5), 1) == 1     # size-1 dims don't count
    assert conv._merged_stride((2, 1, 1, 1), (1, 9, 9, 9), 1) == 1


def test_pool_planes_share_one_lead_layout():
    g = np.zeros((2, 3, 4, 5), np.float32)                 # contiguous: lead dims merge...
    idx = np.zeros((3, 2, 4, 5), np.int64).transpose(1, 0, 2, 3)
    (_, g_lay), (_, i_lay) = pool._planes([g, idx], ["grad", "indices"])[0]
    shapes = pool._planes([g, idx], ["grad", "indices"])[1]
    assert shapes == [(2, 3, 4, 5), (2, 3, 4, 5)]         # ...unless another operand forbids it
    assert g_lay == (0, 60, 20, 5, 1) and i_lay == (0, 20, 40, 5, 1)
    [(_, lay)], [shape] = pool._planes([g], ["grad"])
    assert shape == (1, 6, 4, 5) and lay == (0, 0, 20, 5, 1)
    [(_, lay)], [shape] = pool._planes([np.zeros((3, 4, 5))[:, ::-1]], ["input"])
    assert shape == (1, 3, 4, 5) and lay == (15, 0, 20, -5, 1)
    with pytest.raises(ValueError, match="at most 2 leading dims"):
        pool._planes([np.zeros((2, 3, 4, 5, 6)).transpose(1, 0, 2, 3, 4)], ["input"])
    with pytest.raises(ValueError, match="leading dims"):
        pool._planes([g, np.zeros((2, 4, 4, 5), np.int64)], ["grad", "indices"])


def test_bad_dtypes_are_refused_before_any_launch():
    a = np.ones((2, 2), np.complex64)
    with pytest.raises(TypeError, match="no CUDA GEMM for dtype complex64"):
        linalg.matmul(a, a)
    with pytest.raises(TypeError, match="no CUDA kernel for input of dtype float16"):
        pool.max_pool2d(np.ones((1, 1, 2, 2), np.float16), (1, 1), (1, 1), (0, 0), (1, 1),
                        (2, 2))
    with pytest.raises(TypeError, match="no CUDA kernel for input of dtype int64"):
        conv.conv2d(np.ones((1, 1, 2, 2), np.int64), np.ones((1, 1, 1, 1), np.int64), None,
                    (1, 1), (0, 0), (1, 1), 1, (2, 2), False)
