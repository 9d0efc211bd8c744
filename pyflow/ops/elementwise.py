"""Elementwise ops: each one's forward and backward side by side.

The forward of every op is one call of a kernel generated from its scalar
definition in ``kernels/scalar.py``; broadcasting follows PyTorch (and NumPy).
Backward rules are written with these same ops, so they can be differentiated
again; activations use one fused backward kernel when no graph is being
recorded for the backward itself (the usual ``loss.backward()``).
"""
import math

import numpy as np

from .. import _hooks
from .. import dtypes as _dt
from ..autograd import (GRAD_MODE, Context, Function, is_grad_enabled, record,
                        record_unary)
from ..kernels import scalar as _scalar
from ..tensor import Tensor
from ._method import tensor_method
from ..tensor import TENSOR_TYPES as _TENSOR_TYPES
from ..tensor import host_tensor
from ._util import (CPU_KERNELS, array_module, broadcast_shapes, check_scalar_fits,
                    compute_array, cpu_kernel, kernel, scalar_of, unbroadcast,
                    wrap)
from .creation import zeros_like
from .index import nonzero
from .inplace import _inplace
from ..distributed.signatures import (add_sub_rule, div_rule, elementwise_rule, mul_rule,
                                      unary_linear_rule)

__all__ = ["add", "sub", "mul", "div", "true_divide", "pow", "neg", "exp", "log", "sqrt", "rsqrt",
           "abs", "sign", "sin", "cos", "tanh", "sigmoid", "relu", "gelu", "silu", "reciprocal",
           "clamp", "clip", "where", "masked_fill", "maximum", "minimum", "eq", "ne", "lt", "le",
           "gt", "ge", "logical_and", "logical_or", "logical_xor", "logical_not", "floor_divide",
           "remainder", "square", "isnan", "isinf", "isfinite", "multiply", "subtract", "divide",
           "greater", "less", "equal", "allclose", "isclose"]


# ------------------------------------------------------------------ forward helpers
def _device_of(*xs):
    dev = None
    for x in xs:
        if isinstance(x, Tensor):
            if dev is None:
                dev = x.device
            elif x.device != dev:
                raise RuntimeError(f"Expected all tensors to be on the same device, but found "
                                   f"at least two devices, {dev} and {x.device}!")
    return dev


def _operand(x, cd, name, op):
    if isinstance(x, Tensor):
        return compute_array(x, cd)
    if isinstance(x, (int, float, bool, np.number)):
        return scalar_of(x, cd)
    raise TypeError(f"{op}(): argument '{name}' must be a Tensor or a number, not "
                    f"{type(x).__name__}")


def _kind(name):
    return (_scalar.BINARY.get(name) or _scalar.UNARY.get(name) or _scalar.TERNARY[name])[1]


_KIND = {n: _kind(n) for n in (*_scalar.UNARY, *_scalar.BINARY, *_scalar.TERNARY)}
_BOOL_RESULT = ("compare", "logical")


def _same_kind(a, xs):
    """Every one of ``xs`` a tensor of ``a``'s dtype and device."""
    for x in xs:
        if type(x) not in _TENSOR_TYPES or x.dtype is not a.dtype or x.device is not a.device:
            return False
    return True


def _elementwise(name, *xs):
    """Run elementwise op ``name`` on tensors/numbers; returns a new Tensor."""
    kind = _KIND[name]
    a = xs[0]
    # Fast path: tensors of one dtype and device (the common case in a model; the
    # test is unrolled for one and two operands, as in every activation's backward).
    if kind != "select" and type(a) in _TENSOR_TYPES and (
            len(xs) == 1 or len(xs) == 2 and type(xs[1]) in _TENSOR_TYPES and
            xs[1].dtype is a.dtype and xs[1].device is a.device or _same_kind(a, xs)):
        dtype, dev = a.dtype, a.device
        if dtype is _dt.bool and name in _NOT_FOR_BOOL:
            _refuse_bool(name)
        if dtype.storage is dtype.compute and (kind != "float" or dtype.category == 2) \
                and kind != "logical":
            k = kernel(name, dev.type)
            try:
                res = k(a._data, xs[1]._data) if len(xs) == 2 else k(*[x._data for x in xs])
            except ValueError:
                _raise_not_broadcastable(name, xs)
            if not hasattr(res, "shape"):   # a NumPy scalar from a 0-d ufunc call
                res = np.asarray(res)
            return Tensor._make(res, _dt.bool if kind in _BOOL_RESULT else dtype, dev)
    # Fast path: tensor (op) Python number, where the number does not change the dtype.
    if len(xs) == 2 and type(a) in _TENSOR_TYPES and type(xs[1]) in (float, int):
        dtype = a.dtype
        if dtype.category == 2 and dtype.storage is dtype.compute and kind != "logical" \
                or dtype.category == 1 and type(xs[1]) is int and kind == "arith":
            res = kernel(name, a.device.type)(a._data, dtype.compute.type(xs[1]))
            if not hasattr(res, "shape"):   # a NumPy scalar from a 0-d ufunc call
                res = np.asarray(res)
            return Tensor._make(res, _dt.bool if kind in _BOOL_RESULT else dtype, a.device)
    return _elementwise_general(name, kind, xs)


# Ops PyTorch has no bool kernels for (it raises; NumPy's bool math would answer).
_NOT_FOR_BOOL = {
    "neg": (RuntimeError, "Negation, the `-` operator, on a bool tensor is not supported. If you "
                          "are trying to invert a mask, use the `~` or `logical_not()` operator "
                          "instead."),
    "relu": (RuntimeError, "Boolean inputs not supported for relu"),
    **{n: (NotImplementedError, f"{n}(): not implemented for bool tensors (convert the "
                                f"operands with .long() first)")
       for n in ("floor_divide", "remainder", "pow", "abs")},
}


def _refuse_bool(name):
    exc, msg = _NOT_FOR_BOOL[name]
    raise exc(msg)


def _category(x):
    """bool 0 < int 1 < float 2 of a tensor or a number; None for anything else (the
    op's own argument check explains that one)."""
    if isinstance(x, Tensor):
        return x.dtype.category
    if isinstance(x, (bool, np.bool_)):
        return 0
    if isinstance(x, (int, np.integer)):
        return 1
    return 2 if isinstance(x, (float, np.floating)) else None


def _check_is_tensor(x, op, name="input", position=1):
    """PyTorch's TypeError for a number or other object where a tensor must be."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{op}(): argument '{name}' (position {position}) must be Tensor, "
                        f"not {type(x).__name__}")


def _check_sub(a, b):
    """PyTorch refuses ``-`` with a bool tensor operand (a Python bool counts as one)."""
    ca, cb = _category(a), _category(b)
    if ca is None or cb is None or ca and cb:
        return
    if ca == cb == 0:
        raise RuntimeError("Subtraction, the `-` operator, with two bool tensors is not "
                           "supported. Use the `^` or `logical_xor()` operator instead.")
    raise RuntimeError("Subtraction, the `-` operator, with a bool tensor is not supported. If "
                       "you are trying to invert a mask, use the `~` or `logical_not()` "
                       "operator instead.")


def _check_integer_divisor(op, a, b):
    """Integer ``//`` and ``%`` by zero raise, as in PyTorch (numba's kernels give 0).
    Only integer results pay for the check: one vectorized comparison of the divisor."""
    ca, cb = _category(a), _category(b)
    if ca is None or cb is None or ca == 2 or cb == 2:
        return
    if isinstance(a, Tensor) and a._data.size == 0:
        return                            # nothing is divided (PyTorch: an empty result)
    if isinstance(b, Tensor):
        zero = bool((b._data == 0).any()) if b._data.size else False
    else:
        zero = b == 0
    if zero:
        raise RuntimeError(f"ZeroDivisionError: {op}(): integer division by zero (the divisor "
                           f"has a zero element)")


def _raise_not_broadcastable(name, xs):
    broadcast_shapes(*[x._data.shape for x in xs if isinstance(x, Tensor)], op=name)
    raise


def _elementwise_general(name, kind, xs):
    operands = xs[1:] if kind == "select" else xs
    dtype = _dt.result_type(*operands)
    if dtype is None:
        raise TypeError(f"{name}(): expected at least one Tensor argument")
    if kind == "float" and not dtype.is_floating_point:
        dtype = _dt.get_default_dtype()
    elif kind == "logical":
        dtype = _dt.bool
    elif dtype is _dt.bool and name in _NOT_FOR_BOOL:
        _refuse_bool(name)
    dev = _device_of(*xs)
    shapes = [x._data.shape for x in xs if isinstance(x, Tensor)]
    if len(shapes) > 1 and any(s != shapes[0] for s in shapes):
        broadcast_shapes(*shapes, op=name)
    args = [_operand(x, dtype, f"arg{i}", name) for i, x in enumerate(operands)]
    if kind == "compare" and dtype.storage is not dtype.compute:
        args = [_rounded(x, dtype, dev) for x in args]
    if kind == "select":
        args.insert(0, _operand(xs[0], _dt.bool, "condition", name))
    res = kernel(name, dev.type)(*args)
    if not hasattr(res, "shape"):
        res = np.asarray(res)
    return wrap(res, _dt.bool if kind in _BOOL_RESULT else dtype, dev)


def _rounded(x, dtype, device):
    """Operand ``x`` (float32 values) of a half-``dtype`` comparison rounded to ``dtype``:
    PyTorch compares in the common dtype, so float16 0.2786 (as 0.27856) equals the
    number 0.27868 and bfloat16 0.96875 equals float16 0.9707.  (Arithmetic keeps
    the exact number, as PyTorch's float32 "opmath" does.)"""
    host = type(x) is np.ndarray or isinstance(x, (np.generic, int, float))
    cast = kernel("cast", "cpu" if host else device.type)
    x = np.asarray(x, np.float32) if host else x
    return cast(cast(x, _dt.float32, dtype), dtype, _dt.float32)


def _grad_for(g, x):
    """Fit gradient ``g`` to input ``x``: undo broadcasting, restore dtype."""
    if g._data.shape != x._data.shape or g._logical_shape is not None \
            or x._logical_shape is not None:    # (the same shapes: nothing to undo)
        g = unbroadcast(g, x.shape)
    return g if g.dtype is x.dtype else g.to(x.dtype)


def _needs(ctx, i):
    return len(ctx.needs_input_grad) > i and ctx.needs_input_grad[i]


# ------------------------------------------------------------------ binary arithmetic
def _keep_inputs(ctx, a, b):
    """What add and sub's backward needs: the operands' shapes and dtypes."""
    ctx.inputs = (a, b)


class Add(Function):
    sbp_rule = add_sub_rule
    @staticmethod
    def forward(ctx, a, b):
        _keep_inputs(ctx, a, b)
        return _elementwise("add", a, b)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.inputs
        return (_grad_for(g, a) if _needs(ctx, 0) else None,
                _grad_for(g, b) if _needs(ctx, 1) else None)


class Sub(Function):
    sbp_rule = add_sub_rule
    @staticmethod
    def forward(ctx, a, b):
        _keep_inputs(ctx, a, b)
        return _elementwise("sub", a, b)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.inputs
        return (_grad_for(g, a) if _needs(ctx, 0) else None,
                _grad_for(neg(g), b) if _needs(ctx, 1) else None)


def _save_operands(ctx, a, b):
    """Save the tensor operands (a Python number is kept in ``ctx.scalars``):
    ``ctx.save_for_backward(a or None, b or None)``, written out (every recorded
    mul and div runs it)."""
    ctx._saved = ((a, a._version[0]) if isinstance(a, Tensor) else _NOT_SAVED,
                  (b, b._version[0]) if isinstance(b, Tensor) else _NOT_SAVED)
    ctx.scalars = (a, b)


_NOT_SAVED = (None, 0)              # save_for_backward's entry for None


class Mul(Function):
    sbp_rule = mul_rule
    @staticmethod
    def forward(ctx, a, b):
        _save_operands(ctx, a, b)
        return _elementwise("mul", a, b)

    @staticmethod
    def backward(ctx, g):
        a, b = _restore(ctx)
        return (_grad_for(mul(g, b), a) if _needs(ctx, 0) else None,
                _grad_for(mul(g, a), b) if _needs(ctx, 1) else None)


class Div(Function):
    sbp_rule = div_rule
    @staticmethod
    def forward(ctx, a, b):
        _save_operands(ctx, a, b)
        return _elementwise("div", a, b)

    @staticmethod
    def backward(ctx, g):
        a, b = _restore(ctx)
        ga = _grad_for(div(g, b), a) if _needs(ctx, 0) else None
        gb = _grad_for(neg(div(mul(g, a), mul(b, b))), b) if _needs(ctx, 1) else None
        return ga, gb


class Pow(Function):
    sbp_rule = elementwise_rule()
    @staticmethod
    def forward(ctx, a, b):
        if _category(b) == 1 and not isinstance(b, Tensor) and b < 0 and \
                isinstance(a, Tensor) and a.dtype.category < 2:
            # PyTorch refuses a negative number exponent of an integer tensor (a tensor
            # exponent gives the truncated value: kernels/scalar.py's int_pow)
            raise RuntimeError("Integers to negative integer powers are not allowed.")
        if isinstance(b, (bool, np.bool_)) and isinstance(a, Tensor) and a.dtype is _dt.bool:
            out = logical_or(a, not b)   # PyTorch: a ** True is a, a ** False is all True
        else:
            out = _elementwise("pow", a, b)
        ctx.save_for_backward(*(x if isinstance(x, Tensor) else None for x in (a, b, out)))
        ctx.scalars = (a, b)
        return out

    @staticmethod
    def backward(ctx, g):
        a, b = _restore(ctx)
        out = ctx.saved_tensors[2]
        ga = gb = None
        if _needs(ctx, 0):
            b_minus_1 = sub(b, 1) if isinstance(b, Tensor) else b - 1
            ga = _grad_for(mul(mul(g, b), pow(a, b_minus_1)), a)
        if _needs(ctx, 1):
            if isinstance(a, Tensor):
                safe_log = where(eq(a, 0), 0.0, log(where(eq(a, 0), 1.0, a)))
            else:       # a number base (2.0 ** t): its log, 0 for 0 as above
                safe_log = 0.0 if a == 0 else (math.log(a) if a > 0 else float("nan"))
            gb = _grad_for(mul(mul(g, out), safe_log), b)
        return ga, gb


def _restore(ctx):
    """Saved tensor operands (version-checked) with Python numbers put back."""
    saved = ctx.saved_tensors
    return tuple([s if isinstance(x, Tensor) else x for s, x in zip(saved, ctx.scalars)])


class _MaxMin(Function):
    name = None

    @classmethod
    def forward(cls, ctx, a, b):
        ctx.save_for_backward(a, b)
        return _elementwise(cls.name, a, b)

    @classmethod
    def backward(cls, ctx, g):
        a, b = ctx.saved_tensors
        # PyTorch's rule: ties split the gradient, the operand not picked gets 0 (a
        # select, not g * weight, so an infinite g gives it 0, not NaN) and with a
        # NaN both get g
        shared = where(eq(a, b), mul(g, 0.5), g)
        a_loses, b_loses = (lt(a, b), gt(a, b)) if cls.name == "maximum" else (gt(a, b), lt(a, b))
        return (_grad_for(where(a_loses, 0.0, shared), a) if _needs(ctx, 0) else None,
                _grad_for(where(b_loses, 0.0, shared), b) if _needs(ctx, 1) else None)


class Maximum(_MaxMin):
    sbp_rule = elementwise_rule()
    name = "maximum"


class Minimum(_MaxMin):
    sbp_rule = elementwise_rule()
    name = "minimum"


class Remainder(Function):
    sbp_rule = elementwise_rule()
    @staticmethod
    def forward(ctx, a, b):
        _check_integer_divisor("remainder", a, b)
        ctx.save_for_backward(*(x if isinstance(x, Tensor) else None for x in (a, b)))
        ctx.scalars = (a, b)
        return _elementwise("remainder", a, b)

    @staticmethod
    def backward(ctx, g):
        a, b = _restore(ctx)
        return (_grad_for(g, a) if _needs(ctx, 0) else None,
                _grad_for(neg(mul(g, floor_divide(a, b))), b) if _needs(ctx, 1) else None)


# ------------------------------------------------------------------ direct calls
# The common cases of add, sub, mul, div and the unary ops run their Function's
# forward work themselves: one kernel call, then (when an input requires grad and
# grad mode is on) the same record ``Function.apply`` would make, with the ctx
# the forward fills.  ``local`` (_util) says when that is allowed; each helper
# returns None whenever its own conditions do not hold, and the op takes the
# general path (``Function.apply``), which also explains bad input.
_trace = _hooks._state          # .tracer: this thread's graph tracer, or None
_CPU, _cpu_kernel = CPU_KERNELS, cpu_kernel


# name -> (Function, what its forward keeps in ctx, the dtype categories it takes
# directly): div makes floats of integers (a dtype change: the general path), and
# sub refuses bool operands (the general path raises PyTorch's error).
_DIRECT_BINARY = {"add": (Add, _keep_inputs, (0, 1, 2)), "mul": (Mul, _save_operands, (0, 1, 2)),
                  "sub": (Sub, _keep_inputs, (1, 2)), "div": (Div, _save_operands, (2,))}


def _direct_binary(name, a, b, swap=False):
    """``a (name) b`` (``b (name) a`` with ``swap``) by one kernel call: ``a`` a local
    tensor and ``b`` a local tensor of the same dtype, or a Python int/float that
    keeps ``a``'s dtype (a float for a float tensor, an int for an integer one, as
    ``_elementwise``'s own fast path).  Shapes may broadcast (the ufunc does it);
    a failure goes back to the general path to be explained."""
    if type(a) not in _TENSOR_TYPES or a._placement is not None \
            or type(a._data) is not np.ndarray or _trace.tracer is not None:
        return None                     # (local(a), inline: the most frequent calls)
    dtype = a.dtype
    fn, keep, categories = _DIRECT_BINARY[name]
    if dtype.storage is not dtype.compute or dtype.category not in categories:
        return None
    tb = type(b)
    if tb in _TENSOR_TYPES:
        if b.dtype is not dtype or b._placement is not None or type(b._data) is not np.ndarray:
            return None
        y = b._data
        grad = a.requires_grad or b.requires_grad
    elif tb is float and dtype.category == 2 or tb is int and dtype.category > 0:
        y = dtype.compute.type(b)       # (an int too big for an int64 tensor: OverflowError,
        grad = a.requires_grad          # as on the general path)
    else:
        return None
    k = _CPU.get(name) or _cpu_kernel(name)
    try:
        res = k(y, a._data) if swap else k(a._data, y)
    except ValueError:                  # shapes that do not broadcast
        return None
    if type(res) is not np.ndarray:     # a NumPy scalar from a 0-d ufunc call
        res = np.asarray(res)
    out = host_tensor(res, dtype, a.device)
    if grad and GRAD_MODE.enabled:
        ctx = Context()
        args = (b, a) if swap else (a, b)
        keep(ctx, *args)
        record(fn, ctx, args, out)
    return out


def _direct_unary(fn, x):
    """``fn``'s forward (a ``_Unary``) by one kernel call for a local tensor ``x``
    whose dtype the op keeps: a float one, or any but bool for the
    sign-and-magnitude ops (neg, abs, sign, relu)."""
    if type(x) not in _TENSOR_TYPES or x._placement is not None \
            or type(x._data) is not np.ndarray or _trace.tracer is not None:
        return None                     # (local(x), inline)
    dtype = x.dtype
    name = fn.name
    if dtype.storage is not dtype.compute or \
            dtype.category != 2 and (dtype.category == 0 or _KIND[name] != "arith"):
        return None
    res = (_CPU.get(name) or _cpu_kernel(name))(x._data)
    if type(res) is not np.ndarray:
        res = np.asarray(res)
    out = host_tensor(res, dtype, x.device)
    if x.requires_grad and GRAD_MODE.enabled:
        ctx = Context()
        saved = x if fn.save == "x" else out
        ctx._saved = ((saved, saved._version[0]),)      # ctx.save_for_backward(saved)
        record_unary(fn, ctx, x, out)
    return out


@tensor_method("add", "__add__")
def add(input, other, *, alpha=1):
    if alpha == 1:
        out = _direct_binary("add", input, other)
        if out is not None:
            return out
        return Add.apply(input, other)
    return Add.apply(input, mul(other, alpha))


@tensor_method("__radd__")
def _radd(self, other):
    out = _direct_binary("add", self, other, swap=True)
    return out if out is not None else Add.apply(other, self)


@tensor_method("sub", "__sub__")
def sub(input, other, *, alpha=1):
    if alpha == 1:
        out = _direct_binary("sub", input, other)
        if out is not None:
            return out
    _check_sub(input, other)
    return Sub.apply(input, other if alpha == 1 else mul(other, alpha))


@tensor_method("__rsub__")
def _rsub(self, other):
    out = _direct_binary("sub", self, other, swap=True)
    if out is not None:
        return out
    _check_sub(other, self)
    return Sub.apply(other, self)


@tensor_method("mul", "__mul__")
def mul(input, other):
    out = _direct_binary("mul", input, other)
    return out if out is not None else Mul.apply(input, other)


@tensor_method("__rmul__")
def _rmul(self, other):
    out = _direct_binary("mul", self, other, swap=True)
    return out if out is not None else Mul.apply(other, self)


@tensor_method("div", "__truediv__")
def div(input, other, *, rounding_mode=None):
    if rounding_mode is None:
        out = _direct_binary("div", input, other)
        return out if out is not None else Div.apply(input, other)
    if rounding_mode == "floor":
        return floor_divide(input, other)
    if rounding_mode == "trunc":
        q = Div.apply(input, other)
        return where(lt(q, 0), neg(floor_divide(neg(input), other)), floor_divide(input, other))
    raise ValueError(f"div(): rounding_mode must be None, 'floor' or 'trunc', got {rounding_mode!r}")


@tensor_method("__rtruediv__")
def _rdiv(self, other):
    out = _direct_binary("div", self, other, swap=True)
    return out if out is not None else Div.apply(other, self)


@tensor_method("pow", "__pow__")
def pow(input, exponent):  # noqa: A001 (PyTorch's name)
    return Pow.apply(input, exponent)


@tensor_method("__rpow__")
def _rpow(self, other):
    return Pow.apply(other, self)


@tensor_method()
def maximum(input, other):
    _check_is_tensor(input, "maximum")
    _check_is_tensor(other, "maximum", "other", 2)
    return Maximum.apply(input, other)


@tensor_method()
def minimum(input, other):
    _check_is_tensor(input, "minimum")
    _check_is_tensor(other, "minimum", "other", 2)
    return Minimum.apply(input, other)


@tensor_method("floor_divide", "__floordiv__")
@_hooks.recordable
def floor_divide(input, other):
    _check_integer_divisor("floor_divide", input, other)
    return _elementwise("floor_divide", input, other)


@tensor_method("__rfloordiv__")
@_hooks.recordable
def _rfloordiv(self, other):
    _check_integer_divisor("floor_divide", other, self)
    return _elementwise("floor_divide", other, self)


@tensor_method("remainder", "__mod__")
def remainder(input, other):
    return Remainder.apply(input, other)


@tensor_method("__rmod__")
def _rmod(self, other):
    return Remainder.apply(other, self)


true_divide = divide = div
multiply, subtract = mul, sub


# ------------------------------------------------------------------ comparisons, logic
def _make_compare(name):
    def op(input, other):
        _check_is_tensor(input, name)
        return _elementwise(name, input, other)
    op.__name__ = name
    op.__doc__ = f"Elementwise ``{name}``; returns a bool tensor (not differentiable)."
    return _hooks.recordable(op, elementwise=True)


eq, ne, lt, le, gt, ge = (_make_compare(n) for n in ("eq", "ne", "lt", "le", "gt", "ge"))
logical_and, logical_or, logical_xor = (_make_compare(n) for n in
                                        ("logical_and", "logical_or", "logical_xor"))
greater, less, equal_elementwise = gt, lt, eq
for _n, _f in (("eq", eq), ("ne", ne), ("lt", lt), ("le", le), ("gt", gt), ("ge", ge),
               ("__eq__", eq), ("__ne__", ne), ("__lt__", lt), ("__le__", le), ("__gt__", gt),
               ("__ge__", ge), ("logical_and", logical_and), ("logical_or", logical_or),
               ("logical_xor", logical_xor), ("greater", gt), ("less", lt)):
    tensor_method(_n)(_f)


def _bitwise(name, logical):
    def op(self, other):
        if self.dtype is not _dt.bool:
            raise TypeError(f"{name}: only bool tensors are supported (got {self.dtype})")
        return logical(self, other)
    return op


tensor_method("__and__", "__rand__")(_bitwise("&", logical_and))
tensor_method("__or__", "__ror__")(_bitwise("|", logical_or))
tensor_method("__xor__", "__rxor__")(_bitwise("^", logical_xor))


@tensor_method("logical_not", "__invert__")
@_hooks.recordable(elementwise=True)
def logical_not(input):
    _check_is_tensor(input, "logical_not")
    return _elementwise("logical_not", input)


@tensor_method()
@_hooks.recordable
def equal(input, other):
    """True when both tensors have the same shape and elements."""
    return tuple(input.shape) == tuple(other.shape) and bool(eq(input, other)._data.all())


@tensor_method()
@_hooks.recordable(elementwise=True)
def isclose(input, other, rtol=1e-05, atol=1e-08, equal_nan=False):
    a, b = input._compute(), other._compute()
    xp = array_module(a)          # numpy, or the device's (np.asarray would not work on CuPy)
    return wrap(xp.isclose(a, b, rtol=rtol, atol=atol, equal_nan=equal_nan), _dt.bool, input.device)


@tensor_method()
@_hooks.recordable
def allclose(input, other, rtol=1e-05, atol=1e-08, equal_nan=False):
    return bool(isclose(input, other, rtol, atol, equal_nan)._data.all())


@tensor_method()
def isnan(input):
    _check_is_tensor(input, "isnan")
    return ne(input, input)


@tensor_method()
@_hooks.recordable(elementwise=True)
def isinf(input):
    _check_is_tensor(input, "isinf")
    return wrap(np.isinf(input._compute()), _dt.bool, input.device)


@tensor_method()
@_hooks.recordable(elementwise=True)
def isfinite(input):
    _check_is_tensor(input, "isfinite")
    return wrap(np.isfinite(input._compute()), _dt.bool, input.device)


# ------------------------------------------------------------------ unary math
class _Unary(Function):
    """forward = kernel ``name``; backward given by ``grad(g, x, out)``."""
    sbp_rule = elementwise_rule()
    name = None
    save = "x"

    @classmethod
    def forward(cls, ctx, x):
        out = _elementwise(cls.name, x)
        ctx.save_for_backward(x if cls.save == "x" else out)
        return out

    @classmethod
    def backward(cls, ctx, g):
        (v,) = ctx.saved_tensors
        return cls.grad(g, v)


def _unary(name, save, grad_fn, doc):
    cls = type(name.capitalize(), (_Unary,), {"name": name, "save": save,
                                               "grad": staticmethod(grad_fn)})
    if name == "neg":                   # linear: a partial sum stays one
        cls.sbp_rule = unary_linear_rule

    public = "gelu" if name == "gelu_tanh" else name
    floats_only = name in ("gelu", "gelu_tanh", "silu")     # PyTorch has no integer kernels

    def op(input):
        out = _direct_unary(cls, input)       # (floats only: as floats_only asks)
        if out is not None:
            return out
        _check_is_tensor(input, public)
        if floats_only and input.dtype.category != 2:
            raise NotImplementedError(f"{public}(): not implemented for {input.dtype.name} "
                                      f"tensors (convert with .float() first)")
        return cls.apply(input)
    op.__name__ = name
    op.__doc__ = doc
    tensor_method(name)(op)
    return op


def _zero_grad(g):
    """A zero gradient shaped like ``g`` (not ``g * 0``: an infinite ``g`` would give NaN)."""
    return zeros_like(g)


def _fused_or(name, composite):
    """Backward of an activation: one fused kernel, or ops when recording a graph."""
    def grad(g, v):
        if is_grad_enabled():
            return composite(g, v)
        return _elementwise(name, g, v)
    return grad


neg = _unary("neg", "x", lambda g, x: neg(g), "-input")
exp = _unary("exp", "out", lambda g, y: mul(g, y), "e ** input")
log = _unary("log", "x", lambda g, x: div(g, x), "natural logarithm")
sqrt = _unary("sqrt", "out", lambda g, y: div(g, mul(y, 2.0)), "square root")
rsqrt = _unary("rsqrt", "out", lambda g, y: mul(mul(g, -0.5), mul(y, mul(y, y))), "1 / sqrt(input)")
abs = _unary("abs", "x", lambda g, x: mul(g, sign(x)), "absolute value")  # noqa: A001
sign = _unary("sign", "x", lambda g, x: _zero_grad(g), "sign (-1, 0, 1)")
sin = _unary("sin", "x", lambda g, x: mul(g, cos(x)), "sine")
cos = _unary("cos", "x", lambda g, x: neg(mul(g, sin(x))), "cosine")
reciprocal = _unary("reciprocal", "out", lambda g, y: neg(mul(g, mul(y, y))), "1 / input")
tanh = _unary("tanh", "out", _fused_or("tanh_backward", lambda g, y: mul(g, sub(1.0, mul(y, y)))),
              "hyperbolic tangent")
sigmoid = _unary("sigmoid", "out",
                 _fused_or("sigmoid_backward", lambda g, y: mul(g, mul(y, sub(1.0, y)))),
                 "logistic sigmoid")
# g where y > 0, else 0: a select, not g * (y > 0), which makes an infinite g NaN
relu = _unary("relu", "out", _fused_or("relu_backward", lambda g, y: where(le(y, 0), 0.0, g)),
              "max(input, 0)")
silu = _unary("silu", "x", _fused_or("silu_backward", lambda g, x: mul(
    g, mul(sigmoid(x), add(1.0, mul(x, sub(1.0, sigmoid(x))))))), "input * sigmoid(input)")
_gelu_erf = _unary("gelu", "x", _fused_or("gelu_backward", lambda g, x: mul(g, add(
    mul(0.5, add(1.0, _erf(mul(x, _scalar.SQRT1_2)))),
    mul(mul(x, _scalar.INV_SQRT_2PI), exp(mul(mul(x, x), -0.5)))))), "GELU (erf form)")


def _gelu_tanh_grad(g, x):
    inner = mul(add(x, mul(mul(mul(x, x), x), 0.044715)), _scalar.SQRT_2_OVER_PI)
    t = tanh(inner)
    d_inner = mul(add(1.0, mul(mul(x, x), 3 * 0.044715)), _scalar.SQRT_2_OVER_PI)
    return mul(g, add(mul(0.5, add(1.0, t)), mul(mul(mul(0.5, x), sub(1.0, mul(t, t))), d_inner)))


_gelu_tanh = _unary("gelu_tanh", "x", _fused_or("gelu_tanh_backward", _gelu_tanh_grad),
                    "GELU (tanh approximation)")


class _Erf(Function):
    """erf, only needed inside GELU's differentiable backward."""
    sbp_rule = elementwise_rule()
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        v = np.vectorize(math.erf, otypes=[x.dtype.compute])(x._compute())
        return wrap(v, x.dtype, x.device)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return mul(g, mul(exp(neg(mul(x, x))), 2 * _scalar.INV_SQRT_2PI * np.sqrt(2.0)))


def _erf(x):
    return _Erf.apply(x)


@tensor_method()
def gelu(input, approximate="none"):
    if approximate == "none":
        return _gelu_erf(input)
    if approximate == "tanh":
        return _gelu_tanh(input)
    raise ValueError(f"gelu(): approximate must be 'none' or 'tanh', got {approximate!r}")


@tensor_method()
def square(input):
    _check_is_tensor(input, "square")
    if input.dtype is _dt.bool:
        return pow(input, 2)          # PyTorch: int64, as bool ** 2 (bool * bool stays bool)
    return mul(input, input)


@tensor_method("__neg__")
def _neg(self):
    return neg(self)


@tensor_method("__abs__")
def _abs(self):
    return abs(self)


@tensor_method("__pos__")
def _pos(self):
    return self


# ------------------------------------------------------------------ ternary
class Where(Function):
    sbp_rule = elementwise_rule()
    @staticmethod
    def forward(ctx, cond, a, b):
        ctx.cond = cond
        ctx.inputs = (a, b)
        return _elementwise("where", cond, a, b)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.inputs
        zero = 0.0
        return (None,
                _grad_for(_where(ctx.cond, g, zero), a) if _needs(ctx, 1) else None,
                _grad_for(_where(ctx.cond, zero, g), b) if _needs(ctx, 2) else None)


def _where(cond, a, b):
    """``Where.apply(cond, a, b)``, direct when it can be."""
    out = _direct_where(cond, a, b)
    return out if out is not None else Where.apply(cond, a, b)


def _direct_where(cond, a, b):
    """``Where``'s forward run directly and recorded as ``Where.apply`` records
    it, for a local bool ``cond`` and operands that are local float tensors of one
    dtype or Python numbers (at least one a tensor): the dtype ``Where`` gives then
    is that tensor dtype.  None otherwise, or when the shapes do not broadcast
    (the general path explains)."""
    if type(cond) not in _TENSOR_TYPES or cond.dtype is not _dt.bool \
            or cond._placement is not None or type(cond._data) is not np.ndarray \
            or _trace.tracer is not None:
        return None
    t = a if type(a) in _TENSOR_TYPES else b
    if type(t) not in _TENSOR_TYPES:
        return None
    dtype = t.dtype
    if dtype.category != 2 or dtype.storage is not dtype.compute:
        return None
    args = []
    grad = False
    for x in (a, b):
        if type(x) in _TENSOR_TYPES:
            if x.dtype is not dtype or x._placement is not None \
                    or type(x._data) is not np.ndarray:
                return None
            args.append(x._data)
            grad = grad or x.requires_grad
        elif type(x) is float or type(x) is int:
            args.append(dtype.compute.type(x))
        else:
            return None
    try:
        res = (_CPU.get("where") or _cpu_kernel("where"))(cond._data, args[0], args[1])
    except ValueError:                  # shapes that do not broadcast
        return None
    out = host_tensor(res if type(res) is np.ndarray else np.asarray(res), dtype, t.device)
    if grad and GRAD_MODE.enabled:
        ctx = Context()
        ctx.cond = cond
        ctx.inputs = (a, b)
        record(Where, ctx, (cond, a, b), out)
    return out


@tensor_method("where")
def where(condition, input=None, other=None):
    if input is None and other is None:
        return tuple(nonzero(condition).t())
    if not isinstance(condition, Tensor) or condition.dtype is not _dt.bool:
        raise TypeError(f"where(): condition must be a bool Tensor, got "
                        f"{getattr(condition, 'dtype', type(condition).__name__)}")
    return _where(condition, input, other)


@tensor_method()
def masked_fill(input, mask, value):
    """``input`` with ``value`` where ``mask`` is True; like PyTorch's out-of-place form
    the result has the broadcast shape of both (``masked_fill_`` keeps input's)."""
    if (type(value) is float or type(value) is int) and type(input) in _TENSOR_TYPES \
            and input.dtype.category == 2:  # a float tensor and a number: Where's own dtype
        out = _direct_where(mask, value, input)
        if out is not None:
            return out
    _check_is_tensor(input, "masked_fill")
    if not isinstance(mask, Tensor) or mask.dtype is not _dt.bool:
        raise TypeError(f"masked_fill(): mask must be a bool Tensor, got "
                        f"{getattr(mask, 'dtype', type(mask).__name__)}")
    if not isinstance(value, (Tensor, int, float, np.number)):
        raise TypeError(f"masked_fill(): argument 'value' must be a number or a 0-dim Tensor, "
                        f"not {type(value).__name__}")
    broadcast_shapes(tuple(input.shape), tuple(mask.shape), op="masked_fill")
    if input.dtype is _dt.bool and isinstance(value, (int, float, np.number)):
        value = bool(value)          # 1e-50 is True (through float32 it would be 0: False)
    if isinstance(value, Tensor):
        if value.ndim != 0:
            raise RuntimeError(f"masked_fill(): value must be a 0-dim tensor or a number, got "
                               f"shape {tuple(value.shape)}")
        value = value.to(input.dtype)
    else:
        check_scalar_fits(value, input.dtype, "masked_fill")    # NaN or 2**40 in an int tensor
        if input.dtype.category == 1:
            value = int(value)       # truncated as PyTorch does (not rounded through float32)
    out = Where.apply(mask, value, input)
    return out if out.dtype is input.dtype else out.to(input.dtype)


class Clamp(Function):
    sbp_rule = elementwise_rule()
    @staticmethod
    def forward(ctx, x, lo, hi):
        ctx.save_for_backward(x)
        ctx.bounds = (lo, hi)
        out = x
        if lo is not None:
            out = _elementwise("maximum", out, lo)
        if hi is not None:
            out = _elementwise("minimum", out, hi)
        return out if out is not x else wrap(x._data.copy(), x.dtype, x.device)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        lo, hi = ctx.bounds
        keep = None
        if lo is not None:
            keep = ge(x, lo)
        if hi is not None:
            keep = le(x, hi) if keep is None else logical_and(keep, le(x, hi))
        return (_grad_for(where(keep, g, 0.0), x), None, None)


@tensor_method("clamp", "clip")
def clamp(input, min=None, max=None):  # noqa: A002 (PyTorch's names)
    if min is None and max is None:
        raise RuntimeError("clamp(): at least one of 'min' or 'max' must not be None")
    return Clamp.apply(input, min, max)


clip = clamp


# ------------------------------------------------------------------ in-place forms
def _inplace_method(name, op):
    def method(self, *others, **kwargs):
        if kwargs:
            return _inplace(self, lambda s, *o: op(s, *o, **kwargs), *others)
        return _inplace(self, op, *others)
    method.__name__ = name
    tensor_method(name)(method)


for _name, _op in (("add_", add), ("sub_", sub), ("mul_", mul), ("div_", div), ("pow_", pow),
                   ("clamp_", clamp), ("clip_", clamp), ("neg_", neg), ("exp_", exp),
                   ("log_", log), ("sqrt_", sqrt), ("abs_", abs), ("tanh_", tanh),
                   ("sigmoid_", sigmoid), ("relu_", relu), ("masked_fill_", masked_fill),
                   ("__iadd__", add), ("__isub__", sub), ("__imul__", mul),
                   ("__itruediv__", div), ("square_", square)):
    _inplace_method(_name, _op)
