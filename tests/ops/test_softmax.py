"""softmax / log_softmax: float64 NumPy reference, finite differences over
random shapes, dims and layouts, float32 and half accuracy, -inf handling,
double backward, PyTorch."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

import pyflow as pf
from tests.helpers import assert_close, check_grad, layouts, make_input, needs_torch, torch


def np_softmax(x, dim):
    e = np.exp(x - x.max(dim, keepdims=True))
    return e / e.sum(dim, keepdims=True)


def np_log_softmax(x, dim):
    m = x.max(dim, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(dim, keepdims=True))


OPS = {"softmax": (pf.softmax, np_softmax), "log_softmax": (pf.log_softmax, np_log_softmax)}


def grad_of(fn, v):
    """x -> d/dx sum(fn(x) * v), kept differentiable (for double backward checks)."""
    def first(x):
        if not x.requires_grad:
            x.requires_grad_()
        (g,) = pf.autograd.grad((fn(x) * pf.tensor(v)).sum(), x, create_graph=True)
        return g
    return first


@pytest.mark.parametrize("name", sorted(OPS))
@given(data=st.data())
def test_forward_backward_random_shapes_dims_layouts(name, data):
    pf_fn, np_fn = OPS[name]
    shape = data.draw(st.lists(st.integers(1, 5), min_size=1, max_size=3).map(tuple))
    dim = data.draw(st.integers(-len(shape), len(shape) - 1))
    layout = data.draw(layouts())
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    x, tx = make_input(rng, shape, layout, low=-3, high=3)
    assert_close(pf_fn(tx, dim), np_fn(x, dim), rtol=1e-12, atol=1e-14)
    check_grad(lambda t: pf_fn(t, dim), [x])


@pytest.mark.parametrize("name", sorted(OPS))
@pytest.mark.parametrize("shape,dim", [((7, 300), 1), ((3, 70, 5), 1), ((40, 6), 0),
                                       ((2, 3, 129), -1)])
def test_float32_matches_float64_reference(name, shape, dim):
    pf_fn, np_fn = OPS[name]
    x = np.random.default_rng(1).standard_normal(shape) * 4
    out = pf_fn(pf.tensor(x, dtype=pf.float32), dim)
    assert out.dtype is pf.float32
    assert_close(out, np_fn(x, dim), rtol=1e-5, atol=2e-6)
    g = np.random.default_rng(2).standard_normal(shape)
    t32 = pf.tensor(x, dtype=pf.float32, requires_grad=True)
    pf_fn(t32, dim).backward(pf.tensor(g, dtype=pf.float32))
    t64 = pf.tensor(x, requires_grad=True)
    pf_fn(t64, dim).backward(pf.tensor(g))
    assert_close(t32.grad, t64.grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dt", [pf.float32, pf.float64])
def test_infinities_large_values_and_nan(dt):
    x = pf.tensor([[0.0, -np.inf, 1.0, -np.inf], [1000.0, 999.0, -1000.0, 0.0],
                   [-np.inf] * 4, [np.nan, 0.0, 1.0, 2.0]], dtype=dt)
    y = pf.softmax(x, 1).cpu().numpy()
    assert_close(y[0], np_softmax(np.array([0.0, -np.inf, 1.0, -np.inf]), 0), rtol=1e-6)
    assert y[0, 1] == 0.0 and y[0, 3] == 0.0          # exactly zero, like PyTorch
    assert_close(y[1], np_softmax(np.array([1000.0, 999.0, -1000.0, 0.0]), 0), rtol=1e-6)
    assert np.isnan(y[2]).all() and np.isnan(y[3]).all()
    ly = pf.log_softmax(x, 1).cpu().numpy()
    assert ly[0, 1] == -np.inf and np.isfinite(ly[1]).all()
    assert_close(ly[1], np_log_softmax(np.array([1000.0, 999.0, -1000.0, 0.0]), 0), rtol=1e-6)


@pytest.mark.parametrize("dt", [pf.float16, pf.bfloat16])
@pytest.mark.parametrize("name", sorted(OPS))
def test_half_types_compute_in_float32(dt, name):
    pf_fn, np_fn = OPS[name]
    x = np.random.default_rng(3).standard_normal((4, 9))
    t = pf.tensor(x, dtype=dt, requires_grad=True)
    y = pf_fn(t, -1)
    assert y.dtype is dt
    xr = t.detach().float().cpu().numpy().astype(np.float64)  # the rounded input
    assert_close(y.float(), np_fn(xr, -1), rtol=2e-2, atol=1e-2)
    y.sum().backward()
    assert t.grad.dtype is dt


def test_dtype_argument_and_scalars():
    x = pf.tensor([[1, 2, 3]])
    with pytest.raises(RuntimeError, match="floating point"):
        pf.softmax(x, 1)
    y = pf.softmax(x, 1, dtype=pf.float64)
    assert y.dtype is pf.float64
    assert_close(y, np_softmax(np.array([[1.0, 2, 3]]), 1), rtol=1e-12)
    assert pf.softmax(pf.tensor([1.0, 2.0]), dim=0, dtype=pf.float16).dtype is pf.float16
    assert pf.softmax(pf.tensor(3.0), 0).item() == 1.0
    assert pf.log_softmax(pf.tensor(3.0), -1).item() == 0.0
    assert pf.tensor([[1.0, 2.0]]).softmax(-1).shape == (1, 2)  # Tensor method
    assert pf.softmax(pf.zeros(0, 3), 1).shape == (0, 3)


@pytest.mark.parametrize("name", sorted(OPS))
@pytest.mark.parametrize("dim", [0, 1])
def test_double_backward(name, dim):
    rng = np.random.default_rng(4)
    x, v = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    first = grad_of(lambda t: OPS[name][0](t, dim), v)
    check_grad(first, [x], rtol=1e-5, atol=1e-6)
    fused = pf.tensor(x, requires_grad=True)    # the differentiable form gives the same grad
    OPS[name][0](fused, dim).backward(pf.tensor(v))
    assert_close(first(pf.tensor(x)), fused.grad, rtol=1e-10, atol=1e-12)


def test_errors_are_clear():
    with pytest.raises(IndexError, match="out of range"):
        pf.softmax(pf.ones(2, 3), 2)
    with pytest.raises(TypeError, match="argument 'input'"):
        pf.softmax(np.ones(3), 0)
    with pytest.raises(TypeError, match="dim"):
        pf.log_softmax(pf.ones(3), None)


@needs_torch
@pytest.mark.parametrize("name", sorted(OPS))
@pytest.mark.parametrize("shape,dim", [((5, 33), -1), ((4, 6, 7), 1), ((6, 5), 0)])
def test_against_torch(name, shape, dim):
    rng = np.random.default_rng(5)
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    g = rng.standard_normal(shape).astype(np.float32)
    t = pf.tensor(x, requires_grad=True)
    y = OPS[name][0](t, dim)
    y.backward(pf.tensor(g))
    tt = torch.tensor(x, requires_grad=True)
    ty = getattr(torch, name)(tt, dim)
    ty.backward(torch.tensor(g))
    assert_close(y, ty.detach().cpu().numpy(), rtol=1e-5, atol=1e-6)
    assert_close(t.grad, tt.grad.cpu().numpy(), rtol=1e-4, atol=1e-6)
