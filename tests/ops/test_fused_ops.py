"""fused_bias_add_gelu and fused_bias_dropout_add (pyflow/ops/fused.py): float64
references, finite-difference gradients, equality with the unfused ops they
replace (forward and every gradient), the mask F.dropout draws, non-contiguous
inputs, PyTorch, and the argument errors.  Runs on every test device."""
import math

import numpy as np
import pytest

import pyflow as pf
import pyflow.nn.functional as F
from pyflow.kernels import registry
from tests.helpers import assert_close, check_grad, needs_torch, to_numpy, torch
from tests.ops.test_dropout_embedding import philox_mask_reference

_erf = np.vectorize(math.erf)


def gelu_ref(x, approximate="none"):
    if approximate == "tanh":
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    return 0.5 * x * (1 + _erf(x / math.sqrt(2)))


def _data(shape, dtype=np.float64, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _grads(fn, tensors, g):
    for t in tensors:
        t.grad = None
    out = fn(*tensors)
    out.backward(g)
    return out, [to_numpy(t.grad) for t in tensors]


# ------------------------------------------------------------------ bias + GELU
@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("shape", [(3, 5), (2, 3, 4), (1,)])
def test_bias_gelu_matches_float64_reference(shape, approximate):
    x, b = _data(shape), _data(shape[-1:], seed=1)
    out = F.fused_bias_add_gelu(pf.tensor(x), pf.tensor(b), approximate=approximate)
    assert_close(out, gelu_ref(x + b, approximate), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_bias_gelu_gradients_match_finite_differences(approximate):
    check_grad(lambda x, b: F.fused_bias_add_gelu(x, b, approximate=approximate),
               [_data((3, 4)), _data((4,), seed=1)])


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_bias_gelu_equals_the_unfused_ops_in_float32(approximate):
    x = pf.tensor(_data((4, 6), np.float32), requires_grad=True)
    b = pf.tensor(_data((6,), np.float32, seed=1), requires_grad=True)
    g = pf.tensor(_data((4, 6), np.float32, seed=2))
    fused, fused_grads = _grads(lambda x, b: F.fused_bias_add_gelu(x, b, approximate), [x, b], g)
    plain, plain_grads = _grads(lambda x, b: F.gelu(x + b, approximate=approximate), [x, b], g)
    assert fused.dtype is pf.float32
    assert_close(fused, plain, rtol=1e-6, atol=1e-7)
    for a, e in zip(fused_grads, plain_grads):
        assert_close(a, e, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_bias_gelu_double_backward_equals_the_unfused_ops(approximate):
    x0, b0 = _data((3, 4)), _data((4,), seed=1)
    g = pf.tensor(_data((3, 4), seed=2))

    def second(fn):
        x, b = pf.tensor(x0, requires_grad=True), pf.tensor(b0, requires_grad=True)
        dx, db = pf.autograd.grad(fn(x, b), (x, b), g, create_graph=True)
        (dx * dx).sum().add((db * db).sum()).backward()
        return [to_numpy(t) for t in (dx, db, x.grad, b.grad)]

    fused = second(lambda x, b: F.fused_bias_add_gelu(x, b, approximate))
    plain = second(lambda x, b: F.gelu(x + b, approximate=approximate))
    for a, e in zip(fused, plain):
        assert_close(a, e, rtol=1e-10, atol=1e-12)


def test_bias_gelu_takes_non_contiguous_input():
    x = _data((5, 4))
    b = _data((5,), seed=1)
    xt = pf.tensor(x).t()                   # (4, 5), strided
    assert not xt.is_contiguous()
    assert_close(F.fused_bias_add_gelu(xt, pf.tensor(b)), gelu_ref(x.T + b), rtol=1e-10,
                 atol=1e-12)


def test_bias_gelu_16_bit_runs_the_two_ops():
    x, b = pf.tensor(_data((3, 4), np.float32)), pf.tensor(_data((4,), np.float32, seed=1))
    out = F.fused_bias_add_gelu(x.bfloat16(), b.bfloat16())
    assert out.dtype is pf.bfloat16
    assert_close(out.float(), F.gelu(x.bfloat16() + b.bfloat16()).float(), rtol=0, atol=0)


@needs_torch
def test_bias_gelu_matches_pytorch():
    x, b = _data((3, 8)), _data((8,), seed=1)
    tx, tb = torch.tensor(x, requires_grad=True), torch.tensor(b, requires_grad=True)
    ref = torch.nn.functional.gelu(tx + tb)
    ref.sum().backward()
    px, pb = pf.tensor(x, requires_grad=True), pf.tensor(b, requires_grad=True)
    out = F.fused_bias_add_gelu(px, pb)
    out.sum().backward()
    assert_close(out, ref.detach().numpy(), rtol=1e-10, atol=1e-12)
    assert_close(px.grad, tx.grad.numpy(), rtol=1e-10, atol=1e-12)
    assert_close(pb.grad, tb.grad.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("make, kind, match", [
    (lambda: (pf.ones(3, 4), pf.ones(3)), ValueError, r"'bias' must be 1-D of input's last dim \(4,\)"),
    (lambda: (pf.ones(3, 4), pf.ones(3, 4)), ValueError, r"got shape \(3, 4\)"),
    (lambda: (pf.ones(3, 4), pf.ones(4, dtype=pf.float64)), TypeError, "must be float32"),
    (lambda: (pf.ones(3, 4), [1.0] * 4), TypeError, "argument 'bias' must be a Tensor"),
])
def test_bias_gelu_refuses_bad_arguments(make, kind, match):
    with pytest.raises(kind, match=match):
        F.fused_bias_add_gelu(*make())


def test_bias_gelu_refuses_an_unknown_approximation():
    with pytest.raises(ValueError, match="approximate must be 'none' or 'tanh'"):
        F.fused_bias_add_gelu(pf.ones(2, 3), pf.ones(3), approximate="fast")


# ------------------------------------------------------------------ bias + dropout + residual
def _bias_dropout_add_ops(x, b, r, p):
    y = F.dropout(x if b is None else x + b, p)
    return y if r is None else y + r


@pytest.mark.parametrize("dtype", [pf.float32, pf.float64])
@pytest.mark.parametrize("with_bias, with_residual", [(True, True), (False, True),
                                                      (True, False), (False, False)])
def test_bias_dropout_add_equals_the_unfused_ops(dtype, with_bias, with_residual):
    np_dtype = np.float32 if dtype is pf.float32 else np.float64
    x = pf.tensor(_data((5, 6), np_dtype), requires_grad=True)
    b = pf.tensor(_data((6,), np_dtype, seed=1), requires_grad=True) if with_bias else None
    r = pf.tensor(_data((5, 6), np_dtype, seed=2), requires_grad=True) if with_residual else None
    g = pf.tensor(_data((5, 6), np_dtype, seed=3))
    ts = [t for t in (x, b, r) if t is not None]

    def call(fn):
        def run(*args):
            it = iter(args)
            return fn(next(it), next(it) if with_bias else None,
                      next(it) if with_residual else None, 0.4)
        pf.manual_seed(7)
        return _grads(run, ts, g)

    fused, fused_grads = call(lambda x, b, r, p: F.fused_bias_dropout_add(x, b, r, p=p))
    plain, plain_grads = call(_bias_dropout_add_ops)
    assert fused.dtype is dtype
    np.testing.assert_array_equal(to_numpy(fused), to_numpy(plain))
    for t, a, e in zip(ts, fused_grads, plain_grads):
        if t is b:      # summed in float64 in the backward's pass: the last bit may differ
            assert_close(a, e, rtol=1e-6, atol=1e-6)
        else:
            np.testing.assert_array_equal(a, e)


def test_bias_dropout_add_draws_the_documented_mask():
    x = _data((7, 9))
    out, keep = registry.get("bias_dropout_add_philox", pf.get_default_device().type)(
        pf.tensor(x)._data, None, None, 0.3, 1234, 5)
    expected = philox_mask_reference(63, 0.3, 1234, 5).reshape(7, 9)
    np.testing.assert_array_equal(np.asarray(to_numpy(pf.Tensor._make(keep, pf.bool,
                                                                      pf.get_default_device()))),
                                  expected)


def test_bias_dropout_add_gradients_match_finite_differences():
    def fn(x, b, r):
        pf.manual_seed(3)               # the same mask on every call
        return F.fused_bias_dropout_add(x, b, r, p=0.25)
    check_grad(fn, [_data((4, 3)), _data((3,), seed=1), _data((4, 3), seed=2)])


def test_bias_dropout_add_outside_training_adds_and_draws_no_seed():
    x, b, r = pf.tensor(_data((3, 4))), pf.tensor(_data((4,), seed=1)), pf.tensor(_data((3, 4), seed=2))
    pf.manual_seed(0)
    state = pf.get_rng_state()
    for kwargs in (dict(p=0.5, training=False), dict(p=0.0)):
        out = F.fused_bias_dropout_add(x, b, r, **kwargs)
        assert_close(out, to_numpy(x) + to_numpy(b) + to_numpy(r), rtol=0, atol=0)
    np.testing.assert_array_equal(to_numpy(pf.get_rng_state()), to_numpy(state))


def test_bias_dropout_add_with_p_one_leaves_the_residual():
    x, r = pf.tensor(_data((3, 4))), pf.tensor(_data((3, 4), seed=2))
    assert_close(F.fused_bias_dropout_add(x, None, r, p=1.0), r, rtol=0, atol=0)


def test_bias_dropout_add_takes_non_contiguous_inputs():
    x = pf.tensor(_data((4, 5))).t()
    r = pf.tensor(_data((4, 5), seed=2)).t()
    b = pf.tensor(_data((4,), seed=1))
    pf.manual_seed(1)
    fused = F.fused_bias_dropout_add(x, b, r, p=0.5)
    pf.manual_seed(1)
    np.testing.assert_array_equal(to_numpy(fused), to_numpy(_bias_dropout_add_ops(x, b, r, 0.5)))


def test_bias_dropout_add_float16_equals_the_unfused_ops():
    x = pf.tensor(_data((3, 8), np.float32)).half()
    b, r = pf.tensor(_data((8,), np.float32, seed=1)).half(), pf.tensor(_data((3, 8), np.float32)).half()
    pf.manual_seed(2)
    fused = F.fused_bias_dropout_add(x, b, r, p=0.5)
    pf.manual_seed(2)
    plain = _bias_dropout_add_ops(x, b, r, 0.5)
    assert fused.dtype is pf.float16
    np.testing.assert_array_equal(to_numpy(fused.float()), to_numpy(plain.float()))


@pytest.mark.parametrize("args, kwargs, kind, match", [
    ((pf.ones(3, 4), pf.ones(3)), {}, ValueError, r"'bias' must be 1-D of input's last dim"),
    ((pf.ones(3, 4), None, pf.ones(4, 3)), {}, ValueError,
     r"'residual' must be float32 of input's shape \(3, 4\)"),
    ((pf.ones(3, 4), None, pf.ones(3, 4, dtype=pf.float64)), {}, ValueError,
     "got float64 of shape"),
    ((pf.ones(3, 4), None), {"p": 1.5}, ValueError, "p must be a number between 0 and 1"),
    ((pf.ones(3, 4, dtype=pf.int64), None), {}, TypeError, "expected a floating point input"),
    (([1.0], None), {}, TypeError, "argument 'input' must be a Tensor"),
])
def test_bias_dropout_add_refuses_bad_arguments(args, kwargs, kind, match):
    with pytest.raises(kind, match=match):
        F.fused_bias_dropout_add(*args, **kwargs)
