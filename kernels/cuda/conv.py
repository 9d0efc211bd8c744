"""2-D convolution on the GPU: im2col + the tiled GEMM of ``linalg.py``.

Same layout as the CPU kernels (``kernels/cpu/conv.py``): ``cols`` is
(C*kh*kw, N*Ho*Wo), row ``(c, i, j)`` = channel ``c`` seen through tap
``(i, j)`` at every output position of every image.  The GEMM's strided
operands remove the CPU version's re-layout copies:

* forward: one batched GEMM over (image n, group g) writes
  ``y[n, g] (Og, L) = W_g (Og, Kg) @ cols_g[:, n] (Kg, L)`` straight into the
  (N, O, Ho, Wo) output, with the bias added in the GEMM epilogue;
* input gradient: ``gcols_g[:, n] = W_g^T @ gy[n, g]`` (W transposed through
  strides), then ``col2im``: one thread per input pixel *gathers* the columns
  that read it, so no atomics and a deterministic sum;
* weight gradient: ``gW_g = g2_g @ cols_g^T`` where g2 = grad_out as (O, N*L)
  (one permute kernel: the reduction runs over images and positions, which is
  not one stride in (N, O, L)), cols transposed through strides;
* bias gradient: one block per output channel sums its N*L values (a
  shared-memory tree; numba's simulator has no warp shuffles, and this
  reduction is small next to the GEMMs).

Inputs may be strided views: im2col and the permute read any strides; the
weight and grad_out are copied (one kernel) only when their trailing dims do
not collapse into one stride, which the GEMM needs.
"""
import numpy as np
from numba import cuda
from numba import types as nbtypes

from ..registry import register
from ._memory import empty, launch_config, simulated, stream, zeros
from . import layout
from .linalg import launch_gemm

DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
_NUMBA = {np.dtype(np.float32): nbtypes.float32, np.dtype(np.float64): nbtypes.float64}
REDUCE_THREADS = 128         # block size (a power of 2) of the bias-gradient reduction


def _grid(n):
    """Launch size of a grid-stride loop; tiny under the simulator (1 OS thread per thread)."""
    if simulated():
        return min(2, -(-n // 32)) or 1, 32
    return launch_config(n)


# ------------------------------------------------------------------ kernels
def im2col_function():
    def im2col(x, x_lay, geo, cols):
        """cols (C*kh*kw, N*Ho*Wo), flat; x_lay = (offset, sN, sC, sH, sW)."""
        N, C, H, W, kh, kw, sh, sw, ph, pw, dh, dw, Ho, Wo = geo
        L = Ho * Wo
        NL = N * L
        for e in range(cuda.grid(1), cols.size, cuda.gridsize(1)):
            row = e // NL
            col = e - row * NL
            n = col // L
            l = col - n * L
            oh = l // Wo
            ow = l - oh * Wo
            c = row // (kh * kw)
            r = row - c * (kh * kw)
            i = r // kw
            j = r - i * kw
            ih = oh * sh - ph + i * dh
            iw = ow * sw - pw + j * dw
            if ih >= 0 and ih < H and iw >= 0 and iw < W:
                cols[e] = x[x_lay[0] + n * x_lay[1] + c * x_lay[2] + ih * x_lay[3] + iw * x_lay[4]]
            else:
                cols[e] = 0
    return im2col


def col2im_function(dtype):
    zero = np.dtype(dtype).type(0)

    def col2im(cols, geo, out):
        """out (N, C, H, W), flat: each pixel sums the entries of cols that read it."""
        N, C, H, W, kh, kw, sh, sw, ph, pw, dh, dw, Ho, Wo = geo
        L = Ho * Wo
        NL = N * L
        for e in range(cuda.grid(1), out.size, cuda.gridsize(1)):
            iw = e % W
            t = e // W
            ih = t % H
            t = t // H
            c = t % C
            n = t // C
            acc = zero
            for i in range(kh):
                u = ih + ph - i * dh              # = oh * sh for the output row reading it
                if u < 0:
                    break
                oh = u // sh
                if oh * sh != u or oh >= Ho:
                    continue
                for j in range(kw):
                    v = iw + pw - j * dw
                    if v < 0:
                        break
                    ow = v // sw
                    if ow * sw != v or ow >= Wo:
                        continue
                    acc += cols[((c * kh + i) * kw + j) * NL + n * L + oh * Wo + ow]
            out[e] = acc
    return col2im


def permute_function():
    def nol_to_onl(g, g_lay, N, O, L, out):
        """out (O, N, L), flat = g (N, O, L) with g_lay = (offset, sN, sO, sL)."""
        for e in range(cuda.grid(1), out.size, cuda.gridsize(1)):
            o = e // (N * L)
            r = e - o * (N * L)
            n = r // L
            l = r - n * L
            out[e] = g[g_lay[0] + n * g_lay[1] + o * g_lay[2] + l * g_lay[3]]
    return nol_to_onl


def copy4_function():
    def copy4(src, lay, shape, out):
        """out (contiguous, flat) = src seen through shape (4 dims), lay = (offset, strides)."""
        for e in range(cuda.grid(1), out.size, cuda.gridsize(1)):
            i3 = e % shape[3]
            t = e // shape[3]
            i2 = t % shape[2]
            t = t // shape[2]
            i1 = t % shape[1]
            i0 = t // shape[1]
            out[e] = src[lay[0] + i0 * lay[1] + i1 * lay[2] + i2 * lay[3] + i3 * lay[4]]
    return copy4


def bias_grad_function(dtype, threads):
    dt = np.dtype(dtype).type
    zero = dt(0)

    def bias_grad(g, g_lay, N, O, L, out):
        """out[o] = sum over n, l of g[n, o, l]; one block per channel o, each thread
        sums a strided share, then a shared-memory tree halves the partial sums."""
        partial = cuda.shared.array(threads, dt)
        tid = cuda.threadIdx.x
        for o in range(cuda.blockIdx.x, O, cuda.gridDim.x):
            acc = zero
            for t in range(tid, N * L, threads):
                n = t // L
                acc += g[g_lay[0] + n * g_lay[1] + o * g_lay[2] + (t - n * L) * g_lay[3]]
            partial[tid] = acc
            cuda.syncthreads()
            step = threads // 2
            while step > 0:
                if tid < step:
                    partial[tid] += partial[tid + step]
                cuda.syncthreads()
                step //= 2
            if tid == 0:
                out[o] = partial[0]
            cuda.syncthreads()          # partial is reused by the next channel
    return bias_grad


def signatures(dtype):
    """name -> (plain kernel function, numba signature) for every conv kernel."""
    arr = _NUMBA[np.dtype(dtype)][::1]
    i64 = nbtypes.int64
    tup = lambda n: nbtypes.UniTuple(i64, n)  # noqa: E731
    threads = 32 if simulated() else REDUCE_THREADS
    return {
        "im2col": (im2col_function(), (arr, tup(5), tup(14), arr)),
        "col2im": (col2im_function(dtype), (arr, tup(14), arr)),
        "nol_to_onl": (permute_function(), (arr, tup(4), i64, i64, i64, arr)),
        "copy4": (copy4_function(), (arr, tup(5), tup(4), arr)),
        "bias_grad": (bias_grad_function(dtype, threads), (arr, tup(4), i64, i64, i64, arr)),
    }


_kernels = {}


def _kernel(name, dtype):
    key = (name, np.dtype(dtype))
    k = _kernels.get(key)
    if k is None:
        k = _kernels[key] = cuda.jit(signatures(dtype)[name][0])
    return k


def _in(a):
    """Simulator: read-only operands are copied in only (they may be broadcast views)."""
    return cuda.In(a) if isinstance(a, np.ndarray) else a


# ------------------------------------------------------------------ host side
def _strided(x, what):
    """(1-D span, element offset, element strides) of a device array."""
    shape, strides, dtype = layout.describe(x)
    st = layout.element_strides(shape, strides, dtype, tuple(shape), what)
    if x.size == 0:                  # nothing to read: any span will do
        return empty((0,), dtype, x), 0, st
    span, off = layout.span(x, shape, strides, dtype)
    return span, off, st


def _merged_stride(shape, st, lo):
    """The one stride of dims ``lo:`` seen as a single flat dim, or None if they don't merge."""
    stride = None
    run = 1
    for n, s in zip(reversed(shape[lo:]), reversed(st[lo:])):
        if n == 1:
            continue
        if stride is None:
            stride, run = s, n
        elif s != stride * run:
            return None
        else:
            run *= n
    return 1 if stride is None else stride


def _flat_tail(x, what):
    """x (4-D) as (span, offset, s0, s1, s_tail) where dims 2: merge into one of stride
    s_tail (dims 1: too when ``what`` is 'weight'); copied when they do not merge."""
    span, off, st = _strided(x, what)
    lo = 1 if what == "weight" else 2
    tail = _merged_stride(x.shape, st, lo)
    if tail is not None:
        return span, off, st[0], st[1], tail
    dtype = np.dtype(x.dtype)
    out = empty(x.shape, dtype, x)
    blocks, threads = _grid(out.size)
    _kernel("copy4", dtype)[blocks, threads, stream()](
        _in(span), (off,) + tuple(st), tuple(x.shape), out.reshape(-1))
    c = (int(np.prod(x.shape[1:])), int(np.prod(x.shape[2:])), 1)
    return out.reshape(-1), 0, c[0], c[1], 1


def _check_dtype(op, **arrays):
    dtype = None
    for name, a in arrays.items():
        if a is None:
            continue
        if np.dtype(a.dtype) not in DTYPES:
            raise TypeError(f"{op}: no CUDA kernel for {name} of dtype {a.dtype}; supported: "
                            f"{[str(d) for d in DTYPES]}")
        if dtype is not None and a.dtype != dtype:
            raise TypeError(f"{op}: arrays must share one dtype, got {dtype} and {a.dtype} "
                            f"({name})")
        dtype = np.dtype(a.dtype)
    return dtype


def _im2col(x, kh, kw, stride, padding, dilation, out_hw):
    N, C, H, W = x.shape
    Ho, Wo = out_hw
    cols = empty((C * kh * kw, N * Ho * Wo), x.dtype, x)
    if cols.size == 0:
        return cols
    span, off, st = _strided(x, "input")
    geo = (N, C, H, W, kh, kw, stride[0], stride[1], padding[0], padding[1],
           dilation[0], dilation[1], Ho, Wo)
    blocks, threads = _grid(cols.size)
    _kernel("im2col", x.dtype)[blocks, threads, stream()](
        _in(span), (off,) + tuple(st), geo, cols.reshape(-1))
    return cols


@register("conv2d", "cuda")
def conv2d(x, w, bias, stride, padding, dilation, groups, out_hw, keep_cols):
    """x (N, C, H, W), w (O, C/groups, kh, kw), bias (O,) or None -> (y, cols or None)."""
    dtype = _check_dtype("conv2d", input=x, weight=w, bias=bias)
    N, C = x.shape[:2]
    O, Cg, kh, kw = w.shape
    Ho, Wo = out_hw
    G = groups
    Og, Kg, L = O // G, Cg * kh * kw, Ho * Wo
    cols = _im2col(x, kh, kw, stride, padding, dilation, out_hw)
    y = empty((N, O, Ho, Wo), dtype, x)
    if y.size:
        w_span, w_off, sO, _, sK = _flat_tail(w, "weight")
        d = d_lay = None
        if bias is not None:
            d, b_off, (sb,) = _strided(bias, "bias")
            d_lay = (b_off, sb, 0, 0, Og * sb)
        launch_gemm(y.reshape(-1), (0, L, 1, O * L, Og * L),            # y[n, g] (Og, L)
                    w_span, (w_off, sO, sK, 0, Og * sO),                 # W_g (Og, Kg)
                    cols.reshape(-1), (0, N * L, 1, L, Kg * N * L),      # cols_g[:, n] (Kg, L)
                    d, d_lay, Og, L, Kg, (N, G), dtype)
    return y, (cols if keep_cols else None)


@register("conv2d_backward", "cuda")
def conv2d_backward(x, w, gy, cols, x_shape, w_shape, stride, padding, dilation, groups,
                    need_input, need_weight, need_bias):
    """Gradients (input, weight, bias) of conv2d; each is None unless asked for."""
    dtype = _check_dtype("conv2d_backward", grad_out=gy, input=x, weight=w, cols=cols)
    N, O, Ho, Wo = gy.shape
    _, Cg, kh, kw = w_shape
    G = groups
    Og, Kg, L = O // G, Cg * kh * kw, Ho * Wo
    gx = gw = gb = None
    g_span, g_off, sN, sO, sL = _flat_tail(gy, "grad_out")
    g_lay = (g_off, sN, sO, sL)
    if need_bias:
        gb = empty((O,), dtype, gy)
        threads = 32 if simulated() else REDUCE_THREADS
        blocks = min(O, 2 if simulated() else 65535)
        if O:
            _kernel("bias_grad", dtype)[blocks, threads, stream()](
                _in(g_span), g_lay, N, O, L, gb)
    if need_weight:
        if cols is None:
            cols = _im2col(x, kh, kw, stride, padding, dilation, (Ho, Wo))
        elif tuple(cols.shape) != (G * Kg, N * L):
            raise ValueError(f"conv2d_backward: cols must have shape {(G * Kg, N * L)}, got "
                             f"{tuple(cols.shape)}")
        NL = N * L
        g2 = empty((O, NL), dtype, gy)
        if g2.size:
            blocks, threads = _grid(g2.size)
            _kernel("nol_to_onl", dtype)[blocks, threads, stream()](
                _in(g_span), g_lay, N, O, L, g2.reshape(-1))
        gw = (empty if NL else zeros)((O, Kg), dtype, gy)    # no images: zero gradient
        if gw.size:
            if NL:
                c_span, c_off, c_st = _strided(cols, "cols")
                launch_gemm(gw.reshape(-1), (0, Kg, 1, Og * Kg),          # gW_g (Og, Kg)
                            g2.reshape(-1), (0, NL, 1, Og * NL),          # g2_g (Og, NL)
                            c_span, (c_off, c_st[1], c_st[0], Kg * c_st[0]),  # cols_g^T
                            None, None, Og, Kg, NL, (G,), dtype)
        gw = gw.reshape(w_shape)
    if need_input:
        w_span, w_off, wO, _, wK = _flat_tail(w, "weight")
        gcols = empty((G * Kg, N * L), dtype, gy)
        if gcols.size:
            launch_gemm(gcols.reshape(-1), (0, N * L, 1, L, Kg * N * L),  # gcols_g[:, n]
                        w_span, (w_off, wK, wO, 0, Og * wO),              # W_g^T (Kg, Og)
                        g_span, (g_off, sO, sL, sN, Og * sO),             # gy[n, g] (Og, L)
                        None, None, Kg, L, Og, (N, G), dtype)
        gx = empty(tuple(x_shape), dtype, gy)
        if gx.size:
            geo = (x_shape[0], x_shape[1], x_shape[2], x_shape[3], kh, kw, stride[0],
                   stride[1], padding[0], padding[1], dilation[0], dilation[1], Ho, Wo)
            blocks, threads = _grid(gx.size)
            _kernel("col2im", dtype)[blocks, threads, stream()](
                _in(gcols.reshape(-1)), geo, gx.reshape(-1))
    return gx, gw, gb

