"""Direct 2-D convolution (groups=1): no im2col matrix, no col2im.

All three products of a convolution are one kernel shape, a *gathered*
matrix product with a register tile:

    out[p, o] = sum_k src.flat[poff[p] + koff[k]] * wp[o // B, k, o % B]

``p`` runs over output pixels, ``k`` over (input channel, tap) pairs and
``o`` over output channels in blocks of B = 16 float32 (8 float64: one
64-byte vector, ``simd.py``).  ``poff``/``koff`` are offset tables into a
zero-padded copy of the source, so padding, stride and dilation are only
table arithmetic and the inner loop has no branches.  A tile of 6 pixels x
one block of output channels lives in 6 vector accumulators (12 of AVX2's 16
ymm registers): per k, one vector load of packed weights, 6 scalar
broadcasts of the source and 6 vector FMAs.  The im2col path reads the same
numbers through a (C*kh*kw, N*Ho*Wo) matrix it first writes out; here they
are read where they lie, in NCHW: the blocked layout lives only inside a call
(packed weights, a blocked grad_out for the weight gradient).

* forward:       src = x padded, k = (c, i, j), o = output channel, weights
                 packed as (O/B, C*kh*kw, B); the bias starts the sums.
* input grad:    the transposed convolution.  For stride s, input pixel
                 ``ih`` receives tap ``i`` from output row ``(ih + pad - i)/s``
                 only when that divides, so the input pixels are split into
                 s*s phases (ih % s, iw % s); each phase is a plain gathered
                 product over its own taps: src = grad_out padded,
                 k = (o, i, j), output channel = input channel.  No zero is
                 multiplied (a dilated grad_out would waste 3/4 of the work
                 at stride 2); a phase no tap reaches is zero-filled.
* weight grad:   the roles swap: the tile is 6 (c, i, j) entries x B output
                 channels and the reduction runs over every pixel of every
                 image; grad_out is first re-laid as (O/B, N*Ho*Wo, B) so each
                 step reads one vector.
* short forward: with C*kh*kw < SHORT_REDUCTION (a 3-channel stem) a 6 x 16
                 tile does little but load and scatter; ``_row_product``
                 vectorizes along output rows instead (stride 1 only).

Sums run in chunks of REDUCTION_RUN terms (see "offset tables" below): as
accurate as MKL's SGEMM, where one long chain of FMAs was 2.5x (forward) to
6x (weight gradient) less so.

Each kernel is a ``prange`` over disjoint output tiles (pixel chunk x channel
block, channel block x k tile, image x channel tile), so no two threads
write one element.  A last, partial tile repeats its final pixel (or k, or
channel) rather than branching: the repeats compute and store the same value
to the same place.

The costs this pays that im2col does not: one padded copy of the source,
one packing of the weights per call (the size of the weights: large for the
late ResNet layers, where im2col's matrix is small), and a scatter of each
finished tile into NCHW (16 scalar stores per vector, against 6*K FMAs).
``conv.py`` chooses between the two paths by shape (see its ``direct_ok``).

Measured on one core of an AMD EPYC (Zen 3, AVX2; bench/conv.py): 62-72
GFLOP/s on ResNet-18's 3x3 layers, where MKL's SGEMM peaks at ~70 and the
im2col path reaches 32-55.  AVX-512 machines run the same code on zmm
registers (one per vector) with the same 6-pixel tile, leaving registers
unused: a wider tile there is untried.
"""
import functools

import numpy as np
from numba import njit, prange

from .simd import at, lanes, vadd, vbroadcast, vfma, vlanes, vload, vscatter, vstore, vzero
from .twin import twin

TILE = 6            # pixels (or k entries) per register tile: 6 x 64-byte accumulators
PIXEL_CHUNK = 96    # pixels per parallel work item of the gathered product


# ------------------------------------------------------------------ data movement
# The re-layouts are memory copies, often small (a 64x64x3x3 weight: 37K
# elements): on the threads only from twin.PARALLEL_MIN elements up.
@twin(size_of=3, nogil=True, cache=True)
def _pad(x, top, left, out):
    """out (N, C, Hp, Wp) = x (N, C, H, W) at (top, left), zeros around it."""
    N, C, H, W = x.shape
    Hp, Wp = out.shape[2], out.shape[3]
    for nc in prange(N * C):
        n = nc // C
        c = nc % C
        for r in range(Hp):
            ih = r - top
            if ih < 0 or ih >= H:
                for q in range(Wp):
                    out[n, c, r, q] = 0
                continue
            for q in range(left):
                out[n, c, r, q] = 0
            for iw in range(W):
                out[n, c, r, left + iw] = x[n, c, ih, iw]
            for q in range(left + W, Wp):
                out[n, c, r, q] = 0


# The re-layout loops below keep the lane count a compile-time constant
# (``vlanes``) and move B x B squares (B source rows x B columns, both in L1)
# rather than whole rows: a 4 MB grad_out is blocked in 0.5 ms instead of 2.9
# (a plain copy: 0.14 ms), one core.
@twin(size_of=1, nogil=True, cache=True)
def _to_blocks(m, out):
    """out[b, g*L + q, l] = m[g, b*B + l, q] for m (G, R, L) (zero past row R).

    The forward's weights (G=1: (O, C*kh*kw) -> (O/B, C*kh*kw, B)), the input
    gradient's weights at stride 1 (G=O: (O, C, kh*kw) -> (C/B, O*kh*kw, B)) and
    grad_out for the weight gradient (G=N: (N, O, L) -> (O/B, N*L, B))."""
    G, R, L = m.shape
    OB = out.shape[0]
    for gb in prange(G * OB):
        B = vlanes(out)             # inside the prange body: see _gathered_product
        g = gb // OB
        b = gb % OB
        base = g * L
        if (b + 1) * B <= R:
            for q0 in range(0, L - B + 1, B):
                for l in range(B):
                    for d in range(B):
                        out[b, base + q0 + d, l] = m[g, b * B + l, q0 + d]
            for q in range(L - L % B, L):
                for l in range(B):
                    out[b, base + q, l] = m[g, b * B + l, q]
        else:
            for q in range(L):
                for l in range(B):
                    r = b * B + l
                    out[b, base + q, l] = m[g, r, q] if r < R else 0


@twin(size_of=2, nogil=True, cache=True)
def _pack_transposed(w3, taps, out):
    """out[b, o*T + t, l] = w3[o, b*B + l, taps[t]] for w3 (O, C, kh*kw): the input
    gradient's weights for the T taps of one phase of a strided convolution
    (zero past the last channel); ``_to_blocks`` when the phase has every tap."""
    O, C = w3.shape[0], w3.shape[1]
    CB = out.shape[0]
    T = taps.shape[0]
    for bo in prange(CB * O):
        B = vlanes(out)
        b = bo // O
        o = bo % O
        if (b + 1) * B <= C:
            for t in range(T):
                tap = taps[t]
                for l in range(B):
                    out[b, o * T + t, l] = w3[o, b * B + l, tap]
        else:
            for t in range(T):
                for l in range(B):
                    c = b * B + l
                    out[b, o * T + t, l] = w3[o, c, taps[t]] if c < C else 0


# ------------------------------------------------------------------ the gathered products
@njit(nogil=True, cache=True, inline="always")
def _add_into(part, i, v):
    vstore(part, i, vadd(vload(part, i), v))


@njit(nogil=True, cache=True, parallel=True)
def _gathered_product(src, kruns, poff, soff, cstride, wp, bias, n_out, out):
    """out[soff[p] + o*cstride] = bias[o] + sum_k src[poff[p] + koff[k]] * wp[o//B, k, o%B]

    ``src`` and ``out`` are flat; ``bias`` has OB*B entries (zeros past
    ``n_out``, the real number of output channels); ``kruns`` is koff in
    runs (``_runs``)."""
    OB, K = wp.shape[0], wp.shape[1]
    P = poff.shape[0]
    chunks = (P + PIXEL_CHUNK - 1) // PIXEL_CHUNK
    wflat = wp.reshape(-1)
    for item in prange(chunks * OB):
        # B, a compile-time constant, is taken inside the loop body: a value from
        # outside reaches numba's outlined prange body as an argument, a runtime
        # value there (blocking grad_out: 1.4 against 0.5 ms, one core).
        B = vlanes(wp)
        cb = item % OB              # channel blocks of one pixel chunk run back to back:
        chunk = item // OB          # the chunk's source rows stay in cache
        lo = chunk * PIXEL_CHUNK
        last = min(P, lo + PIXEL_CHUNK) - 1
        wbase = cb * K * B
        count = min(B, n_out - cb * B)
        obase = cb * B * cstride
        part = np.empty(TILE * B, wp.dtype)     # the tile's sum of finished runs
        for p0 in range(lo, last + 1, TILE):
            q0 = poff[p0]
            q1 = poff[min(p0 + 1, last)]
            q2 = poff[min(p0 + 2, last)]
            q3 = poff[min(p0 + 3, last)]
            q4 = poff[min(p0 + 4, last)]
            q5 = poff[min(p0 + 5, last)]
            for t in range(TILE):
                vstore(part, t * B, vload(bias, cb * B))
            k = 0
            wi = wbase
            o = at(kruns, 0)
            while o != _END:
                a0 = vzero(wflat)
                a1 = a0
                a2 = a0
                a3 = a0
                a4 = a0
                a5 = a0
                while o >= 0:           # one run: see _runs
                    w = vload(wflat, wi)
                    a0 = vfma(vbroadcast(src, q0 + o), w, a0)
                    a1 = vfma(vbroadcast(src, q1 + o), w, a1)
                    a2 = vfma(vbroadcast(src, q2 + o), w, a2)
                    a3 = vfma(vbroadcast(src, q3 + o), w, a3)
                    a4 = vfma(vbroadcast(src, q4 + o), w, a4)
                    a5 = vfma(vbroadcast(src, q5 + o), w, a5)
                    wi += B
                    k += 1
                    o = at(kruns, k)
                _add_into(part, 0, a0)
                _add_into(part, B, a1)
                _add_into(part, 2 * B, a2)
                _add_into(part, 3 * B, a3)
                _add_into(part, 4 * B, a4)
                _add_into(part, 5 * B, a5)
                k += 1
                o = at(kruns, k)
            vscatter(out, obase + soff[p0], cstride, vload(part, 0), count)
            vscatter(out, obase + soff[min(p0 + 1, last)], cstride, vload(part, B), count)
            vscatter(out, obase + soff[min(p0 + 2, last)], cstride, vload(part, 2 * B), count)
            vscatter(out, obase + soff[min(p0 + 3, last)], cstride, vload(part, 3 * B), count)
            vscatter(out, obase + soff[min(p0 + 4, last)], cstride, vload(part, 4 * B), count)
            vscatter(out, obase + soff[min(p0 + 5, last)], cstride, vload(part, 5 * B), count)


@njit(nogil=True, cache=True, parallel=True)
def _gathered_weight_grad(src, koff, pruns, gb, n_out, out):
    """out[o*K + k] = sum_p src[poff[p] + koff[k]] * gb[o//B, p, o%B]  (out flat (O, K));
    ``pruns`` is poff in runs (``_runs``)."""
    OB, P = gb.shape[0], gb.shape[1]
    K = koff.shape[0]
    ktiles = (K + TILE - 1) // TILE
    gflat = gb.reshape(-1)
    last = K - 1
    for item in prange(OB * ktiles):
        B = vlanes(gb)              # inside the prange body: see _gathered_product
        cb = item // ktiles         # k tiles of one channel block run back to back:
        k0 = (item % ktiles) * TILE  # they read the same grad_out panel (measured: 18
        #                              against 24 ms the other way round, 512x512 at 4x4)
        o0 = koff[k0]
        o1 = koff[min(k0 + 1, last)]
        o2 = koff[min(k0 + 2, last)]
        o3 = koff[min(k0 + 3, last)]
        o4 = koff[min(k0 + 4, last)]
        o5 = koff[min(k0 + 5, last)]
        part = np.zeros(TILE * B, gb.dtype)     # the tile's sum of finished runs
        gi = cb * P * B
        p = 0
        q = at(pruns, 0)
        while q != _END:
            a0 = vzero(gflat)
            a1 = a0
            a2 = a0
            a3 = a0
            a4 = a0
            a5 = a0
            while q >= 0:               # one run: see _runs
                g = vload(gflat, gi)
                a0 = vfma(vbroadcast(src, q + o0), g, a0)
                a1 = vfma(vbroadcast(src, q + o1), g, a1)
                a2 = vfma(vbroadcast(src, q + o2), g, a2)
                a3 = vfma(vbroadcast(src, q + o3), g, a3)
                a4 = vfma(vbroadcast(src, q + o4), g, a4)
                a5 = vfma(vbroadcast(src, q + o5), g, a5)
                gi += B
                p += 1
                q = at(pruns, p)
            _add_into(part, 0, a0)
            _add_into(part, B, a1)
            _add_into(part, 2 * B, a2)
            _add_into(part, 3 * B, a3)
            _add_into(part, 4 * B, a4)
            _add_into(part, 5 * B, a5)
            p += 1
            q = at(pruns, p)
        count = min(B, n_out - cb * B)
        obase = cb * B * K
        vscatter(out, obase + k0, K, vload(part, 0), count)
        vscatter(out, obase + min(k0 + 1, last), K, vload(part, B), count)
        vscatter(out, obase + min(k0 + 2, last), K, vload(part, 2 * B), count)
        vscatter(out, obase + min(k0 + 3, last), K, vload(part, 3 * B), count)
        vscatter(out, obase + min(k0 + 4, last), K, vload(part, 4 * B), count)
        vscatter(out, obase + min(k0 + 5, last), K, vload(part, 5 * B), count)


@njit(nogil=True, cache=True, parallel=True)
def _row_product(src, kruns, plane, Wp, w2, bias, out):
    """out[n, o, oh, ow:ow+B] = bias[o] + sum_k src[n*plane + oh*Wp + ow + koff[k] : +B] * w2[o, k]

    ``kruns`` is koff in runs (``_runs``).

    The forward of a stride-1 convolution with a short reduction (ResNet's
    3-channel stem, K = 27): vectors run along the output row, so a finished
    tile is B contiguous outputs (one vector store) instead of 16 scattered
    ones, and the tile is 6 output channels x B pixels, the weights broadcast.
    The last tile of a row starts at Wo - B and recomputes a few outputs of
    the one before (same values, same places).  Needs Wo >= B."""
    N, O, Ho, Wo = out.shape
    K = w2.shape[1]
    otiles = (O + TILE - 1) // TILE
    wflat = w2.reshape(-1)
    oflat = out.reshape(-1)
    last = O - 1
    for item in prange(N * otiles):
        B = vlanes(out)             # inside the prange body: see _gathered_product
        rtiles = (Wo + B - 1) // B
        n = item // otiles
        o0 = (item % otiles) * TILE
        c0 = o0                         # the tile's output channels, the last repeated
        c1 = min(o0 + 1, last)
        c2 = min(o0 + 2, last)
        c3 = min(o0 + 3, last)
        c4 = min(o0 + 4, last)
        c5 = min(o0 + 5, last)
        for oh in range(Ho):
            for r in range(rtiles):
                ow = min(r * B, Wo - B)
                q = n * plane + oh * Wp + ow
                a0 = vbroadcast(bias, c0)
                a1 = vbroadcast(bias, c1)
                a2 = vbroadcast(bias, c2)
                a3 = vbroadcast(bias, c3)
                a4 = vbroadcast(bias, c4)
                a5 = vbroadcast(bias, c5)
                k = 0                   # the weight's column
                i = 0                       # the table's entry
                o = at(kruns, 0)
                while o != _END:            # a short reduction: one run, summed in place
                    while o >= 0:
                        v = vload(src, q + o)
                        a0 = vfma(vbroadcast(wflat, c0 * K + k), v, a0)
                        a1 = vfma(vbroadcast(wflat, c1 * K + k), v, a1)
                        a2 = vfma(vbroadcast(wflat, c2 * K + k), v, a2)
                        a3 = vfma(vbroadcast(wflat, c3 * K + k), v, a3)
                        a4 = vfma(vbroadcast(wflat, c4 * K + k), v, a4)
                        a5 = vfma(vbroadcast(wflat, c5 * K + k), v, a5)
                        k += 1
                        i += 1
                        o = at(kruns, i)
                    i += 1
                    o = at(kruns, i)
                row = (n * O * Ho + oh) * Wo + ow
                vstore(oflat, row + c0 * Ho * Wo, a0)
                vstore(oflat, row + c1 * Ho * Wo, a1)
                vstore(oflat, row + c2 * Ho * Wo, a2)
                vstore(oflat, row + c3 * Ho * Wo, a3)
                vstore(oflat, row + c4 * Ho * Wo, a4)
                vstore(oflat, row + c5 * Ho * Wo, a5)


# ------------------------------------------------------------------ offset tables
# The reduction loops read their offsets in runs: ``_runs`` writes the table as
# runs of REDUCTION_RUN offsets, each run followed by _END_RUN and the last by
# _END as well, and a kernel sums one run in registers (``while off >= 0``),
# then adds that sum to the tile's total.  Two reasons:
#
# * accuracy: one chain of K float32 FMAs per output drifts with K (a 256x256
#   3x3 layer: 5.3e-7 RMS relative error where MKL's SGEMM has 1.8e-7; such
#   drift flipped a ReLU whose input lay that close to 0, a 3e-3 error in one
#   BatchNorm's gradient of ResNet-18 at batch 2, tests/models/test_resnet.py);
#   runs of 64 bring it to 1.4e-7.
# * speed: with a trip count it can compute, LLVM unrolls the loop twice and
#   its scheduler then hoists 12 broadcasts above the FMAs, which spills half
#   the tile on AVX2 (16 ymm registers): 39 against 68 GFLOP/s on ResNet's
#   64-channel 3x3 layer, one core.  A sentinel hides the trip count.
#
# So every offset a loop reads is >= 0 (tables are shifted where needed).  The
# tables depend on shapes only and are cached (a few MB for 100k output pixels).
REDUCTION_RUN = 64
_END_RUN, _END = -1, -2


def _frozen(*arrays):
    for a in arrays:
        a.setflags(write=False)
    return arrays


def _runs(offsets, run=REDUCTION_RUN):
    """offsets (>= 0) in runs of ``run``, each closed by _END_RUN, then _END."""
    offsets = np.asarray(offsets, np.int64).reshape(-1)
    n_runs = -(-offsets.size // run)
    out = np.full(offsets.size + n_runs + 1, _END_RUN, np.int64)
    i = np.arange(offsets.size)
    out[i + i // run] = offsets
    out[-1] = _END
    return out


@functools.lru_cache(maxsize=32)
def _forward_tables(N, C, O, Hp, Wp, out_hw, ksize, stride, dilation):
    """(koff, koff in runs, poff, poff in runs, soff) of the forward over a
    padded (N, C, Hp, Wp) source writing (N, O, Ho, Wo); the weight gradient
    reads koff and poff in runs."""
    (Ho, Wo), (kh, kw), (sh, sw), (dh, dw) = out_hw, ksize, stride, dilation
    c, i, j = np.meshgrid(np.arange(C), np.arange(kh), np.arange(kw), indexing="ij")
    koff = (c * (Hp * Wp) + i * (dh * Wp) + j * dw).reshape(-1).astype(np.int64)
    n, oh, ow = np.meshgrid(np.arange(N), np.arange(Ho), np.arange(Wo), indexing="ij")
    poff = (n * (C * Hp * Wp) + oh * (sh * Wp) + ow * sw).reshape(-1).astype(np.int64)
    soff = (n * (O * Ho * Wo) + oh * Wo + ow).reshape(-1).astype(np.int64)
    return _frozen(koff, _runs(koff), poff, _runs(poff), soff)


def _phase_taps(k, s, pad, d, a):
    """Taps i of one axis that reach input positions a (mod s), and the output
    row offset of each: input row s*m + a gets tap i from output row m + off."""
    taps = [i for i in range(k) if (a + pad - i * d) % s == 0]
    return taps, [(a + pad - i * d) // s for i in taps]


@functools.lru_cache(maxsize=32)
def _input_grad_plan(x_shape, O, out_hw, ksize, stride, padding, dilation):
    """The padding of grad_out and, per phase, (taps, koff in runs, poff, soff); a
    tap is i*kw + j."""
    N, C, H, W = x_shape
    Ho, Wo = out_hw
    kw = ksize[1]
    axes = []                    # per axis: [(a, taps, offsets, phase length)]
    for size, k, s, p, d in zip((H, W), ksize, stride, padding, dilation):
        axes.append([(a,) + _phase_taps(k, s, p, d, a) + ((size - a + s - 1) // s,)
                     for a in range(min(s, size))])
    pads = []                    # (before, after) of grad_out along each axis
    for phases, n_out in zip(axes, (Ho, Wo)):
        offs = [(o, m) for _, _, off, m in phases for o in off]
        before = max([0] + [-o for o, _ in offs])
        after = max([0] + [m - 1 + o - (n_out - 1) for o, m in offs])
        pads.append((before, after))
    Hg, Wg = Ho + sum(pads[0]), Wo + sum(pads[1])
    phases = []
    for ah, ti, offh, mh in axes[0]:
        for aw, tj, offw, mw in axes[1]:
            TI, TJ = np.meshgrid(np.arange(len(ti)), np.arange(len(tj)), indexing="ij")
            tap_i = np.asarray(ti, np.int64)[TI.reshape(-1)]
            tap_j = np.asarray(tj, np.int64)[TJ.reshape(-1)]
            tap_off = (np.asarray(offh, np.int64)[TI.reshape(-1)] * Wg
                       + np.asarray(offw, np.int64)[TJ.reshape(-1)])
            koff = (np.arange(O)[:, None] * (Hg * Wg) + tap_off[None, :]).reshape(-1)
            n, m, q = np.meshgrid(np.arange(N), np.arange(mh), np.arange(mw), indexing="ij")
            poff = n * (O * Hg * Wg) + (m + pads[0][0]) * Wg + (q + pads[1][0])
            soff = n * (C * H * W) + (stride[0] * m + ah) * W + (stride[1] * q + aw)
            shift = min(0, int(tap_off.min())) if tap_off.size else 0   # koff >= 0: _runs
            phases.append(_frozen(tap_i * kw + tap_j, _runs(koff - shift),
                                  (poff + shift).reshape(-1), soff.reshape(-1)))
    return pads, tuple(phases)


# ------------------------------------------------------------------ entry points
def _padded(x, top, bottom, left, right):
    """x zero-padded (a contiguous copy), or x itself when no padding and contiguous.
    A non-contiguous x is made contiguous first: one compiled ``_pad`` per dtype."""
    x = np.ascontiguousarray(x)
    if not (top or bottom or left or right):
        return x
    N, C, H, W = x.shape
    out = np.empty((N, C, H + top + bottom, W + left + right), x.dtype)
    _pad(x, top, left, out)
    return out


def _source_padding(size, n_out, k, s, p, d):
    """(before, after) padding so every tap of every output position is inside."""
    need = (n_out - 1) * s + d * (k - 1) + 1         # rows the outputs reach, from -p
    return p, max(0, need - p - size)


SHORT_REDUCTION = 64    # C*kh*kw below this is short: _row_product's case


def row_wise(reduction, stride, out_w, dtype):
    """True when the forward takes ``_row_product``: a short reduction, stride 1
    and output rows of at least one vector."""
    return (reduction < SHORT_REDUCTION and tuple(stride) == (1, 1)
            and out_w >= lanes(np.dtype(dtype)))


def forward(x, w, bias, stride, padding, dilation, out_hw):
    """conv2d (groups=1) of x (N, C, H, W) and w (O, C, kh, kw) -> (N, O, Ho, Wo)."""
    N, C, H, W = x.shape
    O, _, kh, kw = w.shape
    dt = x.dtype
    B = lanes(dt)
    pt, pb = _source_padding(H, out_hw[0], kh, stride[0], padding[0], dilation[0])
    pl, pr = _source_padding(W, out_hw[1], kw, stride[1], padding[1], dilation[1])
    src = _padded(x, pt, pb, pl, pr)
    koff, kruns, poff, _, soff = _forward_tables(N, C, O, src.shape[2], src.shape[3],
                                                 tuple(out_hw), (kh, kw), tuple(stride),
                                                 tuple(dilation))
    y = np.empty((N, O) + tuple(out_hw), dt)
    if row_wise(C * kh * kw, stride, out_hw[1], dt):
        bias_c = np.zeros(O, dt) if bias is None else np.ascontiguousarray(bias, dt)
        _row_product(src.reshape(-1), kruns, src[0].size, src.shape[3],
                     np.ascontiguousarray(w.reshape(O, -1)), bias_c, y)
        return y
    OB = -(-O // B)
    wp = np.empty((OB, koff.shape[0], B), dt)
    _to_blocks(w.reshape(1, O, -1), wp)
    bias_b = np.zeros(OB * B, dt)
    if bias is not None:
        bias_b[:O] = bias
    _gathered_product(src.reshape(-1), kruns, poff, soff, out_hw[0] * out_hw[1], wp, bias_b, O,
                      y.reshape(-1))
    return y


def input_grad(gy, w, x_shape, stride, padding, dilation):
    """dL/dx (x_shape) of conv2d from grad_out gy (N, O, Ho, Wo) and w (O, C, kh, kw)."""
    N, O, Ho, Wo = gy.shape
    _, C, kh, kw = w.shape
    dt = gy.dtype
    B = lanes(dt)
    pads, phases = _input_grad_plan(tuple(x_shape), O, (Ho, Wo), (kh, kw), tuple(stride),
                                    tuple(padding), tuple(dilation))
    src = _padded(gy, pads[0][0], pads[0][1], pads[1][0], pads[1][1]).reshape(-1)
    CB = -(-C // B)
    zeros = np.zeros(CB * B, dt)
    # A phase no tap reaches (1x1 stride 2: three of four) is zero: memset, not tiles
    untouched = any(taps.shape[0] == 0 for taps, _, _, _ in phases)
    gx = np.zeros(x_shape, dt) if untouched else np.empty(x_shape, dt)
    flat = gx.reshape(-1)
    w3 = w.reshape(O, C, kh * kw)
    for taps, kruns, poff, soff in phases:
        if taps.shape[0] == 0:
            continue
        wq = np.empty((CB, O * taps.shape[0], B), dt)
        if taps.shape[0] == kh * kw:
            _to_blocks(w3, wq)
        else:
            _pack_transposed(w3, taps, wq)
        _gathered_product(src, kruns, poff, soff, x_shape[2] * x_shape[3], wq, zeros, C, flat)
    return gx


def weight_grad(x, gy, w_shape, stride, padding, dilation):
    """dL/dw (w_shape) of conv2d from x (N, C, H, W) and grad_out gy (N, O, Ho, Wo)."""
    N, C, H, W = x.shape
    O, _, kh, kw = w_shape
    _, _, Ho, Wo = gy.shape
    dt = gy.dtype
    B = lanes(dt)
    pt, pb = _source_padding(H, Ho, kh, stride[0], padding[0], dilation[0])
    pl, pr = _source_padding(W, Wo, kw, stride[1], padding[1], dilation[1])
    src = _padded(x, pt, pb, pl, pr)
    koff, _, _, pruns, _ = _forward_tables(N, C, O, src.shape[2], src.shape[3], (Ho, Wo),
                                           (kh, kw), tuple(stride), tuple(dilation))
    gb = np.empty((-(-O // B), N * Ho * Wo, B), dt)
    _to_blocks(np.ascontiguousarray(gy).reshape(N, O, Ho * Wo), gb)
    gw = np.empty(w_shape, dt)
    _gathered_weight_grad(src.reshape(-1), koff, pruns, gb, O, gw.reshape(-1))
    return gw
