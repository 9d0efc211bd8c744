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

The file is written atomically (``_atomic``): bytes go to one temporary file
``<name>.pyflow-tmp-<pid>-<hex>`` in the same directory, written by pyflow
itself (``_safetensors``), flushed and fsync'ed, then ``os.replace``'d over
``path`` and the directory fsync'ed.  A crash or error mid-save leaves the
previous checkpoint at ``path`` untouched; an error removes the temporary
file, and the temporary files of killed saves are removed by the next save to
the same path (``remove_stale_temporaries``).  A full disk is an ``OSError``.

Loading trusts nothing in the file: the header is checked against a size
bound and the file's size before anything else is read, every tensor's size
against its offsets, and the structure tree holds only the node kinds ``save``
writes (NumPy scalars of bool, int, float and str kinds only, built from a
plain value, never by a dtype's size; containers at most
``MAX_DEPTH`` deep, hashable dict keys).  Every defect is a ``RuntimeError``
"load: '<file>' is corrupt ...".
"""
import collections
import json
import os

import numpy as np

from .. import dtypes as _dt
from ..tensor import Tensor, rebuild_tensor
from . import _safetensors
from ._atomic import atomic_write, remove_stale_temporaries, temporary_files

__all__ = ["save", "load", "remove_stale_temporaries", "temporary_files", "MAX_DEPTH"]

_FORMAT = "pyflow"
_VERSION = "1"
MAX_DEPTH = 100   # containers inside containers, on save and on load
_SCALAR_KINDS = "biufU"  # NumPy scalars a checkpoint holds: bool, int, uint, float, str
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
        if isinstance(x, np.generic) and x.dtype.kind in _SCALAR_KINDS:
            return {"np_scalar": x.dtype.str, "value": x.item()}
        if isinstance(x, (bool, int, float, str)):  # subclasses, e.g. IntEnum: plain value
            return _base_scalar(x)(x)
        if type(x) is _dt.dtype:
            return {"dtype": x.name}
        if isinstance(x, (dict, tuple, list)) and len(path) >= MAX_DEPTH:
            raise ValueError(f"save: containers nest more than {MAX_DEPTH} deep at "
                             f"'{'.'.join(path[:5])}...' (a container that holds itself?)")
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
    """Rebuilds the object from the JSON tree and the loaded arrays.  The tree
    comes from the file, so every node is checked to be one that ``save``
    writes before it is acted on: a defect is ``_corrupt``, never a NumPy or
    Python error from deep inside."""

    def __init__(self, arrays, where, device):
        self.arrays = arrays
        self.where = where
        self.device = device
        self.built = {}    # tensor key -> tensor, so shared tensors stay shared

    def corrupt(self, why):
        return _corrupt(self.where, f"structure metadata: {why}")

    def node(self, n, depth=0):
        if n is None or type(n) in (bool, int, float, str):
            return n
        if not isinstance(n, dict):
            raise self.corrupt(f"unexpected {type(n).__name__} node")
        kind = next((k for k in _NODE_FIELDS if k in n), None)
        if kind is None or not n.keys() <= _NODE_FIELDS[kind]:
            raise self.corrupt(f"node with keys {sorted(n)[:8]}")
        if kind in ("dict", "list", "tuple"):
            if depth >= MAX_DEPTH:
                raise self.corrupt(f"containers nest more than {MAX_DEPTH} deep")
            if not isinstance(n[kind], list):
                raise self.corrupt(f"a {kind} node does not hold a list")
            if kind == "dict":
                return self._dict(n, depth + 1)
            items = [self.node(v, depth + 1) for v in n[kind]]
            return items if kind == "list" else tuple(items)
        if kind == "tensor":
            key = self._key(n, "tensor")
            t = self.built.get(key)
            if t is None:
                t = self.built[key] = self._tensor(key, n)
            return t
        if kind == "ndarray":
            return self._array(self._key(n, "ndarray"))
        if kind == "np_scalar":
            return self._np_scalar(n)
        name = n["dtype"]
        if not isinstance(name, str) or name not in _dt._BY_NAME:
            raise self.corrupt(f"unknown dtype {name!r}")
        return _dt._by_name(name)

    def _key(self, n, kind):
        key = n[kind]
        if not isinstance(key, str):
            raise self.corrupt(f"a {kind} node names {type(key).__name__}, not a key")
        return key

    def _dict(self, n, depth):
        kind = n.get("type", "dict")
        if not isinstance(kind, str) or kind not in _DICT_TYPES:
            raise self.corrupt(f"unknown dict type {kind!r}")
        out = _DICT_TYPES[kind]()
        for item in n["dict"]:
            if not (isinstance(item, list) and len(item) == 2):
                raise self.corrupt("a dict item is not a [key, value] pair")
            k = self.node(item[0], depth)
            try:
                hash(k)
            except TypeError:
                raise self.corrupt(f"unhashable dict key of type {type(k).__name__}") from None
            out[k] = self.node(item[1], depth)
        return out

    def _np_scalar(self, n):
        """A NumPy scalar of a bool, int, float or str kind made from a plain
        JSON value: never a dtype that allocates by its size (void), an
        object, or an array built from a list."""
        spec, value = n["np_scalar"], n.get("value")
        try:
            dtype = np.dtype(spec) if isinstance(spec, str) else None
        except (TypeError, ValueError):
            dtype = None
        plain = {"b": (bool,), "i": (int,), "u": (int,), "f": (float, int), "U": (str,)}
        if dtype is None or dtype.kind not in _SCALAR_KINDS or dtype.shape:
            raise self.corrupt(f"NumPy scalar of dtype {spec!r}; expected a bool, int, float "
                               f"or str kind")
        if type(value) not in plain[dtype.kind]:
            raise self.corrupt(f"NumPy {dtype} scalar of value {type(value).__name__}")
        try:
            return dtype.type(value)
        except (OverflowError, ValueError) as e:
            raise self.corrupt(f"NumPy {dtype} scalar: {e}") from None

    def _array(self, key):
        try:
            return self.arrays[key]
        except KeyError:
            raise _corrupt(self.where, f"tensor {key!r} is listed in the structure but "
                                       f"missing from the file") from None

    def _tensor(self, key, n):
        """The tensor back on the device it was saved from (as torch.load does),
        or on ``map_location``'s device."""
        extra = {"requires_grad": bool, "parameter": bool, "device": str}
        for field, typ in extra.items():
            if field in n and type(n[field]) is not typ:
                raise self.corrupt(f"tensor {key!r}: {field} is not a {typ.__name__}")
        array = self._array(key)
        try:
            t = _rebuild_tensor(array, n.get("dtype"), n.get("requires_grad", False))
        except (TypeError, ValueError, RuntimeError) as e:   # e.g. an int "requiring grad"
            raise self.corrupt(f"tensor {key!r}: {e}") from None
        device = self.device
        if device is None and "device" in n:
            from ..device import as_device, check_available
            try:
                device = as_device(n["device"])
            except (TypeError, ValueError, RuntimeError) as e:
                raise self.corrupt(f"tensor {key!r}: device {n['device']!r} ({e})") from None
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
            try:
                t = Parameter(t, requires_grad=n.get("requires_grad", True))
            except (TypeError, ValueError, RuntimeError) as e:
                raise self.corrupt(f"tensor {key!r}: not a Parameter ({e})") from None
        return t


# The nodes save writes: {kind: the keys its node may hold}, tried in this order.
_NODE_FIELDS = {"tensor": {"tensor", "dtype", "requires_grad", "device", "parameter"},
                "dict": {"dict", "type"}, "list": {"list"}, "tuple": {"tuple"},
                "ndarray": {"ndarray"}, "np_scalar": {"np_scalar", "value"}, "dtype": {"dtype"}}


def _corrupt(where, why):
    return RuntimeError(f"load: '{where}' is corrupt or not a safetensors checkpoint ({why})")


# Pickles made before the function moved to pyflow.tensor name it here.
_rebuild_tensor = rebuild_tensor


# ----------------------------------------------------------------- save
def save(obj, f, pickle_module=None, pickle_protocol=None, _use_new_zipfile_serialization=True):
    """Write ``obj`` (nested dicts/lists/tuples of tensors and plain values) to
    ``f`` (a path, or a binary file object) as a safetensors checkpoint.  A
    path is replaced atomically (see the module docstring)."""
    flat = _Flattener()
    structure = flat.node(obj, [])
    metadata = {"format": _FORMAT, "pyflow.version": _VERSION,
                "pyflow.structure": json.dumps(structure, separators=(",", ":"))}
    if hasattr(f, "write"):
        _safetensors.write(f, flat.arrays, metadata)
        return
    atomic_write(f, lambda out: _safetensors.write(out, flat.arrays, metadata))


# ----------------------------------------------------------------- load
def load(f, map_location=None, pickle_module=None, *, weights_only=None, mmap=None, **kwargs):
    """Read a checkpoint written by ``save`` from a path or a binary file object
    (read from its position to the end of the checkpoint, no further).  A plain
    safetensors file (no pyflow structure) loads as a flat ``{name: tensor}``
    dict.  A damaged or foreign file is a RuntimeError naming it."""
    device = None
    if map_location is not None:
        from ..device import as_device
        device = as_device(map_location)
    if hasattr(f, "read"):
        where = getattr(f, "name", type(f).__name__)
        meta, arrays, dtypes = _read(f, where, _size_left(f), whole=False)
    else:
        where = os.fspath(f)
        meta, arrays, dtypes = _read_file(where)
    if meta.get("format") != _FORMAT or "pyflow.structure" not in meta:
        return {k: _plain_tensor(a, dtypes[k], k, where) for k, a in arrays.items()}
    try:
        structure = json.loads(meta["pyflow.structure"])
    except (ValueError, RecursionError) as e:
        raise _corrupt(where, f"bad structure metadata: {type(e).__name__}") from None
    return _Builder(arrays, where, device).node(structure)


def _read(f, where, size, whole):
    try:
        return _safetensors.read(f, size, whole)
    except _safetensors.FormatError as e:
        raise _corrupt(where, str(e)) from None


def _read_file(path):
    """(metadata, arrays, dtypes) from one open of ``path``, so a concurrent save
    that replaces the file can't mix an old structure with new tensors."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"load: no such file: '{path}'")
    if os.path.isdir(path):
        raise IsADirectoryError(f"load: '{path}' is a directory, expected a checkpoint file")
    with open(path, "rb") as fh:
        return _read(fh, path, os.fstat(fh.fileno()).st_size, whole=True)


def _size_left(f):
    """Bytes from ``f``'s position to its end, or None for a stream that
    cannot tell (a pipe, a socket)."""
    try:
        if not f.seekable():
            return None
        here = f.tell()
        end = f.seek(0, os.SEEK_END)
        f.seek(here)
        return end - here
    except (AttributeError, OSError, ValueError):
        return None


def _plain_tensor(a, st_dtype, key, where):
    """A tensor of a plain safetensors file: BF16 words as bfloat16, NumPy
    dtypes as pyflow's (small integer types widened as torch.from_numpy's
    users expect)."""
    if st_dtype == "BF16":
        return _rebuild_tensor(a, "bfloat16", False)
    try:
        dtype = _dt.from_numpy(a.dtype)
    except TypeError:
        raise TypeError(f"load: tensor {key!r} in '{where}' has dtype {a.dtype}, which "
                        f"pyflow cannot hold") from None
    return _rebuild_tensor(a.astype(dtype.storage, copy=False), dtype.name, False)
