"""Gradient clipping: rescale (by total norm) or clamp (by value) the ``.grad`` of
parameters in place, as ``torch.nn.utils`` does.

``clip_grad_norm_`` runs once per step over every gradient, so local gradients
take the multi-tensor kernels (``multi_tensor_norm`` / ``multi_tensor_scale``
in ``kernels/*/grad_norm.py``): one norm call and one scale call per (device,
dtype) group, instead of a few ops and a ``mul_`` per gradient.  The norm is
accumulated in float64 and rounded once to the result dtype; the scaling is
bit for bit ``g.mul_(coef)``.  Global (SBP) gradients, gradients met while a
graph is being traced, and norms other than 1, 2 and inf take the op path:
norms computed with pyflow ops, so they run wherever the gradients live.

As in PyTorch, the total norm's dtype is the promotion of the gradients'
dtypes (float32 and float64 gradients give a float64 norm), on the first
gradient's device.
"""
import math

from ... import dtypes as _dt
from ...autograd import no_grad
from ...ops._util import kernel, trace_state
from ...tensor import TENSOR_TYPES, Tensor

__all__ = ["clip_grad_norm_", "clip_grad_value_", "get_total_norm"]


def _grads_of(parameters):
    if isinstance(parameters, Tensor):
        parameters = [parameters]
    return [p.grad for p in parameters if p.grad is not None]


def _vector_norm(t, norm_type):
    """||t||_p of all elements, as a 0-d tensor in t's dtype (float64 accumulation
    for half types would differ from PyTorch only in rounding)."""
    a = t.detach()
    if norm_type == math.inf:
        return a.abs().reshape(-1).max() if hasattr(a, "max") else _np_max(a, abs)
    if norm_type == -math.inf:
        return a.abs().reshape(-1).min() if hasattr(a, "min") else _np_max(a, lambda x: -abs(x))
    if norm_type == 0:
        return (a != 0).to(a.dtype).sum()
    if norm_type == 1:
        return a.abs().sum()
    if norm_type == 2:
        return a.square().sum().sqrt()
    return a.abs().pow(norm_type).sum().pow(1.0 / norm_type)


def _np_max(a, key):
    """Fallback while pyflow has no max reduction: the extreme |value| via NumPy."""
    import numpy as np
    from ...ops.creation import tensor
    vals = np.abs(a._host())                # a host copy for device tensors
    v = (vals.max() if key is abs else vals.min()) if vals.size else 0.0
    return tensor(v, dtype=a.dtype, device=a.device)


_KERNEL_NORMS = (1.0, 2.0, math.inf)


def _kernel_groups(tensors):
    """{(device, dtype): [tensor]} when every tensor may go to the multi-tensor
    kernels (local, plain tensors, no graph being traced), else None."""
    if trace_state.tracer is not None:
        return None
    groups = {}
    for t in tensors:
        if type(t) not in TENSOR_TYPES or t._placement is not None:
            return None
        groups.setdefault((t.device, t.dtype), []).append(t)
    return groups


def _as_values(dtype):
    """True for a dtype the kernels cannot take as stored (bfloat16's uint16 words)."""
    return dtype.storage is not dtype.compute and dtype is not _dt.float16


def _kernel_arrays(dtype, tensors):
    """What the kernels take: the storage, or new float32 values of bfloat16."""
    if _as_values(dtype):
        return [t._compute() for t in tensors]
    return [t._data for t in tensors]


def _result_dtype(tensors):
    d = tensors[0].dtype
    for t in tensors[1:]:
        if t.dtype is not d:
            d = _dt.promote_types(d, t.dtype)
    return d


def _kernel_total(groups, norm_type):
    """The norm of every group's tensors, one ``multi_tensor_norm`` call per group,
    as a Python float (float64)."""
    norms = [kernel("multi_tensor_norm", device.type)(_kernel_arrays(dtype, ts), norm_type)
             for (device, dtype), ts in groups.items()]
    if len(norms) == 1:
        return norms[0]
    if norm_type == math.inf:
        return math.nan if any(math.isnan(n) for n in norms) else max(norms)
    if norm_type == 1.0:
        return math.fsum(norms)
    return math.sqrt(math.fsum(n * n for n in norms))


def _op_total(tensors, norm_type, dtype):
    from ...ops.creation import tensor
    norms = [_vector_norm(g, norm_type).to(dtype).reshape(1) for g in tensors]
    if len(norms) == 1:
        return norms[0].reshape(())
    from ... import ops
    return _vector_norm(ops.cat(norms) if hasattr(ops, "cat") else
                        tensor([n.item() for n in norms], dtype=dtype), norm_type)


def _item(total):
    """The total's value as a Python float on every rank: a global total (of global
    gradients) is made whole first, a collective, as every rank clips."""
    if total._placement is None:
        return total.item()
    from ...distributed.sbp import broadcast
    return total.to_global(sbp=(broadcast,) * total._placement.ndim).to_local().item()


def _total_norm(tensors, norm_type, error_if_nonfinite, groups):
    from ...ops.creation import tensor
    norm_type = float(norm_type)
    if not tensors:
        return tensor(0.0)
    dtype = _result_dtype(tensors)
    with no_grad():
        if groups is not None and norm_type in _KERNEL_NORMS:
            total = tensor(_kernel_total(groups, norm_type), dtype=dtype,
                           device=tensors[0].device)
        else:
            total = _op_total(tensors, norm_type, dtype)
    if error_if_nonfinite and not math.isfinite(_item(total)):
        raise RuntimeError(f"The total norm of order {norm_type} for gradients from "
                           f"`parameters` is non-finite, so it cannot be clipped. To disable "
                           f"this error and scale the gradients by the non-finite norm anyway, "
                           f"set `error_if_nonfinite=False`")
    return total


def get_total_norm(tensors, norm_type=2.0, error_if_nonfinite=False, foreach=None):
    """The norm of the norms of ``tensors`` (= the norm of them all concatenated)."""
    if isinstance(tensors, Tensor):
        tensors = [tensors]
    tensors = list(tensors)
    return _total_norm(tensors, norm_type, error_if_nonfinite, _kernel_groups(tensors))


def _scale_groups(groups, coef):
    """Every gradient of ``groups`` times ``coef`` in place, as ``g.mul_(coef)``:
    one ``multi_tensor_scale`` call per group."""
    for (device, dtype), ts in groups.items():
        arrays = _kernel_arrays(dtype, ts)
        kernel("multi_tensor_scale", device.type)(arrays, coef)
        if _as_values(dtype):                               # bfloat16: cast the values back
            cast = kernel("cast", device.type)
            for t, values in zip(ts, arrays):
                t._data[...] = cast(values, _dt.float32, dtype)
        for t in ts:
            t._version[0] += 1


def clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False,
                    foreach=None):
    """Scale all gradients by ``max_norm / (total_norm + 1e-6)`` when that is < 1.

    Returns the total norm of the gradients (before clipping) as a tensor.
    """
    if isinstance(parameters, Tensor):
        parameters = [parameters]
    parameters = list(parameters)
    grads = _grads_of(parameters)
    groups = _kernel_groups(grads)
    total = _total_norm(grads, norm_type, error_if_nonfinite, groups)
    if not grads:
        return total
    coef = min(float(max_norm) / (_item(total) + 1e-6), 1.0)
    # PyTorch always multiplies (also by 1.0): a NaN norm spreads NaN, as there
    if groups is not None:
        _scale_groups(groups, coef)
        return total
    with no_grad():
        for g in grads:
            g.mul_(coef)
    return total


def clip_grad_value_(parameters, clip_value, foreach=None):
    """Clamp every gradient element into [-clip_value, clip_value]."""
    clip_value = float(clip_value)
    with no_grad():
        for g in _grads_of(parameters):
            g.clamp_(-clip_value, clip_value)
