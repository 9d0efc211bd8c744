"""kernels/cpu/blas.py: every layout, stack and broadcast the MKL path takes
gives NumPy's float64 answer, everything it does not take falls back to
``np.matmul``, and ``PYFLOW_BLAS`` is honoured.  Each test runs on both
backends; the MKL half skips only where the ``mkl`` wheel is not installed
(``make test`` installs it on x86-64 Linux, and test_mkl_used_when_installed
fails if it is installed but not used).  The measured choice of
``PYFLOW_BLAS=auto`` is tested in test_blas_tuning.py; here products are
routed by the fixed rule, so that nothing depends on a measurement."""
import importlib.metadata

import numpy as np
import pytest

from pyflow.kernels.cpu import blas, blas_tuning

try:
    importlib.metadata.version("mkl")
    MKL_INSTALLED = True
except importlib.metadata.PackageNotFoundError:
    MKL_INSTALLED = False

BACKENDS = ["numpy", pytest.param("mkl", marks=pytest.mark.skipif(
    not MKL_INSTALLED, reason="the mkl wheel is not installed"))]


@pytest.fixture(autouse=True)
def fixed_routing(tmp_path, monkeypatch):
    """MKL by the built-in size rule where it is installed (no measurement), and
    a cache directory of the test's own should a test choose ``auto``."""
    monkeypatch.setenv(blas_tuning.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv("PYFLOW_BLAS", "mkl" if MKL_INSTALLED else "numpy")
    blas.reload()
    yield
    monkeypatch.undo()
    blas.reload()


@pytest.fixture(params=BACKENDS)
def backend(request, monkeypatch):
    """Each backend in turn; on MKL every eligible product goes to MKL, however
    small (the size rule is tested on its own below)."""
    monkeypatch.setenv("PYFLOW_BLAS", request.param)
    monkeypatch.setattr(blas, "MKL_MIN_FLOPS", 0)
    monkeypatch.setattr(blas, "MKL_MIN_STACK_FLOPS", 0)
    blas.reload()
    assert blas.backend() == request.param
    yield request.param
    monkeypatch.undo()
    blas.reload()


def _view(rng, shape, layout, dtype):
    """A (..., r, c) operand stored as ``layout``: "c" contiguous, "t" a transposed
    view, "s" rows of a wider array (leading dimension > columns), "p" batch
    dims permuted (strides no single batch stride can describe)."""
    r, c = shape[-2:]
    if layout == "t":
        return np.swapaxes(rng.standard_normal(shape[:-2] + (c, r)).astype(dtype), -1, -2)
    if layout == "s":
        return rng.standard_normal(shape[:-1] + (c + 5,)).astype(dtype)[..., :c]
    if layout == "p" and len(shape) >= 4:
        base = rng.standard_normal((shape[1], shape[0]) + shape[2:]).astype(dtype)
        return np.swapaxes(base, 0, 1)
    return rng.standard_normal(shape).astype(dtype)


def _check(got, a, b):
    want = np.matmul(a.astype(np.float64), b.astype(np.float64))
    assert got.shape == want.shape and got.dtype == np.result_type(a, b)
    tol = 1e-4 if a.dtype == np.float32 else 1e-12
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max())


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("la", ["c", "t", "s"])
@pytest.mark.parametrize("lb", ["c", "t", "s"])
def test_matrix_layouts(backend, dtype, la, lb):
    rng = np.random.default_rng(0)
    a, b = _view(rng, (7, 5), la, dtype), _view(rng, (5, 9), lb, dtype)
    _check(blas.matmul(a, b), a, b)


@pytest.mark.parametrize("sa, sb", [
    ((3, 4, 6, 5), (3, 4, 5, 2)),        # a stack, as attention's heads
    ((3, 1, 6, 5), (4, 5, 2)),           # broadcast batch dims on both sides
    ((2, 6, 5), (5, 3)),                 # a matrix against a stack
    ((6, 5), (2, 3, 5, 4)),
])
@pytest.mark.parametrize("layout", ["c", "t", "p"])
def test_stacks_and_broadcasting(backend, sa, sb, layout):
    rng = np.random.default_rng(1)
    a, b = _view(rng, sa, layout, np.float32), _view(rng, sb, "t", np.float32)
    _check(blas.matmul(a, b), a, b)


def test_out(backend):
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((8, 3)), rng.standard_normal((3, 6))
    out = np.full((8, 6), np.nan)
    assert blas.matmul(a, b, out=out) is out
    _check(out, a, b)
    with pytest.raises(ValueError, match=r"out has shape \(8, 5\).*expected \(8, 6\)"):
        blas.matmul(a, b, out=np.empty((8, 5)))


@pytest.mark.parametrize("a, b", [
    (np.arange(12).reshape(3, 4), np.arange(8).reshape(4, 2)),           # integers
    (np.ones((3, 4), np.float16), np.ones((4, 2), np.float16)),          # half precision
    (np.ones((3, 4), np.float32), np.ones((4, 2), np.float64)),          # mixed dtypes
    (np.ones(4, np.float32), np.ones((4, 2), np.float32)),               # a vector
    (np.ones((1, 4), np.float32), np.ones((4, 3), np.float32)),          # one row
    (np.ones((0, 4), np.float32), np.ones((4, 3), np.float32)),          # empty
    (np.broadcast_to(np.ones((1, 4), np.float32), (3, 4)), np.ones((4, 2), np.float32)),
])
def test_fallback_equals_numpy(backend, a, b):
    got = blas.matmul(a, b)
    want = np.matmul(a, b)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.skipif(not MKL_INSTALLED, reason="the mkl wheel is not installed")
def test_size_rule(monkeypatch):
    """Small products stay with NumPy's BLAS, big ones and stacks go to MKL."""
    monkeypatch.setenv("PYFLOW_BLAS", "mkl")
    blas.reload()
    try:
        f32 = np.float32
        assert not blas.uses_mkl(np.ones((256, 256), f32), np.ones((256, 256), f32))
        assert blas.uses_mkl(np.ones((1024, 256), f32), np.ones((256, 512), f32))
        heads = np.ones((16, 4, 128, 64), f32)
        assert blas.uses_mkl(heads, np.swapaxes(heads, -1, -2))
        assert not blas.uses_mkl(heads[:1, :1, :8], np.swapaxes(heads[:1, :1, :8], -1, -2))
        assert not blas.uses_mkl(np.ones((1024, 256)), np.ones((256, 512), f32))  # mixed
    finally:
        monkeypatch.undo()
        blas.reload()


def test_bad_choice_and_missing_mkl(monkeypatch):
    monkeypatch.setenv("PYFLOW_BLAS", "fastest")
    blas.reload()
    with pytest.raises(ValueError, match="PYFLOW_BLAS='fastest': expected one of auto, mkl, numpy"):
        blas.backend()
    monkeypatch.setenv("PYFLOW_BLAS", "mkl")
    monkeypatch.setattr(blas, "_candidates", lambda: iter(()))
    blas.reload()
    with pytest.raises(RuntimeError, match="PYFLOW_BLAS=mkl but MKL's libmkl_rt was not found"):
        blas.backend()
    monkeypatch.setenv("PYFLOW_BLAS", "auto")
    blas.reload()
    assert blas.backend() == "numpy"          # auto without MKL: NumPy, quietly
    monkeypatch.undo()
    blas.reload()


def test_mkl_used_when_installed(monkeypatch):
    """``auto`` finds the installed wheel and routes to it when it measures faster
    (the measurement replaced by one where MKL wins every shape)."""
    wins = [{"case": str(f), "stack": s, "flops": f, "mkl_ms": 1.0, "numpy_ms": 2.0}
            for f in (1 << 26, 1 << 28) for s in (0, 8)]
    monkeypatch.setenv("PYFLOW_BLAS", "auto")
    monkeypatch.setattr(blas_tuning, "measure", lambda mkl_product, grid=None: wins)
    blas.reload()
    try:
        assert blas.backend() == ("mkl" if MKL_INSTALLED else "numpy")
    finally:
        monkeypatch.undo()
        blas.reload()


@pytest.mark.parametrize("sa,sb", [
    ((8, 4, 32, 16), (8, 4, 16, 32)),       # a tiny stack: one np.matmul
    ((16, 4, 64, 32), (16, 4, 32, 64)),     # big enough to be split over the workers
    ((3, 5, 7), (3, 7, 2)),
])
@pytest.mark.parametrize("into", [False, True])
def test_stacked_matmul_kernel_with_and_without_out(sa, sb, into):
    """The CPU matmul kernel (plain, split over worker threads, or into ``out=``, a
    compiled graph's buffer) gives NumPy's product of every stacked pair."""
    from pyflow.kernels.cpu import linalg
    rng = np.random.default_rng(0)
    a = rng.standard_normal(sa).astype(np.float32)
    b = rng.standard_normal(sb).astype(np.float32)
    want = np.matmul(a.astype(np.float64), b.astype(np.float64))
    out = np.full(want.shape, np.nan, np.float32) if into else None
    got = linalg.matmul(a, b, out=out)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    if into:
        assert np.shares_memory(got, out)
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)
