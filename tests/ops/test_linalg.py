"""Matrix products: every matmul case against np.matmul in float64, gradients
against finite differences (broadcast batch dims summed back), non-contiguous
operands, strict variants, linear, addmm/baddbmm, PyTorch where installed."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

import pyflow as pf
from tests.helpers import (assert_close, broadcastable_pair, check_grad, layouts, make_input,
                           needs_torch, torch)

MATMUL_CASES = [  # (shape of input, shape of other)
    ((3,), (3,)),                  # dot
    ((2, 3), (3,)),                # matrix @ vector
    ((3,), (3, 4)),                # vector @ matrix
    ((2, 3), (3, 4)),              # matrix @ matrix
    ((2, 1, 3, 4), (5, 4, 6)),     # batched, broadcast batch dims
    ((2, 3, 4), (4, 5)),           # N-D @ 2-D: folded into one GEMM
    ((3, 4), (2, 4, 5)),           # 2-D @ N-D
    ((2, 3, 4), (4,)),             # N-D @ vector
    ((4,), (2, 3, 4, 5)),          # vector @ N-D
    ((1, 2, 3), (4, 3, 2)),        # batch 1 broadcast against 4
]


@pytest.mark.parametrize("sa,sb", MATMUL_CASES)
def test_matmul_cases_forward_and_grad(sa, sb):
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(sa), rng.standard_normal(sb)
    out = pf.matmul(pf.tensor(a), pf.tensor(b))
    assert_close(out, np.matmul(a, b), rtol=1e-12, atol=1e-12)
    assert_close(pf.tensor(a) @ pf.tensor(b), np.matmul(a, b), rtol=1e-12, atol=1e-12)
    check_grad(pf.matmul, [a, b])


@given(data=st.data())
def test_matmul_hypothesis_broadcast_and_layouts(data):
    batch_a, batch_b = data.draw(broadcastable_pair(max_dims=2, max_side=3))
    n, k, m = (data.draw(st.integers(1, 4)) for _ in range(3))
    sa, sb = batch_a + (n, k), batch_b + (k, m)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    a, ta = make_input(rng, sa, data.draw(layouts()))
    b, tb = make_input(rng, sb, data.draw(layouts()))
    assert_close(pf.matmul(ta, tb), np.matmul(a, b), rtol=1e-12, atol=1e-12)
    check_grad(pf.matmul, [a, b])


def test_grads_through_non_contiguous_operands():
    """Operands that are transposed/sliced views inside the differentiated function."""
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((2, 4, 3)), rng.standard_normal((8, 5))
    check_grad(lambda x, y: pf.matmul(x.transpose(-1, -2), y[::2, :]), [a, b])
    check_grad(lambda x, y: pf.linear(x.transpose(0, 1), y.t()), [a, rng.standard_normal((3, 2))])


def test_broadcast_batch_grads_are_summed():
    a = pf.ones(2, 1, 3, 4, dtype=pf.float64, requires_grad=True)
    b = pf.ones(5, 4, 6, dtype=pf.float64, requires_grad=True)
    (a @ b).sum().backward()
    assert tuple(a.grad.shape) == (2, 1, 3, 4) and tuple(b.grad.shape) == (5, 4, 6)
    assert_close(a.grad, np.full((2, 1, 3, 4), 5 * 6.0))   # 5 batches x 6 columns
    assert_close(b.grad, np.full((5, 4, 6), 2 * 3.0))      # 2 batches x 3 rows


def test_strict_variants():
    rng = np.random.default_rng(2)
    a, b, v = rng.standard_normal((3, 4)), rng.standard_normal((4, 2)), rng.standard_normal(4)
    p, q = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 4, 5))
    assert_close(pf.mm(pf.tensor(a), pf.tensor(b)), a @ b, rtol=1e-12)
    assert_close(pf.tensor(a).mm(pf.tensor(b)), a @ b, rtol=1e-12)
    assert_close(pf.bmm(pf.tensor(p), pf.tensor(q)), p @ q, rtol=1e-12)
    assert_close(pf.mv(pf.tensor(a), pf.tensor(v)), a @ v, rtol=1e-12)
    assert_close(pf.dot(pf.tensor(v), pf.tensor(v)), v @ v, rtol=1e-12)
    check_grad(pf.mm, [a, b])
    check_grad(pf.bmm, [p, q])
    check_grad(pf.mv, [a, v])
    check_grad(pf.dot, [v, v + 1])


@pytest.mark.parametrize("in_shape", [(3,), (2, 3), (2, 4, 3), (2, 1, 2, 3)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_linear(in_shape, with_bias):
    rng = np.random.default_rng(3)
    x, w, b = rng.standard_normal(in_shape), rng.standard_normal((5, 3)), rng.standard_normal(5)
    ref = x @ w.T + (b if with_bias else 0)
    args = [x, w, b] if with_bias else [x, w]
    assert_close(pf.linear(*[pf.tensor(a) for a in args]), ref, rtol=1e-12, atol=1e-12)
    check_grad(pf.linear, args)


def test_linear_odd_weights_and_biases():
    rng = np.random.default_rng(4)
    x, w1, w = rng.standard_normal((2, 3)), rng.standard_normal(3), rng.standard_normal((4, 3))
    assert_close(pf.linear(pf.tensor(x), pf.tensor(w1)), x @ w1, rtol=1e-12)
    check_grad(lambda a, b: pf.linear(a, b, pf.tensor(0.5, dtype=pf.float64)), [x, w1])
    bias = rng.standard_normal((2, 1))                         # broadcast bias
    check_grad(pf.linear, [x, w, bias])
    x_t = pf.tensor(np.ascontiguousarray(x.T)).t()             # non-contiguous input
    assert_close(pf.linear(x_t, pf.tensor(w)), x @ w.T, rtol=1e-12)


def test_addmm_baddbmm():
    rng = np.random.default_rng(5)
    c, a, b = rng.standard_normal((1, 4)), rng.standard_normal((3, 2)), rng.standard_normal((2, 4))
    assert_close(pf.addmm(pf.tensor(c), pf.tensor(a), pf.tensor(b), beta=0.5, alpha=2.0),
                 0.5 * c + 2.0 * a @ b, rtol=1e-12)
    check_grad(lambda x, y, z: pf.addmm(x, y, z, beta=0.5, alpha=2.0), [c, a, b])
    ci, p, q = rng.standard_normal((3, 1)), rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 4, 2))
    assert_close(pf.tensor(ci).baddbmm(pf.tensor(p), pf.tensor(q), alpha=-1.5),
                 ci - 1.5 * p @ q, rtol=1e-12)
    check_grad(lambda x, y, z: pf.baddbmm(x, y, z, beta=2.0, alpha=0.5), [ci, p, q])
    nan = pf.full((2, 3, 2), float("nan"), dtype=pf.float64)
    out = pf.baddbmm(nan, pf.tensor(p), pf.tensor(q), beta=0)   # beta=0 ignores input
    assert_close(out, p @ q, rtol=1e-12)


def test_dtype_promotion_and_grad_dtypes():
    a = pf.randn(2, 3, dtype=pf.float32, requires_grad=True)
    b = pf.randn(3, 4, dtype=pf.float64, requires_grad=True)
    out = a @ b
    assert out.dtype is pf.float64
    out.sum().backward()
    assert a.grad.dtype is pf.float32 and b.grad.dtype is pf.float64
    assert (pf.tensor([[1, 2]]) @ pf.tensor([[3], [4]])).tolist() == [[11]]   # integer GEMM
    w = pf.randn(4, 3, dtype=pf.float64, requires_grad=True)
    pf.linear(a, w).sum().backward()
    assert a.grad.dtype is pf.float32 and w.grad.dtype is pf.float64


@pytest.mark.parametrize("dt", [pf.float16, pf.bfloat16])
def test_half_types_compute_in_float32(dt):
    rng = np.random.default_rng(6)
    a, b = rng.standard_normal((3, 8)), rng.standard_normal((2, 8, 4))
    out = pf.tensor(a, dtype=dt) @ pf.tensor(b, dtype=dt)
    assert out.dtype is dt
    assert_close(out.float(), a @ b, rtol=3e-2, atol=5e-2)


def test_double_backward():
    rng = np.random.default_rng(7)
    a = pf.tensor(rng.standard_normal((2, 3)), requires_grad=True)
    b = pf.tensor(rng.standard_normal((3, 2)), requires_grad=True)
    (ga,) = pf.autograd.grad(((a @ b) ** 2).sum(), a, create_graph=True)
    (gb,) = pf.autograd.grad(ga.sum(), b)
    an, bn = a.detach().cpu().numpy(), b.detach().cpu().numpy()

    def f(bv):  # d/db of sum(d/da sum((a@b)^2)) = d/db sum(2 (a@b) b^T)
        return np.sum(2 * (an @ bv) @ bv.T)
    eps, num = 1e-6, np.zeros_like(bn)
    for idx in np.ndindex(bn.shape):
        bp, bm = bn.copy(), bn.copy()
        bp[idx] += eps
        bm[idx] -= eps
        num[idx] = (f(bp) - f(bm)) / (2 * eps)
    assert_close(gb, num, rtol=1e-6, atol=1e-6)


def test_errors_name_both_shapes():
    with pytest.raises(RuntimeError, match=r"\(2, 3\) and \(4, 5\) cannot be multiplied"):
        pf.ones(2, 3) @ pf.ones(4, 5)
    with pytest.raises(RuntimeError, match=r"\(2, 3, 4\) and \(5,\) cannot be multiplied"):
        pf.matmul(pf.ones(2, 3, 4), pf.ones(5))
    with pytest.raises(RuntimeError, match="at least 1-D"):
        pf.matmul(pf.tensor(2.0), pf.ones(2))
    with pytest.raises(RuntimeError, match="not broadcastable"):
        pf.matmul(pf.ones(2, 3, 4), pf.ones(3, 4, 5))
    with pytest.raises(RuntimeError, match=r"mm\(\): mat2 must be a matrix"):
        pf.mm(pf.ones(2, 3), pf.ones(3))
    with pytest.raises(RuntimeError, match="2x3 and 4x5"):
        pf.mm(pf.ones(2, 3), pf.ones(4, 5))
    with pytest.raises(RuntimeError, match="batch sizes differ"):
        pf.bmm(pf.ones(2, 3, 4), pf.ones(3, 4, 5))
    with pytest.raises(RuntimeError, match=r"bmm\(\): input must be a batch of matrices \(3-D\)"):
        pf.bmm(pf.ones(3, 4), pf.ones(3, 4, 5))
    with pytest.raises(RuntimeError, match="inconsistent tensor size"):
        pf.dot(pf.ones(3), pf.ones(4))
    with pytest.raises(RuntimeError, match=r"input \(2, 3\) has 3 features, weight \(4, 5\)"):
        pf.linear(pf.ones(2, 3), pf.ones(4, 5))
    with pytest.raises(RuntimeError, match="cannot be broadcast"):
        pf.baddbmm(pf.ones(3, 3, 3), pf.ones(2, 3, 4), pf.ones(2, 4, 3))
    with pytest.raises(TypeError, match="argument 'other' must be a Tensor"):
        pf.matmul(pf.ones(2, 2), [[1.0, 0.0], [0.0, 1.0]])


@needs_torch
@pytest.mark.parametrize("sa,sb", MATMUL_CASES)
def test_matmul_against_torch(sa, sb):
    rng = np.random.default_rng(8)
    a, b = rng.standard_normal(sa).astype(np.float32), rng.standard_normal(sb).astype(np.float32)
    ta, tb = pf.tensor(a, requires_grad=True), pf.tensor(b, requires_grad=True)
    Ta, Tb = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
    out, ref = ta @ tb, Ta @ Tb
    assert_close(out, ref.detach().cpu().numpy(), rtol=1e-5, atol=1e-5)
    g = rng.standard_normal(tuple(ref.shape)).astype(np.float32)
    out.backward(pf.tensor(g))
    ref.backward(torch.tensor(g))
    assert_close(ta.grad, Ta.grad.cpu().numpy(), rtol=1e-5, atol=1e-5)
    assert_close(tb.grad, Tb.grad.cpu().numpy(), rtol=1e-5, atol=1e-5)


@needs_torch
def test_linear_and_baddbmm_against_torch():
    rng = np.random.default_rng(9)
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((2, 3, 4), (5, 4), (5,)))
    px = [pf.tensor(v, requires_grad=True) for v in (x, w, b)]
    tx = [torch.tensor(v, requires_grad=True) for v in (x, w, b)]
    out, ref = pf.linear(*px), torch.nn.functional.linear(*tx)
    assert_close(out, ref.detach().cpu().numpy(), rtol=1e-5, atol=1e-5)
    out.sum().backward()
    ref.sum().backward()
    for p, t in zip(px, tx):
        assert_close(p.grad, t.grad.cpu().numpy(), rtol=1e-5, atol=1e-5)
    c, p, q = (rng.standard_normal(s).astype(np.float32) for s in ((3, 1), (2, 3, 4), (2, 4, 2)))
    assert_close(pf.baddbmm(pf.tensor(c), pf.tensor(p), pf.tensor(q), beta=0.5, alpha=2),
                 torch.baddbmm(torch.tensor(c), torch.tensor(p), torch.tensor(q), beta=0.5,
                               alpha=2).cpu().numpy(), rtol=1e-5, atol=1e-5)
