"""Indexing, setitem, gather/scatter, index_select, masked_select, nonzero:
NumPy references, finite differences, hypothesis-drawn keys, PyTorch values and
gradients (duplicate indices included), bad-input errors."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

import pyflow as pf
from tests.helpers import (assert_close, check_grad, layouts, make_input, needs_torch, shapes,
                           torch)


# ----------------------------------------------------------------- key strategies
@st.composite
def basic_keys(draw, shape):
    """A basic key (ints, slices with steps, None, one Ellipsis) for ``shape``."""
    key, dim = [], 0
    n = draw(st.integers(0, len(shape)))
    used_ellipsis = False
    while dim < n:
        r = draw(st.integers(0, 5))
        if r == 0:
            key.append(None)
            continue
        if r == 1 and not used_ellipsis:
            key.append(Ellipsis)
            used_ellipsis = True
            dim = n   # the ellipsis eats the rest of the drawn count
            continue
        size = shape[dim]
        if r == 2:
            key.append(draw(st.integers(-size, size - 1)))
        else:
            start = draw(st.none() | st.integers(-size - 1, size + 1))
            stop = draw(st.none() | st.integers(-size - 1, size + 1))
            step = draw(st.none() | st.integers(1, 3))
            key.append(slice(start, stop, step))
        dim += 1
    return tuple(key)


@st.composite
def advanced_keys(draw, shape):
    """Int lists, at most one bool mask, ints, slices and None, always broadcastable:
    int lists share one length (or have length 1), and with a mask they have length 1."""
    use_mask = draw(st.booleans())
    n_idx = 1 if use_mask else draw(st.integers(0, 3))
    key, has_adv = [], False
    for size in shape[:draw(st.integers(1, len(shape)))]:
        if draw(st.integers(0, 4)) == 0:
            key.append(None)
        r = draw(st.integers(0, 3))
        if r == 0 or (r == 1 and not use_mask):
            n = n_idx if draw(st.booleans()) else 1
            key.append(draw(st.lists(st.integers(-size, size - 1), min_size=n, max_size=n)))
            has_adv = True
        elif r == 1:
            key.append(draw(st.lists(st.booleans(), min_size=size, max_size=size)))
            use_mask, has_adv = False, True            # at most one mask
        elif r == 2:
            key.append(draw(st.integers(-size, size - 1)))
        else:
            key.append(slice(None, None, draw(st.integers(1, 2))))
    if not has_adv:
        key[-1] = [draw(st.integers(0, shape[len([k for k in key if k is not None]) - 1] - 1))]
    return tuple(key)


def _torch_key(key):
    return tuple((torch.tensor(k) if k else torch.zeros(0, dtype=torch.int64))
                 if isinstance(k, list) else k for k in key)


# ----------------------------------------------------------------- getitem: basic
@given(data=st.data())
def test_basic_getitem_is_a_view_matching_numpy(data):
    shape = data.draw(shapes(1, 4, 1, 4))
    layout = data.draw(layouts())
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    x, t = make_input(rng, shape, layout)
    key = data.draw(basic_keys(shape))
    out = t[key]
    ref = x[key]
    assert_close(out, ref)
    assert out._version is t._version                      # shares the version counter
    if out.numel() and t.is_contiguous():
        # a view: writing through it changes the base
        before = t.detach().cpu().numpy().copy()
        out.fill_(7.0)
        expect = before.copy()
        expect[key] = 7.0
        assert_close(t, expect)


@given(data=st.data())
def test_basic_getitem_grad(data):
    shape = data.draw(shapes(1, 3, 1, 3))
    key = data.draw(basic_keys(shape))
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape)
    if x[key].size == 0:
        return
    check_grad(lambda t: t[key], [x])


# ----------------------------------------------------------------- getitem: advanced
@needs_torch
@given(data=st.data())
def test_advanced_getitem_matches_torch_values_and_grads(data):
    shape = data.draw(shapes(1, 3, 1, 4))
    key = data.draw(advanced_keys(shape))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    x = rng.standard_normal(shape)
    tx = torch.tensor(x, requires_grad=True)
    try:
        ref = tx[_torch_key(key)]
    except (IndexError, RuntimeError):
        with pytest.raises((IndexError, RuntimeError)):
            pf.tensor(x)[key]
        return
    px = pf.tensor(x, requires_grad=True)
    out = px[key]
    assert tuple(out.shape) == tuple(ref.shape), key
    assert_close(out, ref.detach().cpu().numpy(), rtol=0, atol=0)
    w = rng.standard_normal(tuple(ref.shape))
    ref.backward(torch.tensor(w))
    out.backward(pf.tensor(w))
    assert_close(px.grad, tx.grad.cpu().numpy(), rtol=1e-12)


@pytest.mark.parametrize("key, shape", [
    ((0, slice(None), [1, 2]), (3, 2)),             # int applied first: torch order, not NumPy
    (([0, 1], slice(None), [1, 2]), (2, 3)),       # separated advanced dims go first
    ((slice(None), None, [0, 1]), (2, 1, 2, 4)),
    (([0, 1], None, [1, 2]), (2, 1, 4)),
    ((Ellipsis, [0, 0, 3]), (2, 3, 3)),
    ((True,), (1, 2, 3, 4)),
    ((False,), (0, 2, 3, 4)),
    ((slice(None), [True, False, True]), (2, 2, 4)),
    ((1, [2, 0], [3, 3]), (2,)),
    (([[0, 1], [1, 0]],), (2, 2, 3, 4)),            # nested list = an index tensor
])
def test_advanced_placement_rules(key, shape):
    x = pf.arange(24).reshape(2, 3, 4)
    n = np.arange(24).reshape(2, 3, 4)
    assert tuple(x[key].shape) == shape
    if key == (0, slice(None), [1, 2]):
        np.testing.assert_array_equal(x[key].cpu().numpy(), n[0][:, [1, 2]])


def test_duplicate_indices_accumulate_gradient():
    x = pf.tensor([1.0, 2.0, 3.0], dtype=pf.float64, requires_grad=True)
    y = x[pf.tensor([0, 0, 2, 0])]
    y.backward(pf.tensor([1.0, 10.0, 100.0, 1000.0], dtype=pf.float64))
    assert_close(x.grad, [1011.0, 0.0, 100.0])
    check_grad(lambda t: t[[0, 0, 1]][:, [2, 2]], [np.random.default_rng(1).standard_normal((2, 3))])


def test_getitem_double_backward():
    x = pf.tensor([1.0, 2.0, 3.0], dtype=pf.float64, requires_grad=True)
    (g,) = pf.autograd.grad((x[[0, 0, 1]] ** 2).sum(), x, create_graph=True)
    assert_close(g, [4.0, 4.0, 0.0])       # 2*x0 twice, 2*x1 once
    (gg,) = pf.autograd.grad(g.sum(), x)
    assert_close(gg, [4.0, 2.0, 0.0])


def test_bool_mask_and_zero_dim_index_tensor():
    x = pf.arange(12).reshape(3, 4)
    np.testing.assert_array_equal(x[x > 6].cpu().numpy(), np.arange(7, 12))
    np.testing.assert_array_equal(x[[True, False, True]].cpu().numpy(), np.arange(12).reshape(3, 4)[[0, 2]])
    v = x[pf.tensor(1)]                      # a 0-d integer tensor indexes like an int: a view
    assert v._version is x._version and tuple(v.shape) == (4,)
    assert tuple(x[pf.tensor(True)].shape) == (1, 3, 4)
    assert tuple(x[[]].shape) == (0, 4)


def test_getitem_bfloat16_and_ints():
    x = pf.tensor([[1.5, -2.0], [3.25, 4.0]], dtype=pf.bfloat16)
    assert x[:, [1]].dtype is pf.bfloat16
    assert_close(x[:, [1]].float(), [[-2.0], [4.0]])
    i = pf.tensor([[1, 2], [3, 4]], dtype=pf.int32)
    assert i[[1, 0], [0, 0]].tolist() == [3, 1]


@pytest.mark.parametrize("key, err, match", [
    (5, IndexError, "index 5 is out of bounds for dimension 0 with size 3"),
    ((0, -5), IndexError, "index -5 is out of bounds for dimension 1 with size 4"),
    (([0, 3],), IndexError, "index 3 is out of bounds for dimension 0 with size 3"),
    ((slice(None), [4]), IndexError, "index 4 is out of bounds for dimension 1 with size 4"),
    ((0, 0, 0), IndexError, "too many indices for tensor of dimension 2"),
    ((Ellipsis, Ellipsis), IndexError, "single ellipsis"),
    (([True, False],), IndexError, "shape of the mask"),
    (([0, 1], [0, 1, 2]), IndexError, "could not be broadcast"),
    (slice(None, None, -1), ValueError, "step must be greater than zero"),
    ("a", IndexError, "valid indices"),
    (1.5, IndexError, "valid indices"),
])
def test_getitem_errors(key, err, match):
    x = pf.zeros(3, 4)
    with pytest.raises(err, match=match):
        x[key]


def test_float_index_tensor_rejected():
    with pytest.raises(IndexError, match="long, int or bool"):
        pf.zeros(3)[pf.tensor([0.0, 1.0])]


# ----------------------------------------------------------------- setitem
@given(data=st.data())
def test_setitem_basic_matches_numpy(data):
    shape = data.draw(shapes(1, 3, 1, 4))
    key = data.draw(basic_keys(shape))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    x = rng.standard_normal(shape)
    res_shape = x[key].shape
    value = rng.standard_normal(res_shape[-1:] if res_shape and data.draw(st.booleans())
                                else res_shape)
    t = pf.tensor(x)
    v0 = t._version[0]
    t[key] = pf.tensor(value)
    x[key] = value
    assert t._version[0] == v0 + 1
    assert_close(t, x, rtol=0, atol=0)


@needs_torch
@given(data=st.data())
def test_setitem_matches_torch(data):
    shape = data.draw(shapes(1, 3, 1, 4))
    key = data.draw(advanced_keys(shape) if data.draw(st.booleans()) else basic_keys(shape))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    x = rng.standard_normal(shape)
    tt = torch.tensor(x)
    res_shape = tuple(tt[_torch_key(key)].shape)
    if any(isinstance(k, list) and k and not isinstance(k[0], bool) and
           len(set(np.array(k) % 10)) != len(k) for k in key):
        return   # duplicate writes: order unspecified
    value = rng.standard_normal(res_shape)
    tt[_torch_key(key)] = torch.tensor(value)
    t = pf.tensor(x)
    t[key] = pf.tensor(value)
    assert_close(t, tt.cpu().numpy(), rtol=0, atol=0)


def test_setitem_scalar_cast_mask_and_broadcast():
    t = pf.zeros(2, 3, dtype=pf.int64)
    t[0] = 2.7                                      # cast to the tensor's dtype (truncates)
    t[t == 0] = 5
    t[:, 1] = pf.tensor([8.0, 9.0])
    assert t.tolist() == [[2, 8, 2], [5, 9, 5]]
    b = pf.zeros(3, dtype=pf.bfloat16)
    b[1] = 1.00390625                               # bf16 rounds to nearest even: 1.0
    assert b.float().tolist() == [0.0, 1.0, 0.0]
    f = pf.zeros(2, 2)
    f[[0, 1], [1, 0]] = pf.tensor([1.0, 2.0], dtype=pf.float64)
    assert f.dtype is pf.float32 and f.tolist() == [[0.0, 1.0], [2.0, 0.0]]


def test_setitem_full_mask_fast_path():
    x = pf.tensor([[1.0, -2.0], [-3.0, 4.0]], dtype=pf.bfloat16)
    x[x < 0] = 0.5
    assert x.float().tolist() == [[1.0, 0.5], [0.5, 4.0]] and x._version[0] == 1
    e = pf.ones(2).expand(2, 2)
    with pytest.raises(RuntimeError, match="single memory location"):
        e[e > 0] = 0.0
    leaf = pf.ones(2, requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf Variable"):
        leaf[leaf > 0] = 0.0


def test_setitem_through_view_is_visible_and_bumps_shared_version():
    base = pf.zeros(3, 4)
    v = base[1:, ::2]
    v[0, 1] = 3.0
    assert base[1, 2].item() == 3.0
    assert base._version[0] == v._version[0] == 1


def test_setitem_autograd():
    w = pf.tensor([1.0, 2.0, 3.0, 4.0], dtype=pf.float64, requires_grad=True)
    v = pf.tensor([10.0, 20.0], dtype=pf.float64, requires_grad=True)
    y = w * 2
    y[pf.tensor([1, 3])] = v * v
    y.sum().backward()
    assert_close(w.grad, [2.0, 0.0, 2.0, 0.0])
    assert_close(v.grad, [20.0, 40.0])

    # value requires grad, target does not (building a tensor from pieces)
    a = pf.tensor([1.0, 2.0], dtype=pf.float64, requires_grad=True)
    out = pf.zeros(2, 3, dtype=pf.float64)
    out[:, 0] = a
    out[1] = a[0] * 3
    (out * pf.tensor([[1.0, 2, 3], [4, 5, 6]], dtype=pf.float64)).sum().backward()
    assert_close(a.grad, [1.0 + 45.0, 0.0])


def test_setitem_autograd_finite_differences():
    def f(x, v):
        y = x * 1.0
        y[[0, 2], 1:] = v
        return y * x
    rng = np.random.default_rng(2)
    check_grad(f, [rng.standard_normal((3, 3)), rng.standard_normal((2,))])


@needs_torch
def test_setitem_grad_matches_torch():
    x = np.random.default_rng(0).standard_normal((3, 4))
    v = np.random.default_rng(1).standard_normal((2, 4))
    grads = []
    for lib in (pf, torch):
        xs = lib.tensor(x, requires_grad=True)
        vs = lib.tensor(v, requires_grad=True)
        y = xs * 3.0
        y[lib.tensor([True, False, True])] = vs * 2
        (y * y).sum().backward()
        grads.append((np.asarray(xs.grad.cpu().numpy()), np.asarray(vs.grad.cpu().numpy())))
    assert_close(grads[0][0], grads[1][0])
    assert_close(grads[0][1], grads[1][1])


def test_setitem_errors():
    leaf = pf.ones(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        leaf[0] = 2.0
    with pf.no_grad():
        leaf[0] = 2.0                                 # fine without recording
    assert leaf.tolist() == [2.0, 1.0, 1.0]
    x = pf.zeros(2, 3)
    with pytest.raises(RuntimeError, match=r"shape mismatch: value tensor of shape \[4\]"):
        x[0] = pf.ones(4)
    with pytest.raises(RuntimeError, match="single memory location"):
        pf.ones(3).expand(2, 3)[0, 0] = 1.0
    with pytest.raises(TypeError, match="value must be a Tensor or a number"):
        x[0] = "a"
    with pytest.raises(IndexError, match="out of bounds"):
        x[2] = 1.0


# ----------------------------------------------------------------- gather / scatter
def _np_gather(x, dim, idx):
    out = np.empty(idx.shape, x.dtype)
    for pos in np.ndindex(*idx.shape):
        src = list(pos)
        src[dim] = idx[pos]
        out[pos] = x[tuple(src)]
    return out


def _np_scatter_add(x, dim, idx, src):
    out = x.copy()
    for pos in np.ndindex(*idx.shape):
        dst = list(pos)
        dst[dim] = idx[pos]
        out[tuple(dst)] += src[pos]
    return out


@st.composite
def gather_case(draw):
    shape = draw(shapes(1, 3, 1, 4))
    dim = draw(st.integers(0, len(shape) - 1))
    ishape = tuple(draw(st.integers(1, 5)) if d == dim else draw(st.integers(1, n))
                   for d, n in enumerate(shape))
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, shape[dim], size=ishape)
    return shape, dim, idx, rng, draw(layouts())


@given(case=gather_case())
def test_gather_forward_backward(case):
    shape, dim, idx, rng, layout = case
    x, t = make_input(rng, shape, layout)
    assert_close(pf.gather(t, dim, pf.tensor(idx)), _np_gather(x, dim, idx))
    assert_close(t.gather(dim - len(shape), pf.tensor(idx)), _np_gather(x, dim, idx))
    check_grad(lambda a: pf.gather(a, dim, pf.tensor(idx)), [x])


@given(case=gather_case())
def test_scatter_add_forward_backward(case):
    shape, dim, idx, rng, layout = case
    x, t = make_input(rng, shape, layout)
    src = rng.standard_normal(tuple(n + 1 for n in idx.shape))   # src may be larger
    out = pf.scatter_add(t, dim, pf.tensor(idx), pf.tensor(src))
    assert_close(out, _np_scatter_add(x, dim, idx, src))
    check_grad(lambda a, s: pf.scatter_add(a, dim, pf.tensor(idx), s), [x, src])


@needs_torch
@given(case=gather_case())
def test_gather_scatter_match_torch(case):
    shape, dim, idx, rng, _ = case
    x = rng.standard_normal(shape)
    src = rng.standard_normal(idx.shape)
    ti = torch.tensor(idx)
    tx, ts = torch.tensor(x, requires_grad=True), torch.tensor(src, requires_grad=True)
    px, ps = pf.tensor(x, requires_grad=True), pf.tensor(src, requires_grad=True)
    ref = torch.gather(tx, dim, ti) * 3 + torch.scatter_add(tx, dim, ti, ts).sum()
    out = pf.gather(px, dim, pf.tensor(idx)) * 3 + pf.scatter_add(px, dim, pf.tensor(idx), ps).sum()
    assert_close(out, ref.detach().cpu().numpy(), rtol=1e-12)
    w = rng.standard_normal(tuple(ref.shape))
    ref.backward(torch.tensor(w))
    out.backward(pf.tensor(w))
    assert_close(px.grad, tx.grad.cpu().numpy(), rtol=1e-12)
    assert_close(ps.grad, ts.grad.cpu().numpy(), rtol=1e-12)
    # scatter (assign): compare where indices are unique per position
    uniq = torch.argsort(torch.rand(shape), dim=dim).narrow(dim, 0, 1)
    t_sc = torch.scatter(tx.detach(), dim, uniq, 7.0)
    p_sc = pf.scatter(pf.tensor(x), dim, pf.tensor(uniq.cpu().numpy()), value=7.0)
    assert_close(p_sc, t_sc.cpu().numpy())


def test_scatter_and_inplace_forms():
    x = pf.zeros(3, 4, dtype=pf.float64)
    idx = pf.tensor([[0, 1, 2, 0], [2, 2, 2, 2]])
    src = pf.arange(8, dtype=pf.float64).reshape(2, 4)
    out = pf.scatter(x, 0, idx, src)
    assert out.tolist() == [[0, 0, 0, 3], [0, 1, 0, 0], [4, 5, 6, 7]]
    x.scatter_add_(0, idx, src)
    assert x.tolist() == [[0, 0, 0, 3], [0, 1, 0, 0], [4, 5, 8, 7]]
    assert x._version[0] == 1
    y = pf.ones(2, 2)
    y.scatter_(1, pf.tensor([[1], [0]]), value=5.0)
    assert y.tolist() == [[1, 5], [5, 1]]
    s = pf.scatter(pf.zeros(3), 0, pf.tensor([0, 0]), pf.tensor([1.0, 2.0]), reduce="add")
    assert s.tolist() == [3.0, 0.0, 0.0]


def test_scatter_backward_assign():
    rng = np.random.default_rng(4)
    idx = pf.tensor([[2, 0, 1]])
    check_grad(lambda a, s: pf.scatter(a, 0, idx, s) * a, [rng.standard_normal((3, 3)),
                                                           rng.standard_normal((1, 3))])


@pytest.mark.parametrize("call, err, match", [
    (lambda: pf.gather(pf.ones(3), 0, pf.tensor([5])), IndexError,
     "index 5 is out of bounds for dimension 0 with size 3"),
    (lambda: pf.gather(pf.ones(3), 0, pf.tensor([-1])), IndexError, "index -1 is out of bounds"),
    (lambda: pf.gather(pf.ones(3), 0, pf.tensor([0.0])), RuntimeError, "Expected dtype int64"),
    (lambda: pf.gather(pf.ones(2, 3), 1, pf.tensor([0])), RuntimeError, "same number of dimensions"),
    (lambda: pf.gather(pf.ones(2, 3), 1, pf.tensor([[0], [0], [0]])), RuntimeError,
     "Size does not match at dimension 0"),
    (lambda: pf.gather(pf.ones(2, 3), 2, pf.tensor([[0]])), IndexError, "out of range"),
    (lambda: pf.scatter_add(pf.ones(3), 0, pf.tensor([3]), pf.ones(1)), IndexError,
     "index 3 is out of bounds"),
    (lambda: pf.scatter_add(pf.ones(3), 0, pf.tensor([0, 1]), pf.ones(1)), RuntimeError,
     "no larger than src"),
    (lambda: pf.scatter(pf.ones(3), 0, pf.tensor([0])), TypeError, "missing argument 'src'"),
    (lambda: pf.index_select(pf.ones(3), 0, pf.tensor([[0]])), IndexError, "must be a vector"),
    (lambda: pf.index_select(pf.ones(3), 0, pf.tensor([3])), IndexError, "index 3 is out of bounds"),
    (lambda: pf.masked_select(pf.ones(3), pf.tensor([1, 0, 1])), RuntimeError, "bool mask"),
    (lambda: pf.masked_select(pf.ones(3), pf.tensor([True, False])), RuntimeError,
     "not broadcastable"),
])
def test_gather_family_errors(call, err, match):
    with pytest.raises(err, match=match):
        call()


# ----------------------------------------------------------------- index_select / index_add
@given(data=st.data())
def test_index_select_and_index_add(data):
    shape = data.draw(shapes(1, 3, 1, 4))
    dim = data.draw(st.integers(-len(shape), len(shape) - 1))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    x, t = make_input(rng, shape, data.draw(layouts()))
    idx = rng.integers(0, shape[dim], size=data.draw(st.integers(0, 5)))
    assert_close(pf.index_select(t, dim, pf.tensor(idx, dtype=pf.int64)), np.take(x, idx, axis=dim))
    check_grad(lambda a: pf.index_select(a, dim, pf.tensor(idx, dtype=pf.int64)), [x])
    src_shape = list(shape)
    src_shape[dim] = idx.size
    src = rng.standard_normal(src_shape)
    ref = x.copy()
    for j, i in enumerate(idx):
        sl = [slice(None)] * len(shape)
        sl[dim] = i
        sj = [slice(None)] * len(shape)
        sj[dim] = j
        ref[tuple(sl)] += 2 * src[tuple(sj)]
    out = pf.index_add(t, dim, pf.tensor(idx, dtype=pf.int64), pf.tensor(src), alpha=2)
    assert_close(out, ref)
    if src.size:   # (finite differences cannot iterate an empty input)
        check_grad(lambda a, s: pf.index_add(a, dim, pf.tensor(idx, dtype=pf.int64), s,
                                             alpha=2), [x, src])


# ----------------------------------------------------------------- masks, nonzero, take_along_dim
@given(data=st.data())
def test_masked_select_broadcasts_and_grads(data):
    a_shape = data.draw(shapes(0, 3, 1, 3))
    m_shape = a_shape[data.draw(st.integers(0, len(a_shape))):]
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    x = rng.standard_normal(a_shape)
    m = rng.random(m_shape) > 0.4
    shape = np.broadcast_shapes(a_shape, m_shape)
    ref = np.broadcast_to(x, shape)[np.broadcast_to(m, shape)]
    assert_close(pf.masked_select(pf.tensor(x), pf.tensor(m)), ref)
    check_grad(lambda a: pf.masked_select(a, pf.tensor(m)), [x])


@given(shape=shapes(0, 3, 0, 4), seed=st.integers(0, 2**16))
def test_nonzero_matches_numpy(shape, seed):
    x = (np.random.default_rng(seed).random(shape) > 0.5).astype(np.float64)
    t = pf.tensor(x)
    out = pf.nonzero(t)
    assert out.dtype is pf.int64
    np.testing.assert_array_equal(out.cpu().numpy(), np.argwhere(x))
    cols = pf.nonzero(t, as_tuple=True)
    assert len(cols) == max(x.ndim, 1)
    if x.ndim:
        for c, r in zip(cols, np.nonzero(x)):
            np.testing.assert_array_equal(c.cpu().numpy(), r)
    if torch is not None:
        np.testing.assert_array_equal(out.cpu().numpy(), torch.nonzero(torch.tensor(x)).cpu().numpy())


def test_where_single_argument_uses_nonzero():
    cols = pf.where(pf.tensor([[0, 1], [1, 1]]) > 0)
    assert [c.tolist() for c in cols] == [[0, 1, 1], [1, 0, 1]]


def test_take_along_dim():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 4))
    idx = np.argsort(x, axis=1)
    assert_close(pf.take_along_dim(pf.tensor(x), pf.tensor(idx), dim=1),
                 np.take_along_axis(x, idx, 1))
    assert_close(pf.take_along_dim(pf.tensor(x), pf.tensor([[0], [2], [1]]), dim=1),
                 np.take_along_axis(x, np.array([[0], [2], [1]]), 1))
    assert_close(pf.take_along_dim(pf.tensor(x), pf.tensor([11, 0])), x.reshape(-1)[[11, 0]])
    check_grad(lambda a: pf.take_along_dim(a, pf.tensor(idx[:, :2]), 1), [x])


def test_index_put_accumulate():
    x = pf.zeros(4, dtype=pf.float64)
    out = pf.index_put(x, (pf.tensor([0, 0, 3]),), pf.tensor([1.0, 2.0, 5.0], dtype=pf.float64),
                       accumulate=True)
    assert out.tolist() == [3.0, 0.0, 0.0, 5.0]
    x.index_put_((pf.tensor([1]),), pf.tensor(9.0, dtype=pf.float64))
    assert x.tolist() == [0.0, 9.0, 0.0, 0.0]
    check_grad(lambda a, v: pf.index_put(a, (pf.tensor([1, 1]), pf.tensor([0, 2])), v,
                                         accumulate=True) * a,
               [np.random.default_rng(0).standard_normal((2, 3)), np.array([1.5, -2.0])])


def test_an_expanded_index_is_checked_on_its_stored_elements():
    """x[i] with i a broadcast view of 10**12 positions: bounds come from the one
    stored element, and the result's size is refused before it is allocated."""
    from pyflow.ops._util import stored_elements
    x = pf.arange(5.0)
    huge = pf.tensor([2]).expand(10**6, 10**6)
    assert stored_elements(huge._data).size == 1
    with pytest.raises(RuntimeError, match="can't allocate memory"):
        x[huge]
    with pytest.raises(RuntimeError, match="can't allocate memory"):
        x[pf.tensor([-1]).expand(10**6, 10**6)]
    with pytest.raises(IndexError, match="index 7 is out of bounds for dimension 0 with size 5"):
        x[pf.tensor([7]).expand(10**6, 10**6)]
    # negative stored indices wrap, and the result equals the materialized index's
    idx = pf.tensor([[-1], [2]]).expand(2, 3)
    assert x[idx].tolist() == [[4.0, 4.0, 4.0], [2.0, 2.0, 2.0]]
    assert x[idx].tolist() == x[idx.contiguous()].tolist()
    assert pf.index_select(x, 0, pf.tensor([4]).expand(3)).tolist() == [4.0, 4.0, 4.0]


def test_gather_scatter_out_of_bounds_is_runtime_and_index_error():
    # PyTorch raises RuntimeError here (IndexError from index_select); pyflow's error is
    # both, so the IndexError the tests above assert still holds
    for call in (lambda: pf.gather(pf.ones(3), 0, pf.tensor([-1])),
                 lambda: pf.scatter(pf.ones(3), 0, pf.tensor([3]), pf.ones(1)),
                 lambda: pf.scatter_add(pf.ones(2, 2), 1, pf.tensor([[0, 2]]), pf.ones(1, 2)),
                 lambda: pf.index_select(pf.ones(3), 0, pf.tensor([3]))):
        with pytest.raises(RuntimeError, match="out of bounds") as info:
            call()
        assert isinstance(info.value, IndexError)


def test_gather_scatter_empty_index_skips_shape_checks():
    # as PyTorch: an empty index (any dims, any dtype) selects nothing, src of any shape
    out = pf.gather(pf.ones(2, 3), 1, pf.zeros(5, 0, dtype=pf.int64))
    assert tuple(out.shape) == (5, 0) and out.dtype is pf.float32
    assert tuple(pf.gather(pf.ones(2, 3), 1, pf.zeros(0)).shape) == (0,)
    assert tuple(pf.gather(pf.tensor(1.0), 0, pf.zeros(0, 2, dtype=pf.int64)).shape) == (0, 2)
    assert pf.scatter(pf.tensor(1.0), 0, pf.zeros(0, 2, dtype=pf.int64), pf.ones(3)).item() == 1.0
    x = pf.ones(3, 0, 3, requires_grad=True)
    s = pf.ones(4, requires_grad=True)
    out = pf.scatter_add(x, -3, pf.zeros(3, 0, 3, dtype=pf.int64), s)
    assert tuple(out.shape) == (3, 0, 3)
    x2 = pf.ones(2, 3, requires_grad=True)
    pf.scatter(x2, 1, pf.zeros(0, dtype=pf.int64), s).sum().backward()
    assert x2.grad.tolist() == [[1.0] * 3] * 2 and s.grad.tolist() == [0.0] * 4
    # the dim is still checked, and before the index's dtype (as PyTorch)
    with pytest.raises(IndexError, match="out of range"):
        pf.gather(pf.ones(2, 3), 5, pf.zeros(0, dtype=pf.int64))
    with pytest.raises(IndexError, match="out of range"):
        pf.gather(pf.ones(2, 3), 5, pf.zeros(1, 1))


def test_index_select_scalar_needs_one_index():
    with pytest.raises(RuntimeError, match="Index to scalar can have only 1 value, got 0"):
        pf.index_select(pf.tensor(1.0), 0, pf.tensor([], dtype=pf.int64))
    with pytest.raises(RuntimeError, match="got 2 value"):
        pf.index_select(pf.tensor(1.0), 0, pf.tensor([0, 0]))
    assert pf.index_select(pf.tensor(2.0), 0, pf.tensor([0])).item() == 2.0


@pytest.mark.parametrize("key", ["a", b"a", (0, "a"), ["a"]])
def test_getitem_string_key_is_type_error(key):
    # PyTorch: TypeError; the error is an IndexError too (test_getitem_errors asserts it)
    with pytest.raises(TypeError, match="valid indices") as info:
        pf.zeros(3, 4)[key]
    assert isinstance(info.value, IndexError)
