"""PyTorch APIs that ordinary training scripts call and that pyflow accepts with
their closest meaning (issue 20's list): torch.cuda's seeding and device helpers,
torch.backends.cudnn and torch.backends.cuda.matmul's flags, Tensor.pin_memory.
Each is compared with PyTorch's behaviour where PyTorch (CPU build) has one."""
import numpy as np
import pytest

import pyflow as pf
from tests.helpers import needs_torch, torch


def test_cuda_manual_seed_seeds_the_one_default_generator():
    pf.cuda.manual_seed(123)
    a = pf.randn(4).numpy()
    pf.cuda.manual_seed_all(123)
    b = pf.randn(4).numpy()
    pf.manual_seed(123)
    c = pf.randn(4).numpy()
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a, c)
    with pytest.raises(TypeError, match="seed must be an int"):
        pf.cuda.manual_seed("x")


def test_is_bf16_supported_follows_the_device():
    assert pf.cuda.is_bf16_supported() == pf.cuda.is_available()


def test_set_device_checks_the_ordinal():
    if not pf.cuda.is_available():
        with pytest.raises(RuntimeError, match="set_device: the cuda device cannot be used"):
            pf.cuda.set_device(0)
        return
    pf.cuda.set_device(0)
    pf.cuda.set_device("cuda:0")
    with pytest.raises(RuntimeError, match="invalid device ordinal 7"):
        pf.cuda.set_device(7)
    with pytest.raises(ValueError, match="expected a cuda device"):
        pf.cuda.set_device("cpu")


def test_backends_cudnn_switches_are_kept_and_validated():
    cudnn = pf.backends.cudnn
    before = (cudnn.benchmark, cudnn.deterministic)
    try:
        cudnn.benchmark = True
        cudnn.deterministic = True
        assert cudnn.benchmark and cudnn.deterministic and cudnn.enabled and cudnn.allow_tf32
    finally:
        cudnn.benchmark, cudnn.deterministic = before
    assert cudnn.is_available() is False and cudnn.version() is None
    with pytest.raises(TypeError, match="must be True or False"):
        cudnn.benchmark = "yes"
    with pytest.raises(AttributeError, match="no setting 'benchmrk'"):
        cudnn.benchmrk = True


@needs_torch
def test_the_defaults_are_pytorchs():
    for name in pf.backends.cudnn.SETTINGS:
        assert getattr(pf.backends.cudnn, name) == getattr(torch.backends.cudnn, name), name
    assert pf.backends.cuda.matmul.allow_tf32 == torch.backends.cuda.matmul.allow_tf32


def test_matmul_flags_survive_a_change_of_route():
    cuda = pf.backends.cuda
    assert cuda.matmul == "numba" and cuda.matmul.allow_tf32 is False
    try:
        cuda.matmul.allow_tf32 = True
        cuda.matmul = "cublas"
        assert cuda.matmul == "cublas" and cuda.matmul.allow_tf32 is True
        with pytest.raises(TypeError, match="must be True or False"):
            cuda.matmul.allow_tf32 = 1
        with pytest.raises(AttributeError, match="no flag 'allow_tf33'"):
            cuda.matmul.allow_tf33 = True
    finally:
        cuda.matmul = "numba"
        cuda.matmul.allow_tf32 = False
    assert repr(cuda) == "pyflow.backends.cuda(matmul='numba')"


def test_pin_memory_returns_the_cpu_tensor():
    t = pf.ones(3, device="cpu")
    assert t.pin_memory() is t and t.is_pinned() is False
    if pf.cuda.is_available():
        with pytest.raises(RuntimeError, match="only CPU tensors can be pinned"):
            pf.ones(3, device="cuda").pin_memory()
