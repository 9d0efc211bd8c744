"""Joining and layout kernels on the GPU: cat, flip, roll, tile, triangle masks,
one-hot, constant padding (counterparts of ``kernels/cpu/join.py``).

All are index math over the C-contiguous output, one thread per output element
in a grid-stride loop, reading the input through its element strides (any
layout: transposed, sliced, expanded, negative strides):

* ``cat`` copies each input into its slice of the output (``copy.copy_into``,
  one launch per input);
* ``flip`` is a copy of the view with negated strides along the flipped axes;
* ``roll`` and ``tile`` share one remapping kernel: output coordinate ``i``
  along a dim reads input coordinate ``(i + add) % n`` (``add = n - shift``
  for roll, 0 for tile, whose output dim is ``reps * n`` long);
* ``tril`` / ``triu`` keep the elements with ``lo <= col - row <= hi``;
* ``pad_constant`` writes ``value`` outside the destination box and the source
  element inside it, in one pass;
* ``one_hot`` scatters ones into a zeroed output, one thread per index.

Every kernel works on any storage dtype (bfloat16 words included: a copy never
looks at the bits).
"""
import numbers

import numpy as np
from numba import cuda

from ..registry import register
from ._memory import empty, launch_config, stream, to_host, zeros
from .copy import copy, copy_into, describe, operand, pad_dims, read_only, size_of
from .index import check_range, device_index


# ------------------------------------------------------------------ kernels
def _remap(out, src, src_off, src_st, src_shape, shape, add):
    for t in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        rem = t
        p = src_off
        for d in range(len(shape) - 1, -1, -1):
            q = rem // shape[d]
            j = rem - q * shape[d]
            rem = q
            p += ((j + add[d]) % src_shape[d]) * src_st[d]
        out[t] = src[p]


def _triangle(out, src, src_off, src_st, shape, lo, hi):
    """Keep src where lo <= col - row <= hi over the last two dims, else 0."""
    n_rows = shape[len(shape) - 2]
    n_cols = shape[len(shape) - 1]
    for t in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        col = t % n_cols
        row = (t // n_cols) % n_rows
        diag = col - row
        if lo <= diag and diag <= hi:
            rem = t
            p = src_off
            for d in range(len(shape) - 1, -1, -1):
                q = rem // shape[d]
                j = rem - q * shape[d]
                rem = q
                p += j * src_st[d]
            out[t] = src[p]
        else:
            out[t] = 0


def _pad(out, src, src_off, src_st, shape, lo, length, value):
    """out = value, except src at out coordinates lo[d] <= i_d < lo[d] + length[d]."""
    for t in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        rem = t
        p = src_off
        inside = True
        for d in range(len(shape) - 1, -1, -1):
            q = rem // shape[d]
            j = rem - q * shape[d] - lo[d]
            rem = q
            if j < 0 or j >= length[d]:
                inside = False
            p += j * src_st[d]
        if inside:
            out[t] = src[p]
        else:
            out[t] = value


def _fill(out, value):
    for t in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        out[t] = value


def _one_hot(out, idx, num_classes):
    for t in range(cuda.grid(1), idx.size, cuda.gridsize(1)):
        out[t * num_classes + idx[t]] = 1


KERNEL_FUNCTIONS = {"remap": _remap, "triangle": _triangle, "pad": _pad, "fill": _fill,
                    "one_hot": _one_hot}
_jitted = {}


def _jit(name):
    k = _jitted.get(name)
    if k is None:
        k = _jitted[name] = cuda.jit(KERNEL_FUNCTIONS[name])
    return k


def _launch(name, n, *args):
    blocks, threads = launch_config(n)
    _jit(name)[blocks, threads, stream()](*args)


def _ndim(x):
    return len(describe(x)[0])


# ------------------------------------------------------------------ registered kernels
@register("cat", "cuda")
def cat(arrays, axis):
    """``np.concatenate(arrays, axis)``: one strided copy per input into its slice."""
    arrays = list(arrays)
    if not arrays:
        raise ValueError("cat: need at least one array to concatenate")
    shapes = [tuple(describe(a)[0]) for a in arrays]
    nd = len(shapes[0])
    if nd == 0:
        raise ValueError("cat: zero-dimensional arrays cannot be concatenated")
    if not -nd <= axis < nd:
        raise ValueError(f"cat: axis {axis} is out of bounds for arrays of dimension {nd}")
    axis %= nd
    for k, s in enumerate(shapes):
        if len(s) != nd:
            raise ValueError(f"cat: all the input arrays must have the same number of "
                             f"dimensions, but the array at index 0 has {nd} dimension(s) and "
                             f"the array at index {k} has {len(s)} dimension(s)")
        for d in range(nd):
            if d != axis and s[d] != shapes[0][d]:
                raise ValueError(f"cat: all the input array dimensions except for the "
                                 f"concatenation axis must match exactly, but along dimension "
                                 f"{d}, the array at index 0 has size {shapes[0][d]} and the "
                                 f"array at index {k} has size {s[d]}")
    dtype = np.result_type(*(describe(a)[2] for a in arrays))
    out_shape = list(shapes[0])
    out_shape[axis] = sum(s[axis] for s in shapes)
    out = empty(tuple(out_shape), dtype, arrays[0])
    start = 0
    for a, s in zip(arrays, shapes):
        if s[axis]:
            copy_into(out[(slice(None),) * axis + (slice(start, start + s[axis]),)], a)
        start += s[axis]
    return out


@register("flip", "cuda")
def flip(x, axes):
    """A C-contiguous copy of ``x`` reversed along ``axes``."""
    nd = _ndim(x)
    if isinstance(axes, numbers.Integral):
        axes = (axes,)
    axes = {a % nd for a in axes} if nd else set()
    view = x[tuple(slice(None, None, -1) if d in axes else slice(None) for d in range(nd))]
    return copy(view)


def _remapped(x, out_shape, add):
    shape, _, dtype = describe(x)
    out = empty(tuple(out_shape), dtype, x)
    if size_of(out) == 0:
        return out
    view, off, st = operand(x, what="x")
    kshape, (st, add, src_shape) = pad_dims(tuple(out_shape), st, add, shape)
    if len(shape) == 0:
        src_shape = (1,)
    _launch("remap", size_of(out), out.reshape(-1), read_only(view), off, st,
            tuple(src_shape), kshape, tuple(add))
    return out


@register("roll", "cuda")
def roll(x, shifts, axes):
    """``np.roll(x, shifts, axes)``: out[..., i, ...] = x[..., (i - shift) % n, ...]."""
    shape = tuple(describe(x)[0])
    if axes is None:
        flat = copy(x).reshape(-1)
        return roll(flat, shifts, 0).reshape(shape)
    nd = len(shape)
    total = [0] * nd
    try:
        pairs = np.broadcast(np.asarray(shifts), np.asarray(axes))
    except ValueError:
        raise ValueError(f"roll: 'shifts' {shifts!r} and 'axes' {axes!r} should not "
                         f"broadcast together") from None
    for s, a in pairs:
        a = int(a)
        if not -nd <= a < nd:
            raise ValueError(f"roll: axis {a} is out of bounds for array of dimension {nd}")
        total[a % nd] += int(s)
    add = [(n - s % n) % n if n else 0 for n, s in zip(shape, total)]
    return _remapped(x, shape, add)


@register("tile", "cuda")
def tile(x, reps):
    """``np.tile(x, reps)``: out coordinate i reads x at i % n along every dim."""
    reps = (reps,) if isinstance(reps, numbers.Integral) else tuple(int(r) for r in reps)
    if any(r < 0 for r in reps):
        raise ValueError(f"tile: negative repetitions are not allowed, got {reps}")
    shape = tuple(describe(x)[0])
    nd = max(len(shape), len(reps))
    reps = (1,) * (nd - len(reps)) + reps
    in_shape = (1,) * (nd - len(shape)) + shape
    x = x.reshape(in_shape) if in_shape != shape else x     # only adds dims of 1: a view
    return _remapped(x, tuple(r * n for r, n in zip(reps, in_shape)), [0] * nd)


def _triangle_copy(x, lo, hi, op):
    shape, _, dtype = describe(x)
    if len(shape) < 2:
        raise ValueError(f"{op}: input must have at least 2 dimensions, got shape "
                         f"{tuple(shape)}")
    out = empty(tuple(shape), dtype, x)
    if size_of(out) == 0:
        return out
    view, off, st = operand(x, what="x")
    _launch("triangle", size_of(out), out.reshape(-1), read_only(view), off, tuple(st),
            tuple(shape), lo, hi)
    return out


_FAR = 1 << 62     # beyond any column - row difference


@register("tril", "cuda")
def tril(x, k):
    """Zero the elements above diagonal ``k`` of the last two dims."""
    return _triangle_copy(x, -_FAR, int(k), "tril")


@register("triu", "cuda")
def triu(x, k):
    """Zero the elements below diagonal ``k`` of the last two dims."""
    return _triangle_copy(x, int(k), _FAR, "triu")


@register("one_hot", "cuda")
def one_hot(idx, num_classes):
    """``idx`` (int64, any shape) -> idx.shape + (num_classes,) int64 of 0/1."""
    shape = tuple(describe(idx)[0])
    flat = device_index(idx, idx).reshape(-1)
    out = zeros((size_of(flat), num_classes), np.int64, flat)
    if size_of(flat):
        if num_classes <= 0:
            raise RuntimeError("one_hot: Class values must be smaller than num_classes "
                               f"({num_classes})")
        check_range(flat, num_classes, "one_hot")
        _launch("one_hot", size_of(flat), out.reshape(-1), read_only(flat), num_classes)
    return out.reshape(shape + (num_classes,))


def _box(key, shape, what):
    """(starts, lengths) of a key of step-1 slices over ``shape``, or None."""
    key = tuple(key) + (slice(None),) * (len(shape) - len(tuple(key)))
    if len(key) != len(shape) or not all(isinstance(k, slice) for k in key):
        return None
    starts, lengths = [], []
    for k, n in zip(key, shape):
        start, stop, step = k.indices(n)
        if step != 1:
            return None
        starts.append(start)
        lengths.append(max(stop - start, 0))
    return starts, lengths


@register("pad_constant", "cuda")
def pad_constant(x, out_shape, src_key, dst_key, value):
    """A ``value``-filled array of ``out_shape`` with ``x[src_key]`` at ``dst_key``."""
    dtype = describe(x)[2]
    if isinstance(value, np.ndarray):
        value = value.reshape(())[()]
    elif hasattr(value, "__cuda_array_interface__"):
        value = to_host(value).reshape(())[()]
    value = np.asarray(value).astype(dtype)[()]          # a NumPy scalar of x's dtype
    out_shape = tuple(int(n) for n in out_shape)
    out = empty(out_shape, dtype, x)
    if size_of(out) == 0:
        return out
    src = x[tuple(src_key)]
    s_shape = tuple(describe(src)[0])
    if not out_shape:                           # 0-d: nothing to pad
        return copy_into(out, src)
    box = _box(dst_key, out_shape, "dst_key")
    if box is None or size_of(src) == 0:        # general keys: fill, then copy the box
        _launch("fill", size_of(out), out.reshape(-1), value)
        if size_of(src):
            copy_into(out[tuple(dst_key)], src)
        return out
    starts, lengths = box
    if tuple(lengths) != s_shape:
        raise ValueError(f"pad_constant: x[src_key] has shape {s_shape} but out[dst_key] has "
                         f"shape {tuple(lengths)}")
    view, off, st = operand(src, what="x[src_key]")
    kshape, (st, starts, lengths) = pad_dims(out_shape, st, starts, lengths)
    _launch("pad", size_of(out), out.reshape(-1), read_only(view), off, st, kshape,
            tuple(starts), tuple(lengths), value)
    return out
