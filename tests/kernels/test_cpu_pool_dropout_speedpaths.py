"""The fast CPU paths of max pooling and dropout give exactly what the plain
definitions give.

* max pooling: ``_max_pool_2x2`` (the unrolled 2x2/2 kernel) and ``_max_pool``
  (any window) compare with ``>`` alone and redo a plane holding a NaN with
  ``_max_pool_plane``; each of them, on the threads and on one thread, must
  match a plain window-by-window reference bit for bit (values, including the
  sign of zero, and indices): first maximum on ties, the last NaN of a window
  wins, -1 where no element beats -inf.
* dropout: the blocked kernel tests ``bits >> 8 >= keep_threshold(p)`` on
  integers; the contract is the float test ``(bits >> 8) * 2**-24 >= float32(p)``
  on the same Philox words (tests/ops/test_dropout_embedding.py checks the mask
  against a NumPy Philox).
"""
import itertools

import numpy as np
import pytest

from pyflow.kernels.cpu import dropout as D
from pyflow.kernels.cpu import pool as P

pytestmark = pytest.mark.cpu_only


# ------------------------------------------------------------------ max pooling
def window_reference(x, k, s, p, d, out_hw):
    """Plain Python: per window, in row-major order, take v when v > best or v
    is NaN (best starts at -inf, index -1); positions in the padding are skipped."""
    planes, H, W = x.shape
    out = np.empty((planes,) + out_hw, x.dtype)
    idx = np.empty(out.shape, np.int64)
    for q, oh, ow in itertools.product(range(planes), range(out_hw[0]), range(out_hw[1])):
        best, where = -np.inf, -1
        for i, j in itertools.product(range(k[0]), range(k[1])):
            ih, iw = oh * s[0] - p[0] + i * d[0], ow * s[1] - p[1] + j * d[1]
            if 0 <= ih < H and 0 <= iw < W:
                v = x[q, ih, iw]
                if v > best or np.isnan(v):
                    best, where = v, ih * W + iw
        out[q, oh, ow], idx[q, oh, ow] = best, where
    return out, idx


def out_size(n, k, p, s, d, ceil_mode):
    """PyTorch's pooling_output_shape."""
    num = n + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)
    o = num // s + 1
    return o - 1 if ceil_mode and (o - 1) * s >= n + p else o


def hard_planes(rng, planes, H, W, dtype):
    """Half-integers (many ties), -0.0 next to 0.0, -inf, NaN in some planes,
    a plane of -inf only and a plane of signed zeros only."""
    x = np.round(rng.standard_normal((planes, H, W)) * 2) / 2
    u = rng.random(x.shape)
    x[u < 0.15] = -np.inf
    x[(u >= 0.15) & (u < 0.25)] = -0.0
    x[(u >= 0.25) & (u < 0.35)] = 0.0
    nan_planes = rng.random(planes) < 0.3
    x[nan_planes[:, None, None] & (rng.random(x.shape) < 0.2)] = np.nan
    x[0] = -np.inf
    x[1] = np.where(u[1] < 0.5, 0.0, -0.0)
    x[2, 0, :] = np.nan           # NaN next to numbers and NaN next to NaN
    return x.astype(dtype)


def assert_same(got, want):
    (y, i), (ry, ri) = got, want
    assert y.dtype == ry.dtype and i.dtype == ri.dtype == np.int64
    assert np.array_equal(y.view(np.uint8), ry.view(np.uint8))     # NaN and -0.0 alike
    np.testing.assert_array_equal(i, ri)


def run(kernel, x, *geometry, out_hw):
    out = np.full((x.shape[0],) + out_hw, 7, x.dtype)
    idx = np.full(out.shape, 7, np.int64)
    kernel(x, *geometry, out, idx)
    return out, idx


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("hw", [(2, 2), (4, 6), (5, 7), (24, 24)])
def test_2x2_kernel_matches_the_general_one_and_the_reference(dtype, hw):
    rng = np.random.default_rng(hw[0] * 31 + hw[1])
    x = hard_planes(rng, 12, *hw, dtype)
    out_hw = (hw[0] // 2, hw[1] // 2)
    want = window_reference(x, (2, 2), (2, 2), (0, 0), (1, 1), out_hw)
    assert (want[1] == -1).any() and np.isnan(want[0]).any()    # the cases are there
    for compiled in ("serial", "parallel"):
        assert_same(run(getattr(P._max_pool_2x2, compiled), x, out_hw=out_hw), want)
        assert_same(run(getattr(P._max_pool, compiled), x, 2, 2, 2, 2, 0, 0, 1, 1,
                        out_hw=out_hw), want)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_general_kernel_matches_the_reference_for_every_geometry(dtype):
    rng = np.random.default_rng(5)
    cases = 0
    for k, s, p, d, ceil_mode in itertools.product((1, 2, 3), (1, 2, 3), (0, 1), (1, 2),
                                                   (False, True)):
        if 2 * p > k:
            continue
        for H, W in ((5, 7), (6, 4)):
            out_hw = (out_size(H, k, p, s, d, ceil_mode), out_size(W, k, p, s, d, ceil_mode))
            if min(out_hw) < 1:
                continue
            x = hard_planes(rng, 6, H, W, dtype)
            want = window_reference(x, (k, k), (s, s), (p, p), (d, d), out_hw)
            geometry = (k, k, s, s, p, p, d, d)
            for compiled in ("serial", "parallel"):
                assert_same(run(getattr(P._max_pool, compiled), x, *geometry, out_hw=out_hw),
                            want)
            # and the registered kernel, whichever path it takes
            assert_same(P.max_pool2d(x[None], (k, k), (s, s), (p, p), (d, d), out_hw),
                        tuple(a[None] for a in want))
            cases += 1
    assert cases > 100


def test_nan_planes_are_redone_exactly():
    """Without the plane redo, ``>`` alone would keep the first number over a
    NaN, and the first NaN over later ones: this input tells them apart."""
    x = np.array([[[1.0, np.nan, 3.0, np.nan],
                   [np.nan, 2.0, 5.0, 4.0]]], np.float32)
    for compiled in ("serial", "parallel"):
        y, i = run(getattr(P._max_pool_2x2, compiled), x, out_hw=(1, 2))
        assert np.isnan(y).all() and i.tolist() == [[[4, 3]]]
        y, i = run(getattr(P._max_pool, compiled), x, 2, 2, 2, 2, 0, 0, 1, 1, out_hw=(1, 2))
        assert np.isnan(y).all() and i.tolist() == [[[4, 3]]]


def test_which_max_pool_kernel_runs(monkeypatch):
    calls = []
    for name in ("_max_pool", "_max_pool_2x2"):
        real = getattr(P, name)
        monkeypatch.setattr(P, name, lambda *a, _n=name, _f=real: (calls.append(_n), _f(*a)))
    x = np.random.default_rng(0).standard_normal((2, 3, 7, 6)).astype(np.float32)
    cases = [(((2, 2), (2, 2), (0, 0), (1, 1), (3, 3)), "_max_pool_2x2"),     # floor mode
             (((2, 2), (2, 2), (0, 0), (1, 1), (4, 3)), "_max_pool"),         # ceil_mode window
             (((2, 2), (2, 2), (1, 1), (1, 1), (4, 4)), "_max_pool"),         # padding
             (((2, 2), (1, 1), (0, 0), (1, 1), (6, 5)), "_max_pool"),         # stride 1
             (((2, 2), (2, 2), (0, 0), (2, 2), (3, 2)), "_max_pool"),         # dilation
             (((3, 3), (3, 3), (0, 0), (1, 1), (2, 2)), "_max_pool")]
    for args, want in cases:
        calls.clear()
        got = P.max_pool2d(x, *args)
        assert calls == [want], args
        ref = window_reference(x.reshape(6, 7, 6), *args[:4], args[4])
        assert_same(tuple(a.reshape(6, *args[4]) for a in got), ref)


def test_cnn_shape_through_the_registered_kernel():
    """The MNIST CNN's pool (64x64x24x24, 2x2/2) on the threads, against the
    general kernel on one thread (planes with NaN included)."""
    rng = np.random.default_rng(1)
    x = np.maximum(rng.standard_normal((64, 64, 24, 24)).astype(np.float32), 0)
    x[3, 5, 7, 7] = np.nan
    x[9, 1] = -np.inf
    y, i = P.max_pool2d(x, (2, 2), (2, 2), (0, 0), (1, 1), (12, 12))
    want = run(P._max_pool.serial, x.reshape(-1, 24, 24), 2, 2, 2, 2, 0, 0, 1, 1,
               out_hw=(12, 12))
    assert_same((y.reshape(-1, 12, 12), i.reshape(-1, 12, 12)), want)
    assert i[9, 1].tolist() == [[-1] * 12] * 12 and np.isnan(y[3, 5, 3, 3])


# ------------------------------------------------------------------ dropout
def test_keep_threshold_is_the_float_test():
    """``m >= keep_threshold(p)`` iff ``float32(m) * 2**-24 >= float32(p)`` for
    every 24-bit m near the threshold, at p on, just off and between the
    2**-24 grid points, and at 0 and 1."""
    grid = [0.0, 1.0, 2.0 ** -24, 1 - 2.0 ** -24, 0.5, 0.25, 0.1, 0.3, 0.9, 1 / 3]
    ps = []
    for p in grid:
        p32 = np.float32(p)
        ps += [p32, np.nextafter(p32, np.float32(0)), np.nextafter(p32, np.float32(1))]
    ps += list(np.random.default_rng(0).random(200).astype(np.float32))
    for p in ps:
        p = float(np.clip(p, 0, 1))
        thr = int(D.keep_threshold(p))
        ms = np.arange(max(thr - 3, 0), min(thr + 3, 1 << 24), dtype=np.uint32)
        want = ms.astype(np.float32) * np.float32(2.0 ** -24) >= np.float32(p)
        assert np.array_equal(ms >= thr, want), p
    assert int(D.keep_threshold(1.0)) == 1 << 24 and int(D.keep_threshold(0.0)) == 0


def per_element_reference(n, p, seed, offset):
    """The words through the compiled ``philox4x32`` one group at a time, word
    e % 4 for element e, and the float keep test: the definition, unblocked."""
    k, o = D.key_words(seed, "seed"), D.key_words(offset, "offset")
    bits = np.array([D.philox_words((g & 0xFFFFFFFF, g >> 32, *o), k)
                     for g in range((n + 3) // 4)], np.uint32).reshape(-1)[:n]
    return (bits >> 8).astype(np.float32) * np.float32(2.0 ** -24) >= np.float32(p)


@pytest.mark.parametrize("n", [1, 3, 4, 5, 1023, 1024, 1025, 4 * 256 * 3 + 7])
@pytest.mark.parametrize("p", [0.0, 2.0 ** -24, 0.25, 0.5, 1 - 2.0 ** -24, 1.0])
def test_blocked_dropout_kernel_is_the_per_element_definition(n, p):
    """Sizes around the 1024-element blocks, both compilations, and a seed and
    offset whose high words are set."""
    seed, offset = 0xDEADBEEF12345678, (7 << 32) | 3
    want = per_element_reference(n, p, seed, offset)
    x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    x[::5] = np.nan
    scale = np.float32(D.check_probability(p))
    args = (D.keep_threshold(p), scale, np.float32(0), *D.key_words(seed, "seed"),
            *D.key_words(offset, "offset"))
    for compiled in ("serial", "parallel"):
        out, keep = np.empty_like(x), np.empty(n, np.bool_)
        getattr(D._dropout_philox, compiled)(x, *args, out, keep)
        np.testing.assert_array_equal(keep, want)
        want_out = x * np.where(want, scale, np.float32(0))
        assert np.array_equal(out.view(np.uint32), want_out.view(np.uint32))
