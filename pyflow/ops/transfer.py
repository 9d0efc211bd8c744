"""Moving tensors between devices (``Tensor.to(device)``, ``.cpu()``, ``.cuda()``)."""
from ..autograd import Function
from ..device import placed
from ..tensor import Tensor
from ._util import kernel

__all__ = ["to_device"]


class ToDevice(Function):
    @staticmethod
    def forward(ctx, x, device):
        ctx.src = x.device
        if device.type == "cpu":                       # device -> host
            data = kernel("to_host", x.device.type)(x._data)
        else:                                          # host -> device
            src = x._data if x.device.type == "cpu" else kernel("to_host", x.device.type)(x._data)
            data = kernel("to_device", device.type)(src)
        return Tensor._make(data, x.dtype, placed(device))

    @staticmethod
    def backward(ctx, g):
        return to_device(g, ctx.src), None


def to_device(x, device):
    return ToDevice.apply(x, device)
