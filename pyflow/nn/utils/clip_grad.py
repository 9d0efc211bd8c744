"""Gradient clipping: rescale (by total norm) or clamp (by value) the ``.grad`` of
parameters in place, as ``torch.nn.utils`` does.

Norms are computed with pyflow ops, so they run wherever the gradients live.
"""
import math

from ...autograd import no_grad
from ...tensor import Tensor

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


def get_total_norm(tensors, norm_type=2.0, error_if_nonfinite=False, foreach=None):
    """The norm of the norms of ``tensors`` (= the norm of them all concatenated)."""
    from ...ops.creation import tensor
    if isinstance(tensors, Tensor):
        tensors = [tensors]
    tensors = list(tensors)
    norm_type = float(norm_type)
    if not tensors:
        return tensor(0.0)
    with no_grad():
        norms = [_vector_norm(g, norm_type).to(tensors[0].dtype).reshape(1) for g in tensors]
        if len(norms) == 1:
            total = norms[0].reshape(())
        else:
            from ... import ops
            total = _vector_norm(ops.cat(norms) if hasattr(ops, "cat") else
                                 tensor([n.item() for n in norms], dtype=tensors[0].dtype),
                                 norm_type)
    if error_if_nonfinite and not math.isfinite(total.item()):
        raise RuntimeError(f"The total norm of order {norm_type} for gradients from "
                           f"`parameters` is non-finite, so it cannot be clipped. To disable "
                           f"this error and scale the gradients by the non-finite norm anyway, "
                           f"set `error_if_nonfinite=False`")
    return total


def clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False,
                    foreach=None):
    """Scale all gradients by ``max_norm / (total_norm + 1e-6)`` when that is < 1.

    Returns the total norm of the gradients (before clipping) as a tensor.
    """
    if isinstance(parameters, Tensor):
        parameters = [parameters]
    parameters = list(parameters)
    grads = _grads_of(parameters)
    total = get_total_norm(grads, norm_type, error_if_nonfinite)
    if not grads:
        return total
    coef = min(float(max_norm) / (total.item() + 1e-6), 1.0)
    with no_grad():
        for g in grads:
            # PyTorch always multiplies (also by 1.0): a NaN norm spreads NaN, as there
            g.mul_(coef)
    return total


def clip_grad_value_(parameters, clip_value, foreach=None):
    """Clamp every gradient element into [-clip_value, clip_value]."""
    clip_value = float(clip_value)
    with no_grad():
        for g in _grads_of(parameters):
            g.clamp_(-clip_value, clip_value)
