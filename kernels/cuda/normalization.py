"""layer_norm, rms_norm, add_layer_norm and batch_norm kernels (numba.cuda),
forward and fused backward.

Same calls and results as ``kernels/cpu/normalization.py``:

* ``layer_norm``: one block per row of x (rows, n).  Each thread runs
  Welford's update over its strided elements (one pass over x, and stable
  for data with a large mean, which the CPU kernel gets from two float64
  passes instead); the (count, mean, M2) triples are merged across the block
  (Chan's formula, warp shuffles then shared memory).  mean and rstd =
  1/sqrt(var + eps) are saved per row in x's dtype, as the CPU kernel does.
* ``layer_norm_backward``: dx one block per row (the two row sums of
  g*w and g*w*xhat, then the write).  dweight/dbias are column sums over the
  rows: blocks of 32 columns x 8 row-phases, each block covering a chunk of
  rows, summing in shared memory and leaving one partial per chunk; a second
  small kernel adds the chunks.  No atomics, so results are deterministic.
* ``layer_norm_backward`` is also ``add_layer_norm_backward``: the dx kernel
  takes an optional second gradient (``g_sum``, the gradient of s = x + res
  reaching s directly) and adds it in its write, so the gradient of both
  inputs of the fused add comes out of the one pass.
* ``add_layer_norm``: one block per row; each thread writes s = x + res for
  its strided elements and runs Welford's update on them, then writes the
  normalized s, reading back the elements it wrote itself (so no barrier).
* ``rms_norm``: one block per row, a block sum of x^2 gives rstd =
  1/sqrt(mean(x^2) + eps), saved per row.  Its backward: dx one block per row
  (one row sum, of g*w*xhat); dweight with layer_norm's column-sum kernels,
  given a zero mean (their dbias column is unused).
* ``batch_norm_stats``: one block per channel of x (N, C, S), Welford again.
* ``batch_norm_apply``: a grid-stride loop, (x - mean) * rstd * w + b per channel.
* ``batch_norm_backward``: one block per channel (the sums of g and
  g*(x - mean), then dx).
* ``batch_norm_add_relu_apply``: batch_norm_apply's grid-stride loop with the
  addend added and relu taken before the one write.
* ``batch_norm_add_relu_backward``: batch_norm_backward's block per channel on
  gm = g where y > 0 (y the output), computed inline; gm, the addend's
  gradient, is written in the first pass and read back in the second.

Shared block reductions and host helpers live in ``softmax.py``.
"""
import math

from numba import cuda
from numba import types as nbtypes

from ..registry import register
from ._memory import empty, launch_config, stream, zeros
from .rows import (FLOAT_DTYPES, MAX_WARPS, NUMBA_FLOAT, as_input, check_float, contiguous,
                      device_helpers, row_blocks, row_threads, table)

COL_TILE = 32              # columns per block of the dweight/dbias kernel (one warp)
COL_PHASES = 8             # rows read at once per column tile
ROWS_PER_CHUNK = 64        # rows one dweight/dbias block covers (at least)
MAX_CHUNKS = 128


# ------------------------------------------------------------------ kernel functions
def _layer_norm_forward(dtype):
    acc, nb = dtype.type, NUMBA_FLOAT[dtype]
    zero, one = acc(0), acc(1)
    block_welford = device_helpers(acc)["block_welford"]

    def layer_norm_forward(x, w, b, has_w, has_b, eps, out, mean, rstd):
        shc = cuda.shared.array(MAX_WARPS, nb)
        shm = cuda.shared.array(MAX_WARPS, nb)
        shq = cuda.shared.array(MAX_WARPS, nb)
        rows, n = x.shape
        tid, nt = cuda.threadIdx.x, cuda.blockDim.x
        for r in range(cuda.blockIdx.x, rows, cuda.gridDim.x):
            c, mu, q = zero, zero, zero
            for j in range(tid, n, nt):
                v = x[r, j]
                c += one
                d = v - mu
                mu += d / c
                q += d * (v - mu)
            c, mu, q = block_welford(c, mu, q, shc, shm, shq)
            rs = one / math.sqrt(q / c + eps)
            if tid == 0:
                mean[r] = mu
                rstd[r] = rs
            for j in range(tid, n, nt):
                y = (x[r, j] - mu) * rs
                if has_w:
                    y *= w[j]
                if has_b:
                    y += b[j]
                out[r, j] = y
    layer_norm_forward.__name__ = f"layer_norm_forward_{dtype.name}"
    return layer_norm_forward


def _add_layer_norm_forward(dtype):
    """s = x + res, then layer_norm of s: one block per row."""
    acc, nb = dtype.type, NUMBA_FLOAT[dtype]
    zero, one = acc(0), acc(1)
    block_welford = device_helpers(acc)["block_welford"]

    def add_layer_norm_forward(x, res, w, b, has_w, has_b, eps, out, s, mean, rstd):
        shc = cuda.shared.array(MAX_WARPS, nb)
        shm = cuda.shared.array(MAX_WARPS, nb)
        shq = cuda.shared.array(MAX_WARPS, nb)
        rows, n = x.shape
        tid, nt = cuda.threadIdx.x, cuda.blockDim.x
        for r in range(cuda.blockIdx.x, rows, cuda.gridDim.x):
            c, mu, q = zero, zero, zero
            for j in range(tid, n, nt):
                v = x[r, j] + res[r, j]
                s[r, j] = v
                c += one
                d = v - mu
                mu += d / c
                q += d * (v - mu)
            c, mu, q = block_welford(c, mu, q, shc, shm, shq)
            rs = one / math.sqrt(q / c + eps)
            if tid == 0:
                mean[r] = mu
                rstd[r] = rs
            for j in range(tid, n, nt):     # the elements this thread wrote above
                y = (s[r, j] - mu) * rs
                if has_w:
                    y *= w[j]
                if has_b:
                    y += b[j]
                out[r, j] = y
    add_layer_norm_forward.__name__ = f"add_layer_norm_forward_{dtype.name}"
    return add_layer_norm_forward


def _rms_norm_forward(dtype):
    """out = x * rstd * w, rstd = 1/sqrt(mean(x^2) + eps): one block per row."""
    acc, nb = dtype.type, NUMBA_FLOAT[dtype]
    zero, one = acc(0), acc(1)
    block_sum = device_helpers(acc)["block_sum"]

    def rms_norm_forward(x, w, has_w, eps, out, rstd):
        shq = cuda.shared.array(MAX_WARPS, nb)
        rows, n = x.shape
        tid, nt = cuda.threadIdx.x, cuda.blockDim.x
        inv_n = one / acc(n)
        for r in range(cuda.blockIdx.x, rows, cuda.gridDim.x):
            q = zero
            for j in range(tid, n, nt):
                v = x[r, j]
                q += v * v
            q = block_sum(q, shq)
            rs = one / math.sqrt(q * inv_n + eps)
            if tid == 0:
                rstd[r] = rs
            for j in range(tid, n, nt):
                y = x[r, j] * rs
                if has_w:
                    y *= w[j]
                out[r, j] = y
    rms_norm_forward.__name__ = f"rms_norm_forward_{dtype.name}"
    return rms_norm_forward


def _rms_norm_backward_dx(dtype):
    """dx = rstd * (g*w - xhat * mean(g*w*xhat)), one block per row."""
    acc, nb = dtype.type, NUMBA_FLOAT[dtype]
    zero, one = acc(0), acc(1)
    block_sum = device_helpers(acc)["block_sum"]

    def rms_norm_backward_dx(g, x, rstd, w, has_w, dx):
        shb = cuda.shared.array(MAX_WARPS, nb)
        rows, n = x.shape
        tid, nt = cuda.threadIdx.x, cuda.blockDim.x
        inv_n = one / acc(n)
        for r in range(cuda.blockIdx.x, rows, cuda.gridDim.x):
            rs = rstd[r]
            bsum = zero
            for j in range(tid, n, nt):
                gw = g[r, j] * w[j] if has_w else g[r, j]
                bsum += gw * (x[r, j] * rs)
            bsum = block_sum(bsum, shb) * inv_n
            for j in range(tid, n, nt):
                gw = g[r, j] * w[j] if has_w else g[r, j]
                dx[r, j] = rs * (gw - x[r, j] * rs * bsum)
    rms_norm_backward_dx.__name__ = f"rms_norm_backward_dx_{dtype.name}"
    return rms_norm_backward_dx


def _layer_norm_backward_dx(dtype):
    """dx = rstd * (g*w - mean(g*w) - xhat * mean(g*w*xhat)) (+ gs when has_gs), one
    block per row."""
    acc, nb = dtype.type, NUMBA_FLOAT[dtype]
    zero, one = acc(0), acc(1)
    block_sum = device_helpers(acc)["block_sum"]

    def layer_norm_backward_dx(g, x, mean, rstd, w, has_w, gs, has_gs, dx):
        sha = cuda.shared.array(MAX_WARPS, nb)
        shb = cuda.shared.array(MAX_WARPS, nb)
        rows, n = x.shape
        tid, nt = cuda.threadIdx.x, cuda.blockDim.x
        inv_n = one / acc(n)
        for r in range(cuda.blockIdx.x, rows, cuda.gridDim.x):
            mu, rs = mean[r], rstd[r]
            a, bsum = zero, zero
            for j in range(tid, n, nt):
                gw = g[r, j] * w[j] if has_w else g[r, j]
                a += gw
                bsum += gw * ((x[r, j] - mu) * rs)
            a = block_sum(a, sha) * inv_n
            bsum = block_sum(bsum, shb) * inv_n
            for j in range(tid, n, nt):
                gw = g[r, j] * w[j] if has_w else g[r, j]
                d = rs * (gw - a - (x[r, j] - mu) * rs * bsum)
                if has_gs:      # add_layer_norm: the gradient of s itself
                    d += gs[r, j]
                dx[r, j] = d
    layer_norm_backward_dx.__name__ = f"layer_norm_backward_dx_{dtype.name}"
    return layer_norm_backward_dx


def _layer_norm_param_partials(dtype):
    """Per chunk of rows: dw_part[chunk, j] = sum g*xhat, db_part[chunk, j] = sum g.
    Block (COL_TILE, COL_PHASES): x-threads take neighbouring columns (coalesced),
    y-threads take every COL_PHASES-th row of the chunk."""
    acc, nb = dtype.type, NUMBA_FLOAT[dtype]
    zero = acc(0)

    def layer_norm_param_partials(g, x, mean, rstd, dw_part, db_part):
        sdw = cuda.shared.array((COL_PHASES, COL_TILE), nb)
        sdb = cuda.shared.array((COL_PHASES, COL_TILE), nb)
        rows, n = x.shape
        tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
        j = cuda.blockIdx.x * COL_TILE + tx
        chunk, chunks = cuda.blockIdx.y, cuda.gridDim.y
        per = (rows + chunks - 1) // chunks
        start = chunk * per
        stop = min(rows, start + per)
        dw, db = zero, zero
        if j < n:
            for i in range(start + ty, stop, COL_PHASES):
                gv = g[i, j]
                dw += gv * ((x[i, j] - mean[i]) * rstd[i])
                db += gv
        sdw[ty, tx] = dw
        sdb[ty, tx] = db
        cuda.syncthreads()
        if ty == 0 and j < n:
            for p in range(1, COL_PHASES):
                dw += sdw[p, tx]
                db += sdb[p, tx]
            dw_part[chunk, j] = dw
            db_part[chunk, j] = db
    layer_norm_param_partials.__name__ = f"layer_norm_param_partials_{dtype.name}"
    return layer_norm_param_partials


def _sum_chunks(dtype):
    zero = dtype.type(0)

    def sum_chunks(dw_part, db_part, dw, db):
        chunks, n = dw_part.shape
        for j in range(cuda.grid(1), n, cuda.gridsize(1)):
            sw, sb = zero, zero
            for c in range(chunks):
                sw += dw_part[c, j]
                sb += db_part[c, j]
            dw[j] = sw
            db[j] = sb
    sum_chunks.__name__ = f"sum_chunks_{dtype.name}"
    return sum_chunks


def _channel_stats(dtype):
    """Per-channel mean and biased variance of x (N, C, S): one block per channel."""
    acc, nb = dtype.type, NUMBA_FLOAT[dtype]
    zero, one = acc(0), acc(1)
    block_welford = device_helpers(acc)["block_welford"]

    def channel_stats(x, mean, var):
        shc = cuda.shared.array(MAX_WARPS, nb)
        shm = cuda.shared.array(MAX_WARPS, nb)
        shq = cuda.shared.array(MAX_WARPS, nb)
        N, C, S = x.shape
        tid, nt = cuda.threadIdx.x, cuda.blockDim.x
        for ch in range(cuda.blockIdx.x, C, cuda.gridDim.x):
            c, mu, q = zero, zero, zero
            for e in range(tid, N * S, nt):
                i = e // S
                v = x[i, ch, e - i * S]
                c += one
                d = v - mu
                mu += d / c
                q += d * (v - mu)
            c, mu, q = block_welford(c, mu, q, shc, shm, shq)
            if tid == 0:
                mean[ch] = mu
                var[ch] = q / c
    channel_stats.__name__ = f"channel_stats_{dtype.name}"
    return channel_stats


def _channel_affine(dtype):
    """out = (x - mean[c]) * rstd[c] * w[c] + b[c] as x * scale + shift."""
    one, zero = dtype.type(1), dtype.type(0)

    def channel_affine(x, mean, rstd, w, b, has_w, has_b, out):
        N, C, S = x.shape
        for e in range(cuda.grid(1), N * C * S, cuda.gridsize(1)):
            p = e // S
            k = e - p * S
            i = p // C
            c = p - i * C
            scale = rstd[c] * (w[c] if has_w else one)
            shift = (b[c] if has_b else zero) - mean[c] * scale
            out[i, c, k] = x[i, c, k] * scale + shift
    channel_affine.__name__ = f"channel_affine_{dtype.name}"
    return channel_affine


def _batch_norm_backward(dtype):
    acc, nb = dtype.type, NUMBA_FLOAT[dtype]
    zero, one = acc(0), acc(1)
    block_sum = device_helpers(acc)["block_sum"]

    def batch_norm_backward(g, x, mean, rstd, w, has_w, training, dx, dw, db):
        shg = cuda.shared.array(MAX_WARPS, nb)
        shx = cuda.shared.array(MAX_WARPS, nb)
        N, C, S = x.shape
        m = N * S
        tid, nt = cuda.threadIdx.x, cuda.blockDim.x
        for ch in range(cuda.blockIdx.x, C, cuda.gridDim.x):
            mu, r = mean[ch], rstd[ch]
            sg, sgx = zero, zero
            for e in range(tid, m, nt):
                i = e // S
                k = e - i * S
                gv = g[i, ch, k]
                sg += gv
                sgx += gv * (x[i, ch, k] - mu)
            sg = block_sum(sg, shg)
            sgx = block_sum(sgx, shx)
            if tid == 0:
                dw[ch] = sgx * r
                db[ch] = sg
            wr = (w[ch] if has_w else one) * r
            a = sg / acc(m)
            bb = sgx * r / acc(m)
            for e in range(tid, m, nt):
                i = e // S
                k = e - i * S
                if training:   # the batch statistics depend on x too
                    xhat = (x[i, ch, k] - mu) * r
                    dx[i, ch, k] = wr * (g[i, ch, k] - a - xhat * bb)
                else:
                    dx[i, ch, k] = wr * g[i, ch, k]
    batch_norm_backward.__name__ = f"batch_norm_backward_{dtype.name}"
    return batch_norm_backward


def _channel_affine_add_relu(dtype):
    """out = relu(x * scale + shift + addend), scale and shift as channel_affine's."""
    one, zero = dtype.type(1), dtype.type(0)

    def channel_affine_add_relu(x, addend, mean, rstd, w, b, has_addend, has_w, has_b, out):
        N, C, S = x.shape
        for e in range(cuda.grid(1), N * C * S, cuda.gridsize(1)):
            p = e // S
            k = e - p * S
            i = p // C
            c = p - i * C
            scale = rstd[c] * (w[c] if has_w else one)
            shift = (b[c] if has_b else zero) - mean[c] * scale
            v = x[i, c, k] * scale + shift
            if has_addend:
                v = v + addend[i, c, k]
            out[i, c, k] = zero if v < zero else v      # relu: NaN and -0.0 pass
    channel_affine_add_relu.__name__ = f"channel_affine_add_relu_{dtype.name}"
    return channel_affine_add_relu


def _batch_norm_add_relu_backward(dtype):
    """batch_norm_backward of gm = g where y > 0, gm computed inline; with has_da
    gm is written to da (the addend's gradient) in the first pass and read back
    in the second, otherwise recomputed there."""
    acc, nb = dtype.type, NUMBA_FLOAT[dtype]
    zero, one = acc(0), acc(1)
    block_sum = device_helpers(acc)["block_sum"]

    def batch_norm_add_relu_backward(g, y, x, mean, rstd, w, has_w, training, has_da,
                                     dx, da, dw, db):
        shg = cuda.shared.array(MAX_WARPS, nb)
        shx = cuda.shared.array(MAX_WARPS, nb)
        N, C, S = x.shape
        m = N * S
        tid, nt = cuda.threadIdx.x, cuda.blockDim.x
        for ch in range(cuda.blockIdx.x, C, cuda.gridDim.x):
            mu, r = mean[ch], rstd[ch]
            sg, sgx = zero, zero
            for e in range(tid, m, nt):
                i = e // S
                k = e - i * S
                gv = zero if y[i, ch, k] <= zero else g[i, ch, k]
                if has_da:
                    da[i, ch, k] = gv
                sg += gv
                sgx += gv * (x[i, ch, k] - mu)
            sg = block_sum(sg, shg)
            sgx = block_sum(sgx, shx)
            if tid == 0:
                dw[ch] = sgx * r
                db[ch] = sg
            wr = (w[ch] if has_w else one) * r
            a = sg / acc(m)
            bb = sgx * r / acc(m)
            for e in range(tid, m, nt):
                i = e // S
                k = e - i * S
                # da[i, ch, k] was written by this thread in the first loop
                gv = da[i, ch, k] if has_da else (zero if y[i, ch, k] <= zero else g[i, ch, k])
                if training:   # the batch statistics depend on x too
                    xhat = (x[i, ch, k] - mu) * r
                    dx[i, ch, k] = wr * (gv - a - xhat * bb)
                else:
                    dx[i, ch, k] = wr * gv
    batch_norm_add_relu_backward.__name__ = f"batch_norm_add_relu_backward_{dtype.name}"
    return batch_norm_add_relu_backward


_FACTORIES = {"layer_norm_forward": _layer_norm_forward,
              "layer_norm_backward_dx": _layer_norm_backward_dx,
              "add_layer_norm_forward": _add_layer_norm_forward,
              "rms_norm_forward": _rms_norm_forward,
              "rms_norm_backward_dx": _rms_norm_backward_dx,
              "layer_norm_param_partials": _layer_norm_param_partials,
              "sum_chunks": _sum_chunks, "channel_stats": _channel_stats,
              "channel_affine": _channel_affine, "batch_norm_backward": _batch_norm_backward,
              "channel_affine_add_relu": _channel_affine_add_relu,
              "batch_norm_add_relu_backward": _batch_norm_add_relu_backward}


def _signature(kind, dtype):
    t = NUMBA_FLOAT[dtype]
    v, m2, m3 = t[::1], t[:, ::1], t[:, :, ::1]
    flag = nbtypes.boolean
    return {"layer_norm_forward": (m2, v, v, flag, flag, t, m2, v, v),
            "layer_norm_backward_dx": (m2, m2, v, v, v, flag, m2, flag, m2),
            "add_layer_norm_forward": (m2, m2, v, v, flag, flag, t, m2, m2, v, v),
            "rms_norm_forward": (m2, v, flag, t, m2, v),
            "rms_norm_backward_dx": (m2, m2, v, v, flag, m2),
            "layer_norm_param_partials": (m2, m2, v, v, m2, m2),
            "sum_chunks": (m2, m2, v, v),
            "channel_stats": (m3, v, v),
            "channel_affine": (m3, v, v, v, v, flag, flag, m3),
            "batch_norm_backward": (m3, m3, v, v, v, flag, flag, m3, v, v),
            "channel_affine_add_relu": (m3, m3, v, v, v, v, flag, flag, flag, m3),
            "batch_norm_add_relu_backward": (m3, m3, m3, v, v, v, flag, flag, flag, m3, m3,
                                             v, v)}[kind]


def kernel_specs():
    """Every kernel of this module as (label, fresh Python function, numba signature)."""
    return [(f"{kind} {dtype.name}", factory(dtype), _signature(kind, dtype))
            for kind, factory in _FACTORIES.items() for dtype in FLOAT_DTYPES]


_kernels = {}


def _kernel(kind, dtype):
    k = _kernels.get((kind, dtype))
    if k is None:
        k = _kernels[(kind, dtype)] = cuda.jit(_FACTORIES[kind](dtype))
    return k


# ------------------------------------------------------------------ host side
def _param(p, n, dtype, like, op, what):
    """(weight or bias as a contiguous (n,) array, is it given); ``like`` stands in
    for a missing one (the kernel never reads it)."""
    if p is None:
        return like, False
    if p.size != n:
        raise ValueError(f"{op}: {what} must have {n} elements, got shape {tuple(p.shape)}")
    return table(p, dtype, like).reshape(n), True


def _check_2d(a, op, what):
    if len(a.shape) != 2:
        raise ValueError(f"{op}: {what} must be 2-D (rows, n), got shape {tuple(a.shape)}")


def _check_ncs(a, op, what):
    if len(a.shape) != 3:
        raise ValueError(f"{op}: {what} must be 3-D (N, C, S), got shape {tuple(a.shape)}")


def _check_same(a, ref, op, what, ref_what):
    if tuple(a.shape) != tuple(ref.shape):
        raise ValueError(f"{op}: {what} must have the shape of {ref_what} "
                         f"{tuple(ref.shape)}, got {tuple(a.shape)}")


def _stats(a, count, dtype, like, op, what):
    if tuple(a.shape) != (count,):
        raise ValueError(f"{op}: {what} must have shape ({count},), got {tuple(a.shape)}")
    return table(a, dtype, like)


@register("layer_norm", "cuda")
def layer_norm(x, w, b, eps):
    """x: (rows, n); w, b: (n,) or None.  Returns out, mean (rows,), rstd (rows,)."""
    op = "layer_norm"
    _check_2d(x, op, "x")
    dtype = check_float(x, op)
    x = contiguous(x)
    rows, n = x.shape
    mean, rstd = empty(rows, dtype, x), empty(rows, dtype, x)
    out = empty((rows, n), dtype, x)
    if rows == 0:
        return out, mean, rstd
    w_arr, has_w = _param(w, n, dtype, mean, op, "weight")
    b_arr, has_b = _param(b, n, dtype, mean, op, "bias")
    _kernel("layer_norm_forward", dtype)[row_blocks(rows), row_threads(n), stream()](
        as_input(x), as_input(w_arr), as_input(b_arr), has_w, has_b, dtype.type(eps),
        out, mean, rstd)
    return out, mean, rstd


@register("layer_norm_backward", "cuda")
def layer_norm_backward(g, x, mean, rstd, w):
    """Returns dx (rows, n), dw (n,), db (n,)."""
    return _layer_norm_dx_dw_db("layer_norm_backward", g, None, x, mean, rstd, w)


def _layer_norm_dx_dw_db(op, g, g_sum, x, mean, rstd, w):
    _check_2d(x, op, "x")
    _check_same(g, x, op, "g", "x")
    dtype = check_float(x, op)
    g, x = contiguous(g, dtype), contiguous(x)
    rows, n = x.shape
    dx = empty((rows, n), dtype, x)
    if rows == 0 or n == 0:
        return dx, zeros(n, dtype, x), zeros(n, dtype, x)
    mean = _stats(mean, rows, dtype, x, op, "mean")
    rstd = _stats(rstd, rows, dtype, x, op, "rstd")
    w_arr, has_w = _param(w, n, dtype, mean, op, "weight")
    if g_sum is None:
        gs_arr, has_gs = g, False           # (never read)
    else:
        _check_same(g_sum, x, op, "g_sum", "s")
        gs_arr, has_gs = contiguous(g_sum, dtype), True
    _kernel("layer_norm_backward_dx", dtype)[row_blocks(rows), row_threads(n), stream()](
        as_input(g), as_input(x), as_input(mean), as_input(rstd), as_input(w_arr), has_w,
        as_input(gs_arr), has_gs, dx)
    dw, db = _param_grads(g, x, mean, rstd, dtype)
    return dx, dw, db


def _param_grads(g, x, mean, rstd, dtype):
    """Column sums of g * (x - mean) * rstd and of g over the rows of (rows, n) arrays."""
    rows, n = x.shape
    chunks = max(1, min(MAX_CHUNKS, rows // ROWS_PER_CHUNK))
    dw_part, db_part = empty((chunks, n), dtype, x), empty((chunks, n), dtype, x)
    _kernel("layer_norm_param_partials", dtype)[(-(-n // COL_TILE), chunks),
                                                (COL_TILE, COL_PHASES), stream()](
        as_input(g), as_input(x), as_input(mean), as_input(rstd), dw_part, db_part)
    dw, db = empty(n, dtype, x), empty(n, dtype, x)
    blocks, threads = launch_config(n)
    _kernel("sum_chunks", dtype)[blocks, threads, stream()](
        as_input(dw_part), as_input(db_part), dw, db)
    return dw, db


@register("add_layer_norm", "cuda")
def add_layer_norm(x, res, w, b, eps):
    """x, res: (rows, n) of one dtype; w, b: (n,) or None.  Returns out, s = x + res,
    mean (rows,), rstd (rows,) of s."""
    op = "add_layer_norm"
    _check_2d(x, op, "x")
    _check_same(res, x, op, "res", "x")
    dtype = check_float(x, op)
    x, res = contiguous(x), contiguous(res, dtype)
    rows, n = x.shape
    mean, rstd = empty(rows, dtype, x), empty(rows, dtype, x)
    out, s = empty((rows, n), dtype, x), empty((rows, n), dtype, x)
    if rows == 0:
        return out, s, mean, rstd
    w_arr, has_w = _param(w, n, dtype, mean, op, "weight")
    b_arr, has_b = _param(b, n, dtype, mean, op, "bias")
    _kernel("add_layer_norm_forward", dtype)[row_blocks(rows), row_threads(n), stream()](
        as_input(x), as_input(res), as_input(w_arr), as_input(b_arr), has_w, has_b,
        dtype.type(eps), out, s, mean, rstd)
    return out, s, mean, rstd


@register("add_layer_norm_backward", "cuda")
def add_layer_norm_backward(g, g_sum, s, mean, rstd, w):
    """g: gradient of out; g_sum: gradient of s, or None.  Returns ds (rows, n), the
    gradient of s from both outputs (that of x and of res), dw (n,), db (n,)."""
    return _layer_norm_dx_dw_db("add_layer_norm_backward", g, g_sum, s, mean, rstd, w)


@register("rms_norm", "cuda")
def rms_norm(x, w, eps):
    """x: (rows, n); w: (n,) or None.  Returns out, rstd (rows,)."""
    op = "rms_norm"
    _check_2d(x, op, "x")
    dtype = check_float(x, op)
    x = contiguous(x)
    rows, n = x.shape
    rstd = empty(rows, dtype, x)
    out = empty((rows, n), dtype, x)
    if rows == 0:
        return out, rstd
    w_arr, has_w = _param(w, n, dtype, rstd, op, "weight")
    _kernel("rms_norm_forward", dtype)[row_blocks(rows), row_threads(n), stream()](
        as_input(x), as_input(w_arr), has_w, dtype.type(eps), out, rstd)
    return out, rstd


@register("rms_norm_backward", "cuda")
def rms_norm_backward(g, x, rstd, w):
    """Returns dx (rows, n), dw (n,)."""
    op = "rms_norm_backward"
    _check_2d(x, op, "x")
    _check_same(g, x, op, "g", "x")
    dtype = check_float(x, op)
    g, x = contiguous(g, dtype), contiguous(x)
    rows, n = x.shape
    dx = empty((rows, n), dtype, x)
    if rows == 0 or n == 0:
        return dx, zeros(n, dtype, x)
    rstd = _stats(rstd, rows, dtype, x, op, "rstd")
    w_arr, has_w = _param(w, n, dtype, rstd, op, "weight")
    _kernel("rms_norm_backward_dx", dtype)[row_blocks(rows), row_threads(n), stream()](
        as_input(g), as_input(x), as_input(rstd), as_input(w_arr), has_w, dx)
    # dweight = column sums of g * x * rstd: layer_norm's kernels with a zero mean
    dw, _ = _param_grads(g, x, zeros(rows, dtype, x), rstd, dtype)
    return dx, dw


@register("batch_norm_stats", "cuda")
def batch_norm_stats(x):
    """x: (N, C, S).  Returns per-channel mean and biased variance in x's dtype."""
    op = "batch_norm_stats"
    _check_ncs(x, op, "x")
    dtype = check_float(x, op)
    x = contiguous(x)
    N, C, S = x.shape
    mean, var = empty(C, dtype, x), empty(C, dtype, x)
    if C:
        _kernel("channel_stats", dtype)[row_blocks(C), row_threads(N * S), stream()](
            as_input(x), mean, var)
    return mean, var


@register("batch_norm_apply", "cuda")
def batch_norm_apply(x, mean, rstd, w, b):
    """(x - mean) * rstd * w + b per channel of x (N, C, S); w, b may be None."""
    op = "batch_norm_apply"
    _check_ncs(x, op, "x")
    dtype = check_float(x, op)
    x = contiguous(x)
    N, C, S = x.shape
    out = empty((N, C, S), dtype, x)
    if out.size == 0:
        return out
    mean = _stats(mean, C, dtype, x, op, "mean")
    rstd = _stats(rstd, C, dtype, x, op, "rstd")
    w_arr, has_w = _param(w, C, dtype, mean, op, "weight")
    b_arr, has_b = _param(b, C, dtype, mean, op, "bias")
    blocks, threads = launch_config(N * C * S)
    _kernel("channel_affine", dtype)[blocks, threads, stream()](
        as_input(x), as_input(mean), as_input(rstd), as_input(w_arr), as_input(b_arr),
        has_w, has_b, out)
    return out


@register("batch_norm_backward", "cuda")
def batch_norm_backward(g, x, mean, rstd, w, training):
    """Returns dx (N, C, S), dw (C,), db (C,)."""
    op = "batch_norm_backward"
    _check_ncs(x, op, "x")
    _check_same(g, x, op, "g", "x")
    dtype = check_float(x, op)
    g, x = contiguous(g, dtype), contiguous(x)
    N, C, S = x.shape
    dx, dw, db = empty((N, C, S), dtype, x), empty(C, dtype, x), empty(C, dtype, x)
    if C == 0:
        return dx, dw, db
    mean = _stats(mean, C, dtype, x, op, "mean")
    rstd = _stats(rstd, C, dtype, x, op, "rstd")
    w_arr, has_w = _param(w, C, dtype, mean, op, "weight")
    _kernel("batch_norm_backward", dtype)[row_blocks(C), row_threads(N * S), stream()](
        as_input(g), as_input(x), as_input(mean), as_input(rstd), as_input(w_arr), has_w,
        bool(training), dx, dw, db)
    return dx, dw, db


@register("batch_norm_add_relu_apply", "cuda")
def batch_norm_add_relu_apply(x, addend, mean, rstd, w, b):
    """relu((x - mean) * rstd * w + b + addend) per channel of x (N, C, S) in one
    pass; addend (N, C, S) or None, w, b may be None."""
    op = "batch_norm_add_relu_apply"
    _check_ncs(x, op, "x")
    dtype = check_float(x, op)
    x = contiguous(x)
    N, C, S = x.shape
    has_addend = addend is not None
    if has_addend:
        _check_same(addend, x, op, "addend", "x")
        addend = contiguous(addend, dtype)
    out = empty((N, C, S), dtype, x)
    if out.size == 0:
        return out
    mean = _stats(mean, C, dtype, x, op, "mean")
    rstd = _stats(rstd, C, dtype, x, op, "rstd")
    w_arr, has_w = _param(w, C, dtype, mean, op, "weight")
    b_arr, has_b = _param(b, C, dtype, mean, op, "bias")
    blocks, threads = launch_config(N * C * S)
    _kernel("channel_affine_add_relu", dtype)[blocks, threads, stream()](
        as_input(x), as_input(addend if has_addend else x), as_input(mean), as_input(rstd),
        as_input(w_arr), as_input(b_arr), has_addend, has_w, has_b, out)
    return out


@register("batch_norm_add_relu_backward", "cuda")
def batch_norm_add_relu_backward(g, y, x, mean, rstd, w, training, addend_grad):
    """g: gradient of out = relu(batch_norm(x) + addend); y: out.  Returns dx (N, C, S),
    d_addend (N, C, S: g where y > 0; None unless addend_grad), dw (C,), db (C,)."""
    op = "batch_norm_add_relu_backward"
    _check_ncs(x, op, "x")
    _check_same(g, x, op, "g", "x")
    _check_same(y, x, op, "y", "x")
    dtype = check_float(x, op)
    g, y, x = contiguous(g, dtype), contiguous(y, dtype), contiguous(x)
    N, C, S = x.shape
    dx, dw, db = empty((N, C, S), dtype, x), empty(C, dtype, x), empty(C, dtype, x)
    da = empty((N, C, S), dtype, x) if addend_grad else None
    if C == 0:
        return dx, da, dw, db
    mean = _stats(mean, C, dtype, x, op, "mean")
    rstd = _stats(rstd, C, dtype, x, op, "rstd")
    w_arr, has_w = _param(w, C, dtype, mean, op, "weight")
    # without addend_grad the kernel never touches da: a stand-in of one element (not
    # dx, an output the simulator would copy back a second time, over the first)
    _kernel("batch_norm_add_relu_backward", dtype)[row_blocks(C), row_threads(N * S), stream()](
        as_input(g), as_input(y), as_input(x), as_input(mean), as_input(rstd), as_input(w_arr),
        has_w, bool(training), bool(addend_grad), dx,
        empty((1, 1, 1), dtype, x) if da is None else da, dw, db)
    return dx, da, dw, db
