"""pyflow.cuda: the CUDA device's public helpers.

Two ways to have a ``cuda`` device:
- a real GPU: numba.cuda finds a driver and CuPy is installed
  (``pip install pyflow[cuda]``); CuPy's memory pool holds tensor memory and
  kernels launch on CuPy's current stream;
- numba's CUDA simulator: ``NUMBA_ENABLE_CUDASIM=1`` set before pyflow (and
  numba) are imported.  Device memory is NumPy memory and the very same
  numba.cuda kernels run, slowly, in the simulator; events time host wall
  clock.  This is how the test suite exercises every CUDA kernel without a GPU.

The answers come from the cuda backend object (``pyflow/device.py``:
``backend_of("cuda")``), which knows which of the two a process has; this
module is the public face PyTorch users expect (``torch.cuda``'s names).
"""
import time

from .device import backend_of

__all__ = ["is_available", "device_count", "current_device", "set_device", "synchronize",
           "Stream", "Event", "memory_allocated", "max_memory_allocated",
           "reset_peak_memory_stats", "unavailable_reason", "simulated", "manual_seed",
           "manual_seed_all", "is_bf16_supported"]


def _backend():
    return backend_of("cuda")


def simulated():
    """True under numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1)."""
    return _backend().simulated


def unavailable_reason():
    """None when the cuda device can be used, else a sentence saying why not."""
    return _backend().unavailable_reason()


def is_available():
    return unavailable_reason() is None


def device_count():
    return _backend().device_count()


def current_device():
    return _backend().current_device()


def set_device(device):
    """Make ``device`` (an index, ``"cuda:N"`` or a ``pyflow.device``) the current
    cuda device, as ``torch.cuda.set_device``."""
    from .device import device as _device
    if isinstance(device, bool) or not isinstance(device, int):
        d = _device(device)
        if d.type != "cuda":
            raise ValueError(f"set_device: expected a cuda device, got {device!r}")
        device = d.index or 0
    _backend().set_device(device)


def manual_seed(seed):
    """Seed the random numbers of the cuda device.  pyflow has one default
    generator for every device (its Philox stream draws the same numbers, and
    the same dropout masks, on CPU and cuda), so this seeds that generator, as
    ``pyflow.manual_seed`` does; ``torch.cuda.manual_seed`` seeds the CUDA
    generators only, which scripts pair with ``torch.manual_seed`` anyway."""
    from . import random
    return random.manual_seed(seed)


def manual_seed_all(seed):
    """``manual_seed`` for every cuda device: the same one generator."""
    return manual_seed(seed)


def is_bf16_supported(including_emulation=True):
    """True when the cuda device can be used: bfloat16 tensors work there on any
    GPU, since pyflow's cuda ops compute bfloat16 data in float32."""
    return is_available()


def synchronize():
    """Wait for every kernel launched so far (a no-op in the simulator)."""
    _backend().synchronize()


class Stream:
    """A CUDA stream; ``with stream:`` makes it current for kernel launches."""

    def __init__(self):
        self._stream = _backend().new_stream()      # None in the simulator

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
        self._event, self._t = _backend().new_event(enable_timing), None

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
        return _backend().elapsed_time(self._event, end._event)


# ------------------------------------------------------------------ memory statistics
# Counted by the cuda backend (``MemoryStats``): every array its ``empty``,
# ``zeros`` and ``to_device`` make, until it is garbage collected.
def memory_allocated(device=None):
    """Bytes currently held by pyflow's CUDA tensors and kernel outputs."""
    return _backend().memory.allocated


def max_memory_allocated(device=None):
    return _backend().memory.peak


def reset_peak_memory_stats(device=None):
    _backend().memory.reset_peak()
