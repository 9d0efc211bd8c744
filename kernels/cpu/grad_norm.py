"""Global-norm gradient clipping over many tensors in one pass (apex/OneFlow's
"multi-tensor" norm and scale), for ``pyflow.nn.utils.clip_grad_norm_``.

``multi_tensor_norm(arrays, norm_type)`` is the p-norm of every element of
every array taken together, as a Python float: for p = 2 the square root of a
float64 sum of squares, for p = 1 a float64 sum of absolute values, for
p = inf the largest absolute value (NaN if any value is NaN).
``multi_tensor_scale(arrays, coef)`` multiplies every array in place by
``coef`` rounded to the array's dtype, as ``x.mul_(coef)`` with a Python float
does in pyflow and torch (float32 arrays: ``x * float32(coef)`` in float32), so
a clipped gradient is bit for bit the one ``mul_`` gives.

How the list reaches numba: as in ``optim.py`` and ``amp.py``, a tuple of flat
arrays of one dtype padded to ``TUPLE_WIDTH`` (one compilation per dtype,
whatever the gradient count; longer lists run in chunks).  Each chunk is cut
into work items of at most ``BLOCK`` elements of one array (a table of
(array, lo, hi) rows), and a ``prange`` runs over the items: a big embedding
gradient is shared among the threads as well as many small ones.  Every item
writes its own float64 partial; the partials are then combined in item order,
so the order of additions depends on the array sizes only, never on the thread
count or schedule (the serial and parallel compilations of ``twin`` agree bit for bit).
A chunk goes to the threads only from ``PARALLEL_MIN`` elements, a higher bar
than twin.py's: these passes are bound by memory bandwidth, which a second
thread barely adds to, while a parallel region waits for a free core (twin.py).
Measured on this project's loaded 2-core machine: a 4M-element float32 sum of
squares 0.8 ms on one thread, 2.5 ms on the threads; 16M: 2.7 ms vs 4.1 ms.

float32/float64 C-contiguous (and, for the norm, writeable: a read-only array
is another numba type) arrays go through numba.  float16 arrays (numba's CPU
backend has no float16 arithmetic) and non-contiguous ones take a NumPy path:
the norm of a float64 copy, and an in-place multiply (float16 computed in
float32 and rounded once, as pyflow's and ATen's ``mul_`` do).  bfloat16 is
stored as uint16 words that carry no dtype here: as with ``amp_unscale_check``
the caller passes their float32 values and casts the result back.
"""
import math

import numpy as np
from numba import njit, prange

from ..registry import register
from .optim import TUPLE_WIDTH
from .twin import twin

_FAST = (np.dtype(np.float32), np.dtype(np.float64))
_FLOATS = (np.dtype(np.float16),) + _FAST
_EMPTY = {dt: np.empty(0, dt) for dt in _FAST}
BLOCK = 1 << 16            # elements per work item (the partial sums' granularity)
PARALLEL_MIN = 1 << 23     # elements of a chunk from which it runs on the threads
# norm_type -> the kernel's mode
SUM_SQUARES, SUM_ABS, MAX_ABS = 0, 1, 2
_MODES = {2.0: SUM_SQUARES, 1.0: SUM_ABS, math.inf: MAX_ABS}


# The block folds accumulate in float64 with ``fastmath={"reassoc"}``, as the
# norms of reduce.py do: LLVM may then vectorize the fold (it reorders the
# additions, which a float64 accumulator makes harmless).  They are separate
# functions, not inlined into the prange kernels, so the flag stays on their
# loops; the order LLVM picks is fixed at compile time, so a result still
# depends on the data only.
@njit(nogil=True, cache=True, error_model="numpy", fastmath={"reassoc"})
def _sum_squares(a, lo, hi):
    """Float64 sum of squares of a[lo:hi]."""
    b = a[lo:hi]        # (indices from 0: a[i] with i from an int64 lo would carry a
    s = 0.0             # negative-index check that keeps LLVM from vectorizing)
    for i in range(b.size):
        v = np.float64(b[i])
        s += v * v
    return s


@njit(nogil=True, cache=True, error_model="numpy", fastmath={"reassoc"})
def _sum_abs(a, lo, hi):
    b = a[lo:hi]
    s = 0.0
    for i in range(b.size):
        s += abs(np.float64(b[i]))
    return s


@njit(nogil=True, cache=True, error_model="numpy")
def _max_abs(a, lo, hi):
    """The largest |a[i]| of a[lo:hi] (0 when empty), NaN if any is NaN."""
    b = a[lo:hi]
    m = 0.0
    nan = False
    for i in range(b.size):
        v = abs(np.float64(b[i]))
        if v > m:
            m = v
        elif v != v:
            nan = True
    return np.nan if nan else m


@njit(nogil=True, cache=True, error_model="numpy")
def _scale_block(a, lo, hi, coef):
    b = a[lo:hi]
    for i in range(b.size):
        b[i] = b[i] * coef


@twin(size_of=1, nogil=True, cache=True, error_model="numpy")
def _norm_partials_kernel(arrays, work, mode, partials):
    """partials[b] = the mode's reduction of arrays[work[b, 0]][work[b, 1]:work[b, 2]]."""
    for b in prange(work.shape[0]):
        a = arrays[work[b, 0]]
        lo, hi = work[b, 1], work[b, 2]
        if mode == 0:
            partials[b] = _sum_squares(a, lo, hi)
        elif mode == 1:
            partials[b] = _sum_abs(a, lo, hi)
        else:
            partials[b] = _max_abs(a, lo, hi)


@twin(size_of=1, nogil=True, cache=True, error_model="numpy")
def _scale_kernel(arrays, work, coef):
    """arrays[t][lo:hi] *= coef for every (t, lo, hi) row of ``work``, in place."""
    for b in prange(work.shape[0]):
        _scale_block(arrays[work[b, 0]], work[b, 1], work[b, 2], coef)


def _work_table(sizes):
    """(rows of (array index, lo, hi) of at most BLOCK elements, element count)."""
    rows = [(t, lo, min(lo + BLOCK, n)) for t, n in enumerate(sizes) for lo in range(0, n, BLOCK)]
    return np.array(rows, dtype=np.int64).reshape(-1, 3), sum(sizes)


def _chunks(arrays, dtype):
    """(padded tuple, work table, element count) per TUPLE_WIDTH arrays of ``dtype``."""
    empty = _EMPTY[dtype]
    for lo in range(0, len(arrays), TUPLE_WIDTH):
        chunk = arrays[lo:lo + TUPLE_WIDTH]
        work, n = _work_table([a.size for a in chunk])
        yield tuple(chunk) + (empty,) * (TUPLE_WIDTH - len(chunk)), work, n


def _pick(twin_kernel, n):
    return twin_kernel.parallel if n >= PARALLEL_MIN else twin_kernel.serial


def combine(values, mode):
    """Partial results (float64, in a fixed order) as one: a sum, or a NaN-
    propagating max.  Shared with the CUDA twin, which sums its partials here."""
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0:
        return 0.0
    if mode == MAX_ABS:
        return float("nan") if np.isnan(values).any() else float(values.max())
    return float(values.sum())


def finish(value, mode):
    """The norm from the combined partials (the square root for p = 2)."""
    return math.sqrt(value) if mode == SUM_SQUARES else value


def _numpy_partial(a, mode):
    """The NumPy path (float16, or any layout): the mode's reduction in float64."""
    x = np.asarray(a, dtype=np.float64).reshape(-1)
    if x.size == 0:
        return 0.0
    if mode == SUM_SQUARES:
        return float(np.dot(x, x))
    if mode == SUM_ABS:
        return float(np.abs(x).sum())
    return combine(np.abs(x), MAX_ABS)


def _scale_numpy(a, coef):
    if a.dtype == np.float16:
        a[...] = (a.astype(np.float32) * np.float32(coef)).astype(np.float16)
    else:
        a *= a.dtype.type(coef)


def check_call(op, arrays):
    if not isinstance(arrays, (list, tuple)):
        raise TypeError(f"{op}: 'arrays' must be a list of arrays, got {type(arrays).__name__}")


def dtype_error(op, i, dtype):
    """The message for an array of a dtype the kernels do not take (both devices)."""
    return TypeError(f"{op}: 'arrays[{i}]' must be float16, float32 or float64, got {dtype} "
                     f"(bfloat16: pass the float32 values and cast the result back)")


def norm_mode(op, norm_type):
    """The kernel mode of ``norm_type`` (1, 2 or inf; other norms take the op path)."""
    try:
        return _MODES[float(norm_type)]
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"{op}: 'norm_type' must be 1, 2 or inf, got {norm_type!r}") from None


def scale_coef(op, coef):
    if isinstance(coef, (bool, np.bool_)) or not isinstance(coef, (int, float, np.floating)):
        raise TypeError(f"{op}: 'coef' must be a real number, got {type(coef).__name__}")
    return float(coef)


def _check_array(op, i, a, writeable=False):
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{op}: 'arrays[{i}]' must be a NumPy array, got {type(a).__name__}")
    if a.dtype not in _FLOATS:
        raise dtype_error(op, i, a.dtype)
    if writeable and not a.flags.writeable:
        raise ValueError(f"{op}: 'arrays[{i}]' must be writeable (it is scaled in place)")


def _split(op, arrays, writeable):
    """({dtype: flat C-contiguous float32/float64 arrays}, the other non-empty arrays)."""
    fast, slow = {dt: [] for dt in _FAST}, []
    for i, a in enumerate(arrays):
        _check_array(op, i, a, writeable)
        if a.size == 0:
            continue
        if a.dtype in fast and a.flags.c_contiguous and a.flags.writeable:
            fast[a.dtype].append(a.reshape(-1))     # (a read-only array is another numba type)
        else:
            slow.append(a)
    return fast, slow


@register("multi_tensor_norm", "cpu")
def multi_tensor_norm(arrays, norm_type=2.0):
    """The ``norm_type``-norm (1, 2 or inf) of all elements of ``arrays`` (a list
    of float16/float32/float64 NumPy arrays, any shapes, layouts and dtypes), as
    a Python float computed in float64; 0.0 for no elements."""
    op = "multi_tensor_norm"
    check_call(op, arrays)
    mode = norm_mode(op, norm_type)
    fast, slow = _split(op, arrays, writeable=False)
    parts = []
    for dt, flats in fast.items():
        for padded, work, n in _chunks(flats, dt):
            partials = np.empty(work.shape[0], np.float64)
            _pick(_norm_partials_kernel, n)(padded, work, mode, partials)
            parts.append(partials)
    parts.append(np.array([_numpy_partial(a, mode) for a in slow], np.float64))
    return finish(combine(np.concatenate(parts), mode), mode)


@register("multi_tensor_scale", "cpu")
def multi_tensor_scale(arrays, coef):
    """Multiply every array of ``arrays`` in place by ``coef`` in the array's
    dtype (float16 through float32), as ``mul_`` by a Python float does."""
    op = "multi_tensor_scale"
    check_call(op, arrays)
    coef = scale_coef(op, coef)
    fast, slow = _split(op, arrays, writeable=True)
    for dt, flats in fast.items():
        c = dt.type(coef)
        for padded, work, n in _chunks(flats, dt):
            _pick(_scale_kernel, n)(padded, work, c)
    for a in slow:
        _scale_numpy(a, coef)
