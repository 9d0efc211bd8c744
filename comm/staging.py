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

What device memory is and how it is copied and synchronised is the array's
backend's business (``pyflow/device.py``, ``backend_of_array``): CuPy on a GPU;
under numba's simulator (``NUMBA_ENABLE_CUDASIM=1``) ``SimulatedDeviceArray``s,
whose copies are explicit host views and whose "pinned" memory is a plain
NumPy buffer, so the whole staging logic runs in CI without a GPU.
"""
import threading

import numpy as np

from pyflow.device import backend_of, backend_of_array

from .cuda_aware import cuda_aware_mpi

__all__ = ["StagingPool", "staging_pool", "MPIBuffer", "is_host_array"]


def is_host_array(a):
    """True for host NumPy memory (a simulated device array is *not* host memory)."""
    return isinstance(a, np.ndarray) and backend_of_array(a).type == "cpu"


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
    return backend_of("cuda").pinned_empty(nbytes)


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
    __slots__ = ("array", "mpi", "kind", "_write", "_block", "_pool", "_backend")

    def __init__(self, array, read=True, write=True, pool=None):
        self.array, self._write, self._block, self._pool = array, write, None, None
        backend = backend_of_array(array)
        self._backend = backend
        if backend.type == "cpu":
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
                self.mpi = backend.xp.ascontiguousarray(array)
            backend.synchronize_stream()     # MPI reads memory; it does not wait for kernels
        else:
            self.kind = "staged"
            self._pool = pool or staging_pool()
            self.mpi, self._block = self._pool.acquire(array.shape, array.dtype)
            if read:
                backend.to_host(array, out=self.mpi)      # blocking

    def finish(self):
        if self._write:
            if self.kind == "staged":
                self._backend.copy_from_host(self.mpi, self.array)
            else:                       # a contiguous copy of a strided view
                self.array[...] = self.mpi
            self._write = False
        if self._block is not None:
            self._pool.release(self._block)
            self._block = None
