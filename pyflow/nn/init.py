"""nn.init: fill a tensor in place with numbers from a distribution (PyTorch's API).

Numbers come from pyflow's own generators (``pyflow.manual_seed`` makes them
reproducible); they are drawn in float64 with NumPy's Generator and copied into
the tensor in its own dtype, under ``no_grad`` so that initialising a
Parameter is not recorded.  The distributions (and so the bounds and standard
deviations derived from fan-in/fan-out) are PyTorch's; the individual numbers
are not, since the generators differ.
"""
import math
import warnings

import numpy as np

from ..autograd import no_grad
from ..random import generator_of
from ..tensor import Tensor

__all__ = ["calculate_gain", "uniform_", "normal_", "trunc_normal_", "constant_", "ones_",
           "zeros_", "eye_", "xavier_uniform_", "xavier_normal_", "kaiming_uniform_",
           "kaiming_normal_"]


def _check(tensor, fn):
    if not isinstance(tensor, Tensor):
        raise TypeError(f"{fn}(): argument 'tensor' must be a Tensor, not {type(tensor).__name__}")


def _fill_from(tensor, values):
    """Copy the float64 array ``values`` into ``tensor`` (any dtype, any layout)."""
    from ..ops.creation import tensor as make
    with no_grad():
        tensor.copy_(make(values, dtype=tensor.dtype))
    return tensor


def _fill_drawn(tensor, kind, generator, **params):
    """Fill ``tensor`` with ``generator``'s numbers of ``kind`` ("uniform", "normal"),
    drawn in pieces straight into an array of its dtype (``ops.creation._drawn``): no
    float64 copy of the whole tensor, and the numbers one draw of its size would give."""
    from ..ops._util import wrap
    from ..ops.creation import _drawn
    values = _drawn(tuple(tensor.shape), tensor.dtype, kind, generator, **params)
    with no_grad():
        tensor.copy_(wrap(values, tensor.dtype))
    return tensor


def _rng(generator):
    return generator_of(generator).numpy


def calculate_gain(nonlinearity, param=None):
    """The recommended gain for ``nonlinearity`` (PyTorch's table)."""
    linear_fns = ["linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d",
                  "conv_transpose2d", "conv_transpose3d"]
    if nonlinearity in linear_fns or nonlinearity == "sigmoid":
        return 1
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        if param is None:
            slope = 0.01
        elif isinstance(param, (int, float)) and not isinstance(param, bool):
            slope = param
        else:
            raise ValueError(f"negative_slope {param} not a valid number")
        return math.sqrt(2.0 / (1 + slope ** 2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise ValueError(f"Unsupported nonlinearity {nonlinearity}")


def _calculate_fan_in_and_fan_out(tensor):
    dim = tensor.dim()
    if dim < 2:
        raise ValueError("Fan in and fan out can not be computed for tensor with fewer than "
                         "2 dimensions")
    receptive = 1
    for s in tensor.shape[2:]:
        receptive *= s
    return tensor.shape[1] * receptive, tensor.shape[0] * receptive


def _calculate_correct_fan(tensor, mode):
    mode = mode.lower()
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"Mode {mode} not supported, please use one of fan_in, fan_out")
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    return fan_in if mode == "fan_in" else fan_out


def uniform_(tensor, a=0.0, b=1.0, generator=None):
    """Fill with U(a, b)."""
    _check(tensor, "uniform_")
    if a > b:
        raise ValueError(f"uniform_(): expects a <= b, but found a={a} > b={b}")
    return _fill_drawn(tensor, "uniform", generator, low=a, high=b)


def normal_(tensor, mean=0.0, std=1.0, generator=None):
    """Fill with N(mean, std^2)."""
    _check(tensor, "normal_")
    if std < 0:
        raise RuntimeError(f"normal_(): expects std >= 0.0, but found std {std}")
    return _fill_drawn(tensor, "normal", generator, loc=mean, scale=std)


def trunc_normal_(tensor, mean=0.0, std=1.0, a=-2.0, b=2.0, generator=None):
    """Fill with N(mean, std^2) truncated to [a, b] (redrawing values outside)."""
    _check(tensor, "trunc_normal_")
    if not a < b:
        raise ValueError(f"trunc_normal_(): expects a < b, but found a={a}, b={b}")
    if mean < a - 2 * std or mean > b + 2 * std:
        warnings.warn("mean is more than 2 std from [a, b] in nn.init.trunc_normal_. "
                      "The distribution of values may be incorrect.", stacklevel=2)
    rng = _rng(generator)
    n = tensor.numel()
    out = np.empty(n)
    filled = 0
    # Rejection sampling gives exactly the truncated normal; PyTorch's inverse-CDF
    # method gives the same distribution.  Stop redrawing when the window is
    # (numerically) out of reach and clamp, as PyTorch's clamp does.
    for _ in range(100):
        if filled == n:
            break
        draw = rng.normal(mean, std, size=max(2 * (n - filled), 16))
        keep = draw[(draw >= a) & (draw <= b)][: n - filled]
        out[filled:filled + keep.size] = keep
        filled += keep.size
    if filled < n:
        out[filled:] = np.clip(rng.normal(mean, std, size=n - filled), a, b)
    return _fill_from(tensor, out.reshape(tuple(tensor.shape)))


def constant_(tensor, val):
    _check(tensor, "constant_")
    with no_grad():
        tensor.fill_(val)
    return tensor


def ones_(tensor):
    return constant_(tensor, 1.0)


def zeros_(tensor):
    return constant_(tensor, 0.0)


def eye_(tensor):
    """Fill a 2-D tensor with the identity (keeps the identity of linear layers)."""
    _check(tensor, "eye_")
    if tensor.dim() != 2:
        raise ValueError("Only tensors with 2 dimensions are supported")
    return _fill_from(tensor, np.eye(*tuple(tensor.shape)))


def xavier_uniform_(tensor, gain=1.0, generator=None):
    """Glorot uniform: U(-a, a) with a = gain * sqrt(6 / (fan_in + fan_out))."""
    _check(tensor, "xavier_uniform_")
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    std = gain * math.sqrt(2.0 / float(fan_in + fan_out))
    a = math.sqrt(3.0) * std
    return uniform_(tensor, -a, a, generator)


def xavier_normal_(tensor, gain=1.0, generator=None):
    """Glorot normal: N(0, std^2) with std = gain * sqrt(2 / (fan_in + fan_out))."""
    _check(tensor, "xavier_normal_")
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    std = gain * math.sqrt(2.0 / float(fan_in + fan_out))
    return normal_(tensor, 0.0, std, generator)


def _kaiming_std(tensor, a, mode, nonlinearity, fn):
    _check(tensor, fn)
    if 0 in tuple(tensor.shape):
        warnings.warn("Initializing zero-element tensors is a no-op", stacklevel=3)
        return None
    fan = _calculate_correct_fan(tensor, mode)
    return calculate_gain(nonlinearity, a) / math.sqrt(fan)


def kaiming_uniform_(tensor, a=0, mode="fan_in", nonlinearity="leaky_relu", generator=None):
    """He uniform: U(-b, b) with b = gain * sqrt(3 / fan)."""
    std = _kaiming_std(tensor, a, mode, nonlinearity, "kaiming_uniform_")
    if std is None:
        return tensor
    bound = math.sqrt(3.0) * std
    return uniform_(tensor, -bound, bound, generator)


def kaiming_normal_(tensor, a=0, mode="fan_in", nonlinearity="leaky_relu", generator=None):
    """He normal: N(0, std^2) with std = gain / sqrt(fan)."""
    std = _kaiming_std(tensor, a, mode, nonlinearity, "kaiming_normal_")
    if std is None:
        return tensor
    return normal_(tensor, 0.0, std, generator)
