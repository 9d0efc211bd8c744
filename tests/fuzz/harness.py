"""Run one fuzz case on pyflow and on PyTorch and compare the outcomes (the rule
is in this package's docstring).

A case is a function ``case(lib, T)``: ``lib`` is the ``pyflow`` or ``torch``
module, ``T(arr)`` turns an :class:`Arr` (NumPy values and a dtype name) into
that library's tensor.  The same function, written once, runs on both::

    x, i = Arr(values, "float32"), Arr(index, "int64")
    check(lambda lib, T: lib.gather(T(x), 1, T(i)))
"""
import contextlib
import faulthandler
import signal
import sys

import numpy as np
import pytest
from hypothesis import strategies as st

import pyflow as pf

torch = pytest.importorskip("torch")

CASE_SECONDS = 10        # per case and library; a first-call numba compile fits well inside
FAMILIES = (TypeError, ValueError, IndexError, RuntimeError)
NUMBA_LEAKS = ("TypingError", "No implementation of function", "numba.core.errors")

FLOATS = ("float16", "bfloat16", "float32", "float64")
INTS = ("int32", "int64")
DTYPES = FLOATS + INTS + ("bool",)
# The tolerance a result of each dtype is compared at (rtol, atol).
TOL = {"float16": (1e-2, 1e-2), "bfloat16": (3e-2, 3e-2), "float32": (1e-4, 1e-5),
       "float64": (1e-9, 1e-12)}


class Arr:
    """Values (a NumPy array) and the dtype (a name both libraries know) of one
    input tensor; ``T`` makes the tensor."""

    def __init__(self, values, dtype):
        self.values, self.dtype = np.asarray(values), dtype

    def __repr__(self):
        return f"Arr({self.values.tolist()!r}, {self.dtype!r}, shape={self.values.shape})"


def _maker(lib):
    def T(a):
        if not isinstance(a, Arr):
            return a
        if a.dtype in ("bfloat16", "float16"):  # through float32: NumPy has no bfloat16
            t = lib.tensor(a.values.astype(np.float32), dtype=lib.float32)
            return t.to(getattr(lib, a.dtype))
        return lib.tensor(a.values.astype(a.dtype), dtype=getattr(lib, a.dtype))
    return T


# ------------------------------------------------------------------ strategies
def values(shape, dtype, special=True, low=-3, high=3):
    """A NumPy array of ``shape`` for ``dtype``: small floats with, now and then,
    NaN, +-inf and signed zeros; small ints; bools."""
    n = int(np.prod(shape, dtype=np.int64))
    if dtype == "bool":
        elem = st.booleans()
    elif dtype in INTS:
        elem = st.integers(low, high)
    else:
        elem = st.floats(low, high, allow_nan=False, width=16 if dtype == "float16" else 32)
        if special:
            elem = st.one_of(elem, st.sampled_from([np.nan, np.inf, -np.inf, 0.0, -0.0]))
    return st.lists(elem, min_size=n, max_size=n).map(
        lambda v: np.array(v, dtype=np.float64 if dtype not in ("bool",) + INTS else dtype)
        .reshape(shape))


def shapes(min_dims=0, max_dims=3, min_side=0, max_side=4):
    return st.lists(st.integers(min_side, max_side), min_size=min_dims,
                    max_size=max_dims).map(tuple)


@st.composite
def arrays(draw, shape=None, dtype=None, dtypes=DTYPES, special=True, **shape_kw):
    shape = draw(shapes(**shape_kw)) if shape is None else shape
    dtype = draw(st.sampled_from(dtypes)) if dtype is None else dtype
    return Arr(draw(values(shape, dtype, special)), dtype)


# Arguments of the wrong kind where a tensor is expected.
NOT_TENSORS = st.sampled_from([None, 1.5, "x", [[1.0, 2.0]], (1, 2), object()])


# ------------------------------------------------------------------ running a case
class CaseTimeout(Exception):
    pass


@contextlib.contextmanager
def time_limit(seconds, what):
    """Raise CaseTimeout after ``seconds``.  SIGALRM is delivered between Python
    bytecodes, so a kernel that never returns is ended by faulthandler instead:
    it dumps every thread's stack and exits the process a little later."""
    def on_alarm(signum, frame):
        raise CaseTimeout(f"{what} took more than {seconds} s")
    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    faulthandler.dump_traceback_later(seconds + 20, exit=True, file=sys.__stderr__)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        faulthandler.cancel_dump_traceback_later()
        signal.signal(signal.SIGALRM, old)


def outcome(lib, case):
    """('ok', result) or ('err', exception) of ``case`` on ``lib``."""
    name = lib.__name__
    try:
        with time_limit(CASE_SECONDS, name):
            return "ok", case(lib, _maker(lib))
    except CaseTimeout as e:
        pytest.fail(f"{e}: a hang")
    except Exception as e:          # noqa: BLE001 - the exception is the outcome
        return "err", e


def family(exc):
    for f in FAMILIES:
        if isinstance(exc, f):
            return f
    return next(c for c in type(exc).__mro__ if c.__module__ == "builtins")


def check_error(p, t):
    """pyflow's exception ``p`` against torch's ``t`` (see the package docstring)."""
    msg = f"{type(p).__name__}: {p}"
    assert not isinstance(p, AttributeError), f"pyflow leaked {msg}"
    assert not type(p).__module__.startswith("numba"), f"pyflow leaked numba's {msg}"
    assert not any(s in str(p) for s in NUMBA_LEAKS), f"pyflow leaked numba's {msg}"
    assert str(p).strip(), f"pyflow raised {type(p).__name__} with no message"
    want = TypeError if isinstance(t, AttributeError) else family(t)
    assert isinstance(p, want), (f"pyflow raised {msg}\nwhere torch raised "
                                 f"{type(t).__name__}: {str(t).splitlines()[0]}\n"
                                 f"(expected a {want.__name__})")


def _dtype_name(d):
    return str(d).rsplit(".", 1)[-1]


def check_same(p, t, where="result"):
    """pyflow's result ``p`` equals torch's ``t``: structure, shape, dtype, values."""
    if isinstance(t, torch.Tensor):
        assert isinstance(p, pf.Tensor), f"{where}: pyflow gave {type(p).__name__}, torch a Tensor"
        assert tuple(p.shape) == tuple(t.shape), \
            f"{where}: shape {tuple(p.shape)} != torch's {tuple(t.shape)}"
        pd, td = _dtype_name(p.dtype), _dtype_name(t.dtype)
        assert pd == td, f"{where}: dtype {pd} != torch's {td}"
        if td in FLOATS:
            rtol, atol = TOL[td]
            np.testing.assert_allclose(p.detach().to(pf.float64).numpy(),
                                       t.detach().to(torch.float64).numpy(),
                                       rtol=rtol, atol=atol, equal_nan=True, err_msg=where)
        else:
            np.testing.assert_array_equal(p.detach().numpy(), t.detach().numpy(), err_msg=where)
    elif isinstance(t, (tuple, list)) and not isinstance(t, torch.Size):
        n = len(p) if hasattr(p, "__len__") else "?"
        assert isinstance(p, (tuple, list)) and len(p) == len(t), \
            f"{where}: pyflow gave {type(p).__name__} of {n}, torch {type(t).__name__} of {len(t)}"
        for i, (a, b) in enumerate(zip(p, t)):
            check_same(a, b, f"{where}[{i}]")
    elif isinstance(t, float) and np.isnan(t):
        assert isinstance(p, float) and np.isnan(p), f"{where}: {p!r} != torch's nan"
    else:
        assert p == t, f"{where}: {p!r} != torch's {t!r}"


def check(case):
    """Run ``case(lib, T)`` on both libraries; assert the outcomes agree."""
    pk, pv = outcome(pf, case)
    tk, tv = outcome(torch, case)
    if pk == "err" and tk == "err":
        check_error(pv, tv)
    elif pk == "ok" and tk == "ok":
        check_same(pv, tv)
    elif pk == "err":
        raise AssertionError(f"pyflow raised {type(pv).__name__}: {pv}\nwhere torch returned "
                             f"{_describe(tv)}") from pv
    else:
        raise AssertionError(f"pyflow returned {_describe(pv)}\nwhere torch raised "
                             f"{type(tv).__name__}: {str(tv).splitlines()[0]}")


def _describe(r):
    if isinstance(r, (pf.Tensor, torch.Tensor)):
        return f"a tensor of shape {tuple(r.shape)} and dtype {_dtype_name(r.dtype)}"
    return repr(r)[:200]


def fuzz(fn):
    """The settings of every fuzz test: the profile's example count (tests/conftest.py),
    derandomized and without an example database, so CI runs the same cases each time."""
    from hypothesis import settings
    return settings(derandomize=True, database=None, deadline=None)(fn)
