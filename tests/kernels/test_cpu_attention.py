"""The fused attention kernels (kernels/cpu/attention.py) against a float64
NumPy reference of the unfused chain they replace,

    softmax(masked_fill((q @ k^T) * scale, masked, -inf)) @ v

and its backward (the chain's own: softmax's, the masked fill's zeros, the
matmuls'): float32 and float64, no mask, causal, broadcast masks, T != S,
Ev != E, strided and broadcast inputs, NaN rows (all masked) and non-finite
values at skipped positions, SDPA's zero rows, the parallel and serial
compilations, bad input."""
import numpy as np
import pytest

from pyflow.kernels import registry
from pyflow.kernels.cpu import attention, twin

pytestmark = pytest.mark.cpu_only

forward = registry.get("attention_forward", "cpu")
backward = registry.get("attention_backward", "cpu")


def _full_mask(masked, causal, shape):
    T, S = shape[-2:]
    full = np.zeros(shape, bool)
    if masked is not None:
        full |= masked
    if causal:
        full |= np.triu(np.ones((T, S), bool), 1)
    return full


def chain(q, k, v, masked=None, scale=0.5, causal=False):
    """The unfused chain in float64: (out, lse, probabilities, full mask)."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    with np.errstate(all="ignore"):             # NaN and inf cases follow IEEE, quietly
        s = (q @ np.swapaxes(k, -1, -2)) * scale
        full = _full_mask(masked, causal, s.shape)
        s = np.where(full, -np.inf, s)
        m = s.max(-1, keepdims=True)
        e = np.exp(s - m)
        tot = e.sum(-1, keepdims=True)
        p = e / tot
        return p @ v, (m + np.log(tot))[..., 0], p, full


def chain_backward(g, q, k, v, masked=None, scale=0.5, causal=False):
    """dq, dk, dv of the chain: softmax backward, masked fill backward (0 where
    masked), the scale, the matmuls."""
    g = np.asarray(g, np.float64)
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    _, _, p, full = chain(q, k, v, masked, scale, causal)
    with np.errstate(all="ignore"):
        dp = g @ np.swapaxes(v, -1, -2)
        ds = p * (dp - (dp * p).sum(-1, keepdims=True))
        ds = np.where(full, 0.0, ds) * scale
        return ds @ k, np.swapaxes(ds, -1, -2) @ q, np.swapaxes(p, -1, -2) @ g


TOL = {np.float64: dict(rtol=1e-11, atol=1e-12), np.float32: dict(rtol=2e-4, atol=2e-5)}


def _inputs(rng, lead=(2, 3), T=5, S=7, E=4, Ev=3, dtype=np.float64):
    q = rng.standard_normal(lead + (T, E)).astype(dtype)
    k = rng.standard_normal(lead + (S, E)).astype(dtype)
    v = rng.standard_normal(lead + (S, Ev)).astype(dtype)
    g = rng.standard_normal(lead + (T, Ev)).astype(dtype)
    return q, k, v, g


def _check(q, k, v, g, masked, scale, causal, dtype):
    out, lse = forward(q, k, v, masked, scale, causal)
    ref_out, ref_lse, _, _ = chain(q, k, v, masked, scale, causal)
    assert out.dtype == dtype and lse.dtype == dtype and out.flags.c_contiguous
    np.testing.assert_allclose(out, ref_out, **TOL[dtype])
    np.testing.assert_allclose(lse, ref_lse, **TOL[dtype])
    grads = backward(g, q, k, v, out, lse, masked, scale, causal)
    for ours, ref, x in zip(grads, chain_backward(g, q, k, v, masked, scale, causal), (q, k, v)):
        assert ours.dtype == dtype and ours.shape == x.shape
        np.testing.assert_allclose(ours, ref, **TOL[dtype])
    return out, lse, grads


MASKS = ["none", "causal", "full", "heads", "batch", "causal+mask"]


def _mask(rng, kind, lead, T, S):
    shape = {"full": lead + (T, S), "heads": (1, 1, T, S), "batch": lead[:1] + (1, T, S),
             "causal+mask": (T, S)}.get(kind)
    if shape is None:
        return None
    m = rng.random(shape) > 0.6
    m[..., 0] = False                 # every row keeps a key (NaN rows are tested below)
    return m


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("kind", MASKS)
@pytest.mark.parametrize("T, S, E, Ev", [(5, 7, 4, 3), (9, 4, 3, 6), (1, 1, 1, 1), (13, 13, 16, 16)])
def test_matches_the_unfused_chain(dtype, kind, T, S, E, Ev):
    rng = np.random.default_rng(T * 100 + S)
    q, k, v, g = _inputs(rng, (2, 3), T, S, E, Ev, dtype)
    _check(q, k, v, g, _mask(rng, kind, (2, 3), T, S), 0.37, "causal" in kind, dtype)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_strided_views_of_a_qkv_projection_are_read_in_place(dtype):
    """q, k, v as a GPT makes them: split + view + transpose of one (B, T, 3C)
    projection (strided 'A' views), the same numbers as contiguous copies;
    also a k broadcast over heads (stride 0) and a read-only mask."""
    rng = np.random.default_rng(1)
    B, T, H, E = 2, 6, 3, 4
    x = rng.standard_normal((B, T, 3 * H * E)).astype(dtype)
    q, k, v = (x[..., i * H * E:(i + 1) * H * E].reshape(B, T, H, E).transpose(0, 2, 1, 3)
               for i in range(3))
    assert not q.flags.c_contiguous and not q.flags.f_contiguous
    g = rng.standard_normal((B, T, H, E)).astype(dtype).transpose(0, 2, 1, 3)
    mask = np.broadcast_to(np.triu(np.ones((T, T), bool), 1), (B, H, T, T))
    for masked, causal in ((None, True), (mask, False)):
        out, lse, grads = _check(q, k, v, g, masked, 0.5, causal, dtype)
        c = [np.ascontiguousarray(a) for a in (q, k, v, g)]
        c_out, c_lse = forward(*c[:3], masked, 0.5, causal)
        assert np.array_equal(out, c_out) and np.array_equal(lse, c_lse)
        c_grads = backward(c[3], *c[:3], c_out, c_lse, masked, 0.5, causal)
        for a, b in zip(grads, c_grads):
            assert np.array_equal(a, b)
    k1 = np.broadcast_to(k[:, :1], k.shape)           # one key head shared: stride 0
    _check(q, k1, v, g, None, 0.5, True, dtype)


@pytest.mark.parametrize("lead", [(), (3,), (2, 2, 3)])
def test_any_number_of_leading_dims(lead):
    rng = np.random.default_rng(2)
    q, k, v, g = _inputs(rng, lead, 4, 5, 3, 2)
    masked = rng.random((4, 5)) > 0.7
    masked[:, 1] = False
    out, lse, _ = _check(q, k, v, g, masked, 0.8, False, np.float64)
    assert out.shape == lead + (4, 2) and lse.shape == lead + (4,)


def test_strided_five_dim_inputs():
    """Leading dims that cannot be merged into one without a copy."""
    rng = np.random.default_rng(3)
    q, k, v, g = _inputs(rng, (2, 3, 2), 4, 4, 3, 3)
    q, k, v, g = (a.transpose(1, 0, 2, 3, 4) for a in (q, k, v, g))
    _check(q, k, v, g, None, 0.5, True, np.float64)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_rows_with_every_score_masked_are_nan_as_in_the_chain(dtype):
    """The softmax of nothing is NaN: the chain's out row is NaN, its dq row 0
    (the masked fill's backward), and dv NaN (P^T @ dout reads the NaN row)."""
    rng = np.random.default_rng(4)
    q, k, v, g = _inputs(rng, (2, 2), 4, 5, 3, 2, dtype)
    masked = rng.random((2, 1, 4, 5)) > 0.5
    masked[:, :, :, 0] = False
    masked[0, :, 2] = True                          # row 2 of batch 0 keeps nothing
    out, lse, (dq, dk, dv) = _check(q, k, v, g, masked, 0.5, False, dtype)
    assert np.isnan(out[0, :, 2]).all() and np.isnan(lse[0, :, 2]).all()
    assert not np.isnan(out[1]).any() and not np.isnan(out[0, :, [0, 1, 3]]).any()
    assert (dq[0, :, 2] == 0).all() and np.isfinite(dk).all()
    assert np.isnan(dv[0]).all() and np.isfinite(dv[1]).all()


def test_nonfinite_values_spread_as_in_the_chain():
    """Causally masked keys are skipped only where that changes nothing: an
    inf in v behind the mask makes the chain's out NaN (0 * inf), an inf in k
    behind it makes dq NaN, a NaN in q or dout spreads through its row."""
    rng = np.random.default_rng(5)
    q, k, v, g = _inputs(rng, (1, 2), 5, 5, 3, 2)
    v[0, 0, 3, 1] = np.inf              # key 3: masked for queries 0..2
    k[0, 1, 4, 0] = -np.inf             # key 4: masked for queries 0..3
    q[0, 1, 2, 1] = np.nan
    g[0, 0, 1, 0] = np.nan
    out, _, grads = _check(q, k, v, g, None, 0.5, True, np.float64)
    assert np.isnan(out[0, 0, :3, 1]).all()
    assert np.isnan(grads[0][0, 1]).any()


def test_nonfinite_values_behind_the_mask_past_the_first_block():
    """The same rule where the skipping could change a result: T = S = 150
    spans three blocks of query rows, and the first block (rows 0..63) reads
    keys 0..63 only when masked keys are skipped.  An inf in v at key 140
    makes the chain's output NaN in rows 0..139 (0 * inf), a -inf in k at
    key 145 makes dq NaN in rows 0..144; skipping those keys would leave
    them finite."""
    rng = np.random.default_rng(8)
    q, k, v, g = _inputs(rng, (1, 1), 150, 150, 3, 2)
    v[0, 0, 140, 1] = np.inf
    k[0, 0, 145, 0] = -np.inf
    out, _, (dq, _, _) = _check(q, k, v, g, None, 0.5, True, np.float64)
    assert np.isnan(out[0, 0, :140, 1]).all()
    assert np.isnan(dq[0, 0, :145]).any(axis=-1).all()


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_zero_empty_rows(dtype):
    """scaled_dot_product_attention's rule: a row that keeps no key is 0, its
    lse -inf, and it adds nothing to any gradient."""
    rng = np.random.default_rng(6)
    q, k, v, g = _inputs(rng, (2, 2), 4, 5, 3, 2, dtype)
    masked = rng.random((4, 5)) > 0.5
    masked[:, 0] = False
    masked[1] = True
    out, lse = forward(q, k, v, masked, 0.5, False, zero_empty_rows=True)
    dq, dk, dv = backward(g, q, k, v, out, lse, masked, 0.5, False, zero_empty_rows=True)
    assert (out[:, :, 1] == 0).all() and (lse[:, :, 1] == -np.inf).all() and (dq[:, :, 1] == 0).all()
    keep = np.ones(4, bool)
    keep[1] = False
    kept = masked[keep]
    ref_out, _, _, _ = chain(q[:, :, keep], k, v, kept, 0.5, False)
    np.testing.assert_allclose(out[:, :, keep], ref_out, **TOL[dtype])
    ref = chain_backward(g[:, :, keep], q[:, :, keep], k, v, kept, 0.5, False)
    np.testing.assert_allclose(dq[:, :, keep], ref[0], **TOL[dtype])
    np.testing.assert_allclose(dk, ref[1], **TOL[dtype])
    np.testing.assert_allclose(dv, ref[2], **TOL[dtype])


def test_empty_dims():
    rng = np.random.default_rng(7)
    q, k, v, g = _inputs(rng, (2,), 3, 0, 2, 2)        # no key: out 0, as P @ v over nothing
    out, lse = forward(q, k, v, None, 0.5, False)
    assert (out == 0).all() and (lse == -np.inf).all()
    dq, dk, dv = backward(g, q, k, v, out, lse, None, 0.5, False)
    assert (dq == 0).all() and dk.shape == k.shape and dv.shape == v.shape
    q, k, v, g = _inputs(rng, (2,), 0, 3, 2, 2)        # no query
    out, lse = forward(q, k, v, None, 0.5, True)
    assert out.shape == (2, 0, 2) and lse.shape == (2, 0)
    dq, dk, dv = backward(g, q, k, v, out, lse, None, 0.5, True)
    assert (dk == 0).all() and (dv == 0).all()
    q, k, v, g = _inputs(rng, (2,), 3, 4, 0, 2)        # E = 0: every score 0
    _check(q, k, v, g, None, 0.5, True, np.float64)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_parallel_and_serial_compilations_agree_bit_for_bit(dtype, monkeypatch):
    """Which compilation runs depends on sizes only (twin.py); both give the same bits."""
    rng = np.random.default_rng(8)
    q, k, v, g = _inputs(rng, (2, 3), 6, 6, 4, 4, dtype)
    masked = rng.random((2, 1, 6, 6)) > 0.7
    results, used = [], []
    for threshold in (0, 1 << 62):
        monkeypatch.setattr(twin, "PARALLEL_MIN", threshold)
        for kernel in (attention._forward, attention._backward):    # which one ran
            monkeypatch.setattr(kernel, "parallel", _spy(kernel.parallel, used, "parallel"))
            monkeypatch.setattr(kernel, "serial", _spy(kernel.serial, used, "serial"))
        out, lse = forward(q, k, v, masked, 0.5, True)
        results.append((out, lse) + backward(g, q, k, v, out, lse, masked, 0.5, True))
        monkeypatch.undo()
    assert used == ["parallel"] * 2 + ["serial"] * 2
    for a, b in zip(*results):
        assert np.array_equal(a, b, equal_nan=True)
    assert not np.isnan(results[0][0]).all()


def _spy(fn, used, name):
    def call(*args):
        used.append(name)
        return fn(*args)
    return call


def test_bad_input():
    q = np.zeros((2, 3, 4))
    with pytest.raises(ValueError, match="same leading dims"):
        forward(q, np.zeros((3, 3, 4)), np.zeros((3, 3, 4)), None, 1.0, False)
    with pytest.raises(ValueError, match="same leading dims"):
        forward(q, np.zeros((2, 3, 5)), np.zeros((2, 3, 5)), None, 1.0, False)
    with pytest.raises(ValueError, match="one rank"):
        forward(q, np.zeros((3, 4)), np.zeros((3, 4)), None, 1.0, False)
    with pytest.raises(TypeError, match="all float32 or all float64"):
        forward(q, q.astype(np.float32), q, None, 1.0, False)
    with pytest.raises(TypeError, match="all float32 or all float64"):
        forward(q.astype(np.int64), q.astype(np.int64), q.astype(np.int64), None, 1.0, False)
    with pytest.raises(TypeError, match="masked must be a bool array"):
        forward(q, q, q, np.zeros((3, 3)), 1.0, False)
    with pytest.raises(ValueError, match=r"masked of shape \(4, 3\) does not broadcast"):
        forward(q, q, q, np.zeros((4, 3), bool), 1.0, False)
    out, lse = forward(q, q, q, None, 1.0, False)
    with pytest.raises(ValueError, match="do not match"):
        backward(out[:1], q, q, q, out, lse, None, 1.0, False)
