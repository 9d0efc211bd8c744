"""The Tensor: a typed, strided view over a storage, with an autograd hook.

Storage is a NumPy array on ``cpu``.  A tensor's ``_data`` is a NumPy view of
that storage, so shape, strides (in elements) and offset are NumPy's, and view
ops (``view``, ``transpose``, slicing, ``expand``...) share memory exactly as
in PyTorch.  Views also share ``_version``, a one-element list that in-place
ops bump; autograd compares it with the version seen when a tensor was saved.

Ops are defined in ``pyflow/ops/*`` and attached here as methods by
``pyflow.ops._method.tensor_method``; this file holds only what is about the
tensor object itself.
"""
import builtins
import weakref

import numpy as np

from . import dtypes as _dt
from ._hooks import HOOKS
from ._hooks import _state as _trace
from ._print import format_tensor
from .device import CPU, as_device, backend_of, check_available
from .kernels.registry import get as _kernel

__all__ = ["Tensor", "Size"]


# Exact classes that are tensors (Tensor and its subclasses register here), so
# hot paths can test ``type(x) in TENSOR_TYPES`` instead of a slower isinstance.
TENSOR_TYPES = set()


def parse_to_args(args, dtype=None, device=None):
    """The (dtype, device) asked for by ``.to(*args)``: dtypes, devices or a Tensor."""
    for a in args:
        if isinstance(a, Tensor):
            dtype, device = a.dtype, a.device
        elif type(a) is _dt.dtype:
            dtype = a
        elif isinstance(a, (str, int)) or type(a).__name__ == "device":
            device = a
        else:
            raise TypeError(f"to(): expected a dtype, a device or a Tensor, got {a!r}")
    return dtype, device


def _pointer(array):
    """Address of an array's first element (host or device memory)."""
    face = getattr(array, "__array_interface__", None) or array.__cuda_array_interface__
    return face["data"][0]


def _check_storage(data, dtype, device):
    """Internal check that storage is on the tensor's device: a host array must
    never silently become cuda storage (on a GPU, CuPy would refuse it later, far
    from the bug), nor device memory cpu storage.  Under numba's simulator cuda
    storage is a ``SimulatedDeviceArray`` (pyflow/_simarray.py), so CI catches ops
    that do host NumPy math on cuda data.  What each device holds is its backend's
    answer (pyflow/device.py).  Only reached for non-cpu devices or non-ndarray
    data, so the cpu path costs one type comparison."""
    backend = backend_of(device)
    if backend.owns(data):
        return              # host memory includes ndarray subclasses (memmap...) and 0-d results
    raise RuntimeError(
        f"pyflow internal error: a {dtype} tensor on device '{device}' must hold "
        f"{backend.storage}, got {type(data).__module__}.{type(data).__name__}"
        f"{f' of shape {data.shape}' if hasattr(data, 'shape') else ''}; an op built its "
        f"result on the wrong device (use the data's array module or a registered kernel)")


_new = object.__new__


def host_tensor(data, dtype, device):
    """``Tensor._make(data, dtype, device)`` for ``data`` a host ndarray in
    ``dtype.storage`` that no other tensor holds (a kernel's result, not a view
    of a tensor): the ops' fast paths build their results with it,
    skipping ``_make``'s storage check and default arguments (a fifth of a small
    op's time).  They run only while the calling thread traces no graph: the tracer
    hooks ``_make`` to see every tensor made at the top of ``build()``."""
    t = _new(Tensor)
    t._data = data
    t.dtype = dtype
    t.device = device
    t.requires_grad = False
    t.grad = t.grad_fn = t._accumulator = t._hooks = t._base = None
    t._out_idx = 0
    t._version = [0]
    return t


class Size(tuple):
    """torch.Size: a tuple of ints."""

    def numel(self):
        n = 1
        for s in self:
            n *= s
        return n

    def __repr__(self):
        return f"pyflow.Size([{', '.join(str(s) for s in self)}])"


class Tensor:
    __slots__ = ("_data", "dtype", "device", "requires_grad", "grad", "grad_fn", "_out_idx",
                 "_version", "_base", "_accumulator", "_hooks", "__weakref__", "__dict__")
    __array_priority__ = 1000  # so ndarray (op) Tensor defers to Tensor
    # A global tensor (pyflow/distributed/global_tensor.py) sets these on the
    # object: ``_data`` is then this rank's piece and ``shape`` the logical shape.
    _placement = None
    _sbp = None
    _logical_shape = None

    def __init__(self, *args, **kwargs):
        raise TypeError("use pyflow.tensor(data), pyflow.empty(shape) or other creation ops "
                        "to build a Tensor")

    # ------------------------------------------------------------- creation
    @classmethod
    def _make(cls, data, dtype, device=CPU, requires_grad=False, base=None):
        """Wrap a NumPy array (already in ``dtype.storage``) without copying."""
        if type(data) is not np.ndarray or device is not CPU and device.type != "cpu":
            _check_storage(data, dtype, device)
        t = object.__new__(cls)
        t._data = data
        t.dtype = dtype
        t.device = device
        t.requires_grad = requires_grad
        t.grad = None
        t.grad_fn = None
        t._out_idx = 0
        t._accumulator = None
        t._hooks = None
        if base is None:
            t._version = [0]
            t._base = None
        else:  # a view: same storage, same version counter
            t._version = base._version
            t._base = base if base._base is None else base._base
        return t

    def _view_of(self, data):
        """A new tensor viewing ``data`` (a view of this tensor's storage)."""
        if _trace.tracer is not None or type(data) is not np.ndarray \
                or type(self._data) is not np.ndarray:
            # the tracer hooks _make to see identity views; device data is checked there
            return Tensor._make(data, self.dtype, self.device, base=self)
        t = _new(Tensor)            # _make's work for a host view, without the call
        t._data = data
        t.dtype = self.dtype
        t.device = self.device
        t.requires_grad = False
        t.grad = t.grad_fn = t._accumulator = t._hooks = None
        t._out_idx = 0
        t._version = self._version
        base = self._base
        t._base = self if base is None else base
        return t

    # ------------------------------------------------------------- metadata
    @property
    def shape(self):
        """The (logical) shape: for a global tensor the whole tensor's, not the piece's."""
        ls = self._logical_shape
        return Size(self._data.shape if ls is None else ls)

    def size(self, dim=None):
        ls = self._logical_shape
        shape = self._data.shape if ls is None else ls
        if dim is None:
            return Size(shape)
        return shape[self._wrap_dim(dim)]

    @property
    def ndim(self):
        return self._data.ndim

    def dim(self):
        return self._data.ndim

    def numel(self):
        ls = self._logical_shape
        if ls is None:
            return self._data.size
        n = 1
        for s in ls:
            n *= s
        return n

    nelement = numel

    def element_size(self):
        return self.dtype.itemsize

    def stride(self, dim=None):
        st = tuple(s // self._data.itemsize for s in self._data.strides)
        return st if dim is None else st[self._wrap_dim(dim)]

    def storage_offset(self):
        root, kind = self._data, type(self._data)
        while isinstance(root.base, kind):
            root = root.base
        return (_pointer(self._data) - _pointer(root)) // self._data.itemsize

    def data_ptr(self):
        return _pointer(self._data)

    def is_contiguous(self):
        return self._data.flags.c_contiguous

    @property
    def is_leaf(self):
        return self.grad_fn is None

    @property
    def is_cuda(self):
        return self.device.type == "cuda"

    def is_floating_point(self):
        return self.dtype.is_floating_point

    def _wrap_dim(self, dim, ndim=None):
        n = self._data.ndim if ndim is None else ndim
        if not isinstance(dim, (int, np.integer)) or isinstance(dim, bool):
            raise TypeError(f"dim: expected an int, got {dim!r}")
        lo, hi = (-n, n - 1) if n > 0 else (-1, 0)
        if dim < lo or dim > hi:
            raise IndexError(f"dim: out of range (expected to be in range of [{lo}, {hi}], "
                             f"but got {dim}) for a tensor of {n} dimensions")
        return int(dim) % n if n > 0 else 0

    # ------------------------------------------------------------- data access
    def _compute(self):
        """The data as an array of ``dtype.compute`` (float32 for half types), on
        the tensor's device."""
        d = self.dtype
        if d.storage is d.compute:
            return self._data
        return self._as_float32()

    def _as_float32(self):
        return _kernel("cast", self.device.type)(self._data, self.dtype, _dt.float32)

    def _host(self):
        """``_compute()`` as a host NumPy array (a copy for device tensors)."""
        if self.device.type == "cpu":
            return self._compute()
        return self.to("cpu")._compute()

    def numpy(self, force=False):
        if self.device.type != "cpu":
            raise TypeError(f"can't convert {self.device} device type tensor to numpy. Use "
                            f"Tensor.cpu() to copy the tensor to host memory first.")
        if self.requires_grad and not force:
            raise RuntimeError("Can't call numpy() on a Tensor that requires grad. "
                               "Use tensor.detach().numpy() instead.")
        if self.dtype is _dt.bfloat16:
            raise TypeError("numpy() has no bfloat16 dtype; use tensor.float().numpy()")
        return self._data

    def __array__(self, dtype=None, copy=None):
        a = self._host() if self.dtype is _dt.bfloat16 or self.device.type != "cpu" \
            else self._data
        return a if dtype is None else a.astype(dtype)

    def item(self):
        if self._data.size != 1:
            raise RuntimeError(f"a Tensor with {self._data.size} elements cannot be converted "
                               f"to Scalar (item() needs exactly one element)")
        v = self._host().reshape(-1)[0]
        return v.item()

    def tolist(self):
        return self._host().tolist()

    def __len__(self):
        if self._data.ndim == 0:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __iter__(self):
        if self._data.ndim == 0:
            raise TypeError("iteration over a 0-d tensor")
        return (self[i] for i in range(self._data.shape[0]))

    def __bool__(self):
        if self._data.size != 1:
            raise RuntimeError(f"Boolean value of Tensor with {self._data.size} elements is "
                               f"ambiguous")
        return builtins.bool(self.item())

    def __float__(self):
        return builtins.float(self.item())

    def __int__(self):
        return builtins.int(self.item())

    def __index__(self):
        if self.dtype.category != 1 or self._data.size != 1:
            raise TypeError("only integer tensors of a single element can be converted to an index")
        return builtins.int(self.item())

    __hash__ = object.__hash__

    # ------------------------------------------------------------- autograd
    @property
    def data(self):
        return self.detach()

    @data.setter
    def data(self, other):
        if not isinstance(other, Tensor):
            raise TypeError(f"data: expected a Tensor, got {type(other).__name__}")
        self._data, self.dtype, self.device = other._data, other.dtype, other.device
        if other._placement is not None or self._placement is not None:   # global or not
            self._placement, self._sbp, self._logical_shape = \
                other._placement, other._sbp, other._logical_shape

    def detach(self):
        """The same storage and version counter, out of autograd.  Unlike a view
        it keeps no reference to ``self`` (PyTorch's detach neither): through
        ``self.grad_fn`` that would keep a whole autograd graph, and the
        activations its leaves hold, alive for as long as the result lives (a
        loss kept for logging, a graph step's outputs)."""
        t = Tensor._make(self._data, self.dtype, self.device)
        t._version = self._version
        if self._placement is not None:
            t._placement, t._sbp, t._logical_shape = \
                self._placement, self._sbp, self._logical_shape
        return t

    def detach_(self):
        self.grad_fn = None
        self.requires_grad = False
        return self

    def requires_grad_(self, requires_grad=True):
        if requires_grad and not self.dtype.is_floating_point:
            raise RuntimeError(f"only Tensors of floating point dtype can require gradients "
                               f"(got {self.dtype})")
        if not requires_grad and self.grad_fn is not None:
            raise RuntimeError("requires_grad_(False) on a non-leaf tensor; use detach()")
        self.requires_grad = requires_grad
        return self

    def register_hook(self, hook):
        """Call ``hook(grad)`` when this tensor's gradient is computed; it may
        return a replacement gradient."""
        if not self.requires_grad:
            raise RuntimeError("cannot register a hook on a tensor that doesn't require gradient")
        if self.grad_fn is None:
            self._hooks = (self._hooks or []) + [hook]
        else:
            node = self.grad_fn
            node.hooks = node.hooks or {}
            node.hooks.setdefault(self._out_idx, []).append(hook)
        return hook

    def retain_grad(self):
        if self.grad_fn is None:
            return
        ref = weakref.ref(self)

        def keep(g):
            t = ref()
            if t is not None:
                t.grad = g.detach() if t.grad is None else t.grad + g.detach()
        self.register_hook(keep)

    def backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
        if inputs is not None:        # autograd's functions (pyflow/_hooks.py)
            grads = HOOKS.grad(self, inputs, gradient, retain_graph, create_graph,
                                  allow_unused=True)
            taken = set()             # one gradient can reach several inputs (a + b)
            for t, g in zip(inputs, grads):
                if g is None:
                    continue
                if t.grad is not None:
                    t.grad = t.grad + g
                elif create_graph:
                    t.grad = g
                elif id(g._data) in taken or g._data.base is not None or gradient is not None:
                    t.grad = g.detach().clone()     # never share another tensor's storage
                else:
                    taken.add(id(g._data))
                    t.grad = g.detach()
            return
        HOOKS.backward(self, gradient, retain_graph, create_graph)

    # ------------------------------------------------------------- conversion
    def to(self, *args, dtype=None, device=None, copy=False, non_blocking=False):
        dtype, device = parse_to_args(args, dtype, device)
        out = self                        # the conversions are ops (pyflow/_hooks.py)
        if dtype is not None:
            dtype = _dt.as_dtype(dtype)
            if dtype is not self.dtype:
                out = HOOKS.cast(out, dtype)
        if device is not None:
            dev = as_device(device)
            if dev != self.device:
                check_available(dev)
                out = HOOKS.to_device(out, dev)
        if copy and out is self:
            out = HOOKS.clone(self)
        return out

    def type(self, dtype=None):
        if dtype is None:
            return "pyflow." + {"float32": "FloatTensor", "float64": "DoubleTensor",
                                "float16": "HalfTensor", "bfloat16": "BFloat16Tensor",
                                "int32": "IntTensor", "int64": "LongTensor",
                                "bool": "BoolTensor"}[self.dtype.name]
        return self.to(dtype)

    def float(self): return self.to(_dt.float32)
    def double(self): return self.to(_dt.float64)
    def half(self): return self.to(_dt.float16)
    def bfloat16(self): return self.to(_dt.bfloat16)
    def int(self): return self.to(_dt.int32)
    def long(self): return self.to(_dt.int64)
    def bool(self): return self.to(_dt.bool)

    def cpu(self):
        return self.to("cpu")

    def cuda(self, device=None):
        return self.to("cuda" if device is None else as_device(device))

    def pin_memory(self, device=None):
        """This CPU tensor itself (accepted so PyTorch code runs).  PyTorch copies
        it into page-locked memory so that host-to-device copies can run
        asynchronously; pyflow's copies to the device are synchronous whatever
        the memory (CuPy from pageable memory), and the transfers that do go
        through page-locked memory (MPI staging when MPI is not CUDA-aware) use
        reused buffers of pyflow's own.  ``is_pinned()`` stays False."""
        if self.device.type != "cpu":
            raise RuntimeError(f"pin_memory(): cannot pin a {self.device} tensor: only CPU "
                               f"tensors can be pinned")
        return self

    def is_pinned(self, device=None):
        """False: pyflow never page-locks a tensor's own memory (``pin_memory``)."""
        return False

    # ------------------------------------------------------------- printing
    def __repr__(self):
        return format_tensor(self)

    __str__ = __repr__

    def __format__(self, spec):
        if self._data.ndim == 0 and spec:
            return format(self.item(), spec)
        return repr(self)

    def __reduce_ex__(self, proto):
        if self.device.type == "cpu":
            return (rebuild_tensor, (np.array(self._data), self.dtype.name, self.requires_grad))
        # Device memory is pickled as a host copy and moved back when unpickled.
        host = _kernel("to_host", self.device.type)(self._data)
        return (_rebuild_on_device, (host, self.dtype.name, self.requires_grad, str(self.device)))


def _rebuild_on_device(array, dtype_name, requires_grad, device):
    """Unpickle a device tensor: rebuilt on the host, then copied to ``device``."""
    t = rebuild_tensor(array, dtype_name, False).to(device)
    return t.requires_grad_(True) if requires_grad else t


def rebuild_tensor(array, dtype_name, requires_grad):
    """A tensor of pyflow dtype ``dtype_name`` over ``array`` (its storage
    array: uint16 words for bfloat16).  Used by ``load`` and by unpickling."""
    try:
        dtype = _dt._by_name(dtype_name)
    except KeyError:
        raise TypeError(f"_rebuild_tensor: unknown dtype {dtype_name!r}; expected one of "
                        f"{[d.name for d in _dt.ALL]}") from None
    arr = np.asarray(array)
    if arr.dtype != dtype.storage:
        raise TypeError(f"_rebuild_tensor: a {dtype_name} tensor is stored as "
                        f"{dtype.storage}, got an array of {arr.dtype}")
    if not arr.flags.writeable or not arr.flags.c_contiguous:
        arr = np.array(arr, copy=True)
    t = Tensor._make(arr, dtype)
    if requires_grad:
        t.requires_grad_(True)
    return t


TENSOR_TYPES.add(Tensor)
