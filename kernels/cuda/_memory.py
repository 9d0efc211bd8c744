"""Device memory and launch helpers shared by every CUDA kernel module.

What device memory is (CuPy arrays on a GPU, ``SimulatedDeviceArray``s under
numba's simulator), how it is allocated and copied and which stream kernels
launch on is the cuda backend's business (``pyflow/device.py``); this module
is the kernels' short way to it.  Kernel modules allocate only through
``empty``/``zeros`` and launch with ``stream()``, so the GPU and the simulator
share one code path; ``launch_config`` sizes grids for both.
"""
import math

import numpy as np

from pyflow.device import backend_of, backend_of_array

THREADS_PER_BLOCK = 256
MAX_BLOCKS = 8192
# numba's simulator starts one Python thread per CUDA thread at every launch, and
# that start-up, not the arithmetic, is what makes it slow.  Grid-stride kernels
# are correct for any grid, so under the simulator they get at most
# SIM_MAX_BLOCKS blocks of SIM_THREADS threads (still two blocks and a whole
# warp, so block-crossing and the stride loops are exercised).
SIM_THREADS = 32
SIM_MAX_BLOCKS = 2

_CUDA = backend_of("cuda")      # kernels run on the process's cuda backend (GPU or simulator)


def simulated():
    """True under numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1)."""
    return _CUDA.simulated


def array_module(like=None):
    """The array module of ``like``'s memory: ``cupy`` for GPU arrays, the
    simulator's strict stand-in (``SIM_NUMPY``) for simulated device arrays,
    ``numpy`` for host arrays and numbers.  With no ``like``: the device's
    module.  Ops doing array math on device data write ``xp = array_module(data)``
    and ``xp.sqrt(...)``, ``xp.zeros(...)``, so the same code runs on both."""
    return _CUDA.xp if like is None else backend_of_array(like).xp


def is_device_array(a):
    """True for device memory: a CuPy (or other CUDA array interface) array, or a
    simulated device array."""
    return backend_of_array(a).type == "cuda"


def is_host_array(a):
    """True for a host NumPy array (not a simulated device array)."""
    return isinstance(a, np.ndarray) and backend_of_array(a).type == "cpu"


def empty(shape, dtype, like=None):
    """Uninitialised device memory (always on the device, whatever ``like`` is)."""
    return _CUDA.empty(shape, dtype)


def zeros(shape, dtype, like=None):
    return _CUDA.zeros(shape, dtype)


def to_device(host, like=None):
    """A copy of a host NumPy array (or number) as a device array."""
    return _CUDA.to_device(host)


def to_host(array):
    """A host NumPy copy of an array (device or host)."""
    return backend_of_array(array).to_host(array)


def stream():
    """The stream to launch on: CuPy's current stream on a GPU, 0 in the simulator."""
    return _CUDA.launch_stream()


def launch_config(n, threads=THREADS_PER_BLOCK):
    """(blocks, threads per block) for a grid-stride loop over ``n`` items."""
    if simulated():
        return max(1, min(-(-n // SIM_THREADS), SIM_MAX_BLOCKS)), SIM_THREADS
    threads = min(threads, max(32, -(-n // 32) * 32))
    return min(-(-n // threads), MAX_BLOCKS), threads


def prod(shape):
    return math.prod(shape)
