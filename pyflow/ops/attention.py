"""scaled_dot_product_attention, composed of pyflow ops (PyTorch's math path):

    softmax(q @ k^T * scale + bias) @ v

Autograd flows through matmul and softmax, so there is no backward here.
Without a mask, or with ``is_causal``, the scale and the causal mask are fused
into the softmax kernel (``softmax(scores, scale=, causal=)``, OneFlow's
fused_scale_tril_softmax): no scaled copy of q, no L x S bias tensor and no
add, and the masked half of every row is neither read nor exponentiated,
forward or backward.  Boolean masks (True = attend, as in PyTorch) become an
additive bias of 0 / -inf built once; a float mask is added as it is (and gets
a gradient if it requires one).

A row whose mask keeps no position (all False, or all -inf) gives zeros, as in
PyTorch, not the NaN of a softmax over nothing: its bias is 0 (so the softmax
and its gradient stay finite) and its probabilities are multiplied by 0.
"""
import math

import numpy as np

from .._hooks import recordable
from .. import dtypes as _dt
from ._util import array_module, broadcast_shapes, check_same_device, check_tensor, wrap
from .dropout import dropout
from .linalg import matmul
from .softmax import Softmax
from .elementwise import where

__all__ = ["scaled_dot_product_attention"]


def _repeat_heads(t, times):
    """(..., H, S, E) -> (..., H * times, S, E), each head repeated ``times`` in a row."""
    if times == 1:
        return t
    shape = tuple(t.shape)
    t = t.unsqueeze(-3).expand(*shape[:-2], times, *shape[-2:])
    return t.reshape(*shape[:-3], shape[-3] * times, *shape[-2:])


def _validate(query, key, value, attn_mask, dropout_p, is_causal):
    op = "scaled_dot_product_attention"
    for name, t in (("query", query), ("key", key), ("value", value)):
        check_tensor(t, name, op)
        if t.ndim < 2:
            raise RuntimeError(f"{op}(): {name} must be at least 2-D (..., L, E), got shape "
                               f"{list(t.shape)}")
        if not t.dtype.is_floating_point:
            raise RuntimeError(f"{op}(): {name} must be floating point, got {t.dtype}")
    if query.shape[-1] != key.shape[-1]:
        raise RuntimeError(f"{op}(): query and key must have the same embedding size (last "
                           f"dim), got {query.shape[-1]} and {key.shape[-1]}")
    if key.shape[-2] != value.shape[-2]:
        raise RuntimeError(f"{op}(): key and value must have the same sequence length (dim -2), "
                           f"got {key.shape[-2]} and {value.shape[-2]}")
    if not 0.0 <= dropout_p <= 1.0:
        raise ValueError(f"{op}(): dropout_p must be between 0 and 1, got {dropout_p}")
    if attn_mask is not None:
        if is_causal:
            raise RuntimeError(f"{op}(): explicit attn_mask should not be set when "
                               f"is_causal=True")
        check_tensor(attn_mask, "attn_mask", op)
        if attn_mask.dtype is not _dt.bool and not attn_mask.dtype.is_floating_point:
            raise TypeError(f"{op}(): attn_mask must be a bool or floating point tensor, got "
                            f"{attn_mask.dtype}")
        L, S = query.shape[-2], key.shape[-2]
        scores = tuple(query.shape[:-2]) + (L, S)
        if broadcast_shapes(tuple(attn_mask.shape), scores, op=f"{op} (attn_mask)") != scores:
            raise RuntimeError(f"{op}(): attn_mask of shape {list(attn_mask.shape)} must "
                               f"broadcast to the attention scores' shape {list(scores)}")


@recordable
def _mask_bias(keep, dtype):
    """0 where the boolean mask keeps a position, -inf elsewhere; 0 on rows
    that keep nothing (``_kept_rows`` zeroes those)."""
    xp = array_module(keep._data)
    kept = keep._data.any(axis=-1, keepdims=True)
    return wrap(xp.where(keep._data | ~kept, 0.0, -np.inf), dtype, keep.device)


@recordable
def _kept_rows(mask, dtype):
    """1 on the rows where ``mask`` keeps some position, 0 on the others."""
    data = mask._data if mask.dtype is _dt.bool else mask._data > -np.inf
    return wrap(data.any(axis=-1, keepdims=True), dtype, mask.device)


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False):
    """Attention of query (..., L, E) over key (..., S, E) and value (..., S, Ev)."""
    _validate(query, key, value, attn_mask, dropout_p, is_causal)
    if enable_gqa and query.ndim >= 3 and key.shape[-3] != query.shape[-3]:
        hq, hk = query.shape[-3], key.shape[-3]
        if hq % hk or value.shape[-3] != hk:
            raise RuntimeError(f"scaled_dot_product_attention(): with enable_gqa, query heads "
                               f"({hq}) must be a multiple of key/value heads ({hk}, "
                               f"{value.shape[-3]})")
        key, value = _repeat_heads(key, hq // hk), _repeat_heads(value, hq // hk)
    check_same_device("scaled_dot_product_attention", ("query", query), key=key, value=value,
                      attn_mask=attn_mask)
    if scale is None:   # E = 0: every score is 0 whatever the scale (PyTorch's 1/sqrt(0))
        scale = 1.0 / math.sqrt(query.shape[-1]) if query.shape[-1] else 1.0
    scale = float(scale)
    if attn_mask is None:       # no mask or causal: scale and mask fused into the softmax
        scores = matmul(query, key.transpose(-2, -1))
        attn = Softmax.apply(scores, scores.ndim - 1, scale, bool(is_causal))
    else:
        scores = matmul(query * scale, key.transpose(-2, -1))
        kept = _kept_rows(attn_mask, scores.dtype)
        bias = _mask_bias(attn_mask, scores.dtype) if attn_mask.dtype is _dt.bool else \
            where(kept > 0, attn_mask, 0.0)
        attn = Softmax.apply(scores + bias, scores.ndim - 1) * kept
    if dropout_p > 0.0:
        attn = dropout(attn, dropout_p)
    return matmul(attn, value)
