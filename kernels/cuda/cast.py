"""Casts between storage dtypes on the GPU, bfloat16 words included (the
counterpart of ``kernels/cpu/cast.py``, same signature and results).

Between NumPy storage dtypes a cast is ``copy.copy_into`` with a dtype change:
numba's conversions are C's (float -> int truncates, float64 -> float32 and
-> float16 round to nearest even), and conversions to bool are ``v != 0``.

bfloat16 is stored as uint16 words, and numba.cuda has no bf16 type its
simulator could test, so both directions are integer kernels over the bits,
reached through same-size dtype views (metadata only, no copy):

* float32 -> bfloat16: round to nearest even on the 32-bit pattern,
  ``(u + 0x7FFF + ((u >> 16) & 1)) >> 16``, NaNs kept quiet NaNs; exactly the
  CPU's integer formula, so both give the same words;
* bfloat16 -> float32: ``word << 16`` (exact).

Other dtypes go through float32 on the way, as on the CPU (float64 ->
bfloat16 rounds twice, exactly like the CPU kernel).
"""
import numpy as np
from numba import cuda

from ..registry import register
from ._memory import empty, launch_config, stream
from .copy import contiguous, copy, describe, read_only, size_of

_F32 = np.dtype(np.float32)
_U16 = np.dtype(np.uint16)
_U32 = np.dtype(np.uint32)
_EXP_MASK = np.uint32(0x7FFFFFFF)
_INF_BITS = np.uint32(0x7F800000)
_ROUND = np.uint32(0x7FFF)
_QUIET = np.uint32(0x40)
_ONE = np.uint32(1)
_S16 = np.uint32(16)


def _f32_bits_to_bf16(out, bits):
    for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        u = bits[i]
        if (u & _EXP_MASK) > _INF_BITS:                 # NaN: keep it a quiet NaN
            out[i] = np.uint16((u >> _S16) | _QUIET)
        else:                                           # round to nearest even
            out[i] = np.uint16(np.uint32(u + _ROUND + ((u >> _S16) & _ONE)) >> _S16)


def _bf16_to_f32_bits(out, words):
    for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        out[i] = np.uint32(words[i]) << _S16


KERNEL_FUNCTIONS = {"f32_bits_to_bf16": _f32_bits_to_bf16, "bf16_to_f32_bits": _bf16_to_f32_bits}
_jitted = {}


def _launch(name, n, *args):
    k = _jitted.get(name)
    if k is None:
        k = _jitted[name] = cuda.jit(KERNEL_FUNCTIONS[name])
    blocks, threads = launch_config(n)
    k[blocks, threads, stream()](*args)


def float32_to_bfloat16(x):
    """bfloat16 words (uint16, C-contiguous) of a float32 device array."""
    shape = tuple(describe(x)[0])
    src = contiguous(x, _F32)
    out = empty(shape, _U16, x)
    if size_of(out):
        _launch("f32_bits_to_bf16", size_of(out), out.reshape(-1),
                read_only(src.reshape(-1).view(_U32)))
    return out


def bfloat16_to_float32(words):
    """float32 values (C-contiguous) of a device array of bfloat16 words."""
    shape = tuple(describe(words)[0])
    src = contiguous(words, _U16)
    bits = empty(shape, _U32, words)
    if size_of(bits):
        _launch("bf16_to_f32_bits", size_of(bits), bits.reshape(-1), read_only(src.reshape(-1)))
    return bits.view(_F32)


@register("cast", "cuda")
def cast(x, src, dst):
    """Convert device array ``x`` stored as pyflow dtype ``src`` to storage of ``dst``."""
    if describe(x)[2] != src.storage:
        raise TypeError(f"cast: array of dtype {describe(x)[2]} is not the storage of "
                        f"{src.name} ({src.storage})")
    if src is dst:
        return copy(x)
    if src.name == "bfloat16":
        x = bfloat16_to_float32(x)
    if dst.name == "bfloat16":
        return float32_to_bfloat16(x)       # converts to float32 first when needed
    if describe(x)[2] == dst.storage:
        return x if src.name == "bfloat16" else copy(x)
    return copy(x, dst.storage)
