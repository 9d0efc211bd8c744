"""View ops (view, reshape, transpose, permute, t, expand, unsqueeze, squeeze,
flatten, split, chunk, narrow, unbind, select, movedim): values against NumPy,
memory sharing and the shared version counter, contiguous(), gradients, errors."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

import pyflow as pf
from tests.helpers import assert_close, check_grad, layouts, make_input, needs_torch, shapes, torch


def _shares(view, base):
    """``view`` aliases ``base``: same version counter and a write shows through."""
    if view._version is not base._version:
        return False
    if view.numel() == 0:
        return True
    before = base.detach().cpu().numpy().copy()
    view.fill_(123.0)
    shared = not np.array_equal(base.detach().cpu().numpy(), before)
    base.detach().cpu().numpy()[...] = before
    return shared


VIEWS = {  # name: (pyflow fn, numpy reference) on a (2, 3, 4) tensor
    "view": (lambda t: t.view(6, 4), lambda x: x.reshape(6, 4)),
    "view_infer": (lambda t: t.view(-1, 2), lambda x: x.reshape(-1, 2)),
    "reshape": (lambda t: t.reshape(4, 6), lambda x: x.reshape(4, 6)),
    "transpose": (lambda t: t.transpose(0, 2), lambda x: x.swapaxes(0, 2)),
    "permute": (lambda t: t.permute(2, 0, 1), lambda x: x.transpose(2, 0, 1)),
    "permute_neg": (lambda t: t.permute(-1, 0, -2), lambda x: x.transpose(2, 0, 1)),
    "mT": (lambda t: t.mT, lambda x: x.swapaxes(-1, -2)),
    "unsqueeze": (lambda t: t.unsqueeze(-1), lambda x: x[..., None]),
    "squeeze": (lambda t: t[:1].squeeze(), lambda x: x[:1].squeeze()),
    "squeeze_dim": (lambda t: t[:1].squeeze(0), lambda x: x[:1].squeeze(0)),
    "flatten": (lambda t: t.flatten(1), lambda x: x.reshape(2, 12)),
    "narrow": (lambda t: t.narrow(2, 1, 2), lambda x: x[:, :, 1:3]),
    "select": (lambda t: t.select(1, -1), lambda x: x[:, -1]),
    "movedim": (lambda t: t.movedim(0, -1), lambda x: np.moveaxis(x, 0, -1)),
    "expand": (lambda t: t[:, :1].expand(2, 5, 4), lambda x: np.broadcast_to(x[:, :1], (2, 5, 4))),
    "unflatten": (lambda t: t.unflatten(2, (2, 2)), lambda x: x.reshape(2, 3, 2, 2)),
}


@pytest.mark.parametrize("name", sorted(VIEWS))
def test_view_ops_share_memory_and_version(name):
    fn, ref = VIEWS[name]
    x = np.arange(24, dtype=np.float64).reshape(2, 3, 4)
    t = pf.tensor(x)
    out = fn(t)
    assert_close(out, ref(x))
    assert out._version is t._version
    if name != "expand":     # an expanded view is read-only (many elements, one address)
        assert _shares(out, t)
        v0 = t._version[0]
        out.add_(1.0)
        assert t._version[0] == v0 + 1
    check_grad(fn, [x])


@pytest.mark.parametrize("op", ["split", "chunk", "unbind"])
def test_multi_output_views(op):
    x = np.arange(30, dtype=np.float64).reshape(5, 6)
    t = pf.tensor(x)
    parts = {"split": lambda: t.split([2, 4], 1), "chunk": lambda: t.chunk(3, 0),
             "unbind": lambda: t.unbind(1)}[op]()
    refs = {"split": lambda: np.split(x, [2], 1), "chunk": lambda: np.split(x, [2, 4], 0),
            "unbind": lambda: [x[:, i] for i in range(6)]}[op]()
    assert len(parts) == len(refs)
    for p, r in zip(parts, refs):
        assert_close(p, r)
        assert _shares(p, t)
    check_grad(lambda a: pf.cat([p.reshape(-1) * (i + 1) for i, p in enumerate(
        {"split": lambda: a.split([2, 4], 1), "chunk": lambda: a.chunk(3, 0),
         "unbind": lambda: a.unbind(1)}[op]())]), [x])


def test_split_of_a_strided_input_with_unused_pieces_and_double_backward():
    """split is one node for all pieces (its backward one concatenation): pieces
    nobody uses get zero gradient, a transposed input works, and the backward
    is differentiable again."""
    x = np.random.default_rng(0).standard_normal((6, 4))
    check_grad(lambda a: a.t().split([1, 3, 2], 1)[1] * 2.0, [x])
    a = pf.tensor(x, requires_grad=True)
    first, _, last = a.t().split([1, 3, 2], 1)
    (g,) = pf.autograd.grad((first ** 2).sum() + (last ** 3).sum(), [a], create_graph=True)
    want = np.zeros_like(x)
    want[:1] = 2 * x[:1]
    want[4:] = 3 * x[4:] ** 2
    assert_close(g, want)
    (gg,) = pf.autograd.grad(g.sum(), [a])
    want2 = np.zeros_like(x)
    want2[:1] = 2.0
    want2[4:] = 6 * x[4:]
    assert_close(gg, want2)


@needs_torch
@given(size=st.integers(0, 9), n=st.integers(1, 5))
def test_split_chunk_sizes_match_torch(size, n):
    t, p = torch.zeros(size), pf.zeros(size)
    assert [c.shape[0] for c in p.split(n)] == [c.shape[0] for c in t.split(n)]
    assert [c.shape[0] for c in p.chunk(n)] == [c.shape[0] for c in t.chunk(n)]


@given(data=st.data())
def test_reshape_of_any_layout(data):
    shape = data.draw(shapes(1, 3, 1, 4))
    layout = data.draw(layouts())
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    x, t = make_input(rng, shape, layout)
    out = t.reshape(-1)
    assert_close(out, x.reshape(-1))
    if t.is_contiguous():
        assert out._version is t._version        # no copy needed: a view
    f = t.flatten()
    assert_close(f, x.reshape(-1))
    check_grad(lambda a: a.reshape(-1)[::2], [x])


def test_contiguous_copies_only_when_needed():
    t = pf.arange(6.0).reshape(2, 3)
    assert t.contiguous() is t
    tt = t.t()
    assert not tt.is_contiguous()
    c = tt.contiguous()
    assert c.is_contiguous() and c._version is not t._version
    assert_close(c, np.arange(6.0).reshape(2, 3).T)
    assert c.stride() == (2, 1) and tt.stride() == (1, 3)


def test_strides_and_storage_offset_like_torch():
    t = pf.arange(24.0).reshape(2, 3, 4)
    v = t[1, 1:, ::2]
    assert v.stride() == (4, 2)
    assert v.storage_offset() == 16
    assert t.permute(2, 0, 1).stride() == (1, 12, 4)
    assert t[:, :1].expand(2, 5, 4).stride() == (12, 0, 1)


def test_view_errors():
    t = pf.arange(6.0).reshape(2, 3)
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        t.t().view(6)
    with pytest.raises(RuntimeError, match=r"shape '\[4, -1\]' is invalid for input of size 6"):
        t.view(4, -1)
    with pytest.raises(RuntimeError, match="only one dimension can be inferred"):
        t.reshape(-1, -1)
    with pytest.raises(RuntimeError, match="must match the existing size 3"):
        t.expand(2, 4)
    with pytest.raises(RuntimeError, match="number of dims 1 doesn't match"):
        t.permute(0)
    with pytest.raises(RuntimeError, match="repeated dim"):
        t.permute(0, 0)
    with pytest.raises(IndexError, match="out of range"):
        t.transpose(0, 2)
    with pytest.raises(IndexError, match="out of range"):
        t.unsqueeze(3)
    with pytest.raises(RuntimeError, match="t\\(\\) expects a tensor with <= 2 dimensions"):
        pf.zeros(1, 2, 3).t()
    with pytest.raises(IndexError, match="exceeds dimension"):
        t.narrow(1, 2, 2)
    with pytest.raises(RuntimeError, match="must sum to the size"):
        t.split([1, 1], 1)
    with pytest.raises(RuntimeError, match="start_dim"):
        t.flatten(1, 0)
    with pytest.raises(TypeError, match="sequence of ints"):
        t.view(2.0, 3)


def test_inplace_on_base_invalidates_saved_views():
    x = pf.tensor([1.0, 2.0], requires_grad=True)
    y = x * 1.0
    v = y[0:1]
    z = v * v             # saves v, a view of y
    y.mul_(2.0)           # bumps the shared version counter
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        z.sum().backward()


@needs_torch
@given(data=st.data())
def test_view_chain_matches_torch(data):
    shape = data.draw(shapes(2, 4, 1, 4))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    x = rng.standard_normal(shape)
    d0, d1 = data.draw(st.integers(0, len(shape) - 1)), data.draw(st.integers(0, len(shape) - 1))

    def chain(lib_t):
        y = lib_t.transpose(d0, d1).unsqueeze(1).flatten(0, 1)
        return y.reshape(-1, shape[d0]).squeeze()

    tx = torch.tensor(x, requires_grad=True)
    px = pf.tensor(x, requires_grad=True)
    ref, out = chain(tx), chain(px)
    assert_close(out, ref.detach().cpu().numpy(), rtol=0, atol=0)
    assert out.is_contiguous() == ref.is_contiguous()
    w = rng.standard_normal(tuple(ref.shape))
    ref.backward(torch.tensor(w))
    out.backward(pf.tensor(w))
    assert_close(px.grad, tx.grad.cpu().numpy())


def test_fill_number_must_fit_integer_dtype():
    # a Python number out of an integer dtype's range (or NaN/inf) is PyTorch's overflow
    # RuntimeError, not NumPy's OverflowError/ValueError; a tensor value wraps as in torch
    for value in (2**40, 2**31, float("nan"), float("inf")):
        with pytest.raises(RuntimeError, match="fill_.*cannot be converted to type int32 "
                                               "without overflow"):
            pf.zeros(2, dtype=pf.int32).fill_(value)
    with pytest.raises(RuntimeError, match="int64 without overflow"):
        pf.zeros(2, dtype=pf.int64).fill_(float("nan"))
    assert pf.zeros(2, dtype=pf.int32).fill_(-2**31).tolist() == [-2**31] * 2
    assert pf.zeros(2, dtype=pf.int32).fill_(2.7).tolist() == [2, 2]
    # the wrapping cast is the CPU's (numba's CUDA simulator refuses an int32 overflow)
    wide = pf.tensor(2**40, device="cpu")
    assert pf.zeros(2, dtype=pf.int32, device="cpu").fill_(wide).tolist() == [0, 0]
    assert pf.zeros(2).fill_(2**40).tolist() == [2.0**40] * 2
