"""Device memory and launch helpers shared by every CUDA kernel module.

On a GPU, CuPy arrays hold the memory (its pool) and kernels launch on CuPy's
current stream; numba.cuda receives the arrays through
``__cuda_array_interface__``.  Under numba's simulator
(``NUMBA_ENABLE_CUDASIM=1``) device arrays are NumPy arrays and the stream is
the default one.  Kernel modules allocate only through ``empty``/``zeros``
and launch with ``stream()``, so both cases share one code path.
"""
import math

import numpy as np
from numba import cuda

THREADS_PER_BLOCK = 256
MAX_BLOCKS = 8192


def simulated():
    """True under numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1)."""
    from numba import config
    return bool(config.ENABLE_CUDASIM)


def array_module(like=None):
    """numpy under the simulator or for host arrays, cupy for device arrays."""
    if like is not None and not isinstance(like, np.ndarray) and \
            hasattr(like, "__cuda_array_interface__"):
        import cupy
        return cupy
    if like is None and not simulated():
        import cupy
        return cupy
    return np


def _tracked(array):
    from pyflow.cuda import _track       # memory_allocated() / max_memory_allocated()
    return _track(array)


def empty(shape, dtype, like=None):
    return _tracked(array_module(like).empty(shape, dtype))


def zeros(shape, dtype, like=None):
    return _tracked(array_module(like).zeros(shape, dtype))


def to_device(host, like=None):
    """A copy of a host NumPy array (or number) as a device array."""
    return _tracked(array_module(like).array(host, copy=True))


def to_host(array):
    """A host NumPy copy of a device array."""
    if isinstance(array, np.ndarray):
        return np.array(array, copy=True)
    return array.get()


def stream():
    """The stream to launch on: CuPy's current stream on a GPU, 0 in the simulator."""
    if simulated():
        return 0
    import cupy
    return cuda.external_stream(cupy.cuda.get_current_stream().ptr)


def launch_config(n, threads=THREADS_PER_BLOCK):
    """(blocks, threads per block) for a grid-stride loop over ``n`` items."""
    threads = min(threads, max(32, -(-n // 32) * 32))
    return min(-(-n // threads), MAX_BLOCKS), threads


def prod(shape):
    return math.prod(shape)
