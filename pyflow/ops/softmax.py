"""softmax and log_softmax along one dim, forward and backward side by side.

Both run one numba row kernel forward and save their output: the backward
needs only y (softmax: ``y * (g - sum(g * y))``, log_softmax:
``g - exp(y) * sum(g)``), computed by one fused kernel, or by pyflow ops when
the backward itself is being recorded (double backward).
"""
from .. import dtypes as _dt
from ..autograd import GRAD_MODE, Context, Function, is_grad_enabled, record_unary
from ..tensor import host_tensor
from ._method import tensor_method
from ._util import CPU_KERNELS, check_tensor, compute_array, cpu_kernel, kernel, local, wrap
from ..distributed.signatures import softmax_rule

__all__ = ["softmax", "log_softmax"]


class _SoftmaxBase(Function):
    """softmax(x * scale) along ``dim``; ``causal`` (last dim only) masks each
    query row of the (..., L, S) scores past its position.  scale and causal
    are attention's (``scaled_dot_product_attention``); plain softmax has 1 and
    False."""
    sbp_rule = softmax_rule
    log = False

    @classmethod
    def forward(cls, ctx, x, dim, scale=1.0, causal=False):
        name = "log_softmax" if cls.log else "softmax"
        if causal and cls.log:      # its composed backward below assumes y == 0 when masked
            raise ValueError("log_softmax: no causal mask (attention's is a softmax)")
        y = wrap(kernel(name, x.device.type)(compute_array(x, x.dtype), dim, scale=scale,
                                             causal=causal), x.dtype, x.device)
        ctx.dim, ctx.scale, ctx.causal = dim, scale, causal
        ctx.save_for_backward(y)
        return y

    @classmethod
    def backward(cls, ctx, g):
        (y,) = ctx.saved_tensors
        dim, scale = ctx.dim, ctx.scale
        if is_grad_enabled():
            # masked entries: y == 0 (softmax) zeroes them; log_softmax is never masked
            if cls.log:
                dx = g - y.exp() * g.sum(dim, keepdim=True)
            else:
                dx = y * (g - (g * y).sum(dim, keepdim=True))
            return (dx if scale == 1.0 else dx * scale), None, None, None
        name = "log_softmax_backward" if cls.log else "softmax_backward"
        dx = kernel(name, y.device.type)(compute_array(g, y.dtype), compute_array(y, y.dtype), dim,
                                         scale=scale, causal=ctx.causal)
        return wrap(dx, y.dtype, y.device), None, None, None


class Softmax(_SoftmaxBase):
    log = False


class LogSoftmax(_SoftmaxBase):
    log = True


def _prepare(input, dim, dtype, op):
    check_tensor(input, "input", op)
    if dim is None:  # PyTorch's legacy implicit dim: 0 for 0-D, 1-D and 3-D inputs, else 1
        raise TypeError(f"{op}(): argument 'dim' must be an int, got None (the implicit "
                        f"dim choice is deprecated in PyTorch; pass dim explicitly)")
    d = input._wrap_dim(dim, max(input.ndim, 1))     # the dim first, as PyTorch checks
    if dtype is not None:
        input = input.to(_dt.as_dtype(dtype))
    if not input.dtype.is_floating_point:
        raise RuntimeError(f"{op}(): expected a floating point input (or pass dtype=), got "
                           f"{input.dtype}")
    return input, d


def _direct(cls, input, dim):
    """``cls``'s forward (softmax or log_softmax, no scale, no mask) run directly
    and recorded as ``cls.apply(input, dim)`` records it, for a local float tensor
    of at least one dim and an int ``dim`` in range; None otherwise (the general
    path checks and explains)."""
    if not local(input) or type(dim) is not int:
        return None
    data = input._data
    dtype = input.dtype
    n = data.ndim
    if dtype.category != 2 or dtype.storage is not dtype.compute or not -n <= dim < n:
        return None
    dim %= n
    name = "log_softmax" if cls.log else "softmax"
    res = (CPU_KERNELS.get(name) or cpu_kernel(name))(data, dim, scale=1.0, causal=False)
    if res.dtype != data.dtype:
        return None                     # (never: the row kernels keep the dtype)
    y = host_tensor(res, dtype, input.device)
    if input.requires_grad and GRAD_MODE.enabled:
        ctx = Context()
        ctx.dim, ctx.scale, ctx.causal = dim, 1.0, False
        ctx._saved = ((y, 0),)          # ctx.save_for_backward(y)
        record_unary(cls, ctx, input, y, 2)
    return y


@tensor_method()
def softmax(input, dim, dtype=None):
    """exp(x) / sum(exp(x)) along ``dim`` (computed as exp(x - max) for stability)."""
    if dtype is None:
        out = _direct(Softmax, input, dim)
        if out is not None:
            return out
    input, d = _prepare(input, dim, dtype, "softmax")
    if input.ndim == 0:
        return Softmax.apply(input.reshape(1), 0).reshape(())
    return Softmax.apply(input, d)


@tensor_method()
def log_softmax(input, dim, dtype=None):
    """x - log(sum(exp(x))) along ``dim``."""
    if dtype is None:
        out = _direct(LogSoftmax, input, dim)
        if out is not None:
            return out
    input, d = _prepare(input, dim, dtype, "log_softmax")
    if input.ndim == 0:
        return LogSoftmax.apply(input.reshape(1), 0).reshape(())
    return LogSoftmax.apply(input, d)
