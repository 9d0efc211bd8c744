"""fused_scale_mask_softmax and its dropout form (OneFlow's): float64 NumPy
reference, finite differences, equality with the unfused composition (where +
mul + softmax, + dropout under the same seed) forward and backward, mask
broadcast shapes, non-contiguous inputs, fully masked rows, PyTorch, errors.
Tiny shapes: these tests run again on the simulated cuda device."""
import numpy as np
import pytest

import pyflow as pf
from pyflow.kernels.cpu.softmax import mask_rows
from pyflow.ops.softmax import (FusedScaleMaskSoftmax, fused_scale_mask_softmax,
                                fused_scale_mask_softmax_dropout)
from tests.helpers import assert_close, cases, check_grad, make_input, to_numpy

X_SHAPE = (2, 3, 4, 5)
# The simulated cuda run takes one mask of each kernel path: broadcast rows, a
# broadcast column (stride 0), a last-dim-only mask.
MASK_SHAPES = cases([(2, 1, 4, 5), (1, 1, 4, 5), (4, 5), (2, 3, 4, 5), (4, 1), (5,)],
                    simulated=[(2, 1, 4, 5), (4, 1), (5,)])


def np_reference(x, mask, scale, fill, g=None):
    """Forward (and with g the gradient of x) of softmax(where(mask, x * scale, fill), -1)."""
    v = np.where(mask, x * scale, fill)
    with np.errstate(invalid="ignore"):
        e = np.exp(v - v.max(-1, keepdims=True))
        y = e / e.sum(-1, keepdims=True)
        if g is None:
            return y
        return y, np.where(mask, y * (g - (g * y).sum(-1, keepdims=True)) * scale, 0.0)


def random_mask(rng, shape, keep_first=True):
    m = rng.random(shape) > 0.4
    if keep_first:
        m[..., 0] = True            # every row keeps something: no NaN rows
    return m


def composed(t, m, scale, fill):
    """The unfused chain: x * scale, where(mask, ., fill), softmax."""
    return pf.softmax(pf.where(m, t * scale, fill), -1)


@pytest.mark.parametrize("mask_shape", MASK_SHAPES)
@pytest.mark.parametrize("scale,fill", [(1.0, -np.inf), (0.37, -np.inf), (-1.5, -1e4),
                                        (2.0, 0.5)])
def test_float64_reference_forward_and_backward(mask_shape, scale, fill):
    rng = np.random.default_rng(0)
    x = rng.uniform(-3, 3, X_SHAPE)
    m = random_mask(rng, mask_shape, keep_first=mask_shape[-1] != 1)
    if mask_shape == (4, 1):
        m[0, 0] = True
    g = rng.standard_normal(X_SHAPE)
    t = pf.tensor(x, requires_grad=True)
    y = fused_scale_mask_softmax(t, pf.tensor(m), scale, fill)
    ry, rdx = np_reference(x, np.broadcast_to(m, X_SHAPE), scale, fill, g)
    assert y.dtype is pf.float64 and tuple(y.shape) == X_SHAPE
    assert_close(y, ry, rtol=1e-12, atol=1e-14)
    y.backward(pf.tensor(g))
    assert_close(t.grad, rdx, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("mask_shape", cases([(2, 1, 3, 4), (3, 4), (1, 4)],
                                              simulated=[(2, 1, 3, 4)]))
@pytest.mark.parametrize("fill", [-np.inf, -2.0])
def test_finite_difference_gradient(mask_shape, fill):
    rng = np.random.default_rng(1)
    x = rng.uniform(-2, 2, (2, 2, 3, 4))
    m = pf.tensor(random_mask(rng, mask_shape))
    check_grad(lambda t: fused_scale_mask_softmax(t, m, 0.7, fill), [x])


@pytest.mark.parametrize("p", [0.0, 0.3])
def test_dropout_form_finite_difference_gradient(p):
    """Both outputs feed the loss; the same seed gives the same keep mask in
    every forward the check runs."""
    rng = np.random.default_rng(2)
    x = rng.uniform(-2, 2, (2, 3, 4))
    m = pf.tensor(random_mask(rng, (3, 4)))
    w = pf.tensor(rng.standard_normal((2, 3, 4)))

    def fn(t):
        pf.manual_seed(7)
        dropped, y = fused_scale_mask_softmax_dropout(t, m, 1.3, p=p)
        return dropped + y * w
    check_grad(fn, [x])


@pytest.mark.parametrize("mask_shape", MASK_SHAPES)
@pytest.mark.parametrize("scale,fill", [(0.125, -np.inf), (1.0, -30.0)])
def test_float32_equals_the_composition(mask_shape, scale, fill):
    """Bit for bit on the CPU (each element rounds as the composition's kernels
    do); on cuda the row reduction order differs: a few ulp."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal(X_SHAPE).astype(np.float32) * 3
    m = pf.tensor(random_mask(rng, mask_shape, keep_first=False))
    g = pf.tensor(rng.standard_normal(X_SHAPE).astype(np.float32))
    a, b = pf.tensor(x, requires_grad=True), pf.tensor(x, requires_grad=True)
    ya = fused_scale_mask_softmax(a, m, scale, fill)
    yb = composed(b, m, scale, fill)
    ya.backward(g)
    yb.backward(g)
    assert ya.dtype is pf.float32 and a.grad.dtype is pf.float32
    if pf.get_default_device().type == "cpu":
        np.testing.assert_array_equal(to_numpy(ya), to_numpy(yb))
        np.testing.assert_array_equal(to_numpy(a.grad), to_numpy(b.grad))
    else:
        assert np.array_equal(np.isnan(to_numpy(ya)), np.isnan(to_numpy(yb)))
        assert_close(ya, yb, rtol=2e-6, atol=1e-7)
        assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("p", [0.25, 1.0])
@pytest.mark.parametrize("mask_shape", [(2, 1, 4, 5), (4, 5)])
def test_dropout_form_equals_softmax_then_dropout_same_seed(p, mask_shape):
    rng = np.random.default_rng(4)
    x = rng.standard_normal(X_SHAPE).astype(np.float32)
    m = pf.tensor(random_mask(rng, mask_shape, keep_first=False))
    gd = pf.tensor(rng.standard_normal(X_SHAPE).astype(np.float32))
    gy = pf.tensor(rng.standard_normal(X_SHAPE).astype(np.float32))
    a, b = pf.tensor(x, requires_grad=True), pf.tensor(x, requires_grad=True)
    pf.manual_seed(123)
    da, ya = fused_scale_mask_softmax_dropout(a, m, 0.5, p=p)
    after_fused = pf.random.default_generator.draw_seed()
    pf.manual_seed(123)
    yb = composed(b, m, 0.5, -np.inf)
    db = pf.nn.functional.dropout(yb, p)
    assert pf.random.default_generator.draw_seed() == after_fused   # one seed drawn, alike
    pf.autograd.backward([da, ya], [gd, gy])
    pf.autograd.backward([db, yb], [gd, gy])
    exact = pf.get_default_device().type == "cpu"
    for u, v in ((ya, yb), (da, db), (a.grad, b.grad)):
        if exact:
            np.testing.assert_array_equal(to_numpy(u), to_numpy(v))
        else:
            assert_close(u, v, rtol=1e-5, atol=1e-6)
    # the keep mask is the same one: zeros in the same places
    assert np.array_equal(to_numpy(da) == 0, to_numpy(db) == 0)


def test_dropout_form_gradient_from_one_output_only():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 4))
    m = pf.tensor(random_mask(rng, (3, 4)))
    for which in (0, 1):
        t = pf.tensor(x, requires_grad=True)
        pf.manual_seed(9)
        out = fused_scale_mask_softmax_dropout(t, m, p=0.5)
        out[which].sum().backward()
        ref = pf.tensor(x, requires_grad=True)
        pf.manual_seed(9)
        y = composed(ref, m, 1.0, -np.inf)
        (pf.nn.functional.dropout(y, 0.5) if which == 0 else y).sum().backward()
        assert_close(t.grad, ref.grad, rtol=1e-12, atol=1e-14)


def test_dropout_off_returns_the_softmax_twice_and_draws_nothing():
    x = pf.tensor(np.random.default_rng(6).standard_normal((2, 3)))
    m = pf.tensor(np.array([True, False, True]))
    pf.manual_seed(1)
    for kwargs in (dict(p=0.0), dict(p=0.5, training=False)):
        d, y = fused_scale_mask_softmax_dropout(x, m, **kwargs)
        assert d is y
        assert_close(y, fused_scale_mask_softmax(x, m), rtol=0, atol=0)
    after = pf.random.default_generator.draw_seed()
    pf.manual_seed(1)
    assert pf.random.default_generator.draw_seed() == after


@pytest.mark.parametrize("dt", [pf.float32, pf.float64])
def test_fully_masked_rows_are_nan_with_minus_inf_and_uniform_with_a_finite_fill(dt):
    x = np.random.default_rng(7).standard_normal((3, 4))
    mask = np.array([[True, False, True, False], [False] * 4, [True] * 4])
    for fill in (-np.inf, -5.0):
        t = pf.tensor(x, dtype=dt, requires_grad=True)
        y = fused_scale_mask_softmax(t, pf.tensor(mask), 2.0, fill)
        ref = composed(pf.tensor(x, dtype=dt), pf.tensor(mask), 2.0, fill)
        yn = to_numpy(y)
        assert np.array_equal(np.isnan(yn), np.isnan(to_numpy(ref)))
        if fill == -np.inf:
            assert np.isnan(yn[1]).all() and yn[0, 1] == 0.0 and yn[0, 3] == 0.0
        else:
            assert_close(yn[1], np.full(4, 0.25), rtol=1e-6)
        y.sum().backward()
        gx = to_numpy(t.grad)
        assert (gx[~mask] == 0).all()            # masked: exactly zero, NaN rows too
        assert np.isfinite(gx[0]).all() and np.isfinite(gx[2]).all()


@pytest.mark.parametrize("layout", ["transposed", "sliced", "expanded"])
def test_non_contiguous_x_and_mask(layout):
    rng = np.random.default_rng(8)
    x, tx = make_input(rng, (3, 4, 5), layout)
    mask = random_mask(rng, (5, 4)).T                   # (4, 5), a transposed view
    tm = pf.tensor(np.ascontiguousarray(mask.T)).t()
    assert not tm.is_contiguous()
    g = rng.standard_normal((3, 4, 5))
    y = fused_scale_mask_softmax(tx, tm, 0.9)
    ry, rdx = np_reference(x, np.broadcast_to(mask, x.shape), 0.9, -np.inf, g)
    assert_close(y, ry, rtol=1e-12, atol=1e-14)
    # backward into a transposed view of a leaf, with a transposed gradient
    leaf = pf.tensor(np.ascontiguousarray(np.swapaxes(x, -1, -2)), requires_grad=True)
    gt = pf.tensor(np.ascontiguousarray(np.swapaxes(g, -1, -2))).transpose(-1, -2)
    fused_scale_mask_softmax(leaf.transpose(-1, -2), tm, 0.9).backward(gt)
    assert_close(leaf.grad, np.swapaxes(rdx, -1, -2), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dt", [pf.float16, pf.bfloat16])
def test_half_types_compute_in_float32(dt):
    rng = np.random.default_rng(9)
    x = rng.standard_normal((2, 6))
    m = pf.tensor(random_mask(rng, (6,)))
    t = pf.tensor(x, dtype=dt, requires_grad=True)
    y = fused_scale_mask_softmax(t, m, 0.5)
    assert y.dtype is dt
    ref = composed(pf.tensor(x, dtype=dt), m, 0.5, -np.inf)
    assert_close(y.float(), ref.float(), rtol=1e-2, atol=1e-3)
    y.sum().backward()
    assert t.grad.dtype is dt


def test_double_backward_matches_the_kernel():
    rng = np.random.default_rng(10)
    x, v = rng.standard_normal((2, 5)), rng.standard_normal((2, 5))
    m = pf.tensor(random_mask(rng, (2, 5)))

    def first(t):
        if not t.requires_grad:
            t.requires_grad_()
        out = fused_scale_mask_softmax(t, m, 1.7, -3.0)
        (gx,) = pf.autograd.grad((out * pf.tensor(v)).sum(), t, create_graph=True)
        return gx
    check_grad(first, [x], rtol=1e-5, atol=1e-6)
    t = pf.tensor(x, requires_grad=True)
    fused_scale_mask_softmax(t, m, 1.7, -3.0).backward(pf.tensor(v))
    assert_close(first(pf.tensor(x)), t.grad, rtol=1e-10, atol=1e-12)


def test_errors_are_clear():
    x = pf.ones(2, 3, 4)
    with pytest.raises(TypeError, match="mask must be a bool tensor.*int64"):
        fused_scale_mask_softmax(x, pf.ones(3, 4, dtype=pf.int64))
    with pytest.raises(TypeError, match="mask must be a bool tensor.*float32"):
        fused_scale_mask_softmax_dropout(x, pf.ones(4), p=0.1)
    with pytest.raises(RuntimeError, match=r"mask of shape \[3, 5\] must broadcast to x's "
                                           r"shape \[2, 3, 4\]"):
        fused_scale_mask_softmax(x, pf.ones(3, 5, dtype=pf.bool))
    with pytest.raises(RuntimeError, match=r"mask of shape \[1, 2, 3, 4\]"):
        fused_scale_mask_softmax(x, pf.ones(1, 2, 3, 4, dtype=pf.bool))   # more dims than x
    m = pf.ones(4, dtype=pf.bool)
    for p in (-0.1, 1.5):
        with pytest.raises(ValueError, match=f"between 0 and 1, but got {p}"):
            fused_scale_mask_softmax_dropout(x, m, p=p)
    with pytest.raises(TypeError, match="p must be a number"):
        fused_scale_mask_softmax_dropout(x, m, p="0.1")
    with pytest.raises(TypeError, match="argument 'x'"):
        fused_scale_mask_softmax(np.ones(4), m)
    with pytest.raises(TypeError, match="scale must be a real number"):
        fused_scale_mask_softmax(x, m, scale=None)
    with pytest.raises(RuntimeError, match="floating point"):
        fused_scale_mask_softmax(pf.ones(2, 4, dtype=pf.int64), m)


@pytest.mark.parametrize("p", [0.0, 0.4])
def test_against_torch(p):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(11)
    x = (rng.standard_normal(X_SHAPE) * 2).astype(np.float32)
    mask = random_mask(rng, (2, 1, 4, 5), keep_first=False)
    gd, gy = (rng.standard_normal(X_SHAPE).astype(np.float32) for _ in range(2))
    t = pf.tensor(x, requires_grad=True)
    d, y = fused_scale_mask_softmax_dropout(t, pf.tensor(mask), 0.3, p=p)
    pf.autograd.backward([d, y], [pf.tensor(gd), pf.tensor(gy)])
    keep = to_numpy(d) != 0                  # torch's RNG differs: use pyflow's keep mask
    tt = torch.tensor(x, requires_grad=True)
    ty = torch.softmax(torch.where(torch.tensor(mask), tt * 0.3, float("-inf")), -1)
    td = ty * torch.tensor(keep) / (1 - p)
    torch.autograd.backward([td, ty], [torch.tensor(gd), torch.tensor(gy)])
    assert np.array_equal(np.isnan(to_numpy(y)), np.isnan(ty.detach().numpy()))
    assert_close(y, ty.detach().numpy(), rtol=1e-5, atol=1e-6)
    assert_close(d, td.detach().numpy(), rtol=1e-5, atol=1e-6)
    assert np.array_equal(np.isnan(to_numpy(t.grad)), np.isnan(tt.grad.numpy()))
    assert_close(t.grad, tt.grad.numpy(), rtol=1e-4, atol=1e-6)


@pytest.mark.cpu_only
@pytest.mark.parametrize("mask_shape,shape", [((2, 1, 4, 5), (2, 3, 4, 5)), ((4, 1), (2, 4, 6)),
                                              ((1,), (3, 2)), ((3, 2), (3, 2))])
def test_mask_row_offsets_index_the_broadcast_mask(mask_shape, shape):
    rng = np.random.default_rng(12)
    m = rng.random(mask_shape) > 0.5
    moff, mcol = mask_rows("t", mask_shape, shape)
    assert moff.shape == (int(np.prod(shape[:-1])),) and moff.dtype == np.int64
    flat, full = m.reshape(-1), np.broadcast_to(m, shape).reshape(-1, shape[-1])
    got = flat[moff[:, None] + np.arange(shape[-1]) * mcol]
    np.testing.assert_array_equal(got, full)


@pytest.mark.cpu_only
def test_sbp_rule_splits_rows_with_the_mask_alike():
    from pyflow.distributed.sbp import broadcast as B, split as S
    x, m = pf.ones(2, 3, 4, 5), pf.ones(2, 1, 4, 5, dtype=pf.bool)
    cands = FusedScaleMaskSoftmax.sbp_rule((x, m, 1.0, -np.inf))
    ins = [c.ins for c in cands]
    assert (S(0), S(0)) in ins and (S(1), B) in ins and (S(2), S(2)) in ins
    assert all(c.ins[0] != S(3) for c in cands)     # never the softmax dim


@pytest.mark.cpu_only
def test_parallel_and_serial_kernels_agree_bit_for_bit():
    """The @twin kernels give the same numbers on the threads and on one
    (which runs depends on sizes only; tests/kernels/test_cpu_twins.py's rule)."""
    from pyflow.kernels.cpu import softmax as K
    rng = np.random.default_rng(13)
    x = rng.standard_normal((24, 37)).astype(np.float32)
    m = rng.random((37,)) > 0.3
    g = rng.standard_normal((24, 37)).astype(np.float32)
    moff, mcol = mask_rows("t", m.shape, x.shape)
    outs = []
    for which in ("parallel", "serial"):
        y = np.empty_like(x)
        getattr(K._masked_rows_forward, which)(x, y, m, moff, mcol, 0.3, -np.inf)
        dx = np.empty_like(x)
        getattr(K._masked_rows_backward, which)(g, y, dx, m, moff, mcol, 0.3)
        outs.append((y, dx))
    for a, b in zip(*outs):
        np.testing.assert_array_equal(a, b)
