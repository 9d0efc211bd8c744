"""GEMM on the CPU: a BLAS (blas.py routes each product to MKL, when installed,
or NumPy's OpenBLAS, by a measurement of this machine).  A hand-written numba GEMM cannot match a tuned BLAS on the CPU;
the numba.cuda tiled GEMM is where pyflow writes its own.

A transposed 2-D view goes to BLAS with its ``trans`` flag instead of being
copied, so ``x @ weight.T`` and ``grad.T @ x`` cost no copy.
Operands BLAS cannot take (a zero stride from ``expand``, or no unit stride)
are copied first: NumPy's own fallback loop for them is 5-10x slower than the
copy plus BLAS (measured: an expanded (2048, 256) gradient @ (256, 1024), 9 ms).

Batches of small matrices (attention's per-head products) are where OpenBLAS
is weakest: every matrix is one multi-threaded GEMM call whose thread hand-off
costs as much as the arithmetic.  There the batch is split across worker
threads, each running single-threaded BLAS (threadpoolctl sets OpenBLAS to one
thread for the duration; measured 2.4 ms -> 0.7 ms for 64 x (128x64 @ 64x128)).
MKL needs no such help: its batched GEMM takes the whole stack in one call.
"""
import math
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from numba import prange

from ..registry import register
from .twin import twin
from . import blas
from .activation import PARALLEL_MIN

_WORKERS = max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
               else os.cpu_count() or 1)
SMALL_GEMM_FLOPS = 1 << 24      # per matrix; above this BLAS's own threads pay off
# A whole stack below this many flops is one np.matmul call: handing halves to the
# pool (threadpoolctl's limit, futures) costs ~100 us, more than the product itself.
# Measured (AMD EPYC 2 cores, 2026-12-03, loaded machine): a GPT-64 attention
# product (8, 4, 32, 16) @ (8, 4, 16, 32), 1.0e6 flops: 24 us plain, 126-129 us
# split; at 8.4e6 flops 139-161 against 290-301 us; GPT-mini's (16, 4, 128, 64) @
# (16, 4, 64, 128), 1.3e8 flops: 10.7 ms plain, 2.0 ms split.
STACK_SPLIT_MIN_FLOPS = 1 << 23
_pool = _controller = None


def _blas_ready(x):
    """True when BLAS can read ``x``'s trailing matrices without a copy."""
    if x.ndim < 2:
        return True
    s0, s1 = x.strides[-2], x.strides[-1]
    item = x.itemsize
    return (s1 == item and s0 >= item * x.shape[-1]) or (s0 == item and s1 >= item * x.shape[-2])


def _single_thread_blas():
    global _controller
    if _controller is None:
        from threadpoolctl import ThreadpoolController
        _controller = ThreadpoolController()
    return _controller.limit(limits=1, user_api="blas")


def _batched_small(a, b, out=None):
    """Split a broadcast-free stacked product over worker threads, along the
    first batch dim (views, no copy) or, when that is too short, the merged batch;
    into ``out`` (C-contiguous, the result's shape) when given."""
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(_WORKERS - 1, thread_name_prefix="pyflow-gemm")
    batch = a.shape[:-2]
    if a.shape[0] < _WORKERS:
        a, b = a.reshape((-1,) + a.shape[-2:]), b.reshape((-1,) + b.shape[-2:])
    shape = a.shape[:-1] + b.shape[-1:]
    out = np.empty(shape, np.result_type(a, b)) if out is None else out.reshape(shape)
    bounds = np.linspace(0, a.shape[0], _WORKERS + 1).astype(int)
    with _single_thread_blas():
        futures = [_pool.submit(np.matmul, a[lo:hi], b[lo:hi], out=out[lo:hi])
                   for lo, hi in zip(bounds[1:-1], bounds[2:])]
        np.matmul(a[:bounds[1]], b[:bounds[1]], out=out[:bounds[1]])
        for f in futures:
            f.result()
    return out.reshape(batch + out.shape[-2:])


@register("matmul", "cpu")
def matmul(a, b, out=None):
    """(..., n, k) @ (..., k, m) with NumPy's batch broadcasting; 1-D x 1-D is a dot.
    ``out``: a C-contiguous array of the result's shape and dtype to write into
    (a compiled graph's pre-allocated buffer)."""
    if not (a.flags.c_contiguous or _blas_ready(a)):      # the flag first: ~0.5 us less
        a = np.ascontiguousarray(a)
    if not (b.flags.c_contiguous or _blas_ready(b)):
        b = np.ascontiguousarray(b)
    if out is None and a.ndim == 2 and b.ndim == 2 and \
            2 * a.shape[0] * a.shape[1] * b.shape[1] < blas.mkl_min_flops():
        # What blas.matmul does below MKL's size, without its checks.  On operands
        # BLAS reads in place, np.dot is NumPy's 2-D product through the same BLAS
        # call as np.matmul (bit-identical, tests/kernels/test_cpu_matmul.py) with
        # ~0.6 us less dispatch: a fifth of a 16x16 eager matmul.
        return np.dot(a, b)
    if (not blas.uses_mkl(a, b) and _WORKERS > 1 and a.ndim >= 3
            and a.shape[:-2] == b.shape[:-2]
            and 2 * a.shape[-2] * a.shape[-1] * b.shape[-1] < SMALL_GEMM_FLOPS
            and math.prod(a.shape[:-2]) >= 2 * _WORKERS
            and 2 * a.size * b.shape[-1] >= STACK_SPLIT_MIN_FLOPS
            and (out is None or out.flags.c_contiguous)):
        return _batched_small(a, b, out)
    if out is not None:
        return blas.matmul(a, b, out=out)
    return np.asarray(blas.matmul(a, b))


@twin(nogil=True, cache=True)
def _add_rows(out, bias):
    """out[i, :] += bias for every row, the rows split over the threads."""
    for i in prange(out.shape[0]):
        for j in range(out.shape[1]):
            out[i, j] += bias[j]


@register("linear", "cpu")
def linear(x, weight, bias, out=None):
    """x (M, K) @ weight (N, K).T + bias (N,): one GEMM, bias added in place;
    into ``out`` (C-contiguous, (M, N)) when given."""
    if not _blas_ready(x):
        x = np.ascontiguousarray(x)
    out = blas.matmul(x, weight.T, out=out)
    if bias is not None:
        # After the GEMM, not written first for the GEMM to add to (beta=1, as
        # PyTorch's addmm): measured 3.6 against 4.1 ms a call for 2048x256 @
        # 256x1024.  Big outputs on every core: NumPy's add is one thread
        # (after a GPT-mini GEMM, 2048x1024: 0.35 -> 0.24 ms).
        if out.ndim == 2 and out.size >= PARALLEL_MIN and bias.dtype == out.dtype and \
                out.flags.c_contiguous and out.dtype in (np.float32, np.float64):
            _add_rows(out, bias)
        else:
            out += bias
    return out
