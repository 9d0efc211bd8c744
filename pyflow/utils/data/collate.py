"""default_collate / default_convert: turn a list of samples into a batch.

Tensors are stacked on a new first dimension (their storage arrays are stacked
with NumPy: one copy, exact for every dtype including bfloat16 words; tensors
that require grad go through ``pyflow.stack`` so the batch stays on the tape).
NumPy arrays become tensors and are stacked; Python floats become a float64
tensor and ints an int64 tensor (torch's choices); strings stay lists;
mappings, named tuples and sequences are collated field by field.
"""
import collections.abc
import numbers

import numpy as np

from ... import dtypes as _dt
from ...tensor import Tensor
from ...ops.creation import as_tensor, tensor
from ...ops.join import stack

__all__ = ["default_collate", "default_convert"]

_ERR = ("default_collate: batch must contain tensors, numpy arrays, numbers, dicts or lists; "
        "found {}")


def _stack_tensors(batch):
    shape = tuple(batch[0].shape)
    for i, t in enumerate(batch):
        if tuple(t.shape) != shape:
            raise RuntimeError(f"stack expects each tensor to be equal size, but got "
                               f"{list(shape)} at entry 0 and {list(t.shape)} at entry {i}")
    dtype = batch[0].dtype
    for t in batch[1:]:
        if t.dtype is not dtype:
            dtype = _dt.promote_types(dtype, t.dtype)
    if any(t.requires_grad for t in batch):
        return stack([t.to(dtype) for t in batch], 0)
    arrays = [t._data if t.dtype is dtype else t.to(dtype)._data for t in batch]
    return Tensor._make(np.stack(arrays), dtype, batch[0].device)


def _from_numpy(arr):
    if arr.dtype.kind in "USO":
        raise TypeError(_ERR.format(arr.dtype))
    return as_tensor(np.require(arr, requirements="C"))


def default_convert(data):
    """Used when batching is off: NumPy arrays -> tensors, recursively."""
    if isinstance(data, Tensor):
        return data
    if isinstance(data, np.ndarray):
        return data if data.dtype.kind in "USO" else _from_numpy(data)
    if isinstance(data, np.generic):
        return _from_numpy(np.asarray(data))
    if isinstance(data, collections.abc.Mapping):
        out = {k: default_convert(v) for k, v in data.items()}
        try:
            return type(data)(out)
        except TypeError:  # a mapping type that can't be built from a dict
            return out
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(default_convert(d) for d in data))
    if isinstance(data, tuple):
        return [default_convert(d) for d in data]
    if isinstance(data, collections.abc.Sequence) and not isinstance(data, (str, bytes)):
        return [default_convert(d) for d in data]
    return data


def default_collate(batch):
    """Collate a list of samples into a batch (see the module docstring)."""
    if not isinstance(batch, collections.abc.Sequence) or isinstance(batch, (str, bytes)):
        raise TypeError(f"default_collate: expected a list of samples, got "
                        f"{type(batch).__name__}")
    if len(batch) == 0:
        raise ValueError("default_collate: got an empty batch (no samples)")
    elem = batch[0]
    if isinstance(elem, Tensor):
        return _stack_tensors(batch)
    if isinstance(elem, np.ndarray):
        return _stack_tensors([_from_numpy(np.asarray(b)) for b in batch])
    if isinstance(elem, np.generic):
        return _from_numpy(np.array(batch))
    if isinstance(elem, bool):
        return tensor(batch, dtype=_dt.bool)
    if isinstance(elem, numbers.Integral):
        return tensor(batch, dtype=_dt.int64)
    if isinstance(elem, numbers.Real):
        return tensor(batch, dtype=_dt.float64)
    if isinstance(elem, (str, bytes)):
        return batch
    if isinstance(elem, collections.abc.Mapping):
        for i, b in enumerate(batch):
            if set(b) != set(elem):
                raise RuntimeError(f"default_collate: sample {i} has keys {sorted(map(str, b))}, "
                                   f"sample 0 has {sorted(map(str, elem))}")
        out = {k: default_collate([b[k] for b in batch]) for k in elem}
        try:
            return type(elem)(out)
        except TypeError:
            return out
    if isinstance(elem, tuple) and hasattr(elem, "_fields"):  # namedtuple
        return type(elem)(*(default_collate(list(s)) for s in zip(*batch)))
    if isinstance(elem, collections.abc.Sequence):
        n = len(elem)
        if any(len(b) != n for b in batch):
            raise RuntimeError("each element in list of batch should be of equal size")
        transposed = [default_collate(list(s)) for s in zip(*batch)]
        if isinstance(elem, tuple):
            return transposed  # a list, as torch returns
        try:
            return type(elem)(transposed)
        except TypeError:
            return transposed
    raise TypeError(_ERR.format(type(elem)))
