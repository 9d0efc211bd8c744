"""GEMM on the GPU: a tiled numba.cuda kernel (and cuBLAS through CuPy on request).

The kernel (``gemm_function``) is the classic shared-memory SGEMM:

* a thread block computes one ``BM x BN`` tile of C.  It walks K in steps of
  ``BK``: the block's threads copy the ``BM x BK`` slice of A and the
  ``BK x BN`` slice of B into shared memory (zeros past the matrix edges, so
  any M, N, K works), synchronise, and every thread multiplies from shared
  memory into its own ``TM x TN`` register block (``cuda.local.array``);
* a thread's share of the next slices is loaded into registers whole, right
  after the shared tiles are published and before the products begin, so
  those global loads are in flight while it multiplies (one tile of
  prefetch: ``BM*BK/threads + BK*BN/threads`` registers);
* register budget: launch bounds of (threads, 2 blocks per multiprocessor)
  hold ptxas to 128 registers a thread, and the index math is written so it
  fits without spilling: thread positions are unsigned (numba's signed ``//``,
  ``%`` round toward -inf and every signed array index is checked for
  wraparound, each costing selects and live registers), and global element
  indices are 32-bit unless an operand spans 2^32 elements.  ptxas -v for
  sm_90 says 96-128 registers and no spills for every production variant
  (docs/cuda.md has the table; tests/kernels/test_cuda_linalg_conv_ptx.py
  checks it);
* shared tiles are stored k-major with rows padded by 4 words, so storing a
  k-contiguous operand (row-major A, ``linear``'s transposed weight) hits
  distinct banks;
* a thread's outputs are interleaved (rows ``ty + i*BM/TM``, columns
  ``tx + j*BN/TN``): neighbouring threads read neighbouring shared-memory words
  (no bank conflicts) and write neighbouring words of C (coalesced stores);
* every operand is "a 1-D span + element strides": A's element (m, k) is
  ``a[off + m*rs + k*cs + batch offset]``.  Transposed views are just other
  strides (no copy); which of A's/B's dims is the unit-stride one only picks
  how threads map onto a tile while loading, so global loads stay coalesced
  (a compile-time flag per operand);
* batches run along grid z; each batch index is unravelled over the
  (coalesced) batch shape and dotted with each operand's batch strides, 0 on
  broadcast dims, so NumPy's batch broadcasting costs no copy;
* an optional epilogue operand D (same span + strides form) is added before
  the store: ``linear``'s bias (strides (0, 1)) and conv2d's bias (strides
  (1, 0)) are fused into the GEMM;
* accumulation is in float32 for float16/float32, float64 for float64,
  int64 for integers.

Tile sizes are parameters (``Tile``): production uses 128x128x8 with 8x8
outputs per thread for big products and 64x64x16 with 4x4 for small ones
(more blocks to fill the GPU); the simulator, which runs one OS thread per
CUDA thread, uses 16x16x8 with 4x4 (16 threads).  Kernels are compiled lazily
per (dtype, tile, load layouts, bias) and cached.  Row tiles run along grid x,
column tiles along grid y (at most 65535 of them: beyond that the launch
computes C^T = B^T A^T, i.e. swaps operands and strides).

``pyflow.backends.cuda.matmul = "cublas"`` routes ``matmul`` and ``linear``
to ``cupy.matmul`` (cuBLAS) on a real GPU; under the simulator it raises.
"""
from collections import namedtuple

import numpy as np
from numba import cuda
from numba import types as nbtypes

from ..settings import cuda as _settings
from ..registry import register
from ._memory import empty, launch_config, simulated, stream
from . import layout

Tile = namedtuple("Tile", "BM BN BK TM TN")
LARGE_TILE = Tile(128, 128, 8, 8, 8)      # 256 threads, 64 outputs each
SMALL_TILE = Tile(64, 64, 16, 4, 4)       # 256 threads, 16 outputs each
SIM_TILE = Tile(16, 16, 8, 4, 4)          # 16 threads: cheap in the simulator
MAX_GRID_Y = MAX_GRID_Z = 65535      # row tiles go along grid x (2^31 - 1 blocks)

_ACC = {np.dtype(np.float16): np.float32, np.dtype(np.float32): np.float32,
        np.dtype(np.float64): np.float64, np.dtype(np.int32): np.int64,
        np.dtype(np.int64): np.int64}
DTYPES = tuple(_ACC)
_NUMBA = {np.dtype(np.float16): nbtypes.float16, np.dtype(np.float32): nbtypes.float32,
          np.dtype(np.float64): nbtypes.float64, np.dtype(np.int32): nbtypes.int32,
          np.dtype(np.int64): nbtypes.int64}


def check_tile(tile):
    tile = Tile(*tile)
    if tile.BM % tile.TM or tile.BN % tile.TN:
        raise ValueError(f"tile {tile}: BM must be a multiple of TM and BN of TN")
    threads = (tile.BM // tile.TM) * (tile.BN // tile.TN)
    if threads > 1024:
        raise ValueError(f"tile {tile} needs {threads} threads per block (at most 1024)")
    return tile


# ------------------------------------------------------------------ the kernel
def gemm_function(dtype, tile, a_k_contiguous=True, b_n_contiguous=True, has_bias=False,
                  wide_index=False):
    """The plain Python GEMM kernel (not yet ``cuda.jit``-ed) for ``dtype`` and ``tile``.

    Arguments of the kernel (``lay`` = element offset, row stride, column
    stride, then one stride per batch dim)::

        gemm(c, c_lay, a, a_lay, b, b_lay, d, d_lay, M, N, K, batch_shape)

    computes ``C[z] = A[z] @ B[z] (+ D[z])`` for every batch index z.  With
    ``wide_index`` False, A's and B's element indices must fit 32 bits.
    """
    BM, BN, BK, TM, TN = check_tile(tile)
    TX, TY = BN // TN, BM // TM              # threads along a row / a column of the tile
    THREADS = TX * TY
    A_SIZE, B_SIZE = BM * BK, BK * BN
    LA, LB = -(-A_SIZE // THREADS), -(-B_SIZE // THREADS)   # elements a thread loads per tile
    A_EXACT, B_EXACT = A_SIZE % THREADS == 0, B_SIZE % THREADS == 0
    # Tiles are stored k-major; a row padded by 4 words moves consecutive k of one
    # row (how a k-contiguous operand is loaded) to different banks.
    A_ROW, B_ROW = BM + 4, BN + 4
    acc_t = _ACC[np.dtype(dtype)]
    A_K_CONTIG, B_N_CONTIG, HAS_BIAS = bool(a_k_contiguous), bool(b_n_contiguous), bool(has_bias)
    u64, i64 = np.uint64, np.int64
    zero = acc_t(0)
    # Global element indices in 32 bits (half the registers of 64-bit ones), unless
    # an operand spans 2^32 elements or more (``wide_index``, chosen at launch).
    idx = np.uint64 if wide_index else np.uint32

    # Index math on thread positions is unsigned: numba's signed // and % round
    # toward -inf (extra selects per use), and a signed index is checked for
    # wraparound at every array access (one more select and a live register).
    @cuda.jit(device=True, inline="always")
    def a_slot(tid, s):
        """(m, k) in the A tile of this thread's load ``s`` (``tid`` unsigned):
        consecutive threads take consecutive addresses of the unit-stride dim."""
        e = tid + u64(s * THREADS)
        if A_K_CONTIG:
            return e // u64(BK), e % u64(BK)
        return e % u64(BM), e // u64(BM)

    @cuda.jit(device=True, inline="always")
    def b_slot(tid, s):
        """(k, n) in the B tile of this thread's load ``s``."""
        e = tid + u64(s * THREADS)
        if B_N_CONTIG:
            return e // u64(BN), e % u64(BN)
        return e % u64(BK), e // u64(BK)

    @cuda.jit(device=True, inline="always")
    def load_tiles(a, pa, a_rs, a_cs, b, pb, b_rs, b_cs, m0, n0, k0, M, N, K, tid,
                   a_next, b_next):
        """This thread's elements of the A and B tiles at ``k0`` into registers
        (zeros past the matrix edges, so any M, N, K works)."""
        for s in range(LA):
            if A_EXACT or tid + u64(s * THREADS) < u64(A_SIZE):
                mm, kk = a_slot(tid, s)
                gm = m0 + i64(mm)
                gk = k0 + i64(kk)
                a_next[s] = a[idx(pa + gm * a_rs + gk * a_cs)] if gm < M and gk < K else zero
        for s in range(LB):
            if B_EXACT or tid + u64(s * THREADS) < u64(B_SIZE):
                kk, nn = b_slot(tid, s)
                gn = n0 + i64(nn)
                gk = k0 + i64(kk)
                b_next[s] = b[idx(pb + gk * b_rs + gn * b_cs)] if gn < N and gk < K else zero

    @cuda.jit(device=True, inline="always")
    def batch_offsets(z, batch_shape, x_lay, y_lay):
        """Element offsets of batch ``z`` in two operands: z unravelled over the
        batch shape, dotted with each layout's batch strides.  (A and B's before
        the products, C and D's after: the C/D offsets are not live in the loop.)"""
        px = x_lay[0]
        py = y_lay[0]
        rem = z
        for t in range(len(batch_shape) - 1, -1, -1):
            q = rem // batch_shape[t]
            j = rem - q * batch_shape[t]
            rem = q
            px += j * x_lay[3 + t]
            py += j * y_lay[3 + t]
        return px, py

    def gemm(c, c_lay, a, a_lay, b, b_lay, d, d_lay, M, N, K, batch_shape):
        As = cuda.shared.array((BK, A_ROW), acc_t)
        Bs = cuda.shared.array((BK, B_ROW), acc_t)
        acc = cuda.local.array((TM, TN), acc_t)
        a_reg = cuda.local.array(TM, acc_t)
        b_reg = cuda.local.array(TN, acc_t)
        a_next = cuda.local.array(LA, acc_t)
        b_next = cuda.local.array(LB, acc_t)
        tid = u64(cuda.threadIdx.x)
        a_col = tid // u64(TX)            # this thread's first row and column in the tile
        b_col = tid % u64(TX)
        ty = i64(a_col)
        tx = i64(b_col)
        m0 = cuda.blockIdx.x * BM
        n0 = cuda.blockIdx.y * BN
        n_batch = 1
        for s in batch_shape:
            n_batch *= s
        for z in range(cuda.blockIdx.z, n_batch, cuda.gridDim.z):
            pa, pb = batch_offsets(z, batch_shape, a_lay, b_lay)
            for i in range(TM):
                for j in range(TN):
                    acc[i, j] = 0
            load_tiles(a, pa, a_lay[1], a_lay[2], b, pb, b_lay[1], b_lay[2],
                       m0, n0, 0, M, N, K, tid, a_next, b_next)
            for k0 in range(0, K, BK):
                # the tile loaded (during the previous tile's products) -> shared
                for s in range(LA):
                    if A_EXACT or tid + u64(s * THREADS) < u64(A_SIZE):
                        mm, kk = a_slot(tid, s)
                        As[kk, mm] = a_next[s]
                for s in range(LB):
                    if B_EXACT or tid + u64(s * THREADS) < u64(B_SIZE):
                        kk, nn = b_slot(tid, s)
                        Bs[kk, nn] = b_next[s]
                cuda.syncthreads()
                if k0 + BK < K:           # next tile's loads in flight while we multiply
                    load_tiles(a, pa, a_lay[1], a_lay[2], b, pb, b_lay[1], b_lay[2],
                               m0, n0, k0 + BK, M, N, K, tid, a_next, b_next)
                for kk in range(BK):
                    row = u64(kk)
                    for i in range(TM):
                        a_reg[i] = As[row, a_col + u64(i * TY)]
                    for j in range(TN):
                        b_reg[j] = Bs[row, b_col + u64(j * TX)]
                    for i in range(TM):
                        for j in range(TN):
                            acc[i, j] += a_reg[i] * b_reg[j]
                cuda.syncthreads()
            pc, pd = batch_offsets(z, batch_shape, c_lay, d_lay)     # epilogue: (+ D), store
            for i in range(TM):
                gm = m0 + ty + i * TY
                if gm < M:
                    for j in range(TN):
                        gn = n0 + tx + j * TX
                        if gn < N:
                            v = acc[i, j]
                            if HAS_BIAS:
                                v += d[pd + gm * d_lay[1] + gn * d_lay[2]]
                            c[pc + gm * c_lay[1] + gn * c_lay[2]] = v

    gemm.__name__ = (f"gemm_{np.dtype(dtype).name}_{BM}x{BN}x{BK}_{TM}x{TN}"
                     f"_{'k' if A_K_CONTIG else 'm'}{'n' if B_N_CONTIG else 'k'}"
                     f"{'_bias' if HAS_BIAS else ''}")
    return gemm


def gemm_signature(dtype, batch_dims=1):
    """numba argument types of the GEMM kernel with ``batch_dims`` batch dims."""
    arr = _NUMBA[np.dtype(dtype)][::1]
    lay = nbtypes.UniTuple(nbtypes.int64, 3 + batch_dims)
    i64 = nbtypes.int64
    return (arr, lay, arr, lay, arr, lay, arr, lay, i64, i64, i64,
            nbtypes.UniTuple(i64, batch_dims))


def gemm_launch_bounds(dtype, tile):
    """``cuda.jit``'s launch bounds for the GEMM: the block size, and at least two
    blocks per multiprocessor (so ptxas keeps to 128 registers a thread) where the
    accumulators take at most half of those (64 words: 8x8 float32, 4x4 float64).

    Without the bound ptxas spends registers freely (132 for the 128x128 float32
    tile) and one block of 256 threads fits a multiprocessor's register file
    twice only at <= 128; tests/kernels/test_cuda_resources.py checks the
    result with ``ptxas -v``."""
    BM, BN, BK, TM, TN = check_tile(tile)
    threads = (BM // TM) * (BN // TN)
    words = TM * TN * np.dtype(_ACC[np.dtype(dtype)]).itemsize // 4
    return (threads, 2) if words <= 64 else (threads,)


_kernels = {}


def _gemm_kernel(dtype, tile, a_k_contiguous, b_n_contiguous, has_bias, wide_index):
    key = (np.dtype(dtype), tile, a_k_contiguous, b_n_contiguous, has_bias, wide_index)
    k = _kernels.get(key)
    if k is None:
        bounds = {} if simulated() else {"launch_bounds": gemm_launch_bounds(dtype, tile)}
        k = _kernels[key] = cuda.jit(gemm_function(*key), **bounds)
    return k


# ------------------------------------------------------------------ host side
_sm_count = None


def _multiprocessors():
    global _sm_count
    if _sm_count is None:
        try:
            import cupy
            _sm_count = int(cupy.cuda.Device().attributes["MultiProcessorCount"])
        except Exception:            # no CuPy/GPU: any plausible count will do
            _sm_count = 108
    return _sm_count


def tiles(dtype):
    """The tiles ``choose_tile`` picks from for ``dtype``: 128x128 only where the
    64 accumulators a thread holds are 4-byte words (float16/float32): 64
    8-byte ones (float64, the int64 accumulators of integer GEMMs) would take
    all 128 registers a thread may have at two blocks per multiprocessor."""
    if np.dtype(_ACC[np.dtype(dtype)]).itemsize > 4:
        return (SMALL_TILE,)
    return (LARGE_TILE, SMALL_TILE)


def choose_tile(M, N, n_batch, dtype):
    """Big tiles when they still give every multiprocessor a block, small ones otherwise."""
    if simulated():
        return SIM_TILE
    if LARGE_TILE not in tiles(dtype):
        return SMALL_TILE
    big = -(-M // LARGE_TILE.BM) * -(-N // LARGE_TILE.BN) * n_batch
    return LARGE_TILE if big >= _multiprocessors() else SMALL_TILE


def launch_gemm(c, c_lay, a, a_lay, b, b_lay, d, d_lay, M, N, K, batch_shape, dtype,
                tile=None):
    """Run the GEMM on operands given as 1-D spans + layouts (see ``gemm_function``).

    ``d`` is None for no epilogue.  Layout tuples may carry any number of batch
    strides, matching ``batch_shape``.
    """
    dtype = np.dtype(dtype)
    batch_shape = tuple(int(s) for s in batch_shape) or (1,)
    nb = len(batch_shape)
    lays = []
    for lay in (c_lay, a_lay, b_lay, d_lay):
        lay = (0, 0, 0) + (0,) * nb if lay is None else tuple(int(v) for v in lay)
        if len(lay) != 3 + nb:
            raise ValueError(f"GEMM layout {lay} needs 3 + {nb} entries")
        lays.append(lay)
    c_lay, a_lay, b_lay, d_lay = lays
    n_batch = int(np.prod(batch_shape))
    if M == 0 or N == 0 or n_batch == 0:
        return
    tile = check_tile(tile) if tile is not None else choose_tile(M, N, n_batch, dtype)
    if -(-N // tile.BN) > MAX_GRID_Y:
        # column tiles go along grid y (at most 65535): compute C^T = B^T A^T instead,
        # the same kernel with the operands and each layout's two strides swapped
        def t(lay):
            return (lay[0], lay[2], lay[1]) + lay[3:]
        c_lay, a, a_lay, b, b_lay, d_lay = t(c_lay), b, t(b_lay), a, t(a_lay), t(d_lay)
        M, N = N, M
    has_bias = d is not None
    # which dim of A / B is the unit-stride one decides how threads load tiles
    a_k = a_lay[2] == 1 or a_lay[1] != 1
    b_n = b_lay[2] == 1 or b_lay[1] != 1
    wide = max(a.size, b.size) >= 2 ** 32        # (spans: every index lies inside)
    if isinstance(c, np.ndarray):            # simulator: inputs are copied in only
        a, b = cuda.In(a), cuda.In(b)
        d = cuda.In(d) if has_bias else a
    elif not has_bias:
        d = a
    threads = (tile.BM // tile.TM) * (tile.BN // tile.TN)
    grid = (-(-M // tile.BM), -(-N // tile.BN), min(n_batch, MAX_GRID_Z))
    _gemm_kernel(dtype, tile, a_k, b_n, has_bias, wide)[grid, threads, stream()](
        c, c_lay, a, a_lay, b, b_lay, d, d_lay, int(M), int(N), int(K), batch_shape)


def _operand(x, full_shape, what):
    """(1-D span, layout) of array ``x`` broadcast to ``full_shape`` = batch + (rows, cols)."""
    shape, strides, dtype = layout.describe(x)
    st = layout.element_strides(shape, strides, dtype, full_shape, what)
    span, off = layout.span(x, shape, strides, dtype) if x.size else (x.reshape(-1), 0)
    return span, off, st


def _flat(x):
    """A C-contiguous device array as its 1-D span (a plain NumPy view under the
    simulator, whose strict device arrays its kernels copy in as plain arrays)."""
    return x.reshape(-1).view(np.ndarray) if isinstance(x, np.ndarray) else x.reshape(-1)


def _dense_2d(*arrays):
    return all(getattr(x, "ndim", 0) == 2 and x.flags.c_contiguous for x in arrays)


def _dense_gemm(a, b, b_lay, N, bias=None):
    """A new C-contiguous (M, N) = a (M, K, C-contiguous) @ B, where B is the
    memory of the C-contiguous array ``b`` read with layout ``b_lay``, plus an
    optional C-contiguous bias row (N,) read with strides (0, 1)."""
    M, K = a.shape
    out = empty((M, N), a.dtype, a)
    if out.size:
        launch_gemm(_flat(out), (0, N, 1, 0), _flat(a), (0, K, 1, 0), _flat(b), b_lay,
                    None if bias is None else _flat(bias),
                    None if bias is None else (0, 0, 1, 0), M, N, K, (1,), a.dtype)
    return out


def gemm(a, b, bias=None, out=None, tile=None):
    """(..., M, K) @ (..., K, N) (+ bias broadcast to (..., M, N)) with the numba kernel.

    Batch dims broadcast as in NumPy; operands may have any strides (transposed,
    sliced, expanded views).  Returns ``out`` (allocated C-contiguous if None).
    """
    dtype = _check_pair(a, b, "matmul")
    if out is None and bias is None and tile is None and _dense_2d(a, b) and \
            a.shape[1] == b.shape[0]:
        # the common case, without the layout analysis below: C-contiguous
        # matrices, whose layouts are (offset 0, row stride, 1)
        N = b.shape[1]
        return _dense_gemm(a, b, (0, N, 1, 0), N)
    if a.ndim < 2 or b.ndim < 2:
        raise ValueError(f"gemm: operands must be at least 2-D, got shapes {tuple(a.shape)} "
                         f"and {tuple(b.shape)}")
    M, K = a.shape[-2:]
    K2, N = b.shape[-2:]
    if K != K2:
        raise ValueError(f"matmul: shapes {tuple(a.shape)} and {tuple(b.shape)} cannot be "
                         f"multiplied ({K} != {K2})")
    try:
        batch = tuple(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
    except ValueError:
        raise ValueError(f"matmul: batch dims of {tuple(a.shape)} and {tuple(b.shape)} do "
                         f"not broadcast") from None
    if out is None:
        out = empty(batch + (M, N), dtype, a)
    elif tuple(out.shape) != batch + (M, N) or out.dtype != dtype:
        raise ValueError(f"matmul: out must be {batch + (M, N)} {dtype}, got "
                         f"{tuple(out.shape)} {out.dtype}")
    if out.size == 0:
        return out
    operands = [_operand(out, batch + (M, N), "out"), _operand(a, batch + (M, K), "a"),
                _operand(b, batch + (K, N), "b")]
    if bias is not None:
        if bias.dtype != dtype:
            raise TypeError(f"linear: bias must have dtype {dtype}, got {bias.dtype}")
        operands.append(_operand(bias, batch + (M, N), "bias"))
    nb = len(batch)
    shape, batch_strides = layout.coalesce(list(batch), [st[:nb] for _, _, st in operands])
    lays = [(off,) + tuple(st[nb:]) + bst
            for (_, off, st), bst in zip(operands, batch_strides)]
    if not shape:
        shape, lays = (1,), [lay + (0,) for lay in lays]
    spans = [span for span, _, _ in operands]
    launch_gemm(spans[0], lays[0], spans[1], lays[1], spans[2], lays[2],
                spans[3] if bias is not None else None,
                lays[3] if bias is not None else None, M, N, K, shape, dtype, tile)
    return out


def _check_pair(a, b, op):
    for name, x in (("a", a), ("b", b)):
        if not hasattr(x, "shape") or not hasattr(x, "dtype"):
            raise TypeError(f"{op}: {name} must be a device array, got {type(x).__name__}")
    if a.dtype != b.dtype:
        raise TypeError(f"{op}: operands must share one dtype, got {a.dtype} and {b.dtype}")
    if np.dtype(a.dtype) not in _ACC:
        raise TypeError(f"{op}: no CUDA GEMM for dtype {a.dtype}; supported: "
                        f"{[str(d) for d in DTYPES]}")
    return np.dtype(a.dtype)


def _use_cublas(op):
    if _settings.matmul != "cublas":
        return False
    if simulated():
        raise RuntimeError(f"{op}: pyflow.backends.cuda.matmul = 'cublas' needs a real GPU "
                           f"(cuBLAS through CuPy); numba's CUDA simulator "
                           f"(NUMBA_ENABLE_CUDASIM=1) has no cuBLAS. Set "
                           f"pyflow.backends.cuda.matmul = 'numba' to use pyflow's own GEMM.")
    return True


def _add_rows_function():
    def add_rows(c, d, n):
        """c (contiguous, rows of n) += d (n,) on every row."""
        for i in range(cuda.grid(1), c.size, cuda.gridsize(1)):
            c[i] += d[i % n]
    return add_rows


_add_rows = None


def _add_bias(out, bias):
    global _add_rows
    if _add_rows is None:
        _add_rows = cuda.jit(_add_rows_function())
    flat = out.reshape(-1)
    blocks, threads = launch_config(flat.size)
    _add_rows[blocks, threads, stream()](flat, bias, out.shape[-1])


# ------------------------------------------------------------------ registered kernels
@register("matmul", "cuda")
def matmul(a, b):
    """(..., n, k) @ (..., k, m) with NumPy's batch broadcasting; 1-D x 1-D is a dot."""
    _check_pair(a, b, "matmul")
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError(f"matmul: operands must be at least 1-D, got shapes "
                         f"{tuple(a.shape)} and {tuple(b.shape)}")
    if _use_cublas("matmul"):
        import cupy
        return cupy.matmul(a, b)
    a2 = a.reshape((1,) + a.shape) if a.ndim == 1 else a          # views, as NumPy does
    b2 = b.reshape(b.shape + (1,)) if b.ndim == 1 else b
    out = gemm(a2, b2)
    if a.ndim == 1:
        out = out.reshape(out.shape[:-2] + out.shape[-1:])
    if b.ndim == 1:
        out = out.reshape(out.shape[:-1])
    return out


@register("linear", "cuda")
def linear(x, weight, bias):
    """x (M, K) @ weight (N, K).T + bias (N,): one GEMM, the bias added in its epilogue."""
    _check_pair(x, weight, "linear")
    if x.ndim != 2 or weight.ndim != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"linear: expected x (M, K) and weight (N, K), got "
                         f"{tuple(x.shape)} and {tuple(weight.shape)}")
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(f"linear: bias must have shape ({weight.shape[0]},), got "
                         f"{tuple(bias.shape)}")
    if _use_cublas("linear"):
        import cupy
        out = cupy.matmul(x, weight.T)
        if bias is not None and out.size:
            _add_bias(out, bias)
        return out
    if _dense_2d(x, weight) and (bias is None or bias.flags.c_contiguous):
        # x (M, K) and weight (N, K) C-contiguous: weight.T is weight's memory read
        # with strides (1, K); no layout analysis needed (gemm's general path does
        # it for any other strides)
        return _dense_gemm(x, weight, (0, 1, x.shape[1], 0), weight.shape[0], bias)
    return gemm(x, weight.T, bias)
