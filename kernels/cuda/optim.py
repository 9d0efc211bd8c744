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

from ..cpu.optim import check_adam_hparams, check_sgd_hparams, adam_members, sgd_members
from ..registry import register
from ._memory import launch_config, stream, zeros
from .copy import describe, read_only

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


@cuda.jit(device=True)
def _adam_element(i, param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, weight_decay, decay,
                  one_minus_beta1, beta2, one_minus_beta2, neg_step_size,
                  bias_correction2_sqrt, eps, has_weight_decay, amsgrad, maximize, decoupled):
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


@cuda.jit(device=True)
def _sgd_element(i, param, grad, momentum_buffer, neg_lr, weight_decay, momentum,
                 one_minus_dampening, has_weight_decay, use_momentum, first_step, nesterov,
                 maximize):
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


def _adam(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, weight_decay, decay,
          one_minus_beta1, beta2, one_minus_beta2, neg_step_size, bias_correction2_sqrt, eps,
          has_weight_decay, amsgrad, maximize, decoupled):
    for i in range(cuda.grid(1), param.size, cuda.gridsize(1)):
        _adam_element(i, param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, weight_decay, decay,
                      one_minus_beta1, beta2, one_minus_beta2, neg_step_size,
                      bias_correction2_sqrt, eps, has_weight_decay, amsgrad, maximize, decoupled)


def _sgd(param, grad, momentum_buffer, neg_lr, weight_decay, momentum, one_minus_dampening,
         has_weight_decay, use_momentum, first_step, nesterov, maximize):
    for i in range(cuda.grid(1), param.size, cuda.gridsize(1)):
        _sgd_element(i, param, grad, momentum_buffer, neg_lr, weight_decay, momentum,
                     one_minus_dampening, has_weight_decay, use_momentum, first_step, nesterov,
                     maximize)


# Multi-tensor kernels (graph mode's allow_fuse_model_update_ops): the buffers
# of up to TUPLE_WIDTH parameters arrive as tuples of arrays (padded with a
# one-element array), the hyperparameters as one flat tuple of scalars
# (ADAM_HP or SGD_HP per parameter) and the flags as a tuple of bools, all
# passed by value in the launch's parameter block: no host-to-device copy of a
# hyperparameter table per step, and one compilation per dtype.  Every thread
# walks the tensors in turn with a grid-stride loop over each, so one launch
# does the whole step.  The width keeps the parameter block well under the
# 4 KiB limit (5 tuples x 8 arrays x 56 bytes + 64 scalars).
TUPLE_WIDTH = 8
ADAM_HP, ADAM_FLAGS, SGD_HP, SGD_FLAGS = 8, 4, 4, 5


def _adam_multi(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, hp, flags, n):
    for t in range(n):
        param = params[t]
        grad, exp_avg, exp_avg_sq, vmax = grads[t], exp_avgs[t], exp_avg_sqs[t], \
            max_exp_avg_sqs[t]
        h, f = t * ADAM_HP, t * ADAM_FLAGS
        for i in range(cuda.grid(1), param.size, cuda.gridsize(1)):
            _adam_element(i, param, grad, exp_avg, exp_avg_sq, vmax, hp[h], hp[h + 1],
                          hp[h + 2], hp[h + 3], hp[h + 4], hp[h + 5], hp[h + 6], hp[h + 7],
                          flags[f], flags[f + 1], flags[f + 2], flags[f + 3])


def _sgd_multi(params, grads, momentum_buffers, hp, flags, n):
    for t in range(n):
        param = params[t]
        grad, buf = grads[t], momentum_buffers[t]
        h, f = t * SGD_HP, t * SGD_FLAGS
        for i in range(cuda.grid(1), param.size, cuda.gridsize(1)):
            _sgd_element(i, param, grad, buf, hp[h], hp[h + 1], hp[h + 2], hp[h + 3],
                         flags[f], flags[f + 1], flags[f + 2], flags[f + 3], flags[f + 4])


KERNEL_FUNCTIONS = {"adam": _adam, "sgd": _sgd, "adam_multi": _adam_multi,
                    "sgd_multi": _sgd_multi}
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
    check_adam_hparams(lr, beta1, beta2, eps, weight_decay)
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
    check_sgd_hparams(lr, momentum, dampening, weight_decay, nesterov)
    if not use_momentum:
        momentum_buffer = zeros(1, dt, param)       # never read (see adam_step)
    T = dt.type
    if n:
        _launch("sgd", n, param, read_only(grad), momentum_buffer, T(-lr), T(weight_decay),
                T(momentum), T(1 - dampening), weight_decay != 0, bool(use_momentum),
                bool(first_step), bool(nesterov), bool(maximize))


# ------------------------------------------------------------------ multi-tensor updates
def _same_dtype(op, i, names, arrays, dt):
    """Check parameter i's arrays; every parameter of a call has one dtype."""
    _, a_dt = _check_arrays(op, names, arrays)
    if dt is not None and a_dt != dt:
        raise TypeError(f"{op}: 'params[{i}]' has dtype {a_dt}, expected {dt} (the dtype "
                        f"of 'params[0]'); call once per dtype")
    return a_dt


def _kernel_array(a):
    """A tuple member as numba.cuda types it: simulated arrays as they are; CuPy
    arrays (typed by numba only as top-level arguments) as zero-copy views."""
    return a if isinstance(a, np.ndarray) else cuda.as_cuda_array(a, sync=False)


def _launch_multi(name, columns, scalars, flag_rows, dt, like):
    """Launch ``name`` over every TUPLE_WIDTH chunk of the parameters.  A None
    in ``columns`` (an unused buffer) and the tuples' unused slots get a
    one-element array that is never read (a separate one: the simulator must
    not see an alias of a parameter)."""
    pad = _kernel_array(zeros(1, dt, like))
    n = len(columns[0])
    T = dt.type
    for lo in range(0, n, TUPLE_WIDTH):
        hi = min(lo + TUPLE_WIDTH, n)
        width = TUPLE_WIDTH - (hi - lo)
        arrays = [tuple(pad if a is None else _kernel_array(a) for a in col[lo:hi])
                  + (pad,) * width for col in columns]
        hp = tuple(T(x) for row in scalars[lo:hi] for x in row)
        hp += (T(0),) * (len(scalars[0]) * width)
        flags = tuple(bool(x) for row in flag_rows[lo:hi] for x in row)
        flags += (False,) * (len(flag_rows[0]) * width)
        largest = max(int(describe(a)[0][0]) for a in columns[0][lo:hi])
        if largest:
            _launch(name, largest, *arrays, hp, flags, hi - lo)


@register("adam_multi_step", "cuda")
def adam_multi_step(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, hparams, flags):
    """``adam_step`` over many parameters of one dtype in one launch per
    TUPLE_WIDTH parameters (the CPU kernel's signature and checks)."""
    op = "adam_multi_step"
    scalars, flag_rows, maxes, dt = [], [], [], None
    for i, names, arrays, row, amsgrad, maximize, decoupled in adam_members(
            op, params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, hparams, flags):
        dt = _same_dtype(op, i, names, arrays, dt)
        weight_decay = row[0]
        scalars.append(row)
        flag_rows.append((weight_decay != 0, amsgrad, maximize, decoupled))
        maxes.append(max_exp_avg_sqs[i] if amsgrad else None)
    if not scalars:
        return
    _launch_multi("adam_multi", [params, [_grad_member(g) for g in grads], exp_avgs,
                                 exp_avg_sqs, maxes], scalars, flag_rows, dt, params[0])


@register("sgd_multi_step", "cuda")
def sgd_multi_step(params, grads, momentum_buffers, hparams, flags):
    """``sgd_step`` over many parameters of one dtype in one launch per
    TUPLE_WIDTH parameters (the CPU kernel's signature and checks)."""
    op = "sgd_multi_step"
    scalars, flag_rows, bufs, dt = [], [], [], None
    for i, names, arrays, row, use_momentum, first_step, nesterov, maximize in sgd_members(
            op, params, grads, momentum_buffers, hparams, flags):
        dt = _same_dtype(op, i, names, arrays, dt)
        scalars.append(row)
        flag_rows.append((row[1] != 0, use_momentum, first_step, nesterov, maximize))
        bufs.append(momentum_buffers[i] if use_momentum else None)
    if not scalars:
        return
    _launch_multi("sgd_multi", [params, [_grad_member(g) for g in grads], bufs],
                  scalars, flag_rows, dt, params[0])


def _grad_member(grad):
    """Gradients are only read, but a tuple member cannot be a ``cuda.In`` hint
    (the simulator passes tuples as they are, with no copy in or back): a
    read-only host view would be refused, so it is copied."""
    if isinstance(grad, np.ndarray) and not grad.flags.writeable:
        return grad.copy()
    return grad
