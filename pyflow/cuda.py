"""pyflow.cuda: the CUDA device's public helpers.

Two ways to have a ``cuda`` device:
- a real GPU: numba.cuda finds a driver and CuPy is installed
  (``pip install pyflow[cuda]``); CuPy's memory pool holds tensor memory and
  kernels launch on CuPy's current stream;
- numba's CUDA simulator: ``NUMBA_ENABLE_CUDASIM=1`` set before pyflow (and
  numba) are imported.  Device memory is NumPy memory and the very same
  numba.cuda kernels run, slowly, in the simulator; events time host wall
  clock.  This is how the test suite exercises every CUDA kernel without a GPU.
"""
import time
import weakref

__all__ = ["is_available", "device_count", "current_device", "synchronize", "Stream", "Event",
           "memory_allocated", "max_memory_allocated", "reset_peak_memory_stats",
           "unavailable_reason", "simulated"]


def simulated():
    from numba import config
    return bool(config.ENABLE_CUDASIM)


def unavailable_reason():
    """None when the cuda device can be used, else a sentence saying why not."""
    if simulated():
        return None
    try:
        from numba import cuda
        has_gpu = cuda.is_available()
    except Exception as e:  # noqa: BLE001 (a broken driver install is a reason too)
        return f"numba.cuda could not start ({e})"
    if not has_gpu:
        return ("no GPU found (numba.cuda.is_available() is False); to run the CUDA kernels "
                "in numba's simulator instead, set NUMBA_ENABLE_CUDASIM=1 before importing pyflow")
    try:
        import cupy  # noqa: F401
    except ImportError:
        return "CuPy is not installed; install it with: pip install 'pyflow[cuda]'"
    return None


def is_available():
    return unavailable_reason() is None


def device_count():
    if not is_available():
        return 0
    if simulated():
        return 1
    import cupy
    return cupy.cuda.runtime.getDeviceCount()


def current_device():
    if simulated() or not is_available():
        return 0
    import cupy
    return cupy.cuda.Device().id


def synchronize():
    """Wait for every kernel launched so far (a no-op in the simulator)."""
    if is_available() and not simulated():
        import cupy
        cupy.cuda.Device().synchronize()


class Stream:
    """A CUDA stream; ``with stream:`` makes it current for kernel launches."""

    def __init__(self):
        self._stream = None
        if not simulated():
            import cupy
            self._stream = cupy.cuda.Stream(non_blocking=True)

    def __enter__(self):
        if self._stream is not None:
            self._stream.__enter__()
        return self

    def __exit__(self, *exc):
        if self._stream is not None:
            self._stream.__exit__(*exc)

    def synchronize(self):
        if self._stream is not None:
            self._stream.synchronize()


class Event:
    """A CUDA event; ``elapsed_time`` in milliseconds between two recorded events.
    In the simulator it records host wall-clock time."""

    def __init__(self, enable_timing=False):
        self._event, self._t = None, None
        if not simulated():
            import cupy
            self._event = cupy.cuda.Event(disable_timing=not enable_timing)

    def record(self, stream=None):
        if self._event is None:
            self._t = time.perf_counter()
        else:
            self._event.record(None if stream is None else stream._stream)

    def synchronize(self):
        if self._event is not None:
            self._event.synchronize()

    def elapsed_time(self, end):
        if self._event is None:
            if self._t is None or end._t is None:
                raise RuntimeError("elapsed_time: both events must be recorded first")
            return (end._t - self._t) * 1e3
        import cupy
        return cupy.cuda.get_elapsed_time(self._event, end._event)


# ------------------------------------------------------------------ memory statistics
class _Stats:
    allocated = 0
    peak = 0


def _track(array):
    """Count ``array``'s bytes as allocated until it is garbage collected."""
    n = int(array.nbytes)
    _Stats.allocated += n
    _Stats.peak = max(_Stats.peak, _Stats.allocated)
    weakref.finalize(array, _release, n)
    return array


def _release(n):
    _Stats.allocated -= n


def memory_allocated(device=None):
    """Bytes currently held by pyflow's CUDA tensors and kernel outputs."""
    return _Stats.allocated


def max_memory_allocated(device=None):
    return _Stats.peak


def reset_peak_memory_stats(device=None):
    _Stats.peak = _Stats.allocated
