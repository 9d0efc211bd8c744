"""Every CUDA reduction kernel compiles to PTX for sm_80 and sm_90 (no GPU needed).

``numba.cuda.compile_ptx`` with NVVM from the numba-cuda[cu12] wheels catches
typing errors the simulator cannot (it runs kernels as Python): 64-bit warp
shuffles, bool/uint8/float16 loads, float32 constants, tuples of strides.

Each spec (reduction x dtype) is compiled in the ``row`` kernel, which calls all
four of its device functions (step, combine through the warp shuffles, finish);
the other kernel shapes (``column``, split ``partial`` variants, ``combine``)
are the same templates around the same device functions, so they are compiled
for a few specs that cover each kind of state (a sum, a value with an index,
an int32 flag, a second pass with a center).  Plus both cumsum kernels.
"""
import re

import numpy as np
import pytest

from pyflow.kernels.cuda import reduce as cr
from tests.kernels.cudatools import compile_ptx, compile_ptx_all

SPECS = cr.kernel_specs()
IDS = [label for label, _, _ in SPECS]
TEMPLATE_SPECS = ["sum f32", "max_dim int32", "all f32", "logsumexp expdev f32"]
SHAPES = [("column", False), ("column", True), ("row", True), ("combine", False)]
F64_MATH = re.compile(r"\s*(add|sub|mul|fma|div|rcp|sqrt|setp|max|min|abs|neg|ex2|lg2)"
                      r"[.\w]*\.f64\s")
SCANS = [(np.float64, np.float32, np.float32), (np.int64, np.int64, np.uint8),
         (np.int64, np.int64, np.int32), (np.float64, np.float64, np.float64)]


def ptx_kernels():
    """The plain kernel functions this file compiles (for tests/test_op_coverage.py)."""
    fns = [cr.kernel_function(spec, "row") for _, spec, _ in SPECS]
    fns += [cr.kernel_function(SPECS[IDS.index(label)][1], shape, partial)
            for label in TEMPLATE_SPECS for shape, partial in SHAPES]
    return fns + [cr.scan_kernel_function(acc, out, shape)
                  for shape in ("row", "column") for acc, out, _ in SCANS]


@pytest.mark.parametrize("label,spec,dtype", SPECS, ids=IDS)
def test_row_kernel_of_every_spec_compiles(label, spec, dtype, monkeypatch):
    compile_ptx_all(cr.kernel_function(spec, "row"), cr.kernel_signature(spec, "row", dtype),
                    monkeypatch)


@pytest.mark.parametrize("label", TEMPLATE_SPECS)
def test_every_kernel_shape_compiles(label, monkeypatch):
    _, spec, dtype = SPECS[IDS.index(label)]
    for shape, partial in SHAPES:
        # a 2-D kept and a 2-D reduced layout: the unravelling loop is generated
        signature = cr.kernel_signature(spec, shape, dtype, partial, kept_ndim=2, red_ndim=2)
        compile_ptx_all(cr.kernel_function(spec, shape, partial), signature, monkeypatch)


@pytest.mark.parametrize("shape", ["row", "column"])
def test_cumsum_kernels_compile(shape, monkeypatch):
    for acc, out, dtype in SCANS:
        compile_ptx_all(cr.scan_kernel_function(acc, out, shape),
                        cr.scan_kernel_signature(dtype, out), monkeypatch)


@pytest.mark.parametrize("label", ["sum f32", "mean f32", "var sqdev f32",
                                   "logsumexp expdev f32", "max_dim float32", "argmax float32"])
def test_float32_reductions_stay_in_float32(label, monkeypatch):
    """float32 data must not be computed in float64 (up to 64x slower on a GPU).
    The kernel's float64 ``param`` (var's denominator) may be loaded and
    converted, but no float64 arithmetic may appear."""
    _, spec, dtype = SPECS[IDS.index(label)]
    ptx = compile_ptx(cr.kernel_function(spec, "row"), cr.kernel_signature(spec, "row", dtype),
                      (9, 0), monkeypatch)
    f64 = [line.strip()[:60] for line in ptx.splitlines() if F64_MATH.match(line)]
    assert not f64, f"{label}: float64 instructions {f64[:3]}"


def test_warp_shuffles_are_in_the_ptx(monkeypatch):
    """The cross-thread steps really are warp shuffles (shfl.sync), 64-bit ones
    split into two 32-bit shuffles, and the scan uses shfl.sync.up."""
    _, spec, dtype = SPECS[IDS.index("max_dim float64")]
    ptx = compile_ptx(cr.kernel_function(spec, "row"), cr.kernel_signature(spec, "row", dtype),
                      (9, 0), monkeypatch)
    assert "shfl.sync.down" in ptx
    ptx = compile_ptx(cr.scan_kernel_function(np.float64, np.float32, "row"),
                      cr.scan_kernel_signature(np.float32, np.float32), (9, 0), monkeypatch)
    assert "shfl.sync.up" in ptx
