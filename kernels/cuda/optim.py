"""Fused optimizer updates on the GPU: one kernel per parameter per step
(the counterpart of ``kernels/cpu/optim.py``, same signatures and checks).

Each thread updates whole elements in registers: a step reads param, grad and
the moments once and writes them once, where PyTorch's single-tensor Adam runs
about ten elementwise kernels.  The arithmetic follows torch's op order with
hyperparameters combined on the host in double, as torch does, then passed as
scalars of the parameter's dtype, so float32 parameters are updated in float32
only (no float64 literal reaches the kernel).  NVVM may contract a*b+c into an
FMA, so results can differ from the CPU kernel in the last bit.

Flags (amsgrad, maximize, ...) are kernel arguments: branches on them are
uniform across a warp and cost nothing next to the memory traffic.
"""
import math

import numpy as np
from numba import cuda

from ..cpu.optim import _check_adam_hparams, _check_sgd_hparams
from ..registry import register
from ._memory import launch_config, stream, zeros
from .copy import describe, read_only

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def _adam(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, weight_decay, decay,
          one_minus_beta1, beta2, one_minus_beta2, neg_step_size, bias_correction2_sqrt, eps,
          has_weight_decay, amsgrad, maximize, decoupled):
    for i in range(cuda.grid(1), param.size, cuda.gridsize(1)):
        g = grad[i]
        if maximize:
            g = -g
        p = param[i]
        if has_weight_decay:
            if decoupled:               # AdamW: param.mul_(1 - lr * weight_decay)
                p = p * decay
            else:                       # Adam: grad = grad.add(param, alpha=weight_decay)
                g = g + weight_decay * p
        m = exp_avg[i]
        m = m + one_minus_beta1 * (g - m)                   # exp_avg.lerp_(grad, 1 - beta1)
        v = exp_avg_sq[i] * beta2                           # exp_avg_sq.mul_(beta2)
        v = v + one_minus_beta2 * g * g                     #   .addcmul_(grad, grad, 1 - beta2)
        exp_avg[i] = m
        exp_avg_sq[i] = v
        if amsgrad:
            if max_exp_avg_sq[i] > v:
                v = max_exp_avg_sq[i]
            max_exp_avg_sq[i] = v
        denom = math.sqrt(v) / bias_correction2_sqrt + eps
        param[i] = p + neg_step_size * m / denom             # param.addcdiv_(m, denom, -step_size)


def _sgd(param, grad, momentum_buffer, neg_lr, weight_decay, momentum, one_minus_dampening,
         has_weight_decay, use_momentum, first_step, nesterov, maximize):
    for i in range(cuda.grid(1), param.size, cuda.gridsize(1)):
        g = grad[i]
        if maximize:
            g = -g
        p = param[i]
        if has_weight_decay:
            g = g + weight_decay * p
        if use_momentum:
            if first_step:                                  # buf = grad.clone()
                b = g
            else:                                           # buf.mul_(m).add_(g, 1 - damp)
                b = momentum_buffer[i] * momentum
                b = b + one_minus_dampening * g
            momentum_buffer[i] = b
            if nesterov:
                g = g + momentum * b
            else:
                g = b
        param[i] = p + neg_lr * g


KERNEL_FUNCTIONS = {"adam": _adam, "sgd": _sgd}
_jitted = {}


def _launch(name, n, *args):
    k = _jitted.get(name)
    if k is None:
        k = _jitted[name] = cuda.jit(KERNEL_FUNCTIONS[name])
    blocks, threads = launch_config(n)
    k[blocks, threads, stream()](*args)


def _check_arrays(op, names, arrays):
    """The CPU kernel's checks, for device arrays: one dtype (float32/float64),
    flat, C-contiguous, one size; all but 'grad' writeable."""
    for name, a in zip(names, arrays):
        if not hasattr(a, "__cuda_array_interface__") and not isinstance(a, np.ndarray):
            raise TypeError(f"{op}: '{name}' must be a device array, got {type(a).__name__}")
    ref_shape, _, dt = describe(arrays[0])
    if dt not in _FLOATS:
        raise TypeError(f"{op}: '{names[0]}' must be float32 or float64, got {dt}")
    n = ref_shape[0] if len(ref_shape) == 1 else None
    for i, (name, a) in enumerate(zip(names, arrays)):
        shape, strides, a_dt = describe(a)
        if a_dt != dt:
            raise TypeError(f"{op}: '{name}' has dtype {a_dt}, expected {dt} "
                            f"(the dtype of '{names[0]}')")
        if len(shape) != 1 or (shape[0] > 1 and strides[0] != dt.itemsize):
            raise ValueError(f"{op}: '{name}' must be a flat C-contiguous array "
                             f"(got shape {tuple(shape)}, strides {tuple(strides)})")
        if shape[0] != n:
            raise ValueError(f"{op}: '{name}' has {shape[0]} elements, expected {n} "
                             f"(the size of '{names[0]}')")
        if i != 1 and isinstance(a, np.ndarray) and not a.flags.writeable:
            raise ValueError(f"{op}: '{name}' must be writeable")
    return n, dt


@register("adam_step", "cuda")
def adam_step(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq=None, *, step, lr, beta1,
              beta2, eps, weight_decay=0.0, amsgrad=False, maximize=False,
              decoupled_weight_decay=False):
    """One Adam (or AdamW, with ``decoupled_weight_decay``) step, in place.

    ``step`` is the step number after incrementing (1 on the first step).
    """
    names = ["param", "grad", "exp_avg", "exp_avg_sq"]
    arrays = [param, grad, exp_avg, exp_avg_sq]
    if amsgrad:
        if max_exp_avg_sq is None:
            raise ValueError("adam_step: amsgrad=True needs 'max_exp_avg_sq'")
        names.append("max_exp_avg_sq")
        arrays.append(max_exp_avg_sq)
    n, dt = _check_arrays("adam_step", names, arrays)
    _check_adam_hparams(lr, beta1, beta2, eps, weight_decay)
    if not step >= 1:
        raise ValueError(f"adam_step: step must be >= 1, got {step}")
    bias_correction1 = 1 - beta1 ** step
    bias_correction2 = 1 - beta2 ** step
    step_size = lr / bias_correction1
    T = dt.type
    if not amsgrad:     # never read; a separate array (the simulator copies each argument
        max_exp_avg_sq = zeros(1, dt, param)  # back, so an alias of param would undo it)
    if n:
        _launch("adam", n, param, read_only(grad), exp_avg, exp_avg_sq, max_exp_avg_sq,
                T(weight_decay), T(1 - lr * weight_decay), T(1 - beta1), T(beta2), T(1 - beta2),
                T(-step_size), T(bias_correction2 ** 0.5), T(eps), weight_decay != 0,
                bool(amsgrad), bool(maximize), bool(decoupled_weight_decay))


@register("sgd_step", "cuda")
def sgd_step(param, grad, momentum_buffer=None, *, lr, momentum=0.0, dampening=0.0,
             weight_decay=0.0, nesterov=False, maximize=False, first_step=False):
    """One SGD step, in place.  With momentum, ``first_step`` initialises the
    buffer to the (decayed) gradient as torch does, ignoring dampening."""
    names, arrays = ["param", "grad"], [param, grad]
    use_momentum = momentum != 0
    if use_momentum:
        if momentum_buffer is None:
            raise ValueError("sgd_step: momentum != 0 needs 'momentum_buffer'")
        names.append("momentum_buffer")
        arrays.append(momentum_buffer)
    n, dt = _check_arrays("sgd_step", names, arrays)
    _check_sgd_hparams(lr, momentum, dampening, weight_decay, nesterov)
    if not use_momentum:
        momentum_buffer = zeros(1, dt, param)       # never read (see adam_step)
    T = dt.type
    if n:
        _launch("sgd", n, param, read_only(grad), momentum_buffer, T(-lr), T(weight_decay),
                T(momentum), T(1 - dampening), weight_decay != 0, bool(use_momentum),
                bool(first_step), bool(nesterov), bool(maximize))
