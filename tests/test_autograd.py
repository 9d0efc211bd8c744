"""The autograd engine: accumulation, retain_graph, grad modes, autograd.grad,
custom Functions, hooks and the in-place version check."""
import numpy as np
import pytest

import pyflow as pf
from tests.helpers import assert_close, check_grad


def test_gradients_accumulate_across_backward_calls():
    w = pf.tensor([1.0, 2.0], requires_grad=True)
    (w * 3).sum().backward()
    (w * w).sum().backward()
    assert_close(w.grad, [3 + 2, 3 + 4])


def test_shared_subexpression_sums_both_paths():
    x = pf.tensor([2.0], requires_grad=True)
    y = x * x
    z = y + y * x         # x^2 + x^3 -> 2x + 3x^2
    z.backward()
    assert_close(x.grad, [4 + 12])


def test_backward_twice_needs_retain_graph():
    x = pf.tensor([1.0, 2.0], requires_grad=True)
    y = (x.sigmoid() * x).sum()
    y.backward(retain_graph=True)
    g1 = x.grad.clone()
    y.backward()
    assert_close(x.grad, 2 * g1.cpu().numpy())
    with pytest.raises(RuntimeError, match="second time"):
        y.backward()


def test_non_scalar_backward_needs_gradient():
    x = pf.ones(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="only for scalar outputs"):
        (x * 2).backward()
    (x * 2).backward(pf.tensor([1.0, 0.5, 0.0]))
    assert_close(x.grad, [2.0, 1.0, 0.0])
    with pytest.raises(RuntimeError, match="shape"):
        (x * 2).backward(pf.ones(2))


def test_no_grad_enable_grad_and_set_grad_enabled():
    x = pf.ones(2, requires_grad=True)
    with pf.no_grad():
        y = x * 2
        assert not y.requires_grad and not pf.is_grad_enabled()
        with pf.enable_grad():
            assert (x * 2).requires_grad
    assert pf.is_grad_enabled()
    with pf.set_grad_enabled(False):
        assert not (x * 2).requires_grad

    @pf.no_grad()
    def f(t):
        return t * 2
    assert not f(x).requires_grad


def test_detach_and_requires_grad_():
    x = pf.ones(2, requires_grad=True)
    d = (x * 2).detach()
    assert not d.requires_grad and d.grad_fn is None
    d.requires_grad_()
    assert d.requires_grad and d.is_leaf
    with pytest.raises(RuntimeError, match="floating point"):
        pf.tensor([1, 2]).requires_grad_()


def test_autograd_grad_does_not_accumulate_and_supports_higher_order():
    x = pf.tensor([1.5], dtype=pf.float64, requires_grad=True)
    y = x ** 3
    (g,) = pf.autograd.grad(y, x, create_graph=True)
    assert_close(g, [3 * 1.5 ** 2])
    assert x.grad is None
    (gg,) = pf.autograd.grad(g, x)
    assert_close(gg, [6 * 1.5])


def test_autograd_grad_unused_input():
    x = pf.ones(1, requires_grad=True)
    z = pf.ones(1, requires_grad=True)
    with pytest.raises(RuntimeError, match="not used"):
        pf.autograd.grad((x * 2).sum(), [x, z])
    gx, gz = pf.autograd.grad((x * 2).sum(), [x, z], allow_unused=True)
    assert gz is None and gx.tolist() == [2.0]


class Cube(pf.autograd.Function):
    @staticmethod
    def forward(ctx, x, k):
        ctx.save_for_backward(x)
        ctx.k = k
        return x * x * x * k

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * 3 * x * x * ctx.k, None


def test_custom_function():
    x = np.array([0.5, -1.0, 2.0])
    check_grad(lambda t: Cube.apply(t, 2.0), [x])
    t = pf.tensor(x, requires_grad=True)
    out = Cube.apply(t, 2.0)
    assert out.grad_fn.name() == "CubeBackward"


def test_custom_function_wrong_number_of_grads():
    class Bad(pf.autograd.Function):
        @staticmethod
        def forward(ctx, a, b):
            return a + b

        @staticmethod
        def backward(ctx, g):
            return (g,)
    a, b = pf.ones(1, requires_grad=True), pf.ones(1, requires_grad=True)
    with pytest.raises(RuntimeError, match="returned 1 gradients, expected 2"):
        Bad.apply(a, b).sum().backward()


def test_hooks_and_retain_grad():
    x = pf.tensor([1.0, 2.0], requires_grad=True)
    x.register_hook(lambda g: g * 10)
    y = x * 2
    y.retain_grad()
    seen = []
    y.register_hook(lambda g: seen.append(g.tolist()))
    y.sum().backward()
    assert seen == [[1.0, 1.0]]
    assert_close(y.grad, [1.0, 1.0])
    assert_close(x.grad, [20.0, 20.0])


def test_saved_tensor_modified_in_place_is_detected():
    a = pf.tensor([1.0, 2.0], requires_grad=True)
    b = a.exp()          # exp saves its output
    b.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        b.sum().backward()


def test_int_outputs_do_not_require_grad():
    x = pf.tensor([1.0, -2.0], requires_grad=True)
    assert not (x > 0).requires_grad


def test_backward_through_views():
    x = pf.tensor(np.arange(6.0).reshape(2, 3), requires_grad=True)
    y = x.t()[1:, :].reshape(-1)
    (y * pf.tensor([1.0, 2.0, 3.0, 4.0])).sum().backward()
    assert_close(x.grad, [[0, 1, 3], [0, 2, 4]])


def test_a_leaf_used_in_a_graph_is_freed_without_the_cycle_collector():
    """An AccumulateGrad node refers to its leaf weakly: no tensor <-> node cycle
    keeps it (and its memory) alive until the garbage collector runs."""
    import gc
    import weakref
    gc.disable()
    try:
        x = pf.randn(64, 64, requires_grad=True)
        (x * x).sum().backward()
        (x * 2).sum().backward()            # a second graph shares the leaf's node anew
        assert_close(x.grad, 2 * x.detach() + 2)
        dead = weakref.ref(x)
        del x
        assert dead() is None
    finally:
        gc.enable()


def test_detach_shares_storage_and_version_but_keeps_no_graph_alive():
    import weakref
    x = pf.randn(4, requires_grad=True)
    y = x * 2
    d = y.detach()
    assert d.grad_fn is None and not d.requires_grad
    d.add_(1)                               # same storage, same version counter
    assert_close(y.detach(), 2 * x.detach() + 1)
    assert y._version[0] == d._version[0] == 1
    alive = weakref.ref(y)
    del y                                   # the detached tensor keeps no reference to it
    assert alive() is None


def test_one_gradient_reaching_two_leaves_is_not_shared_between_their_grads():
    """add's backward hands the same gradient to both operands: stored as is in
    both .grad, the second backward added into one array twice (a.grad and b.grad
    came out 3c instead of 2c).  PyTorch copies a gradient held elsewhere."""
    c = pf.tensor([5.0, 6.0])
    for use_inputs in (False, True):
        a = pf.tensor([1.0, 2.0], requires_grad=True)
        b = pf.tensor([3.0, 4.0], requires_grad=True)
        for _ in range(2):
            ((a + b) * c).sum().backward(inputs=[a, b] if use_inputs else None)
        assert_close(a.grad, [10.0, 12.0])
        assert_close(b.grad, [10.0, 12.0])
        assert not np.shares_memory(a.grad.numpy(), b.grad.numpy())


def test_a_given_gradient_is_not_taken_as_a_leafs_grad():
    """``y.backward(g)`` with y = a + b: a.grad must not be g's storage (an
    in-place change of g, or the next accumulation into a.grad, would reach the
    other)."""
    a = pf.tensor([1.0, 2.0], requires_grad=True)
    b = pf.tensor([3.0, 4.0], requires_grad=True)
    g = pf.tensor([1.0, 1.0])
    (a + b).backward(g)
    assert not np.shares_memory(a.grad.numpy(), g.numpy())
    assert not np.shares_memory(a.grad.numpy(), b.grad.numpy())
    g.mul_(5.0)
    assert_close(a.grad, [1.0, 1.0])
