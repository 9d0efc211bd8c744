"""Reductions: float64 NumPy reference, finite-difference gradients over drawn
shapes, dims (negative, tuples) and keepdim, non-contiguous layouts, PyTorch's
dtype rules, ties and NaN, PyTorch values and gradients, clear errors."""
import math

import numpy as np
import pytest
from hypothesis import given, strategies as st

import pyflow as pf
from tests.helpers import assert_close, check_grad, layouts, make_input, needs_torch, torch

INF = float("inf")


def _axes(dims, ndim):
    """NumPy axes for a pyflow ``dim`` argument (None = all)."""
    if dims is None:
        return tuple(range(ndim))
    dims = (dims,) if isinstance(dims, int) else dims
    return tuple(sorted(d % ndim for d in dims)) if ndim else ()


def _np_norm(a, p, axes, keepdim):
    if p in ("fro", 2):
        return np.sqrt(np.sum(a * a, axis=axes, keepdims=keepdim))
    if p == INF:
        return np.max(np.abs(a), axis=axes, keepdims=keepdim)
    if p == -INF:
        return np.min(np.abs(a), axis=axes, keepdims=keepdim)
    return np.sum(np.abs(a) ** p, axis=axes, keepdims=keepdim) ** (1 / p)


def _np_var(a, axes, keepdim, correction):
    n = math.prod(a.shape[d] for d in axes)
    c = a - a.mean(axis=axes, keepdims=True)
    return np.sum(c * c, axis=axes, keepdims=keepdim) / (n - correction)


def _np_lse(a, axes, keepdim):
    m = np.max(a, axis=axes, keepdims=True)
    out = np.log(np.sum(np.exp(a - m), axis=axes, keepdims=True)) + m
    return out if keepdim else np.squeeze(out, axis=axes)


# name: (pyflow(t, dim, keepdim), numpy(a, axes, keepdim), takes a tuple of dims)
MULTI_DIM = {
    "sum": (lambda t, d, k: pf.sum(t, d, k), lambda a, ax, k: np.sum(a, ax, keepdims=k)),
    "mean": (lambda t, d, k: t.mean(d, keepdim=k), lambda a, ax, k: np.mean(a, ax, keepdims=k)),
    "amax": (lambda t, d, k: pf.amax(t, () if d is None else d, k),
             lambda a, ax, k: np.max(a, ax, keepdims=k)),
    "amin": (lambda t, d, k: t.amin(() if d is None else d, keepdim=k),
             lambda a, ax, k: np.min(a, ax, keepdims=k)),
    "var": (lambda t, d, k: pf.var(t, d, keepdim=k),
            lambda a, ax, k: _np_var(a, ax, k, 1)),
    "var_biased": (lambda t, d, k: t.var(d, unbiased=False, keepdim=k),
                   lambda a, ax, k: _np_var(a, ax, k, 0)),
    "std": (lambda t, d, k: pf.std(t, d, keepdim=k, correction=0),
            lambda a, ax, k: np.sqrt(_np_var(a, ax, k, 0))),
    "logsumexp": (lambda t, d, k: pf.logsumexp(t, () if d is None else d, k), _np_lse),
    "norm2": (lambda t, d, k: pf.norm(t, dim=d, keepdim=k), lambda a, ax, k: _np_norm(a, 2, ax, k)),
    "norm1": (lambda t, d, k: t.norm(1, d, k), lambda a, ax, k: _np_norm(a, 1, ax, k)),
    "norm3": (lambda t, d, k: t.norm(3, d, k), lambda a, ax, k: _np_norm(a, 3, ax, k)),
    "norm0.5": (lambda t, d, k: t.norm(0.5, d, k), lambda a, ax, k: _np_norm(a, 0.5, ax, k)),
    "norm_inf": (lambda t, d, k: t.norm(INF, d, k), lambda a, ax, k: _np_norm(a, INF, ax, k)),
    "norm_-inf": (lambda t, d, k: t.norm(-INF, d, k), lambda a, ax, k: _np_norm(a, -INF, ax, k)),
}


def _np_max_dim(a, d, k, pick):
    return pick(a, d, keepdims=k) if a.ndim else a


ONE_DIM = {  # ops that take one int dim (or None where PyTorch allows)
    "prod": (lambda t, d, k: t.prod(d, keepdim=k) if d is not None else pf.prod(t),
             lambda a, d, k: np.prod(a, d, keepdims=k and d is not None)),
    "max_dim": (lambda t, d, k: t.max(d, keepdim=k).values if d is not None else pf.max(t),
                lambda a, d, k: np.max(a, d, keepdims=k and d is not None)),
    "min_dim": (lambda t, d, k: pf.min(t, d, k)[0] if d is not None else t.min(),
                lambda a, d, k: np.min(a, d, keepdims=k and d is not None)),
    "cumsum": (lambda t, d, k: pf.cumsum(t, 0 if d is None else d),
               lambda a, d, k: np.cumsum(a, 0 if d is None else d) if a.ndim else a),
}


@st.composite
def reduce_case(draw, tuple_dims=True, min_side=1):
    shape = draw(st.lists(st.integers(min_side, 4), min_size=0, max_size=3).map(tuple))
    n = len(shape)
    choices = [st.none()]
    if n:
        choices.append(st.integers(-n, n - 1))
        if tuple_dims:
            choices.append(st.lists(st.integers(-n, n - 1), min_size=1, max_size=n,
                                    unique_by=lambda d: d % n).map(tuple))
    else:
        choices.append(st.sampled_from([0, -1]))
    dim = draw(st.one_of(*choices))
    return shape, dim, draw(st.booleans()), draw(layouts()), draw(st.integers(0, 2**16))


def _away_from_zero(a):
    return np.where(np.abs(a) < 0.1, 0.5, a)


@pytest.mark.parametrize("name", sorted(MULTI_DIM))
@given(case=reduce_case())
def test_multi_dim_reductions_forward_backward(name, case):
    shape, dim, keepdim, layout, seed = case
    pf_fn, np_fn = MULTI_DIM[name]
    x, tx = make_input(np.random.default_rng(seed), shape, layout)
    axes = _axes(dim, len(shape))
    count = math.prod(shape[d] for d in axes)
    if name == "var" and count < 2:
        with pytest.warns(RuntimeWarning, match="degrees of freedom"):
            out = pf_fn(tx, dim, keepdim)
        assert np.isnan(out.detach().cpu().numpy()).all()
        return
    assert_close(pf_fn(tx, dim, keepdim), np_fn(x, axes, keepdim), rtol=1e-10, atol=1e-12)
    # Finite differences need a smooth point: no ties (the expanded layout
    # repeats values; max-like ops and std of a constant slice have kinks) and
    # no zeros where |x| has a kink.
    if name.startswith("norm") and name != "norm2":
        x = _away_from_zero(x)
    x = x + np.arange(x.size).reshape(x.shape) * 0.001
    if name == "std" and count == 1:
        return
    check_grad(lambda t: pf_fn(t, dim, keepdim), [x])


@pytest.mark.parametrize("name", sorted(ONE_DIM))
@given(case=reduce_case(tuple_dims=False))
def test_one_dim_reductions_forward_backward(name, case):
    shape, dim, keepdim, layout, seed = case
    pf_fn, np_fn = ONE_DIM[name]
    x, tx = make_input(np.random.default_rng(seed), shape, layout)
    d = None if dim is None or not shape else dim % len(shape)
    expected = np_fn(x, d, keepdim)
    if dim is not None and not shape and name != "cumsum":
        expected = x
    assert_close(pf_fn(tx, dim, keepdim), expected, rtol=1e-10, atol=1e-12)
    if name == "prod":
        x = _away_from_zero(x)
    x = x + np.arange(x.size).reshape(x.shape) * 0.001     # no ties for max/min
    check_grad(lambda t: pf_fn(t, dim, keepdim), [x])


@given(case=reduce_case(tuple_dims=False))
def test_max_min_indices_and_argmax_match_numpy(case):
    shape, dim, keepdim, layout, seed = case
    rng = np.random.default_rng(seed)
    x, tx = make_input(rng, shape, layout)
    x = np.round(x)                        # many ties: the first occurrence must win
    tx = pf.tensor(x)
    if layout == "transposed" and len(shape) >= 2:
        tx = pf.tensor(np.ascontiguousarray(np.swapaxes(x, -1, -2))).transpose(-1, -2)
    axis = None if dim is None or not shape else dim % len(shape)
    ref_arg = np.argmax(x, axis) if shape else np.array(0)
    ref_argmin = np.argmin(x, axis) if shape else np.array(0)
    got = pf.argmax(tx, dim, keepdim)
    want = np.expand_dims(ref_arg, axis) if keepdim and axis is not None else ref_arg
    if keepdim and dim is None:
        want = np.reshape(ref_arg, (1,) * len(shape))
    assert got.dtype is pf.int64 and got.tolist() == want.tolist()
    assert tx.argmin(dim).tolist() == ref_argmin.tolist()
    if dim is not None:
        values, indices = pf.max(tx, dim, keepdim)
        assert indices.dtype is pf.int64 and values.shape == indices.shape
        assert indices.tolist() == (np.expand_dims(ref_arg, axis) if keepdim and shape
                                    else ref_arg).tolist()
        res = tx.min(dim)
        assert res.indices.tolist() == ref_argmin.tolist()
        assert_close(res.values, np.min(x, axis) if shape else x)


def test_max_scattered_and_strided_dims_fold_correctly():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((3, 4, 5, 2))
    t = pf.tensor(x).permute(2, 0, 3, 1)           # non-contiguous 4-d
    xp = np.transpose(x, (2, 0, 3, 1))
    for dims in [(0, 2), (1, 3), (0, 1, 3), (-1, 0)]:
        assert_close(t.amax(dims), np.max(xp, _axes(dims, 4)))
        assert_close(t.logsumexp(dims, keepdim=True), _np_lse(xp, _axes(dims, 4), True))
        assert_close(t.norm(dim=dims), _np_norm(xp, 2, _axes(dims, 4), False))
        assert_close(t.var(dims), _np_var(xp, _axes(dims, 4), False, 1))
    for d in range(4):
        assert_close(t.cumsum(d), np.cumsum(xp, d))
        assert_close(t.max(d).values, np.max(xp, d))
        assert t.argmin(d).tolist() == np.argmin(xp, d).tolist()
        assert_close(t.prod(d), np.prod(xp, d))


# ------------------------------------------------------------------ ties, NaN, zeros
def test_gradient_ties_split_evenly_for_max_amax_and_inf_norm():
    x = pf.tensor([[3.0, 1.0, 3.0], [2.0, 2.0, 2.0]], requires_grad=True)
    x.max().backward()
    assert x.grad.tolist() == [[0.5, 0.0, 0.5], [0.0, 0.0, 0.0]]
    x.grad = None
    x.amax(1).sum().backward()
    assert_close(x.grad, [[0.5, 0, 0.5], [1 / 3, 1 / 3, 1 / 3]])
    x.grad = None
    x.max(1).values.sum().backward()               # with a dim: the returned index only
    assert x.grad.tolist() == [[1.0, 0.0, 0.0], [1.0, 0.0, 0.0]]
    y = pf.tensor([-3.0, 3.0, 1.0], requires_grad=True)
    y.norm(INF).backward()
    assert y.grad.tolist() == [-0.5, 0.5, 0.0]


def test_nan_propagates_and_its_first_index_wins():
    nan = float("nan")
    x = pf.tensor([[1.0, nan, 5.0, nan], [2.0, 7.0, 7.0, 0.0]])
    v, i = x.max(1)
    assert math.isnan(v.tolist()[0]) and v.tolist()[1] == 7.0 and i.tolist() == [1, 1]
    assert x.argmin(1).tolist() == [1, 3] and x.argmax().item() == 1
    assert math.isnan(x.amax().item()) and math.isnan(x.logsumexp(1).tolist()[0])
    assert pf.tensor([[1.0, 2.0, 7.0, 7.0]]).t().max(0).indices.tolist() == [2]


def test_prod_gradient_with_zeros():
    for values in ([2.0, 0.0, 3.0, 4.0], [0.0, 5.0, 0.0, 1.0], [1.5, -2.0, 0.5, 3.0]):
        x = pf.tensor(values, dtype=pf.float64, requires_grad=True)
        x.prod().backward()
        a = np.array(values)
        want = [np.prod(np.delete(a, i)) for i in range(a.size)]
        assert_close(x.grad, want)
    x = pf.tensor([[0.0, 2.0], [3.0, 4.0]], dtype=pf.float64, requires_grad=True)
    x.prod(0).sum().backward()
    assert x.grad.tolist() == [[3.0, 4.0], [0.0, 2.0]]


def test_gradients_at_zero_are_zero_not_nan():
    for fn in (lambda t: t.norm(), lambda t: t.norm(3), lambda t: t.norm(dim=1),
               lambda t: t.std(), lambda t: t.std(1, correction=0)):
        x = pf.zeros(2, 3, dtype=pf.float64, requires_grad=True)
        fn(x).sum().backward()
        assert x.grad.tolist() == [[0.0] * 3] * 2
    x = pf.tensor([0.0, 1.0, 0.0], requires_grad=True)
    x.norm(0.5).backward()
    assert x.grad.tolist() == [0.0, 1.0, 0.0]


def test_logsumexp_is_stable_and_its_gradient_is_softmax():
    x = pf.tensor([[1000.0, 1000.0], [-1000.0, -1001.0], [-INF, -INF], [INF, 1.0]])
    out = x.logsumexp(1).tolist()
    assert_close(out[:2], [1000 + math.log(2), -1000 + math.log(1 + math.exp(-1))], rtol=1e-6)
    assert out[2] == -INF and out[3] == INF
    a = np.random.default_rng(2).standard_normal((3, 5))
    t = pf.tensor(a, requires_grad=True)
    t.logsumexp(-1).sum().backward()
    e = np.exp(a - a.max(1, keepdims=True))
    assert_close(t.grad, e / e.sum(1, keepdims=True), rtol=1e-12)
    assert pf.zeros(2, 0).logsumexp(1).tolist() == [-INF, -INF]


def test_cumsum_backward_is_reversed_cumsum_and_double_backward():
    g = np.arange(1.0, 6.0)
    x = pf.tensor(np.ones(5), requires_grad=True)
    x.cumsum(0).backward(pf.tensor(g))
    assert x.grad.tolist() == np.cumsum(g[::-1])[::-1].tolist()
    a = np.random.default_rng(3).standard_normal((3, 4)) + 2
    for fn in (lambda t: t.logsumexp(1), lambda t: t.var(0), lambda t: t.norm(dim=1),
               lambda t: t.std(1), lambda t: (t.cumsum(1) ** 2), lambda t: t.amax(1) * t.sum(1)):
        def grad_of(t, fn=fn):
            if not t.requires_grad:            # finite differences pass plain tensors
                t = t.detach().requires_grad_()
            (gx,) = pf.autograd.grad(fn(t).sum(), t, create_graph=True)
            return gx * gx
        check_grad(grad_of, [a])


# ------------------------------------------------------------------ dtypes
def test_dtype_rules_follow_pytorch():
    i = pf.tensor([[1, 2, 3], [4, 5, 6]], dtype=pf.int32)
    b = pf.tensor([True, False, True])
    assert i.sum().dtype is pf.int64 and i.sum().item() == 21
    assert b.sum().dtype is pf.int64 and b.sum().item() == 2
    assert i.prod(1).dtype is pf.int64 and i.prod(1).tolist() == [6, 120]
    assert i.cumsum(1).dtype is pf.int64 and b.cumsum(0).tolist() == [1, 1, 2]
    assert i.argmax(1).tolist() == [2, 2] and i.max(0).values.dtype is pf.int32
    assert i.amax().dtype is pf.int32 and i.amax().item() == 6
    assert b.max().dtype is pf.bool and b.max().item() is True
    assert i.logsumexp(1).dtype is pf.float32
    assert i.mean(dtype=pf.float64).dtype is pf.float64
    assert i.sum(dtype=pf.float32).dtype is pf.float32
    assert i.cumsum(0, dtype=pf.float64).dtype is pf.float64
    assert i.all().dtype is pf.bool and i.all().item() is True
    assert (i - 1).all(1).tolist() == [False, True] and (i - 1).any(1).tolist() == [True, True]
    assert b.all(0, keepdim=True).tolist() == [False]
    assert pf.zeros(2, 2).all((), ).shape == (2, 2)       # dim=(): no reduction for all/any


@pytest.mark.parametrize("dt", [pf.float16, pf.bfloat16])
def test_half_types_compute_in_float32_and_keep_their_dtype(dt):
    a = np.random.default_rng(4).uniform(0.5, 2.0, (3, 8))
    t = pf.tensor(a, dtype=dt)
    ref = t.float()._compute().astype(np.float64)         # the rounded inputs
    cases = [(t.sum(1), ref.sum(1)), (t.mean(0), ref.mean(0)), (t.amax(0), ref.max(0)),
             (t.max(1).values, ref.max(1)), (t.var(1), ref.var(1, ddof=1)),
             (t.norm(dim=1), np.sqrt((ref ** 2).sum(1))),
             (t.logsumexp(1), _np_lse(ref, (1,), False)),
             (t.cumsum(1), np.cumsum(ref, 1)), (t.prod(1), ref.prod(1)),
             (t.std(0), ref.std(0, ddof=1))]
    for out, want in cases:
        assert out.dtype is dt
        assert_close(out.float(), want, rtol=1e-2, atol=1e-2)
    assert t.argmax(1).tolist() == np.argmax(ref, 1).tolist()
    x = pf.tensor(a, dtype=dt, requires_grad=True)
    x.logsumexp(1).sum().backward()
    assert x.grad.dtype is dt


def test_bfloat16_full_reduction_is_0d():
    t = pf.tensor([1.0, 2.0], dtype=pf.bfloat16)
    assert t.sum().shape == () and t.mean().shape == () and t.norm().shape == ()


def test_float32_results_are_accurate():
    rows = 1000 if pf.get_default_device().type == "cpu" else 100    # the simulator is slow
    a = np.random.default_rng(5).uniform(0, 1, (rows, 300)).astype(np.float32)
    t = pf.tensor(a)
    a64 = a.astype(np.float64)
    assert_close(t.sum(), a64.sum(), rtol=1e-6)
    assert_close(t.norm(), np.sqrt((a64 ** 2).sum()), rtol=1e-6)
    assert_close(t.norm(1, dim=0), np.abs(a64).sum(0), rtol=1e-6)
    assert_close(t.cumsum(0)[-1], a64.sum(0), rtol=1e-6)
    assert_close(t.var(), a64.var(ddof=1), rtol=1e-5)
    assert_close(t.logsumexp((0, 1)), _np_lse(a64, (0, 1), False), rtol=1e-6)


# ------------------------------------------------------------------ argument forms
def test_argument_forms():
    x = pf.tensor([[1.0, 5.0, 2.0], [4.0, 0.0, 6.0]])
    other = pf.tensor([[3.0, 3.0, 3.0]])
    assert pf.max(x, other).tolist() == [[3.0, 5.0, 3.0], [4.0, 3.0, 6.0]]
    assert x.min(other=other).tolist() == [[1.0, 3.0, 2.0], [3.0, 0.0, 3.0]]
    r = x.max(dim=-1, keepdim=True)
    assert r.values.tolist() == [[5.0], [6.0]] and r.indices.tolist() == [[1], [2]]
    v, i = r
    assert type(r).__name__ == "max" and v is r.values and i is r[1]
    assert x.argmax(keepdim=True).shape == (1, 1) and x.argmax().item() == 5
    assert x.sum([0, 1]).item() == 18.0 and x.sum(()).item() == 18.0
    assert x.amax(()).item() == 6.0 and x.amax((0, 1), keepdim=True).shape == (1, 1)
    assert_close(x.var(1, True), np.var(x.cpu().numpy(), 1, ddof=1))
    assert_close(x.var(False), np.var(x.cpu().numpy()))
    assert_close(x.std(0, correction=0), np.std(x.cpu().numpy(), 0))
    assert_close(x.var(correction=2), np.var(x.cpu().numpy(), ddof=2))
    assert_close(x.norm(p="fro", dim=(0, 1)), np.linalg.norm(x.cpu().numpy()))
    s = pf.tensor(3.0)
    assert s.max(0).values.item() == 3.0 and s.argmax(-1).item() == 0 and s.sum(0).item() == 3.0
    assert s.cumsum(0).item() == 3.0 and s.logsumexp(0).item() == 3.0
    assert pf.zeros(0, 3).max(1).values.shape == (0,)
    assert pf.zeros(0).sum().item() == 0.0 and pf.zeros(0).prod().item() == 1.0
    assert math.isnan(pf.zeros(0).mean().item()) and pf.zeros(0).norm().item() == 0.0


# ------------------------------------------------------------------ errors
def test_bad_input_raises_clear_errors():
    x = pf.ones(2, 3)
    with pytest.raises(IndexError, match=r"sum\(\): dim 2 out of range"):
        x.sum(2)
    with pytest.raises(IndexError, match=r"max\(\): dim -3 out of range"):
        x.max(-3)
    with pytest.raises(IndexError, match="out of range"):
        x.cumsum(5)
    with pytest.raises(RuntimeError, match="appears multiple times"):
        x.amax((1, -1))
    with pytest.raises(RuntimeError, match=r"mean\(\).*floating point.*int64"):
        pf.tensor([1, 2]).mean()
    with pytest.raises(RuntimeError, match="floating point"):
        pf.tensor([1, 2]).var()
    with pytest.raises(RuntimeError, match="floating point"):
        pf.tensor([1, 2]).norm()
    with pytest.raises(IndexError, match=r"max\(\): Expected reduction dim 1 to have non-zero"):
        pf.zeros(2, 0).max(1)
    with pytest.raises(IndexError, match=r"amax\(\): Expected reduction dim 1"):
        pf.zeros(2, 0).amax(1)
    with pytest.raises(IndexError, match=r"argmin\(\): Expected reduction dim 0"):
        pf.zeros(0, 2).argmin(0)
    with pytest.raises(RuntimeError, match="Expected reduction dim to be specified"):
        pf.zeros(2, 0).max()
    with pytest.raises(IndexError, match="Expected reduction dim to be specified"):
        pf.zeros(0).argmax()
    with pytest.raises(RuntimeError, match="inf norm on an empty tensor"):
        pf.zeros(0).norm(INF)
    with pytest.raises(RuntimeError, match="does not support bool"):
        pf.tensor([True]).argmax()
    with pytest.raises(TypeError, match="'dim' must be an int"):
        x.prod((0, 1))
    with pytest.raises(TypeError, match="'dim' must be an int"):
        x.max((0, 1))
    with pytest.raises(ValueError, match="'nuc'"):
        x.norm("nuc")
    with pytest.raises(TypeError, match="either unbiased or correction"):
        x.var(1, True, correction=0)
    with pytest.raises(TypeError, match="argument 'input' must be a Tensor"):
        pf.sum([1, 2])
    with pytest.raises(TypeError, match="argument 'other' must be a Tensor"):
        pf.max(x, other=2.0)


# ------------------------------------------------------------------ PyTorch
@needs_torch
def test_values_and_gradients_match_torch():
    a = np.random.default_rng(6).standard_normal((4, 5, 3)).astype(np.float32)
    a[1, 2, :] = a[1, 0, :]                       # ties for the max-like reductions
    a[0, :, 1] = 0.0                              # zeros for norm/prod gradients
    cases = {
        "sum": lambda m, t: m.sum(t, (0, -1)),
        "mean": lambda m, t: t.mean(1, keepdim=True),
        "prod": lambda m, t: t.prod(1),
        "max": lambda m, t: t.max(),
        "max_dim": lambda m, t: t.max(1)[0],
        "min_dim": lambda m, t: t.min(-1, keepdim=True).values,
        "amax": lambda m, t: m.amax(t, (0, 1)),
        "amin": lambda m, t: t.amin(1),
        "var": lambda m, t: t.var(1),
        "var_c0": lambda m, t: t.var((0, 2), correction=0),
        "std": lambda m, t: t.std(2, keepdim=True),
        "norm": lambda m, t: t.norm(),
        "norm_dim": lambda m, t: t.norm(dim=(0, 2)),
        "norm1": lambda m, t: t.norm(1, 1),
        "norm3": lambda m, t: t.norm(3, -1),
        "norm_inf": lambda m, t: t.norm(INF, 1),
        "logsumexp": lambda m, t: m.logsumexp(t, (1, 2)),
        "cumsum": lambda m, t: t.cumsum(1),
    }
    w = np.random.default_rng(8)
    for name, fn in cases.items():
        x = pf.tensor(a, requires_grad=True)
        tx = torch.tensor(a, requires_grad=True)
        out, ref = fn(pf, x), fn(torch, tx)
        assert tuple(out.shape) == tuple(ref.shape), name
        assert_close(out, ref.detach().cpu().numpy(), rtol=1e-5, atol=1e-6, msg=name)
        g = w.standard_normal(tuple(ref.shape)).astype(np.float32)
        out.backward(pf.tensor(g))
        ref.backward(torch.tensor(g))
        assert_close(x.grad, tx.grad.cpu().numpy(), rtol=1e-4, atol=1e-5, msg=name)
    t = torch.tensor(a)
    x = pf.tensor(a)
    for d in (0, 1, 2):
        assert x.argmax(d).tolist() == t.argmax(d).tolist()
        assert x.max(d).indices.tolist() == t.max(d).indices.tolist()
        assert x.min(d).indices.tolist() == t.min(d).indices.tolist()
        assert x.all(d).tolist() == t.all(d).tolist() and x.any(d).tolist() == t.any(d).tolist()
    assert x.argmin().item() == t.argmin().item()
