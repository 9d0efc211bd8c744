"""Checks every CUDA reduction kernel in numba's CUDA simulator (no GPU needed).

Run by ``test_cuda_reduce.py`` in its own process, because
``NUMBA_ENABLE_CUDASIM=1`` must be set before numba is first imported::

    NUMBA_ENABLE_CUDASIM=1 python tests/kernels/cudasim_reduce.py

Every kernel registered in ``kernels/cuda/reduce.py`` is compared with the CPU
kernel of the same name on tiny inputs: each dtype the op layer passes it,
contiguous / transposed / step-sliced / reversed (negative strides) /
expanded (stride 0) inputs, several dim sets, keepdim, ties and NaNs for the
max-like kernels, +-inf for logsumexp and empty reductions.  Each case runs
under two launch configurations: the shipped thresholds (a warp per row, no
split), and tiny thresholds that force block-per-row reductions (shared
memory between warps), split reductions (partial states + the combine
kernel) and the block-per-row scan with several chunks.  Grids are capped to
2 blocks (so grid-stride loops take several turns) of <= 64 threads: the
simulator runs one OS thread per CUDA thread.

Prints one line per failure and ``N checks, F failures``; exits 1 on failure.
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tests.kernels.check_target import select  # noqa: E402

TARGET = select()      # the simulator, or a real GPU for bench/gpu_check
# Simulated threads hand the GIL around at every shuffle/barrier; the default
# 5 ms switch interval makes that 10x slower than it needs to be.
sys.setswitchinterval(5e-4)

import numpy as np  # noqa: E402
from numba import config  # noqa: E402

import pyflow.kernels.cpu.reduce  # noqa: E402,F401  (registers the CPU references)
import pyflow.kernels.cuda.reduce as cr  # noqa: E402
from pyflow.kernels import registry  # noqa: E402

assert config.ENABLE_CUDASIM or TARGET == "gpu", "numba did not pick up NUMBA_ENABLE_CUDASIM=1"

TOL = {np.float32: (2e-5, 2e-6), np.float64: (1e-12, 1e-13), np.float16: (2e-3, 2e-3)}
SMALL = dict(ROWS_PER_BLOCK=2, MAX_BLOCKS=2, ROW_THREADS=64)
CONFIGS = {
    "shipped": {},
    # a block (2 warps) per row above 4 elements, split reductions for fewer than
    # 3 results, (32, NY > 1) column blocks, block-per-row scans of 2+ chunks
    "block rows, splits": dict(WARP_ROW_MAX=4, SPLIT_CHUNK=8, COL_SPLIT_CHUNK=8, TARGET_BLOCKS=3,
                               COL_PER_THREAD=4, ROW_SCAN_MIN=8),
}
# The second configuration only changes how reductions of more than this many
# elements launch, so it reruns just those cases, for one dtype per op (the
# device functions of every dtype already ran under the first).
STRESS_MIN_N = 9
LAYOUTS = ("contiguous", "transposed", "sliced", "reversed", "expanded")
rng = np.random.default_rng(0)


# ------------------------------------------------------------------ inputs
def values(shape, dtype, kind):
    """kind: 'real', 'ties' (few distinct values), 'nan' (ties and NaNs),
    'zeros' (many zeros, for all/any), 'positive' (for prod), 'inf' (+-inf)."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return np.asarray(rng.integers(0, 2, shape).astype(bool)) if kind != "ones" else \
            np.ones(shape, bool)
    if dtype.kind == "i":
        return np.asarray(rng.integers(0 if kind == "zeros" else -3, 3 if kind == "zeros" else 4,
                                       shape).astype(dtype))
    if kind == "ties":
        v = rng.integers(-2, 3, shape).astype(np.float64)
    elif kind == "zeros":
        v = rng.integers(0, 3, shape) * rng.uniform(-2, 2, shape)
    elif kind == "positive":
        v = rng.uniform(0.5, 1.5, shape)
    else:
        v = rng.uniform(-2.0, 2.0, shape)
    flat = v.reshape(-1)
    if kind == "nan" and flat.size >= 4:
        v = rng.integers(-2, 3, shape).astype(np.float64)
        flat = v.reshape(-1)
        flat[rng.choice(flat.size, size=max(2, flat.size // 5), replace=False)] = np.nan
    if kind == "inf" and flat.size >= 4:
        flat[0], flat[-1] = np.inf, -np.inf
        if v.ndim >= 2 and v.shape[-1] >= 1:
            v[..., -1, :] = -np.inf                   # a slice that is all -inf
    return np.asarray(v).astype(dtype)


def laid_out(shape, dtype, kind, layout):
    """An input of ``shape`` whose memory layout is ``layout``."""
    n = len(shape)
    if n == 0:                                      # 0-d: no layout to vary
        return values(shape, dtype, kind)
    if layout == "transposed" and n >= 2:
        return values(shape[::-1], dtype, kind).transpose()
    if layout == "sliced" and n >= 1:
        base = values(shape[:-1] + (2 * shape[-1] + 1,), dtype, kind)
        return base[..., 1::2]
    if layout == "reversed" and n >= 1:
        return values(shape, dtype, kind)[(slice(None, None, -1),) * n]
    if layout == "expanded" and n >= 2 and shape[1] > 1:
        return np.broadcast_to(values(shape[:1] + (1,) + shape[2:], dtype, kind), shape)
    return values(shape, dtype, kind)


# ------------------------------------------------------------------ comparison
def same(got, want):
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"got {got.shape} {got.dtype}, want {want.shape} {want.dtype}"
    if got.dtype.kind == "f":
        rtol, atol = TOL[got.dtype.type]
        ok = np.allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol,
                         atol=atol, equal_nan=True)
        ok = ok and np.array_equal(np.isinf(got) & (got > 0), np.isinf(want) & (want > 0))
    else:
        ok = np.array_equal(got, want)
    return None if ok else f"got {got.tolist()}\n    want {want.tolist()}"


def check(name, x, args, failures, label):
    try:
        got = registry.get(name, "cuda")(x, *args)
    except Exception as e:  # report every case, not just the first failure
        failures.append(f"{label}: raised {type(e).__name__}: {e}")
        return
    with np.errstate(all="ignore"):
        want = registry.get(name, "cpu")(x, *args)
    pairs = zip(got, want) if isinstance(want, tuple) else [(got, want)]
    for g, w in pairs:
        problem = same(g, w)
        if problem:
            failures.append(f"{label}: {problem}\n    input {np.asarray(x).tolist()}")
            return


# ------------------------------------------------------------------ cases
# (op, dtype, value kind, extra args after (x, dims, keepdim) or after x3)
DIM_OPS = [
    ("sum", np.float32, "real", (np.float32,)), ("sum", np.float64, "real", (np.float64,)),
    ("sum", np.int32, "real", (np.int64,)), ("sum", np.bool_, "real", (np.int64,)),
    ("sum", np.float32, "real", (np.float64,)), ("sum", np.int64, "zeros", (np.bool_,)),
    ("mean", np.float32, "real", ()), ("mean", np.float64, "real", ()),
    ("amax", np.float32, "nan", ()), ("amax", np.int64, "ties", ()),
    ("amax", np.bool_, "real", ()), ("amin", np.float64, "ties", ()),
    ("amin", np.int32, "ties", ()),
    ("var", np.float32, "real", (1,)), ("var", np.float64, "real", (0,)),
    ("all", np.float32, "zeros", ()), ("all", np.bool_, "ones", ()),
    ("any", np.int32, "zeros", ()), ("any", np.float64, "nan", ()),
    ("logsumexp", np.float32, "real", ()), ("logsumexp", np.float64, "inf", ()),
]
DIM_SHAPES = [  # (shape, dims); layouts rotate over the cases
    ((2, 3, 4), (0,)), ((2, 3, 4), (1,)), ((2, 3, 4), (2,)), ((2, 3, 4), (0, 2)),
    ((2, 3, 4), (0, 1, 2)), ((2, 3, 4), ()), ((3, 20), (1,)), ((20, 3), (0,)),
    ((), ()), ((0, 3), (0,)), ((3, 0), (0,)),
]
X3_OPS = [
    ("prod", np.float32, "positive", (np.float32,)), ("prod", np.float64, "real", (np.float64,)),
    ("prod", np.int32, "real", (np.int64,)), ("prod", np.bool_, "real", (np.int64,)),
    ("norm", np.float32, "real", (2.0,)), ("norm", np.float64, "real", (2.0,)),
    ("norm", np.float32, "real", (1.0,)), ("norm", np.float32, "zeros", (0.0,)),
    ("norm", np.float64, "real", (3.0,)), ("norm", np.float32, "positive", (0.5,)),
    ("norm", np.float64, "positive", (-1.0,)),
    ("max_dim", np.float32, "nan", ()), ("max_dim", np.int32, "ties", ()),
    ("max_dim", np.bool_, "real", ()), ("min_dim", np.float64, "nan", ()),
    ("min_dim", np.int64, "ties", ()),
    ("argmax", np.float64, "nan", ()), ("argmax", np.int64, "ties", ()),
    ("argmin", np.float32, "ties", ()), ("argmin", np.float32, "nan", ()),
    ("cumsum", np.float32, "real", (np.float32, False)),
    ("cumsum", np.float64, "real", (np.float64, True)),
    ("cumsum", np.int32, "real", (np.int64, True)), ("cumsum", np.bool_, "real", (np.int64, False)),
]
X3_SHAPES = [(2, 5, 3), (3, 12, 1), (1, 40, 1), (2, 1, 3), (4, 3, 1), (2, 0, 3), (1, 70, 1)]
NO_EMPTY = ("max_dim", "min_dim", "argmax", "argmin", "amax", "amin")


def primaries(ops):
    """For each entry of ``ops``: is it the op's first entry?"""
    seen, flags = set(), []
    for entry in ops:
        flags.append(entry[0] not in seen)
        seen.add(entry[0])
    return flags


def dim_cases():
    turn = 0
    for (name, dtype, kind, extra), primary in zip(DIM_OPS, primaries(DIM_OPS)):
        for shape, dims in DIM_SHAPES:
            if name in NO_EMPTY and any(shape[d] == 0 for d in dims):
                continue
            layout = LAYOUTS[turn % len(LAYOUTS)]
            turn += 1
            keepdim = turn % 2 == 0
            args = (dims, keepdim) + extra if name != "var" else (dims, extra[0], keepdim)
            x = laid_out(shape, dtype, kind, layout)
            n_red = int(np.prod([shape[d] for d in dims]))
            yield name, x, args, f"{name} {np.dtype(dtype)} {shape} dims={dims} " \
                                 f"keepdim={keepdim} {layout} {extra}", n_red, primary


def x3_cases():
    turn = 0
    for (name, dtype, kind, extra), primary in zip(X3_OPS, primaries(X3_OPS)):
        for shape in X3_SHAPES:
            if name in NO_EMPTY and shape[1] == 0:
                continue
            layout = LAYOUTS[turn % len(LAYOUTS)]
            turn += 1
            x = laid_out(shape, dtype, kind, layout)
            yield name, x, extra, f"{name} {np.dtype(dtype)} {shape} {layout} {extra}", \
                shape[1], primary


def check_errors(failures):
    """Bad input gives a clear exception, not a simulator crash."""
    get = lambda name: registry.get(name, "cuda")  # noqa: E731
    x = np.ones((2, 3, 4), np.float32)
    expectations = [
        (lambda: get("sum")(x.astype(np.complex64), (0,), False, np.complex64), TypeError,
         "no CUDA reduction kernel for dtype complex64"),
        (lambda: get("prod")(x[0], np.float32), ValueError, "expected a 3-D"),
        (lambda: get("sum")(x, (3,), False, np.float32), ValueError, "dims must be a tuple"),
        (lambda: get("max_dim")(np.ones((2, 0, 3), np.float32)), ValueError, "empty dim"),
        (lambda: get("norm")(x, np.inf), ValueError, "p must be finite"),
        (lambda: get("mean")(x.astype(np.int32), (0,), False), TypeError,
         "expected a float16/float32/float64"),
        (lambda: get("amax")([[1.0]], (0,), False), TypeError, "amax: expected a NumPy array"),
        (lambda: get("cumsum")(x, np.complex64), TypeError, "no CUDA kernel for out_dtype"),
    ]
    for call, exc, text in expectations:
        try:
            call()
        except exc as e:
            if text not in str(e):
                failures.append(f"error message {str(e)!r} lacks {text!r}")
        except Exception as e:
            failures.append(f"expected {exc.__name__} containing {text!r}, got "
                            f"{type(e).__name__}: {e}")
        else:
            failures.append(f"expected {exc.__name__} containing {text!r}")


def check_coverage(failures):
    """Every CPU reduction kernel has a CUDA twin, and this script checks it."""
    cpu = {n for (n, dev) in registry._KERNELS if dev == "cpu"
           and registry._KERNELS[(n, dev)].__module__.endswith("cpu.reduce")}
    cuda = {n for (n, dev) in registry._KERNELS if dev == "cuda"
            and registry._KERNELS[(n, dev)].__module__.endswith("cuda.reduce")}
    checked = {c[0] for c in DIM_OPS + X3_OPS}
    if cpu != cuda or cuda != checked:
        failures.append(f"kernel sets differ: cpu-only {sorted(cpu - cuda)}, cuda-only "
                        f"{sorted(cuda - cpu)}, unchecked {sorted(cuda - checked)}")


PATHS = {"row, warp per result", "row, block per result", "row, split", "column",
         "column, NY > 1", "column, split", "scan, block per row", "scan, thread per row"}


def record_paths():
    """Wrap the launch planners to note which kernel paths the cases reached."""
    seen = set()
    plan, scan_kernel = cr._plan, cr._scan_kernel

    def recording_plan(n_out, n_red, column):
        splits, chunk, blocks, threads = plan(n_out, n_red, column)
        if column:
            seen.add("column")
            seen.update(["column, NY > 1"] if threads[1] > 1 else [])
            seen.update(["column, split"] if splits > 1 else [])
        else:
            seen.add("row, block per result" if threads[0] > 32 else "row, warp per result")
            seen.update(["row, split"] if splits > 1 else [])
        return splits, chunk, blocks, threads

    def recording_scan_kernel(acc, out, shape):
        seen.add("scan, block per row" if shape == "row" else "scan, thread per row")
        return scan_kernel(acc, out, shape)

    cr._plan, cr._scan_kernel = recording_plan, recording_scan_kernel
    return seen


def main():
    start = time.perf_counter()
    failures, count = [], 0
    seen_paths = record_paths()
    for attr, value in SMALL.items():
        setattr(cr, attr, value)
    shipped = {attr: getattr(cr, attr) for changes in CONFIGS.values() for attr in changes}
    for config_name, changes in CONFIGS.items():
        for attr, value in {**shipped, **changes}.items():
            setattr(cr, attr, value)
        for name, x, args, label, n_red, primary in list(dim_cases()) + list(x3_cases()):
            if changes and (n_red < STRESS_MIN_N or not primary or
                           (n_red > 64 and name != "cumsum")):   # (1, 70, 1) is for scans
                continue
            t0 = time.perf_counter()
            check(name, x, args, failures, f"[{config_name}] {label}")
            count += 1
            if os.environ.get("CUDASIM_TIMES"):
                print(f"{time.perf_counter() - t0:.3f} [{config_name}] {label}")
    if seen_paths != PATHS:
        failures.append(f"kernel paths never taken: {sorted(PATHS - seen_paths)}")
    check_errors(failures)
    check_coverage(failures)
    for f in failures:
        print("FAIL", f)
    print(f"{count} checks, {len(failures)} failures, {time.perf_counter() - start:.1f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
