"""Fused optimizer updates: one numba pass over a parameter per step.

PyTorch's single-tensor Adam runs about ten elementwise kernels per parameter
(lerp, mul, addcmul, sqrt, div, add, addcdiv, ...), each a full pass over
memory.  Here the whole update of one element happens in registers, so a step
reads param, grad and the moments once and writes them once.

The arithmetic follows PyTorch's op order and rounds every intermediate to the
parameter's dtype, the way ATen's float32 CPU kernels do: hyperparameters are
combined in Python floats (double) exactly as ``torch.optim`` does, then cast
to the array dtype, and the loop never mixes in a float64 literal.  Results
match torch to ~1e-7 relative per step (ATen uses FMA in lerp, we do not).

Kernels take flat, C-contiguous float32/float64 arrays and update them in
place; the wrappers check that before numba sees anything.  They compile with
``error_model="numpy"``: Python's model puts a ZeroDivisionError branch on
every division, which stops LLVM from vectorizing the loop (measured 2.3x
slower on 8M float32 Adam); NumPy's model gives inf/nan like torch.
"""
import numpy as np
from numba import njit

from ..registry import register

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


# Hyperparameters arrive packed in one small array of the param dtype: numba's
# dispatch cost grows with the argument count, and the array's creation casts
# every Python float to the dtype exactly as ``T(x)`` would.
_ADAM_HP = ("weight_decay", "decay", "one_minus_beta1", "beta2", "one_minus_beta2",
            "neg_step_size", "bias_correction2_sqrt", "eps")


@njit(nogil=True, cache=True, error_model="numpy")  # numpy model: no zero-division branch,
def _adam_kernel(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, hp,  # so LLVM vectorizes
                 amsgrad, maximize, decoupled):
    weight_decay, decay, one_minus_beta1, beta2 = hp[0], hp[1], hp[2], hp[3]
    one_minus_beta2, neg_step_size, bias_correction2_sqrt, eps = hp[4], hp[5], hp[6], hp[7]
    for i in range(param.size):
        g = grad[i]
        if maximize:
            g = -g
        p = param[i]
        if weight_decay != 0:
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
        denom = np.sqrt(v) / bias_correction2_sqrt + eps
        param[i] = p + neg_step_size * m / denom             # param.addcdiv_(m, denom, -step_size)


@njit(nogil=True, cache=True, error_model="numpy")
def _sgd_kernel(param, grad, momentum_buffer, hp, use_momentum, first_step, nesterov,
                maximize):
    neg_lr, weight_decay, momentum, one_minus_dampening = hp[0], hp[1], hp[2], hp[3]
    for i in range(param.size):
        g = grad[i]
        if maximize:
            g = -g
        p = param[i]
        if weight_decay != 0:
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


def _check_arrays(op, names, arrays):
    ref = arrays[0]
    if not isinstance(ref, np.ndarray):
        raise TypeError(f"{op}: '{names[0]}' must be a NumPy array, got {type(ref).__name__}")
    dt, n = ref.dtype, ref.size
    if dt not in _FLOATS:
        raise TypeError(f"{op}: '{names[0]}' must be float32 or float64, got {dt}")
    for i, a in enumerate(arrays):
        if not isinstance(a, np.ndarray) or a.dtype != dt or a.ndim != 1 or a.size != n \
                or not a.flags.c_contiguous or (i != 1 and not a.flags.writeable):
            _explain(op, names[i], a, names[0], ref, writeable=i != 1)


def _explain(op, name, a, ref_name, ref, writeable):
    """The message for the first thing wrong with array ``a``."""
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{op}: '{name}' must be a NumPy array, got {type(a).__name__}")
    if a.dtype != ref.dtype:
        raise TypeError(f"{op}: '{name}' has dtype {a.dtype}, expected {ref.dtype} "
                        f"(the dtype of '{ref_name}')")
    if a.ndim != 1 or not a.flags.c_contiguous:
        raise ValueError(f"{op}: '{name}' must be a flat C-contiguous array "
                         f"(got shape {a.shape}, contiguous={a.flags.c_contiguous})")
    if a.size != ref.size:
        raise ValueError(f"{op}: '{name}' has {a.size} elements, expected {ref.size} "
                         f"(the size of '{ref_name}')")
    if writeable:
        raise ValueError(f"{op}: '{name}' must be writeable")


def _check_adam_hparams(lr, beta1, beta2, eps, weight_decay):
    """The argument checks of torch.optim.Adam, with its messages."""
    if not 0.0 <= lr:
        raise ValueError(f"Invalid learning rate: {lr}")
    if not 0.0 <= eps:
        raise ValueError(f"Invalid epsilon value: {eps}")
    if not 0.0 <= beta1 < 1.0:
        raise ValueError(f"Invalid beta parameter at index 0: {beta1}")
    if not 0.0 <= beta2 < 1.0:
        raise ValueError(f"Invalid beta parameter at index 1: {beta2}")
    if not 0.0 <= weight_decay:
        raise ValueError(f"Invalid weight_decay value: {weight_decay}")


def _check_sgd_hparams(lr, momentum, dampening, weight_decay, nesterov):
    """The argument checks of torch.optim.SGD, with its messages."""
    if not 0.0 <= lr:
        raise ValueError(f"Invalid learning rate: {lr}")
    if not 0.0 <= momentum:
        raise ValueError(f"Invalid momentum value: {momentum}")
    if not 0.0 <= weight_decay:
        raise ValueError(f"Invalid weight_decay value: {weight_decay}")
    if nesterov and (momentum <= 0 or dampening != 0):
        raise ValueError("Nesterov momentum requires a momentum and zero dampening")


@register("adam_step", "cpu")
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
    _check_arrays("adam_step", names, arrays)
    _check_adam_hparams(lr, beta1, beta2, eps, weight_decay)
    if not step >= 1:
        raise ValueError(f"adam_step: step must be >= 1, got {step}")
    # Scalars exactly as torch's _single_tensor_adam computes them (in double).
    bias_correction1 = 1 - beta1 ** step
    bias_correction2 = 1 - beta2 ** step
    step_size = lr / bias_correction1
    hp = np.array([weight_decay, 1 - lr * weight_decay, 1 - beta1, beta2, 1 - beta2,
                   -step_size, bias_correction2 ** 0.5, eps], dtype=param.dtype)
    if not amsgrad:
        max_exp_avg_sq = param[:0]  # never read; keeps the kernel's types fixed
    _adam_kernel(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, hp, bool(amsgrad),
                 bool(maximize), bool(decoupled_weight_decay))


@register("sgd_step", "cpu")
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
    else:
        momentum_buffer = param[:0]
    _check_arrays("sgd_step", names, arrays)
    _check_sgd_hparams(lr, momentum, dampening, weight_decay, nesterov)
    hp = np.array([-lr, weight_decay, momentum, 1 - dampening], dtype=param.dtype)
    _sgd_kernel(param, grad, momentum_buffer, hp, bool(use_momentum), bool(first_step),
                bool(nesterov), bool(maximize))

