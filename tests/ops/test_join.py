"""cat, stack, hstack, vstack, tril, triu, one_hot, pad, repeat, tile, flip, roll:
NumPy references, finite differences, hypothesis shapes and layouts, PyTorch
comparisons (pad modes and their gradients), bad-input errors."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

import pyflow as pf
from tests.helpers import (assert_close, check_grad, layouts, make_input, needs_torch, shapes,
                           torch)


# ----------------------------------------------------------------- cat / stack
@given(data=st.data())
def test_cat_forward_backward(data):
    shape = data.draw(shapes(1, 3, 1, 3))
    dim = data.draw(st.integers(-len(shape), len(shape) - 1))
    n = data.draw(st.integers(1, 3))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    arrays, tensors = [], []
    for _ in range(n):
        s = list(shape)
        s[dim] = data.draw(st.integers(0, 3))
        a, t = make_input(rng, tuple(s), data.draw(layouts()))
        arrays.append(a)
        tensors.append(t)
    assert_close(pf.cat(tensors, dim), np.concatenate(arrays, dim))
    if all(a.size for a in arrays):
        check_grad(lambda *ts: pf.cat(list(ts), dim), arrays)


def test_cat_promotes_mixed_dtypes_and_casts_grads_back():
    a = pf.tensor([[1.0, 2.0]], requires_grad=True)                    # float32
    b = pf.tensor([[3.0]], dtype=pf.float64, requires_grad=True)
    i = pf.tensor([[7]])
    out = pf.cat([a, b, i], 1)
    assert out.dtype is pf.float64 and out.tolist() == [[1.0, 2.0, 3.0, 7.0]]
    out.sum().backward()
    assert a.grad.dtype is pf.float32 and b.grad.dtype is pf.float64
    assert pf.cat([pf.ones(2, dtype=pf.bfloat16), pf.ones(1, dtype=pf.float16)]).dtype is pf.float32
    assert pf.cat([pf.tensor([1], dtype=pf.int32), pf.tensor([True])]).dtype is pf.int32


def test_cat_skips_legacy_empty_1d():
    out = pf.cat([pf.ones(2, 3), pf.zeros(0), pf.ones(1, 3)])
    assert tuple(out.shape) == (3, 3)


def test_cat_errors_name_the_tensor():
    with pytest.raises(RuntimeError, match=r"Expected size 3 but got size 4 for tensor number 2"):
        pf.cat([pf.ones(2, 3), pf.ones(1, 3), pf.ones(2, 4)])
    with pytest.raises(RuntimeError, match=r"same number of dimensions: got 2 and 1.*tensor 1 "
                                           r"has shape \[3\]"):
        pf.cat([pf.ones(2, 3), pf.ones(3)])
    with pytest.raises(RuntimeError, match="non-empty list"):
        pf.cat([])
    with pytest.raises(TypeError, match="element 1"):
        pf.cat([pf.ones(2), 3])
    with pytest.raises(TypeError, match="tuple or list of Tensors"):
        pf.cat(pf.ones(2))
    with pytest.raises(RuntimeError, match="zero-dimensional"):
        pf.cat([pf.tensor(1.0), pf.tensor(2.0)])
    with pytest.raises(IndexError, match="out of range"):
        pf.cat([pf.ones(2), pf.ones(2)], 1)


@needs_torch
def test_cat_stack_match_torch():
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((2, 3)) for _ in range(3)]
    for dim in (0, 1, -1):
        assert_close(pf.cat([pf.tensor(x) for x in xs], dim),
                     torch.cat([torch.tensor(x) for x in xs], dim).cpu().numpy())
    for dim in (0, 1, 2, -1):
        assert_close(pf.stack([pf.tensor(x) for x in xs], dim),
                     torch.stack([torch.tensor(x) for x in xs], dim).cpu().numpy())
    v = [rng.standard_normal(3), rng.standard_normal(2)]
    assert_close(pf.hstack([pf.tensor(x) for x in v]), torch.hstack([torch.tensor(x) for x in v]))
    m = [rng.standard_normal(3), rng.standard_normal((2, 3))]
    assert_close(pf.vstack([pf.tensor(x) for x in m]), torch.vstack([torch.tensor(x) for x in m]))
    assert_close(pf.hstack([pf.tensor(x) for x in xs]), torch.hstack([torch.tensor(x) for x in xs]))


def test_stack_grad_and_errors():
    rng = np.random.default_rng(1)
    check_grad(lambda a, b: pf.stack([a, b], 1), [rng.standard_normal((2, 3)),
                                                  rng.standard_normal((2, 3))])
    with pytest.raises(RuntimeError, match=r"equal size, but got \[2\] at entry 0 and \[3\] at "
                                           r"entry 1"):
        pf.stack([pf.ones(2), pf.ones(3)])


# ----------------------------------------------------------------- tril / triu
@given(data=st.data())
def test_tril_triu(data):
    shape = data.draw(shapes(2, 4, 1, 4))
    k = data.draw(st.integers(-4, 4))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    x, t = make_input(rng, shape, data.draw(layouts()))
    assert_close(pf.tril(t, k), np.tril(x, k))
    assert_close(t.triu(k), np.triu(x, k))
    check_grad(lambda a: pf.tril(a, k), [x])
    check_grad(lambda a: pf.triu(a, diagonal=k), [x])


def test_tril_triu_dtypes_and_errors():
    i = pf.arange(9).reshape(3, 3)
    assert pf.tril(i).tolist() == np.tril(np.arange(9).reshape(3, 3)).tolist()
    b = pf.ones(2, 2, dtype=pf.bfloat16)
    assert pf.triu(b).float().tolist() == [[1.0, 1.0], [0.0, 1.0]]
    with pytest.raises(RuntimeError, match="at least 2 dimensions"):
        pf.tril(pf.ones(3))
    with pytest.raises(TypeError, match="diagonal"):
        pf.triu(pf.ones(2, 2), 0.5)


# ----------------------------------------------------------------- one_hot
def test_one_hot():
    idx = pf.tensor([[0, 2], [1, 2]])
    out = pf.one_hot(idx)
    assert out.dtype is pf.int64 and tuple(out.shape) == (2, 2, 3)
    np.testing.assert_array_equal(out.cpu().numpy(), np.eye(3, dtype=np.int64)[idx.cpu().numpy()])
    assert tuple(pf.one_hot(pf.tensor([1]), num_classes=5).shape) == (1, 5)
    assert tuple(pf.one_hot(pf.zeros(0, dtype=pf.int64), 4).shape) == (0, 4)
    if torch is not None:
        np.testing.assert_array_equal(
            out.cpu().numpy(), torch.nn.functional.one_hot(torch.tensor(idx.cpu().numpy())).cpu().numpy())


@pytest.mark.parametrize("args, match", [
    ((pf.tensor([0, 3]), 3), "smaller than num_classes"),
    ((pf.tensor([-1, 0]), 3), "non-negative"),
    ((pf.tensor([0.0]), 3), "index tensor of dtype int64"),
    ((pf.zeros(0, dtype=pf.int64),), "empty tensor"),
])
def test_one_hot_errors(args, match):
    with pytest.raises(RuntimeError, match=match):
        pf.one_hot(*args)


# ----------------------------------------------------------------- pad
@st.composite
def pad_case(draw, allow_negative=True):
    shape = draw(shapes(1, 3, 1, 4))
    k = draw(st.integers(1, len(shape)))
    pads = []
    for i in range(k):
        n = shape[len(shape) - 1 - i]
        lo = draw(st.integers(-n if allow_negative else 0, 3))
        hi = draw(st.integers(max(-n - lo, -n) if allow_negative else 0, 3))
        pads += [lo, hi]
    return shape, tuple(pads)


def _np_pad_constant(x, pads, value):
    widths = [(0, 0)] * x.ndim
    for i in range(len(pads) // 2):
        widths[x.ndim - 1 - i] = (pads[2 * i], pads[2 * i + 1])
    crop = tuple(slice(max(-lo, 0), x.shape[d] - max(-hi, 0)) for d, (lo, hi) in enumerate(widths))
    x = x[crop]
    return np.pad(x, [(max(lo, 0), max(hi, 0)) for lo, hi in widths], constant_values=value)


@given(case=pad_case(), layout=layouts(), seed=st.integers(0, 2**16))
def test_pad_constant(case, layout, seed):
    shape, pads = case
    rng = np.random.default_rng(seed)
    x, t = make_input(rng, shape, layout)
    assert_close(pf.pad(t, pads, value=1.5), _np_pad_constant(x, pads, 1.5))
    ref = _np_pad_constant(x, pads, 0)
    if ref.size:
        check_grad(lambda a: pf.pad(a, pads), [x])


@needs_torch
@pytest.mark.parametrize("mode", ["reflect", "replicate", "circular"])
@given(data=st.data())
def test_pad_modes_match_torch(mode, data):
    nd = data.draw(st.integers(1, 3))          # padded trailing dims; torch wants batch + channel
    shape = (data.draw(st.integers(1, 2)), data.draw(st.integers(1, 2))) + tuple(
        data.draw(st.integers(2, 4)) for _ in range(nd))
    pads = []
    for i in range(nd):
        n = shape[-1 - i]
        hi_max = n - 1 if mode == "reflect" else n
        pads += [data.draw(st.integers(0, hi_max)), data.draw(st.integers(0, hi_max))]
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    x = rng.standard_normal(shape)
    tx = torch.tensor(x, requires_grad=True)
    ref = torch.nn.functional.pad(tx, tuple(pads), mode=mode)
    px = pf.tensor(x, requires_grad=True)
    out = pf.pad(px, tuple(pads), mode=mode)
    assert_close(out, ref.detach().cpu().numpy(), rtol=0, atol=0)
    w = rng.standard_normal(tuple(ref.shape))
    ref.backward(torch.tensor(w))
    out.backward(pf.tensor(w))
    assert_close(px.grad, tx.grad.cpu().numpy(), rtol=1e-12)


def test_pad_reflect_grad_finite_differences():
    x = np.random.default_rng(3).standard_normal((2, 4))
    check_grad(lambda a: pf.pad(a, (2, 1), mode="reflect"), [x])
    check_grad(lambda a: pf.pad(a, (1, 2, 1, 0), mode="replicate"), [x])


def test_pad_dtypes():
    b = pf.pad(pf.ones(2, dtype=pf.bfloat16), (1, 1), value=2.0)
    assert b.dtype is pf.bfloat16 and b.float().tolist() == [2.0, 1.0, 1.0, 2.0]
    i = pf.pad(pf.tensor([1, 2]), (0, 2), value=9)
    assert i.dtype is pf.int64 and i.tolist() == [1, 2, 9, 9]


@pytest.mark.parametrize("args, kwargs, err, match", [
    ((pf.ones(3), (1,)), {}, RuntimeError, "divisible by 2"),
    ((pf.ones(3), (1, 1, 1, 1)), {}, RuntimeError, "less than or equal to two times"),
    ((pf.ones(3), (-2, -2)), {}, RuntimeError, "negative output size"),
    ((pf.ones(1, 3), (3, 0)), {"mode": "reflect"}, RuntimeError, "Padding size should be less"),
    ((pf.ones(1, 3), (1, 0)), {"mode": "wrap"}, NotImplementedError, "mode must be"),
    ((pf.ones(1, 3), (1, 0)), {"mode": "reflect", "value": 2.0}, RuntimeError,
     "doesn't take in value"),
    ((pf.ones(3), (1.5, 0)), {}, TypeError, "tuple of ints"),
])
def test_pad_errors(args, kwargs, err, match):
    with pytest.raises(err, match=match):
        pf.pad(*args, **kwargs)


# ----------------------------------------------------------------- repeat / tile
@given(data=st.data())
def test_repeat(data):
    shape = data.draw(shapes(0, 3, 1, 3))
    lead = data.draw(st.integers(0, 2))
    reps = tuple(data.draw(st.integers(1, 3)) for _ in range(len(shape) + lead))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    x, t = make_input(rng, shape, data.draw(layouts()))
    assert_close(t.repeat(*reps), np.tile(x, reps))
    assert_close(t.repeat(reps), np.tile(x, reps))
    check_grad(lambda a: a.repeat(*reps), [x])


def test_repeat_tile_misc():
    assert tuple(pf.ones(2, 3).repeat(0, 1).shape) == (0, 3)
    assert_close(pf.tile(pf.tensor([[1.0, 2.0]]), (2,)), np.tile([[1.0, 2.0]], (1, 2)))
    with pytest.raises(RuntimeError, match="can not be smaller than number of dimensions"):
        pf.ones(2, 3).repeat(2)
    with pytest.raises(RuntimeError, match="can not be negative"):
        pf.ones(2).repeat(-1)


# ----------------------------------------------------------------- flip / roll
@given(data=st.data())
def test_flip(data):
    shape = data.draw(shapes(1, 3, 1, 4))
    dims = data.draw(st.lists(st.integers(0, len(shape) - 1), unique=True, max_size=len(shape)))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    x, t = make_input(rng, shape, data.draw(layouts()))
    out = pf.flip(t, dims)
    assert_close(out, np.flip(x, dims))
    assert out._version is not t._version      # a copy, like torch.flip
    check_grad(lambda a: a.flip(dims), [x])


@given(data=st.data())
def test_roll(data):
    shape = data.draw(shapes(1, 3, 1, 4))
    k = data.draw(st.integers(1, len(shape)))
    dims = tuple(data.draw(st.lists(st.integers(-len(shape), len(shape) - 1), min_size=k,
                                    max_size=k)))
    shifts = tuple(data.draw(st.integers(-6, 6)) for _ in dims)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    x, t = make_input(rng, shape, data.draw(layouts()))
    assert_close(pf.roll(t, shifts, dims), np.roll(x, shifts, dims))
    assert_close(t.roll(shifts[0]), np.roll(x, shifts[0]))
    check_grad(lambda a: pf.roll(a, shifts, dims), [x])
    check_grad(lambda a: pf.roll(a, shifts[0]), [x])


def test_flip_roll_errors():
    with pytest.raises(RuntimeError, match="appears multiple times"):
        pf.flip(pf.ones(2, 2), (0, 0))
    with pytest.raises(RuntimeError, match="shifts and dimensions must align"):
        pf.roll(pf.ones(2, 2), (1, 1), 0)
    with pytest.raises(IndexError, match="out of range"):
        pf.roll(pf.ones(2, 2), 1, 2)
