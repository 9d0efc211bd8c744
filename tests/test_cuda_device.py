"""The cuda device: a clear error where it is unavailable, and the device layer
checked in numba's simulator (a child process, see cudasim_device.py)."""
import os

import pytest

import pyflow as pf
from tests.kernels.cudatools import run_in_simulator


def test_unavailable_cuda_says_why():
    reason = pf.cuda.unavailable_reason()
    if reason is None:      # a machine with a GPU: the device must work instead
        assert pf.ones(2, device="cuda").device.type == "cuda"
        return
    assert not pf.cuda.is_available() and pf.cuda.device_count() == 0
    with pytest.raises(RuntimeError, match="not available") as e:
        pf.ones(2, device="cuda")
    assert reason in str(e.value)
    with pytest.raises(RuntimeError, match="NUMBA_ENABLE_CUDASIM|CuPy|numba.cuda"):
        pf.tensor([1.0]).to("cuda")


def test_device_layer_in_the_simulator():
    run_in_simulator(os.path.join(os.path.dirname(os.path.abspath(__file__)), "cudasim_device.py"))
