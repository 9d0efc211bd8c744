"""Elementwise ops: NumPy float64 reference, finite differences, broadcasting,
non-contiguous layouts, PyTorch where installed."""
import math

import numpy as np
import pytest
from hypothesis import given, strategies as st

import pyflow as pf
from tests.helpers import (assert_close, broadcastable_pair, check_grad, layouts, make_input,
                           needs_torch, to_numpy, torch)

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


# ----------------------------------------------------------------- infinities, zeros, integers
INF, NAN = float("inf"), float("nan")


def _values(t):
    return to_numpy(t.float() if t.dtype in (pf.float16, pf.bfloat16) else t)


@pytest.mark.parametrize("dt", [pf.float32, pf.float64, pf.float16, pf.bfloat16])
def test_relu_of_infinities_nan_and_negative_zero_like_pytorch(dt):
    """relu(-inf) is 0 (not inf * 0 = NaN), relu of a negative is +0.0, relu(-0.0) and
    NaN pass through; the backward sends 0 (not NaN) where the output is <= 0, also for
    an infinite upstream gradient, and the gradient itself where the output is NaN."""
    x = pf.tensor([-INF, -3.0, -0.0, 0.0, 2.0, NAN, INF], dtype=dt, requires_grad=True)
    y = pf.relu(x)
    got = _values(y)
    np.testing.assert_array_equal(got, [0.0, 0.0, -0.0, 0.0, 2.0, NAN, INF])
    assert list(np.signbit(got[:4])) == [False, False, True, False]   # as torch.relu
    g = pf.tensor([INF, NAN, INF, -INF, 1.0, INF, NAN], dtype=dt)
    want = [0.0, 0.0, 0.0, 0.0, 1.0, INF, NAN]
    (gx,) = pf.autograd.grad(y, x, g, retain_graph=True)                # fused backward kernel
    np.testing.assert_array_equal(_values(gx), want)
    (gx,) = pf.autograd.grad(y, x, g, create_graph=True)                # differentiable form
    np.testing.assert_array_equal(_values(gx), want)


def test_relu_after_masked_fill_with_minus_infinity():
    """The masking idiom F.relu(x.masked_fill(mask, -inf)), and nn.ReLU."""
    x = pf.tensor([[1.0, -2.0], [3.0, 4.0]])
    mask = pf.tensor([[False, True], [True, False]])
    out = pf.nn.functional.relu(x.masked_fill(mask, -INF))
    assert out.tolist() == [[1.0, 0.0], [0.0, 4.0]]
    assert pf.nn.ReLU()(pf.tensor([-INF, -1.0])).tolist() == [0.0, 0.0]
    assert pf.relu(pf.tensor([-3, 0, 2])).tolist() == [0, 0, 2]


def test_fused_chains_take_the_new_relu_and_select_their_max_gradients():
    """The graph's fused kernels are generated from kernels/scalar.py: relu(a * s) of
    -inf is 0 and its gradient for an infinite g is 0; maximum's fused gradient gives
    the operand not picked 0 (selected, not g * 0 = NaN)."""
    from pyflow.graph.passes.fusion import fused_function
    mul_relu = fused_function((("mul", (0, 1)), ("relu", (2,))), (False, True))
    a = pf.tensor([-INF, -1.0, 2.0], requires_grad=True)
    out = mul_relu.apply(a, 1.0)
    assert out.tolist() == [0.0, 0.0, 2.0]
    out.backward(pf.tensor([INF, INF, 1.0]))
    assert a.grad.tolist() == [0.0, 0.0, 1.0]
    max_mul = fused_function((("maximum", (0, 1)), ("mul", (2, 3))), (False, False, True))
    a = pf.tensor([1.0, 2.0, 3.0], requires_grad=True)
    b = pf.tensor([2.0, 2.0, 1.0], requires_grad=True)
    max_mul.apply(a, b, 1.0).backward(pf.tensor([INF, INF, INF]))
    assert a.grad.tolist() == [0.0, INF, INF] and b.grad.tolist() == [INF, INF, 0.0]


def test_select_gradients_with_an_infinite_upstream_gradient():
    """maximum/minimum, clamp and sign give 0 (PyTorch's values), not inf * 0 = NaN."""
    g = pf.tensor([INF, INF, INF])
    a = pf.tensor([1.0, 2.0, 3.0], requires_grad=True)
    b = pf.tensor([2.0, 2.0, 1.0], requires_grad=True)
    pf.maximum(a, b).backward(g)
    assert a.grad.tolist() == [0.0, INF, INF] and b.grad.tolist() == [INF, INF, 0.0]
    a.grad = b.grad = None
    pf.minimum(a, b).backward(g)
    assert a.grad.tolist() == [INF, INF, 0.0] and b.grad.tolist() == [0.0, INF, INF]
    x = pf.tensor([-2.0, 0.0, 2.0], requires_grad=True)
    pf.clamp(x, -1.0, 1.0).backward(g)
    assert x.grad.tolist() == [0.0, INF, 0.0]
    x.grad = None
    pf.sign(x).backward(g)
    assert x.grad.tolist() == [0.0, 0.0, 0.0]
    # a NaN operand: both get the gradient, as in PyTorch
    a = pf.tensor([NAN], requires_grad=True)
    b = pf.tensor([1.0], requires_grad=True)
    pf.maximum(a, b).backward(pf.ones(1))
    assert a.grad.tolist() == [1.0] and b.grad.tolist() == [1.0]


@pytest.mark.parametrize("dt", [pf.int32, pf.int64])
def test_integer_division_by_zero_raises_like_pytorch(dt):
    a = pf.tensor([5, -5, 7], dtype=dt)
    z = pf.tensor([0, 2, 0], dtype=dt)
    for call in (lambda: a // z, lambda: a % z, lambda: a // 0, lambda: a % 0,
                 lambda: pf.floor_divide(a, z), lambda: pf.remainder(a, 0),
                 lambda: pf.div(a, z, rounding_mode="floor"),
                 lambda: pf.div(a, z, rounding_mode="trunc"),
                 lambda: 7 // z, lambda: 7 % z, lambda: a // False):
        with pytest.raises(RuntimeError, match="ZeroDivisionError"):
            call()
    # no zero: the usual answers; an empty divisor is fine
    assert (a // pf.tensor([2, 2, -3], dtype=dt)).tolist() == [2, -3, -3]
    assert (a % pf.tensor([2, 2, -3], dtype=dt)).tolist() == [1, 1, -2]
    assert (pf.zeros(0, dtype=dt) // pf.zeros(0, dtype=dt)).shape == (0,)
    # float results divide by zero as IEEE says
    assert (a / z).tolist()[0] == INF
    assert (a // 0.0).tolist() == [INF, -INF, INF]


def test_integer_floor_division_of_int_min_by_minus_one_wraps_like_pytorch():
    assert (pf.tensor([-2**63]) // -1).tolist() == [-2**63]
    assert (pf.tensor([-2**31], dtype=pf.int32) // -1).tolist() == [-2**31]
    assert (pf.tensor([7, -7]) // pf.tensor([-1, -1])).tolist() == [-7, 7]
    assert (pf.tensor([-2**63]) % -1).tolist() == [0]


@pytest.mark.parametrize("dt", [pf.int32, pf.int64])
def test_integer_pow_with_negative_exponents_like_pytorch(dt):
    a = pf.tensor([5, -5, 7], dtype=dt)
    with pytest.raises(RuntimeError, match="Integers to negative integer powers"):
        a ** -1
    with pytest.raises(RuntimeError, match="Integers to negative integer powers"):
        pf.pow(a, -2)
    with pytest.raises(RuntimeError, match="Integers to negative integer powers"):
        pf.tensor([True, False]) ** -1
    # a tensor exponent: 1 / a ** n truncated (0 ** -n is 0, not INT64_MIN)
    base = pf.tensor([-1, 0, 1, 2, -2, 3, -1], dtype=dt)
    exp = pf.tensor([-1, -2, -3, -1, -1, 0, -2], dtype=dt)
    assert (base ** exp).tolist() == [-1, 0, 1, 0, 0, 1, 1]
    assert (pf.tensor([0], dtype=dt) ** pf.tensor([-1], dtype=dt)).tolist() == [0]
    assert (2 ** exp).tolist() == [0, 0, 0, 0, 0, 1, 0]
    assert (a ** 2).tolist() == [25, 25, 49] and (a ** -1.0).dtype is pf.float32
    with pytest.raises(RuntimeError, match="Integers to negative integer powers"):
        a ** np.int64(-1)


def test_numpy_integer_scalars_promote_as_ints_like_pytorch():
    """A NumPy int scalar is an int (it made int tensors float: tensor([2]) ** np.int64(3)
    was tensor([8.]))."""
    assert (pf.tensor([2]) ** np.int64(3)).tolist() == [8]
    assert (pf.tensor([2]) + np.int32(3)).dtype is pf.int64
    assert (pf.tensor([2], dtype=pf.int32) * np.int64(3)).dtype is pf.int32
    assert (pf.tensor([2.0]) * np.int64(3)).dtype is pf.float32


def test_bool_subtraction_and_negation_are_refused_like_pytorch():
    a, b = pf.tensor([True, False]), pf.tensor([True, True])
    for call in (lambda: a - b, lambda: a - True, lambda: True - a, lambda: pf.sub(a, b),
                 lambda: a.clone().sub_(b), lambda: pf.sub(a, b, alpha=2)):
        with pytest.raises(RuntimeError, match="with two bool tensors is not supported"):
            call()
    for call in (lambda: a - 1, lambda: 1 - a, lambda: pf.tensor([1.5]) - a):
        with pytest.raises(RuntimeError, match="with a bool tensor is not supported"):
            call()
    for call in (lambda: -a, lambda: pf.neg(a)):
        with pytest.raises(RuntimeError, match="Negation, the `-` operator, on a bool tensor"):
            call()
    for call in (lambda: a // b, lambda: a % b, lambda: a ** b, lambda: pf.abs(a)):
        with pytest.raises(NotImplementedError, match="bool"):
            call()
    assert pf.pow(a, True).tolist() == [True, False] and (a ** False).tolist() == [True, True]
    with pytest.raises(RuntimeError, match="Boolean inputs not supported for relu"):
        pf.relu(a)
    assert (a + b).tolist() == [True, True] and (~a).tolist() == [False, True]
    sq = pf.square(a)
    assert sq.dtype is pf.int64 and sq.tolist() == [1, 0]


@needs_torch
def test_integer_and_bool_edge_cases_against_torch():
    """Each case gives PyTorch's value, or an exception of PyTorch's type."""
    cases = [
        lambda m: m.tensor([5, -5]) // m.tensor([0, 1]),
        lambda m: m.tensor([5, -5], dtype=m.int32) % 0,
        lambda m: m.tensor([3, -3]) ** -1,
        lambda m: m.tensor([-1, 0, 1, 2]) ** m.tensor([-3, -1, -2, -1]),
        lambda m: m.tensor([-2**63]) // -1,
        lambda m: m.tensor([True]) - m.tensor([False]),
        lambda m: m.tensor([True]) - 1,
        lambda m: -m.tensor([True]),
        lambda m: m.tensor([True]) // m.tensor([True]),
        lambda m: m.relu(m.tensor([-float("inf"), -2.0, float("nan")])),
        lambda m: m.square(m.tensor([True, False])),
    ]
    for i, case in enumerate(cases):
        try:
            want = case(torch).tolist()
        except Exception as e:  # noqa: BLE001  (the type is what is compared)
            with pytest.raises(type(e)):
                case(pf)
            continue
        got = case(pf).tolist()
        np.testing.assert_array_equal(np.array(got, dtype=float), np.array(want, dtype=float),
                                      err_msg=f"case {i}")


@pytest.mark.parametrize("dt", [pf.float32, pf.float64, pf.float16])
def test_sign_rsqrt_abs_of_nan_and_signed_zeros_like_pytorch(dt):
    x = pf.tensor([NAN, -0.0, 0.0, -2.0, 4.0, -INF, INF], dtype=dt)
    np.testing.assert_array_equal(_values(pf.sign(x)), [0.0, 0.0, 0.0, -1.0, 1.0, -1.0, 1.0])
    np.testing.assert_array_equal(_values(pf.rsqrt(x)), [NAN, -INF, INF, NAN, 0.5, NAN, 0.0])
    a = _values(pf.abs(x))
    np.testing.assert_array_equal(a, [NAN, 0.0, 0.0, 2.0, 4.0, INF, INF])
    assert not np.signbit(a[1])                                 # abs(-0.0) is +0.0


def test_activations_and_unary_ops_check_their_input_like_pytorch():
    for fn, name in ((pf.exp, "exp"), (pf.relu, "relu"), (pf.isnan, "isnan"),
                     (pf.isinf, "isinf"), (pf.isfinite, "isfinite"), (pf.square, "square"),
                     (pf.gelu, "gelu"), (pf.neg, "neg")):
        with pytest.raises(TypeError, match=rf"{name}\(\): argument 'input' \(position 1\) "
                                            r"must be Tensor, not float"):
            fn(2.0)
    for fn in (pf.maximum, pf.minimum):
        with pytest.raises(TypeError, match="argument 'other' .* must be Tensor, not float"):
            fn(pf.ones(2), 2.0)
    for call in (lambda: pf.gelu(pf.tensor([1, 2])), lambda: pf.silu(pf.tensor([1, 2])),
                 lambda: pf.gelu(pf.tensor([True]), approximate="tanh")):
        with pytest.raises(NotImplementedError, match="not implemented for (int64|bool)"):
            call()
    assert pf.sigmoid(pf.tensor([0, 0])).tolist() == [0.5, 0.5]     # sigmoid promotes


def test_masked_fill_broadcasts_and_fills_bools_like_pytorch():
    out = pf.zeros(3).masked_fill(pf.tensor([[True], [False]]), 1.0)
    assert out.tolist() == [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]
    with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):
        pf.zeros(3).masked_fill_(pf.tensor([[True], [False]]), 1.0)
    b = pf.tensor([False, False])
    assert b.masked_fill(pf.tensor([True, False]), 1e-50).tolist() == [True, False]
    assert b.masked_fill(pf.tensor([True, False]), NAN).tolist() == [True, False]
    i = pf.zeros(3, dtype=pf.int32).masked_fill(pf.tensor(True), 1.9999999999999998)
    assert i.dtype is pf.int32 and i.tolist() == [1, 1, 1]          # truncated, not 2.0f
    with pytest.raises(TypeError, match="'value' must be a number or a 0-dim Tensor, not NoneType"):
        pf.zeros(2).masked_fill(pf.tensor([[True]]), None)


def test_half_comparisons_round_the_other_operand_like_pytorch():
    """PyTorch compares in the common dtype: a number or a 0-d tensor of another dtype
    is rounded to float16/bfloat16 first (arithmetic keeps the exact number)."""
    h = pf.tensor([0.278564453125], dtype=pf.float16)
    assert (h == 0.2786802329729676).tolist() == [True]
    assert (h < 0.2786802329729676).tolist() == [False]
    b = pf.tensor([[0.96875]], dtype=pf.bfloat16)
    assert pf.eq(b, pf.tensor(0.97070312, dtype=pf.float16)).tolist() == [[True]]
    assert (b * pf.tensor(0.97070312, dtype=pf.float16)).item() == 0.94140625     # as torch
