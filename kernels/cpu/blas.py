"""Every CPU matrix product goes through ``matmul`` here: Intel MKL's cblas
(the ``mkl`` wheel, ``pip install pyflow[mkl]``) or NumPy's BLAS (OpenBLAS in
its pip wheel), whichever this machine runs faster for the product's size.

Why two libraries, and why measured.  Neither wins everywhere, and where each
wins depends on the CPU.  MKL's call and thread start-up cost more, so on
small products OpenBLAS is up to 2-8x faster.  On a 2-core Intel Xeon MKL was
0-50% faster from about 2^26 flops up (a 256x256x512 product) and on stacks
of products from 2^24 (a GPT-2-small layer's 15 GEMMs 211 ms against
OpenBLAS's 233 ms, torch 208 ms).  On a 2-core AMD EPYC OpenBLAS was as fast
or faster on single products of every size (the same 15 GEMMs: 585 ms against
MKL's 737 ms), while MKL's one batched call still beat NumPy on stacks of
attention's per-head products (GPT-2's 96 heads of 128x128 @ 128x64: 2.5
against 4.0 ms, best times); the Xeon's thresholds cost GPT-2's DLPerf CPU preset 1.00x
PyTorch against 1.23x with OpenBLAS alone.  So under
``PYFLOW_BLAS=auto`` (the default) the thresholds are measured on the machine
at hand, by ``kernels/cpu/blas_tuning.py``: on the first product that could
go to MKL (float32/float64 matrices BLAS reads in place) when nothing valid is
cached, both libraries are timed on a grid of the GEMM shapes training runs
(about 1-2 s), and a single product takes MKL from ``min_flops`` up, a stack
of products (one batched MKL call against NumPy's loop) from
``min_stack_flops`` up; either may be "never", and with both never MKL is not
used at all.  The choice is cached per CPU model, MKL/NumPy/OpenBLAS version
and thread count, in ``$PYFLOW_CACHE_DIR`` (default ``~/.cache/pyflow``);
``python -m pyflow.kernels.cpu.blas --tune`` measures again, and
``python -m pyflow.kernels.cpu.blas`` or ``pyflow.backends.cpu.blas`` says what
was chosen and why.

Rounding.  Which library runs a product changes its last bits, never more.
The routing depends only on the product's shape and on thresholds read once
per process (from the cache, or the measurement that wrote it), so within a
process a shape always takes the same library, and processes on one machine
agree: they share the cache file, and a lock makes the ones that start
together wait for the first one's measurement.  Ranks on different machines
(another CPU model, another cache) or with other thread counts may choose
differently; where every rank must round alike, set ``PYFLOW_BLAS=mkl`` or
``numpy`` on all of them.

``PYFLOW_BLAS`` picks: ``auto`` (measured, as above; NumPy's BLAS, quietly,
when MKL is not installed), ``mkl`` (no measurement: MKL from the built-in
thresholds ``MKL_MIN_FLOPS`` and ``MKL_MIN_STACK_FLOPS`` up, the Xeon's;
an error when it is not installed) or ``numpy`` (NumPy's BLAS only).  Only
float32/float64 operands of one dtype whose matrices BLAS can read in place
(unit stride along rows or columns) can go to MKL; everything else (integers,
half precision, vectors, zero strides inside a matrix, empty shapes) takes
``np.matmul``, which is exact for them.  Mixing the two libraries is cheap
only while OpenBLAS's idle threads sleep at once (``OPENBLAS_THREAD_TIMEOUT``,
set by ``import pyflow`` when NumPy is not imported before it): spinning,
they slowed BERT's MKL GEMMs by 20%.

MKL is reached with ``ctypes`` (no compiled glue): ``cblas_?gemm`` for one
matrix, ``cblas_?gemm_batch`` with arrays of pointers for a stack, so any batch
strides (a head split out of a fused qkv projection, a broadcast operand)
become one call that MKL spreads over its threads.  Its threading layer is
GNU OpenMP, the runtime numba's ``omp`` layer already loaded, so the two share
one pool of threads instead of fighting for the cores.
"""
import ctypes
import ctypes.util
import glob
import math
import os
import sys

import numpy as np

from . import blas_tuning

_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112
_GNU_THREADS, _TBB_THREADS = 3, 4               # MKL_Set_Threading_Layer's codes
_INT_MAX = 2 ** 31 - 1                          # MKL's LP64 interface: 32-bit sizes
_CHOICES = ("auto", "mkl", "numpy")
# PYFLOW_BLAS=mkl's fixed rule (measured on a 2-core Xeon; see the module doc).
MKL_MIN_FLOPS = 1 << 26          # one product: MKL from here up
MKL_MIN_STACK_FLOPS = 1 << 24    # a stack of products, all of them together


def _candidates():
    """Where the ``mkl`` wheel puts libmkl_rt: the environment's lib/ (a venv's
    or the user base's), then the dynamic loader's search path."""
    import site
    prefixes = [sys.prefix, sys.base_prefix, getattr(site, "USER_BASE", None) or ""]
    for prefix in dict.fromkeys(p for p in prefixes if p):
        yield from sorted(glob.glob(os.path.join(prefix, "lib", "libmkl_rt.so*")), reverse=True)
    found = ctypes.util.find_library("mkl_rt")
    if found:
        yield found


class MKL:
    """The few MKL entry points pyflow calls, typed for ctypes."""

    def __init__(self, path):
        self.path = path
        lib = ctypes.CDLL(path)
        # Before the first MKL call.  GNU OpenMP is what numba's omp layer runs on;
        # without libgomp, MKL's TBB layer (the mkl wheel depends on tbb).
        layer = _GNU_THREADS if ctypes.util.find_library("gomp") else _TBB_THREADS
        lib.MKL_Set_Threading_Layer.argtypes = [ctypes.c_int]
        lib.MKL_Set_Threading_Layer(layer)
        i, p = ctypes.c_int, ctypes.c_void_p
        self.gemm, self.gemm_batch = {}, {}
        for dtype, prefix, scalar in ((np.float32, "s", ctypes.c_float),
                                      (np.float64, "d", ctypes.c_double)):
            fn = getattr(lib, f"cblas_{prefix}gemm")
            fn.restype = None
            fn.argtypes = [i, i, i, i, i, i, scalar, p, i, p, i, scalar, p, i]
            self.gemm[np.dtype(dtype)] = fn
            fn = getattr(lib, f"cblas_{prefix}gemm_batch")
            fn.restype = None
            fn.argtypes = [i] + [p] * 13 + [i, p]
            self.gemm_batch[np.dtype(dtype)] = fn
        buf = ctypes.create_string_buffer(256)
        lib.MKL_Get_Version_String.argtypes = [ctypes.c_char_p, ctypes.c_int]
        lib.MKL_Get_Version_String(buf, len(buf))
        self.version = buf.value.decode(errors="replace").strip()
        lib.MKL_Get_Max_Threads.restype = ctypes.c_int
        self.threads = lib.MKL_Get_Max_Threads()


class _Route:
    """Where products go, fixed once per process: ``mkl`` (None: NumPy only) and
    the flops from which a single product / a stack takes it (None: never)."""

    def __init__(self, lib, min_flops, min_stack_flops, why, **report):
        self.mkl = lib if (min_flops is not None or min_stack_flops is not None) else None
        self.min_flops, self.min_stack_flops = min_flops, min_stack_flops
        self.report = {"library": _library_words(self.mkl, min_flops, min_stack_flops),
                       "why": why,
                       "mkl_min_flops": blas_tuning.describe(min_flops if self.mkl else None),
                       "mkl_min_stack_flops": blas_tuning.describe(
                           min_stack_flops if self.mkl else None),
                       **report}


def _library_words(mkl, min_flops, min_stack_flops):
    if mkl is None:
        return "numpy"
    if min_flops == 0 and min_stack_flops == 0:
        return "mkl"
    return "mkl above the thresholds, numpy below"


_route = None


def _find_mkl():
    for path in _candidates():
        try:
            return MKL(path)
        except (OSError, AttributeError):
            continue
    return None


def _setting():
    choice = os.environ.get("PYFLOW_BLAS", "auto").strip().lower() or "auto"
    if choice not in _CHOICES:
        raise ValueError(f"PYFLOW_BLAS={choice!r}: expected one of {', '.join(_CHOICES)}")
    return choice


def _choose(retune=False):
    """Read ``PYFLOW_BLAS``, then the cache or a measurement: the process's _Route."""
    choice = _setting()
    setting = f"PYFLOW_BLAS={choice}"
    if choice == "numpy":
        return _Route(None, None, None, f"forced by {setting}", setting=setting, source="forced")
    mkl = _find_mkl()
    if mkl is None:
        if choice == "mkl":
            raise RuntimeError("PYFLOW_BLAS=mkl but MKL's libmkl_rt was not found; "
                               "install it with `pip install mkl` (or pyflow[mkl]), "
                               "or set PYFLOW_BLAS=auto")
        return _Route(None, None, None, "MKL is not installed (pip install mkl)",
                      setting=setting, source="no MKL")
    found = {"mkl": f"{mkl.version} ({mkl.path}), {mkl.threads} threads"}
    if choice == "mkl":
        return _Route(mkl, MKL_MIN_FLOPS, MKL_MIN_STACK_FLOPS,
                      f"forced by {setting}: the built-in thresholds, nothing measured",
                      setting=setting, source="forced", **found)
    entry, source, path = blas_tuning.choose(machine_key(mkl),
                                             lambda: blas_tuning.measure(_mkl_product(mkl)),
                                             retune=retune)
    why = ("measured on this machine" if source == "measured"
           else f"measured on {entry.get('measured_on', 'an earlier run')}, read from the cache")
    return _Route(mkl, entry["choice"]["min_flops"], entry["choice"]["min_stack_flops"],
                  why, setting=setting, source=source, cache=path, **found,
                  measure_seconds=entry.get("seconds"), cpu=entry["key"]["cpu"],
                  measured=blas_tuning.summary(entry.get("rows") or []))


def _routing():
    global _route
    if _route is None:
        _route = _choose()
    return _route


def machine_key(mkl):
    """What the measured choice depends on (the cache file is named by it)."""
    return blas_tuning.machine_key(mkl.version, mkl.threads)


def backend():
    """The BLAS in use: ``"mkl"`` (for products above the thresholds) or
    ``"numpy"`` (reads ``PYFLOW_BLAS``, and the cache or a measurement)."""
    return "mkl" if _routing().mkl is not None else "numpy"


def report():
    """What was chosen and why: library, thresholds, where it came from (the
    cache, a fresh measurement, a forced setting), the cache file and the
    measured times (``pyflow.backends.cpu.blas``)."""
    return dict(_routing().report)


def chosen():
    """Whether this process has chosen yet (``report()`` would not measure)."""
    return _route is not None


def mkl_min_flops():
    """Flops from which a single 2-D product may take MKL (inf: never)."""
    route = _routing()
    return route.min_flops if route.mkl is not None and route.min_flops is not None else math.inf


def reload():
    """Read ``PYFLOW_BLAS`` and the cache again on the next product (tests)."""
    global _route
    _route = None


def retune():
    """Measure again (``--tune``), rewrite the cache and route by the result;
    under a forced ``PYFLOW_BLAS`` this only reads the setting."""
    global _route
    _route = _choose(retune=True)
    return dict(_route.report)


def uses_mkl(a, b):
    """True when ``matmul(a, b)`` will run in MKL."""
    return _eligible(a, b) and _above(_routing(), a, b)


def _layout(x):
    """(transpose flag, leading dimension) for BLAS to read ``x``'s trailing
    matrix in place, row-major; None when it cannot."""
    item = x.itemsize
    s0, s1 = x.strides[-2], x.strides[-1]
    if s0 % item or s1 % item:
        return None
    s0, s1 = s0 // item, s1 // item
    rows, cols = x.shape[-2], x.shape[-1]
    if s1 == 1 and s0 >= cols:
        return _NO_TRANS, s0
    if s0 == 1 and s1 >= rows:
        return _TRANS, s1
    return None


def _eligible(a, b):
    """True when MKL could compute ``a @ b``: float32/float64 matrices of one
    dtype that BLAS reads in place (whatever their size)."""
    if a.dtype != b.dtype or a.dtype not in (np.float32, np.float64):
        return False
    if a.ndim < 2 or b.ndim < 2 or min(a.shape[-2:] + b.shape[-1:]) < 2:
        return False                # vectors and size-1 matrices: NumPy's GEMV/dot paths
    if max(a.shape[-2:] + b.shape[-1:]) > _INT_MAX or a.shape[-1] != b.shape[-2]:
        return False
    return _layout(a) is not None and _layout(b) is not None


def _batch_shape(a, b):
    """The broadcast batch dims of ``a @ b``; equal ones (the usual case, e.g.
    attention's heads) without np.broadcast_shapes, which costs ~10 us."""
    sa, sb = a.shape[:-2], b.shape[:-2]
    return sa if sa == sb else np.broadcast_shapes(sa, sb)


def _above(route, a, b):
    """True when an eligible ``a @ b`` is big enough for MKL by ``route``."""
    if route.mkl is None:
        return False
    flops = 2 * a.shape[-2] * a.shape[-1] * b.shape[-1]
    stack = 1
    if a.ndim > 2 or b.ndim > 2:
        stack = math.prod(_batch_shape(a, b))
    if stack > 1:
        return route.min_stack_flops is not None and flops * stack >= route.min_stack_flops
    return route.min_flops is not None and flops >= route.min_flops


def _gemm(lib, a, b, out):
    """out = a @ b, for 2-D operands."""
    m, k = a.shape
    n = b.shape[1]
    ta, lda = _layout(a)
    tb, ldb = _layout(b)
    lib.gemm[a.dtype](_ROW_MAJOR, ta, tb, m, n, k, 1.0, a.ctypes.data, lda,
                      b.ctypes.data, ldb, 0.0, out.ctypes.data, out.strides[0] // out.itemsize)


def _pointers(x, batch):
    """Addresses of every trailing matrix of ``x`` broadcast to ``batch`` dims."""
    view = np.broadcast_to(x, batch + x.shape[-2:])
    offsets = np.zeros((), np.int64)
    for size, stride in zip(batch, view.strides[:len(batch)]):
        offsets = np.add.outer(offsets, np.arange(size, dtype=np.int64) * stride)
    return (x.ctypes.data + offsets).ravel().astype(np.uint64)


def _gemm_batch(lib, a, b, out, batch):
    m, k = a.shape[-2:]
    n = b.shape[-1]
    ta, lda = _layout(a)
    tb, ldb = _layout(b)
    c = out.reshape((-1, m, n))
    count = c.shape[0]
    pa, pb = _pointers(a, batch), _pointers(b, batch)
    pc = (c.ctypes.data + np.arange(count, dtype=np.uint64) * np.uint64(c.strides[0]))
    ints = np.array([ta, tb, m, n, k, lda, ldb, n, count], np.int32)
    scalars = np.array([1.0, 0.0], a.dtype)
    addr = ints.ctypes.data
    isz, ssz = ints.itemsize, scalars.itemsize
    lib.gemm_batch[a.dtype](_ROW_MAJOR, addr, addr + isz, addr + 2 * isz, addr + 3 * isz,
                            addr + 4 * isz, scalars.ctypes.data, pa.ctypes.data,
                            addr + 5 * isz, pb.ctypes.data, addr + 6 * isz,
                            scalars.ctypes.data + ssz, pc.ctypes.data, addr + 7 * isz,
                            1, addr + 8 * isz)


def _mkl_product(lib):
    """``f(a, b, out)``: an eligible product into a C-contiguous ``out``, in MKL
    whatever its size (what the measurement times)."""
    def product(a, b, out):
        batch = _batch_shape(a, b)
        if batch:
            _gemm_batch(lib, a, b, out, batch)
        else:
            _gemm(lib, a, b, out)
    return product


def matmul(a, b, out=None):
    """``np.matmul(a, b, out=out)`` computed by MKL where it is routed (see the
    module doc), by NumPy otherwise.  ``out``, when given, must be C-contiguous."""
    if out is not None and a.ndim >= 2 and b.ndim >= 2:
        shape = _batch_shape(a, b) + (a.shape[-2], b.shape[-1])
        if out.shape != shape or out.dtype != np.result_type(a, b):
            raise ValueError(f"matmul: out has shape {out.shape} and dtype {out.dtype}; "
                             f"expected {shape} and {np.result_type(a, b)}")
    if (out is not None and not out.flags.c_contiguous) or not _eligible(a, b) or \
            not _above(_routing(), a, b):
        return np.matmul(a, b) if out is None else np.matmul(a, b, out=out)
    lib = _route.mkl
    batch = _batch_shape(a, b)
    if out is None:
        out = np.empty(batch + (a.shape[-2], b.shape[-1]), a.dtype)
    if not batch:
        _gemm(lib, a, b, out)
    elif math.prod(batch) > _INT_MAX:
        np.matmul(a, b, out=out)
    elif out.size:
        _gemm_batch(lib, a, b, out, batch)
    return out


def main(argv=None):
    """``python -m pyflow.kernels.cpu.blas [--tune]`` (see blas_tuning.main)."""
    return blas_tuning.main(argv, report, retune)


if __name__ == "__main__":
    # Run by -m, this file is a second copy of the module (__main__); the choice
    # belongs to the imported one, which pyflow's kernels use.
    from pyflow.kernels.cpu import blas as _blas
    sys.exit(_blas.main())
