"""Elementwise CUDA kernels generated from the scalar definitions in ``kernels/scalar.py``.

Every scalar function becomes a ``@cuda.jit(device=True)`` function, called
from one of two generated ``@cuda.jit`` kernels, both grid-stride loops over
the flat (C-order) output:

* ``contiguous``: every operand is one dense run of the same length, so
  element ``i`` of the output reads element ``i`` of each input (no index math);
* ``strided``: each operand (output included) gets its element strides over
  the output's shape (0 along broadcast dimensions) and the element offset of
  its first element; the flat index is unravelled once per element and dotted
  with each operand's strides.  Shapes and strides travel as tuples, so numba
  specialises the kernel per number of dimensions and unrolls the loop.

Before launching, dimensions of size 1 are dropped and neighbouring dimensions
that are contiguous in every operand are merged (as PyTorch's TensorIterator
does), so most non-broadcast inputs take the contiguous kernel and the strided
one rarely sees more than 2-3 dimensions.  Operands reach the kernel as 1-D
views of the memory they span, which works alike for NumPy arrays (simulator)
and for any ``__cuda_array_interface__`` object (a real GPU).

dtypes: float32, float64, int32, int64 and bool as each op's kind allows, and
float16, which is loaded, computed in float32 and stored back as float16.
bfloat16 has no kernels here: numba's simulator has no bf16 type, so these
kernels could not be tested without a GPU (ops compute bf16 in float32).

float32 kernels use the float32 clone of each scalar function
(``activation.float32_version``): Python float literals would otherwise make
numba compute float32 data in float64, which is 2x-64x slower on a GPU.

Kernels are compiled lazily, once per (op, dtype, layout), and cached.
"""
import collections
import functools
import math
import types as _pytypes

import numpy as np
from numba import cuda
from numba import types as nbtypes

from .. import scalar
from ..cpu.activation import float32_version
from ..registry import register
from ._memory import MAX_BLOCKS, THREADS_PER_BLOCK, empty, launch_config, to_device  # noqa: F401
from . import layout
from ._memory import stream as _current_stream


def _stream(stream):
    return _current_stream() if stream is None else stream

# name -> (scalar function, kind, number of inputs)
OPS = {name: (fn, kind, fn.__code__.co_argcount)
       for table in (scalar.UNARY, scalar.BINARY, scalar.TERNARY)
       for name, (fn, kind) in table.items()}

_NUMERIC = tuple(np.dtype(t) for t in (np.float16, np.float32, np.float64, np.int32, np.int64))
_FLOATS = tuple(np.dtype(t) for t in (np.float16, np.float32, np.float64))
_BOOL = np.dtype(np.bool_)
# The input dtypes each kind of op has kernels for (the dtype of the values; the
# condition of ``where`` is always bool).  Mirrors what the CPU ufuncs accept.
DTYPES = {"arith": _NUMERIC + (_BOOL,), "float": _FLOATS, "compare": _NUMERIC + (_BOOL,),
          "logical": _NUMERIC + (_BOOL,), "select": _NUMERIC + (_BOOL,)}
_NUMBA_TYPE = {np.dtype(np.float16): nbtypes.float16, np.dtype(np.float32): nbtypes.float32,
               np.dtype(np.float64): nbtypes.float64, np.dtype(np.int32): nbtypes.int32,
               np.dtype(np.int64): nbtypes.int64, _BOOL: nbtypes.boolean}
LAYOUTS = ("contiguous", "strided")
# PyTorch rejects these on bool (NumPy's bool scalars, which the simulator
# computes with, reject neg and sub too), so there are no bool kernels for them.
_NO_BOOL = ("neg", "sub", "floor_divide", "remainder")


def supported_dtypes(name):
    """The input dtypes op ``name`` has CUDA kernels for."""
    dtypes = DTYPES[_op(name)[1]]
    return tuple(d for d in dtypes if d != _BOOL) if name in _NO_BOOL else dtypes


def result_dtype(name, dtype):
    """The output dtype of op ``name`` on inputs of ``dtype``."""
    return _BOOL if _op(name)[1] in ("compare", "logical") else np.dtype(dtype)


def _op(name):
    try:
        return OPS[name]
    except KeyError:
        raise ValueError(f"unknown elementwise op {name!r}; known: {sorted(OPS)}") from None


# ------------------------------------------------------------------ device functions
# math with float32 inf/nan, so ``-math.inf`` in a float32 clone stays float32.
_math32 = _pytypes.ModuleType("pyflow_cuda_math32")
_math32.__dict__.update(math.__dict__)
for _c in ("inf", "nan", "pi", "e", "tau"):
    setattr(_math32, _c, np.float32(getattr(math, _c)))


def _float32_clone(fn):
    """``fn`` with float32 constants (reusing the CPU backend's float32 clone) and
    CUDA's own math functions (libdevice) instead of the CPU's fast_exp/fast_erf.

    Integer literals become float32 too: relu's ``0 if x < 0 else x`` would
    otherwise join int64 with float32, which numba types as float64.  The scalar
    functions only use integer literals as arithmetic operands or as a zero
    result, so this is safe for them.
    """
    clone = float32_version(fn).py_func          # njit is lazy: nothing compiles here
    code = clone.__code__
    code = code.replace(co_consts=tuple(np.float32(c) if type(c) is int else c
                                        for c in code.co_consts))
    globs = dict(clone.__globals__, math=_math32)
    return _pytypes.FunctionType(code, globs, clone.__name__, clone.__defaults__,
                                 clone.__closure__)


def _widened(dev, nin):
    """Device function computing float16 data in float32 (exact widening)."""
    f32 = np.float32
    if nin == 1:
        def op(a): return dev(f32(a))
    elif nin == 2:
        def op(a, b): return dev(f32(a), f32(b))
    else:
        def op(a, b, c): return dev(f32(a), f32(b), f32(c))
    return cuda.jit(device=True)(op)


def device_function(name, dtype):
    """A new ``@cuda.jit(device=True)`` function computing op ``name`` on ``dtype`` inputs."""
    fn, kind, nin = _op(name)
    dtype = np.dtype(dtype)
    if dtype.kind == "i":
        fn = scalar.INTEGER.get(name, fn)
    if dtype in _FLOATS and dtype != np.float64 and kind != "select":
        dev = cuda.jit(device=True)(_float32_clone(fn))
        return _widened(dev, nin) if dtype == np.float16 else dev
    return cuda.jit(device=True)(fn)


# ------------------------------------------------------------------ kernel generation
def _kernel_source(nin, layout):
    """Python source of a grid-stride kernel calling ``op`` on ``nin`` inputs.

    For nin=2, layout="strided" it reads::

        def kernel(out, n, shape, out_st, out_off, a0, a0_st, a0_off, a1, a1_st, a1_off):
            for i in range(cuda.grid(1), n, cuda.gridsize(1)):
                rem = i
                p_out = out_off; p0 = a0_off; p1 = a1_off
                for d in range(len(shape) - 1, -1, -1):
                    q = rem // shape[d]
                    j = rem - q * shape[d]
                    rem = q
                    p_out += j * out_st[d]; p0 += j * a0_st[d]; p1 += j * a1_st[d]
                out[p_out] = op(a0[p0], a1[p1])
    """
    return kernel_source([False] * nin, layout)


def kernel_source(scalars, layout):
    """The grid-stride kernel source for operands ``a0, a1, ...``; an operand
    whose ``scalars`` flag is set is a number passed by value (``s<k>``).
    Shared with the fused kernels of ``fused.py``."""
    n = len(scalars)
    if layout == "contiguous":
        params = ", ".join(f"s{k}" if s else f"a{k}" for k, s in enumerate(scalars))
        call = ", ".join(f"s{k}" if s else f"a{k}[i]" for k, s in enumerate(scalars))
        return (f"def kernel(out, {params}):\n"
                f"    for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):\n"
                f"        out[i] = op({call})\n")
    arrays = [k for k in range(n) if not scalars[k]]
    params = ", ".join(f"s{k}" if scalars[k] else f"a{k}, a{k}_st, a{k}_off" for k in range(n))
    starts = "; ".join(f"p{k} = a{k}_off" for k in arrays)
    steps = "; ".join(f"p{k} += j * a{k}_st[d]" for k in arrays)
    call = ", ".join(f"s{k}" if scalars[k] else f"a{k}[p{k}]" for k in range(n))
    return (f"def kernel(out, n, shape, out_st, out_off, {params}):\n"
            f"    for i in range(cuda.grid(1), n, cuda.gridsize(1)):\n"
            f"        rem = i\n"
            f"        p_out = out_off; {starts}\n"
            f"        for d in range(len(shape) - 1, -1, -1):\n"
            f"            q = rem // shape[d]\n"
            f"            j = rem - q * shape[d]\n"
            f"            rem = q\n"
            f"            p_out += j * out_st[d]; {steps}\n"
            f"        out[p_out] = op({call})\n")


def kernel_function(name, dtype, layout):
    """The plain Python function of op ``name``'s kernel (not yet ``cuda.jit``-ed),
    with fresh device functions; ``compile_ptx`` takes this."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    nin = _op(name)[2]
    namespace = {"cuda": cuda, "op": device_function(name, dtype)}
    exec(compile(_kernel_source(nin, layout), f"<cuda {layout} kernel {name}>", "exec"),
         namespace)
    kernel = namespace["kernel"]
    kernel.__name__ = f"{name}_{np.dtype(dtype).name}_{layout}"
    return kernel


def kernel_signature(name, dtype, layout, ndim=3):
    """The numba argument types of a kernel (``ndim`` only matters for ``strided``)."""
    fn, kind, nin = _op(name)
    t = _NUMBA_TYPE[np.dtype(dtype)]
    out = _NUMBA_TYPE[result_dtype(name, dtype)][::1]
    ins = [t[::1]] * nin
    if kind == "select":
        ins[0] = nbtypes.boolean[::1]
    if layout == "contiguous":
        return (out, *ins)
    dims = nbtypes.UniTuple(nbtypes.int64, ndim)
    args = [out, nbtypes.int64, dims, dims, nbtypes.int64]
    for a in ins:
        args += [a, dims, nbtypes.int64]
    return tuple(args)


def specs():
    """Every (op, dtype, layout) this module generates a kernel for."""
    return [(name, dtype, layout) for name in OPS for dtype in supported_dtypes(name)
            for layout in LAYOUTS]


@functools.lru_cache(maxsize=None)
def _kernel(name, dtype, layout):
    """The compiled kernel, built on first use of (op, dtype, layout)."""
    return cuda.jit(kernel_function(name, dtype, layout))


_Plan = collections.namedtuple("_Plan", "n dtype contiguous shape strides offsets geometries")
_plans = {}
_MAX_PLANS = 4096        # distinct layouts remembered (then forgotten all at once)


def _launch_plan(name, out_desc, described):
    """Everything ``launch`` derives from the operands' layouts alone (checks,
    broadcast shape, element strides, coalesced dims, span geometry, which
    kernel), for (shape, strides, dtype) of ``out`` and of each input.  Raises
    the op's error for a bad combination (nothing is kept then)."""
    fn, kind, nin = _op(name)
    if len(described) != nin:
        raise TypeError(f"{name}: expected {nin} input array(s), got {len(described)}")
    out_shape, out_strides, out_dtype = out_desc
    values = described[1:] if kind == "select" else described
    dtype = values[0][2]
    if any(d[2] != dtype for d in values):
        raise TypeError(f"{name}: inputs must share one dtype, got "
                        f"{[str(d[2]) for d in values]}")
    if kind == "select" and described[0][2] != _BOOL:
        raise TypeError(f"{name}: condition must be bool, got {described[0][2]}")
    if dtype not in supported_dtypes(name):
        raise TypeError(f"{name}: no CUDA kernel for dtype {dtype}; supported: "
                        f"{[str(d) for d in supported_dtypes(name)]}")
    if out_dtype != result_dtype(name, dtype):
        raise TypeError(f"{name}: out must have dtype {result_dtype(name, dtype)} for "
                        f"{dtype} inputs, got {out_dtype}")
    shape = np.broadcast_shapes(*(d[0] for d in described))
    if shape != tuple(out_shape):
        raise ValueError(f"{name}: out has shape {tuple(out_shape)} but the inputs "
                         f"broadcast to {shape}")
    n = math.prod(shape)
    if n == 0:
        return _Plan(0, dtype, True, (), [], [], [])
    operands = [out_desc] + list(described)
    geometries, offsets, strides = [], [], []
    for i, (s, st, dt) in enumerate(operands):
        geometry = layout.span_geometry(s, st, dt)
        geometries.append(geometry)
        offsets.append(geometry[1] // dt.itemsize)
        strides.append(layout.element_strides(s, st, dt, shape,
                                              "out" if i == 0 else f"input {i - 1}"))
    if any(st == 0 for st, m in zip(strides[0], shape) if m > 1):
        raise ValueError(f"{name}: out must not be a broadcast (expanded) view")
    shape, strides = layout.coalesce(list(shape), strides)
    contiguous = len(shape) <= 1 and all(off == 0 for off in offsets) and \
        all(st == () or st == (1,) for st in strides)
    return _Plan(n, dtype, contiguous, shape, strides, offsets, geometries)


def launch(name, out, *inputs, stream=None):
    """Compute op ``name`` of ``inputs`` into ``out`` (all device arrays, or NumPy
    arrays under the simulator); inputs broadcast to ``out``'s shape.  What the
    operands' layouts decide is computed once per layout (``_launch_plan``)."""
    described = tuple(layout.describe(a) for a in inputs)
    out_desc = layout.describe(out)
    key = (name, out_desc, described)
    plan = _plans.get(key)
    if plan is None:
        plan = _launch_plan(name, out_desc, described)
        if len(_plans) >= _MAX_PLANS:
            _plans.clear()
        _plans[key] = plan
    if plan.n == 0:
        return out
    spans = [layout.span(a, *desc, geometry=g)[0]
             for a, desc, g in zip((out,) + inputs, (out_desc,) + described, plan.geometries)]
    if isinstance(spans[0], np.ndarray):
        # Simulator: it copies NumPy arguments in and back out; inputs are only
        # copied in (they may be read-only broadcast views).
        spans[1:] = [cuda.In(v) if isinstance(v, np.ndarray) else v for v in spans[1:]]

    blocks, threads = launch_config(plan.n)
    if plan.contiguous:
        _kernel(name, plan.dtype, "contiguous")[blocks, threads, _stream(stream)](*spans)
    else:
        args = [spans[0], plan.n, plan.shape, plan.strides[0], plan.offsets[0]]
        for view, st, off in zip(spans[1:], plan.strides[1:], plan.offsets[1:]):
            args += [view, st, off]
        _kernel(name, plan.dtype, "strided")[blocks, threads, _stream(stream)](*args)
    return out


# ------------------------------------------------------------------ registered kernels
def _as_array(x, dtype, like):
    """A kernel operand: arrays as they are, numbers (NumPy scalars) as 0-d arrays."""
    if isinstance(x, np.generic):
        return to_device(np.asarray(x), like)
    if isinstance(x, (bool, int, float)):
        return to_device(np.asarray(x, dtype), like)
    return x            # arrays; anything else is refused by launch() with a clear error


@functools.lru_cache(maxsize=None)
def _dense_dtypes(name, nin):
    """The dtypes ``_dense_launch`` may take for op ``name`` called with ``nin`` arrays."""
    fn, kind, n = _op(name)
    return supported_dtypes(name) if kind != "select" and nin == n else ()


def _dense_launch(name, arrays):
    """The common case without the layout analysis: every array operand
    C-contiguous, of one shape and dtype, so the contiguous kernel reads element
    ``i`` of each; numbers (``x * 2.0``) are passed to the kernel by value, in the
    arrays' dtype (as ``_as_array`` would convert them), instead of being copied
    to the device as 0-d arrays.  ``launch`` first describes, spans, broadcasts
    and coalesces every operand (about 2/3 of an op's host time, measured in the
    simulator: bench/cuda_host_path.py); none of that can change anything here.
    None when the case does not apply (then ``launch`` takes the call, with its
    checks and messages)."""
    scalars = tuple(isinstance(a, (bool, int, float, np.generic)) for a in arrays)
    first = next((a for a, s in zip(arrays, scalars) if not s), None)
    shape, dtype = getattr(first, "shape", None), getattr(first, "dtype", None)
    if dtype not in _dense_dtypes(name, len(arrays)):
        return None
    for a, s in zip(arrays, scalars):
        if s:
            continue
        flags = getattr(a, "flags", None)
        if flags is None or not flags.c_contiguous or a.shape != shape or a.dtype != dtype:
            return None
    n = math.prod(shape)
    if n == 0:
        return None
    out = empty(shape, result_dtype(name, dtype), first)
    simulated_arrays = isinstance(out, np.ndarray)
    args = [out.reshape(-1).view(np.ndarray) if simulated_arrays else out.reshape(-1)]
    for a, s in zip(arrays, scalars):
        if s:
            args.append(dtype.type(a))
        elif simulated_arrays:           # simulator: inputs copied in only, as in launch()
            args.append(cuda.In(a.reshape(-1).view(np.ndarray)))
        else:
            args.append(a.reshape(-1))
    blocks, threads = launch_config(n)
    kernel = _scalar_kernel(name, dtype, scalars) if any(scalars) else \
        _kernel(name, dtype, "contiguous")
    kernel[blocks, threads, _stream(None)](*args)
    return out


def scalar_kernel_function(name, dtype, scalars):
    """The contiguous kernel of op ``name`` with the operands flagged in ``scalars``
    passed by value (plain function, for ``compile_ptx`` and ``_scalar_kernel``)."""
    namespace = {"cuda": cuda, "op": device_function(name, dtype)}
    exec(compile(kernel_source(list(scalars), "contiguous"),
                 f"<cuda contiguous kernel {name} scalars={scalars}>", "exec"), namespace)
    kernel = namespace["kernel"]
    flags = "".join("s" if s else "a" for s in scalars)
    kernel.__name__ = f"{name}_{np.dtype(dtype).name}_contiguous_{flags}"
    return kernel


def scalar_kernel_signature(name, dtype, scalars):
    t = _NUMBA_TYPE[np.dtype(dtype)]
    return (_NUMBA_TYPE[result_dtype(name, dtype)][::1],
            *(t if s else t[::1] for s in scalars))


@functools.lru_cache(maxsize=None)
def _scalar_kernel(name, dtype, scalars):
    return cuda.jit(scalar_kernel_function(name, dtype, scalars))


def _make_kernel(name):
    kind = _op(name)[1]

    def kernel(*arrays, out=None):
        if out is None and arrays:
            done = _dense_launch(name, arrays)
            if done is not None:
                return done
        like = next((a for a in arrays if hasattr(a, "shape")), None)
        default = like.dtype if like is not None else np.dtype(np.float64)
        arrays = [_as_array(a, default, like) for a in arrays]
        if out is None:
            described = [layout.describe(a) for a in arrays]
            dtype = (described[-1] if kind == "select" else described[0])[2]
            shape = np.broadcast_shapes(*(d[0] for d in described))
            out = empty(shape, result_dtype(name, dtype), like)
        return launch(name, out, *arrays)
    kernel.__name__ = name
    kernel.__doc__ = f"CUDA kernel of {name!r} (numba.cuda, generated from kernels.scalar)"
    return kernel


for _name in OPS:
    register(_name, "cuda")(_make_kernel(_name))
