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


def check_adam_hparams(lr, beta1, beta2, eps, weight_decay):
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


def check_sgd_hparams(lr, momentum, dampening, weight_decay, nesterov):
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
    check_adam_hparams(lr, beta1, beta2, eps, weight_decay)
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
    check_sgd_hparams(lr, momentum, dampening, weight_decay, nesterov)
    hp = np.array([-lr, weight_decay, momentum, 1 - dampening], dtype=param.dtype)
    _sgd_kernel(param, grad, momentum_buffer, hp, bool(use_momentum), bool(first_step),
                bool(nesterov), bool(maximize))



# ------------------------------------------------------------------ multi-tensor updates
# One call updates every parameter of an optimizer group (graph mode's
# allow_fuse_model_update_ops).  How the list of buffers reaches numba: a tuple
# of flat arrays, padded to a fixed width TUPLE_WIDTH with an empty array.  A
# homogeneous tuple is unboxed by the dispatcher as cheaply as separate
# arguments and can be indexed with a runtime index, and the fixed width means
# one compilation per dtype whatever the parameter count (longer lists run in
# chunks).  The alternatives cost more: a numba typed List is built element by
# element from the interpreter on every call (the gradients are new arrays each
# step), and concatenating the buffers into one flat array would copy params,
# grads and moments every step, or move every parameter's storage for good.
# The per-tensor loop calls the single-tensor kernel above, so a fused step does
# exactly the arithmetic of the unfused one (bit for bit).
TUPLE_WIDTH = 16
_EMPTY = {dt: np.empty(0, dt) for dt in _FLOATS}


@njit(nogil=True, cache=True, error_model="numpy")
def _adam_multi_kernel(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, hp, flags, n):
    for t in range(n):
        _adam_kernel(params[t], grads[t], exp_avgs[t], exp_avg_sqs[t], max_exp_avg_sqs[t],
                     hp[t], flags[t, 0] != 0, flags[t, 1] != 0, flags[t, 2] != 0)


@njit(nogil=True, cache=True, error_model="numpy")
def _sgd_multi_kernel(params, grads, momentum_buffers, hp, flags, n):
    for t in range(n):
        _sgd_kernel(params[t], grads[t], momentum_buffers[t], hp[t], flags[t, 0] != 0,
                    flags[t, 1] != 0, flags[t, 2] != 0, flags[t, 3] != 0)


def _check_lists(op, lists, names):
    """Every list as long as the first, each non-empty; returns the count."""
    n = len(lists[0])
    for name, items in zip(names, lists):
        if not isinstance(items, (list, tuple)):
            raise TypeError(f"{op}: '{name}' must be a list of arrays, got {type(items).__name__}")
        if len(items) != n:
            raise ValueError(f"{op}: '{name}' has {len(items)} entries, expected {n} "
                             f"(one per parameter, like '{names[0]}')")
    return n


def adam_members(op, params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, hparams, flags):
    """The argument checks of ``adam_multi_step`` that do not depend on the device
    (the CPU and CUDA kernels share them).  Yields, per parameter i,
    ``(i, names, arrays, scalars, amsgrad, maximize, decoupled)``: the arrays
    the kernel touches with their argument names, and the packed scalars
    ``(wd, 1 - lr*wd, 1 - beta1, beta2, 1 - beta2, -lr/bc1, sqrt(bc2), eps)``,
    the same double-precision values as ``adam_step`` computes."""
    n = _check_lists(op, [params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, hparams, flags],
                     ["params", "grads", "exp_avgs", "exp_avg_sqs", "max_exp_avg_sqs",
                      "hparams", "flags"])
    rows = {}                     # hyperparameters seen -> packed scalars (usually one)
    for i in range(n):
        amsgrad, maximize, decoupled = (bool(f) for f in flags[i])
        names = [f"params[{i}]", f"grads[{i}]", f"exp_avgs[{i}]", f"exp_avg_sqs[{i}]"]
        arrays = [params[i], grads[i], exp_avgs[i], exp_avg_sqs[i]]
        if amsgrad:
            if max_exp_avg_sqs[i] is None:
                raise ValueError(f"{op}: amsgrad=True for parameter {i} needs "
                                 f"'max_exp_avg_sqs[{i}]'")
            names.append(f"max_exp_avg_sqs[{i}]")
            arrays.append(max_exp_avg_sqs[i])
        row = rows.get(hparams[i])
        if row is None:
            row = rows[hparams[i]] = adam_row(op, hparams[i], i)
        yield i, names, arrays, row, amsgrad, maximize, decoupled


def adam_row(op, hparams, i):
    """Parameter i's ``(step, lr, beta1, beta2, eps, weight_decay)`` checked and
    packed as the kernels read them (``_ADAM_HP``), in double as torch does."""
    step, lr, beta1, beta2, eps, weight_decay = hparams
    check_adam_hparams(lr, beta1, beta2, eps, weight_decay)
    if not step >= 1:
        raise ValueError(f"{op}: step of parameter {i} must be >= 1, got {step}")
    bias_correction1 = 1 - beta1 ** step
    bias_correction2 = 1 - beta2 ** step
    return (weight_decay, 1 - lr * weight_decay, 1 - beta1, beta2, 1 - beta2,
            -(lr / bias_correction1), bias_correction2 ** 0.5, eps)


def sgd_members(op, params, grads, momentum_buffers, hparams, flags):
    """The device-independent checks of ``sgd_multi_step``.  Yields, per parameter
    i, ``(i, names, arrays, scalars, use_momentum, first_step, nesterov,
    maximize)`` with scalars ``(-lr, weight_decay, momentum, 1 - dampening)``."""
    n = _check_lists(op, [params, grads, momentum_buffers, hparams, flags],
                     ["params", "grads", "momentum_buffers", "hparams", "flags"])
    checked = set()               # hyperparameters already checked
    for i in range(n):
        lr, momentum, dampening, weight_decay = hparams[i]
        nesterov, maximize, first_step = (bool(f) for f in flags[i])
        names, arrays = [f"params[{i}]", f"grads[{i}]"], [params[i], grads[i]]
        use_momentum = momentum != 0
        if use_momentum:
            if momentum_buffers[i] is None:
                raise ValueError(f"{op}: momentum != 0 for parameter {i} needs "
                                 f"'momentum_buffers[{i}]'")
            names.append(f"momentum_buffers[{i}]")
            arrays.append(momentum_buffers[i])
        if hparams[i] not in checked:
            check_sgd_hparams(lr, momentum, dampening, weight_decay, nesterov)
            checked.add(hparams[i])
        yield (i, names, arrays, (-lr, weight_decay, momentum, 1 - dampening), use_momentum,
               first_step, nesterov, maximize)


def _check_group_arrays(op, names, arrays, dtype):
    """``_check_arrays`` with a fast path (this runs once per parameter per
    step), plus: every parameter of a call has the first one's dtype."""
    ref = arrays[0]
    n = ref.size if type(ref) is np.ndarray else -1
    for i, a in enumerate(arrays):
        if not (type(a) is np.ndarray and a.dtype == dtype and a.ndim == 1 and a.size == n
                and a.flags.c_contiguous and (i == 1 or a.flags.writeable)):
            break
    else:
        return
    if type(ref) is np.ndarray and ref.dtype != dtype:
        raise TypeError(f"{op}: '{names[0]}' has dtype {ref.dtype}, expected {dtype} (the "
                        f"dtype of 'params[0]'); call once per dtype")
    _check_arrays(op, names, arrays)


def _one_setting(lists, hparams, flags, dtype):
    """The common case of a multi-tensor call, checked in one pass with no
    per-parameter messages built: every parameter has the same flags, and
    every array is a flat, C-contiguous, writeable ``dtype`` array the size of
    its parameter.  False sends the call through the per-parameter checks,
    which name what is wrong."""
    n = len(lists[0])
    if dtype not in _FLOATS or any(len(items) != n for items in lists) \
            or not isinstance(hparams, (list, tuple)) or not isinstance(flags, (list, tuple)) \
            or len(hparams) != n or len(flags) != n or flags.count(flags[0]) != n:
        return False
    ndarray = np.ndarray
    for arrays in zip(*lists):
        size = arrays[0].size
        for a in arrays:
            if type(a) is not ndarray or a.dtype != dtype or a.ndim != 1 or a.size != size:
                return False
            flags = a.flags
            if not (flags.c_contiguous and flags.writeable):
                return False
    return True


def _padded_chunks(n, dtype):
    """(lo, hi) chunks of TUPLE_WIDTH and a function padding a chunk's arrays."""
    empty = _EMPTY[dtype]

    def pad(arrays):
        return tuple(arrays) + (empty,) * (TUPLE_WIDTH - len(arrays))
    return [(lo, min(lo + TUPLE_WIDTH, n)) for lo in range(0, n, TUPLE_WIDTH)], pad


def _writeable(a):
    """The kernels index a tuple of one array type: a read-only grad is copied."""
    return a if a.flags.writeable else a.copy()


@register("adam_multi_step", "cpu")
def adam_multi_step(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, hparams, flags):
    """``adam_step`` over many parameters of one dtype in one kernel call.

    ``hparams[i]`` is ``(step, lr, beta1, beta2, eps, weight_decay)`` and
    ``flags[i]`` ``(amsgrad, maximize, decoupled_weight_decay)`` of parameter i;
    ``max_exp_avg_sqs[i]`` may be None where amsgrad is off."""
    op = "adam_multi_step"
    n = len(params) if isinstance(params, (list, tuple)) else 0
    dtype = params[0].dtype if n and isinstance(params[0], np.ndarray) else None
    hp = np.empty((n, len(_ADAM_HP)), dtype=dtype if dtype in _FLOATS else np.float64)
    flag_rows = np.zeros((n, 3), np.int8)
    if n and _one_setting((params, grads, exp_avgs, exp_avg_sqs), hparams, flags, dtype) \
            and not flags[0][0]:
        index, table = {}, []                     # no amsgrad: no max_exp_avg_sq to check
        for i, h in enumerate(hparams):           # usually one or two settings (decay or not)
            if h not in index:
                index[h] = len(table)
                table.append(adam_row(op, h, i))
        hp[:] = np.array(table, dtype=hp.dtype)[[index[h] for h in hparams]]
        flag_rows[:] = tuple(bool(f) for f in flags[0])
        maxes = [_EMPTY[dtype]] * n               # (every grad writeable: _one_setting)
    else:
        maxes = []
        for i, names, arrays, row, amsgrad, maximize, decoupled in adam_members(
                op, params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, hparams, flags):
            _check_group_arrays(op, names, arrays, dtype)
            hp[i] = row
            flag_rows[i] = (amsgrad, maximize, decoupled)
            maxes.append(max_exp_avg_sqs[i] if amsgrad else _EMPTY[dtype])
        grads = [_writeable(g) for g in grads]    # (checked above: arrays)
    if n == 0:
        return
    chunks, pad = _padded_chunks(n, dtype)
    for lo, hi in chunks:
        _adam_multi_kernel(pad(params[lo:hi]), pad(grads[lo:hi]), pad(exp_avgs[lo:hi]),
                           pad(exp_avg_sqs[lo:hi]), pad(maxes[lo:hi]), hp[lo:hi],
                           flag_rows[lo:hi], hi - lo)


@register("sgd_multi_step", "cpu")
def sgd_multi_step(params, grads, momentum_buffers, hparams, flags):
    """``sgd_step`` over many parameters of one dtype in one kernel call.

    ``hparams[i]`` is ``(lr, momentum, dampening, weight_decay)`` and
    ``flags[i]`` ``(nesterov, maximize, first_step)`` of parameter i;
    ``momentum_buffers[i]`` may be None where momentum is 0."""
    op = "sgd_multi_step"
    n = len(params) if isinstance(params, (list, tuple)) else 0
    dtype = params[0].dtype if n and isinstance(params[0], np.ndarray) else None
    hp = np.empty((n, 4), dtype=dtype if dtype in _FLOATS else np.float64)
    flag_rows = np.zeros((n, 4), np.int8)
    bufs = []
    for i, names, arrays, row, use_momentum, first_step, nesterov, maximize in sgd_members(
            op, params, grads, momentum_buffers, hparams, flags):
        _check_group_arrays(op, names, arrays, dtype)
        hp[i] = row
        flag_rows[i] = (use_momentum, first_step, nesterov, maximize)
        bufs.append(momentum_buffers[i] if use_momentum else _EMPTY[dtype])
    if n == 0:
        return
    chunks, pad = _padded_chunks(n, dtype)
    grads = [_writeable(g) for g in grads]
    for lo, hi in chunks:
        _sgd_multi_kernel(pad(params[lo:hi]), pad(grads[lo:hi]), pad(bufs[lo:hi]), hp[lo:hi],
                          flag_rows[lo:hi], hi - lo)
