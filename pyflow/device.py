"""Devices.  ``cpu`` keeps tensors in NumPy arrays; ``cuda`` in CuPy arrays on a
GPU, or in NumPy arrays under numba's CUDA simulator (see ``pyflow.cuda``)."""
__all__ = ["device", "set_default_device", "get_default_device"]

_TYPES = ("cpu", "cuda")


class device:
    __slots__ = ("type", "index")

    def __init__(self, type_or_str, index=None):
        if isinstance(type_or_str, device):
            self.type, self.index = type_or_str.type, type_or_str.index
            return
        if not isinstance(type_or_str, str):
            raise TypeError(f"device: expected a string like 'cpu' or 'cuda:0', got {type_or_str!r}")
        s = type_or_str
        if ":" in s:
            s, idx = s.split(":", 1)
            if index is not None or not idx.isdigit():
                raise ValueError(f"device: invalid device string {type_or_str!r}")
            index = int(idx)
        if s not in _TYPES:
            raise ValueError(f"device: expected one of {_TYPES} (optionally ':index'), got {type_or_str!r}")
        self.type, self.index = s, index

    def __eq__(self, other):
        if isinstance(other, str):
            other = device(other)
        return isinstance(other, device) and self.type == other.type and \
            (self.index or 0) == (other.index or 0)

    def __hash__(self):
        return hash((self.type, self.index or 0))

    def __repr__(self):
        return f"device(type='{self.type}'" + (f", index={self.index})" if self.index is not None else ")")

    def __str__(self):
        return self.type if self.index is None else f"{self.type}:{self.index}"


CPU = device("cpu")
_default = [CPU]


def set_default_device(d):
    """Device of tensors made by creation ops without ``device=`` (PyTorch's name)."""
    d = as_device(d)
    check_available(d)
    _default[0] = d


def get_default_device():
    return _default[0]


def as_device(d, argname="device"):
    if d is None:
        return CPU
    if type(d) is device:
        return d
    if isinstance(d, int):
        return device("cuda", d)
    try:
        return device(d)
    except (TypeError, ValueError) as e:
        raise type(e)(f"{argname}: {e}") from None


def placed(d):
    """The device a tensor lives on: ``cuda`` means the current CUDA device, ``cuda:0``."""
    if d.type == "cuda" and d.index is None:
        from . import cuda
        return device("cuda", cuda.current_device())
    return d


def check_available(d):
    """Raise a clear error when data cannot be placed on device ``d``."""
    if d.type == "cpu":
        return
    from . import cuda
    reason = cuda.unavailable_reason()
    if reason is not None:
        raise RuntimeError(f"device '{d}' is not available: {reason}")
    if (d.index or 0) >= cuda.device_count():
        raise RuntimeError(f"device '{d}': invalid device index, {cuda.device_count()} CUDA "
                           f"device(s) available")
