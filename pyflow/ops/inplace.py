"""In-place writes: ``x.add_(y)``, ``x[k] = v``, ``fill_``, ``copy_``...

Every in-place op is its out-of-place op plus one write, made by ``_inplace``:
when autograd records, the out-of-place op runs on a copy of the old value and
``self`` takes the result's place in the graph (earlier nodes that saved
``self`` see its version change and refuse to run); a global ``self`` keeps
its layout; a graph trace records the write instead (``_hooks.note_inplace``).
The families (elementwise, indexing, scatter, dropout) build their ``op_``
forms with it; this module sits below them and imports only ``shape``.
"""
import numpy as np

from .. import _hooks
from .. import dtypes as _dt
from ..autograd import is_grad_enabled
from ..tensor import Tensor
from ._method import tensor_method
from ._util import check_scalar_fits, check_tensor, kernel
from .shape import Clone, clone, expand

__all__ = ["zero_", "fill_", "copy_"]


def _can_cast(src, dst):
    return src.category <= dst.category


def _inplace(self, op, *others):
    """``self = op(self, *others)`` writing into self's storage.

    When autograd is recording, the out-of-place op is recorded on a copy of the
    old value and ``self`` takes over the result's place in the graph, so earlier
    nodes that saved ``self`` see its version change and refuse to run.
    """
    if not isinstance(self, Tensor):
        raise TypeError("in-place op: self must be a Tensor")
    record = is_grad_enabled() and (self.requires_grad or any(
        isinstance(o, Tensor) and o.requires_grad for o in others))
    if record:
        if self.grad_fn is None and self.requires_grad:
            raise RuntimeError("a leaf Variable that requires grad is being used in an in-place "
                               "operation (use `with pyflow.no_grad():` or an out-of-place op).")
        if self._base is not None and (self._base.requires_grad or self.requires_grad):
            raise RuntimeError("in-place operation on a view of a tensor that requires grad is not "
                               "supported by pyflow autograd; use an out-of-place op instead")
        res = op(clone(self), *others)
    else:
        res = op(self, *others)
    if not _can_cast(res.dtype, self.dtype):
        raise RuntimeError(f"result type {res.dtype.name} can't be cast to the desired output "
                           f"type {self.dtype.name} of the in-place op")
    if tuple(res.shape) != tuple(self.shape):
        raise RuntimeError(f"output with shape {tuple(self.shape)} doesn't match the broadcast "
                           f"shape {tuple(res.shape)} of the in-place op")
    if self._placement is not None and (res._placement != self._placement
                                        or res._sbp != self._sbp):
        # a global self keeps its layout: its piece of the result is what it stores
        res = res.to_global(self._placement, self._sbp)
    if _hooks.note_inplace(self, res):      # a graph trace records the write instead
        return self
    self._data[...] = res._data if res.dtype is self.dtype else res.to(self.dtype)._data
    self._version[0] += 1
    if record:
        self.grad_fn, self._out_idx, self.requires_grad = res.grad_fn, res._out_idx, True
    return self


@tensor_method()
def zero_(input):
    return fill_(input, 0)


@tensor_method()
def fill_(input, value):
    if is_grad_enabled() and input.requires_grad and input.grad_fn is None:
        raise RuntimeError("a leaf Variable that requires grad is being used in an in-place "
                           "operation (fill_); wrap it in `with pyflow.no_grad():`")
    if isinstance(value, Tensor):
        # a tensor converts as .to() does (wrapping, as in PyTorch); a number must fit
        value = value.to(input.dtype).item()
    else:
        check_scalar_fits(value, input.dtype, "fill_")
    if input.dtype is _dt.bfloat16:
        value = kernel("cast", "cpu")(np.asarray(value, np.float32), _dt.float32, _dt.bfloat16).item()
    input._data[...] = value
    input._version[0] += 1
    return input


@tensor_method()
def copy_(input, src, non_blocking=False):
    """Copy ``src`` (broadcast, converted to ``input``'s dtype) into ``input``."""
    check_tensor(src, "src", "copy_")

    def take(s, x):  # the new value: x broadcast to s's shape; s itself gets no gradient
        return Clone.apply(expand(x.to(s.dtype) if x.dtype is not s.dtype else x, tuple(s.shape)))
    if is_grad_enabled() and (input.requires_grad or src.requires_grad) or \
            _hooks.recording() or input._placement is not None or src._placement is not None:
        # recorded (by autograd, or as a graph's assign), or global: input keeps its SBP
        return _inplace(input, take, src)
    if src.device != input.device:          # a copy across devices (host <-> GPU)
        src = src.to(input.device)
    try:
        data = np.broadcast_to(src._data if src.dtype is input.dtype else
                               src.to(input.dtype)._data, input._data.shape)
    except ValueError:
        raise RuntimeError(f"copy_(): src of shape {tuple(src.shape)} cannot be broadcast to "
                           f"{tuple(input.shape)}") from None
    input._data[...] = data
    input._version[0] += 1
    return input
