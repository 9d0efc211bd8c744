"""Elementwise ops: NumPy float64 reference, finite differences, broadcasting,
non-contiguous layouts, PyTorch where installed."""
import math

import numpy as np
import pytest
from hypothesis import given, strategies as st

import pyflow as pf
from tests.helpers import (assert_close, broadcastable_pair, check_grad, layouts, make_input,
                           needs_torch, torch)

_erf = np.vectorize(math.erf)
BINARY = {
    "add": (pf.add, np.add), "sub": (pf.sub, np.subtract), "mul": (pf.mul, np.multiply),
    "div": (pf.div, np.divide), "maximum": (pf.maximum, np.maximum),
    "minimum": (pf.minimum, np.minimum),
}
UNARY = {  # name: (pyflow, numpy reference, input domain)
    "neg": (pf.neg, np.negative, (-2, 2)), "exp": (pf.exp, np.exp, (-2, 2)),
    "log": (pf.log, np.log, (0.2, 3)), "sqrt": (pf.sqrt, np.sqrt, (0.2, 3)),
    "rsqrt": (pf.rsqrt, lambda x: 1 / np.sqrt(x), (0.2, 3)), "abs": (pf.abs, np.abs, (-2, 2)),
    "sin": (pf.sin, np.sin, (-3, 3)), "cos": (pf.cos, np.cos, (-3, 3)),
    "tanh": (pf.tanh, np.tanh, (-3, 3)), "sigmoid": (pf.sigmoid, lambda x: 1 / (1 + np.exp(-x)), (-4, 4)),
    "relu": (pf.relu, lambda x: np.maximum(x, 0), (-2, 2)),
    "gelu": (pf.gelu, lambda x: 0.5 * x * (1 + _erf(x / np.sqrt(2))), (-3, 3)),
    "gelu_tanh": (lambda x: pf.gelu(x, approximate="tanh"),
                  lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3))), (-3, 3)),
    "silu": (pf.silu, lambda x: x / (1 + np.exp(-x)), (-4, 4)),
    "reciprocal": (pf.reciprocal, lambda x: 1 / x, (0.5, 3)),
}


def _away_from_kinks(x):
    """Keep finite-difference points away from non-differentiable points."""
    return np.where(np.abs(x) < 0.05, 0.3, x)


@pytest.mark.parametrize("name", sorted(BINARY))
@given(data=st.data())
def test_binary_forward_backward(name, data):
    pf_fn, np_fn = BINARY[name]
    sa, sb = data.draw(broadcastable_pair(max_dims=3))
    la, lb = data.draw(layouts()), data.draw(layouts())
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    a, ta = make_input(rng, sa, la)
    b, tb = make_input(rng, sb, lb, low=0.5, high=2.0)
    assert_close(pf_fn(ta, tb), np_fn(a, b), rtol=1e-12)
    if name in ("maximum", "minimum"):
        b = b + 0.01  # no ties in finite differences
    check_grad(pf_fn, [a, b])


@pytest.mark.parametrize("name", sorted(UNARY))
@given(data=st.data())
def test_unary_forward_backward(name, data):
    pf_fn, np_fn, (lo, hi) = UNARY[name]
    shape = data.draw(st.lists(st.integers(1, 4), min_size=0, max_size=3).map(tuple))
    layout = data.draw(layouts())
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    x, tx = make_input(rng, shape, layout, low=lo, high=hi)
    assert_close(pf_fn(tx), np_fn(x), rtol=1e-10, atol=1e-12)
    if name in ("abs", "relu"):
        x = _away_from_kinks(x)
    check_grad(pf_fn, [x])


@pytest.mark.parametrize("name", ["sigmoid", "tanh", "relu", "gelu", "silu", "exp", "mul"])
def test_float32_matches_float64(name):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((5, 7))
    fn = UNARY[name][0] if name in UNARY else (lambda t: t * t)
    out32 = fn(pf.tensor(x, dtype=pf.float32))
    assert out32.dtype is pf.float32
    assert_close(out32, fn(pf.tensor(x)), rtol=1e-5, atol=1e-6)


def test_double_backward_through_activation():
    x = pf.tensor([0.3, -1.2, 2.0], dtype=pf.float64, requires_grad=True)
    for fn in (pf.sigmoid, pf.tanh, pf.gelu, pf.silu):
        (g,) = pf.autograd.grad(fn(x).sum(), x, create_graph=True)
        (gg,) = pf.autograd.grad(g.sum(), x)
        eps = 1e-6
        xp = pf.tensor(x.detach().cpu().numpy() + eps, requires_grad=True)
        xm = pf.tensor(x.detach().cpu().numpy() - eps, requires_grad=True)
        (gp,) = pf.autograd.grad(fn(xp).sum(), xp)
        (gm,) = pf.autograd.grad(fn(xm).sum(), xm)
        assert_close(gg, (gp.cpu().numpy() - gm.cpu().numpy()) / (2 * eps), rtol=1e-5, atol=1e-7)


def test_type_promotion_like_pytorch():
    i = pf.tensor([1, 2, 3])
    f = pf.tensor([1.0, 2.0, 3.0])
    d = pf.tensor([1.0], dtype=pf.float64)
    assert (i + 1).dtype is pf.int64
    assert (i * 2.5).dtype is pf.float32
    assert (i / 2).dtype is pf.float32
    assert (f + d).dtype is pf.float64
    assert (f + pf.tensor(2.0, dtype=pf.float64)).dtype is pf.float32  # 0-dim doesn't win
    assert (i + pf.tensor(2.0, dtype=pf.float64)).dtype is pf.float64  # higher category does
    assert (pf.tensor([1], dtype=pf.int32) + pf.tensor([1])).dtype is pf.int64
    assert (pf.ones(2, dtype=pf.float16) + pf.ones(2, dtype=pf.bfloat16)).dtype is pf.float32
    assert (f > 1).dtype is pf.bool


@pytest.mark.parametrize("dt", [pf.float16, pf.bfloat16])
def test_half_types_compute_in_float32(dt):
    x = np.array([0.5, -1.25, 3.0, 100.0])
    t = pf.tensor(x, dtype=dt)
    out = (t * 2 + 1).sigmoid()
    assert out.dtype is dt
    assert_close(out.float(), 1 / (1 + np.exp(-(x * 2 + 1))), rtol=1e-2, atol=1e-3)


def test_where_clamp_masked_fill():
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((3, 4)), rng.standard_normal((4,))
    c = a > 0
    assert_close(pf.where(pf.tensor(c), pf.tensor(a), pf.tensor(b)), np.where(c, a, b))
    check_grad(lambda x, y: pf.where(pf.tensor(c), x, y), [a, b])
    assert_close(pf.clamp(pf.tensor(a), -0.5, 0.5), np.clip(a, -0.5, 0.5))
    check_grad(lambda x: pf.clamp(x, -0.5, 0.5), [np.where(np.abs(np.abs(a) - 0.5) < 0.05, 0.0, a)])
    assert_close(pf.tensor(a).masked_fill(pf.tensor(c), -1.0), np.where(c, -1.0, a))
    check_grad(lambda x: x.masked_fill(pf.tensor(c), 0.0), [a])


def test_comparisons_and_logic():
    a = pf.tensor([1, 2, 3])
    b = pf.tensor([3, 2, 1])
    assert (a == b).tolist() == [False, True, False]
    assert (a < b).tolist() == [True, False, False]
    assert ((a >= 2) & (b >= 2)).tolist() == [False, True, False]
    assert (~(a > 1)).tolist() == [True, False, False]
    assert pf.logical_xor(a > 1, b > 1).tolist() == [True, False, True]
    assert (a % 2).tolist() == [1, 0, 1] and (a // 2).tolist() == [0, 1, 1]


def test_inplace_ops_and_version_counter():
    x = pf.tensor([1.0, 2.0, 3.0])
    v = x.view(3)
    x.add_(1).mul_(2)
    assert v.tolist() == [4.0, 6.0, 8.0]  # views see in-place changes
    assert x._version[0] == 2 and v._version[0] == 2
    w = pf.tensor([1.0, 2.0], requires_grad=True)
    y = w * 1
    z = y * y
    y.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        z.sum().backward()


def test_inplace_on_leaf_requiring_grad_is_an_error():
    w = pf.ones(2, requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf Variable"):
        w.add_(1)
    with pf.no_grad():
        w.add_(1)
    assert w.tolist() == [2.0, 2.0]


def test_inplace_records_autograd_on_nonleaf():
    a = pf.tensor([1.0, 2.0], requires_grad=True)
    b = a * 3
    b.mul_(a)          # b = 3a * a -> d/da = 6a
    b.sum().backward()
    assert_close(a.grad, [6.0, 12.0])


def test_inplace_cannot_change_dtype_category():
    with pytest.raises(RuntimeError, match="can't be cast"):
        pf.tensor([1, 2]).add_(0.5)


def test_errors_are_clear():
    with pytest.raises(RuntimeError, match="not broadcastable"):
        pf.ones(2, 3) + pf.ones(4)
    with pytest.raises(TypeError, match="argument"):
        pf.add(pf.ones(2), "x")
    with pytest.raises(TypeError, match="bool Tensor"):
        pf.ones(2).masked_fill(pf.ones(2), 0.0)


@needs_torch
def test_against_torch():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((4, 5)).astype(np.float32)
    for name in ("sigmoid", "tanh", "gelu", "silu", "relu", "exp"):
        ours = UNARY[name][0](pf.tensor(x, requires_grad=True))
        ref = getattr(torch.nn.functional, name, None) or getattr(torch, name)
        tx = torch.tensor(x, requires_grad=True)
        tr = ref(tx)
        assert_close(ours, tr.detach().cpu().numpy(), rtol=1e-5, atol=1e-6, msg=name)
        xp = pf.tensor(x, requires_grad=True)
        UNARY[name][0](xp).sum().backward()
        tr.sum().backward()
        assert_close(xp.grad, tx.grad.cpu().numpy(), rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.cpu_only   # the CPU backend's own float32 loops, at sizes the simulator can't run
@pytest.mark.parametrize("name", ["gelu", "gelu_tanh", "silu", "sigmoid"])
@pytest.mark.parametrize("size", [37, 70_001])   # serial and parallel fast loops
def test_float32_fast_activation_loops(name, size):
    """Contiguous float32 takes the vectorized loops of kernels/cpu/activation.py;
    values and fused backward stay within float32 accuracy of float64."""
    rng = np.random.default_rng(size)
    x = (rng.standard_normal(size) * 3).astype(np.float32)
    x[:4] = [0.0, 30.0, -30.0, np.nan]
    pf_fn, np_fn, _ = UNARY[name]
    t = pf.tensor(x, requires_grad=True)
    out = pf_fn(t)
    ref = np_fn(x.astype(np.float64))
    np.testing.assert_allclose(out.detach().cpu().numpy(), ref, rtol=2e-6, atol=2e-6)
    out.backward(pf.ones(size))
    t64 = pf.tensor(x.astype(np.float64), requires_grad=True)
    pf_fn(t64).backward(pf.ones(size, dtype=pf.float64))
    np.testing.assert_allclose(t.grad.cpu().numpy(), t64.grad.cpu().numpy(), rtol=2e-5, atol=2e-6)


def test_pow_with_a_number_base_differentiates_the_exponent():
    """2.0 ** t and pow(2.0, t): d/dt = 2**t * ln 2 (the base is a Python number)."""
    t = pf.tensor([0.5, 1.5, -1.0], dtype=pf.float64, requires_grad=True)
    (pf.pow(2.0, t) + 3.0 ** t).sum().backward()
    x = np.array([0.5, 1.5, -1.0])
    np.testing.assert_allclose(t.grad.cpu().numpy(), 2.0 ** x * np.log(2.0) + 3.0 ** x * np.log(3.0),
                               rtol=1e-12)
