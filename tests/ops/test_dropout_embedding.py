"""dropout (mask statistics, scaling, generator reproducibility, in-place,
gradient = same mask) and embedding (gather, scatter-add gradient, padding_idx,
scale_grad_by_freq, max_norm, double backward, PyTorch, bad indices)."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

import pyflow as pf
from tests.helpers import assert_close, check_grad, layouts, make_input, needs_torch, torch


# ------------------------------------------------------------------ dropout
M0, M1, W0, W1 = 0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85


def philox_mask_reference(n, p, seed, offset=0):
    """The keep mask of the documented scheme, in vectorized NumPy: element e
    uses word e % 4 of Philox-4x32-10((e//4, 0, offset lo, offset hi), (seed lo,
    seed hi)) and is kept when float32((bits >> 8) * 2**-24) >= float32(p)."""
    lo = np.uint64(0xFFFFFFFF)
    c = [np.arange((n + 3) // 4, dtype=np.uint64), np.zeros((n + 3) // 4, np.uint64),
         np.full((n + 3) // 4, offset & 0xFFFFFFFF, np.uint64),
         np.full((n + 3) // 4, offset >> 32, np.uint64)]
    k0, k1 = np.uint64(seed & 0xFFFFFFFF), np.uint64(seed >> 32)
    for _ in range(10):
        p0, p1 = np.uint64(M0) * c[0], np.uint64(M1) * c[2]
        c = [(p1 >> np.uint64(32)) ^ c[1] ^ k0, p1 & lo, (p0 >> np.uint64(32)) ^ c[3] ^ k1, p0 & lo]
        k0, k1 = (k0 + np.uint64(W0)) & lo, (k1 + np.uint64(W1)) & lo
    bits = np.stack(c, axis=1).reshape(-1)[:n]
    return (bits >> np.uint64(8)).astype(np.float32) * np.float32(2.0 ** -24) >= np.float32(p)


def next_seed(gen):
    """The 64-bit seed dropout takes from ``gen`` (one draw per call)."""
    return int(gen.numpy.integers(0, 1 << 64, dtype=np.uint64))


@given(data=st.data())
def test_dropout_keeps_and_scales(data):
    shape = data.draw(st.lists(st.integers(1, 5), min_size=1, max_size=3).map(tuple))
    p = data.draw(st.sampled_from([0.1, 0.5, 0.9]))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    x, tx = make_input(rng, shape, data.draw(layouts()), low=0.5, high=2.0)  # no zeros
    tx.requires_grad_()
    out = pf.dropout(tx, p)
    y = out.detach().cpu().numpy()
    kept = y != 0
    assert_close(y[kept], x[kept] / (1 - p), rtol=1e-12)
    g = rng.standard_normal(shape)
    out.backward(pf.tensor(g))
    assert_close(tx.grad, np.where(kept, g / (1 - p), 0.0), rtol=1e-12)


@given(data=st.data())
def test_dropout_mask_is_philox_of_the_generator_seed(data):
    """The mask is a function of the logical element index and the seed drawn
    from the generator only: not of the layout, the dtype or the device."""
    shape = data.draw(st.lists(st.integers(1, 6), min_size=1, max_size=3).map(tuple))
    p = data.draw(st.sampled_from([0.0625, 0.3, 0.75]))
    s = data.draw(st.integers(0, 2**64 - 1))
    rng = np.random.default_rng(s % 2**32)
    x, tx = make_input(rng, shape, data.draw(layouts()), low=0.5, high=2.0)
    out = pf.dropout(tx, p, generator=pf.Generator().manual_seed(s))
    want = philox_mask_reference(x.size, p, next_seed(pf.Generator().manual_seed(s)))
    assert np.array_equal(out.cpu().numpy().reshape(-1) != 0, want)
    half = pf.dropout(pf.tensor(x, dtype=pf.float16), p, generator=pf.Generator().manual_seed(s))
    assert np.array_equal(half.float().cpu().numpy().reshape(-1) != 0, want)


@pytest.mark.parametrize("shape, p", [((3, 1025), 0.3), ((64, 128), 0.5), ((64, 9216), 0.25)])
def test_dropout_mask_of_large_tensors_is_philox(shape, p):
    """Sizes past the CPU kernel's 1024-element blocks, with a ragged tail, and
    the MNIST CNN's (64, 9216), which runs on the threads: mask and values."""
    s = 0x0123456789ABCDEF
    x = np.random.default_rng(4).standard_normal(shape).astype(np.float32)
    out = pf.dropout(pf.tensor(x), p, generator=pf.Generator().manual_seed(s)).cpu().numpy()
    keep = philox_mask_reference(x.size, p, next_seed(pf.Generator().manual_seed(s)))
    want = x.reshape(-1) * np.where(keep, np.float32(1 / (1 - p)), np.float32(0))
    assert np.array_equal(out.reshape(-1), want)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_dropout_keep_rate_is_binomial(p):
    n = 20000
    kept = (pf.dropout(pf.ones(n), p, generator=pf.Generator().manual_seed(11)).cpu().numpy()
            != 0).mean()
    sigma = np.sqrt(p * (1 - p) / n)             # binomial standard deviation of the rate
    assert abs(kept - (1 - p)) < 5 * sigma, (kept, 1 - p, sigma)


def test_dropout_fraction_and_generator():
    x = pf.ones(200, 100)
    gen = pf.Generator().manual_seed(3)
    a = pf.dropout(x, 0.3, generator=gen)
    assert abs((a.cpu().numpy() != 0).mean() - 0.7) < 5 * np.sqrt(0.21 / x.numel())
    assert not pf.equal(a, pf.dropout(x, 0.3, generator=gen))    # the generator advanced
    gen.manual_seed(3)
    assert pf.equal(a, pf.dropout(x, 0.3, generator=gen))
    pf.manual_seed(5)
    b = pf.dropout(x, 0.3)
    state = pf.get_rng_state()
    c = pf.dropout(x, 0.3)
    pf.manual_seed(5)
    assert pf.equal(b, pf.dropout(x, 0.3)) and not pf.equal(a, b)
    pf.set_rng_state(state)
    assert pf.equal(c, pf.dropout(x, 0.3)) and not pf.equal(b, c)


def test_dropout_gradient_is_mask_times_scale_and_double_backward():
    rng = np.random.default_rng(2)
    w = rng.standard_normal((3, 4))
    # a fresh generator per call: the same mask each time, so dropout is linear in t
    check_grad(lambda t: pf.dropout(t, 0.4, generator=pf.Generator().manual_seed(9)), [w])
    t = pf.tensor(w, requires_grad=True)
    out = pf.dropout(t, 0.4, generator=pf.Generator().manual_seed(9))
    (g,) = pf.autograd.grad(out.sum(), t, create_graph=True)
    keep = philox_mask_reference(12, 0.4, next_seed(pf.Generator().manual_seed(9))).reshape(3, 4)
    assert_close(g, np.where(keep, 1 / 0.6, 0.0), rtol=1e-12)
    assert_close(out, np.where(keep, w / 0.6, 0.0), rtol=1e-12)


def test_dropout_special_cases():
    x = pf.tensor([1.0, 2.0, 3.0], requires_grad=True)
    assert pf.dropout(x, 0.5, training=False) is x
    assert pf.dropout(x, 0.0) is x
    z = pf.dropout(x, 1.0)
    assert z.tolist() == [0.0, 0.0, 0.0]
    z.sum().backward()
    assert x.grad.tolist() == [0.0, 0.0, 0.0]
    nan = pf.dropout(pf.tensor([float("nan"), 1.0]), 1.0).cpu().numpy()
    assert np.isnan(nan[0]) and nan[1] == 0.0          # like PyTorch: NaN * 0
    assert pf.dropout(pf.ones(0, 3), 0.5).shape == (0, 3)
    h = pf.dropout(pf.ones(4, 4, dtype=pf.bfloat16), 0.5)
    assert h.dtype is pf.bfloat16 and set(np.unique(h.float().cpu().numpy())) <= {0.0, 2.0}
    f = pf.dropout(pf.ones(4, 4, dtype=pf.float16, requires_grad=True), 0.5)
    assert f.dtype is pf.float16 and set(np.unique(f.detach().float().cpu().numpy())) <= {0.0, 2.0}


def test_dropout_inplace():
    x = pf.ones(50)
    y = pf.dropout(x, 0.5, inplace=True)
    assert y is x and set(np.unique(x.cpu().numpy())) == {0.0, 2.0} and x._version[0] == 1
    w = pf.ones(10, requires_grad=True)
    h = w * 1
    pf.dropout(h, 0.5, inplace=True)
    h.sum().backward()
    assert_close(w.grad, h.detach().cpu().numpy())  # grad is mask * 2 = the output itself
    with pytest.raises(RuntimeError, match="leaf Variable"):
        pf.dropout(w, 0.5, inplace=True)
    b = pf.ones(8, dtype=pf.bfloat16)
    pf.dropout(b, 0.5, inplace=True, generator=pf.Generator().manual_seed(4))
    want = pf.dropout(pf.ones(8), 0.5, generator=pf.Generator().manual_seed(4))
    assert b.dtype is pf.bfloat16 and pf.equal(b.float(), want)


def test_dropout_errors():
    with pytest.raises(ValueError, match="between 0 and 1, but got 1.5"):
        pf.dropout(pf.ones(3), 1.5)
    with pytest.raises(ValueError, match="between 0 and 1"):
        pf.dropout(pf.ones(3), -0.1)
    with pytest.raises(ValueError, match="between 0 and 1"):
        pf.dropout(pf.ones(3), float("nan"))
    with pytest.raises(RuntimeError, match="floating point"):
        pf.dropout(pf.tensor([1, 2]), 0.5)
    with pytest.raises(TypeError, match="Generator"):
        pf.dropout(pf.ones(3), 0.5, generator=np.random.default_rng())


@needs_torch
def test_dropout_matches_torch_semantics():
    """Masks differ (another generator); scale, zeros and rate match PyTorch."""
    x = np.linspace(0.5, 2.0, 4000).astype(np.float32)
    ours = pf.dropout(pf.tensor(x), 0.2).cpu().numpy()
    torch.manual_seed(0)
    theirs = torch.nn.functional.dropout(torch.tensor(x), 0.2).numpy()
    for y in (ours, theirs):
        kept = y != 0
        assert_close(y[kept], x[kept] / np.float32(0.8), rtol=1e-6)
        assert abs(kept.mean() - 0.8) < 5 * np.sqrt(0.16 / x.size)


# ------------------------------------------------------------------ embedding
@given(data=st.data())
def test_embedding_forward_backward(data):
    num, dim = data.draw(st.integers(1, 6)), data.draw(st.integers(1, 4))
    idx_shape = data.draw(st.lists(st.integers(1, 4), min_size=0, max_size=2).map(tuple))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    w, tw = make_input(rng, (num, dim), data.draw(layouts()))
    idx = rng.integers(0, num, idx_shape)
    pad = data.draw(st.sampled_from([None, 0, -1]))
    tw.requires_grad_()
    out = pf.embedding(pf.tensor(idx), tw, padding_idx=pad)
    assert_close(out, w[idx], rtol=0, atol=0)
    g = rng.standard_normal(idx_shape + (dim,))
    out.backward(pf.tensor(g))
    expected = np.zeros((num, dim))
    np.add.at(expected, idx, g)
    if pad is not None:
        expected[pad % num] = 0.0
    assert_close(tw.grad, expected, rtol=1e-12, atol=1e-12)


def test_embedding_finite_differences_and_double_backward():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((5, 3))
    idx = pf.tensor([[0, 4, 4], [2, 1, 0]])
    check_grad(lambda t: pf.embedding(idx, t), [w])
    v = rng.standard_normal((2, 3, 3))

    def weight_grad(t):   # d/dw sum(v * emb(w)^2) = scatter(2 * v * emb): depends on w
        t.requires_grad_()
        out = pf.embedding(idx, t, padding_idx=1)
        return pf.autograd.grad((out * out * pf.tensor(v)).sum(), t, create_graph=True)[0]
    check_grad(weight_grad, [w])


def test_embedding_int32_indices_half_weight_and_max_norm():
    w = pf.tensor([[3.0, 4.0], [0.3, 0.4], [6.0, 8.0]])
    out = pf.embedding(pf.tensor([0, 1], dtype=pf.int32), w, max_norm=1.0)
    assert_close(out, [[0.6, 0.8], [0.3, 0.4]], rtol=1e-5)
    assert_close(w[2], [6.0, 8.0])              # rows not looked up are left alone
    assert w._version[0] == 1
    h = pf.embedding(pf.tensor([[1]]), pf.ones(2, 3, dtype=pf.float16))
    assert h.dtype is pf.float16 and h.shape == (1, 1, 3)


def test_embedding_errors():
    w = pf.ones(4, 2)
    with pytest.raises(IndexError, match="index 4 is out of range for num_embeddings=4"):
        pf.embedding(pf.tensor([0, 4]), w)
    with pytest.raises(IndexError, match="index -1 is out of range"):
        pf.embedding(pf.tensor([-1]), w)
    with pytest.raises(TypeError, match="integer tensor"):
        pf.embedding(pf.tensor([0.0]), w)
    with pytest.raises(ValueError, match="padding_idx must be within num_embeddings"):
        pf.embedding(pf.tensor([0]), w, padding_idx=4)
    with pytest.raises(ValueError, match="must be 2-D"):
        pf.embedding(pf.tensor([0]), pf.ones(4))


@needs_torch
@pytest.mark.parametrize("kw", [{}, {"padding_idx": 2}, {"scale_grad_by_freq": True},
                                {"max_norm": 1.5}])
def test_embedding_against_torch(kw):
    rng = np.random.default_rng(1)
    w = rng.standard_normal((6, 4)).astype(np.float32)
    idx = rng.integers(0, 6, (3, 5))
    g = rng.standard_normal((3, 5, 4)).astype(np.float32)
    ours, theirs = pf.tensor(w, requires_grad=True), torch.tensor(w, requires_grad=True)
    out = pf.embedding(pf.tensor(idx), ours, **kw)
    ref = torch.nn.functional.embedding(torch.tensor(idx), theirs, **kw)
    assert_close(out, ref.detach().cpu().numpy(), rtol=1e-6)
    out.backward(pf.tensor(g))
    ref.backward(torch.tensor(g))
    assert_close(ours.grad, theirs.grad.cpu().numpy(), rtol=1e-5, atol=1e-6)
    assert_close(ours, theirs.detach().cpu().numpy(), rtol=1e-6)   # max_norm renormalized alike


def test_embedding_of_a_huge_broadcast_index_fails_at_once():
    """An index expanded to 10**12 positions: the output size is checked first (PyTorch's
    "can't allocate memory"), before any scan of the positions or any allocation."""
    idx = pf.zeros(1, dtype=pf.int64).expand(10**6, 10**6)
    with pytest.raises(RuntimeError, match=r"embedding\(\): can't allocate memory"):
        pf.embedding(idx, pf.ones(10, 4))


def test_embedding_checks_the_stored_indices_of_an_expanded_view():
    w = pf.tensor(np.arange(8.0).reshape(4, 2))
    idx = pf.tensor([[3], [1]]).expand(2, 1000)
    out = pf.embedding(idx, w)
    assert out.shape == (2, 1000, 2)
    assert out[0, 999].tolist() == [6.0, 7.0] and out[1, 0].tolist() == [2.0, 3.0]
    with pytest.raises(IndexError, match="index 9 is out of range for num_embeddings=4"):
        pf.embedding(pf.tensor([[1], [9]]).expand(2, 1000), w)
    w = pf.tensor([[3.0, 4.0], [0.3, 0.4]])
    out = pf.embedding(pf.tensor([0]).expand(5), w, max_norm=1.0)   # renormed once, on row 0
    assert_close(out, [[0.6, 0.8]] * 5, rtol=1e-5)


def test_embedding_error_types_match_torch():
    w = pf.ones(4, 2)
    # float indices: PyTorch's RuntimeError; still the TypeError test_embedding_errors asserts
    with pytest.raises(RuntimeError, match="integer tensor") as info:
        pf.embedding(pf.tensor([0.0]), w)
    assert isinstance(info.value, TypeError)
    # a table with no rows: a RuntimeError (PyTorch's), not the out-of-range IndexError
    with pytest.raises(RuntimeError, match="no rows"):
        pf.embedding(pf.tensor([0]), pf.ones(0, 2))
    assert tuple(pf.embedding(pf.tensor([], dtype=pf.int64), pf.ones(0, 2)).shape) == (0, 2)
    # out of range: PyTorch's IndexError, or its RuntimeError when the rows are empty
    for w in (pf.ones(2, 3), pf.ones(2, 0)):
        with pytest.raises(RuntimeError, match="index 2 is out of range") as info:
            pf.embedding(pf.tensor([2]), w)
        assert isinstance(info.value, IndexError)
