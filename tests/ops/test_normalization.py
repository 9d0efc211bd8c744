"""layer_norm and batch_norm: float64 NumPy references, finite differences
(input, weight, bias) over random shapes and layouts, float32 precision,
running statistics, double backward, PyTorch, bad input."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

import pyflow as pf
from tests.helpers import assert_close, check_grad, layouts, make_input, needs_torch, torch


def np_layer_norm(x, k, w=None, b=None, eps=1e-5):
    dims = tuple(range(x.ndim - k, x.ndim))
    mu = x.mean(dims, keepdims=True)
    var = ((x - mu) ** 2).mean(dims, keepdims=True)
    y = (x - mu) / np.sqrt(var + eps)
    return y * (1 if w is None else w) + (0 if b is None else b)


def np_batch_norm(x, mean, var, w=None, b=None, eps=1e-5):
    shape = (1, -1) + (1,) * (x.ndim - 2)
    y = (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + eps)
    return y * (1 if w is None else w.reshape(shape)) + (0 if b is None else b.reshape(shape))


def batch_stats(x):
    dims = (0,) + tuple(range(2, x.ndim))
    return x.mean(dims), x.var(dims)


# ------------------------------------------------------------------ layer_norm
@given(data=st.data())
def test_layer_norm_random_shapes_and_layouts(data):
    shape = data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple))
    k = data.draw(st.integers(1, len(shape)))
    affine = data.draw(st.booleans())
    layout = data.draw(layouts())
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    x, tx = make_input(rng, shape, layout)
    nshape = shape[len(shape) - k:]
    w, b = rng.standard_normal(nshape), rng.standard_normal(nshape)
    if affine:
        out = pf.layer_norm(tx, nshape, pf.tensor(w), pf.tensor(b), eps=1e-3)
        assert_close(out, np_layer_norm(x, k, w, b, 1e-3), rtol=1e-10, atol=1e-12)
        check_grad(lambda a, c, d: pf.layer_norm(a, nshape, c, d, eps=1e-3), [x, w, b],
                   rtol=1e-4, atol=1e-6)
    else:
        out = pf.layer_norm(tx, nshape, eps=1e-3)
        assert_close(out, np_layer_norm(x, k, eps=1e-3), rtol=1e-10, atol=1e-12)
        check_grad(lambda a: pf.layer_norm(a, nshape, eps=1e-3), [x], rtol=1e-4, atol=1e-6)


def test_layer_norm_float32_keeps_precision_with_large_mean():
    x = 1000.0 + np.random.default_rng(0).standard_normal((6, 257))
    out = pf.layer_norm(pf.tensor(x, dtype=pf.float32), 257)
    assert out.dtype is pf.float32
    x32 = x.astype(np.float32).astype(np.float64)
    assert_close(out, np_layer_norm(x32, 1), rtol=1e-3, atol=2e-4)


def test_layer_norm_float32_grads_match_float64():
    rng = np.random.default_rng(1)
    x, w, g = rng.standard_normal((37, 65)), rng.standard_normal(65), rng.standard_normal((37, 65))
    grads = {}
    for dt in (pf.float32, pf.float64):
        ts = [pf.tensor(a, dtype=dt, requires_grad=True) for a in (x, w, w)]
        pf.layer_norm(ts[0], (65,), ts[1], ts[2]).backward(pf.tensor(g, dtype=dt))
        grads[dt] = [t.grad for t in ts]
    for a, b in zip(grads[pf.float32], grads[pf.float64]):
        assert_close(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dt", [pf.float16, pf.bfloat16])
def test_layer_norm_half_types(dt):
    x = np.random.default_rng(2).standard_normal((3, 8))
    t = pf.tensor(x, dtype=dt, requires_grad=True)
    w = pf.ones(8, dtype=dt, requires_grad=True)
    out = pf.layer_norm(t, [8], w)
    assert out.dtype is dt
    assert_close(out.float(), np_layer_norm(t.detach().float().cpu().numpy().astype(np.float64), 1),
                 rtol=2e-2, atol=2e-2)
    out.sum().backward()
    assert t.grad.dtype is dt and w.grad.dtype is dt


def test_layer_norm_double_backward():
    rng = np.random.default_rng(3)
    x, w, v = rng.standard_normal((2, 5)), rng.standard_normal(5), rng.standard_normal((2, 5))

    def first(a):
        a.requires_grad_()
        out = pf.layer_norm(a, (5,), pf.tensor(w))
        return pf.autograd.grad((out * pf.tensor(v)).sum(), a, create_graph=True)[0]
    check_grad(first, [x], rtol=1e-4, atol=1e-6)
    fused = pf.tensor(x, requires_grad=True)    # the differentiable form gives the same grad
    pf.layer_norm(fused, (5,), pf.tensor(w)).backward(pf.tensor(v))
    assert_close(first(pf.tensor(x)), fused.grad, rtol=1e-10, atol=1e-12)


def test_layer_norm_errors():
    with pytest.raises(RuntimeError, match=r"normalized_shape=\[4\].*got input of size \[2, 3\]"):
        pf.layer_norm(pf.ones(2, 3), (4,))
    with pytest.raises(RuntimeError, match="weight of shape"):
        pf.layer_norm(pf.ones(2, 3), (3,), pf.ones(4))
    with pytest.raises(RuntimeError, match="floating point"):
        pf.layer_norm(pf.tensor([[1, 2]]), 2)
    with pytest.raises(TypeError, match="argument 'input'"):
        pf.layer_norm([1.0, 2.0], 2)


# ------------------------------------------------------------------ batch_norm
BN_SHAPES = [(5, 3), (4, 3, 5), (3, 2, 3, 4)]


@pytest.mark.parametrize("shape", BN_SHAPES)
@pytest.mark.parametrize("training", [True, False])
def test_batch_norm_forward_backward(shape, training):
    rng = np.random.default_rng(4)
    C = shape[1]
    x = rng.standard_normal(shape)
    w, b = rng.standard_normal(C), rng.standard_normal(C)
    rm, rv = rng.standard_normal(C), rng.uniform(0.5, 2, C)

    def run(xt, wt, bt):
        return pf.batch_norm(xt, pf.tensor(rm.copy()), pf.tensor(rv.copy()), wt, bt,
                             training=training, eps=1e-3)
    mean, var = batch_stats(x) if training else (rm, rv)
    assert_close(run(pf.tensor(x), pf.tensor(w), pf.tensor(b)),
                 np_batch_norm(x, mean, var, w, b, 1e-3), rtol=1e-10, atol=1e-12)
    check_grad(run, [x, w, b], rtol=1e-4, atol=1e-6)


@given(data=st.data())
def test_batch_norm_non_contiguous_and_no_affine(data):
    shape = data.draw(st.sampled_from(BN_SHAPES))
    layout = data.draw(layouts())
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    x, tx = make_input(rng, shape, layout)
    if np.ptp(x.reshape(shape[0], shape[1], -1), axis=(0, 2)).min() < 1e-3:
        x = x + rng.standard_normal(shape) * 0.1   # an expanded input has zero variance
        tx = pf.tensor(x)
    out = pf.batch_norm(tx, None, None, training=True)
    assert_close(out, np_batch_norm(x, *batch_stats(x)), rtol=1e-8, atol=1e-8)


def test_batch_norm_running_stats_update_in_place():
    rng = np.random.default_rng(5)
    rm, rv = pf.zeros(3), pf.ones(3)
    version = rm._version[0]
    exp_m, exp_v = np.zeros(3), np.ones(3)
    for _ in range(3):
        x = rng.standard_normal((4, 3, 2)) + 2
        pf.batch_norm(pf.tensor(x, dtype=pf.float32), rm, rv, training=True, momentum=0.2)
        m = x.mean((0, 2))
        v = x.var((0, 2), ddof=1)   # the running variance is unbiased
        exp_m, exp_v = 0.8 * exp_m + 0.2 * m, 0.8 * exp_v + 0.2 * v
    assert_close(rm, exp_m, rtol=1e-5, atol=1e-6)
    assert_close(rv, exp_v, rtol=1e-5, atol=1e-6)
    assert rm._version[0] == version + 3 and not rm.requires_grad
    out = pf.batch_norm(pf.tensor(x), rm.double(), rv.double(), training=False)
    assert_close(out, np_batch_norm(x, exp_m, exp_v), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dt", [pf.float16, pf.bfloat16])
def test_batch_norm_half_types(dt):
    x = pf.tensor(np.random.default_rng(6).standard_normal((4, 2, 3)), dtype=dt,
                  requires_grad=True)
    out = pf.batch_norm(x, pf.zeros(2, dtype=dt), pf.ones(2, dtype=dt), training=True)
    assert out.dtype is dt
    xr = x.detach().float().cpu().numpy().astype(np.float64)
    assert_close(out.float(), np_batch_norm(xr, *batch_stats(xr)), rtol=2e-2, atol=2e-2)
    out.sum().backward()
    assert x.grad.dtype is dt


@pytest.mark.parametrize("training", [True, False])
def test_batch_norm_double_backward(training):
    """d(dx)/dx in training (the batch statistics depend on x); d(dx)/dweight in eval,
    where dx = g * weight * rstd no longer depends on x."""
    rng = np.random.default_rng(7)
    x, w, v = rng.standard_normal((3, 2, 2)), rng.standard_normal(2), rng.standard_normal((3, 2, 2))

    def first(a, wt):
        a.requires_grad_()
        out = pf.batch_norm(a, pf.zeros(2, dtype=pf.float64), pf.ones(2, dtype=pf.float64),
                            wt, None, training=training)
        return pf.autograd.grad((out * pf.tensor(v)).sum(), a, create_graph=True)[0]
    if training:
        check_grad(lambda a: first(a, pf.tensor(w)), [x], rtol=1e-4, atol=1e-6)
    else:
        check_grad(lambda wt: first(pf.tensor(x), wt), [w], rtol=1e-4, atol=1e-6)
    fused = pf.tensor(x, requires_grad=True)    # the differentiable form gives the same grad
    pf.batch_norm(fused, pf.zeros(2, dtype=pf.float64), pf.ones(2, dtype=pf.float64),
                  pf.tensor(w), None, training=training).backward(pf.tensor(v))
    assert_close(first(pf.tensor(x), pf.tensor(w)), fused.grad, rtol=1e-10, atol=1e-12)


def test_batch_norm_errors():
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        pf.batch_norm(pf.ones(1, 3), None, None, training=True)
    with pytest.raises(RuntimeError, match="must be given when training=False"):
        pf.batch_norm(pf.ones(2, 3), None, None, training=False)
    with pytest.raises(RuntimeError, match=r"running_mean of shape \[3\].*got \[4\]"):
        pf.batch_norm(pf.ones(2, 3), pf.zeros(4), pf.ones(3))
    with pytest.raises(ValueError, match="at least 2 dims"):
        pf.batch_norm(pf.ones(3), pf.zeros(3), pf.ones(3))


# ------------------------------------------------------------------ PyTorch
@needs_torch
@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm_against_torch(affine):
    rng = np.random.default_rng(8)
    x = rng.standard_normal((4, 3, 10)).astype(np.float32)
    w, b = rng.standard_normal((3, 10)).astype(np.float32), rng.standard_normal((3, 10)).astype(np.float32)
    g = rng.standard_normal(x.shape).astype(np.float32)
    ours = [pf.tensor(a, requires_grad=True) for a in (x, w, b)]
    theirs = [torch.tensor(a, requires_grad=True) for a in (x, w, b)]
    out = pf.layer_norm(ours[0], (3, 10), *(ours[1:] if affine else (None, None)))
    ref = torch.nn.functional.layer_norm(theirs[0], (3, 10), *(theirs[1:] if affine else (None, None)))
    out.backward(pf.tensor(g))
    ref.backward(torch.tensor(g))
    assert_close(out, ref.detach().cpu().numpy(), rtol=1e-5, atol=1e-5)
    for o, t in zip(ours[:3 if affine else 1], theirs):
        assert_close(o.grad, t.grad.cpu().numpy(), rtol=1e-4, atol=1e-4)


@needs_torch
@pytest.mark.parametrize("shape", BN_SHAPES)
def test_batch_norm_against_torch_over_several_steps(shape):
    rng = np.random.default_rng(9)
    C = shape[1]
    w, b = rng.standard_normal(C).astype(np.float32), rng.standard_normal(C).astype(np.float32)
    rm, rv = pf.zeros(C), pf.ones(C)
    trm, trv = torch.zeros(C), torch.ones(C)
    for step in range(4):
        training = step < 3
        x = (rng.standard_normal(shape) * 2 + 1).astype(np.float32)
        g = rng.standard_normal(shape).astype(np.float32)
        ours = [pf.tensor(a, requires_grad=True) for a in (x, w, b)]
        theirs = [torch.tensor(a, requires_grad=True) for a in (x, w, b)]
        out = pf.batch_norm(ours[0], rm, rv, ours[1], ours[2], training, 0.3, 1e-4)
        ref = torch.nn.functional.batch_norm(theirs[0], trm, trv, theirs[1], theirs[2],
                                             training, 0.3, 1e-4)
        out.backward(pf.tensor(g))
        ref.backward(torch.tensor(g))
        assert_close(out, ref.detach().cpu().numpy(), rtol=1e-4, atol=1e-5)
        for o, t in zip(ours, theirs):
            assert_close(o.grad, t.grad.cpu().numpy(), rtol=1e-4, atol=1e-4)
        assert_close(rm, trm.cpu().numpy(), rtol=1e-5, atol=1e-6)
        assert_close(rv, trv.cpu().numpy(), rtol=1e-5, atol=1e-6)
