"""rms_norm, RMSNorm and fused_add_layer_norm: float64 NumPy references, finite
differences of every input over random shapes and layouts, agreement with the
unfused composition of ops in float32, double backward, PyTorch, bad input."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

import pyflow as pf
from pyflow.ops.normalization import fused_add_layer_norm, layer_norm, rms_norm
from tests.helpers import assert_close, check_grad, make_input, needs_torch, torch


def np_rms_norm(x, k, w=None, eps=1e-6):
    dims = tuple(range(x.ndim - k, x.ndim))
    y = x / np.sqrt((x * x).mean(dims, keepdims=True) + eps)
    return y * (1 if w is None else w)


def np_layer_norm(x, k, w=None, b=None, eps=1e-5):
    dims = tuple(range(x.ndim - k, x.ndim))
    mu = x.mean(dims, keepdims=True)
    y = (x - mu) / np.sqrt(((x - mu) ** 2).mean(dims, keepdims=True) + eps)
    return y * (1 if w is None else w) + (0 if b is None else b)


def both(out_and_sum):
    """fused_add_layer_norm's two outputs as one tensor, so one check weighs both."""
    return pf.stack(list(out_and_sum))


# ------------------------------------------------------------------ rms_norm
@given(data=st.data())
def test_rms_norm_random_shapes_and_layouts(data):
    shape = data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple))
    k = data.draw(st.integers(1, len(shape)))
    affine = data.draw(st.booleans())
    layout = data.draw(st.sampled_from(["contiguous", "transposed", "sliced"]))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    x, tx = make_input(rng, shape, layout)
    nshape = shape[len(shape) - k:]
    w = rng.standard_normal(nshape)
    if affine:
        out = rms_norm(tx, nshape, pf.tensor(w), eps=1e-3)
        assert_close(out, np_rms_norm(x, k, w, 1e-3), rtol=1e-10, atol=1e-12)
        check_grad(lambda a, c: rms_norm(a, nshape, c, eps=1e-3), [x, w], rtol=1e-4, atol=1e-6)
    else:
        out = rms_norm(tx, nshape, eps=1e-3)
        assert_close(out, np_rms_norm(x, k, eps=1e-3), rtol=1e-10, atol=1e-12)
        check_grad(lambda a: rms_norm(a, nshape, eps=1e-3), [x], rtol=1e-4, atol=1e-6)


def test_rms_norm_default_eps_is_the_dtype_machine_epsilon():
    x = np.random.default_rng(0).standard_normal((2, 6)) * 1e-5   # eps matters at this scale
    for dt, eps in ((pf.float32, np.finfo(np.float32).eps), (pf.float64, np.finfo(np.float64).eps)):
        out = rms_norm(pf.tensor(x, dtype=dt), 6)
        xr = x.astype(dt.storage).astype(np.float64)
        assert_close(out, np_rms_norm(xr, 1, eps=eps), rtol=1e-5 if dt is pf.float32 else 1e-12)


def test_rms_norm_float32_equals_the_unfused_ops():
    rng = np.random.default_rng(1)
    x, w, g = (rng.standard_normal(s).astype(np.float32) for s in ((5, 3, 8), (3, 8), (5, 3, 8)))
    fused = [pf.tensor(a, requires_grad=True) for a in (x, w)]
    plain = [pf.tensor(a, requires_grad=True) for a in (x, w)]
    out = rms_norm(fused[0], (3, 8), fused[1], eps=1e-5)
    a, wt = plain
    ref = a * (a.pow(2).mean((-2, -1), keepdim=True) + 1e-5).rsqrt() * wt
    assert out.dtype is pf.float32
    assert_close(out, ref, rtol=1e-5, atol=1e-6)
    out.backward(pf.tensor(g))
    ref.backward(pf.tensor(g))
    for f, p in zip(fused, plain):
        assert_close(f.grad, p.grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dt", [pf.float16, pf.bfloat16])
def test_rms_norm_half_types(dt):
    x = np.random.default_rng(2).standard_normal((3, 8))
    t = pf.tensor(x, dtype=dt, requires_grad=True)
    w = pf.ones(8, dtype=dt, requires_grad=True)
    out = rms_norm(t, [8], w)
    assert out.dtype is dt
    assert_close(out.float(), np_rms_norm(t.detach().float().cpu().numpy().astype(np.float64), 1),
                 rtol=2e-2, atol=2e-2)
    out.sum().backward()
    assert t.grad.dtype is dt and w.grad.dtype is dt


def test_rms_norm_double_backward():
    rng = np.random.default_rng(3)
    x, w, v = rng.standard_normal((2, 5)), rng.standard_normal(5), rng.standard_normal((2, 5))

    def first(a, wt):
        a.requires_grad_()
        out = rms_norm(a, (5,), wt, eps=1e-3)
        return pf.autograd.grad((out * pf.tensor(v)).sum(), a, create_graph=True)[0]
    check_grad(first, [x, w], rtol=1e-4, atol=1e-6)
    fused = pf.tensor(x, requires_grad=True)    # the differentiable form gives the same grad
    rms_norm(fused, (5,), pf.tensor(w), eps=1e-3).backward(pf.tensor(v))
    assert_close(first(pf.tensor(x), pf.tensor(w)), fused.grad, rtol=1e-10, atol=1e-12)


def test_rms_norm_module():
    m = pf.nn.RMSNorm((2, 3), eps=1e-4)
    assert tuple(m.weight.shape) == (2, 3) and np.all(m.weight.detach().cpu().numpy() == 1)
    assert repr(m) == "RMSNorm((2, 3), eps=0.0001, elementwise_affine=True)"
    with pf.no_grad():
        m.weight.mul_(3.0)
    m.reset_parameters()
    assert np.all(m.weight.detach().cpu().numpy() == 1)
    bare = pf.nn.RMSNorm(3, elementwise_affine=False)
    assert bare.weight is None and list(bare.parameters()) == []
    x = np.random.default_rng(4).standard_normal((4, 3))
    assert_close(bare(pf.tensor(x)), np_rms_norm(x, 1, eps=np.finfo(np.float64).eps),
                 rtol=1e-12)
    assert "RMSNorm" in pf.nn.__all__ and pf.nn.RMSNorm is pf.nn.modules.RMSNorm


def test_rms_norm_errors():
    with pytest.raises(RuntimeError, match=r"rms_norm\(\): given normalized_shape=\[4\].*"
                                           r"got input of size \[2, 3\]"):
        rms_norm(pf.ones(2, 3), (4,))
    with pytest.raises(RuntimeError, match=r"rms_norm\(\): expected weight of shape \[3\], got \[4\]"):
        rms_norm(pf.ones(2, 3), (3,), pf.ones(4))
    with pytest.raises(RuntimeError, match="floating point"):
        rms_norm(pf.tensor([[1, 2]]), 2)
    with pytest.raises(TypeError, match="argument 'input'"):
        rms_norm([1.0, 2.0], 2)


# ------------------------------------------------------------------ fused_add_layer_norm
@given(data=st.data())
def test_fused_add_layer_norm_random_shapes_and_layouts(data):
    shape = data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple))
    k = data.draw(st.integers(1, len(shape)))
    affine = data.draw(st.booleans())
    layouts = st.sampled_from(["contiguous", "transposed", "sliced"])
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    x, tx = make_input(rng, shape, data.draw(layouts))
    r, tr = make_input(rng, shape, data.draw(layouts))
    nshape = shape[len(shape) - k:]
    w, b = rng.standard_normal(nshape), rng.standard_normal(nshape)
    if affine:
        out, total = fused_add_layer_norm(tx, tr, nshape, pf.tensor(w), pf.tensor(b), eps=1e-3)
        assert_close(out, np_layer_norm(x + r, k, w, b, 1e-3), rtol=1e-10, atol=1e-12)
        check_grad(lambda a, c, d, e: both(fused_add_layer_norm(a, c, nshape, d, e, eps=1e-3)),
                   [x, r, w, b], rtol=1e-4, atol=1e-6)
    else:
        out, total = fused_add_layer_norm(tx, tr, nshape, eps=1e-3)
        assert_close(out, np_layer_norm(x + r, k, eps=1e-3), rtol=1e-10, atol=1e-12)
        check_grad(lambda a, c: both(fused_add_layer_norm(a, c, nshape, eps=1e-3)), [x, r],
                   rtol=1e-4, atol=1e-6)
    assert_close(total, x + r, rtol=0, atol=0)


@pytest.mark.parametrize("affine", [True, False])
def test_fused_add_layer_norm_float32_equals_the_unfused_ops(affine):
    rng = np.random.default_rng(5)
    shape, nshape = (3, 4, 6), (4, 6)
    x, r, go, gs = (rng.standard_normal(shape).astype(np.float32) for _ in range(4))
    w, b = (rng.standard_normal(nshape).astype(np.float32) for _ in range(2))
    fused = [pf.tensor(a, requires_grad=True) for a in (x, r, w, b)]
    plain = [pf.tensor(a, requires_grad=True) for a in (x, r, w, b)]
    params = slice(2, 4 if affine else 2)
    out, total = fused_add_layer_norm(fused[0], fused[1], nshape, *fused[params])
    ref_total = plain[0] + plain[1]
    ref = layer_norm(ref_total, nshape, *plain[params])
    assert out.dtype is pf.float32 and total.dtype is pf.float32
    assert_close(total, ref_total, rtol=0, atol=0)
    assert_close(out, ref, rtol=1e-5, atol=1e-6)
    (out * pf.tensor(go) + total * pf.tensor(gs)).sum().backward()
    (ref * pf.tensor(go) + ref_total * pf.tensor(gs)).sum().backward()
    for i, (f, p) in enumerate(zip(fused, plain)):
        if i >= 2 and not affine:
            assert f.grad is None
            continue
        assert_close(f.grad, p.grad, rtol=1e-5, atol=1e-5, msg=f"input {i}")


@pytest.mark.parametrize("used", ["out", "sum"])
def test_fused_add_layer_norm_one_output_used(used):
    """The other output's gradient is absent (no zeros made): the grads are those of
    the used output alone."""
    rng = np.random.default_rng(6)
    x, r, w = rng.standard_normal((3, 5)), rng.standard_normal((3, 5)), rng.standard_normal(5)
    ts = [pf.tensor(a, requires_grad=True) for a in (x, r, w)]
    out, total = fused_add_layer_norm(ts[0], ts[1], 5, ts[2])
    (out if used == "out" else total).sum().backward()
    ref = [pf.tensor(a, requires_grad=True) for a in (x, r, w)]
    s = ref[0] + ref[1]
    (layer_norm(s, 5, ref[2]) if used == "out" else s).sum().backward()
    assert_close(ts[0].grad, ref[0].grad, rtol=1e-10, atol=1e-12)
    assert_close(ts[1].grad, ref[1].grad, rtol=1e-10, atol=1e-12)
    if used == "out":
        assert_close(ts[2].grad, ref[2].grad, rtol=1e-10, atol=1e-12)
    else:
        assert ts[2].grad is None


def test_fused_add_layer_norm_double_backward():
    rng = np.random.default_rng(7)
    x, r, w = rng.standard_normal((2, 5)), rng.standard_normal((2, 5)), rng.standard_normal(5)
    v, u = rng.standard_normal((2, 5)), rng.standard_normal((2, 5))

    def first(a, c, wt):
        a.requires_grad_()
        out, total = fused_add_layer_norm(a, c, (5,), wt)
        loss = (out * pf.tensor(v) + total * total * pf.tensor(u)).sum()
        return pf.autograd.grad(loss, a, create_graph=True)[0]
    check_grad(first, [x, r, w], rtol=1e-4, atol=1e-6)
    fused = pf.tensor(x, requires_grad=True)    # the differentiable form gives the same grad
    out, total = fused_add_layer_norm(fused, pf.tensor(r), (5,), pf.tensor(w))
    (out * pf.tensor(v) + total * total * pf.tensor(u)).sum().backward()
    assert_close(first(pf.tensor(x), pf.tensor(r), pf.tensor(w)), fused.grad, rtol=1e-10,
                 atol=1e-12)


def test_fused_add_layer_norm_errors():
    x = pf.ones(2, 3)
    with pytest.raises(RuntimeError, match=r"fused_add_layer_norm\(\): given normalized_shape="
                                           r"\[4\].*got input of size \[2, 3\]"):
        fused_add_layer_norm(x, pf.ones(2, 3), (4,))
    with pytest.raises(RuntimeError, match=r"expected residual of the shape of input \[2, 3\], "
                                           r"got \[1, 3\]"):
        fused_add_layer_norm(x, pf.ones(1, 3), (3,))
    with pytest.raises(RuntimeError, match=r"expected residual of input's dtype pyflow.float32, "
                                           r"got pyflow.float64"):
        fused_add_layer_norm(x, pf.ones(2, 3, dtype=pf.float64), (3,))
    with pytest.raises(RuntimeError, match="expected bias of shape"):
        fused_add_layer_norm(x, pf.ones(2, 3), (3,), pf.ones(3), pf.ones(2))
    with pytest.raises(TypeError, match="argument 'residual'"):
        fused_add_layer_norm(x, [1.0, 2.0, 3.0], 3)


def test_fused_add_layer_norm_device_mismatch():
    if pf.get_default_device().type == "cpu":
        pytest.skip("needs a second device (the cuda-simulator run has one)")
    with pytest.raises(RuntimeError, match=r"residual is on cpu and input on cuda"):
        fused_add_layer_norm(pf.ones(2, 3), pf.ones(2, 3, device="cpu"), 3)


# ------------------------------------------------------------------ PyTorch
@needs_torch
@pytest.mark.parametrize("eps", [None, 1e-4])
@pytest.mark.parametrize("affine", [True, False])
def test_rms_norm_against_torch(eps, affine):
    rng = np.random.default_rng(8)
    x = rng.standard_normal((4, 3, 10)).astype(np.float32)
    w = rng.standard_normal((3, 10)).astype(np.float32)
    g = rng.standard_normal(x.shape).astype(np.float32)
    ours = [pf.tensor(a, requires_grad=True) for a in (x, w)]
    theirs = [torch.tensor(a, requires_grad=True) for a in (x, w)]
    out = rms_norm(ours[0], (3, 10), ours[1] if affine else None, eps)
    ref = torch.nn.functional.rms_norm(theirs[0], (3, 10), theirs[1] if affine else None, eps)
    out.backward(pf.tensor(g))
    ref.backward(torch.tensor(g))
    assert_close(out, ref.detach().numpy(), rtol=1e-5, atol=1e-5)
    for o, t in zip(ours[:2 if affine else 1], theirs):
        assert_close(o.grad, t.grad.numpy(), rtol=1e-4, atol=1e-4)


@needs_torch
def test_rms_norm_module_against_torch():
    rng = np.random.default_rng(9)
    x = rng.standard_normal((2, 5, 6)).astype(np.float32)
    g = rng.standard_normal(x.shape).astype(np.float32)
    w = rng.standard_normal(6).astype(np.float32)
    ours, theirs = pf.nn.RMSNorm(6), torch.nn.RMSNorm(6)
    assert repr(ours) == repr(theirs)
    with pf.no_grad():
        ours.weight.copy_(pf.tensor(w))
    with torch.no_grad():
        theirs.weight.copy_(torch.tensor(w))
    tx, rx = pf.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    out, ref = ours(tx), theirs(rx)
    out.backward(pf.tensor(g))
    ref.backward(torch.tensor(g))
    assert_close(out, ref.detach().numpy(), rtol=1e-5, atol=1e-5)
    assert_close(tx.grad, rx.grad.numpy(), rtol=1e-4, atol=1e-4)
    assert_close(ours.weight.grad, theirs.weight.grad.numpy(), rtol=1e-4, atol=1e-4)
    bare = pf.nn.RMSNorm([5, 6], eps=1e-3, elementwise_affine=False)
    tbare = torch.nn.RMSNorm([5, 6], eps=1e-3, elementwise_affine=False)
    assert repr(bare) == repr(tbare)
    assert_close(bare(pf.tensor(x)), tbare(torch.tensor(x)).numpy(), rtol=1e-5, atol=1e-5)


@needs_torch
def test_fused_add_layer_norm_against_torch():
    rng = np.random.default_rng(10)
    x, r, go, gs = (rng.standard_normal((4, 3, 10)).astype(np.float32) for _ in range(4))
    w, b = (rng.standard_normal((3, 10)).astype(np.float32) for _ in range(2))
    ours = [pf.tensor(a, requires_grad=True) for a in (x, r, w, b)]
    theirs = [torch.tensor(a, requires_grad=True) for a in (x, r, w, b)]
    out, total = fused_add_layer_norm(ours[0], ours[1], (3, 10), ours[2], ours[3])
    ref_total = theirs[0] + theirs[1]
    ref = torch.nn.functional.layer_norm(ref_total, (3, 10), theirs[2], theirs[3])
    (out * pf.tensor(go) + total * pf.tensor(gs)).sum().backward()
    (ref * torch.tensor(go) + ref_total * torch.tensor(gs)).sum().backward()
    assert_close(out, ref.detach().numpy(), rtol=1e-5, atol=1e-5)
    assert_close(total, ref_total.detach().numpy(), rtol=0, atol=0)
    for o, t in zip(ours, theirs):
        assert_close(o.grad, t.grad.numpy(), rtol=1e-4, atol=1e-4)
