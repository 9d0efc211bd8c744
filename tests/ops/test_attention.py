"""scaled_dot_product_attention: float64 NumPy reference (no mask, causal,
bool and float masks, custom scale), finite differences for query, key, value
and a float mask, grouped-query heads, dropout, PyTorch, bad input."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

import pyflow as pf
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
