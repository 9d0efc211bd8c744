"""Matrix products: matmul (all of PyTorch's broadcasting cases), mm, bmm, linear."""
from .. import dtypes as _dt
from ..autograd import Function
from ._method import tensor_method
from ._util import check_tensor, compute_array, kernel, wrap

__all__ = ["matmul", "mm", "bmm", "linear"]


class Matmul(Function):
    """2-D x 2-D product (higher-rank cases are reduced to it or to batched form)."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        dt = _dt.promote_types(a.dtype, b.dtype)
        out = kernel("matmul", a.device.type)(compute_array(a, dt), compute_array(b, dt))
        return wrap(out, dt, a.device)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        ga = matmul(g, b.mT) if ctx.needs_input_grad[0] else None
        gb = matmul(a.mT, g) if ctx.needs_input_grad[1] else None
        return ga, gb


@tensor_method("matmul", "__matmul__")
def matmul(input, other):
    check_tensor(input, "input", "matmul")
    check_tensor(other, "other", "matmul")
    if input.ndim == 2 and other.ndim == 2:
        if input.shape[1] != other.shape[0]:
            raise RuntimeError(f"matmul: mat1 and mat2 shapes cannot be multiplied "
                               f"({input.shape[0]}x{input.shape[1]} and "
                               f"{other.shape[0]}x{other.shape[1]})")
        return Matmul.apply(input, other)
    raise RuntimeError("matmul: only 2-D operands are supported so far")


@tensor_method()
def mm(input, mat2):
    return matmul(input, mat2)


@tensor_method()
def bmm(input, mat2):
    return matmul(input, mat2)


def linear(input, weight, bias=None):
    out = matmul(input, weight.t())
    return out if bias is None else out + bias
