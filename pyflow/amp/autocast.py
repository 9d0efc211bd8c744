"""``torch.autocast``: run the ops that gain from it in a lower-precision dtype.

Inside ``with pyflow.autocast("cpu"):`` the matrix products and convolutions
(matmul, mm, bmm, linear, addmm, baddbmm, conv2d, scaled_dot_product_attention)
cast their floating point inputs to bfloat16 (float16 on "cuda") and the losses
and ``prod`` cast theirs to float32, as PyTorch's CPU autocast does; every
other op runs in its inputs' dtypes (docs/amp.md has the table, which
tests/amp/test_autocast.py checks against torch).

The state is per thread and lives in ``pyflow.autograd.AUTOCAST`` (the ops
read one flag of it); each op's policy is declared where the op is: the class
attribute ``autocast`` of its Function, or ``autocast_op`` on a composite op.
The casts are the differentiable ``Tensor.to``, so gradients reach float32
parameters in float32, and a graph's build() records them like any other op.
"""
import functools

from .. import dtypes as _dt
from ..autograd import AUTOCAST

__all__ = ["autocast", "is_autocast_enabled", "get_autocast_dtype"]

DEVICE_TYPES = ("cpu", "cuda")
DTYPES = {"cpu": (_dt.bfloat16, _dt.float16), "cuda": (_dt.float16, _dt.bfloat16)}


def _device_type(device_type):
    if not isinstance(device_type, str):
        raise TypeError(f"autocast: device_type must be a str, one of {DEVICE_TYPES}, got "
                        f"{type(device_type).__name__}")
    if device_type not in DEVICE_TYPES:
        raise ValueError(f"autocast: device_type must be one of {DEVICE_TYPES}, got "
                         f"{device_type!r}")
    return device_type


def is_autocast_enabled(device_type="cpu"):
    """Whether autocast is on for ``device_type`` in the calling thread."""
    return getattr(AUTOCAST, _device_type(device_type))


def get_autocast_dtype(device_type):
    """The lower-precision dtype autocast uses on ``device_type`` in the calling
    thread (bfloat16 on "cpu", float16 on "cuda" unless an autocast set another)."""
    return getattr(AUTOCAST, _device_type(device_type) + "_dtype")


class autocast:
    """Context manager and decorator: ``with pyflow.autocast("cpu"):`` or
    ``@pyflow.autocast("cpu")``, as ``torch.autocast``.

    ``dtype`` is the lower-precision dtype (default bfloat16 on "cpu", float16
    on "cuda"; each device type accepts those two).  ``enabled=False`` turns
    autocast off for the block, inside an enabled one too; leaving a block
    restores the state it found.  The state is the calling thread's only.

    ``cache_enabled`` is accepted for torch's signature and does nothing:
    pyflow keeps no cache of cast weights, so a parameter used by several
    ops inside one block is cast once per use."""

    def __init__(self, device_type, dtype=None, enabled=True, cache_enabled=None):
        self.device_type = _device_type(device_type)
        if dtype is None:
            dtype = DTYPES[device_type][0]
        else:
            given = dtype
            try:
                dtype = _dt.as_dtype(dtype)
            except (TypeError, ValueError):
                dtype = None
            if dtype not in DTYPES[device_type]:
                names = " or ".join(f"pyflow.{d.name}" for d in DTYPES[device_type])
                raise TypeError(f"autocast: dtype must be {names} for device_type "
                                f"{device_type!r}, got {given!r}")
        if not isinstance(enabled, bool):
            raise TypeError(f"autocast: enabled must be a bool, got {type(enabled).__name__}")
        self.fast_dtype = dtype
        self._enabled = enabled
        self._cache_enabled = True if cache_enabled is None else bool(cache_enabled)
        self._saved = []        # a stack: one instance may be entered again inside itself

    def __enter__(self):
        mode, dev = AUTOCAST, self.device_type
        self._saved.append((getattr(mode, dev), getattr(mode, dev + "_dtype"), mode.cache))
        setattr(mode, dev, self._enabled)
        setattr(mode, dev + "_dtype", self.fast_dtype)
        mode.cache = self._cache_enabled
        mode.enabled = mode.cpu or mode.cuda
        return self

    def __exit__(self, *exc):
        mode, dev = AUTOCAST, self.device_type
        on, dtype, mode.cache = self._saved.pop()
        setattr(mode, dev, on)
        setattr(mode, dev + "_dtype", dtype)
        mode.enabled = mode.cpu or mode.cuda
        return False

    def __call__(self, fn):
        """Decorator: ``fn`` runs inside this autocast on every call."""
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with self:
                return fn(*args, **kwargs)
        return wrapper
