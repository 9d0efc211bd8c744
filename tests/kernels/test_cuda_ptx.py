"""Every generated CUDA elementwise kernel compiles to PTX for sm_80 and sm_90.

``numba.cuda.compile_ptx`` needs no GPU (NVVM comes with the numba-cuda[cu12]
wheels), so this catches typing errors in code the simulator never compiles:
float16 conversions, float32 constants, integer/bool specialisations.

numba compiles device functions for "the current device"; without a GPU there
is none, so the test stands in a device of the target compute capability.
The strided kernel is specialised per number of dimensions; it is compiled
here for 3 (the index math is the same loop for any count).
"""
import numpy as np
import pytest

from pyflow.kernels.cuda import elementwise as ew
from tests.kernels.cudatools import compile_ptx, compile_ptx_all


@pytest.mark.parametrize("name", sorted(ew.OPS))
def test_kernels_compile_to_ptx(name, monkeypatch):
    compiled = 0
    for dtype in ew.supported_dtypes(name):
        for layout in ew.LAYOUTS:
            kernel = ew.kernel_function(name, dtype, layout)   # fresh device functions
            compile_ptx_all(kernel, ew.kernel_signature(name, dtype, layout), monkeypatch)
            compiled += 1
    assert compiled == 2 * len(ew.supported_dtypes(name))


def test_float32_kernels_stay_in_float32(monkeypatch):
    """float32 math must not fall back to float64 (2x-64x slower on a GPU)."""
    for name in ("add", "relu", "gelu", "gelu_tanh_backward", "silu", "sigmoid", "log"):
        for dtype in (np.float32, np.float16):
            ptx = compile_ptx(ew.kernel_function(name, dtype, "contiguous"),
                              ew.kernel_signature(name, dtype, "contiguous"), (9, 0), monkeypatch)
            f64 = [line for line in ptx.splitlines() if ".f64" in line]
            assert not f64, f"{name} {np.dtype(dtype)}: float64 instructions {f64[:3]}"


def test_every_registered_dtype_has_a_spec():
    specs = ew.specs()
    assert len(specs) == len(set(specs))
    assert {name for name, _, _ in specs} == set(ew.OPS)
    assert ("gelu", np.dtype(np.float16), "strided") in specs
    assert ("neg", np.dtype(np.bool_), "contiguous") not in specs


@pytest.mark.parametrize("name", ["add", "mul", "sub", "div", "pow", "maximum", "lt"])
def test_kernels_with_a_number_passed_by_value_compile_to_ptx(name, monkeypatch):
    """``x * 2.0`` launches the contiguous kernel with the number as an argument
    (elementwise._dense_launch): float16 numbers by value included."""
    for dtype in ew.supported_dtypes(name):
        if np.dtype(dtype) not in (np.float16, np.float32, np.int64, np.bool_):
            continue
        for scalars in ((False, True), (True, False)):
            compile_ptx_all(ew.scalar_kernel_function(name, dtype, scalars),
                            ew.scalar_kernel_signature(name, dtype, scalars), monkeypatch)
