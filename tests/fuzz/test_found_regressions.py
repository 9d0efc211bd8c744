"""Defects the fuzz suite (tests/fuzz) found in the ops, each pinned to
PyTorch's behaviour: shape ops on 0-d and empty tensors, argument types,
products of bool or empty matrices, losses' targets, empty layer norm,
attention with no features, adaptive pooling."""
import numpy as np
import pytest

import pyflow as pf
import pyflow.nn.functional as F

pytestmark = pytest.mark.cpu_only


def test_shape_ops_reject_non_tensors():
    for fn, args in ((pf.flatten, ()), (pf.reshape, ((1,),)), (pf.transpose, (0, 1)),
                     (pf.split, (1,)), (pf.squeeze, ()), (pf.unbind, ())):
        with pytest.raises(TypeError, match=f"{fn.__name__}\\(\\): argument 'input' must be a "
                                            f"Tensor, not NoneType"):
            fn(None, *args)


def test_missing_shape_arguments_are_type_errors():
    x = pf.ones(3)
    for method in ("view", "reshape", "permute", "expand"):
        with pytest.raises(TypeError, match="missing 1 required positional argument"):
            getattr(x, method)()
    assert pf.tensor(2.0).reshape(()).shape == ()


def test_zero_dim_tensors_check_their_dims():
    s = pf.tensor(2.0)
    for call in (lambda: pf.transpose(s, 0, 1), lambda: pf.flatten(s, 1),
                 lambda: pf.prod(s, 3)):
        with pytest.raises(IndexError, match="out of range"):
            call()
    assert pf.transpose(s, 0, -1).shape == () and pf.flatten(s, -1).shape == (1,)
    assert pf.movedim(s, 0, 0).shape == ()
    for call, err in ((lambda: pf.split(s, 1), RuntimeError),
                      (lambda: pf.chunk(s, 2), RuntimeError),
                      (lambda: pf.unbind(s), IndexError),
                      (lambda: pf.select(s, 0, 0), IndexError),
                      (lambda: pf.narrow(s, 0, 0, 1), RuntimeError),
                      (lambda: s.unflatten(0, (1, -1)), RuntimeError)):
        with pytest.raises(err, match="1-dimensional|0-dim"):
            call()


def test_split_sizes():
    assert [t.shape for t in pf.split(pf.ones(0, 2), 0)] == [(0, 2)]
    with pytest.raises(RuntimeError, match="0 for a dimension of size 0"):
        pf.split(pf.ones(3), 0)
    with pytest.raises(RuntimeError, match="non-negative"):
        pf.split(pf.ones(3), -1, dim=5)      # the size is checked before the dim
    with pytest.raises(RuntimeError, match="non-negative"):
        pf.split(pf.ones(4), [5, -1])


def test_join_checks_in_pytorchs_order():
    with pytest.raises(IndexError, match="out of range"):
        pf.stack([pf.ones(2), pf.ones(3)], 5)
    with pytest.raises(RuntimeError, match="zero-dimensional tensor \\(at position 1\\)"):
        pf.cat([pf.ones(2), pf.tensor(1.0)], 7)


def test_amax_of_an_empty_tensor_without_dim():
    with pytest.raises(RuntimeError, match="Expected reduction dim to be specified"):
        pf.amax(pf.ones(0, 2))
    with pytest.raises(IndexError, match="Expected reduction dim 0 to have non-zero size"):
        pf.amax(pf.ones(0, 2), 0)


def test_products_of_bool_and_empty_matrices():
    b = pf.ones(2, 2, dtype=pf.bool)
    for call in (lambda: pf.matmul(b, b), lambda: pf.mm(b, b), lambda: F.linear(b, b)):
        with pytest.raises(RuntimeError, match="not implemented for bool"):
            call()
    x, w = pf.ones(3, 0, requires_grad=True), pf.ones(2, 0, requires_grad=True)
    y = F.linear(x, w)          # (3, 0) x (0, 2): zeros, as PyTorch (was a reshape error)
    assert y.shape == (3, 2) and y.tolist() == [[0.0, 0.0]] * 3
    y.sum().backward()
    assert x.grad.shape == (3, 0) and w.grad.shape == (2, 0)
    assert pf.matmul(pf.ones(2, 3, 0), pf.ones(0, 4)).shape == (2, 3, 4)


def test_layer_norm_over_an_empty_shape():
    x = pf.randn(3, 0, requires_grad=True)
    y = F.layer_norm(x, (0,), pf.ones(0))
    assert y.shape == (3, 0)
    y.sum().backward()
    assert x.grad.shape == (3, 0)


def test_attention_with_no_features_averages_the_values():
    v = pf.tensor(np.arange(12.0).reshape(1, 3, 4))
    out = F.scaled_dot_product_attention(pf.ones(1, 2, 0), pf.ones(1, 3, 0), v)
    np.testing.assert_allclose(out.numpy(), np.broadcast_to(v.numpy().mean(1), (1, 2, 4)))


def test_adaptive_avg_pool2d_arguments():
    with pytest.raises(TypeError, match="output_size must be an int or a pair"):
        F.adaptive_avg_pool2d(pf.ones(1, 2, 3, 3), None)
    x = pf.ones(1, 0, 3, 3, requires_grad=True)      # no channels: an empty map
    y = F.adaptive_avg_pool2d(x, 2)
    assert y.shape == (1, 0, 2, 2)
    with pytest.raises(RuntimeError, match="non-zero height and width"):
        F.adaptive_avg_pool2d(pf.ones(1, 2, 0, 3), 2)


def test_one_hot_of_an_empty_tensor_needs_a_class_count():
    with pytest.raises(RuntimeError, match="Can not infer total number of classes"):
        F.one_hot(pf.ones(0, dtype=pf.int64), 0)
    assert F.one_hot(pf.ones(0, dtype=pf.int64), 3).shape == (0, 3)


def test_class_loss_targets_as_pytorch():
    x = pf.randn(3, 2)
    with pytest.raises(RuntimeError, match="ignore_index \\(1\\) is not supported"):
        F.cross_entropy(x, pf.rand(3, 2), ignore_index=1)
    F.cross_entropy(x, pf.rand(3, 2), ignore_index=-1)      # negative: accepted, as torch
    with pytest.raises(ValueError, match="batch_size \\(3\\) to match target batch_size "
                                         "\\(4\\)"):
        F.cross_entropy(x, pf.rand(4))
    with pytest.raises(ValueError, match="batch_size"):
        F.nll_loss(x, pf.tensor(1))
    with pytest.raises(RuntimeError, match="expected target of shape \\[3\\]"):
        F.nll_loss(x, pf.zeros(3, 1, dtype=pf.int64))
    with pytest.raises(RuntimeError, match="must be 0-dim"):
        F.nll_loss(pf.randn(2), pf.zeros(2, 3, dtype=pf.int64))
    with pytest.raises(ValueError, match="must be 0-dim \\(or of size 1\\)"):
        F.nll_loss(pf.randn(2), pf.zeros(2, dtype=pf.int64))
    assert F.cross_entropy(pf.randn(2), pf.tensor([1])).shape == ()
    with pytest.raises(RuntimeError, match="holds class probabilities and must be floating"):
        F.cross_entropy(pf.randn(4), pf.tensor([0, 1, 0, 1]))


def test_pointwise_losses_promote_like_pytorch():
    x, t = pf.ones(2, 3), pf.tensor(0.5, dtype=pf.float64)   # a 0-d float64 target
    assert F.l1_loss(x, t).dtype is pf.float64 and F.mse_loss(x, t).dtype is pf.float64
    with pytest.raises(RuntimeError, match="floating point"):
        F.mse_loss(pf.ones(3, dtype=pf.int64), pf.ones(3, dtype=pf.int64), reduction="none")


def test_softmax_checks_the_dim_before_the_dtype():
    with pytest.raises(IndexError, match="out of range"):
        pf.softmax(pf.ones(3, dtype=pf.int64), 2)
