"""scaled_dot_product_attention: float64 NumPy reference (no mask, causal,
bool and float masks, custom scale), finite differences for query, key, value
and a float mask, grouped-query heads, dropout, PyTorch, bad input.

FusedAttention (the fused kernel, which SDPA runs on for CPU float32/float64
without dropout or float masks): the unfused chain it replaces (NumPy float64,
pyflow's own ops, PyTorch's), NaN rows where everything is masked, views of a
qkv projection, finite differences, double backward, bad input."""
import math
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, strategies as st

import pyflow as pf
import pyflow.nn.functional as F
from pyflow.ops.attention import FusedAttention
from tests.helpers import assert_close, check_grad, needs_torch, to_numpy, torch

sdpa = pf.scaled_dot_product_attention


def np_attention(q, k, v, mask=None, causal=False, scale=None):
    scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    s = q @ np.swapaxes(k, -1, -2) * scale
    L, S = s.shape[-2:]
    if causal:
        mask = np.tril(np.ones((L, S), bool))
    kept = np.ones(s.shape[:-1] + (1,), bool)
    if mask is not None:
        s = np.where(mask, s, -np.inf) if mask.dtype == bool else s + mask
        kept = (s > -np.inf).any(-1, keepdims=True)     # a row that keeps nothing is 0
        s = np.where(kept, s, 0.0)
    e = np.exp(s - s.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True) * kept) @ v


@given(data=st.data())
def test_against_reference(data):
    batch = data.draw(st.sampled_from([(), (2,), (2, 3)]))
    L, S, E, Ev = (data.draw(st.integers(1, 4)) for _ in range(4))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    q, k = rng.standard_normal(batch + (L, E)), rng.standard_normal(batch + (S, E))
    v = rng.standard_normal(batch + (S, Ev))
    kind = data.draw(st.sampled_from(["none", "causal", "bool", "float", "scale"]))
    kw, ref_kw = {}, {}
    if kind == "causal":
        kw, ref_kw = {"is_causal": True}, {"causal": True}
    elif kind == "bool":
        m = rng.random((L, S)) > 0.4
        m[:, 0] = True                       # every query attends somewhere
        kw, ref_kw = {"attn_mask": pf.tensor(m)}, {"mask": m}
    elif kind == "float":
        m = rng.standard_normal(batch[-1:] + (1, S))
        kw, ref_kw = {"attn_mask": pf.tensor(m)}, {"mask": m}
    elif kind == "scale":
        kw = ref_kw = {"scale": 0.3}
    out = sdpa(pf.tensor(q), pf.tensor(k), pf.tensor(v), **kw)
    assert_close(out, np_attention(q, k, v, **ref_kw), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kind", ["causal", "bool"])
def test_gradients_wrt_query_key_value(kind):
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 3, 2)) for _ in range(3))
    m = pf.tensor(np.array([[True, False, True], [True, True, False], [False, True, True]]))
    kw = {"is_causal": True} if kind == "causal" else {"attn_mask": m}
    check_grad(lambda a, b, c: sdpa(a, b, c, **kw), [q, k, v])


@pytest.mark.parametrize("float_mask", [False, True])
def test_rows_that_keep_nothing_are_zero_with_finite_gradients(float_mask):
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((2, 3, 4)) for _ in range(3))
    m = np.ones((3, 3), bool)
    m[1] = False
    m[2, 0] = False
    mask = np.where(m, 0.0, -np.inf) if float_mask else m
    out = sdpa(pf.tensor(q), pf.tensor(k), pf.tensor(v), attn_mask=pf.tensor(mask))
    assert_close(out, np_attention(q, k, v, mask))
    assert (to_numpy(out)[:, 1] == 0).all()
    check_grad(lambda q, k, v: sdpa(q, k, v, attn_mask=pf.tensor(mask)), [q, k, v])


def test_gradient_wrt_float_mask():
    rng = np.random.default_rng(1)
    q, k, v, m = (rng.standard_normal(s) for s in ((2, 3, 2), (2, 4, 2), (2, 4, 3), (3, 4)))
    check_grad(lambda a, b: sdpa(a, pf.tensor(k), pf.tensor(v), attn_mask=b), [q, m])


def test_causal_with_more_keys_than_queries_matches_torch_convention():
    # PyTorch's is_causal uses tril(ones(L, S)): query i sees keys 0..i
    rng = np.random.default_rng(2)
    q, k, v = rng.standard_normal((2, 3)), rng.standard_normal((4, 3)), rng.standard_normal((4, 2))
    out = sdpa(pf.tensor(q), pf.tensor(k), pf.tensor(v), is_causal=True)
    assert_close(out[0], v[0], rtol=1e-12)            # the first query sees only key 0
    assert_close(out, np_attention(q, k, v, causal=True), rtol=1e-12)


@pytest.mark.parametrize("L, S, scale", [(5, 3, 0.7), (3, 5, -0.4), (4, 4, 0.7)])
def test_fused_scale_and_causal_mask_gradients(L, S, scale):
    """The fused path (scale and causal mask inside the softmax kernel): more
    queries than keys, more keys than queries, a negative scale; batch dims."""
    rng = np.random.default_rng(6)
    q, k, v = (rng.standard_normal(s) for s in ((2, L, 3), (2, S, 3), (2, S, 2)))
    assert_close(sdpa(pf.tensor(q), pf.tensor(k), pf.tensor(v), is_causal=True, scale=scale),
                 np_attention(q, k, v, causal=True, scale=scale), rtol=1e-12)
    check_grad(lambda a, b, c: sdpa(a, b, c, is_causal=True, scale=scale), [q, k, v])


def test_causal_double_backward():
    """Gradients of gradients through the fused softmax: its backward composed
    of ops (create_graph) equals the kernel's, and is differentiated right."""
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((3, 2)) for _ in range(3))
    a, b, c = (pf.tensor(x, requires_grad=True) for x in (q, k, v))
    composed = pf.autograd.grad(sdpa(a, b, c, is_causal=True).square().sum(), [a, b],
                                create_graph=True)
    fused = pf.autograd.grad(sdpa(a, b, c, is_causal=True).square().sum(), [a, b])
    for x, y in zip(composed, fused):
        assert_close(x, to_numpy(y), rtol=1e-12)

    def grad_norm(a, b, c):
        if not a.requires_grad:             # finite differences evaluate without grad
            a = a.detach().requires_grad_(True)
        out = sdpa(a, b, c, is_causal=True)
        (ga,) = pf.autograd.grad((out * out).sum(), [a], create_graph=True)
        return (ga * ga).sum()
    check_grad(grad_norm, [q, k, v])


@pytest.mark.cpu_only   # the CPU backend's float32 loops; cudasim_rows.py checks the CUDA rows
def test_long_float32_rows_match_float64():
    """T = 130: the vectorized float32 row loops (8-lane maxima, remainders) and
    the masked tails, forward and backward, against the float64 result."""
    rng = np.random.default_rng(8)
    arrays = [rng.standard_normal((2, 130, 16)) for _ in range(3)]
    g = rng.standard_normal((2, 130, 16))
    grads = []
    for dtype in (pf.float32, pf.float64):
        ts = [pf.tensor(a, dtype=dtype, requires_grad=True) for a in arrays]
        out = sdpa(*ts, is_causal=True)
        out.backward(pf.tensor(g, dtype=dtype))
        grads.append([out] + [t.grad for t in ts])
    assert_close(grads[1][0], np_attention(*arrays, causal=True), rtol=1e-12)
    for ours, exact in zip(grads[0], grads[1]):
        assert_close(ours, to_numpy(exact), rtol=1e-4, atol=1e-5)


def test_grouped_query_attention():
    rng = np.random.default_rng(3)
    q = rng.standard_normal((1, 4, 3, 2))
    k, v = rng.standard_normal((1, 2, 3, 2)), rng.standard_normal((1, 2, 3, 2))
    out = sdpa(pf.tensor(q), pf.tensor(k), pf.tensor(v), enable_gqa=True)
    kr, vr = np.repeat(k, 2, axis=1), np.repeat(v, 2, axis=1)
    assert_close(out, np_attention(q, kr, vr), rtol=1e-12)


def test_dropout_uses_the_generator_and_float32():
    rng = np.random.default_rng(4)
    q, k, v = (pf.tensor(rng.standard_normal((2, 5, 4)), dtype=pf.float32) for _ in range(3))
    pf.manual_seed(7)
    a = sdpa(q, k, v, dropout_p=0.5)
    pf.manual_seed(7)
    b = sdpa(q, k, v, dropout_p=0.5)
    assert a.dtype is pf.float32 and pf.equal(a, b)
    assert not pf.allclose(a, sdpa(q, k, v))
    assert pf.equal(sdpa(q, k, v, dropout_p=1.0), pf.zeros(2, 5, 4))


def test_errors_are_clear():
    q = pf.ones(2, 3, 4)
    with pytest.raises(RuntimeError, match="same embedding size"):
        sdpa(q, pf.ones(2, 3, 5), pf.ones(2, 3, 5))
    with pytest.raises(RuntimeError, match="same sequence length"):
        sdpa(q, pf.ones(2, 3, 4), pf.ones(2, 2, 4))
    with pytest.raises(RuntimeError, match="should not be set when is_causal"):
        sdpa(q, q, q, attn_mask=pf.ones(3, 3), is_causal=True)
    with pytest.raises(RuntimeError, match=r"attn_mask.*\(4, 3\) and \(2, 3, 3\) are not broadcastable"):
        sdpa(q, q, q, attn_mask=pf.ones(4, 3))
    with pytest.raises(RuntimeError, match=r"attn_mask of shape \[2, 2, 3, 3\] must broadcast"):
        sdpa(q, q, q, attn_mask=pf.ones(2, 2, 3, 3))
    with pytest.raises(TypeError, match="bool or floating point"):
        sdpa(q, q, q, attn_mask=pf.tensor([[1, 0, 1]]))


@needs_torch
@pytest.mark.parametrize("kind", ["none", "causal", "bool", "float", "bool_empty_row",
                                  "float_empty_row"])
def test_against_torch(kind):
    rng = np.random.default_rng(5)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in
              ((2, 3, 4, 8), (2, 3, 6, 8), (2, 3, 6, 5))]
    kw, tkw = {}, {}
    if kind == "causal":
        kw = tkw = {"is_causal": True}
    elif kind == "bool":
        m = rng.random((4, 6)) > 0.5
        m[:, 0] = True
        kw, tkw = {"attn_mask": pf.tensor(m)}, {"attn_mask": torch.tensor(m)}
    elif kind == "float":
        m = rng.standard_normal((3, 1, 6)).astype(np.float32)
        kw, tkw = {"attn_mask": pf.tensor(m)}, {"attn_mask": torch.tensor(m)}
    elif kind.endswith("empty_row"):     # PyTorch: zeros for a row that attends to nothing
        m = rng.random((4, 6)) > 0.5
        m[:, 0], m[2] = True, False
        if kind == "float_empty_row":
            m = np.where(m, 0.0, -np.inf).astype(np.float32)
        kw, tkw = {"attn_mask": pf.tensor(m)}, {"attn_mask": torch.tensor(m)}
    ours = [pf.tensor(a, requires_grad=True) for a in arrays]
    theirs = [torch.tensor(a, requires_grad=True) for a in arrays]
    out = sdpa(*ours, **kw)
    ref = torch.nn.functional.scaled_dot_product_attention(*theirs, **tkw)
    assert_close(out, ref.detach().cpu().numpy(), rtol=1e-4, atol=1e-5)
    g = rng.standard_normal(tuple(ref.shape)).astype(np.float32)
    out.backward(pf.tensor(g))
    ref.backward(torch.tensor(g))
    for o, t in zip(ours, theirs):
        assert_close(o.grad, t.grad.cpu().numpy(), rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------ FusedAttention
def np_chain(q, k, v, masked=None, scale=0.5, causal=False):
    """softmax(masked_fill((q @ k^T) * scale, masked, -inf)) @ v in float64: a row
    with every score masked is NaN, as the softmax of nothing is."""
    with np.errstate(all="ignore"):
        s = (q @ np.swapaxes(k, -1, -2)) * scale
        if causal:
            s = np.where(np.triu(np.ones(s.shape[-2:], bool), 1), -np.inf, s)
        if masked is not None:
            s = np.where(masked, -np.inf, s)
        e = np.exp(s - s.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True) @ v


def pf_chain(q, k, v, masked=None, scale=0.5, causal=False):
    """The same chain in pyflow ops, as a model writes it."""
    att = (q @ k.transpose(-2, -1)) * scale
    if causal:
        T, S = att.shape[-2:]
        att = att.masked_fill(pf.tensor(np.triu(np.ones((T, S), bool), 1)), float("-inf"))
    if masked is not None:
        att = att.masked_fill(masked, float("-inf"))
    return F.softmax(att, dim=-1) @ v


def fused(q, k, v, masked=None, scale=0.5, causal=False):
    return FusedAttention.apply(q, k, v, masked, scale, causal)


def _qkv_views(rng, B=2, T=5, H=3, E=4, dtype=pf.float64):
    """q, k, v as nanoGPT makes them: a (B, T, 3C) projection split, viewed and
    transposed to (B, H, T, E), strided views of one leaf."""
    x = pf.tensor(rng.standard_normal((B, T, 3 * H * E)), dtype=dtype, requires_grad=True)
    q, k, v = (t.view(B, T, H, E).transpose(1, 2) for t in x.split(H * E, dim=2))
    return x, q, k, v


@pytest.mark.cpu_only
@pytest.mark.parametrize("kind", ["none", "causal", "heads", "batch", "full", "causal+mask"])
def test_fused_attention_against_reference_and_finite_differences(kind):
    rng = np.random.default_rng(10)
    B, H, T, S, E, Ev = 2, 2, 4, 5, 3, 2
    q, k, v = (rng.standard_normal(s) for s in ((B, H, T, E), (B, H, S, E), (B, H, S, Ev)))
    shape = {"heads": (1, 1, T, S), "batch": (B, 1, T, S), "full": (B, H, T, S),
             "causal+mask": (T, S)}.get(kind)
    m = None
    if shape is not None:
        m = rng.random(shape) > 0.6
        m[..., 0] = False
    causal = "causal" in kind
    masked = None if m is None else pf.tensor(m)
    out = fused(pf.tensor(q), pf.tensor(k), pf.tensor(v), masked, 0.7, causal)
    assert_close(out, np_chain(q, k, v, m, 0.7, causal), rtol=1e-12, atol=1e-13)
    check_grad(lambda a, b, c: fused(a, b, c, masked, 0.7, causal), [q, k, v])


@pytest.mark.cpu_only
@pytest.mark.parametrize("dtype", [pf.float32, pf.float64])
@pytest.mark.parametrize("causal", [False, True])
def test_fused_attention_equals_the_pyflow_chain_on_qkv_views(dtype, causal):
    """The model's own chain and the fused op on the same strided views of a
    qkv projection: outputs and the gradient reaching the projection."""
    rng = np.random.default_rng(11)
    tol = dict(rtol=1e-12, atol=1e-13) if dtype is pf.float64 else dict(rtol=2e-5, atol=2e-6)
    T = 6
    m = pf.tensor(np.triu(np.ones((T, T), bool), 1) | (rng.random((T, T)) > 0.8))
    m[:, 0] = False
    masked = None if causal else m
    g = pf.tensor(rng.standard_normal((2, 3, T, 4)), dtype=dtype)
    results = []
    for fn in (pf_chain, fused):
        x, q, k, v = _qkv_views(np.random.default_rng(12), T=T, dtype=dtype)
        assert not q.is_contiguous()
        out = fn(q, k, v, masked, 1 / math.sqrt(4), causal)
        out.backward(g)
        results.append((out, x.grad))
    assert results[1][0].dtype is dtype
    for a, b in zip(*results):
        assert_close(a, to_numpy(b), **tol)


@pytest.mark.cpu_only
@pytest.mark.parametrize("dtype", [pf.float32, pf.float64])
def test_fused_attention_rows_with_everything_masked_are_nan_like_the_chain(dtype):
    """The fused op replaces user code whose eager result is NaN on a row that
    masks every key (softmax of all -inf): the same NaN there, and the same
    gradients (the chain's dq row is 0, its dv NaN)."""
    rng = np.random.default_rng(13)
    m = rng.random((4, 5)) > 0.5
    m[:, 0] = False
    m[2] = True
    masked = pf.tensor(m)
    arrays = [rng.standard_normal(s) for s in ((2, 4, 3), (2, 5, 3), (2, 5, 2))]
    g = pf.tensor(rng.standard_normal((2, 4, 2)), dtype=dtype)
    results = []
    for fn in (pf_chain, fused):
        ts = [pf.tensor(a, dtype=dtype, requires_grad=True) for a in arrays]
        out = fn(*ts, masked)
        out.backward(g)
        results.append([out] + [t.grad for t in ts])
    out = to_numpy(results[1][0])
    assert np.isnan(out[:, 2]).all() and not np.isnan(out[:, [0, 1, 3]]).any()
    assert (to_numpy(results[1][1])[:, 2] == 0).all() and np.isnan(to_numpy(results[1][3])).all()
    tol = dict(rtol=1e-12, atol=1e-13) if dtype is pf.float64 else dict(rtol=2e-5, atol=2e-6)
    for a, b in zip(*results):      # NaN where the chain has NaN (assert_allclose's equal_nan)
        assert_close(a, to_numpy(b), **tol)
    assert_close(results[1][0], np_chain(*arrays, m), **tol)


@pytest.mark.cpu_only
@pytest.mark.parametrize("dtype", [pf.float16, pf.bfloat16])
def test_fused_attention_half_precision_computes_in_float32(dtype):
    rng = np.random.default_rng(14)
    arrays = [rng.standard_normal((2, 3, 4)) for _ in range(3)]
    ts = [pf.tensor(a, dtype=dtype, requires_grad=True) for a in arrays]
    out = fused(*ts, None, 0.5, True)
    assert out.dtype is dtype
    ref = fused(*[t.detach().float() for t in ts], None, 0.5, True)
    assert pf.equal(out, ref.to(dtype))
    out.sum().backward()
    assert all(t.grad.dtype is dtype for t in ts)


@pytest.mark.cpu_only
def test_fused_attention_double_backward():
    """create_graph: the backward is composed of ops and differentiates again."""
    rng = np.random.default_rng(15)
    q, k, v = (rng.standard_normal((2, 3, 2)) for _ in range(3))
    m = pf.tensor(np.array([[False, True, False], [False, False, True], [True, False, False]]))
    a, b, c = (pf.tensor(x, requires_grad=True) for x in (q, k, v))
    composed = pf.autograd.grad(fused(a, b, c, m).square().sum(), [a, b, c], create_graph=True)
    kernel = pf.autograd.grad(fused(a, b, c, m).square().sum(), [a, b, c])
    for x, y in zip(composed, kernel):
        assert_close(x, to_numpy(y), rtol=1e-12, atol=1e-14)

    def grad_norm(a, b, c):
        if not a.requires_grad:             # finite differences evaluate without grad
            a = a.detach().requires_grad_(True)
        (ga,) = pf.autograd.grad(fused(a, b, c, m, 0.5, True).square().sum(), [a],
                                 create_graph=True)
        return (ga * ga).sum()
    check_grad(grad_norm, [q, k, v])


@pytest.mark.cpu_only
def test_sdpa_runs_on_the_fused_kernel_where_it_applies():
    rng = np.random.default_rng(16)
    q, k, v = (pf.tensor(rng.standard_normal((2, 3, 4, 8)), dtype=pf.float32,
                         requires_grad=True) for _ in range(3))
    m = pf.tensor(rng.random((4, 4)) > 0.3)

    def op(**kw):
        return sdpa(q, k, v, **kw).grad_fn.fn.__name__
    assert op() == op(is_causal=True) == op(attn_mask=m) == "FusedAttention"
    assert op(attn_mask=pf.zeros(4, 4)) != "FusedAttention"            # a float mask
    assert op(dropout_p=0.5) != "FusedAttention"
    big = pf.ones(2, 4, 128, 64)                # 2**22 multiply-adds: BLAS does better
    assert sdpa(big, big, big, is_causal=True).grad_fn is None       # (no grad: composed)
    assert not pf.ops.attention._fusable(big, big, big, None, 0.0)
    small = big[:1, :2, :64]                    # 2**20
    assert pf.ops.attention._fusable(small, small, small, None, 0.0)
    q16 = q.detach().to(pf.bfloat16).requires_grad_(True)
    assert sdpa(q16, q16, q16).grad_fn.fn.__name__ != "FusedAttention"
    # leading dims that broadcast: expanded views, the gradient summed back
    kk = pf.tensor(rng.standard_normal((3, 4, 8)), requires_grad=True)
    out = sdpa(q.double(), kk, kk, is_causal=True)
    assert out.shape == (2, 3, 4, 8)
    out.sum().backward()
    assert kk.grad.shape == (3, 4, 8)


@pytest.mark.cpu_only
def test_sdpa_rows_that_keep_nothing_stay_zero_on_the_fused_kernel():
    """SDPA's rule (zeros, finite gradients), not the chain's NaN, through the
    fused op's zero_empty_rows; the same numbers as PyTorch's math path."""
    rng = np.random.default_rng(17)
    q, k, v = (rng.standard_normal((2, 3, 4)) for _ in range(3))
    m = np.ones((2, 3, 3), bool)
    m[0, 1] = False
    m[1, 2, :2] = False
    out = sdpa(pf.tensor(q), pf.tensor(k), pf.tensor(v), attn_mask=pf.tensor(m))
    assert out.grad_fn is None or out.grad_fn.fn is FusedAttention
    assert (to_numpy(out)[0, 1] == 0).all()
    assert_close(out, np_attention(q, k, v, m), rtol=1e-12)
    check_grad(lambda a, b, c: sdpa(a, b, c, attn_mask=pf.tensor(m)), [q, k, v])


@needs_torch
@pytest.mark.cpu_only
@pytest.mark.parametrize("kind", ["causal", "mask", "nan_row"])
def test_fused_attention_against_torch(kind):
    """Against PyTorch's manual chain (NaN rows included) and its SDPA (with
    attn_mask = ~masked, where no row is empty)."""
    rng = np.random.default_rng(18)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in
              ((2, 3, 6, 8), (2, 3, 7, 8), (2, 3, 7, 5))]
    m = rng.random((2, 1, 6, 7)) > 0.6
    m[..., 0] = False
    if kind == "nan_row":
        m[1, 0, 3] = True
    causal = kind == "causal"
    masked = None if causal else m
    g = rng.standard_normal((2, 3, 6, 5)).astype(np.float32)
    ours = [pf.tensor(a, requires_grad=True) for a in arrays]
    out = fused(*ours, None if masked is None else pf.tensor(masked), 0.3, causal)
    out.backward(pf.tensor(g))
    theirs = [torch.tensor(a, requires_grad=True) for a in arrays]
    tq, tk, tv = theirs
    att = (tq @ tk.transpose(-2, -1)) * 0.3
    tm = torch.ones(6, 7, dtype=torch.bool).triu(1) if causal else torch.tensor(m)
    ref = torch.softmax(att.masked_fill(tm, float("-inf")), dim=-1) @ tv
    ref.backward(torch.tensor(g))
    assert_close(out, ref.detach().numpy(), rtol=1e-4, atol=1e-5)
    for o, t in zip(ours, theirs):
        assert_close(o.grad, t.grad.numpy(), rtol=1e-4, atol=1e-5)
    if kind != "nan_row":
        tkw = {"is_causal": True} if causal else {"attn_mask": ~torch.tensor(m)}
        sd = torch.nn.functional.scaled_dot_product_attention(
            *[torch.tensor(a) for a in arrays], scale=0.3, **tkw)
        assert_close(out, sd.numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.cpu_only
def test_fused_attention_bad_input():
    q = pf.ones(2, 3, 4)
    with pytest.raises(TypeError, match="argument 'k' must be a Tensor"):
        fused(q, np.ones((2, 3, 4)), q)
    with pytest.raises(RuntimeError, match="q must be at least 2-D"):
        fused(pf.ones(4), q, q)
    with pytest.raises(RuntimeError, match="v must be floating point"):
        fused(q, q, pf.ones(2, 3, 4, dtype=pf.int64))
    with pytest.raises(RuntimeError, match="same dtype.*float32, float64 and float32"):
        fused(q, q.double(), q)
    with pytest.raises(RuntimeError, match=r"same leading \(batch, head\) dims.*\[2, 3, 4\], "
                                           r"\[1, 3, 4\]"):
        fused(q, pf.ones(1, 3, 4), pf.ones(1, 3, 4))
    with pytest.raises(RuntimeError, match="same embedding size"):
        fused(q, pf.ones(2, 3, 5), q)
    with pytest.raises(RuntimeError, match="same sequence length"):
        fused(q, q, pf.ones(2, 2, 4))
    with pytest.raises(TypeError, match="masked must be a bool tensor"):
        fused(q, q, q, pf.ones(3, 3))
    with pytest.raises(RuntimeError, match=r"masked.*\(4, 3\) and \(2, 3, 3\) are not broadcastable"):
        fused(q, q, q, pf.ones(4, 3, dtype=pf.bool))
    with pytest.raises(RuntimeError, match=r"masked of shape \[2, 2, 3, 3\] must broadcast"):
        fused(q, q, q, pf.ones(2, 2, 3, 3, dtype=pf.bool))
    with pytest.raises(TypeError, match="scale must be a real number"):
        fused(q, q, q, None, "0.5")
    with pytest.raises(TypeError, match="causal must be a bool"):
        fused(q, q, q, None, 0.5, None)


@pytest.mark.cpu_only
def test_fused_attention_names_a_device_without_its_kernel():
    """CPU only so far: on the cuda device (numba's simulator, a child process)
    a clear RuntimeError; scaled_dot_product_attention keeps its composed path there."""
    script = (
        "import pyflow as pf\n"
        "from pyflow.ops.attention import FusedAttention\n"
        "q = pf.ones(2, 3, 4, device='cuda')\n"
        "try:\n"
        "    FusedAttention.apply(q, q, q, None, 0.5, True)\n"
        "except RuntimeError as e:\n"
        "    print('error:', e)\n"
        "print('sdpa on', pf.scaled_dot_product_attention(q, q, q, is_causal=True).device)\n")
    proc = subprocess.run([sys.executable, "-c", script],
                          env=dict(os.environ, NUMBA_ENABLE_CUDASIM="1"),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "error: FusedAttention(): only CPU tensors have a fused attention kernel so far, " \
           "got tensors on cuda:0" in proc.stdout
    assert "sdpa on cuda:0" in proc.stdout
