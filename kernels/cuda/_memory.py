"""Device memory and launch helpers shared by every CUDA kernel module.

On a GPU, CuPy arrays hold the memory (its pool) and kernels launch on CuPy's
current stream; numba.cuda receives the arrays through
``__cuda_array_interface__``.  Under numba's simulator
(``NUMBA_ENABLE_CUDASIM=1``) device arrays are ``SimulatedDeviceArray``s,
NumPy arrays as strict as CuPy about host/device mixing (see ``_simarray``),
and the stream is the default one.  Kernel modules allocate only through ``empty``/``zeros``
and launch with ``stream()``, so both cases share one code path.
"""
import math

import numpy as np
from numba import cuda

from ._simarray import SIM_NUMPY, SimulatedDeviceArray

THREADS_PER_BLOCK = 256
MAX_BLOCKS = 8192
# numba's simulator starts one Python thread per CUDA thread at every launch, and
# that start-up, not the arithmetic, is what makes it slow.  Grid-stride kernels
# are correct for any grid, so under the simulator they get at most
# SIM_MAX_BLOCKS blocks of SIM_THREADS threads (still two blocks and a whole
# warp, so block-crossing and the stride loops are exercised).
SIM_THREADS = 32
SIM_MAX_BLOCKS = 2


def simulated():
    """True under numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1)."""
    from numba import config
    return bool(config.ENABLE_CUDASIM)


def array_module(like=None):
    """The array module of ``like``'s memory: ``cupy`` for GPU arrays, the
    simulator's strict stand-in (``_simarray.SIM_NUMPY``) for simulated device
    arrays, ``numpy`` for host arrays and numbers.  With no ``like``: the device's
    module.  Ops doing array math on device data write ``xp = array_module(data)``
    and ``xp.sqrt(...)``, ``xp.zeros(...)``, so the same code runs on both."""
    if like is None:
        return _device_module()
    if isinstance(like, np.ndarray):
        return SIM_NUMPY if isinstance(like, SimulatedDeviceArray) else np
    if hasattr(like, "__cuda_array_interface__"):
        import cupy
        return cupy
    return np


def _device_module():
    if simulated():
        return SIM_NUMPY
    import cupy
    return cupy


def is_device_array(a):
    """True for device memory: a CuPy (or other CUDA array interface) array, or a
    simulated device array."""
    return isinstance(a, SimulatedDeviceArray) or \
        (not isinstance(a, np.ndarray) and hasattr(a, "__cuda_array_interface__"))


def is_host_array(a):
    """True for a host NumPy array (not a simulated device array)."""
    return isinstance(a, np.ndarray) and not isinstance(a, SimulatedDeviceArray)


def _tracked(array):
    from pyflow.cuda import _track       # memory_allocated() / max_memory_allocated()
    return _track(array)


def empty(shape, dtype, like=None):
    """Uninitialised device memory (always on the device, whatever ``like`` is)."""
    return _tracked(_device_module().empty(shape, dtype))


def zeros(shape, dtype, like=None):
    return _tracked(_device_module().zeros(shape, dtype))


def to_device(host, like=None):
    """A copy of a host NumPy array (or number) as a device array."""
    return _tracked(_device_module().array(host, copy=True))


def to_host(array):
    """A host NumPy copy of a device array."""
    if isinstance(array, np.ndarray):
        return np.array(array, copy=True, subok=False)
    return array.get()


def stream():
    """The stream to launch on: CuPy's current stream on a GPU, 0 in the simulator."""
    if simulated():
        return 0
    import cupy
    return cuda.external_stream(cupy.cuda.get_current_stream().ptr)


def launch_config(n, threads=THREADS_PER_BLOCK):
    """(blocks, threads per block) for a grid-stride loop over ``n`` items."""
    if simulated():
        return max(1, min(-(-n // SIM_THREADS), SIM_MAX_BLOCKS)), SIM_THREADS
    threads = min(threads, max(32, -(-n // 32) * 32))
    return min(-(-n // threads), MAX_BLOCKS), threads


def prod(shape):
    return math.prod(shape)
