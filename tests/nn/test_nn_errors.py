"""Errors a user reads (issue 14): layers called with something that is not a
tensor, degenerate convolutions, integer parameters, and the op-level defects
the fuzz suite (tests/fuzz) found; each as PyTorch raises or returns."""
import pytest

import pyflow as pf
import pyflow.nn.functional as F
from pyflow import nn

LAYERS = [nn.Linear(3, 2), nn.Conv2d(1, 2, 1), nn.BatchNorm1d(3), nn.BatchNorm2d(3),
          nn.Flatten(), nn.Unflatten(0, (1, -1)), nn.Dropout().eval(), nn.Softmax(),
          nn.LogSoftmax(), nn.LayerNorm(3), nn.MaxPool2d(2), nn.AdaptiveAvgPool2d(1),
          nn.Embedding(3, 2), nn.Sequential(nn.Linear(3, 2), nn.ReLU())]


@pytest.mark.parametrize("layer", LAYERS, ids=lambda m: type(m).__name__)
@pytest.mark.parametrize("arg", [None, [[1.0, 2.0, 3.0]]], ids=["None", "list"])
def test_layers_reject_non_tensors_with_a_type_error(layer, arg):
    # before: AttributeError ('NoneType' object has no attribute 'shape') from inside
    with pytest.raises(TypeError, match=r"argument 'input' must be a Tensor, not "
                                        r"(NoneType|list)"):
        layer(arg)


def test_layer_type_error_names_the_layer():
    with pytest.raises(TypeError, match=r"^Linear\.forward\(\): argument 'input' must be a "
                                        r"Tensor, not NoneType$"):
        nn.Linear(3, 2)(None)
    with pytest.raises(TypeError, match=r"^Conv2d\.forward\(\).*not list$"):
        nn.Conv2d(1, 1, 1)([[1.0]])


def test_conv2d_zero_kernel_raises_in_forward():
    # before: a bias-only map of shape (1, 4, 6, 6); PyTorch builds the layer and
    # raises in the forward ("kernel size should be greater than zero")
    conv = nn.Conv2d(3, 4, 0)
    with pytest.raises(RuntimeError, match="kernel size should be greater than zero"):
        conv(pf.randn(1, 3, 5, 5))
    with pytest.raises(RuntimeError, match="kernel size should be greater than zero"):
        F.conv2d(pf.randn(1, 3, 5, 5), pf.randn(4, 3, 3, 0))
    with pytest.raises(RuntimeError, match="at least one output channel"):
        F.conv2d(pf.randn(1, 2, 3, 3), pf.randn(0, 2, 2, 2))


@pytest.mark.parametrize("kwargs, match", [
    (dict(stride=0), "stride must be positive"), (dict(stride=-1), "stride must be positive"),
    (dict(padding=-1), "padding must be non-negative"),
    (dict(dilation=0), "dilation must be positive")])
def test_conv2d_layer_bad_geometry_raises_in_forward(kwargs, match):
    conv = nn.Conv2d(3, 4, 3, **kwargs)         # PyTorch accepts these at construction too
    with pytest.raises(RuntimeError, match=match):
        conv(pf.randn(1, 3, 5, 5))


def test_conv2d_groups_and_pooling_arguments():
    with pytest.raises(ValueError, match="in_channels must be divisible by groups"):
        nn.Conv2d(3, 4, 3, groups=2)
    with pytest.raises(ValueError, match="groups must be a positive integer"):
        nn.Conv2d(3, 4, 3, groups=0)
    with pytest.raises(RuntimeError, match="channels divisible by groups"):
        F.conv2d(pf.randn(1, 4, 5, 5), pf.randn(3, 2, 3, 3), groups=3)
    x = pf.randn(1, 3, 5, 5)
    for layer, match in ((nn.MaxPool2d(2, stride=0), "stride must be positive"),
                         (nn.MaxPool2d(2, padding=-1), "padding must be non-negative"),
                         (nn.MaxPool2d(2, dilation=0), "dilation must be positive"),
                         (nn.AvgPool2d(0), "kernel_size must be positive")):
        with pytest.raises(RuntimeError, match=match):
            layer(x)


def test_parameter_of_an_integer_tensor_cannot_require_grad():
    # before: accepted, with requires_grad silently False
    with pytest.raises(RuntimeError, match="only Tensors of floating point dtype can require "
                                           "gradients, got pyflow.int64"):
        nn.Parameter(pf.tensor([1, 2]))
    with pytest.raises(RuntimeError, match="floating point"):
        nn.Parameter(pf.tensor([True]))
    p = nn.Parameter(pf.tensor([1, 2]), requires_grad=False)
    assert not p.requires_grad and p.dtype is pf.int64
    assert nn.Parameter(pf.ones(2)).requires_grad


def test_dropout_p_of_the_wrong_type_is_a_type_error():
    with pytest.raises(TypeError, match="p must be a number"):
        F.dropout(pf.ones(3), None)
    with pytest.raises(TypeError, match="p must be a number"):
        nn.Dropout("0.5")
    with pytest.raises(ValueError, match="between 0 and 1"):
        nn.Dropout(1.5)
