"""How a tensor's memory is handed to MPI: zero-copy, direct device, or staged.

Three cases, decided per array by ``MPIBuffer``:

* **host** (cpu tensors): the NumPy array itself is the MPI buffer, zero-copy.
  A non-contiguous view is copied once into a contiguous array and, for
  operations that write (in-place all_reduce, broadcast, recv...), written back.
* **device, CUDA-aware MPI** (``cuda_aware.py``): the stream is synchronised
  (MPI reads memory, it does not wait for kernels) and the device array is
  passed straight to MPI through ``__cuda_array_interface__``.
* **device, staged**: the bytes go through a *pinned host buffer* borrowed from
  ``StagingPool``: device -> host, MPI on the host buffer, host -> device.
  The pool keeps the buffers between calls, so a training loop allocates its
  staging memory once (Horovod / ChainerMN do the same; mpi4jax allocates per
  call, which is what this avoids).

Under numba's simulator (``NUMBA_ENABLE_CUDASIM=1``) device arrays are
``SimulatedDeviceArray``s; the copies below are then explicit host views and
"pinned" memory is a plain NumPy buffer, so the whole staging logic runs in CI
without a GPU.
"""
import threading

import numpy as np

from .cuda_aware import cuda_aware_mpi

__all__ = ["StagingPool", "staging_pool", "MPIBuffer", "is_host_array"]


def is_host_array(a):
    """True for host NumPy memory (a simulated device array is *not* host memory)."""
    if type(a) is np.ndarray:           # the common case, decided without an import
        return True
    from pyflow.kernels.cuda._simarray import SimulatedDeviceArray
    return isinstance(a, np.ndarray) and not isinstance(a, SimulatedDeviceArray)


def _simulated():
    from numba import config
    return bool(config.ENABLE_CUDASIM)


# --------------------------------------------------------------------- copies
def synchronize_stream():
    """Wait for the kernels queued on the current stream (MPI reads memory
    directly, it knows nothing about CUDA streams)."""
    if not _simulated():
        import cupy
        cupy.cuda.get_current_stream().synchronize()


def device_to_host(device_array, host_out):
    """Copy a device array into the contiguous host array ``host_out`` (blocking)."""
    if _simulated():
        np.copyto(host_out, device_array.view(np.ndarray))
    else:
        import cupy
        if not device_array.flags.c_contiguous:
            device_array = cupy.ascontiguousarray(device_array)
        device_array.get(out=host_out)         # blocking: returns when the bytes are there


def host_to_device(host, device_out):
    """Copy the host array ``host`` into ``device_out``; returns when done, so the
    host buffer may be reused at once (a copy from pinned memory is otherwise
    asynchronous)."""
    if _simulated():
        np.copyto(device_out.view(np.ndarray), host)
        return
    import cupy
    if device_out.flags.c_contiguous:
        device_out.set(host)
    else:
        tmp = cupy.empty(host.shape, host.dtype)
        tmp.set(host)
        device_out[...] = tmp
    cupy.cuda.get_current_stream().synchronize()


def _device_contiguous(a):
    if _simulated():
        from pyflow.kernels.cuda._simarray import as_simulated
        return as_simulated(np.ascontiguousarray(a.view(np.ndarray)))
    import cupy
    return cupy.ascontiguousarray(a)


# --------------------------------------------------------------------- pool
class StagingPool:
    """Reused pinned host buffers for device <-> MPI staging.

    Blocks are raw bytes, so one block serves any dtype: the cache is keyed by
    size alone.  ``acquire`` lends the smallest free block that is big enough;
    when none is, a new one of the next power of two is allocated (so a loop
    whose sizes vary settles after a few calls) and, if the cache is full, the
    smallest free block is dropped.  A block is lent to one operation at a time
    (non-blocking collectives keep theirs until ``wait()``), so concurrent
    operations never share memory.

    ``allocations`` counts the blocks ever allocated: tests assert that a
    repeated call does not raise it.
    """

    MIN_BYTES = 4096
    MAX_FREE = 8

    def __init__(self, allocate=None):
        self._allocate = allocate or _allocate_pinned
        self._free = []                # free blocks (uint8 arrays), smallest first
        self._lock = threading.Lock()  # the comm stream thread and the main thread share it
        self.allocations = 0
        self.bytes_allocated = 0

    def acquire(self, shape, dtype):
        """(view, block): a C-contiguous host view of ``shape``/``dtype`` on a lent block."""
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        with self._lock:
            for i, block in enumerate(self._free):
                if block.nbytes >= nbytes:
                    del self._free[i]
                    break
            else:
                size = max(self.MIN_BYTES, 1 << max(0, nbytes - 1).bit_length())
                block = self._allocate(size)
                self.allocations += 1
                self.bytes_allocated += size
        return block[:nbytes].view(dtype).reshape(shape), block

    def release(self, block):
        with self._lock:
            self._free.append(block)
            self._free.sort(key=lambda b: b.nbytes)
            if len(self._free) > self.MAX_FREE:
                del self._free[0]

    def clear(self):
        with self._lock:
            self._free.clear()


def _allocate_pinned(nbytes):
    """Page-locked host memory on a GPU (fast, asynchronous-capable copies);
    plain host memory under the simulator."""
    if _simulated():
        return np.empty(nbytes, np.uint8)
    import cupyx
    return cupyx.empty_pinned((nbytes,), np.uint8)


_pool = []


def staging_pool():
    """The process-wide staging pool (shared by every communicator)."""
    if not _pool:
        _pool.append(StagingPool())
    return _pool[0]


# --------------------------------------------------------------------- buffers
class MPIBuffer:
    """One array as MPI sees it.

    ``read``: MPI reads the array's current values (send side); ``write``: MPI
    writes results that must land in the array (receive side).  ``.mpi`` is what
    to pass to MPI (always C-contiguous); ``finish()`` copies results back where
    needed and returns staging memory; call it once the MPI operation is done.
    """
    __slots__ = ("array", "mpi", "kind", "_write", "_block", "_pool")

    def __init__(self, array, read=True, write=True, pool=None):
        self.array, self._write, self._block, self._pool = array, write, None, None
        if is_host_array(array):
            self.kind = "host"
            if array.flags.c_contiguous:
                self.mpi, self._write = array, False          # zero-copy: MPI writes in place
            else:
                self.mpi = np.ascontiguousarray(array) if read else np.empty(array.shape,
                                                                             array.dtype)
        elif cuda_aware_mpi():
            self.kind = "device"
            if array.flags.c_contiguous:
                self.mpi, self._write = array, False
            else:
                self.mpi = _device_contiguous(array)
            synchronize_stream()
        else:
            self.kind = "staged"
            self._pool = pool or staging_pool()
            self.mpi, self._block = self._pool.acquire(array.shape, array.dtype)
            if read:
                device_to_host(array, self.mpi)

    def finish(self):
        if self._write:
            if self.kind == "staged":
                host_to_device(self.mpi, self.array)
            else:                       # a contiguous copy of a strided view
                self.array[...] = self.mpi
            self._write = False
        if self._block is not None:
            self._pool.release(self._block)
            self._block = None
