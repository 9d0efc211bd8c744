"""``repr(tensor)`` in PyTorch's exact format (torch/_tensor_str.py, default
print options): ``tensor([ 0.0000,  2.5000, 10.0000])``.

One formatter is chosen for the whole tensor from its non-zero finite values:
integer-valued floats print as ``2.``, otherwise 4 decimals, and scientific
notation when max/min > 1000, max > 1e8 or min < 1e-4.  Every element is
right-aligned to the widest one.  Tensors over 1000 elements show 3 edge items
per dim around ``...``; lines wrap at 80 columns.
"""
import math

import numpy as np

from . import dtypes as _dt

PRECISION, THRESHOLD, EDGEITEMS, LINEWIDTH = 4, 1000, 3, 80


class _Formatter:
    def __init__(self, values, floating):
        """``values``: a flat NumPy array of the (summarized) elements."""
        self.floating = floating
        self.int_mode, self.sci_mode, self.max_width = True, False, 1
        if not floating:
            for v in values.tolist():
                self.max_width = max(self.max_width, len(str(v)))
            return
        vals = values[np.isfinite(values) & (values != 0)]
        if vals.size == 0:
            return
        absv = np.abs(vals.astype(np.float64))
        lo, hi = absv.min(), absv.max()
        self.int_mode = bool(np.all(vals == np.ceil(vals)))
        if self.int_mode:
            if hi / lo > 1000.0 or hi > 1.0e8:
                self.sci_mode = True
                widths = (len(f"{v:.{PRECISION}e}") for v in vals.tolist())
            else:
                widths = (len(f"{v:.0f}") + 1 for v in vals.tolist())
        elif hi / lo > 1000.0 or hi > 1.0e8 or lo < 1.0e-4:
            self.sci_mode = True
            widths = (len(f"{v:.{PRECISION}e}") for v in vals.tolist())
        else:
            widths = (len(f"{v:.{PRECISION}f}") for v in vals.tolist())
        self.max_width = max(self.max_width, max(widths))

    def format(self, v):
        if self.floating:
            if self.sci_mode:
                s = f"{v:{self.max_width}.{PRECISION}e}"
            elif self.int_mode:
                s = f"{v:.0f}"
                if not (math.isinf(v) or math.isnan(v)):
                    s += "."
            else:
                s = f"{v:.{PRECISION}f}"
        else:
            s = str(v)
        return " " * (self.max_width - len(s)) + s


def _summarized(arr):
    """The elements a summarized print shows (edge items of every dim)."""
    if arr.ndim == 0:
        return arr.reshape(-1)
    if arr.shape[0] > 2 * EDGEITEMS:
        arr = np.concatenate([arr[:EDGEITEMS], arr[-EDGEITEMS:]])
    if arr.ndim == 1:
        return arr
    return np.concatenate([_summarized(a) for a in arr]) if len(arr) else arr.reshape(-1)


def _vector(arr, indent, summarize, fmt):
    per_line = max(1, int(math.floor((LINEWIDTH - indent) / (fmt.max_width + 2))))
    if summarize and arr.shape[0] > 2 * EDGEITEMS:
        data = ([fmt.format(v) for v in arr[:EDGEITEMS].tolist()] + [" ..."] +
                [fmt.format(v) for v in arr[-EDGEITEMS:].tolist()])
    else:
        data = [fmt.format(v) for v in arr.tolist()]
    lines = [", ".join(data[i:i + per_line]) for i in range(0, len(data), per_line)]
    return "[" + ("," + "\n" + " " * (indent + 1)).join(lines) + "]"


def _body(arr, indent, summarize, fmt):
    if arr.ndim == 0:
        return fmt.format(arr.item())
    if arr.ndim == 1:
        return _vector(arr, indent, summarize, fmt)
    if summarize and arr.shape[0] > 2 * EDGEITEMS:
        rows = ([_body(arr[i], indent + 1, summarize, fmt) for i in range(EDGEITEMS)] + ["..."] +
                [_body(arr[i], indent + 1, summarize, fmt)
                 for i in range(arr.shape[0] - EDGEITEMS, arr.shape[0])])
    else:
        rows = [_body(a, indent + 1, summarize, fmt) for a in arr]
    return "[" + ("," + "\n" * (arr.ndim - 1) + " " * (indent + 1)).join(rows) + "]"


def _add_suffixes(text, suffixes, indent):
    parts = [text]
    last_line_len = len(text) - text.rfind("\n") + 1
    for s in suffixes:
        if last_line_len + len(s) + 2 > LINEWIDTH:
            parts.append(",\n" + " " * indent + s)
            last_line_len = indent + len(s)
        else:
            parts.append(", " + s)
            last_line_len += len(s) + 2
    parts.append(")")
    return "".join(parts)


def format_tensor(t):
    arr = np.asarray(t._host()).reshape(t._data.shape)  # (bf16 cast may drop a 0-d shape)
    prefix = "tensor("
    indent = len(prefix)
    suffixes = []
    if t.device.type != "cpu":
        suffixes.append(f"device='{t.device}'")
    if arr.size == 0:
        if arr.ndim != 1:
            suffixes.append(f"size={tuple(arr.shape)}")
        if t.dtype is not _dt.get_default_dtype():
            suffixes.append(f"dtype={t.dtype!r}")
        body = "[]"
    else:
        if t.dtype not in (_dt.get_default_dtype(), _dt.int64, _dt.bool):
            suffixes.append(f"dtype={t.dtype!r}")
        summarize = arr.size > THRESHOLD
        floating = t.dtype.is_floating_point
        fmt = _Formatter((_summarized(arr) if summarize else arr).reshape(-1), floating)
        body = _body(arr, indent, summarize, fmt)
    if t.grad_fn is not None:
        suffixes.append(f"grad_fn=<{t.grad_fn.name()}>")
    elif t.requires_grad:
        suffixes.append("requires_grad=True")
    return _add_suffixes(prefix + body, suffixes, indent)
