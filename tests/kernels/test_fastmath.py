"""The vectorizable float32 transcendental functions of kernels/cpu/fastmath.py
against float64 NumPy, on a dense grid and at special values."""
import numpy as np
import pytest
from numba import njit

from pyflow.kernels.cpu.fastmath import fast_erf, fast_exp, fast_tanh

FASTMATH = {"nsz", "arcp", "contract", "afn", "reassoc"}   # as kernels/cpu/activation.py


def _loop(fn):
    @njit(fastmath=FASTMATH, error_model="numpy")
    def run(x, out):
        for i in range(x.size):
            out[i] = fn(x[i])
    return run


def _apply(fn, x):
    out = np.empty_like(x)
    _loop(fn)(x, out)
    return out


@pytest.mark.parametrize("fn, ref, lo, hi, rel, abs_", [
    (fast_exp, np.exp, -80.0, 80.0, 2e-7, 0.0),
    (fast_erf, None, -6.0, 6.0, 0.0, 5e-7),
    (fast_tanh, np.tanh, -12.0, 12.0, 3e-7, 0.0),
])
def test_accuracy_on_a_grid(fn, ref, lo, hi, rel, abs_):
    x = np.linspace(lo, hi, 400_001).astype(np.float32)
    if ref is None:
        import math
        want = np.array([math.erf(v) for v in x.astype(np.float64)])
    else:
        want = ref(x.astype(np.float64))
    got = _apply(fn, x).astype(np.float64)
    err = np.abs(got - want)
    if rel:
        assert (err / np.maximum(np.abs(want), 1e-30)).max() < rel
    else:
        assert err.max() < abs_


def test_special_values():
    x = np.array([np.nan, np.inf, -np.inf, 0.0, 1e-30, -1e-30, 100.0, -100.0], np.float32)
    np.testing.assert_array_equal(_apply(fast_tanh, x), np.tanh(x))
    np.testing.assert_array_equal(_apply(fast_exp, x[:4]), np.exp(x[:4]))
    assert np.isnan(_apply(fast_erf, x[:1])[0])
