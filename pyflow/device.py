"""Devices, and one backend object per device kind: where an array lives.

A ``device`` names where a tensor lives (``cpu``, ``cuda:0``).  A *backend*
knows that device kind's memory: its array type and array module, how to
allocate (``empty``/``zeros``), how to copy to and from the host, the stream
kernels launch on, and what it has allocated.  Three exist:

* ``cpu``: NumPy arrays (the host).
* ``cuda`` on a GPU: CuPy arrays (CuPy's memory pool); numba.cuda kernels take
  them through ``__cuda_array_interface__`` and launch on CuPy's current stream.
* ``cuda`` under numba's simulator (``NUMBA_ENABLE_CUDASIM=1`` before numba is
  imported): ``SimulatedDeviceArray``s, NumPy memory as strict as CuPy about
  mixing with the host (``pyflow/_simarray.py``).  Which of the two ``cuda``
  backends a process has is decided once, on first use.

``backend_of(device)`` and ``backend_of_array(array)`` are the only ways in:
code that asks "what is this array, where does it live, how do I make another
one there" asks them instead of testing for CuPy or the simulator itself.  The
device layer is the lowest one (only ``dtypes`` beside it), so this module
imports nothing of pyflow above it; CuPy and numba are imported only when a
cuda backend first needs them, so ``import pyflow`` on a CPU-only machine
loads neither.
"""
import contextlib
import numbers
import threading
import weakref

import numpy as np

__all__ = ["device", "set_default_device", "get_default_device", "backend_of",
           "backend_of_array", "Backend"]

_TYPES = ("cpu", "cuda")


class device:
    __slots__ = ("type", "index")

    def __init__(self, type_or_str, index=None):
        if isinstance(type_or_str, device):
            self.type, self.index = type_or_str.type, type_or_str.index
            return
        if not isinstance(type_or_str, str):
            raise TypeError(f"device: expected a string like 'cpu' or 'cuda:0', got {type_or_str!r}")
        s = type_or_str
        if ":" in s:
            s, idx = s.split(":", 1)
            if index is not None or not idx.isdigit():
                raise ValueError(f"device: invalid device string {type_or_str!r}")
            index = int(idx)
        if s not in _TYPES:
            raise ValueError(f"device: expected one of {_TYPES} (optionally ':index'), got {type_or_str!r}")
        self.type, self.index = s, index

    def __eq__(self, other):
        if isinstance(other, str):
            other = device(other)
        return isinstance(other, device) and self.type == other.type and \
            (self.index or 0) == (other.index or 0)

    def __hash__(self):
        return hash((self.type, self.index or 0))

    def __repr__(self):
        return f"device(type='{self.type}'" + (f", index={self.index})" if self.index is not None else ")")

    def __str__(self):
        return self.type if self.index is None else f"{self.type}:{self.index}"


CPU = device("cpu")
_default = [CPU]


def set_default_device(d):
    """Device of tensors made by creation ops without ``device=`` (PyTorch's name)."""
    d = as_device(d)
    check_available(d)
    _default[0] = d


def get_default_device():
    return _default[0]


def as_device(d, argname="device"):
    if d is None:
        return CPU
    if type(d) is device:
        return d
    if isinstance(d, int):
        return device("cuda", d)
    try:
        return device(d)
    except (TypeError, ValueError) as e:
        raise type(e)(f"{argname}: {e}") from None


def placed(d):
    """The device a tensor lives on: ``cuda`` means the current CUDA device, ``cuda:0``."""
    if d.type == "cuda" and d.index is None:
        return device("cuda", backend_of(d).current_device())
    return d


def check_available(d):
    """Raise a clear error when data cannot be placed on device ``d``."""
    if d.type == "cpu":
        return
    backend = backend_of(d)
    reason = backend.unavailable_reason()
    if reason is not None:
        raise RuntimeError(f"device '{d}' is not available: {reason}")
    if (d.index or 0) >= backend.device_count():
        raise RuntimeError(f"device '{d}': invalid device index, {backend.device_count()} CUDA "
                           f"device(s) available")


# ------------------------------------------------------------------ memory statistics
class MemoryStats:
    """Bytes a backend's arrays hold (``pyflow.cuda.memory_allocated``): every
    array made by ``empty``/``zeros``/``to_device`` counts until it is garbage
    collected."""

    def __init__(self):
        self.allocated = 0
        self.peak = 0

    def track(self, array):
        n = int(array.nbytes)
        self.allocated += n
        if self.allocated > self.peak:
            self.peak = self.allocated
        weakref.finalize(array, self._release, n)
        return array

    def _release(self, n):
        self.allocated -= n

    def reset_peak(self):
        self.peak = self.allocated


# ------------------------------------------------------------------ backends
class Backend:
    """What one device kind's memory is and how to use it (the interface; the
    ``cpu`` backend's answers are the defaults).

    ``type``: the device type (``"cpu"``, ``"cuda"``); ``simulated``: True for
    the ``cuda`` of numba's simulator; ``xp``: the array module (``numpy``,
    ``cupy``, or the simulator's stand-in) for array math where the data is;
    ``array_types``: the classes of its arrays; ``storage``: those in words,
    for error messages; ``memory``: a ``MemoryStats``."""

    type = "cpu"
    simulated = False
    storage = "a host numpy.ndarray"

    def __init__(self):
        self.memory = MemoryStats()

    def __repr__(self):
        return f"<pyflow backend {self.type}{' (simulated)' if self.simulated else ''}>"

    @property
    def xp(self):
        return np

    @property
    def array_types(self):
        return (np.ndarray, np.generic)

    def owns(self, a):
        """True when ``a`` is an array of this backend's memory."""
        return isinstance(a, self.array_types) and backend_of_array(a) is self

    # -------------------------------------------------------------- allocation
    def empty(self, shape, dtype):
        """Uninitialised memory of this backend."""
        return np.empty(shape, dtype)

    def zeros(self, shape, dtype):
        return np.zeros(shape, dtype)

    # -------------------------------------------------------------- copies
    def to_device(self, host):
        """A copy of host data (a NumPy array or number) in this backend's memory."""
        return np.array(host, copy=True)

    def to_host(self, array, out=None):
        """A host NumPy copy of ``array`` (one of this backend's); with ``out`` (a
        C-contiguous host array) the copy goes there, and has finished on return."""
        if out is None:
            return np.array(array, copy=True, subok=False)
        np.copyto(out, array)
        return out

    def copy_from_host(self, host, out):
        """Copy host array ``host`` into ``out`` (one of this backend's arrays);
        finished on return, so ``host`` may be reused at once."""
        np.copyto(out, host)

    def pinned_empty(self, nbytes):
        """``nbytes`` of host memory for staging this backend's copies (page-locked
        on a GPU, so copies are fast)."""
        return np.empty(nbytes, np.uint8)

    # -------------------------------------------------------------- streams
    def launch_stream(self):
        """The stream numba kernels launch on (None: no streams)."""
        return None

    def synchronize_stream(self):
        """Wait for the work queued on the current stream (MPI and host code read
        memory directly; they know nothing about streams)."""

    def synchronize(self):
        """Wait for every kernel launched so far on this device."""

    def new_stream(self):
        """A new stream object (None where the backend has no streams)."""
        return None

    def new_event(self, enable_timing=False):
        """A new event object (None where the backend has no events)."""
        return None

    # -------------------------------------------------------------- graphs
    def capture_unavailable(self):
        """None when this backend can capture the work queued on its stream into
        a graph and replay it (pyflow.graph.cuda_graph), else why not."""
        return f"the {self.type} device has no streams to capture"

    def begin_capture(self):
        """Start recording the work launched on the current stream (run nothing)."""
        raise RuntimeError(self.capture_unavailable())

    def end_capture(self):
        """Stop recording; the graph (``graph.launch()`` replays it)."""
        raise RuntimeError(self.capture_unavailable())

    def capture_failed(self, exc):
        """True when ``exc``, raised while capturing, says the work cannot be
        captured (a host read, a synchronisation), not that the work is wrong."""
        return False

    # -------------------------------------------------------------- availability
    def unavailable_reason(self):
        """None when the device can be used, else a sentence saying why not."""
        return None

    def device_count(self):
        return 1

    def current_device(self):
        return 0

    def set_device(self, index):
        """Make device ``index`` the current one (a backend with one device: 0 only)."""
        self._check_index(index)

    def _check_index(self, index):
        count = self.device_count()
        if not 0 <= index < count:
            raise RuntimeError(f"set_device: invalid device ordinal {index}: {count} "
                               f"{self.type} device(s) available")


class CpuBackend(Backend):
    """The host: NumPy arrays (no streams, no memory statistics)."""


class SimulatedCudaBackend(Backend):
    """``cuda`` under numba's simulator: ``SimulatedDeviceArray``s (NumPy memory
    that refuses implicit host mixing as CuPy does), the default stream, host
    wall-clock events."""

    type = "cuda"
    simulated = True

    def __init__(self):
        super().__init__()
        from . import _simarray          # imports numba: only once the simulator is used
        self._sim = _simarray
        self.storage = "a device array (pyflow._simarray.SimulatedDeviceArray)"

    @property
    def xp(self):
        return self._sim.SIM_NUMPY

    @property
    def array_types(self):
        return (self._sim.SimulatedDeviceArray,)

    def empty(self, shape, dtype):
        return self.memory.track(self._sim.SIM_NUMPY.empty(shape, dtype))

    def zeros(self, shape, dtype):
        return self.memory.track(self._sim.SIM_NUMPY.zeros(shape, dtype))

    def to_device(self, host):
        return self.memory.track(self._sim.SIM_NUMPY.array(host, copy=True))

    def to_host(self, array, out=None):
        if out is None:
            return np.array(array, copy=True, subok=False)
        np.copyto(out, array.view(np.ndarray))
        return out

    def copy_from_host(self, host, out):
        np.copyto(out.view(np.ndarray), host)

    def launch_stream(self):
        return 0

    def capture_unavailable(self):
        return None

    def begin_capture(self):
        from . import _simcapture           # the simulator's capture (see its docstring)
        _simcapture.begin(self)

    def end_capture(self):
        from . import _simcapture
        return _simcapture.end()

    def capture_failed(self, exc):
        from . import _simcapture
        return isinstance(exc, _simcapture.CaptureError)


class CudaBackend(Backend):
    """``cuda`` on a GPU: CuPy arrays from CuPy's pool, kernels on CuPy's
    current stream.  Built without touching CuPy; ``unavailable_reason`` says
    when there is no GPU or no CuPy."""

    type = "cuda"

    def __init__(self):
        super().__init__()
        self._cupy = None

    @property
    def xp(self):
        if self._cupy is None:
            import cupy
            self._cupy = cupy
        return self._cupy

    @property
    def array_types(self):
        return (self.xp.ndarray,)

    @property
    def storage(self):
        return "a device array (cupy.ndarray)"

    def empty(self, shape, dtype):
        return self.memory.track(self.xp.empty(shape, dtype))

    def zeros(self, shape, dtype):
        return self.memory.track(self.xp.zeros(shape, dtype))

    def to_device(self, host):
        return self.memory.track(self.xp.array(host, copy=True))

    def to_host(self, array, out=None):
        if out is None:
            return array.get()
        if not array.flags.c_contiguous:
            array = self.xp.ascontiguousarray(array)
        array.get(out=out)                  # blocking: returns when the bytes are there
        return out

    def copy_from_host(self, host, out):
        # a copy from pinned memory is otherwise asynchronous: wait, so the
        # caller may reuse ``host`` at once
        if out.flags.c_contiguous:
            out.set(host)
        else:
            tmp = self.xp.empty(host.shape, host.dtype)
            tmp.set(host)
            out[...] = tmp
        self.synchronize_stream()

    def pinned_empty(self, nbytes):
        import cupyx
        return cupyx.empty_pinned((nbytes,), np.uint8)

    def launch_stream(self):
        from numba import cuda
        return cuda.external_stream(self.xp.cuda.get_current_stream().ptr)

    def synchronize_stream(self):
        self.xp.cuda.get_current_stream().synchronize()

    def synchronize(self):
        if self.unavailable_reason() is None:
            self.xp.cuda.Device().synchronize()

    def new_stream(self):
        return self.xp.cuda.Stream(non_blocking=True)

    def new_event(self, enable_timing=False):
        return self.xp.cuda.Event(disable_timing=not enable_timing)

    def elapsed_time(self, start, end):
        """Milliseconds between two recorded events of ``new_event``."""
        return self.xp.cuda.get_elapsed_time(start, end)

    def capture_unavailable(self):
        return self.unavailable_reason()

    def begin_capture(self):
        """CuPy's stream capture on a stream of its own, allocating from a memory
        pool of its own: what the graph allocates while capturing stays the
        graph's (no later allocation can take it), and pool growth (cudaMalloc)
        is allowed in CuPy's default relaxed capture mode."""
        cp = self.xp
        stream, pool = cp.cuda.Stream(non_blocking=True), cp.cuda.MemoryPool()
        scope = contextlib.ExitStack()
        scope.enter_context(cp.cuda.using_allocator(pool.malloc))
        scope.enter_context(stream)
        scope.enter_context(_no_interface_sync())
        stream.begin_capture()
        self._capture = (stream, pool, scope)

    def end_capture(self):
        stream, pool, scope = self._capture
        self._capture = None
        try:
            graph = stream.end_capture()
        finally:
            scope.close()
        return _CapturedGraph(graph, pool)

    def capture_failed(self, exc):
        # cudaErrorStreamCapture* and CUDA_ERROR_STREAM_CAPTURE_* are 900-908
        code = getattr(exc, "status", None)
        if code is None:
            code = getattr(exc, "code", None)
        return isinstance(code, int) and 900 <= code <= 908 or "captur" in str(exc)

    def unavailable_reason(self):
        try:
            from numba import cuda
            has_gpu = cuda.is_available()
        except Exception as e:  # noqa: BLE001 (a broken driver install is a reason too)
            return f"numba.cuda could not start ({e})"
        if not has_gpu:
            return ("no GPU found (numba.cuda.is_available() is False); to run the CUDA kernels "
                    "in numba's simulator instead, set NUMBA_ENABLE_CUDASIM=1 before importing "
                    "pyflow")
        try:
            self.xp
        except ImportError:
            return "CuPy is not installed; install it with: pip install 'pyflow[cuda]'"
        return None

    def device_count(self):
        if self.unavailable_reason() is not None:
            return 0
        return self.xp.cuda.runtime.getDeviceCount()

    def current_device(self):
        if self.unavailable_reason() is not None:
            return 0
        return self.xp.cuda.Device().id

    def set_device(self, index):
        """CuPy's current device (tensor memory, streams) and numba's current
        context (kernels) both become ``index``.  Not yet run on a machine with
        several GPUs."""
        reason = self.unavailable_reason()
        if reason is not None:
            raise RuntimeError(f"set_device: the cuda device cannot be used: {reason}")
        self._check_index(index)
        from numba import cuda
        self.xp.cuda.Device(index).use()
        cuda.select_device(index)


class _CapturedGraph:
    """A CuPy graph and the memory pool its buffers came from (kept alive with it)."""

    def __init__(self, graph, pool):
        self.graph, self.pool = graph, pool

    def launch(self):
        self.graph.launch()             # on the current stream, after the work before it


@contextlib.contextmanager
def _no_interface_sync():
    """numba synchronises the stream named in a CUDA array interface it is handed
    (CUDA_ARRAY_INTERFACE_SYNC), which a capturing stream refuses; the kernels
    run on that very stream, so no synchronisation is needed."""
    from numba.core import config
    before = getattr(config, "CUDA_ARRAY_INTERFACE_SYNC", None)
    config.CUDA_ARRAY_INTERFACE_SYNC = False
    try:
        yield
    finally:
        config.CUDA_ARRAY_INTERFACE_SYNC = before


# ------------------------------------------------------------------ the entry points
CPU_BACKEND = CpuBackend()
_BACKENDS = {"cpu": CPU_BACKEND}       # device type -> backend, the cuda one made on first use
_BY_TYPE = {np.ndarray: CPU_BACKEND}   # array class -> backend, learnt as classes are met


def backend_of(d):
    """The backend of device ``d`` (a ``device``, or what ``device()`` accepts)."""
    kind = d.type if type(d) is device else as_device(d).type
    backend = _BACKENDS.get(kind)
    if backend is None:
        with _making:
            backend = _BACKENDS.get(kind) or _BACKENDS.setdefault(kind, _cuda_backend())
    return backend


# One cuda backend per process, whichever thread asks first (its memory
# statistics must not be split between two objects).
_making = threading.RLock()
_simulated = []


def _cuda_backend():
    from numba import config             # NUMBA_ENABLE_CUDASIM is read when numba loads
    return _simulated_backend() if config.ENABLE_CUDASIM else CudaBackend()


def _simulated_backend():
    with _making:
        if not _simulated:
            _simulated.append(SimulatedCudaBackend())
    return _simulated[0]


def backend_of_array(a):
    """The backend whose memory holds ``a``.  Host data of any kind (NumPy arrays
    and scalars, Python numbers, lists) is the ``cpu`` backend's; a simulated
    device array the simulator's; anything else with ``__cuda_array_interface__``
    (a CuPy array, a raw device span) the process's ``cuda`` backend."""
    backend = _BY_TYPE.get(type(a))
    return backend if backend is not None else _classify(a)


def _classify(a):
    kind = type(a)
    if getattr(kind, "_pyflow_simulated_device", False):
        backend = _simulated_backend()
    elif isinstance(a, (np.ndarray, np.generic, numbers.Number)):
        backend = CPU_BACKEND              # host subclasses too (np.memmap, 0-d results)
    elif hasattr(kind, "__cuda_array_interface__"):
        backend = backend_of("cuda")
    elif hasattr(a, "__cuda_array_interface__"):
        return backend_of("cuda")          # set on the instance: not a property of the class
    else:
        backend = CPU_BACKEND              # lists, tuples: host data
    _BY_TYPE[kind] = backend
    return backend
