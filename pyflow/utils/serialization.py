"""pyflow.save / pyflow.load: checkpoints as safetensors files.

A checkpoint is any nesting of dicts, lists and tuples holding tensors and
plain values (a model's state_dict, an optimizer's, ``{"model": ...,
"optim": ..., "step": 3}``).  ``save`` splits it in two:

* every tensor goes into one safetensors file, under a readable key built from
  its path (``model.fc.weight``, ``optim.state.0.exp_avg``), stored as its raw
  storage array (bfloat16 as its 16-bit words);
* the rest (containers, key types such as the int keys of optimizer state,
  plain values, each tensor's dtype / requires_grad / Parameter-ness) is a
  JSON tree kept in the safetensors metadata under ``pyflow.structure``.

Why safetensors and not pickle: loading never runs code from the file, the
format is readable by other tools, and tensors are a flat byte range each.

The file is written atomically: bytes go to a temporary file in the same
directory, which is flushed and fsync'ed, then ``os.replace``'d over ``path``
and the directory fsync'ed.  A crash or error mid-save leaves the previous
checkpoint at ``path`` untouched and removes the temporary file.
"""
import collections
import json
import os
import struct
import uuid

import numpy as np

from .. import dtypes as _dt
from ..tensor import Tensor

__all__ = ["save", "load"]

_FORMAT = "pyflow"
_VERSION = "1"
_CHUNK = 1 << 26  # 64 MiB per write() call
_DICT_TYPES = {"dict": dict, "OrderedDict": collections.OrderedDict, "Counter": collections.Counter}


# ----------------------------------------------------------------- flattening
class _Flattener:
    """Walks an object, collecting tensors into ``arrays`` and returning the
    JSON tree that describes everything else."""

    def __init__(self):
        self.arrays = {}
        self.seen = {}     # id(tensor) -> its node: a tensor saved twice is stored once

    def _key(self, path):
        base = ".".join(path) or "tensor"
        key, n = base, 1
        while key in self.arrays:
            key, n = f"{base}#{n}", n + 1
        return key

    def node(self, x, path):
        if x is None or type(x) in (bool, int, float, str):
            return x
        if isinstance(x, Tensor):
            return self._tensor(x, path)
        if isinstance(x, np.ndarray):
            if x.dtype.kind not in "biuf":
                raise TypeError(f"save: cannot store a NumPy array of dtype {x.dtype} at "
                                f"'{'.'.join(path)}'")
            key = self._key(path)
            self.arrays[key] = np.require(x, requirements="C")
            return {"ndarray": key}
        if isinstance(x, np.generic):
            return {"np_scalar": x.dtype.str, "value": x.item()}
        if isinstance(x, (bool, int, float, str)):  # subclasses, e.g. IntEnum: plain value
            return _base_scalar(x)(x)
        if type(x) is _dt.dtype:
            return {"dtype": x.name}
        if isinstance(x, dict):
            kind = type(x).__name__ if type(x).__name__ in _DICT_TYPES else "dict"
            items = []
            for k, v in x.items():
                if isinstance(k, Tensor):
                    _bad(k, path, "as a dict key ")
                items.append([self.node(k, path + [str(k)]), self.node(v, path + [str(k)])])
            return {"dict": items, "type": kind}
        if isinstance(x, tuple):
            return {"tuple": [self.node(v, path + [str(i)]) for i, v in enumerate(x)]}
        if isinstance(x, list):
            return {"list": [self.node(v, path + [str(i)]) for i, v in enumerate(x)]}
        return _bad(x, path)

    def _tensor(self, t, path):
        node = self.seen.get(id(t))
        if node is None:
            key = self._key(path)
            host = t if t.device.type == "cpu" else t.to("cpu")    # device data: a host copy
            self.arrays[key] = np.require(host._data, requirements="C")
            from ..nn.parameter import Parameter
            node = {"tensor": key, "dtype": t.dtype.name, "requires_grad": bool(t.requires_grad)}
            if t.device.type != "cpu":
                node["device"] = str(t.device)
            if isinstance(t, Parameter):
                node["parameter"] = True
            self.seen[id(t)] = node
        return node


def _base_scalar(x):
    for base in (bool, int, float, str):
        if isinstance(x, base):
            return base


def _bad(x, path, where=""):
    raise TypeError(f"save: cannot store an object of type {type(x).__module__}."
                    f"{type(x).__qualname__} {where}at '{'.'.join(path) or '<root>'}'; "
                    f"checkpoints hold tensors, NumPy arrays, numbers, strings, None, "
                    f"pyflow dtypes and dicts/lists/tuples of them")


class _Builder:
    """Rebuilds the object from the JSON tree and the loaded arrays."""

    def __init__(self, arrays, where, device):
        self.arrays = arrays
        self.where = where
        self.device = device
        self.built = {}    # tensor key -> tensor, so shared tensors stay shared

    def node(self, n):
        if not isinstance(n, dict):
            return n
        if "tensor" in n:
            key = n["tensor"]
            t = self.built.get(key)
            if t is None:
                t = self.built[key] = self._tensor(key, n)
            return t
        if "dict" in n:
            cls = _DICT_TYPES.get(n.get("type"), dict)
            out = cls()
            for k, v in n["dict"]:
                out[self.node(k)] = self.node(v)
            return out
        if "list" in n:
            return [self.node(v) for v in n["list"]]
        if "tuple" in n:
            return tuple(self.node(v) for v in n["tuple"])
        if "ndarray" in n:
            return self._array(n["ndarray"])
        if "np_scalar" in n:
            return np.dtype(n["np_scalar"]).type(n["value"])
        if "dtype" in n:
            return _dt.as_dtype(n["dtype"])
        raise RuntimeError(f"load: '{self.where}' has an unknown structure node {n!r}")

    def _array(self, key):
        try:
            return self.arrays[key]
        except KeyError:
            raise RuntimeError(f"load: '{self.where}' is corrupt: tensor {key!r} is listed in "
                               f"the structure but missing from the file") from None

    def _tensor(self, key, n):
        """The tensor back on the device it was saved from (as torch.load does),
        or on ``map_location``'s device."""
        t = _rebuild_tensor(self._array(key), n["dtype"], n.get("requires_grad", False))
        device = self.device
        if device is None and "device" in n:
            from ..device import as_device, check_available
            device = as_device(n["device"])
            try:
                check_available(device)
            except RuntimeError as e:
                raise RuntimeError(f"load: '{self.where}': tensor {key!r} was saved on "
                                   f"{device}, which is not available here ({e}); pass "
                                   f"map_location='cpu' to load it on the CPU") from None
        if device is not None and device.type != "cpu":
            t = t.to(device)
        if n.get("parameter"):
            from ..nn.parameter import Parameter
            t = Parameter(t, requires_grad=n.get("requires_grad", True))
        return t


def _rebuild_tensor(array, dtype_name, requires_grad):
    """A tensor of pyflow dtype ``dtype_name`` over ``array`` (its storage
    array: uint16 words for bfloat16).  Used by load and by Tensor pickling."""
    try:
        dtype = _dt._by_name(dtype_name)
    except KeyError:
        raise TypeError(f"_rebuild_tensor: unknown dtype {dtype_name!r}; expected one of "
                        f"{[d.name for d in _dt.ALL]}") from None
    arr = np.asarray(array)
    if arr.dtype != dtype.storage:
        raise TypeError(f"_rebuild_tensor: a {dtype_name} tensor is stored as "
                        f"{dtype.storage}, got an array of {arr.dtype}")
    if not arr.flags.writeable or not arr.flags.c_contiguous:
        arr = np.array(arr, copy=True)
    t = Tensor._make(arr, dtype)
    if requires_grad:
        t.requires_grad_(True)
    return t


# ----------------------------------------------------------------- save
def save(obj, f, pickle_module=None, pickle_protocol=None, _use_new_zipfile_serialization=True):
    """Write ``obj`` (nested dicts/lists/tuples of tensors and plain values) to
    ``f`` (a path, or a binary file object) as a safetensors checkpoint."""
    import safetensors.numpy
    flat = _Flattener()
    structure = flat.node(obj, [])
    metadata = {"format": _FORMAT, "pyflow.version": _VERSION,
                "pyflow.structure": json.dumps(structure, separators=(",", ":"))}
    if hasattr(f, "write"):
        _write_all(f, safetensors.numpy.save(flat.arrays, metadata=metadata))
        return
    # save_file streams the arrays to disk from Rust: 2-4x faster than building
    # the whole file as one bytes object first (measured on 100 MB).
    _atomic_write(os.fspath(f),
                  lambda tmp: safetensors.numpy.save_file(flat.arrays, tmp, metadata=metadata))


def _write_all(f, data):
    view = memoryview(data)
    for start in range(0, len(view), _CHUNK):
        f.write(view[start:start + _CHUNK])


def _atomic_write(path, write_to):
    """Call ``write_to(tmp)`` for a temporary path beside ``path``, make it
    durable, then rename it over ``path``."""
    if os.path.islink(path):  # write through a "latest -> ckpt-100" link, as open() would
        path = os.path.realpath(path)
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"save: directory '{directory}' of '{path}' does not exist")
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{uuid.uuid4().hex}.tmp")
    try:
        write_to(tmp)
        fd = os.open(tmp, os.O_RDWR | getattr(os, "O_BINARY", 0))
        try:
            os.fsync(fd)  # the data is on disk before the new name can point to it
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(directory)


def _fsync_dir(directory):
    """Make the rename itself durable.  Best effort: some platforms and
    filesystems cannot open or fsync a directory, and the data is already
    safely in place by then."""
    try:
        dfd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)


# ----------------------------------------------------------------- load
def load(f, map_location=None, pickle_module=None, *, weights_only=None, mmap=None, **kwargs):
    """Read a checkpoint written by ``save``.  A plain safetensors file (no
    pyflow structure) loads as a flat ``{name: tensor}`` dict."""
    device = None
    if map_location is not None:
        from ..device import as_device
        device = as_device(map_location)
    if hasattr(f, "read"):
        where = getattr(f, "name", type(f).__name__)
        meta, arrays = _read_bytes(f.read(), where)
    else:
        where = os.fspath(f)
        meta, arrays = _read_file(where)
    meta = meta or {}
    if meta.get("format") != _FORMAT or "pyflow.structure" not in meta:
        return {k: _rebuild_tensor(_plain_array(a, k, where), _dt.from_numpy(a.dtype).name,
                                   False) for k, a in arrays.items()}
    try:
        structure = json.loads(meta["pyflow.structure"])
    except ValueError as e:
        raise RuntimeError(f"load: '{where}' is corrupt: bad structure metadata ({e})") from None
    return _Builder(arrays, where, device).node(structure)


def _read_file(path):
    """(metadata, arrays) from one open of ``path``, so a concurrent save that
    replaces the file can't mix an old structure with new tensors."""
    from safetensors import safe_open
    if not os.path.exists(path):
        raise FileNotFoundError(f"load: no such file: '{path}'")
    if os.path.isdir(path):
        raise IsADirectoryError(f"load: '{path}' is a directory, expected a checkpoint file")
    try:
        with safe_open(path, framework="numpy") as fh:
            return fh.metadata(), {k: fh.get_tensor(k) for k in fh.keys()}
    except Exception as e:  # safetensors raises its own error types
        raise RuntimeError(f"load: '{path}' is corrupt or not a safetensors checkpoint "
                           f"({e})") from None


def _read_bytes(data, where):
    import safetensors.numpy
    header = _read_header(data, where)
    try:
        arrays = safetensors.numpy.load(bytes(data))
    except Exception as e:  # safetensors raises its own error types
        raise RuntimeError(f"load: '{where}' is corrupt or not a safetensors checkpoint "
                           f"({e})") from None
    return header.get("__metadata__"), arrays


def _plain_array(a, key, where):
    try:
        _dt.from_numpy(a.dtype)
    except TypeError:
        raise TypeError(f"load: tensor {key!r} in '{where}' has dtype {a.dtype}, which "
                        f"pyflow cannot hold") from None
    return a.astype(_dt.from_numpy(a.dtype).storage, copy=False)


def _read_header(data, where):
    """The safetensors JSON header: 8-byte little-endian length, then JSON."""
    if len(data) < 8:
        raise RuntimeError(f"load: '{where}' is corrupt or not a checkpoint (only "
                           f"{len(data)} bytes)")
    (n,) = struct.unpack("<Q", bytes(data[:8]))
    if n > len(data) - 8:
        raise RuntimeError(f"load: '{where}' is corrupt or truncated (header of {n} bytes, "
                           f"file of {len(data)})")
    try:
        header = json.loads(bytes(data[8:8 + n]))
    except ValueError:
        raise RuntimeError(f"load: '{where}' is corrupt or not a safetensors checkpoint "
                           f"(unreadable header)") from None
    if not isinstance(header, dict):
        raise RuntimeError(f"load: '{where}' is corrupt (header is not a JSON object)")
    return header
