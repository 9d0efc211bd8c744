"""Data types and PyTorch's type-promotion rules.

A ``dtype`` names how elements are stored (``storage``: the NumPy dtype of the
backing array) and how CPU kernels compute on them (``compute``).  NumPy has no
bfloat16, so bfloat16 tensors are stored as raw 16-bit words (``uint16``) and
computed in float32; float16 is stored natively by NumPy but numba's CPU
backend cannot compute on it, so it is computed in float32 as well.
"""
import numpy as np

__all__ = [
    "dtype", "float32", "float64", "float16", "bfloat16", "int32", "int64", "bool",
    "float", "double", "half", "int", "long", "get_default_dtype", "set_default_dtype",
    "promote_types", "result_type",
]

_BOOL, _INT, _FLOAT = 0, 1, 2  # category order used by promotion


class dtype:
    __slots__ = ("name", "storage", "compute", "itemsize", "category", "bits")

    def __init__(self, name, storage, compute, category, bits):
        self.name = name
        self.storage = np.dtype(storage)
        self.compute = np.dtype(compute)
        self.itemsize = self.storage.itemsize
        self.category = category
        self.bits = bits

    @property
    def is_floating_point(self):
        return self.category == _FLOAT

    @property
    def is_signed(self):
        return self.category != _BOOL

    def __repr__(self):
        return "pyflow." + self.name

    def __reduce__(self):  # dtypes are singletons, also across pickling
        return (_by_name, (self.name,))


float32 = dtype("float32", np.float32, np.float32, _FLOAT, 32)
float64 = dtype("float64", np.float64, np.float64, _FLOAT, 64)
float16 = dtype("float16", np.float16, np.float32, _FLOAT, 16)
bfloat16 = dtype("bfloat16", np.uint16, np.float32, _FLOAT, 16)
int32 = dtype("int32", np.int32, np.int32, _INT, 32)
int64 = dtype("int64", np.int64, np.int64, _INT, 64)
bool = dtype("bool", np.bool_, np.bool_, _BOOL, 8)  # noqa: A001 (PyTorch's name)
float, double, half, int, long = float32, float64, float16, int32, int64  # noqa: A001

ALL = (float32, float64, float16, bfloat16, int32, int64, bool)
_BY_NAME = {d.name: d for d in ALL}
_FROM_NUMPY = {np.dtype(np.float32): float32, np.dtype(np.float64): float64,
               np.dtype(np.float16): float16, np.dtype(np.int32): int32,
               np.dtype(np.int64): int64, np.dtype(np.bool_): bool}
# NumPy integer types PyTorch would also accept, widened to a supported one.
_FROM_NUMPY.update({np.dtype(t): int64 for t in (np.int8, np.int16, np.uint8, np.uint32)})

_default = [float32]


def _by_name(name):
    return _BY_NAME[name]


def from_numpy(np_dtype):
    try:
        return _FROM_NUMPY[np.dtype(np_dtype)]
    except KeyError:
        raise TypeError(f"NumPy dtype {np.dtype(np_dtype)} has no pyflow equivalent; "
                        f"supported: {sorted(str(k) for k in _FROM_NUMPY)}") from None


def get_default_dtype():
    return _default[0]


def set_default_dtype(d):
    d = as_dtype(d, "d")
    if not d.is_floating_point:
        raise TypeError(f"set_default_dtype: expected a floating point dtype, got {d}")
    _default[0] = d


# Names a dtype may be given by: each dtype's own and PyTorch's aliases, so "float"
# is float32 and "int" int32 as ``torch.float``/``torch.int`` (NumPy's "float" is
# float64 and its "int" int64, so strings never go through NumPy).
_BY_STRING = dict(_BY_NAME, float=float32, double=float64, half=float16, int=int32, long=int64)


def as_dtype(d, argname="dtype"):
    """Accept a pyflow dtype, a name ("float32", or PyTorch's "float", "double",
    "half", "int", "long"; "pyflow."/"torch." prefixes allowed), a NumPy dtype or
    a Python type (float -> float64, int -> int64, bool -> bool, as in PyTorch)."""
    if type(d) is dtype:
        return d
    if isinstance(d, str):
        name = d[7:] if d.startswith("pyflow.") else d[6:] if d.startswith("torch.") else d
        if name in _BY_STRING:
            return _BY_STRING[name]
        raise TypeError(f"{argname}: unknown dtype name {d!r}; expected a pyflow dtype (e.g. "
                        f"pyflow.float32) or one of the names {sorted(_BY_STRING)}")
    import builtins
    if d is builtins.float:
        return float64
    if d is builtins.int:
        return int64
    if d is builtins.bool:
        return bool
    try:
        return from_numpy(d)
    except TypeError:
        raise TypeError(f"{argname}: expected a pyflow dtype (e.g. pyflow.float32), got {d!r}") from None


# Lattice for two dtypes of one category; mixed float16/bfloat16 goes to float32.
def promote_types(a, b):
    if a is b:
        return a
    if a.category != b.category:
        return a if a.category > b.category else b
    if a.category == _INT:
        return int64
    if {a, b} == {float16, bfloat16}:
        return float32
    return a if a.bits > b.bits else b


def _scalar_category(x):
    import builtins
    if isinstance(x, builtins.bool):
        return _BOOL
    if isinstance(x, (builtins.int, np.integer)):     # NumPy ints are ints, as in PyTorch
        return _INT
    return _FLOAT


def result_type(*operands):
    """torch.result_type: tensors with dimensions outrank 0-dim tensors, which
    outrank Python scalars; a lower rank only matters when its category
    (bool < int < float) is higher."""
    dim_t = zero_t = None
    scalar_cat = -1
    for x in operands:
        d = getattr(x, "dtype", None)
        if type(d) is dtype:
            if x.ndim > 0:
                dim_t = d if dim_t is None else promote_types(dim_t, d)
            else:
                zero_t = d if zero_t is None else promote_types(zero_t, d)
        elif x is not None:
            c = _scalar_category(x)
            scalar_cat = c if c > scalar_cat else scalar_cat
    res = dim_t
    if zero_t is not None and (res is None or zero_t.category > res.category):
        res = zero_t
    if scalar_cat >= 0 and (res is None or scalar_cat > res.category):
        res = {_BOOL: bool, _INT: int64, _FLOAT: _default[0]}[scalar_cat]
    return res
