"""Simulated device memory that is as strict as CuPy's.

Why this exists: on a GPU, cuda tensors hold CuPy arrays, and CuPy refuses to
mix them with host memory implicitly (``np.asarray(cupy_array)`` and
``cupy_array + numpy_array`` raise TypeError), while a NumPy function called
on a CuPy array either fails or, worse, computes on the host.  Under numba's
simulator (NUMBA_ENABLE_CUDASIM=1, how CI runs the cuda device) device memory
is NumPy memory, so an op that does host NumPy math on a cuda tensor's data
passes every simulated test and breaks on the first real GPU.

``SimulatedDeviceArray`` is the simulator's device array: a NumPy subclass
(so numba's simulator kernels take it like any array) that behaves like CuPy
where host and device meet:

- ufuncs and NumPy functions work among device arrays, Python/NumPy scalars
  and 0-d arrays and return device arrays (reductions return 0-d device
  arrays, as in CuPy), but raise TypeError when a plain host ndarray with
  dimensions is mixed in;
- a CPU numba ``@njit`` function refuses it with a TypeError, as it cannot
  read GPU memory (``__numba_array_subtype_dispatch__`` sends typing to
  ``typeof_impl``, registered here to raise);
- ``SIM_NUMPY`` stands in for the ``cupy`` module: its creation functions
  (``zeros``, ``asarray``, ``arange``...) make device arrays, everything else
  is NumPy's (which keeps device arrays device arrays, see above).

``np.asarray(device_array)`` cannot be intercepted for an ndarray subclass (it
returns a host view); such a host array is still caught as soon as it meets a
device array in a ufunc or becomes a cuda tensor's storage (``Tensor._make``
checks).  None of this exists outside the simulator.

Why it lives here, at the device level, and not in ``kernels/cuda``: the
simulated cuda backend (``pyflow/device.py``) makes these arrays (``empty``,
``zeros``, host -> device copies) and ``backend_of_array`` recognises them,
and the device layer sits below ``kernels/``, so it cannot import a kernel
module.  ``pyflow.device`` imports this module only when the simulated backend
is first built (it imports numba), so a CPU-only process never loads it.
``kernels/cuda/_simarray.py`` re-exports it under its old name.
"""
import numbers

import numpy as np
from numba.core.typing.typeof import typeof_impl

__all__ = ["SimulatedDeviceArray", "SIM_NUMPY", "as_simulated", "is_simulated_array"]


def _host_operand(x):
    """True for the operands CuPy refuses: host arrays with dimensions."""
    return isinstance(x, np.ndarray) and x.ndim > 0 and not isinstance(x, SimulatedDeviceArray)


def _refuse(what, x):
    raise TypeError(
        f"{what}: a host NumPy array (shape {x.shape}, dtype {x.dtype}) was mixed with a cuda "
        f"device array; on a GPU this is a CuPy array and CuPy refuses implicit host/device "
        f"mixing.  Use the array module of the data (backend_of_array(data).xp in "
        f"pyflow/device.py), a "
        f"registered kernel, or an explicit to_device/to_host copy")


def _check(what, values):
    for x in values:
        if type(x) in (list, tuple):          # np.concatenate([a, b]), np.stack((a, b))...
            _check(what, x)
        elif _host_operand(x):
            _refuse(what, x)


def _plain(x):
    if isinstance(x, SimulatedDeviceArray):
        return x.view(np.ndarray)
    if type(x) in (list, tuple):
        return type(x)(_plain(v) for v in x)
    return x


def as_simulated(x):
    """``x`` (a NumPy array, scalar or a tuple/list of them) as device arrays."""
    if isinstance(x, SimulatedDeviceArray):
        return x
    if isinstance(x, np.ndarray):
        return x.view(SimulatedDeviceArray)
    if isinstance(x, (np.generic, numbers.Number)) and not isinstance(x, (str, bytes)):
        return np.asarray(x).view(SimulatedDeviceArray)
    if type(x) in (list, tuple):
        return type(x)(as_simulated(v) for v in x)
    return x


def is_simulated_array(x):
    return isinstance(x, SimulatedDeviceArray)


class SimulatedDeviceArray(np.ndarray):
    """A NumPy array standing for GPU memory under numba's simulator (see the module
    docstring)."""

    # How ``pyflow.device.backend_of_array`` tells it from host NumPy memory
    # without importing this module (and numba) in processes that never simulate.
    _pyflow_simulated_device = True

    def __array_ufunc__(self, ufunc, method, *inputs, out=None, **kwargs):
        what = f"numpy.{ufunc.__name__}" + ("" if method == "__call__" else f".{method}")
        _check(what, inputs)
        if out is not None:
            _check(what, out)
            kwargs["out"] = tuple(_plain(o) for o in out)
        result = getattr(ufunc, method)(*(_plain(x) for x in inputs), **kwargs)
        if out is not None:
            return out[0] if len(out) == 1 else out
        if method == "at":
            return None
        return as_simulated(result)

    def __array_function__(self, func, types, args, kwargs):
        what = f"numpy.{func.__name__}"
        _check(what, args)
        _check(what, kwargs.values())
        out = kwargs.get("out")
        result = func(*_plain(args), **{k: _plain(v) for k, v in kwargs.items()})
        if out is not None:
            return out
        if func is np.copyto or result is None:
            return result
        if isinstance(result, (bool, int, float, complex, str)) or func.__name__ in _HOST_RESULTS:
            return result                      # metadata (shapes, flags), as in CuPy
        return as_simulated(result)

    # numba's dispatcher types ndarray subclasses as plain arrays in C unless
    # this attribute is set; with it, typing goes through ``typeof_impl``
    # (registered below to refuse).
    __numba_array_subtype_dispatch__ = True

    @property
    def _numba_type_(self):
        raise TypeError(
            f"a cuda device array (shape {self.shape}, dtype {self.dtype}) was passed to a CPU "
            f"numba function; on a GPU this is CuPy memory the CPU cannot read.  Call the cuda "
            f"kernel (kernel(name, x.device.type)) or copy it to the host first")

    def get(self):
        """CuPy's device -> host copy."""
        return np.array(self, copy=True, subok=False)

    def __reduce_ex__(self, proto):
        raise TypeError("a cuda device array cannot be pickled directly; copy it to the host "
                        "(to_host / Tensor.cpu()) first")


@typeof_impl.register(SimulatedDeviceArray)
def _refuse_in_njit(value, context):
    return value._numba_type_          # raises TypeError


# NumPy functions whose results are metadata, not data (no device array to make).
_HOST_RESULTS = frozenset({"shape", "ndim", "size", "result_type", "may_share_memory",
                           "shares_memory", "iscomplexobj", "isrealobj", "array_equal",
                           "array_equiv", "allclose"})


class _SimNumpy:
    """The simulator's stand-in for the ``cupy`` module (see the module docstring)."""

    __name__ = "pyflow_simulated_cupy"

    def __getattr__(self, name):
        return getattr(np, name)

    @staticmethod
    def _made(fn):
        def make(*args, **kwargs):
            _check(f"numpy.{fn.__name__}", args)
            return as_simulated(fn(*_plain(args), **kwargs))
        make.__name__ = fn.__name__
        return make


def _host_to_device(fn):
    """cupy.array / cupy.asarray: host data is copied to the device (allowed)."""
    def make(obj, *args, **kwargs):
        return as_simulated(fn(_plain(obj), *args, **kwargs))
    make.__name__ = fn.__name__
    return make


SIM_NUMPY = _SimNumpy()
for _name in ("empty", "zeros", "ones", "full", "arange", "linspace", "eye", "identity", "tri"):
    setattr(SIM_NUMPY, _name, _SimNumpy._made(getattr(np, _name)))
for _name in ("array", "asarray", "ascontiguousarray"):
    setattr(SIM_NUMPY, _name, _host_to_device(getattr(np, _name)))
