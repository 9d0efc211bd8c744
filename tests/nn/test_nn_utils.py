"""nn.utils: clip_grad_norm_ / clip_grad_value_ against PyTorch, parameter vectors."""
import math

import numpy as np
import pytest

import pyflow as pf
from pyflow import nn
from pyflow.nn.utils import (clip_grad_norm_, clip_grad_value_, parameters_to_vector,
                             vector_to_parameters)
from tests.helpers import assert_close, needs_torch, torch


def params_with_grads(seed=0, shapes=((3, 4), (4,), (2, 2, 2)), scale=1.0):
    rng = np.random.default_rng(seed)
    grads = [rng.standard_normal(s) * scale for s in shapes]
    ours = []
    for g in grads:
        p = nn.Parameter(pf.zeros(*g.shape, dtype=pf.float64))
        p.grad = pf.tensor(g)
        ours.append(p)
    return ours, grads


@needs_torch
@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.0, math.inf, "inf"])
@pytest.mark.parametrize("max_norm", [0.5, 1e3])
def test_clip_grad_norm_matches_torch(norm_type, max_norm):
    ours, grads = params_with_grads()
    ref = []
    for g in grads:
        p = torch.nn.Parameter(torch.zeros(g.shape, dtype=torch.float64))
        p.grad = torch.tensor(g)
        ref.append(p)
    nt = float(norm_type)
    total = clip_grad_norm_(ours, max_norm, norm_type=nt)
    ttotal = torch.nn.utils.clip_grad_norm_(ref, max_norm, norm_type=nt)
    assert_close(total, ttotal.item(), rtol=1e-12)
    for p, tp in zip(ours, ref):
        assert_close(p.grad, tp.grad.cpu().numpy(), rtol=1e-12)


def test_clip_grad_norm_semantics():
    ours, grads = params_with_grads(scale=10.0)
    norm = math.sqrt(sum((g ** 2).sum() for g in grads))
    total = clip_grad_norm_(iter(ours), 1.0)          # any iterable of parameters
    assert total.item() == pytest.approx(norm)
    after = math.sqrt(sum((p.grad.cpu().numpy() ** 2).sum() for p in ours))
    assert after == pytest.approx(1.0, rel=1e-5)
    # a single tensor, and parameters without grads are skipped
    p = nn.Parameter(pf.ones(4))
    assert clip_grad_norm_(p, 1.0).item() == 0.0
    p.grad = pf.full((4,), 3.0)
    assert clip_grad_norm_([p, nn.Parameter(pf.ones(2))], 10.0).item() == pytest.approx(6.0)
    np.testing.assert_allclose(p.grad.cpu().numpy(), 3.0)   # under max_norm: unchanged


@pytest.mark.filterwarnings("ignore:invalid value encountered")
def test_clip_grad_norm_nonfinite():
    p = nn.Parameter(pf.ones(2))
    p.grad = pf.tensor([1.0, float("inf")])
    with pytest.raises(RuntimeError, match="total norm of order 2.0 for gradients from "
                                           "`parameters` is non-finite"):
        clip_grad_norm_([p], 1.0, error_if_nonfinite=True)
    assert math.isinf(clip_grad_norm_([p], 1.0).item())


@needs_torch
def test_clip_grad_value_matches_torch():
    ours, grads = params_with_grads(seed=1)
    ref = []
    for g in grads:
        p = torch.nn.Parameter(torch.zeros(g.shape, dtype=torch.float64))
        p.grad = torch.tensor(g)
        ref.append(p)
    clip_grad_value_(ours, 0.3)
    torch.nn.utils.clip_grad_value_(ref, 0.3)
    for p, tp in zip(ours, ref):
        assert_close(p.grad, tp.grad.cpu().numpy(), rtol=0)
        assert np.abs(p.grad.cpu().numpy()).max() <= 0.3


def test_clip_after_backward_on_a_model():
    model = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 1))
    (model(pf.randn(8, 3)) * 100).sum().backward()
    clip_grad_norm_(model.parameters(), 0.1)
    total = math.sqrt(sum((p.grad.cpu().numpy().astype(np.float64) ** 2).sum()
                          for p in model.parameters()))
    assert total == pytest.approx(0.1, rel=1e-4)


def test_parameters_to_vector_and_back():
    model = nn.Linear(3, 2)
    vec = parameters_to_vector(model.parameters())
    assert tuple(vec.shape) == (8,)
    assert_close(vec[:6], model.weight.detach().reshape(-1), rtol=0)
    vector_to_parameters(pf.arange(8, dtype=pf.float32), model.parameters())
    assert model.bias.tolist() == [6.0, 7.0] and model.weight.requires_grad
    with pytest.raises(ValueError, match="1-D with 8 elements"):
        vector_to_parameters(pf.zeros(7), model.parameters())
