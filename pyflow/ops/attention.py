"""Attention: ``FusedAttention``, one kernel forward and one backward, and
``scaled_dot_product_attention`` (PyTorch's), which runs on it where it can.

``FusedAttention.apply(q, k, v, masked, scale, causal)`` is the chain

    softmax(masked_fill((q @ k^T) * scale, masked, -inf)) @ v

of a hand-written attention (nanoGPT's), in one numba kernel per direction
(kernels/cpu/attention.py): no (..., T, S) scores, probabilities or their
gradients in memory, the probabilities recomputed in the backward from each
row's saved log-sum-exp.  ``masked`` (a bool tensor broadcasting to the scores,
or None) is True where a score is masked out (``masked_fill``'s sense); ``causal``
also masks key j > query i (PyTorch's top-left aligned ``is_causal``).  Its
results are the chain's up to rounding, NaN included: a row whose scores are
all masked is NaN, as the softmax of nothing is.  CPU only for now.

``scaled_dot_product_attention`` uses it on CPU for float32/float64 without
dropout, with no mask, ``is_causal`` or a bool ``attn_mask`` (True = attend,
passed on as ``masked = ~attn_mask``), and keeps PyTorch's rule that a row whose
mask keeps no position gives zeros (with zero gradients), not NaN: the
kernel's ``zero_empty_rows``; and only on small problems (``FUSED_MAX_WORK``:
the kernel's numba loops lose to BLAS on big products).  Everything else
(float masks, dropout, other devices and dtypes, big shapes) is composed of
pyflow ops (PyTorch's math path):

    softmax(q @ k^T * scale + bias) @ v

Autograd flows through matmul and softmax there.  Without a mask, or with
``is_causal``, the scale and the causal mask are fused into the softmax kernel
(``softmax(scores, scale=, causal=)``, OneFlow's fused_scale_tril_softmax): no
scaled copy of q, no L x S bias tensor and no add, and the masked half of every
row is neither read nor exponentiated, forward or backward.  Boolean masks
(True = attend, as in PyTorch) become an additive bias of 0 / -inf built once;
a float mask is added as it is (and gets a gradient if it requires one).  A row
whose mask keeps no position (all False, or all -inf) gives zeros there too: its
bias is 0 (so the softmax and its gradient stay finite) and its probabilities
are multiplied by 0.
"""
import math

import numpy as np

from .._hooks import recordable
from .. import dtypes as _dt
from ..autograd import Function, autocast_op, is_grad_enabled
from ..distributed.sbp import broadcast as _B
from ..distributed.sbp import split as _S
from ..distributed.signatures import Candidate
from ..tensor import Tensor
from ._util import (array_module, broadcast_shapes, check_same_device, check_tensor,
                    compute_array, is_number, kernel, wrap)
from .dropout import dropout
from .linalg import matmul
from .softmax import Softmax
from .elementwise import where

__all__ = ["scaled_dot_product_attention"]


# ------------------------------------------------------------------ fused attention
def _attention_rule(args):
    """Every (batch, head) matrix is computed alone: q, k, v split alike on a
    leading dim (the mask too where it has that dim), the output on it."""
    q, masked = args[0], args[3]
    lead = q.ndim - 2
    cands = []
    for d in range(lead):
        ins = (_S(d),) * 3
        if masked is not None:
            m = d - (q.ndim - masked.ndim)
            ins += (_S(m) if m >= 0 and masked.shape[m] != 1 else _B,)
        cands.append(Candidate(ins, (_S(d),)))
    cands.append(Candidate((_B,) * (3 + (masked is not None)), (_B,)))
    return cands


def _check_fused(q, k, v, masked, scale, causal):
    op = "FusedAttention"
    _check_operands(op, (("q", q), ("k", k), ("v", v)), "(..., T, E)")
    if not (q.dtype is k.dtype is v.dtype):
        raise RuntimeError(f"{op}(): expected q, k and v to have the same dtype, got "
                           f"{q.dtype.name}, {k.dtype.name} and {v.dtype.name}")
    if tuple(q.shape[:-2]) != tuple(k.shape[:-2]) or tuple(q.shape[:-2]) != tuple(v.shape[:-2]):
        raise RuntimeError(f"{op}(): q, k and v must have the same leading (batch, head) dims, "
                           f"got shapes {list(q.shape)}, {list(k.shape)} and {list(v.shape)}")
    if q.shape[-1] != k.shape[-1]:
        raise RuntimeError(f"{op}(): q and k must have the same embedding size (last dim), "
                           f"got {q.shape[-1]} and {k.shape[-1]}")
    if k.shape[-2] != v.shape[-2]:
        raise RuntimeError(f"{op}(): k and v must have the same sequence length (dim -2), got "
                           f"{k.shape[-2]} and {v.shape[-2]}")
    if masked is not None:
        check_tensor(masked, "masked", op)
        if masked.dtype is not _dt.bool:
            raise TypeError(f"{op}(): masked must be a bool tensor (True: masked out) or None, "
                            f"got {masked.dtype}")
        scores = tuple(q.shape[:-1]) + (k.shape[-2],)
        if broadcast_shapes(tuple(masked.shape), scores, op=f"{op} (masked)") != scores:
            raise RuntimeError(f"{op}(): masked of shape {list(masked.shape)} must broadcast "
                               f"to the scores' shape {list(scores)}")
    if not is_number(scale) or isinstance(scale, bool) or isinstance(scale, complex):
        raise TypeError(f"{op}(): scale must be a real number, got {type(scale).__name__}")
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"{op}(): causal must be a bool, got {type(causal).__name__}")
    check_same_device(op, ("q", q), k=k, v=v, masked=masked)
    if q.device.type != "cpu":
        raise RuntimeError(f"{op}(): only CPU tensors have a fused attention kernel so far, "
                           f"got tensors on {q.device}")


class FusedAttention(Function):
    """softmax(masked_fill((q @ k^T) * scale, masked, -inf)) @ v in one kernel.

    ``apply(q, k, v, masked, scale, causal, zero_empty_rows=False)``: q (..., T, E),
    k (..., S, E), v (..., S, Ev) with the same leading dims, any strides;
    ``masked`` a bool tensor broadcasting to (..., T, S) (True: masked out) or None.
    A row with every score masked is NaN, as in the chain, unless
    ``zero_empty_rows`` (scaled_dot_product_attention's rule): then 0.
    float16/bfloat16 are computed in float32."""
    sbp_rule = _attention_rule

    @classmethod
    def forward(cls, ctx, q, k, v, masked, scale, causal, zero_empty_rows=False):
        _check_fused(q, k, v, masked, scale, causal)
        dtype, dev = q.dtype, q.device.type
        out, lse = kernel("attention_forward", dev)(
            compute_array(q, dtype), compute_array(k, dtype), compute_array(v, dtype),
            None if masked is None else masked._data, float(scale), bool(causal),
            bool(zero_empty_rows))
        y = wrap(out, dtype, q.device)
        ctx.save_for_backward(q, k, v, y, masked)
        # out in the compute dtype (y rounds it for float16/bfloat16) and the
        # rows' log-sum-exp: what the backward kernel recomputes P from
        ctx.out, ctx.lse = out, lse
        ctx.args = (float(scale), bool(causal), bool(zero_empty_rows))
        return y

    @classmethod
    def backward(cls, ctx, g):
        q, k, v, _, masked = ctx.saved_tensors
        scale, causal, zero_empty = ctx.args
        if is_grad_enabled():       # create_graph: the same gradients, written with ops
            grads = _composed_backward(g, q, k, v, masked, scale, causal, zero_empty)
        else:
            dtype = q.dtype
            dq, dk, dv = kernel("attention_backward", q.device.type)(
                compute_array(g, dtype), compute_array(q, dtype), compute_array(k, dtype),
                compute_array(v, dtype), ctx.out, ctx.lse,
                None if masked is None else masked._data, scale, causal, zero_empty)
            grads = (wrap(dq, dtype, q.device), wrap(dk, dtype, q.device),
                     wrap(dv, dtype, q.device))
        return grads + (None, None, None, None)


def _full_mask(q, k, masked, causal):
    """The masked positions (True) of (..., T, S) scores as a bool tensor, or None."""
    T, S = q.shape[-2], k.shape[-2]
    full = None if masked is None else masked._data
    if causal:
        xp = array_module(q._data)
        tri = xp.asarray(np.triu(np.ones((T, S), bool), 1))
        full = tri if full is None else full | tri
    return None if full is None else Tensor._make(full, _dt.bool, q.device)


def _composed_backward(g, q, k, v, masked, scale, causal, zero_empty):
    """FusedAttention's gradients composed of differentiable ops (double backward)."""
    full = _full_mask(q, k, masked, causal)
    kept = None
    if full is not None and zero_empty:
        empty = full._data.all(axis=-1, keepdims=True)      # rows that keep no key: 0
        kept = wrap(~empty, q.dtype, q.device)
        full = Tensor._make(full._data & ~empty, _dt.bool, q.device)
    scores = matmul(q, k.transpose(-2, -1)) * scale
    if full is not None:
        scores = where(full, -np.inf, scores)
    p = Softmax.apply(scores, scores.ndim - 1)
    if kept is not None:
        p = p * kept
    dp = matmul(g, v.transpose(-2, -1))
    ds = p * (dp - (dp * p).sum(-1, keepdim=True))
    if full is not None:
        ds = where(full, 0.0, ds)
    ds = ds * scale
    return matmul(ds, k), matmul(ds.transpose(-2, -1), q), matmul(p.transpose(-2, -1), g)


def _repeat_heads(t, times):
    """(..., H, S, E) -> (..., H * times, S, E), each head repeated ``times`` in a row."""
    if times == 1:
        return t
    shape = tuple(t.shape)
    t = t.unsqueeze(-3).expand(*shape[:-2], times, *shape[-2:])
    return t.reshape(*shape[:-3], shape[-3] * times, *shape[-2:])


def _check_operands(op, named, layout):
    """Each (name, tensor) a floating point Tensor of at least 2 dims."""
    for name, t in named:
        check_tensor(t, name, op)
        if t.ndim < 2:
            raise RuntimeError(f"{op}(): {name} must be at least 2-D {layout}, got shape "
                               f"{list(t.shape)}")
        if not t.dtype.is_floating_point:
            raise RuntimeError(f"{op}(): {name} must be floating point, got {t.dtype}")


def _validate(query, key, value, attn_mask, dropout_p, is_causal):
    op = "scaled_dot_product_attention"
    _check_operands(op, (("query", query), ("key", key), ("value", value)), "(..., L, E)")
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


# Multiply-adds (heads * L * S * (E + Ev)) up to which SDPA runs on the fused
# kernel.  Its numba loops reach 15-45 GFLOP/s, BLAS more on big products: on
# the 2-core EPYC, forward + backward of 8 x 4 heads of 32 x 32 x 16 (2**20)
# took 749 us fused against 788 composed (is_causal), but 8 x 12 heads of
# 128 x 128 x 64 (2**27) 23.2 ms against 14.2 (bench numbers of issue 16).
FUSED_MAX_WORK = 1 << 21


def _fusable(query, key, value, attn_mask, dropout_p):
    """True where FusedAttention computes scaled_dot_product_attention: local
    float32/float64 CPU tensors of one dtype, no dropout, no mask or a bool one,
    small enough for the fused kernel to beat BLAS (``FUSED_MAX_WORK``)."""
    dtype = query.dtype
    try:
        heads = math.prod(broadcast_shapes(*(tuple(t.shape[:-2]) for t in (query, key, value))))
    except RuntimeError:        # the composed path says what does not broadcast
        return False
    work = heads * query.shape[-2] * key.shape[-2] * (query.shape[-1] + value.shape[-1])
    return dropout_p == 0.0 and query.device.type == "cpu" and work <= FUSED_MAX_WORK \
        and (dtype is _dt.float32 or dtype is _dt.float64) \
        and key.dtype is dtype and value.dtype is dtype \
        and (attn_mask is None or attn_mask.dtype is _dt.bool) \
        and all(t is None or t._placement is None for t in (query, key, value, attn_mask))


def _expand_lead(t, lead):
    """``t`` (..., n, d) with its leading dims broadcast to ``lead`` (a view)."""
    if tuple(t.shape[:-2]) == lead:
        return t
    return t.expand(*lead, *t.shape[-2:])


@autocast_op("lower")
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
    if _fusable(query, key, value, attn_mask, dropout_p):
        lead = broadcast_shapes(*(tuple(t.shape[:-2]) for t in (query, key, value)),
                                op="scaled_dot_product_attention")
        query, key, value = (_expand_lead(t, lead) for t in (query, key, value))
        masked = None if attn_mask is None else ~attn_mask
        # zero_empty_rows: a row whose attn_mask keeps nothing is 0, as in PyTorch
        return FusedAttention.apply(query, key, value, masked, scale, bool(is_causal),
                                    attn_mask is not None)
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
