"""group_norm / nn.GroupNorm (torch.nn.GroupNorm): float64 NumPy reference over
shapes, groups and layouts, finite differences of input, weight and bias,
PyTorch, a graph against eager, bad arguments.  Tiny shapes: these tests run
again on the simulated cuda device."""
import numpy as np
import pytest

import pyflow as pf
import pyflow.nn.functional as F
from tests.helpers import assert_close, check_grad, make_input, needs_torch, torch


def np_group_norm(x, groups, w=None, b=None, eps=1e-5):
    n, c = x.shape[:2]
    rows = x.reshape(n, groups, -1)
    mu = rows.mean(-1, keepdims=True)
    var = ((rows - mu) ** 2).mean(-1, keepdims=True)
    y = ((rows - mu) / np.sqrt(var + eps)).reshape(x.shape)
    per_channel = (c,) + (1,) * (x.ndim - 2)
    if w is not None:
        y = y * w.reshape(per_channel)
    if b is not None:
        y = y + b.reshape(per_channel)
    return y


@pytest.mark.parametrize("shape,groups", [((2, 4, 3), 2), ((2, 6, 2, 3), 3), ((3, 4), 4),
                                          ((1, 3, 5), 1)])
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "sliced"])
def test_float64_reference(shape, groups, layout):
    rng = np.random.default_rng(0)
    x, tx = make_input(rng, shape, layout)
    w, b = rng.uniform(0.5, 2, shape[1]), rng.uniform(-1, 1, shape[1])
    got = F.group_norm(tx, groups, pf.tensor(w), pf.tensor(b), eps=1e-5)
    assert_close(got, np_group_norm(x, groups, w, b), rtol=1e-10, atol=1e-10)
    assert_close(F.group_norm(tx, groups), np_group_norm(x, groups), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("affine", [True, False])
def test_finite_difference_gradient(affine):
    rng = np.random.default_rng(1)
    x = rng.uniform(-2, 2, (2, 4, 3))
    if affine:
        w, b = rng.uniform(0.5, 2, 4), rng.uniform(-1, 1, 4)
        check_grad(lambda t, tw, tb: F.group_norm(t, 2, tw, tb), [x, w, b])
    else:
        check_grad(lambda t: F.group_norm(t, 2), [x])


def test_module_defaults_and_repr():
    m = pf.nn.GroupNorm(2, 4)
    assert repr(m) == "GroupNorm(2, 4, eps=1e-05, affine=True)"
    assert_close(m.weight, np.ones(4))
    assert_close(m.bias, np.zeros(4))
    assert pf.nn.GroupNorm(2, 4, affine=False).weight is None
    x = np.random.default_rng(2).standard_normal((2, 4, 3, 3))
    assert_close(m(pf.tensor(x)), np_group_norm(x, 2), rtol=1e-10, atol=1e-10)


@needs_torch
def test_against_torch_forward_and_backward():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 6, 3, 4)).astype(np.float32)
    g = rng.standard_normal(x.shape).astype(np.float32)
    ours, theirs = pf.nn.GroupNorm(3, 6), torch.nn.GroupNorm(3, 6)
    with torch.no_grad():
        theirs.weight.copy_(torch.tensor(rng.uniform(0.5, 2, 6).astype(np.float32)))
        theirs.bias.copy_(torch.tensor(rng.uniform(-1, 1, 6).astype(np.float32)))
    ours.weight.data = pf.tensor(theirs.weight.detach().numpy())
    ours.bias.data = pf.tensor(theirs.bias.detach().numpy())
    tx, px = torch.tensor(x, requires_grad=True), pf.tensor(x, requires_grad=True)
    ty, py = theirs(tx), ours(px)
    ty.backward(torch.tensor(g))
    py.backward(pf.tensor(g))
    assert_close(py, ty.detach().numpy(), rtol=1e-5, atol=1e-5)
    assert_close(px.grad, tx.grad.numpy(), rtol=1e-4, atol=1e-5)
    assert_close(ours.weight.grad, theirs.weight.grad.numpy(), rtol=1e-4, atol=1e-4)
    assert_close(ours.bias.grad, theirs.bias.grad.numpy(), rtol=1e-4, atol=1e-4)


def test_graph_equals_eager():
    rng = np.random.default_rng(4)
    x = pf.tensor(rng.standard_normal((2, 4, 5)))
    m = pf.nn.GroupNorm(2, 4)

    class Step(pf.nn.Graph):
        def __init__(self):
            super().__init__()
            self.m = m

        def build(self, a):
            return self.m(a)
    assert_close(Step()(x), m(x), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("call, kind, match", [
    (lambda x: F.group_norm(x, 3), RuntimeError, "divisible by num_groups"),
    (lambda x: F.group_norm(x, 0), RuntimeError, "divisible by num_groups"),
    (lambda x: F.group_norm(x, 2, pf.ones(3)), RuntimeError, r"weight of shape \[4\]"),
    (lambda x: F.group_norm(x, 2, None, pf.ones(4, 1)), RuntimeError, r"bias of shape \[4\]"),
    (lambda x: F.group_norm(x[0, 0], 1), RuntimeError, "at least 2 dims"),
    (lambda x: F.group_norm(x.long(), 2), RuntimeError, "floating point"),
    (lambda x: F.group_norm(np.ones((2, 4, 3)), 2), TypeError, "input"),
    (lambda x: pf.nn.GroupNorm(3, 4), ValueError, "divisible by num_groups"),
])
def test_bad_arguments_are_clear_errors(call, kind, match):
    x = pf.tensor(np.ones((2, 4, 3)))
    with pytest.raises(kind, match=match):
        call(x)
