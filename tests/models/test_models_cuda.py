"""The model zoo on the ``cuda`` device: ``cudasim_models.py`` runs one training
step of GPT (eager and graph), BERT and ResNet on numba's simulated GPU in a
child process and compares with the CPU (and checks ``Module.to(device)``)."""
import os

import pytest

from ..kernels.cudatools import run_in_simulator

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.slow
@pytest.mark.cpu_only
def test_models_on_the_simulated_cuda_device_equal_the_cpu():
    out = run_in_simulator(os.path.join(HERE, "cudasim_models.py"))
    assert "5 checks, 0 failures" in out
