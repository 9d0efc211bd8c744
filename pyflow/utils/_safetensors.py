"""The safetensors file format, written and read by pyflow itself.

A file is an 8-byte little-endian header length ``N``, ``N`` bytes of JSON
header (``{"__metadata__": {str: str}, name: {"dtype": "F32", "shape": [2, 3],
"data_offsets": [begin, end]}, ...}``, padded with spaces to a multiple of 8),
then the tensors' bytes back to back (offsets relative to the end of the
header).  The layout written here is the safetensors package's own: tensors
ordered by item size (largest first) then name, so every tensor is aligned.

Why not the safetensors package's functions:

* ``save_file`` writes through a temporary file of its own that a kill leaves
  behind under a name nobody can recognise, and reports a full disk as
  ``SafetensorError`` rather than ``OSError``;
* ``save`` builds the whole file as one bytes object (twice the memory);
* its readers take a path or the whole file as bytes, so a stream would be
  read to its end before its header is looked at.

``write`` streams each array into a file object the caller owns; ``read``
checks the header against a size bound and the tensors' sizes against their
offsets before it reads (or allocates) anything else, then reads exactly the
bytes the header describes.  Every defect of the file is a ``FormatError``.
"""
import json
import math
import struct

import numpy as np

__all__ = ["FormatError", "write", "read", "MAX_HEADER"]

MAX_HEADER = 100_000_000     # the safetensors package's own bound on the header
_MAX_NDIM = 32               # NumPy's smallest limit (NumPy 1.x)
_CHUNK = 1 << 26             # 64 MiB per read()/write() call
_DTYPES = {"BOOL": "|b1", "U8": "|u1", "I8": "|i1", "U16": "<u2", "I16": "<i2",
           "F16": "<f2", "BF16": "<u2", "U32": "<u4", "I32": "<i4", "F32": "<f4",
           "U64": "<u8", "I64": "<i8", "F64": "<f8", "C64": "<c8"}
_DTYPES = {k: np.dtype(v) for k, v in _DTYPES.items()}
_NAMES = {v: k for k, v in _DTYPES.items() if k != "BF16"}   # uint16 words are U16


class FormatError(ValueError):
    """The bytes are not a well-formed safetensors file (the message says why)."""


# ----------------------------------------------------------------- writing
def _little_endian(key, a):
    dtype = a.dtype.newbyteorder("<") if a.dtype.byteorder in "<>=" else a.dtype
    if dtype not in _NAMES:
        raise TypeError(f"save: array {key!r} has dtype {a.dtype}, which safetensors cannot "
                        f"store; expected one of {sorted(str(d) for d in _NAMES)}")
    return np.asarray(a, dtype=dtype, order="C")   # no copy when it already is


def write(f, arrays, metadata):
    """Write ``arrays`` ({name: ndarray}) and ``metadata`` ({str: str}) to the
    binary file object ``f`` as one safetensors file."""
    arrays = {k: _little_endian(k, a) for k, a in arrays.items()}
    order = sorted(arrays, key=lambda k: (-arrays[k].dtype.itemsize, k))
    header, offset = {"__metadata__": metadata}, 0
    for k in order:
        a = arrays[k]
        header[k] = {"dtype": _NAMES[a.dtype], "shape": list(a.shape),
                     "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)              # the data starts 8-byte aligned
    f.write(struct.pack("<Q", len(text)) + text)
    for k in order:
        data = memoryview(arrays[k].reshape(-1).view(np.uint8))
        for start in range(0, len(data), _CHUNK):
            f.write(data[start:start + _CHUNK])


# ----------------------------------------------------------------- reading
def read(f, size=None, whole=False):
    """``(metadata, arrays, dtypes)`` of the safetensors file at ``f``'s
    position: metadata a {str: str} dict (empty when absent), arrays
    {name: ndarray} (BF16 tensors as their uint16 words), dtypes {name:
    safetensors dtype name}.  ``size``: the bytes left in ``f`` when known,
    checked before anything is allocated.  ``whole``: the file must end with
    the last tensor.  Reads exactly the bytes the header describes."""
    (n,) = struct.unpack("<Q", _read_bytes(f, 8, "the header length"))
    if n > MAX_HEADER:
        raise FormatError(f"header length {n} is over the bound of {MAX_HEADER} bytes")
    if size is not None and n > size - 8:
        raise FormatError(f"truncated: a header of {n} bytes in a file of {size}")
    try:
        header = json.loads(_read_bytes(f, n, "the header"))
    except (ValueError, RecursionError) as e:    # UnicodeDecodeError is a ValueError
        raise FormatError(f"unreadable header ({type(e).__name__})") from None
    metadata, entries, data_len = _check_header(header)
    if size is not None:
        have = size - 8 - n
        if have < data_len:
            raise FormatError(f"truncated: the header describes {data_len} bytes of tensors, "
                              f"the file holds {have}")
        if whole and have > data_len:
            raise FormatError(f"{have - data_len} stray bytes after the tensors")
    arrays = {key: _read_array(f, dtype, shape, size is not None)
              for key, dtype, shape in entries}
    return metadata, arrays, {key: header[key]["dtype"] for key, _, _ in entries}


def _check_header(header):
    """(metadata, [(key, np dtype, shape)] in file order, bytes of data), or a
    FormatError: every tensor's size matches its offsets, and the tensors
    tile the data with no gap and no overlap."""
    if not isinstance(header, dict):
        raise FormatError("header is not a JSON object")
    metadata = header.get("__metadata__") or {}
    if not (isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())):
        raise FormatError("__metadata__ is not a map of strings")
    spans = []
    for key, info in header.items():
        if key == "__metadata__":
            continue
        if not isinstance(info, dict):
            raise FormatError(f"tensor {key!r}: entry is not a JSON object")
        name, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if not isinstance(name, str) or name not in _DTYPES:
            raise FormatError(f"tensor {key!r}: unknown or unsupported dtype {name!r}")
        if not (isinstance(shape, list) and len(shape) <= _MAX_NDIM
                and all(_is_count(d) for d in shape)):
            raise FormatError(f"tensor {key!r}: bad shape {shape!r}")
        if not (isinstance(offsets, list) and len(offsets) == 2
                and all(_is_count(o) for o in offsets) and offsets[0] <= offsets[1]):
            raise FormatError(f"tensor {key!r}: bad data_offsets {offsets!r}")
        dtype = _DTYPES[name]
        if offsets[1] - offsets[0] != math.prod(shape) * dtype.itemsize:
            raise FormatError(f"tensor {key!r}: {name} of shape {shape} does not fill "
                              f"data_offsets {offsets}")
        spans.append((offsets[0], offsets[1], key, dtype, tuple(shape)))
    spans.sort(key=lambda s: s[:2])
    end = 0
    for begin, stop, key, _, _ in spans:
        if begin != end:
            raise FormatError(f"tensor {key!r} starts at byte {begin} of the data, expected "
                              f"{end} (a gap or an overlap)")
        end = stop
    return metadata, [(key, dtype, shape) for _, _, key, dtype, shape in spans], end


def _is_count(x):
    return type(x) is int and x >= 0


def _read_array(f, dtype, shape, size_known):
    """The next ``prod(shape)`` items of ``f`` as a fresh, aligned array.  When
    the stream's size is unknown the bytes are gathered before the array is
    allocated, so a header that lies about sizes costs no more memory than the
    bytes that actually arrive."""
    nbytes = math.prod(shape) * dtype.itemsize
    if size_known:
        out = np.empty(shape, dtype)
        _read_into(f, memoryview(out.reshape(-1).view(np.uint8)))
        return out
    chunks, got = [], 0
    while got < nbytes:
        chunks.append(_read_bytes(f, min(_CHUNK, nbytes - got), "the tensor data"))
        got += len(chunks[-1])
    out = np.empty(shape, dtype)
    view, pos = memoryview(out.reshape(-1).view(np.uint8)), 0
    for c in chunks:
        view[pos:pos + len(c)] = c
        pos += len(c)
    return out


def _read_into(f, view):
    pos = 0
    readinto = getattr(f, "readinto", None)
    while pos < len(view):
        part = view[pos:pos + _CHUNK]
        if readinto is not None:
            got = readinto(part)
        else:
            data = f.read(len(part))
            got = len(data)
            part[:got] = data
        if not got:
            raise FormatError(f"truncated: the file ends {len(view) - pos} bytes into a tensor")
        pos += got


def _read_bytes(f, n, what):
    """Exactly ``n`` bytes of ``f``, read in bounded pieces (a short stream is a
    FormatError, not a partial result)."""
    parts, got = [], 0
    while got < n:
        data = f.read(min(_CHUNK, n - got))
        if not data:
            raise FormatError(f"truncated: the file ends {n - got} bytes into {what}")
        parts.append(bytes(data))
        got += len(data)
    return b"".join(parts)
