"""Where a kernel check script (``tests/kernels/cudasim_*.py``) runs.

* numba's simulator, ``NUMBA_ENABLE_CUDASIM=1`` (CI, and ``bench/gpu_check --sim``):
  host NumPy arrays are the simulator's device arrays, as the scripts were
  written;
* a real GPU, ``PYFLOW_KERNEL_CHECKS=gpu`` (``bench/gpu_check`` on a GPU machine):
  every registered cuda kernel is wrapped so that host NumPy arguments (also
  inside tuples and lists) are copied to the device first.  The scripts read
  results through ``to_host`` already, so they compare host copies: device
  inputs, host results, on the same checks and tolerances.  Kernels a script
  launches itself get host arrays, which numba copies in and out.

Anything else ends the script with a message saying which variable to set.
"""
import os
import sys

SIMULATOR, GPU = "simulator", "gpu"


def select():
    """The target of this process (call before numba is imported: the simulator
    is chosen by an environment variable numba reads once)."""
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        return SIMULATOR
    if os.environ.get("PYFLOW_KERNEL_CHECKS") == GPU:
        _send_host_arguments_to_the_device()
        return GPU
    sys.exit("set NUMBA_ENABLE_CUDASIM=1 (numba's simulator) or PYFLOW_KERNEL_CHECKS=gpu "
             "(a real GPU) before running this script")


def _send_host_arguments_to_the_device():
    import numpy as np

    import pyflow.cuda
    from pyflow.kernels import registry
    from pyflow.kernels.cuda._memory import to_device
    reason = pyflow.cuda.unavailable_reason()
    if reason is not None:
        sys.exit(f"PYFLOW_KERNEL_CHECKS=gpu, but the cuda device cannot be used: {reason}")

    def on_device(value):
        if isinstance(value, np.ndarray):
            return to_device(value)
        if isinstance(value, (tuple, list)):
            return type(value)(on_device(v) for v in value)
        return value

    host_get = registry.get

    def get(name, device, *args, **kwargs):
        kernel = host_get(name, device, *args, **kwargs)
        if device != "cuda":
            return kernel

        def with_device_inputs(*a, **kw):
            return kernel(*on_device(a), **{k: on_device(v) for k, v in kw.items()})
        return with_device_inputs
    registry.get = get
