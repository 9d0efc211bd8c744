"""Which BLAS runs a CPU matrix product: measured once per machine, kept on disk.

``kernels/cpu/blas.py`` sends a float32/float64 product to Intel MKL or to
NumPy's BLAS (OpenBLAS in NumPy's pip wheel) by its flops: a single product
takes MKL from ``min_flops`` up, a stack of products (one batched MKL call
against NumPy's loop) from ``min_stack_flops`` up, and ``None`` means never.
Which library wins where depends on the CPU: on a 2-core Intel Xeon MKL won
single products from about 2^26 flops up and stacks from 2^24; on a 2-core
AMD EPYC, timed as a step runs them (see below), MKL won single products
from 2^29.6 flops and stacks from 2^27 (timed alone, OpenBLAS had tied or won
every single product).  So the two thresholds are measured here, not fixed.

The measurement (``measure``) times both libraries on a grid of the float32
GEMMs training runs (``GRID``: GPT-tiny/mini/GPT-2 linears and attention's
per-head products, ResNet-50's im2col and 1x1 GEMMs, the MNIST CNN's), at the
thread counts the process has, in about 2 s (2 cores, AMD EPYC).  Each
library's side is timed as pyflow runs it: MKL one ``cblas_sgemm`` or one
``cblas_sgemm_batch``; NumPy ``np.matmul``, and for the attention stacks that
``kernels/cpu/linalg.py`` splits over worker threads (each thread
single-threaded OpenBLAS), that split.  ``derive`` turns the times into the
thresholds: a library wins a shape when it is at least ``MARGIN`` faster,
and a threshold is the smallest flops of a shape MKL wins above every shape
NumPy wins (two such wins at least); below it, and below the grid, NumPy
runs, and above the grid the largest shape's verdict holds.  The thresholds,
measured in float32, serve float64 products too (not measured apart).

The result is cached in ``$PYFLOW_CACHE_DIR`` (default
``$XDG_CACHE_HOME/pyflow``, else ``~/.cache/pyflow``), one JSON file per
``machine_key``: the CPU model (``/proc/cpuinfo``'s model name, vendor,
family and model numbers; ``platform`` elsewhere), the MKL, NumPy and NumPy
BLAS versions, and the thread counts.  A file that cannot be read, or that was
written for another key or format, is ignored with a warning naming it, and
measured again.  A lock file makes processes on one machine that start at once
(data-parallel ranks) take turns: the first measures, the others read its
result, so they route alike.  ``python -m pyflow.kernels.cpu.blas --tune``
measures again and rewrites the file.

Each timed call follows a parallel numba kernel, as GEMMs do in a training
step (layer norm, GELU, softmax between the products): numba's OpenMP
workers then spin for a while, and a threaded OpenBLAS GEMM right after it
ran up to 2x slower (1024x768 @ 768x768 on 2 AMD EPYC cores: 13.3 ms against
6.5 ms alone), while MKL, which shares that OpenMP pool, ran as fast as
alone.  Timed alone, OpenBLAS tied or won every single product and ``auto``
picked it; whole GPT-2 steps (``bench/dlperf.py``) were 0.91x PyTorch with it
and 1.01x with MKL (2026-12-03).

The measurement uses its own arrays and random generator: no tensor, seed or
setting of the caller's changes, only which BLAS runs later products.
"""
import contextlib
import hashlib
import json
import math
import os
import platform
import sys
import tempfile
import time
import warnings

import numpy as np
from numba import njit, prange

FORMAT = 2                      # bumped when GRID, MARGIN or the file's fields change
CACHE_ENV = "PYFLOW_CACHE_DIR"
MARGIN = 0.05                   # a library must be 5% faster to win a shape
MIN_WINS = 2                    # MKL's wins above NumPy's last one for a threshold
TARGET_SECONDS = 0.04           # timing per grid shape, both libraries together
PASSES = 3                      # walks over the grid (see measure)
WARM_SECONDS = 0.15             # both libraries busy before the first timing (see measure)
MIN_REPEATS, MAX_REPEATS = 2, 12    # calls per library, shape and pass

# (name, stack, m, k, n, layout, how NumPy's side runs).  layout: "nn" a @ b,
# "nt" a @ w.T (forward of a linear, attention scores), "tn" g.T @ x (a weight
# gradient); stack 0 is a single product, "bcast" a 2-D weight against a stack
# of 8 (a 1x1 convolution, per image of a batch of 8).  NumPy's side: "matmul" or "split" over the
# worker threads (linalg.py's _batched_small, which runs attention stacks).
GRID = (
    ("MNIST CNN conv1 (32x9 @ 9x12544)", 0, 32, 9, 12544, "nn", "matmul"),
    ("GPT-tiny qkv, 512 tokens", 0, 512, 64, 192, "nt", "matmul"),
    ("GPT-tiny MLP, 2048 tokens", 0, 2048, 64, 256, "nt", "matmul"),
    ("MNIST CNN conv2 (64x288 @ 288x3136)", 0, 64, 288, 3136, "nn", "matmul"),
    ("ResNet-50 layer1 3x3 (64x576 @ 576x2048)", 0, 64, 576, 2048, "nn", "matmul"),
    ("ResNet-50 layer4 3x3 weight grad (512x32 @ 32x4608)", 0, 512, 32, 4608, "nt", "matmul"),
    ("GPT-mini qkv, 2048 tokens", 0, 2048, 256, 768, "nt", "matmul"),
    ("GPT-2 proj input grad, 1024 tokens", 0, 1024, 768, 768, "nn", "matmul"),
    ("GPT-2 MLP fc, 1024 tokens", 0, 1024, 768, 3072, "nt", "matmul"),
    ("GPT-64 attention (32 x 32x16 @ 16x32)", 32, 32, 16, 32, "nt", "matmul"),
    ("GPT-tiny attention (64 x 64x32 @ 32x64)", 64, 64, 32, 64, "nt", "split"),
    ("ResNet-50 1x1 conv (256x64 @ 8 x 64x256)", "bcast", 256, 64, 256, "nn", "matmul"),
    ("ResNet-50 1x1 weight grad (8 x 256x256 @ 256x64)", 8, 256, 256, 64, "nt", "matmul"),
    ("GPT-mini attention (64 x 128x64 @ 64x128)", 64, 128, 64, 128, "nt", "split"),
    ("GPT-2 attention (96 x 128x128 @ 128x64)", 96, 128, 128, 64, "nn", "split"),
)


# -- the key and the cache file ------------------------------------------------------------

def cpu_model():
    """The CPU's model name, with vendor, family and model numbers where Linux
    gives them (a VM may show only "AMD EPYC" for several generations)."""
    fields = {}
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if not line.strip():
                    break                       # the first processor's block is enough
                name, _, value = line.partition(":")
                fields[name.strip()] = value.strip()
    except OSError:
        pass
    name = fields.get("model name") or platform.processor() or platform.machine() or "unknown"
    numbers = [f"{k} {fields[k]}" for k in ("vendor_id", "cpu family", "model") if k in fields]
    return f"{name} ({', '.join(numbers)})" if numbers else name


def numpy_blas():
    """(description, threads) of NumPy's BLAS, as threadpoolctl finds it loaded."""
    from threadpoolctl import threadpool_info
    for info in threadpool_info():
        if info.get("user_api") == "blas" and info.get("internal_api") != "mkl":
            desc = " ".join(str(info.get(k)) for k in ("internal_api", "version", "architecture")
                            if info.get(k))
            return desc, info.get("num_threads")
    return "unknown", None


def cpus():
    """CPUs this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def machine_key(mkl_version, mkl_threads):
    """What a measurement depends on: the file it is cached in is named by it."""
    blas_desc, blas_threads = numpy_blas()
    return {"format": FORMAT, "cpu": cpu_model(), "cpus": cpus(),
            "mkl": mkl_version, "mkl_threads": mkl_threads,
            "numpy": np.__version__, "numpy_blas": blas_desc, "numpy_blas_threads": blas_threads}


def cache_dir():
    """``$PYFLOW_CACHE_DIR``, else ``$XDG_CACHE_HOME/pyflow``, else ``~/.cache/pyflow``."""
    path = os.environ.get(CACHE_ENV, "").strip()
    if path:
        return os.path.abspath(os.path.expanduser(path))
    base = os.environ.get("XDG_CACHE_HOME", "").strip() or os.path.join("~", ".cache")
    return os.path.abspath(os.path.join(os.path.expanduser(base), "pyflow"))


def cache_path(key):
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return os.path.join(cache_dir(), f"blas-{digest}.json")


def load(path, key):
    """The cached entry for ``key`` at ``path``, or None (missing: quietly;
    unreadable or for another key: with a warning naming the file)."""
    try:
        with open(path) as f:
            entry = json.load(f)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, ValueError) as e:
        return _ignore(path, f"it could not be read ({e})")
    if not isinstance(entry, dict) or entry.get("key") != key:
        return _ignore(path, "it was written for another CPU, thread count or library version")
    choice = entry.get("choice")
    if not isinstance(choice, dict) or not all(_valid_threshold(choice.get(k, "missing"))
                                               for k in ("min_flops", "min_stack_flops")):
        return _ignore(path, "its choice is malformed")
    try:
        summary(entry.get("rows", []))          # what the report prints must read back
    except (TypeError, KeyError, ValueError, AttributeError) as e:
        return _ignore(path, f"its measured rows are malformed ({e!r})")
    return entry


def _valid_threshold(value):
    return value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0)


def _ignore(path, why):
    warnings.warn(f"pyflow: ignoring the BLAS choice cached in {path}: {why}; measuring again",
                  RuntimeWarning, stacklevel=3)
    return None


def store(path, entry):
    """Write ``entry`` atomically (a reader sees the old file or the new one);
    a directory that cannot be written costs a warning, not the run."""
    tmp = None
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".blas-", suffix=".tmp", dir=os.path.dirname(path))
        with os.fdopen(fd, "w") as f:
            json.dump(entry, f, indent=1)
        os.replace(tmp, path)
        return True
    except OSError as e:
        if tmp is not None and os.path.exists(tmp):
            os.remove(tmp)
        warnings.warn(f"pyflow: could not cache the BLAS choice in {path} ({e}); "
                      f"each process will measure again", RuntimeWarning, stacklevel=2)
        return False


@contextlib.contextmanager
def _locked(directory):
    """Hold ``directory``/blas.lock (one measurement at a time on a machine);
    no lock where there is no fcntl or the directory cannot be made."""
    try:
        import fcntl
        os.makedirs(directory, exist_ok=True)
        f = open(os.path.join(directory, "blas.lock"), "a")
    except (ImportError, OSError):
        yield
        return
    with f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def choose(key, run_measurement, retune=False):
    """(entry, source, path): the cached entry for ``key`` (source "cache"), or a
    fresh one from ``run_measurement()`` -> rows, cached (source "measured")."""
    path = cache_path(key)
    with _locked(os.path.dirname(path)):
        entry = None if retune else load(path, key)
        if entry is not None:
            return entry, "cache", path
        t0 = time.perf_counter()
        rows = run_measurement()
        entry = {"key": key, "choice": derive(rows), "rows": rows,
                 "seconds": round(time.perf_counter() - t0, 3),
                 "measured_on": time.strftime("%Y-%m-%d %H:%M:%S")}
        store(path, entry)
    return entry, "measured", path


# -- the measurement -----------------------------------------------------------------------

def _operands(rng, stack, m, k, n, layout):
    """float32 (a, b) of the case, stored as training passes them."""
    def mat(*shape):
        return rng.standard_normal(shape, dtype=np.float32)
    lead = () if stack in (0, "bcast") else (stack,)
    a = np.swapaxes(mat(*lead, k, m), -1, -2) if layout == "tn" else mat(*lead, m, k)
    lead_b = (8,) if stack == "bcast" else lead
    b = np.swapaxes(mat(*lead_b, n, k), -1, -2) if layout == "nt" else mat(*lead_b, k, n)
    return a, b


def _split(pool, workers):
    """NumPy's stacked product as linalg.py's _batched_small runs it: the stack cut
    into ``workers`` parts, each a single-threaded BLAS np.matmul in a thread."""
    from threadpoolctl import ThreadpoolController
    controller = ThreadpoolController()

    def run(a, b, out):
        bounds = np.linspace(0, a.shape[0], workers + 1).astype(int)
        with controller.limit(limits=1, user_api="blas"):
            futures = [pool.submit(np.matmul, a[lo:hi], b[lo:hi], out=out[lo:hi])
                       for lo, hi in zip(bounds[1:-1], bounds[2:])]
            np.matmul(a[:bounds[1]], b[:bounds[1]], out=out[:bounds[1]])
            for f in futures:
                f.result()
    return run


@njit(parallel=True, cache=True)
def _pool_work(x):
    for i in prange(x.size):
        x[i] = x[i] * np.float32(0.5) + np.float32(0.5)


_POOL_BUFFER = np.ones(1 << 19, np.float32)     # above the twins' PARALLEL_MIN: threaded


def _as_in_a_step():
    """Run a parallel numba kernel, leaving numba's OpenMP workers as a step
    leaves them before its next GEMM (see the module's docstring)."""
    _pool_work(_POOL_BUFFER)


def _time_blocks(fns, args, samples):
    """Add timings of each of two products to ``samples`` (two lists; empty on
    the first pass, which warms up first): a block of calls of one, then of the
    other, as many as fit this pass's share of ``TARGET_SECONDS``, each right
    after a parallel numba kernel (``_as_in_a_step``)."""
    if not samples[0]:
        for fn in fns:                          # first-call costs, caches
            fn(*args)
    for fn, times in zip(fns, samples):
        repeats = None
        while repeats is None or len(times) < repeats:
            _as_in_a_step()
            t0 = time.perf_counter()
            fn(*args)
            times.append(time.perf_counter() - t0)
            if repeats is None:
                share = TARGET_SECONDS / (2 * PASSES)
                repeats = len(times) - 1 + int(min(MAX_REPEATS, max(
                    MIN_REPEATS, share // max(times[-1], 1e-9))))


def measure(mkl_product, grid=None):
    """Time ``mkl_product(a, b, out)`` against NumPy's BLAS on each ``grid`` case;
    returns rows {case, stack, flops (of the whole stack), mkl_ms, numpy_ms}.

    Each library runs a block of calls, not calls alternating with the other's:
    MKL's OpenMP threads spin for a while after a call, and an OpenBLAS call
    right after it ran up to 2x slower (GPT-2's 1024x768 @ 768x768, 2 cores:
    16 ms against 8 ms after OpenBLAS), which would credit MKL with its own
    cost.  But every call follows a parallel numba kernel, as in a step (see
    the module's docstring), so each library is timed after numba's pool
    has run, not after the other library.  Each time is the median of its
    samples: the best of them (this module's choice until 2026-12-03) kept
    the calls that happened to start after numba's workers had gone to
    sleep, and so did not see the slowdown a step sees.  On a shared machine
    another process taking a core holds a multi-threaded GEMM up for whole
    scheduler slices (8-16 ms on a 0.2 ms product, seen on 2 cores), hitting
    either library at random: the grid is walked ``PASSES`` times, so that
    such a burst spoils one pass of a shape, not the median of all its
    samples.  ``_warm_up`` runs first."""
    from concurrent.futures import ThreadPoolExecutor
    grid = GRID if grid is None else grid
    rng = np.random.default_rng(0)               # not NumPy's global generator
    workers = cpus()
    cases = []
    for name, stack, m, k, n, layout, numpy_way in grid:
        a, b = _operands(rng, stack, m, k, n, layout)
        out = np.empty(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (m, n), np.float32)
        cases.append((name, numpy_way, a, b, out, ([], [])))
    plain = (lambda x, y, o: np.matmul(x, y, out=o))
    with ThreadPoolExecutor(max(1, workers - 1), thread_name_prefix="pyflow-blas-tune") as pool:
        split = _split(pool, workers)
        _warm_up((mkl_product, plain), cases[len(cases) // 2][2:5])
        for _ in range(PASSES):
            for name, numpy_way, a, b, out, samples in cases:
                numpy_side = split if numpy_way == "split" and workers > 1 else plain
                _time_blocks((mkl_product, numpy_side), (a, b, out), samples)
    rows = []
    for name, numpy_way, a, b, out, (mkl_s, numpy_s) in cases:
        count = int(np.prod(out.shape[:-2]))
        m, n, k = out.shape[-2], out.shape[-1], a.shape[-1]
        rows.append({"case": name, "stack": count if out.ndim > 2 else 0,
                     "flops": 2 * m * k * n * count, "samples": len(mkl_s),
                     "mkl_ms": round(float(np.median(mkl_s)) * 1e3, 4),
                     "numpy_ms": round(float(np.median(numpy_s)) * 1e3, 4)})
    return rows


def _warm_up(fns, args):
    """Run both libraries for ``WARM_SECONDS``: right after start-up every
    multi-threaded GEMM took whole scheduler slices (12-16 ms for 0.2 ms of
    work, both libraries, 2 cores of a VM) for the first ~0.3 s of work."""
    end = time.perf_counter() + WARM_SECONDS
    while time.perf_counter() < end:
        for fn in fns:
            fn(*args)


def derive(rows):
    """Thresholds from measured rows, for single products and for stacks apart:
    the smallest flops of a grid shape MKL wins above every shape NumPy wins
    (a win: faster by ``MARGIN``; a tie goes with its neighbours); None when
    MKL wins fewer than ``MIN_WINS`` shapes above NumPy's last win (one win
    alone, on a tie of the two, was seen to come and go between runs)."""
    choice = {}
    for field, stacked in (("min_flops", False), ("min_stack_flops", True)):
        mine = [r for r in rows if bool(r["stack"]) == stacked]
        numpy_won = max((r["flops"] for r in mine if _winner(r) == "NumPy"), default=-1)
        won = [r["flops"] for r in mine if _winner(r) == "MKL" and r["flops"] > numpy_won]
        choice[field] = int(min(won)) if len(won) >= MIN_WINS else None
    return choice


def _winner(row):
    if row["mkl_ms"] < (1.0 - MARGIN) * row["numpy_ms"]:
        return "MKL"
    if row["numpy_ms"] < (1.0 - MARGIN) * row["mkl_ms"]:
        return "NumPy"
    return "tie"


def summary(rows):
    """One line per grid case: milliseconds of each library and the winner."""
    lines = []
    for r in rows:
        who = _winner(r)
        lines.append(f"{r['case']}: 2^{math.log2(r['flops']):.1f} flops, MKL {r['mkl_ms']:.3f} ms, "
                     f"NumPy {r['numpy_ms']:.3f} ms -> {who}")
    return lines


def describe(threshold):
    if threshold is None:
        return "never"
    return f"from {threshold} flops (2^{math.log2(max(threshold, 1)):.1f})"


def main(argv, report, retune):
    """``python -m pyflow.kernels.cpu.blas [--tune]``: print the choice (measuring
    when nothing valid is cached); ``--tune`` measures again and rewrites the cache."""
    import argparse
    ap = argparse.ArgumentParser(prog="python -m pyflow.kernels.cpu.blas",
                                 description="Which BLAS pyflow's CPU matrix products use, "
                                             "measured on this machine and cached.")
    ap.add_argument("--tune", action="store_true",
                    help="measure MKL and NumPy's BLAS again and rewrite the cache")
    args = ap.parse_args(argv)
    if args.tune:
        retune()
    info = report()
    for name, value in info.items():
        if isinstance(value, list):
            print(f"{name}:")
            for line in value:
                print(f"  {line}")
        else:
            print(f"{name}: {value}")
    sys.stdout.flush()
    return 0
