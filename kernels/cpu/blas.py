"""Every CPU matrix product goes through ``matmul`` here: Intel MKL's cblas
when the ``mkl`` wheel is installed (``pip install pyflow[mkl]``), NumPy's
BLAS (OpenBLAS in its pip wheel) otherwise.

Why a second BLAS.  On the same GEMM shapes OpenBLAS trails MKL, the BLAS
PyTorch's CPU build uses: the 15 GEMM shapes of a GPT-2-small layer and its
head take 233 ms in OpenBLAS 0.3.31 against 211 ms in MKL 2026.2 (torch 2.13:
208 ms), and attention's stacked per-head products (GPT-mini, 128x64 matrices)
42 ms against torch's 17 ms (measured on this 2-core Xeon; bench/gemm.py
prints the comparison).  A GEMM is not pyflow's subject; a well-kept BLAS is
the right tool, and choosing the faster one makes the comparison with PyTorch
one of frameworks, not of BLAS libraries.

Neither BLAS wins everywhere.  MKL's call and thread start-up cost more, so
below about 2^26 flops (a 256x256x512 product) OpenBLAS is up to 2-8x faster,
and from about 2^27 up MKL is 0-50% faster (a grid of 64 shapes, each library
in its own process, pyflow imported first).  So a single product takes MKL
from ``MKL_MIN_FLOPS`` up, and a stack of products (one batched MKL call
against a loop of OpenBLAS calls) from ``MKL_MIN_STACK_FLOPS``.  The rule
depends only on shapes, so every rank and every run makes the same choice and
rounds alike.  Mixing the two is cheap only while OpenBLAS's idle threads
sleep at once (``OPENBLAS_THREAD_TIMEOUT``, set by ``import pyflow`` when
NumPy is not imported before it): spinning, they slowed BERT's MKL GEMMs by
20%.

MKL is reached with ``ctypes`` (no compiled glue): ``cblas_?gemm`` for one
matrix, ``cblas_?gemm_batch`` with arrays of pointers for a stack, so any batch
strides (a head split out of a fused qkv projection, a broadcast operand)
become one call that MKL spreads over its threads.  Its threading layer is
GNU OpenMP, the runtime numba's ``omp`` layer already loaded, so the two share
one pool of threads instead of fighting for the cores.

``PYFLOW_BLAS`` picks: ``auto`` (the default: MKL when found), ``mkl`` (an
error when it is not installed) or ``numpy``.  Only float32/float64 operands
of one dtype whose matrices BLAS can read in place (unit stride along rows or
columns) go to MKL; everything else (integers, half precision, vectors, zero
strides inside a matrix, empty shapes) takes ``np.matmul``, which is exact for
them.
"""
import ctypes
import ctypes.util
import glob
import os
import sys

import numpy as np

_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112
_GNU_THREADS, _TBB_THREADS = 3, 4               # MKL_Set_Threading_Layer's codes
_INT_MAX = 2 ** 31 - 1                          # MKL's LP64 interface: 32-bit sizes
_CHOICES = ("auto", "mkl", "numpy")
MKL_MIN_FLOPS = 1 << 26          # one product: MKL from here up (see the module doc)
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


_mkl = None
_mkl_loaded = False


def backend():
    """The BLAS in use: ``"mkl"`` or ``"numpy"`` (reads ``PYFLOW_BLAS``)."""
    return "mkl" if _library() is not None else "numpy"


def reload():
    """Read ``PYFLOW_BLAS`` again on the next product (tests switch backends)."""
    global _mkl, _mkl_loaded
    _mkl, _mkl_loaded = None, False


def _library():
    global _mkl, _mkl_loaded
    if _mkl_loaded:
        return _mkl
    choice = os.environ.get("PYFLOW_BLAS", "auto").strip().lower() or "auto"
    if choice not in _CHOICES:
        raise ValueError(f"PYFLOW_BLAS={choice!r}: expected one of {', '.join(_CHOICES)}")
    if choice != "numpy":
        for path in _candidates():
            try:
                _mkl = MKL(path)
                break
            except (OSError, AttributeError):
                continue
        if _mkl is None and choice == "mkl":
            raise RuntimeError("PYFLOW_BLAS=mkl but MKL's libmkl_rt was not found; "
                               "install it with `pip install mkl` (or pyflow[mkl]), "
                               "or set PYFLOW_BLAS=auto")
    _mkl_loaded = True
    return _mkl


def uses_mkl(a, b):
    """True when ``matmul(a, b)`` will run in MKL."""
    return _library() is not None and _mkl_ready(a, b)


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


def _mkl_ready(a, b):
    """True when ``a @ b`` goes to MKL: float32/float64 matrices BLAS reads in
    place, big enough that MKL is the faster (see the module doc)."""
    if a.dtype != b.dtype or a.dtype not in (np.float32, np.float64):
        return False
    if a.ndim < 2 or b.ndim < 2 or min(a.shape[-2:] + b.shape[-1:]) < 2:
        return False                # vectors and size-1 matrices: NumPy's GEMV/dot paths
    if max(a.shape[-2:] + b.shape[-1:]) > _INT_MAX or a.shape[-1] != b.shape[-2]:
        return False
    flops = 2 * a.shape[-2] * a.shape[-1] * b.shape[-1]
    if a.ndim > 2 or b.ndim > 2:
        stack = int(np.prod(np.broadcast_shapes(a.shape[:-2], b.shape[:-2])))
        if stack > 1 and flops * stack < MKL_MIN_STACK_FLOPS:
            return False
        if stack == 1 and flops < MKL_MIN_FLOPS:
            return False
    elif flops < MKL_MIN_FLOPS:
        return False
    return _layout(a) is not None and _layout(b) is not None


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


def matmul(a, b, out=None):
    """``np.matmul(a, b, out=out)`` computed by MKL where it can (see the module
    doc), by NumPy otherwise.  ``out``, when given, must be C-contiguous."""
    if out is not None and a.ndim >= 2 and b.ndim >= 2:
        shape = np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1])
        if out.shape != shape or out.dtype != np.result_type(a, b):
            raise ValueError(f"matmul: out has shape {out.shape} and dtype {out.dtype}; "
                             f"expected {shape} and {np.result_type(a, b)}")
    lib = _library()
    if lib is None or not _mkl_ready(a, b) or (out is not None and not out.flags.c_contiguous):
        return np.matmul(a, b) if out is None else np.matmul(a, b, out=out)
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    if out is None:
        out = np.empty(batch + (a.shape[-2], b.shape[-1]), a.dtype)
    if not batch:
        _gemm(lib, a, b, out)
    elif int(np.prod(batch)) > _INT_MAX:
        np.matmul(a, b, out=out)
    elif out.size:
        _gemm_batch(lib, a, b, out, batch)
    return out
