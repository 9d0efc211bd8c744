"""Casts between storage dtypes, including bfloat16 held as 16-bit words."""
import numpy as np
from numba import njit

from ..registry import register


@njit(nogil=True, cache=True)
def _f32_to_bf16(src, dst):
    bits = src.view(np.uint32)
    for i in range(bits.size):
        u = bits[i]
        if (u & 0x7FFFFFFF) > 0x7F800000:           # NaN: keep it a quiet NaN
            dst[i] = np.uint16((u >> 16) | 0x40)
        else:                                        # round to nearest even
            dst[i] = np.uint16((u + 0x7FFF + ((u >> 16) & 1)) >> 16)


def float32_to_bfloat16(x):
    x = np.asarray(x, dtype=np.float32, order="C")   # keeps 0-d arrays 0-d
    out = np.empty(x.shape, np.uint16)
    _f32_to_bf16(x.reshape(-1), out.reshape(-1))
    return out


def bfloat16_to_float32(words):
    bits = np.asarray(words).astype(np.uint32) << np.uint32(16)
    return np.asarray(bits).view(np.float32)


@register("cast", "cpu")
def cast(x, src, dst):
    """Convert array ``x`` stored as pyflow dtype ``src`` to storage of ``dst``."""
    if src is dst:
        return x.copy()
    if src.name == "bfloat16":
        x = bfloat16_to_float32(x)
    if dst.name == "bfloat16":
        return float32_to_bfloat16(x)
    if dst.name == "float16":           # beyond its range is inf, silently, as in PyTorch
        with np.errstate(over="ignore"):
            return x.astype(np.float16)
    return x.astype(dst.storage)
