"""Stream capture for numba's simulator: a CUDA graph as a recording of device work.

Why this exists: on a GPU a step is captured into a CUDA graph
(``pyflow.graph.cuda_graph``).  While a stream captures, the work queued on it
(kernel launches, copies, CuPy's own kernels) is recorded, not run; a replay
runs all of it again with the very same arguments and device pointers, and no
Python.  A captured step is therefore wrong when

1. it reads device data on the host while capturing (CUDA refuses: a
   synchronous copy, ``float(x)``, a bounds check's flag);
2. a host value that changes between steps is baked into the recording (a
   dropout seed, a learning rate): the replay keeps using the captured one;
3. it copies host data to the device while capturing (the replay would copy
   from host memory that is gone), or its shape depends on device data.

The simulator has no streams to capture, so without this module the captured
code path could only run on a GPU.  ``capture()`` gives the simulator the same
semantics, strictly enough that tests see all three mistakes:

- while capturing, simulated kernel launches, ufuncs and NumPy functions on
  device arrays, item assignment, ``fill``, ``copy``, ``astype`` and indexing
  that copies are recorded and *not* run.  An operation that makes a new array
  still makes it (its shape is needed), but fills a float one with NaN: a value
  read from it before the replay is visibly wrong;
- host reads and host -> device copies raise ``CaptureError``;
- ``SimulatedGraph.launch()`` runs the recording in order, each new array's
  values written into the array made at capture (a graph's fixed pointers).

Views (reshape, transpose, basic slices) are not work; they pass through.
Everything is patched onto the classes only while a capture is open, so
simulated runs that capture nothing pay nothing.  None of this exists on a GPU,
where CuPy's stream capture does the real thing (``pyflow/device.py``).
"""
import numpy as np

from ._simarray import SIM_NUMPY, SimulatedDeviceArray, as_simulated


class CaptureError(RuntimeError):
    """Work a CUDA graph cannot hold was met while capturing (a host read, a
    host -> device copy, a shape that depends on device data)."""


_ORIGINAL = {}          # (owner, attribute) -> what it was before the capture
_INHERITED = set()      # (owner, attribute) that the owner did not hold itself
_IN_PLACE = frozenset({np.copyto, np.put, np.place, np.putmask, np.fill_diagonal,
                       np.put_along_axis})
_DATA_SHAPED = frozenset({np.nonzero, np.flatnonzero, np.argwhere, np.unique, np.compress,
                          np.extract, np.allclose, np.array_equal, np.array_equiv})
_MISSING = object()
_recording = None       # the list being recorded into, while a capture is open


def _plain(a):
    return a.view(np.ndarray) if isinstance(a, SimulatedDeviceArray) else a


def _host_read(what):
    raise CaptureError(
        f"{what} while capturing a CUDA graph: a captured step cannot read device data on "
        f"the host (on a GPU this is a synchronising copy, which stream capture refuses)")


def _fresh(result, operands):
    """The device arrays in ``result`` (an array or a tuple) that are new memory,
    not views of a device array among ``operands``."""
    arrays = result if isinstance(result, tuple) else (result,)
    return [a for a in arrays if isinstance(a, SimulatedDeviceArray) and not any(
        isinstance(o, np.ndarray) and np.may_share_memory(_plain(a), _plain(o))
        for o in operands)]


def _made(result, redo, operands):
    """Record ``redo`` (which makes ``result`` again) when ``result`` holds new
    device memory, and poison new float arrays until the replay fills them;
    host metadata and views pass through."""
    fresh = _fresh(result, operands)
    if fresh:
        _recording.append(("make", redo, result))
        for a in fresh:
            if a.dtype.kind in "fc":
                a.view(np.ndarray).fill(np.nan)
    return result


def _operands(args):
    out = []
    for a in args:
        if type(a) in (list, tuple):
            out += _operands(a)
        elif isinstance(a, np.ndarray):
            out.append(a)
    return out


# ------------------------------------------------------------------ the recording versions
def _ufunc(self, ufunc, method, *inputs, out=None, **kwargs):
    run = _ORIGINAL[SimulatedDeviceArray, "__array_ufunc__"]

    def redo():
        return run(self, ufunc, method, *inputs, out=out, **kwargs)
    if out is not None or method == "at":
        _recording.append(("do", redo))
        return None if out is None else (out[0] if len(out) == 1 else out)
    return _made(redo(), redo, ())


def _function(self, func, types, args, kwargs):
    run = _ORIGINAL[SimulatedDeviceArray, "__array_function__"]
    if func in _DATA_SHAPED:
        _host_read(f"numpy.{func.__name__} (its result depends on device data)")

    def redo():
        return run(self, func, types, args, kwargs)
    if func in _IN_PLACE or kwargs.get("out") is not None:
        _recording.append(("do", redo))
        return kwargs.get("out")
    return _made(redo(), redo, _operands(args) + _operands(kwargs.values()))


def _method(name):
    """An ndarray method that may copy (``copy``, ``astype``, ``reshape``...)."""
    base = getattr(np.ndarray, name)

    def method(self, *args, **kwargs):
        if name == "__getitem__" and _boolean_index(args[0]):
            _host_read("indexing with a boolean mask (the result's shape depends on device data)")

        def redo():
            return base(self, *args, **kwargs)
        result = redo()
        if not isinstance(result, np.ndarray):
            _host_read(f"reading element {args[0]!r} of a device array")
        return _made(as_simulated(result), lambda: as_simulated(redo()), [self])
    method.__name__ = name
    return method


def _boolean_index(key):
    keys = key if isinstance(key, tuple) else (key,)
    return any(isinstance(k, np.ndarray) and k.dtype == np.bool_ for k in keys)


def _in_place(name):
    base = getattr(np.ndarray, name)

    def method(self, *args):
        _recording.append(("do", lambda: base(self, *args)))
    method.__name__ = name
    return method


def _refused(what):
    def method(self, *args, **kwargs):
        _host_read(what)
    return method


def _make_fn(name):
    """SIM_NUMPY.zeros / full / arange / ...: new device memory with values (a
    kernel on a GPU, so recorded); ``empty`` has no values to record."""
    base = getattr(SIM_NUMPY, name)

    def make(*args, **kwargs):
        result = base(*args, **kwargs)
        return result if name == "empty" else _made(result, lambda: base(*args, **kwargs), ())
    return make


def _from(name):
    """SIM_NUMPY.array / asarray / ascontiguousarray: a device copy is recorded,
    host data refused (a host -> device copy)."""
    base = getattr(SIM_NUMPY, name)

    def make(obj, *args, **kwargs):
        if not isinstance(obj, SimulatedDeviceArray):
            _host_read(f"copying host data to the device ({name})")
        return _made(base(obj, *args, **kwargs), lambda: base(obj, *args, **kwargs), [obj])
    return make


def _launch(self, *args):
    """The simulator's kernel launch: recorded with its configuration."""
    run = _ORIGINAL[_fake_kernel(), "__call__"]
    if self._device:
        return run(self, *args)
    config = (self.grid_dim, self.block_dim, self.dynshared_size)

    def redo():
        self.grid_dim, self.block_dim, self.dynshared_size = config
        return run(self, *args)
    _recording.append(("do", redo))


def _fake_kernel():
    from numba.cuda.simulator.kernel import FakeCUDAKernel
    return FakeCUDAKernel


def _patches(backend):
    refuse = _refused
    yield SimulatedDeviceArray, "__array_ufunc__", _ufunc
    yield SimulatedDeviceArray, "__array_function__", _function
    for name in ("__getitem__", "copy", "astype", "reshape", "ravel", "flatten"):
        yield SimulatedDeviceArray, name, _method(name)
    for name in ("__setitem__", "fill"):
        yield SimulatedDeviceArray, name, _in_place(name)
    for name in ("__float__", "__int__", "__bool__", "__index__", "__complex__", "item",
                 "tolist", "get"):
        yield SimulatedDeviceArray, name, refuse(f"{name} of a device array")
    for name in ("zeros", "ones", "full", "arange", "linspace", "eye", "identity", "tri",
                 "empty"):
        yield SIM_NUMPY, name, _make_fn(name)
    for name in ("array", "asarray", "ascontiguousarray"):
        yield SIM_NUMPY, name, _from(name)
    yield _fake_kernel(), "__call__", _launch
    yield backend, "to_host", lambda *a, **k: _host_read("a device -> host copy (to_host)")
    yield backend, "to_device", lambda *a, **k: _host_read("a host -> device copy (to_device)")
    yield backend, "copy_from_host", lambda *a, **k: _host_read(
        "a host -> device copy (copy_from_host)")


# ------------------------------------------------------------------ the API
class SimulatedGraph:
    """What a simulated capture recorded; ``launch()`` runs it (a CUDA graph's replay)."""

    def __init__(self, records):
        self.records = records

    def __len__(self):
        return len(self.records)

    def launch(self, stream=None):
        for rec in self.records:
            if rec[0] == "do":
                rec[1]()
            else:
                _, redo, made = rec
                new = redo()
                for a, b in zip(made if isinstance(made, tuple) else (made,),
                                new if isinstance(new, tuple) else (new,)):
                    if isinstance(a, np.ndarray):
                        np.copyto(_plain(a), _plain(b))


def begin(backend):
    """Start capturing the simulated device's work (one capture at a time)."""
    global _recording
    if _recording is not None:
        raise RuntimeError("a simulated CUDA graph capture is already open")
    for owner, name, fn in list(_patches(backend)):
        # the attribute as the owner itself holds it; an inherited one (ndarray's
        # methods, the backend class's) is deleted again at the end
        own = vars(owner).get(name, _MISSING)
        _ORIGINAL[owner, name] = getattr(owner, name) if own is _MISSING else own
        if own is _MISSING:
            _INHERITED.add((owner, name))
        setattr(owner, name, fn)
    _recording = []


def end():
    """Stop capturing; the SimulatedGraph of what was recorded."""
    global _recording
    records, _recording = _recording, None
    for owner, name in list(_ORIGINAL):
        original = _ORIGINAL.pop((owner, name))
        if (owner, name) in _INHERITED:
            delattr(owner, name)
        else:
            setattr(owner, name, original)
    _INHERITED.clear()
    if records is None:
        raise RuntimeError("no simulated CUDA graph capture is open")
    return SimulatedGraph(records)


def capturing():
    return _recording is not None

