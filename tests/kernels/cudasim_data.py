"""Checks the CUDA data-movement kernels (copy, index, join, embedding, dropout,
cast, optim) against their CPU kernels in numba's CUDA simulator.

Run by ``test_cuda_data.py`` in its own process (``NUMBA_ENABLE_CUDASIM=1``
must be set before numba is imported)::

    NUMBA_ENABLE_CUDASIM=1 python tests/kernels/cudasim_data.py

Tiny shapes (the simulator runs one OS thread per CUDA thread), with
contiguous, transposed, step-sliced, reversed and expanded inputs where the
CPU kernel accepts them, and the bad-index errors.  Prints one line per
failure, then ``N checks, F failures``; exits 1 on any failure.
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tests.kernels.check_target import select  # noqa: E402

TARGET = select()      # the simulator, or a real GPU for bench/gpu_check

import numpy as np  # noqa: E402
from numba import config  # noqa: E402

import pyflow.dtypes as dt  # noqa: E402
from pyflow.kernels import registry  # noqa: E402
from pyflow.kernels.cuda import copy as cucopy  # noqa: E402
from pyflow.kernels.cuda import dropout as cudrop  # noqa: E402
from pyflow.kernels.cuda import index as cuindex  # noqa: E402

assert config.ENABLE_CUDASIM or TARGET == "gpu", "numba did not pick up NUMBA_ENABLE_CUDASIM=1"

rng = np.random.default_rng(0)
checks = 0
failures = []


def cpu(name):
    return registry.get(name, "cpu")


def gpu(name):
    return registry.get(name, "cuda")


def check(label, fn):
    """Run ``fn`` (which returns (got, want) pairs or raises AssertionError)."""
    global checks
    checks += 1
    try:
        for got, want, *tol in fn():
            got, want = np.asarray(got), np.asarray(want)
            if got.shape != want.shape:
                raise AssertionError(f"shape {got.shape} != {want.shape}")
            if got.dtype != want.dtype:
                raise AssertionError(f"dtype {got.dtype} != {want.dtype}")
            if tol:
                np.testing.assert_allclose(got, want, rtol=tol[0], atol=tol[0])
            elif not np.array_equal(got, want, equal_nan=got.dtype.kind == "f"):
                raise AssertionError(f"values differ:\n{got}\n{want}")
    except Exception as e:  # report every check, not just the first failure
        failures.append(f"{label}: {type(e).__name__}: {e}")


def check_raises(label, exc, match, fn):
    global checks
    checks += 1
    try:
        fn()
    except exc as e:
        if match not in str(e):
            failures.append(f"{label}: message {str(e)!r} lacks {match!r}")
    except Exception as e:
        failures.append(f"{label}: raised {type(e).__name__}: {e}, expected {exc.__name__}")
    else:
        failures.append(f"{label}: did not raise {exc.__name__}")


def layouts(shape, dtype=np.float32, values=None):
    """(name, array) for the same values laid out contiguous / transposed /
    sliced / reversed (and expanded when a dim is 1)."""
    make = values or (lambda s: rng.uniform(-2, 2, s).astype(dtype))
    base = make(shape)
    out = [("contiguous", base)]
    if len(shape) >= 2:
        t = np.ascontiguousarray(np.swapaxes(base, -1, -2))
        out.append(("transposed", np.swapaxes(t, -1, -2)))
    if len(shape) >= 1:
        wide = np.zeros(shape[:-1] + (2 * shape[-1] + 1,), base.dtype)
        wide[..., 1::2] = base
        out.append(("sliced", wide[..., 1::2]))
        out.append(("reversed", np.ascontiguousarray(base[..., ::-1])[..., ::-1]))
    if len(shape) >= 1 and shape[0] == 1:
        out.append(("expanded", np.broadcast_to(base[:1], (1,) + shape[1:])))
    return out


# ------------------------------------------------------------------ copy
def copy_checks():
    for name, a in layouts((3, 4)):
        check(f"contiguous {name}", lambda a=a: [(cucopy.contiguous(a), np.ascontiguousarray(a))])
    b = np.broadcast_to(np.arange(4.0), (3, 4))
    check("copy expanded", lambda: [(cucopy.copy(b), np.array(b))])
    x = rng.uniform(-3, 3, (2, 3)).astype(np.float64)
    x[0, 0] = np.nan
    for dst in (np.float32, np.float16, np.int32, np.int64, np.bool_):
        v = x if dst is not np.int32 and dst is not np.int64 else np.nan_to_num(x)
        check(f"copy float64 -> {np.dtype(dst)}",
              lambda v=v, dst=dst: [(cucopy.copy(v.T, dst), np.ascontiguousarray(v.T.astype(dst)))])
    dst = np.zeros((4, 6), np.float32)
    want = dst.copy()
    src = rng.uniform(-1, 1, (2, 3)).astype(np.float32)
    want[1::2, ::2] = src
    check("copy_into strided dst", lambda: [(cucopy.copy_into(dst[1::2, ::2], src) is not None
                                             and dst, want)])
    check("0-d copy", lambda: [(cucopy.copy(np.full((), 3.5, np.float32)),
                                np.full((), 3.5, np.float32))])
    for case in range(12):         # random shapes and layouts, against NumPy
        nd = int(rng.integers(1, 4))
        shape = tuple(int(v) for v in rng.integers(1, 4, nd))
        base = rng.uniform(-1, 1, tuple(2 * n + 1 for n in shape))
        key = tuple(slice(None, None, -2) if rng.uniform() < 0.3 else slice(1, 1 + 2 * n, 2)
                    for n in shape)
        src = np.transpose(base[key], rng.permutation(nd))
        dst = np.zeros(src.shape[::-1]).T
        check(f"copy_into random layout {case} {src.shape}", lambda src=src, dst=dst: [
            (cucopy.copy_into(dst, src) is not None and dst, src)])
        reps = tuple(int(v) for v in rng.integers(0, 3, nd))
        shift = tuple(int(v) for v in rng.integers(-5, 6, nd))
        check(f"roll/tile random layout {case} {src.shape}", lambda src=src, r=reps, s=shift: [
            (gpu("tile")(src, r), cpu("tile")(src, r)),
            (gpu("roll")(src, s, tuple(range(len(s)))), cpu("roll")(src, s, tuple(range(len(s)))))])
    check_raises("copy_into bad shape", ValueError, "cannot be broadcast",
                 lambda: cucopy.copy_into(np.zeros((2, 3)), np.zeros((3, 2))))


# ------------------------------------------------------------------ index
def fold3(a, d):
    s = a.shape
    return a.reshape(int(np.prod(s[:d])), s[d], int(np.prod(s[d + 1:])))


def index_checks():
    for dtype in (np.float32, np.float64, np.int64):
        src = (rng.uniform(-5, 5, (2, 5, 3))).astype(dtype)
        idx = rng.integers(0, 5, (2, 4, 3))
        check(f"gather {np.dtype(dtype)}", lambda src=src, idx=idx: [
            (gpu("gather")(src, idx), cpu("gather")(src, idx))])
    src = rng.uniform(-1, 1, (3, 5, 2)).astype(np.float32)
    src_t = np.swapaxes(np.ascontiguousarray(np.swapaxes(src, 0, 2)), 0, 2)
    idx = rng.integers(0, 5, (3, 6, 2))
    check("gather transposed src", lambda: [(gpu("gather")(src_t, idx), cpu("gather")(src, idx))])
    check_raises("gather index too big", IndexError, "index 5 is out of bounds",
                 lambda: gpu("gather")(src, np.full((3, 1, 2), 5)))
    check_raises("gather negative index", IndexError, "index -1 is out of bounds",
                 lambda: gpu("gather")(src, np.full((3, 1, 2), -1)))

    for dtype in (np.float32, np.float64, np.int32, np.int64, np.bool_):
        for acc in (False, True):
            dst = rng.uniform(-3, 3, (2, 5, 3)).astype(dtype)
            if acc:
                idx = rng.integers(0, 5, (2, 4, 3))           # duplicates accumulate
            else:                                             # distinct per (o, i) column
                idx = np.stack([np.stack([rng.permutation(5)[:4] for _ in range(3)], -1)
                                for _ in range(2)])
            s = rng.uniform(-3, 3, (2, 4, 3)).astype(dtype)
            want = cpu("scatter")(dst.copy(), idx, s, acc)
            tol = (1e-6,) if dtype == np.float32 and acc else ()

            def run(dst=dst, idx=idx, s=s, acc=acc, want=want, tol=tol):
                d = dst.copy()
                return [(gpu("scatter")(d, idx, s, acc), want, *tol), (d, want, *tol)]
            check(f"scatter {np.dtype(dtype)} accumulate={acc}", run)
    # in place into a non-contiguous dst (a transposed view)
    base = np.zeros((3, 5, 2), np.float64)
    dst_t = np.swapaxes(np.zeros((2, 5, 3)), 0, 2)
    idx = rng.integers(0, 5, (3, 4, 2))
    s = rng.uniform(-1, 1, (3, 4, 2))
    want = cpu("scatter")(base, idx, s, True)
    check("scatter_add into a transposed dst", lambda: [
        (gpu("scatter")(dst_t, idx, s, True) is not None and dst_t, want, 1e-12)])
    check_raises("scatter index too big", IndexError, "scatter_add(): index 7",
                 lambda: gpu("scatter")(np.zeros((1, 3, 1)), np.full((1, 1, 1), 7),
                                        np.ones((1, 1, 1)), True))
    check_raises("scatter float16 accumulate", TypeError, "no CUDA atomic add",
                 lambda: gpu("scatter")(np.zeros((1, 3, 1), np.float16),
                                        np.zeros((1, 1, 1), np.int64),
                                        np.ones((1, 1, 1), np.float16), True))

    for dtype in (np.float32, np.float64, np.int64, np.bool_):
        dst = rng.uniform(-3, 3, (2, 4, 3)).astype(dtype)
        idx = np.array([3, 0, 3, 1, 3])
        s = rng.uniform(-3, 3, (2, 5, 3)).astype(dtype)
        want = cpu("index_add")(dst.copy(), idx, s)

        def run(dst=dst, idx=idx, s=s, want=want):
            d = dst.copy()
            gpu("index_add")(d, idx, s)
            return [(d, want, 1e-6) if want.dtype.kind == "f" else (d, want)]
        check(f"index_add {np.dtype(dtype)}", run)
    check_raises("index_add bad index", IndexError, "index_add(): index 4",
                 lambda: gpu("index_add")(np.zeros((1, 4, 1)), np.array([0, 4]),
                                          np.ones((1, 2, 1))))

    for name, x in layouts((3, 4, 2)):
        for dim in (0, 1, 2):
            idx = rng.integers(-x.shape[dim], x.shape[dim], 5)
            check(f"index_select {name} dim={dim}", lambda x=x, dim=dim, idx=idx: [
                (gpu("index_select")(x, dim, idx), cpu("index_select")(x, dim, idx))])
    check_raises("index_select out of range", IndexError, "index 3 is out of bounds for axis 0",
                 lambda: gpu("index_select")(np.zeros((3, 2)), 0, np.array([0, 3])))
    check_raises("index_select too negative", IndexError, "index -4 is out of bounds for axis 1",
                 lambda: gpu("index_select")(np.zeros((2, 3)), 1, np.array([-4])))

    x = rng.uniform(-1, 1, (4, 3, 5)).astype(np.float32)
    xt = np.transpose(np.ascontiguousarray(np.transpose(x, (2, 0, 1))), (1, 2, 0))
    i0 = np.array([[0, 3], [-1, 2]])
    i1 = np.array([2, 0])
    i2 = np.array([[4], [1]])
    keys = {"one leading array": (np.array([3, 1, 3, -4]),),
            "2-d leading array": (i0,),
            "adjacent arrays": (slice(None), i1, np.broadcast_to(i2, (2, 2))),
            "separated arrays": (i1, slice(None), i2),
            "middle array": (slice(None), i1),
            "empty index": (np.zeros(0, np.int64),)}
    for label, key in keys.items():
        for lname, arr in (("contiguous", x), ("permuted", xt)):
            check(f"index {label} {lname}", lambda arr=arr, key=key: [
                (gpu("index")(arr, key), cpu("index")(arr, key))])
    check_raises("index out of range", IndexError, "index 5 is out of bounds for axis 2",
                 lambda: gpu("index")(x, (slice(None), slice(None), np.array([5]))))
    check_raises("index bad broadcast", IndexError, "shape mismatch",
                 lambda: gpu("index")(x, (np.array([0, 1]), np.array([0, 1, 2]))))

    tbl = np.array([[3, -2, 9, 0], [1, 1, 1, 1]], np.int64)
    check("minmax_rows", lambda: [(cuindex.minmax_rows(tbl), np.array([[-2, 9], [1, 1]]))])
    big = rng.integers(-1000, 1000, (1, 700))
    check("minmax_rows several blocks", lambda: [
        (cuindex.minmax_rows(big), np.array([[big.min(), big.max()]]))])


# ------------------------------------------------------------------ join
def join_checks():
    a = rng.uniform(-1, 1, (2, 3)).astype(np.float32)
    for name, b in layouts((2, 4)):
        check(f"cat axis=1 with {name}", lambda b=b: [
            (gpu("cat")([a, b], 1), cpu("cat")([a, b], 1))])
    c = rng.integers(0, 9, (1, 3)).astype(np.int64)
    check("cat axis=0 mixed dtypes", lambda: [(gpu("cat")([a, c], 0), cpu("cat")([a, c], 0))])
    check("cat with an empty input", lambda: [
        (gpu("cat")([a, np.zeros((0, 3), np.float32), a], 0),
         cpu("cat")([a, np.zeros((0, 3), np.float32), a], 0))])
    w = np.arange(6, dtype=np.uint16).reshape(2, 3)
    check("cat bfloat16 words", lambda: [(gpu("cat")([w, w[:, ::-1]], -1),
                                          cpu("cat")([w, w[:, ::-1]], -1))])
    check_raises("cat mismatched dims", ValueError, "along dimension 1",
                 lambda: gpu("cat")([a, np.zeros((2, 4), np.float32)], 0))

    for name, x in layouts((2, 3, 4)):
        for axes in ((0,), (2,), (0, 1, 2), ()):
            check(f"flip {name} {axes}", lambda x=x, axes=axes: [
                (gpu("flip")(x, axes), cpu("flip")(x, axes))])
        for shifts, axes in ((1, 0), ((2, -1), (2, 0)), (5, None), ((1, 1), (1, 1)), (-7, 2)):
            check(f"roll {name} {shifts} {axes}", lambda x=x, s=shifts, ax=axes: [
                (gpu("roll")(x, s, ax), cpu("roll")(x, s, ax))])
        for reps in ((1, 1, 1), (2, 1, 3), (2, 1, 1, 2), (0, 1, 1)):
            check(f"tile {name} {reps}", lambda x=x, r=reps: [
                (gpu("tile")(x, r), cpu("tile")(x, r))])
        for k in (-1, 0, 2, -5):
            check(f"tril/triu {name} k={k}", lambda x=x, k=k: [
                (gpu("tril")(x, k), cpu("tril")(x, k)), (gpu("triu")(x, k), cpu("triu")(x, k))])
    s = np.full((), 2.5)
    check("tile 0-d", lambda: [(gpu("tile")(s, (3,)), cpu("tile")(s, (3,)))])
    xb = rng.integers(0, 2, (3, 3)).astype(bool)
    check("tril bool", lambda: [(gpu("tril")(xb, 0), cpu("tril")(xb, 0))])
    check_raises("tril 1-d", ValueError, "at least 2 dimensions", lambda: gpu("tril")(a[0], 0))

    for shape in ((5,), (2, 3), ()):
        idx = rng.integers(0, 4, shape)
        check(f"one_hot {shape}", lambda idx=idx: [
            (gpu("one_hot")(idx, 4), cpu("one_hot")(idx, 4))])
    idx = rng.integers(0, 4, (3, 2)).T
    check("one_hot transposed", lambda: [(gpu("one_hot")(idx, 5), cpu("one_hot")(idx, 5))])
    check_raises("one_hot out of range", IndexError, "index 4 is out of bounds",
                 lambda: gpu("one_hot")(np.array([0, 4]), 4))

    def pad_args(shape, widths):
        out_shape, src, dst = [], [], []
        for n, (lo, hi) in zip(shape, widths):
            out_shape.append(n + lo + hi)
            src.append(slice(max(-lo, 0), n - max(-hi, 0)))
            dst.append(slice(max(lo, 0), max(lo, 0) + max(n - max(-lo, 0) - max(-hi, 0), 0)))
        return tuple(out_shape), tuple(src), tuple(dst)
    for name, x in layouts((2, 3, 4)):
        for widths in (((0, 0), (1, 2), (3, 0)), ((1, 1), (-1, 0), (0, -2)),
                       ((0, 0), (-3, 1), (0, 0))):
            args = pad_args(x.shape, widths)
            check(f"pad_constant {name} {widths}", lambda x=x, args=args: [
                (gpu("pad_constant")(x, *args, np.full((), -1.5, np.float32)),
                 cpu("pad_constant")(x, *args, np.full((), -1.5, np.float32)))])
    x = rng.uniform(-1, 1, (3, 4)).astype(np.float32)
    check("pad_constant stepped dst key", lambda: [
        (gpu("pad_constant")(x, (6, 4), (slice(None), slice(None)), (slice(0, 6, 2), slice(None)),
                             np.ones((), np.float32)),
         cpu("pad_constant")(x, (6, 4), (slice(None), slice(None)), (slice(0, 6, 2), slice(None)),
                             np.ones((), np.float32)))])


# ------------------------------------------------------------------ embedding
def embedding_checks():
    for dtype in (np.float32, np.float64):
        for name, w in layouts((6, 3), dtype):
            idx = rng.integers(0, 6, (2, 4))
            check(f"embedding {np.dtype(dtype)} {name}", lambda w=w, idx=idx: [
                (gpu("embedding")(w, idx), cpu("embedding")(w, idx))])
        idx = np.array([[1, 4, 1], [0, 1, 5]])
        for name, g in layouts((2, 3, 4), dtype):
            for pad in (-1, 1):
                for freq in (False, True):
                    check(f"embedding_backward {np.dtype(dtype)} {name} pad={pad} freq={freq}",
                          lambda g=g, pad=pad, freq=freq: [
                              (gpu("embedding_backward")(g, idx, 6, pad, freq),
                               cpu("embedding_backward")(g, idx, 6, pad, freq), 1e-6)])
    check_raises("embedding index out of range", IndexError,
                 "embedding(): index 6 is out of range for num_embeddings=6",
                 lambda: gpu("embedding")(np.zeros((6, 2), np.float32), np.array([0, 6])))
    check_raises("embedding_backward negative index", IndexError,
                 "index -1 is out of range",
                 lambda: gpu("embedding_backward")(np.zeros((2, 2), np.float32),
                                                   np.array([0, -1]), 3, -1, False))


# ------------------------------------------------------------------ dropout
def philox_on_host(*args, **kwargs):
    """The fused CUDA dropout's (out, keep), copied to the host for NumPy checks."""
    return tuple(cudrop.to_host(a) for a in cudrop.dropout_philox(*args, **kwargs))


def dropout_checks():
    for dtype in (np.float32, np.float64):
        for name, x in layouts((3, 5), dtype):
            keep = rng.uniform(0, 1, x.shape) >= 0.3
            check(f"dropout {np.dtype(dtype)} {name}", lambda x=x, keep=keep: [
                (gpu("dropout")(x, keep, 1 / 0.7), cpu("dropout")(x, keep, 1 / 0.7))])
    x = np.array([np.nan, 1.0], np.float32)
    check("dropout keeps NaN", lambda: [(gpu("dropout")(x, np.array([False, True]), 2.0),
                                         np.array([np.nan, 2.0], np.float32))])
    kat = [((0, 0, 0, 0), (0, 0), (0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8)),
           ((0xffffffff,) * 4, (0xffffffff,) * 2, (0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd)),
           ((0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344), (0xa4093822, 0x299f31d0),
            (0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1))]
    for ctr, key, want in kat:
        check(f"philox4x32-10 known answer {ctr[0]:#x}", lambda c=ctr, k=key, w=want: [
            (np.array(cudrop.philox4x32(c, k), np.uint64), np.array(w, np.uint64))])

    x = rng.uniform(0.5, 2, (37, 29)).astype(np.float32)      # 1073 elements, odd tail
    p = 0.3

    def philox():
        out, keep = philox_on_host(x, p, seed=1234, offset=7)
        out2, keep2 = philox_on_host(x, p, seed=1234, offset=7, launch=(3, 32))
        _, keep3 = philox_on_host(x, p, seed=1235, offset=7)
        _, keep4 = philox_on_host(x, p, seed=1234, offset=8)
        rate = keep.mean()
        # keep rate 0.7 +- 5 sigma of a binomial over 1073 draws (sigma = 0.014)
        assert abs(rate - 0.7) < 0.07, f"keep rate {rate}"
        assert (keep != keep3).mean() > 0.2 and (keep != keep4).mean() > 0.2, \
            "another seed or offset gave (almost) the same mask"
        want = np.where(keep, x * np.float32(1 / 0.7), np.float32(0))
        return [(keep2, keep), (out2, out), (out, want, 1e-6)]
    check("dropout_philox statistics, reproducibility, scaling", philox)
    xd = rng.uniform(-1, 1, (4, 6))[:, ::2]

    def philox_f64():
        out, keep = philox_on_host(xd, 0.5, seed=2**40 + 3)
        _, keep32 = philox_on_host(xd.astype(np.float32), 0.5, seed=2**40 + 3)
        return [(keep32, keep), (out, np.where(keep, xd * 2.0, 0.0))]
    check("dropout_philox float64 strided (same mask as float32)", philox_f64)

    def layout_of_counters():
        """Element e uses word e % 4 of Philox((e//4, 0, offset lo, offset hi), seed words)."""
        seed, offset = 0x1234_5678_9ABC, 2**33 + 5
        _, keep = philox_on_host(x, p, seed, offset)
        flat = keep.reshape(-1)
        k = (np.uint32(seed & 0xFFFFFFFF), np.uint32(seed >> 32))
        o = (np.uint32(offset & 0xFFFFFFFF), np.uint32(offset >> 32))
        pairs = []
        for e in (0, 1, 2, 3, 4, 5, 517, flat.size - 1):
            words = cudrop._philox4x32(np.uint32(e // 4), np.uint32(0), *o, *k)
            u = np.float32(words[e % 4] >> np.uint32(8)) * np.float32(2.0 ** -24)
            pairs.append((flat[e], u >= np.float32(p)))
        return pairs
    check("dropout_philox counter layout", layout_of_counters)
    check("dropout_philox p=1 and p=0", lambda: [
        (philox_on_host(x, 1.0, 5)[1], np.zeros(x.shape, bool)),
        (philox_on_host(x, 0.0, 5)[0], x)])
    check_raises("dropout int input", TypeError, "floating point",
                 lambda: gpu("dropout")(np.ones(3, np.int64), np.ones(3, bool), 2.0))
    check_raises("dropout mask shape", ValueError, "does not match",
                 lambda: gpu("dropout")(np.ones(3, np.float32), np.ones(4, bool), 2.0))


# ------------------------------------------------------------------ cast
def cast_checks():
    vals = np.array([[0.0, -0.0, 1.5, -2.25], [3.3e38, -1e-40, np.inf, -np.inf],
                     [np.nan, 1.00390625, 1.01171875, 65504.0]], np.float32)
    sources = {dt.float32: vals, dt.float64: vals.astype(np.float64) * 1.0000001,
               dt.float16: np.nan_to_num(vals, posinf=7, neginf=-7).clip(-6e4, 6e4)
                                 .astype(np.float16),
               dt.int32: np.arange(-6, 6, dtype=np.int32).reshape(3, 4),
               dt.int64: np.arange(-6, 6, dtype=np.int64).reshape(3, 4),
               dt.bool: (np.arange(12).reshape(3, 4) % 3 == 0)}
    sources[dt.bfloat16] = cpu("cast")(vals, dt.float32, dt.bfloat16)
    for src, x in sources.items():
        for dst in (dt.float32, dt.float64, dt.float16, dt.bfloat16, dt.int32, dt.int64, dt.bool):
            v = x
            if dst.category == dt.int32.category and src.is_floating_point:
                if src is dt.bfloat16:
                    v = cpu("cast")(np.nan_to_num(cpu("cast")(x, src, dt.float32), posinf=9,
                                                  neginf=-9).clip(-9, 9), dt.float32, src)
                else:
                    v = np.nan_to_num(x, posinf=9, neginf=-9).clip(-9, 9).astype(x.dtype)
            for lname, arr in (("contiguous", v), ("transposed", v.T)):
                check(f"cast {src.name} -> {dst.name} {lname}", lambda a=arr, s=src, d=dst: [
                    (gpu("cast")(a, s, d), np.ascontiguousarray(cpu("cast")(a, s, d)))])
    # round to nearest even on the bit pattern, ties both ways, and a NaN payload
    bits = np.array([0x3F808000, 0x3F818000, 0x3F80FFFF, 0x7F7FFFFF, 0x7FC00001, 0xFF800001],
                    np.uint32)
    check("float32 -> bfloat16 rounding", lambda: [
        (gpu("cast")(bits.view(np.float32), dt.float32, dt.bfloat16),
         np.array([0x3F80, 0x3F82, 0x3F81, 0x7F80, 0x7FC0, 0xFFC0], np.uint16))])
    check_raises("cast wrong storage", TypeError, "is not the storage",
                 lambda: gpu("cast")(np.zeros(2, np.float64), dt.float32, dt.int64))


# ------------------------------------------------------------------ optim
def optim_checks():
    n = 37
    for dtype in (np.float32, np.float64):
        tol = 1e-6 if dtype == np.float32 else 1e-13
        for opts in ({}, {"weight_decay": 0.1},
                     {"weight_decay": 0.1, "decoupled_weight_decay": True},
                     {"amsgrad": True, "maximize": True}):
            def run(dtype=dtype, opts=opts, tol=tol):
                arrays = [rng.uniform(-1, 1, n).astype(dtype) for _ in range(2)] + \
                         [rng.uniform(0, 1, n).astype(dtype) for _ in range(3)]
                mine = [a.copy() for a in arrays]
                theirs = [a.copy() for a in arrays]
                hp = dict(lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8, **opts)
                for step in (1, 2, 3):
                    gpu("adam_step")(*mine, step=step, **hp)
                    cpu("adam_step")(*theirs, step=step, **hp)
                return [(m, t, tol) for m, t in zip(mine, theirs)]
            check(f"adam_step {np.dtype(dtype)} {opts}", run)
        for opts in ({}, {"momentum": 0.9},
                     {"momentum": 0.9, "nesterov": True, "weight_decay": 0.01},
                     {"momentum": 0.5, "dampening": 0.1, "maximize": True}):
            def run(dtype=dtype, opts=opts, tol=tol):
                arrays = [rng.uniform(-1, 1, n).astype(dtype) for _ in range(3)]
                mine = [a.copy() for a in arrays]
                theirs = [a.copy() for a in arrays]
                for step in (1, 2):
                    gpu("sgd_step")(*mine, lr=0.1, first_step=step == 1, **opts)
                    cpu("sgd_step")(*theirs, lr=0.1, first_step=step == 1, **opts)
                return [(m, t, tol) for m, t in zip(mine, theirs)]
            check(f"sgd_step {np.dtype(dtype)} {opts}", run)
    z = np.zeros(4, np.float32)
    check_raises("adam dtype mismatch", TypeError, "'grad' has dtype float64",
                 lambda: gpu("adam_step")(z.copy(), np.zeros(4), z.copy(), z.copy(), step=1,
                                          lr=0.1, beta1=0.9, beta2=0.99, eps=1e-8))
    check_raises("adam size mismatch", ValueError, "'exp_avg' has 3 elements",
                 lambda: gpu("adam_step")(z.copy(), z, z[:3].copy(), z.copy(), step=1,
                                          lr=0.1, beta1=0.9, beta2=0.99, eps=1e-8))
    check_raises("adam bad beta", ValueError, "Invalid beta parameter at index 0",
                 lambda: gpu("adam_step")(z.copy(), z, z.copy(), z.copy(), step=1,
                                          lr=0.1, beta1=1.0, beta2=0.99, eps=1e-8))
    check_raises("sgd strided param", ValueError, "flat C-contiguous",
                 lambda: gpu("sgd_step")(np.zeros(8, np.float32)[::2], z, lr=0.1))
    check_raises("sgd nesterov", ValueError, "Nesterov momentum requires",
                 lambda: gpu("sgd_step")(z.copy(), z, z.copy(), lr=0.1, momentum=0.9,
                                         dampening=0.5, nesterov=True))


SECTIONS = {"copy": copy_checks, "index": index_checks, "join": join_checks,
            "embedding": embedding_checks, "dropout": dropout_checks, "cast": cast_checks,
            "optim": optim_checks}

if __name__ == "__main__":
    wanted = sys.argv[1:] or list(SECTIONS)
    for name in wanted:
        t0 = time.perf_counter()
        before = checks
        SECTIONS[name]()
        print(f"{name}: {checks - before} checks in {time.perf_counter() - t0:.1f} s")
    for f in failures:
        print("FAIL", f)
    print(f"{checks} checks, {len(failures)} failures")
    sys.exit(1 if failures else 0)
