"""``repr(tensor)`` in PyTorch's format: ``tensor([1.0000, 2.5000], dtype=pyflow.float64)``."""
import numpy as np

from . import dtypes as _dt


def _float_formatter(values):
    finite = values[np.isfinite(values)]
    if finite.size and np.all(finite == np.round(finite)) and np.abs(finite).max() < 1e8:
        return lambda v: (f"{v:.0f}." if np.isfinite(v) else str(v)) if v == v else "nan"
    big = np.abs(finite).max() if finite.size else 0.0
    small = np.abs(finite[finite != 0]).min() if np.any(finite != 0) else 1.0
    if big >= 1e8 or small < 1e-4 or (small > 0 and big / small > 1e3 and big > 1e3):
        return lambda v: f"{v:.4e}" if v == v else "nan"
    return lambda v: f"{v:.4f}" if v == v else "nan"


def format_tensor(t):
    arr = np.asarray(t._compute())
    if t.dtype.is_floating_point:
        fmt = _float_formatter(arr.astype(np.float64).reshape(-1))
        formatter = {"float_kind": fmt}
    elif t.dtype is _dt.bool:
        formatter = {"bool": lambda v: "True" if v else "False"}
    else:
        formatter = {"int": lambda v: str(v)}
    body = np.array2string(arr, separator=", ", formatter=formatter, prefix="tensor(",
                           threshold=1000, edgeitems=3, max_line_width=80)
    extras = []
    default = {_dt.float32, _dt.int64, _dt.bool}
    if t.dtype not in default or arr.size == 0:
        if not (arr.size == 0 and t.dtype is _dt.float32):
            extras.append(f"dtype={t.dtype!r}")
    if t.device.type != "cpu":
        extras.append(f"device='{t.device}'")
    if t.grad_fn is not None:
        extras.append(f"grad_fn=<{t.grad_fn.name()}>")
    elif t.requires_grad:
        extras.append("requires_grad=True")
    if arr.size == 0 and arr.ndim != 1:
        extras.insert(0, f"size={tuple(arr.shape)}")
    return "tensor(" + body + "".join(", " + e for e in extras) + ")"
