"""kernels/cpu/blas_tuning.py and blas.py's PYFLOW_BLAS=auto: the BLAS choice
is measured once, cached per machine key, read back without measuring, a
corrupt or foreign cache file is ignored with a warning and replaced, the
routing follows the cached thresholds, and ``PYFLOW_BLAS=mkl|numpy`` bypasses
all of it.  No timing is asserted: measurements are replaced by fixed rows,
except one real measurement on a two-shape grid (its rows, not its times)."""
import importlib.metadata
import json
import os
import re
import warnings

import numpy as np
import pytest

from pyflow import backends
from pyflow.kernels.cpu import blas, blas_tuning

try:
    importlib.metadata.version("mkl")
    MKL_INSTALLED = True
except importlib.metadata.PackageNotFoundError:
    MKL_INSTALLED = False
needs_mkl = pytest.mark.skipif(not MKL_INSTALLED, reason="the mkl wheel is not installed")
F32 = np.float32


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    """A cache of the test's own, and blas.py reads its setting afresh before
    and after each test."""
    monkeypatch.setenv(blas_tuning.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv("PYFLOW_BLAS", "auto")
    blas.reload()
    yield tmp_path / "cache"
    monkeypatch.undo()
    blas.reload()


def row(flops, mkl_ms, numpy_ms, stack=0):
    return {"case": f"{flops} flops", "stack": stack, "flops": flops,
            "mkl_ms": mkl_ms, "numpy_ms": numpy_ms}


ROWS = [row(1 << 20, 2.0, 1.0), row(1 << 24, 1.0, 1.0), row(1 << 26, 1.0, 2.0),
        row(1 << 28, 1.0, 2.0),                                   # singles: MKL from 2^26
        row(1 << 18, 1.0, 2.0, 8), row(1 << 22, 1.0, 2.0, 8)]     # stacks: from 2^18


def no_measuring(*args, **kwargs):
    raise AssertionError("measured although a valid choice was cached")


def fake_measure(rows=ROWS, calls=None):
    def measure(mkl_product, grid=None):
        if calls is not None:
            calls.append(1)
        return [dict(r) for r in rows]
    return measure


KEY = {"format": blas_tuning.FORMAT, "cpu": "Test CPU 9000", "cpus": 2, "mkl": "2026.2",
       "mkl_threads": 2, "numpy": np.__version__, "numpy_blas": "openblas 0.3.31",
       "numpy_blas_threads": 2}


# -- blas_tuning alone (no MKL needed) ------------------------------------------------------

def test_derive_thresholds():
    assert blas_tuning.derive(ROWS) == {"min_flops": 1 << 26, "min_stack_flops": 1 << 18}
    # A NumPy win above MKL's wins moves the threshold above it; a tie does not.
    rows = ROWS[:4] + [row(1 << 29, 2.0, 1.0), row(1 << 30, 1.0, 2.0), row(1 << 31, 1.0, 1.02),
                       row(1 << 32, 1.0, 2.0)]
    assert blas_tuning.derive(rows)["min_flops"] == 1 << 30
    # One MKL win alone above NumPy's last is not enough (MIN_WINS), nor none at all.
    assert blas_tuning.derive(ROWS[:3] + [row(1 << 28, 2.0, 1.0), row(1 << 29, 1.0, 2.0)]) == \
        {"min_flops": None, "min_stack_flops": None}
    assert blas_tuning.derive([]) == {"min_flops": None, "min_stack_flops": None}
    # Within MARGIN is a tie: no win for either.
    assert blas_tuning.derive([row(1 << 26, 1.0, 1.04), row(1 << 27, 1.0, 1.04)])["min_flops"] \
        is None


def test_cache_dir_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(blas_tuning.CACHE_ENV, str(tmp_path / "mine"))
    assert blas_tuning.cache_dir() == str(tmp_path / "mine")
    monkeypatch.delenv(blas_tuning.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert blas_tuning.cache_dir() == str(tmp_path / "xdg" / "pyflow")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert blas_tuning.cache_dir() == str(tmp_path / "home" / ".cache" / "pyflow")


def test_machine_key_names_cpu_versions_and_threads():
    key = blas_tuning.machine_key("MKL 2026.2", 2)
    assert key["cpu"] and key["cpu"] == blas_tuning.cpu_model()
    assert key["mkl"] == "MKL 2026.2" and key["mkl_threads"] == 2
    assert key["numpy"] == np.__version__ and key["numpy_blas"]
    assert key["cpus"] >= 1 and key["format"] == blas_tuning.FORMAT
    other = dict(key, cpu="Another CPU")
    assert blas_tuning.cache_path(other) != blas_tuning.cache_path(key)
    assert blas_tuning.cache_path(dict(key, mkl_threads=1)) != blas_tuning.cache_path(key)


def test_measured_once_then_read_from_the_cache():
    calls = []
    entry, source, path = blas_tuning.choose(KEY, lambda: fake_measure(calls=calls)(None))
    assert source == "measured" and calls == [1] and os.path.isfile(path)
    assert entry["choice"] == {"min_flops": 1 << 26, "min_stack_flops": 1 << 18}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again, source, path2 = blas_tuning.choose(KEY, no_measuring)
    assert source == "cache" and path2 == path and again == json.loads(json.dumps(entry))
    # --tune measures again even so.
    _, source, _ = blas_tuning.choose(KEY, lambda: fake_measure(calls=calls)(None), retune=True)
    assert source == "measured" and calls == [1, 1]


@pytest.mark.parametrize("content, why", [
    ("{not json", "could not be read"),
    ('["a list"]', "another CPU"),
    (json.dumps({"key": dict(KEY, cpu="Another CPU"), "choice": {"min_flops": 1,
                                                                 "min_stack_flops": 1}}),
     "another CPU"),
    (json.dumps({"key": dict(KEY, mkl="2024.0"), "choice": {"min_flops": 1,
                                                            "min_stack_flops": 1}}),
     "another CPU"),
    (json.dumps({"key": KEY, "choice": {"min_flops": "2^26", "min_stack_flops": None}}),
     "malformed"),
    (json.dumps({"key": KEY}), "malformed"),
    (json.dumps({"key": KEY, "choice": {"min_flops": 1, "min_stack_flops": None},
                 "rows": [{"case": "x"}]}), "rows are malformed"),
])
def test_corrupt_or_foreign_cache_file_is_ignored_with_a_warning_and_replaced(content, why):
    path = blas_tuning.cache_path(KEY)
    os.makedirs(os.path.dirname(path))
    with open(path, "w") as f:
        f.write(content)
    calls = []
    warning = f"ignoring the BLAS choice cached in {re.escape(path)}: .*{why}"
    with pytest.warns(RuntimeWarning, match=warning):
        entry, source, _ = blas_tuning.choose(KEY, lambda: fake_measure(calls=calls)(None))
    assert source == "measured" and calls == [1]
    with open(path) as f:
        assert json.load(f)["key"] == KEY                  # replaced by a valid entry
    assert blas_tuning.choose(KEY, no_measuring)[1] == "cache"


def test_an_entry_for_another_cpu_or_version_is_not_used():
    for other in (dict(KEY, cpu="Another CPU"), dict(KEY, numpy_blas="openblas 0.3.20"),
                  dict(KEY, mkl_threads=1)):
        blas_tuning.choose(other, lambda: fake_measure()(None))
    calls = []
    _, source, _ = blas_tuning.choose(KEY, lambda: fake_measure(calls=calls)(None))
    assert source == "measured" and calls == [1]


def test_unwritable_cache_directory_warns_and_still_chooses(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(blas_tuning.CACHE_ENV, str(blocker / "cache"))
    with pytest.warns(RuntimeWarning, match="could not cache the BLAS choice"):
        entry, source, _ = blas_tuning.choose(KEY, lambda: fake_measure()(None))
    assert source == "measured" and entry["choice"]["min_flops"] == 1 << 26


def test_measure_times_each_grid_case(monkeypatch):
    """A real measurement on two small cases (a product standing in for MKL's):
    one row each, flops of the whole stack, every call given the case's operands."""
    monkeypatch.setattr(blas_tuning, "WARM_SECONDS", 0.0)
    monkeypatch.setattr(blas_tuning, "TARGET_SECONDS", 0.0)
    seen = []

    def product(a, b, out):
        seen.append((a.shape, b.shape, out.shape))
        np.matmul(a, b, out=out)
    grid = (("single", 0, 8, 5, 6, "tn", "matmul"), ("heads", 4, 8, 5, 6, "nt", "split"),
            ("1x1", "bcast", 8, 5, 6, "nn", "matmul"))
    rows = blas_tuning.measure(product, grid)
    assert [r["case"] for r in rows] == ["single", "heads", "1x1"]
    assert [r["stack"] for r in rows] == [0, 4, 8]
    assert [r["flops"] for r in rows] == [2 * 8 * 5 * 6, 4 * 2 * 8 * 5 * 6, 8 * 2 * 8 * 5 * 6]
    assert all(r["mkl_ms"] > 0 and r["numpy_ms"] > 0 for r in rows)
    assert set(seen) == {((8, 5), (5, 6), (8, 6)), ((4, 8, 5), (4, 5, 6), (4, 8, 6)),
                         ((8, 5), (8, 5, 6), (8, 8, 6))}
    assert all(r["samples"] == blas_tuning.PASSES * blas_tuning.MIN_REPEATS for r in rows)


def test_grid_cases_are_well_formed():
    rng = np.random.default_rng(0)
    for name, stack, m, k, n, layout, numpy_way in blas_tuning.GRID:
        a, b = blas_tuning._operands(rng, 2 if isinstance(stack, int) and stack else stack,
                                     m, k, n, layout)
        assert a.shape[-2:] == (m, k) and b.shape[-2:] == (k, n), name
        assert numpy_way in ("matmul", "split") and layout in ("nn", "nt", "tn"), name


# -- blas.py under PYFLOW_BLAS=auto (MKL needed) -------------------------------------------

def write_cache(choice, rows=ROWS):
    """A valid cache entry for this machine's key, as a measurement writes it."""
    key = blas.machine_key(blas._find_mkl())
    path = blas_tuning.cache_path(key)
    blas_tuning.store(path, {"key": key, "choice": choice, "rows": rows, "seconds": 1.0,
                             "measured_on": "2026-12-03 12:00:00"})
    return path


@needs_mkl
def test_auto_routes_by_the_cached_thresholds_without_measuring(monkeypatch):
    path = write_cache({"min_flops": 1 << 20, "min_stack_flops": 1 << 22})
    monkeypatch.setattr(blas_tuning, "measure", no_measuring)
    ones = np.ones
    assert not blas.chosen()
    # 2 * 64 * 64 * 128 = 2^20 flops: MKL; one column fewer: NumPy.
    assert blas.uses_mkl(ones((64, 64), F32), ones((64, 128), F32))
    assert not blas.uses_mkl(ones((64, 64), F32), ones((64, 127), F32))
    # A stack of 4 x 2^20 = 2^22 flops: MKL; of 3: NumPy.
    assert blas.uses_mkl(ones((4, 64, 64), F32), ones((4, 64, 128), F32))
    assert not blas.uses_mkl(ones((3, 64, 64), F32), ones((3, 64, 128), F32))
    assert blas.mkl_min_flops() == 1 << 20 and blas.backend() == "mkl"
    report = backends.cpu.blas
    assert report["source"] == "cache" and report["cache"] == path
    assert report["setting"] == "PYFLOW_BLAS=auto"
    assert report["mkl_min_flops"] == "from 1048576 flops (2^20.0)"
    assert report["mkl_min_stack_flops"] == "from 4194304 flops (2^22.0)"
    assert report["library"] == "mkl above the thresholds, numpy below"
    assert "read from the cache" in report["why"] and report["measured"][0].startswith("1048576")
    assert "blas={'library'" in repr(backends.cpu)
    # The product itself: MKL's answer, within float32 rounding of float64.
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((64, 64), F32), rng.standard_normal((64, 128), F32)
    np.testing.assert_allclose(blas.matmul(a, b), a.astype(float) @ b, rtol=1e-4, atol=1e-4)


@needs_mkl
def test_auto_with_mkl_never_faster_uses_numpy_only(monkeypatch):
    write_cache({"min_flops": None, "min_stack_flops": None})
    monkeypatch.setattr(blas_tuning, "measure", no_measuring)
    big = np.ones((1024, 1024), F32)
    assert blas.backend() == "numpy" and not blas.uses_mkl(big, big)
    assert blas.mkl_min_flops() == float("inf")
    report = backends.cpu.blas
    assert report["library"] == "numpy" and report["mkl_min_flops"] == "never"
    assert report["source"] == "cache"


@needs_mkl
def test_first_eligible_product_measures_once_and_caches(monkeypatch, cache_dir):
    calls = []
    monkeypatch.setattr(blas_tuning, "measure", fake_measure(calls=calls))
    # A repr does not measure.
    assert "blas='(chosen at the first matrix product)'" in repr(backends.cpu)
    blas.matmul(np.ones((3, 4), np.int64), np.ones((4, 2), np.int64))  # MKL could not take it
    assert calls == [] and not blas.chosen()
    blas.matmul(np.ones((3, 4), F32), np.ones((4, 2), F32))
    assert calls == [1] and blas.chosen()
    assert backends.cpu.blas["source"] == "measured"
    blas.matmul(np.ones((3, 4), F32), np.ones((4, 2), F32))
    assert calls == [1]
    assert len(list(cache_dir.glob("blas-*.json"))) == 1
    blas.reload()                                   # a new process: reads the file
    assert blas.backend() == "mkl" and calls == [1]
    assert backends.cpu.blas["source"] == "cache"
    assert blas.uses_mkl(np.ones((256, 256), F32), np.ones((256, 512), F32))    # 2^26


@needs_mkl
def test_corrupt_cache_file_is_measured_again_through_blas(monkeypatch):
    path = write_cache({"min_flops": 1 << 20, "min_stack_flops": 1 << 22})
    with open(path, "w") as f:
        f.write("\0garbage")
    calls = []
    monkeypatch.setattr(blas_tuning, "measure", fake_measure(calls=calls))
    warning = f"ignoring the BLAS choice cached in {re.escape(path)}"
    with pytest.warns(RuntimeWarning, match=warning):
        assert blas.backend() == "mkl"
    assert calls == [1] and backends.cpu.blas["source"] == "measured"
    assert blas.mkl_min_flops() == 1 << 26          # the new measurement's, not the file's


@pytest.mark.parametrize("setting", ["numpy", pytest.param("mkl", marks=needs_mkl)])
def test_forced_setting_bypasses_tuning(monkeypatch, cache_dir, setting):
    monkeypatch.setenv("PYFLOW_BLAS", setting)
    monkeypatch.setattr(blas_tuning, "measure", no_measuring)
    monkeypatch.setattr(blas_tuning, "choose", no_measuring)
    blas.reload()
    assert blas.backend() == setting
    big = np.ones((1024, 512), F32)
    assert blas.uses_mkl(big, big.T) == (setting == "mkl")
    report = backends.cpu.blas
    assert report["source"] == "forced" and report["setting"] == f"PYFLOW_BLAS={setting}"
    assert "forced by PYFLOW_BLAS" in report["why"] and "cache" not in report
    if setting == "mkl":                            # the built-in thresholds
        assert blas.mkl_min_flops() == blas.MKL_MIN_FLOPS
    assert not cache_dir.exists()


@needs_mkl
def test_mkl_product_used_by_the_measurement_is_exact_enough():
    """What measure() times as MKL computes the product (one matrix, a stack,
    a broadcast weight)."""
    product = blas._mkl_product(blas._find_mkl())
    rng = np.random.default_rng(0)
    for stack in (0, 4, "bcast"):
        a, b = blas_tuning._operands(rng, stack, 9, 7, 5, "nt")
        out = np.empty(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (9, 5), F32)
        product(a, b, out)
        np.testing.assert_allclose(out, np.matmul(a.astype(float), b), rtol=1e-4, atol=1e-4)


@needs_mkl
def test_tune_command_measures_again_and_prints_the_choice(monkeypatch, capsys):
    write_cache({"min_flops": 1 << 20, "min_stack_flops": 1 << 22})
    calls = []
    monkeypatch.setattr(blas_tuning, "measure", fake_measure(calls=calls))
    assert blas.main([]) == 0 and calls == []            # no --tune: the cached choice
    assert "source: cache" in capsys.readouterr().out
    assert blas.main(["--tune"]) == 0 and calls == [1]
    out = capsys.readouterr().out
    assert "source: measured" in out and "mkl_min_flops: from 67108864 flops (2^26.0)" in out
    assert blas.mkl_min_flops() == 1 << 26               # the process routes by it now
