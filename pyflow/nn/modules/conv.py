"""Conv2d: 2-D convolution (cross-correlation, as in PyTorch) over NCHW input."""
import math

from ... import ops
from .. import functional as F
from .. import init
from ..module import Module
from ..parameter import Parameter

__all__ = ["Conv2d"]

_PADDING_MODES = ("zeros", "reflect", "replicate", "circular")


def _pair(v, name):
    if isinstance(v, int) and not isinstance(v, bool):
        return (v, v)
    v = tuple(v)
    if len(v) != 2 or not all(isinstance(x, int) for x in v):
        raise ValueError(f"Conv2d: {name} must be an int or a pair of ints, got {v!r}")
    return v


class Conv2d(Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1,
                 groups=1, bias=True, padding_mode="zeros", device=None, dtype=None):
        super().__init__()
        if groups <= 0:
            raise ValueError("groups must be a positive integer")
        if in_channels % groups != 0:
            raise ValueError("in_channels must be divisible by groups")
        if out_channels % groups != 0:
            raise ValueError("out_channels must be divisible by groups")
        if padding_mode not in _PADDING_MODES:
            raise ValueError(f"padding_mode must be one of {list(_PADDING_MODES)}, but got "
                             f"padding_mode='{padding_mode}'")
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.kernel_size = _pair(kernel_size, "kernel_size")
        self.stride = _pair(stride, "stride")
        self.dilation = _pair(dilation, "dilation")
        if isinstance(padding, str):
            if padding not in ("same", "valid"):
                raise ValueError(f"Invalid padding string {padding!r}, should be one of "
                                 f"{{'valid', 'same'}}")
            if padding == "same" and any(s != 1 for s in self.stride):
                raise ValueError("padding='same' is not supported for strided convolutions")
            self.padding = padding
        else:
            self.padding = _pair(padding, "padding")
        self.groups = groups
        self.padding_mode = padding_mode
        # What to pad on each side, in F.pad's order (last dim first): used for
        # non-'zeros' padding modes and for 'same' with an even kernel (asymmetric).
        if isinstance(self.padding, str):
            total = [d * (k - 1) if self.padding == "same" else 0
                     for d, k in zip(self.dilation, self.kernel_size)]
        else:
            total = [2 * p for p in self.padding]
        (lo_h, lo_w) = (t // 2 for t in total)
        self._reversed_padding_repeated_twice = [lo_w, total[1] - lo_w, lo_h, total[0] - lo_h]
        self.weight = Parameter(ops.empty(out_channels, in_channels // groups, *self.kernel_size,
                                          dtype=dtype, device=device))
        if bias:
            self.bias = Parameter(ops.empty(out_channels, dtype=dtype, device=device))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self):
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            fan_in, _ = init._calculate_fan_in_and_fan_out(self.weight)
            if fan_in != 0:
                bound = 1 / math.sqrt(fan_in)
                init.uniform_(self.bias, -bound, bound)

    def forward(self, input):
        self._check_input(input)
        if input.dim() not in (3, 4):
            raise RuntimeError(f"Conv2d: expected 3D (unbatched) or 4D (batched) input, but got "
                               f"input of size: {list(input.shape)}")
        channels = input.shape[-3]
        if channels != self.in_channels:
            raise RuntimeError(f"Conv2d: expected input with {self.in_channels} channels "
                               f"(shape {list(input.shape)} has {channels} at dim -3)")
        pads = self._reversed_padding_repeated_twice
        symmetric = pads[0] == pads[1] and pads[2] == pads[3]
        if self.padding_mode != "zeros" or not symmetric:
            mode = "constant" if self.padding_mode == "zeros" else self.padding_mode
            x = F.pad(input, pads, mode=mode)
            return F.conv2d(x, self.weight, self.bias, self.stride, (0, 0), self.dilation,
                            self.groups)
        return F.conv2d(input, self.weight, self.bias, self.stride, (pads[2], pads[0]),
                        self.dilation, self.groups)

    def extra_repr(self):
        s = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, " \
            f"stride={self.stride}"
        if self.padding != (0, 0):
            s += f", padding={self.padding!r}" if isinstance(self.padding, str) \
                else f", padding={self.padding}"
        if self.dilation != (1, 1):
            s += f", dilation={self.dilation}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        if self.bias is None:
            s += ", bias=False"
        if self.padding_mode != "zeros":
            s += f", padding_mode={self.padding_mode}"
        return s
