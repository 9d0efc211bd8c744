"""Global-norm gradient clipping on the GPU: the twin of ``kernels/cpu/grad_norm.py``
(same argument rules, same values up to the order of float64 additions).

``multi_tensor_norm``: one launch per array, each block reducing its grid-stride
share in float64 and writing one partial into its own slot of a device array of
partials (no float atomics); a last one-block kernel reduces the partials in slot
order, and only that float64 is copied to the host.  Launch shapes depend on the
sizes only, so a norm is the same on every run (deterministic), though not bit
for bit the CPU's (another summation order).
``multi_tensor_scale``: one launch per array, ``x[i] * coef`` with ``coef``
rounded to the array's dtype, as ``mul_`` by a Python float does.

float16 and non-contiguous arrays are reduced from a contiguous float32 (or own
dtype) copy and scaled in one that is copied back, float16 rounding once as
ATen's opmath does.  bfloat16: the caller passes float32 values, as on the CPU.
"""

import numpy as np
from numba import cuda, float64

from ..cpu.grad_norm import (MAX_ABS, SUM_ABS, SUM_SQUARES, check_call, dtype_error, finish,
                             norm_mode, scale_coef)
from ..registry import register
from .amp import described_floats
from ._memory import MAX_BLOCKS, launch_config, simulated, stream, to_host, zeros
from .copy import copy_into, flat, is_contiguous

_FAST = (np.dtype(np.float32), np.dtype(np.float64))
REDUCE_THREADS = 256       # a power of two: the shared-memory tree halves it
MAX_PARTIALS = 1024        # blocks (partials) per array at most


@cuda.jit(device=True)
def _combine(a, b, mode):
    """Two partials as one: a sum, or a max that keeps a NaN."""
    if mode != MAX_ABS:
        return a + b
    if a != a:
        return a
    if b != b or b > a:
        return b
    return a


@cuda.jit(device=True)
def _block_reduce(v, sh, mode):
    """``v`` of every thread of the block combined in a fixed tree order; the
    result in thread 0 (blockDim.x a power of two <= REDUCE_THREADS)."""
    tid = cuda.threadIdx.x
    sh[tid] = v
    cuda.syncthreads()
    half = cuda.blockDim.x // 2
    while half > 0:
        if tid < half:
            sh[tid] = _combine(sh[tid], sh[tid + half], mode)
        cuda.syncthreads()
        half //= 2
    return sh[0]


@cuda.jit
def _norm_partials_kernel(x, mode, partials, offset):
    """partials[offset + block] = the mode's float64 reduction of the block's
    grid-stride share of ``x``."""
    sh = cuda.shared.array(REDUCE_THREADS, float64)
    acc = float64(0.0)
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        v = float64(x[i])
        if mode == SUM_SQUARES:
            acc += v * v
        else:
            v = abs(v)
            if mode == SUM_ABS:
                acc += v
            else:
                acc = _combine(acc, v, mode)
    total = _block_reduce(acc, sh, mode)
    if cuda.threadIdx.x == 0:
        partials[offset + cuda.blockIdx.x] = total


@cuda.jit
def _reduce_partials_kernel(partials, mode, out):
    """out[0] = every partial combined (one block, a fixed order)."""
    sh = cuda.shared.array(REDUCE_THREADS, float64)
    acc = float64(0.0)
    for i in range(cuda.threadIdx.x, partials.size, cuda.blockDim.x):
        acc = _combine(acc, partials[i], mode)
    total = _block_reduce(acc, sh, mode)
    if cuda.threadIdx.x == 0:
        out[0] = total


@cuda.jit
def _scale_kernel(x, coef):
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        x[i] = x[i] * coef


def kernel_specs():
    """The kernels as (label, plain Python function, numba signature) per dtype
    they run on (float16 arrays run in a float32 copy), for the PTX tests.  The
    norm kernels accumulate in float64 on purpose: their labels say "f32 data"
    rather than "float32", which promises no float64 instruction."""
    from numba import types
    specs = []
    for name, t in (("f32 data", types.float32), ("float64", types.float64)):
        specs.append((f"multi_tensor_norm partials {name}", _norm_partials_kernel.py_func,
                      (types.Array(t, 1, "C"), types.int64, types.Array(types.float64, 1, "C"),
                       types.int64)))
    specs.append(("multi_tensor_norm reduce partials float64", _reduce_partials_kernel.py_func,
                  (types.Array(types.float64, 1, "C"), types.int64,
                   types.Array(types.float64, 1, "C"))))
    for name, t in (("float32", types.float32), ("float64", types.float64)):
        specs.append((f"multi_tensor_scale {name}", _scale_kernel.py_func,
                      (types.Array(t, 1, "C"), t)))
    return specs


def _reduce_config(n):
    """(blocks, threads) of a partials launch: the threads a power of two."""
    threads = 32 if simulated() else REDUCE_THREADS
    blocks = launch_config(n, threads)[0]
    return max(1, min(blocks, MAX_PARTIALS, MAX_BLOCKS)), threads


def _described(op, arrays):
    """[(array, element count, dtype)], checked."""
    return described_floats(op, arrays, "arrays", dtype_error)


@register("multi_tensor_norm", "cuda")
def multi_tensor_norm(arrays, norm_type=2.0):
    """The ``norm_type``-norm (1, 2 or inf) of all elements of the device arrays
    ``arrays``, as a Python float computed in float64; 0.0 for no elements."""
    op = "multi_tensor_norm"
    check_call(op, arrays)
    mode = norm_mode(op, norm_type)
    jobs = [(a, n, dtype, _reduce_config(n)) for a, n, dtype in _described(op, arrays) if n]
    if not jobs:
        return 0.0
    partials = zeros(sum(blocks for *_, (blocks, _) in jobs), np.float64)
    offset = 0
    for a, n, dtype, (blocks, threads) in jobs:
        x = flat(a) if dtype in _FAST else flat(a, np.float32)
        _norm_partials_kernel[blocks, threads, stream()](x, mode, partials, offset)
        offset += blocks
    out = zeros(1, np.float64)
    _reduce_partials_kernel[1, 32 if simulated() else REDUCE_THREADS, stream()](
        partials, mode, out)
    return finish(float(to_host(out)[0]), mode)


@register("multi_tensor_scale", "cuda")
def multi_tensor_scale(arrays, coef):
    """Multiply every device array of ``arrays`` in place by ``coef`` in the
    array's dtype (float16 through float32), as ``mul_`` by a Python float does."""
    op = "multi_tensor_scale"
    check_call(op, arrays)
    coef = scale_coef(op, coef)
    for a, n, dtype in _described(op, arrays):
        if n == 0:
            continue
        work_dtype = dtype if dtype in _FAST else np.dtype(np.float32)
        in_place = dtype in _FAST and is_contiguous(a)
        work = flat(a) if in_place else flat(a, work_dtype)
        blocks, threads = launch_config(n)
        _scale_kernel[blocks, threads, stream()](work, work_dtype.type(coef))
        if not in_place:
            copy_into(a, work.reshape(a.shape))
