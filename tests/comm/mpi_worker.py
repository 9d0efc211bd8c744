"""Run under ``mpirun -n N python mpi_worker.py DEVICE``: every pyflow.comm call
checked against NumPy on every rank.

Each rank can build every rank's input (the data of rank r comes from a
generator seeded with r), so each rank computes the NumPy reference itself.
A failing check is recorded, not raised, so one run reports all of them; each
rank ends with ``rank r: N checks, F failures`` and exits non-zero on a failure.

DEVICE is ``cpu`` (zero-copy NumPy buffers) or ``cuda`` (with
NUMBA_ENABLE_CUDASIM=1: first the pinned-staging path, then the direct
CUDA-aware path forced on).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tests.rank_checks import RankChecks, raises  # noqa: E402

import numpy as np  # noqa: E402

import pyflow  # noqa: E402
import pyflow.comm as comm  # noqa: E402
from pyflow.comm import cuda_aware, staging  # noqa: E402
from pyflow.comm.communicator import CollectiveMismatchError  # noqa: E402

DEVICE = sys.argv[1] if len(sys.argv) > 1 else "cpu"
W = comm.world()
RANK, SIZE = W.rank, W.size
DTYPES = (pyflow.float32, pyflow.float64, pyflow.float16, pyflow.bfloat16, pyflow.int32,
          pyflow.int64, pyflow.bool)
TOL = {"float32": 1e-5, "float64": 1e-12, "float16": 2e-3, "bfloat16": 1e-2}
check = RankChecks(RANK)


# ------------------------------------------------------------------ data
def host_values(a):
    """A tensor's values as a host NumPy array (float64 for floats)."""
    if a.device.type != "cpu":
        a = a.cpu()
    if a.dtype.is_floating_point:
        return a.float()._data.astype(np.float64) if a.dtype is pyflow.bfloat16 \
            else a._data.astype(np.float64)
    return np.array(a._data)


def make(rank, dtype, shape, seed=0, transposed=False):
    """Rank ``rank``'s input; ``transposed`` gives a non-contiguous view."""
    rng = np.random.default_rng(1000 * seed + rank)
    full = shape[::-1] if transposed else shape
    if dtype.is_floating_point:
        arr = rng.standard_normal(full)
    elif dtype is pyflow.bool:
        arr = rng.random(full) < 0.5
    else:
        arr = rng.integers(-50, 50, full)
    t = pyflow.tensor(arr, dtype=dtype, device=DEVICE)
    return t.t() if transposed else t


def assert_close(got, want, dtype, what):
    got = host_values(got)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    if dtype.is_floating_point:
        tol = TOL[dtype.name]
        ok = np.allclose(got, want, rtol=tol, atol=tol)
    else:
        ok = np.array_equal(got, want)
    assert ok, f"{what}: got\n{got}\nwant\n{want}"


def reduce_ref(stack, op, dtype):
    if dtype is pyflow.bool:
        return stack.all(0) if op == "min" else stack.any(0)
    return {"sum": stack.sum(0), "avg": stack.mean(0), "max": stack.max(0),
            "min": stack.min(0)}[op]


def ops_for(dtype):
    return ("sum", "avg", "max", "min") if dtype.is_floating_point else ("sum", "max", "min")


# ------------------------------------------------------------------ collectives
def check_all_reduce(dtype, op, blocking, transposed):
    shape = (3, 4)
    mine = make(RANK, dtype, shape, 1, transposed)
    base = mine._base
    want = reduce_ref(np.stack([host_values(make(r, dtype, shape, 1, transposed))
                                for r in range(SIZE)]), op, dtype)
    version = mine._version[0]
    out = W.all_reduce(mine, op) if blocking else W.iall_reduce(mine, op).wait()
    assert out is mine, "all_reduce must return its (in-place) input"
    assert mine._version[0] > version, "all_reduce writes in place: the version must move"
    assert_close(mine, want, dtype, f"all_reduce {op}")
    if transposed:                 # the write-back reached the storage of the view
        assert_close(base.t(), want, dtype, "all_reduce base")


def check_all_gather(dtype, blocking, shape):
    mine = make(RANK, dtype, shape, 2)
    out = W.all_gather(mine) if blocking else W.iall_gather(mine).wait()
    parts = [host_values(make(r, dtype, shape, 2)).reshape(shape or (1,)) for r in range(SIZE)]
    assert out.device == mine.device and out.dtype is dtype
    assert_close(out, np.concatenate(parts, 0), dtype, "all_gather")


def check_reduce_scatter(dtype, op, blocking):
    shape, strided = (2 * SIZE, 3), dtype is pyflow.float32      # one non-contiguous input
    mine = make(RANK, dtype, shape, 3, strided)
    full = reduce_ref(np.stack([host_values(make(r, dtype, shape, 3, strided))
                                for r in range(SIZE)]), op, dtype)
    out = W.reduce_scatter(mine, op) if blocking else W.ireduce_scatter(mine, op).wait()
    assert_close(out, full[RANK * 2:(RANK + 1) * 2], dtype, f"reduce_scatter {op}")


def check_all_to_all(dtype, blocking):
    shape = (2 * SIZE, 3)
    mine = make(RANK, dtype, shape, 4)
    out = W.all_to_all(mine) if blocking else W.iall_to_all(mine).wait()
    want = np.concatenate([host_values(make(r, dtype, shape, 4))[2 * RANK:2 * RANK + 2]
                           for r in range(SIZE)])
    assert_close(out, want, dtype, "all_to_all")


def check_broadcast(dtype, blocking):
    root = SIZE - 1
    mine = make(RANK, dtype, (2, 5), 5, transposed=True)
    out = W.broadcast(mine, root) if blocking else W.ibroadcast(mine, root).wait()
    assert out is mine
    assert_close(mine, host_values(make(root, dtype, (2, 5), 5, transposed=True)), dtype,
                 "broadcast")


def check_send_recv(dtype):
    # a ring with non-blocking sends (no ordering deadlock), then blocking pairs
    nxt, prv = (RANK + 1) % SIZE, (RANK - 1) % SIZE
    box = pyflow.zeros((2, 3), dtype=dtype, device=DEVICE)
    w_send = W.isend(make(RANK, dtype, (2, 3), 6), nxt, tag=7)
    w_recv = W.irecv(box, prv, tag=7)
    assert w_recv.wait() is box
    w_send.wait()
    assert_close(box, host_values(make(prv, dtype, (2, 3), 6)), dtype, "isend/irecv ring")
    if SIZE > 1 and not (SIZE % 2 and RANK == SIZE - 1):
        peer = RANK ^ 1
        got = pyflow.zeros((3, 2), dtype=dtype, device=DEVICE).t()   # non-contiguous target
        if RANK % 2 == 0:
            W.send(make(RANK, dtype, (2, 3), 8), peer, tag=3)
            W.recv(got, peer, tag=4)
        else:
            W.recv(got, peer, tag=3)
            W.send(make(RANK, dtype, (2, 3), 8), peer, tag=4)
        assert_close(got, host_values(make(peer, dtype, (2, 3), 8)), dtype, "send/recv pair")


def check_nonblocking_overlap():
    """Several non-blocking collectives in flight at once, finished out of order."""
    a = make(RANK, pyflow.float32, (4,), 9)
    b = make(RANK, pyflow.float64, (SIZE, 2), 9)
    works = [W.iall_reduce(a, "max"), W.iall_gather(b), W.ibarrier()]
    while not works[2].test():
        pass
    gathered = works[1].wait()
    works[0].wait()
    assert works[0].test() and works[0].is_completed()
    assert_close(a, np.stack([host_values(make(r, pyflow.float32, (4,), 9))
                              for r in range(SIZE)]).max(0), pyflow.float32, "overlap max")
    assert tuple(gathered.shape) == (SIZE * SIZE, 2)


# ------------------------------------------------------------------ groups
def check_groups():
    members = [0, SIZE - 1] if SIZE > 1 else [0]
    if SIZE == 4:
        members = [3, 1]                    # order gives the new ranks
    g = W.group(members)
    assert W.group(members) is g, "group() is cached per rank list"
    if RANK not in members:
        assert g is None
        return
    assert g.size == len(members) and g.rank == members.index(RANK)
    t = make(RANK, pyflow.float64, (3,), 10)
    g.all_reduce(t)
    want = sum(host_values(make(r, pyflow.float64, (3,), 10)) for r in members)
    assert_close(t, want, pyflow.float64, "group all_reduce")
    gathered = g.all_gather(pyflow.tensor([float(RANK)], device=DEVICE))
    assert host_values(gathered).tolist() == [float(r) for r in members]
    sub = g.group([0])
    assert (sub is not None) == (g.rank == 0)


# ------------------------------------------------------------------ buckets
def check_bucketer():
    shapes = [(5, 3), (7,), (2, 2, 2), (40,), (3,)]
    dtypes = [pyflow.float32, pyflow.float32, pyflow.float64, pyflow.float32, pyflow.bfloat16]

    def params_with_grads(step):
        ps = []
        for i, (s, d) in enumerate(zip(shapes, dtypes)):
            p = pyflow.zeros(s, dtype=d, device=DEVICE).requires_grad_()
            p.grad = make(RANK, d, s, 20 + i + 7 * step)
            ps.append(p)
        ps[1].grad = None                              # an unused parameter
        return ps

    params = params_with_grads(0)
    # float32 items: 60 + 28 bytes fit in 100, the 160-byte one gets its own bucket
    bucketer = comm.GradBucketer(params, bucket_bytes=100, average=True)
    kinds = [(b.dtype.name, len(b.params)) for b in bucketer.buckets]
    assert kinds == [("float32", 2), ("float64", 1), ("float32", 1), ("bfloat16", 1)], kinds
    for step in range(2):
        fresh = params_with_grads(step)
        for p, q in zip(params, fresh):
            p.grad = q.grad
        before = [id(b.flat) for b in bucketer.buckets]
        if step == 0:
            bucketer.reduce()
        else:
            for i in range(len(bucketer.buckets)):
                bucketer.start_bucket(i)
            for i in reversed(range(len(bucketer.buckets))):
                bucketer.finish_bucket(i)
        if step == 1:
            assert [id(b.flat) for b in bucketer.buckets] == before, "bucket buffers reused"
        assert bucketer.collectives == 4 * (step + 1)
        for i, (p, s, d) in enumerate(zip(params, shapes, dtypes)):
            if i == 1:
                want = np.zeros(s)
            else:
                want = np.mean([host_values(make(r, d, s, 20 + i + 7 * step))
                                for r in range(SIZE)], 0)
            assert_close(p.grad, want, d, f"bucketed grad {i}")


# ------------------------------------------------------------------ faults
def expect_mismatch(fn, *needles):
    try:
        fn()
    except CollectiveMismatchError as e:
        for needle in needles:
            assert needle in str(e), f"{needle!r} not in {e}"
        return
    raise AssertionError("no CollectiveMismatchError")


def check_mismatches():
    if SIZE == 1:
        return
    # a call every rank has made before (its descriptor kept, communicator.py)
    # against a new one: still a mismatch, seen on every rank
    W.all_reduce(pyflow.ones(5, device=DEVICE))
    expect_mismatch(lambda: W.all_reduce(pyflow.ones(5 if RANK == 0 else 6, device=DEVICE)),
                    "rank 0: all_reduce(shape=(5,)", "rank 1: all_reduce(shape=(6,)")
    bad_shape = (4,) if RANK == 0 else (3,)
    expect_mismatch(lambda: W.all_reduce(pyflow.ones(bad_shape, device=DEVICE)),
                    "rank 0: all_reduce(shape=(4,)", "rank 1: all_reduce(shape=(3,)")
    dt = pyflow.float64 if RANK == SIZE - 1 else pyflow.float32
    expect_mismatch(lambda: W.iall_gather(pyflow.ones(2, dtype=dt, device=DEVICE)),
                    "dtype=float64", "dtype=float32")
    op = "max" if RANK == 0 else "sum"
    expect_mismatch(lambda: W.all_reduce(pyflow.ones(2, device=DEVICE), op), "op=max")
    root = RANK % 2
    expect_mismatch(lambda: W.broadcast(pyflow.ones(2, device=DEVICE), root), "root=1")
    t = pyflow.ones(SIZE, device=DEVICE)
    expect_mismatch(lambda: W.all_to_all(t) if RANK == 0 else W.all_reduce(t),
                    "all_to_all(", "all_reduce(")
    # the communicator is still usable after the errors
    t = pyflow.ones(3, device=DEVICE)
    W.all_reduce(t)
    assert host_values(t).tolist() == [SIZE] * 3
    # point to point: the receiving rank raises, the sender is not left hanging
    if RANK == 0:
        expect_mismatch(lambda: W.recv(pyflow.zeros(4, device=DEVICE), 1, tag=11),
                        "expected 16 bytes", "has 12 bytes")
    elif RANK == 1:
        W.send(pyflow.ones(3, device=DEVICE), 0, tag=11)
    W.barrier()


def check_bad_input():
    raises(ValueError, "op must be one of", lambda: W.all_reduce(pyflow.ones(2), "prod"))
    raises(TypeError, "op 'avg' needs a floating point",
           lambda: W.all_reduce(pyflow.ones(2, dtype=pyflow.int32), "avg"))
    raises(ValueError, "divisible by the group size",
           lambda: W.reduce_scatter(pyflow.ones(2 * SIZE + 1)))
    raises(ValueError, "root must be a rank", lambda: W.broadcast(pyflow.ones(2), SIZE))
    raises(TypeError, "must be a pyflow Tensor", lambda: W.all_gather(np.ones(2)))
    raises(ValueError, "ranks must be distinct", lambda: W.group([0, 0]))
    raises(ValueError, "peer is this rank", lambda: W.send(pyflow.ones(2), RANK))


# ------------------------------------------------------------------ memory paths
def check_zero_copy():
    t = pyflow.ones(8)
    buf = staging.MPIBuffer(t._data)
    assert buf.kind == "host" and buf.mpi is t._data
    before = staging.staging_pool().allocations
    W.all_reduce(t)
    W.all_gather(t)
    assert staging.staging_pool().allocations == before == 0, "CPU tensors never stage"


def check_staging_reused():
    assert not comm.cuda_aware_mpi()
    pool = staging.staging_pool()
    t = make(RANK, pyflow.float32, (64,), 30)
    assert staging.MPIBuffer(t._data).kind == "staged"
    W.all_reduce(t)                     # warm up: the pool now has its blocks
    W.all_gather(t)
    W.reduce_scatter(pyflow.ones(SIZE * 8, device=DEVICE))
    allocated = pool.allocations
    assert allocated > 0
    for _ in range(5):
        W.all_reduce(t)
        W.all_gather(t)
        W.all_reduce(make(RANK, pyflow.float64, (5,), 31))      # smaller: fits a block
        W.reduce_scatter(pyflow.ones(SIZE * 8, device=DEVICE))
        W.broadcast(t, 0)
    assert pool.allocations == allocated, (pool.allocations, allocated)


def run_suite(label):
    for dtype in DTYPES:
        name = f"{label} {dtype.name}"
        for op in ops_for(dtype):
            for blocking in (True, False):
                check(f"{name} all_reduce {op} blocking={blocking}", check_all_reduce, dtype,
                      op, blocking, op == "sum")
            check(f"{name} reduce_scatter {op}", check_reduce_scatter, dtype, op, op != "max")
        for blocking in (True, False):
            check(f"{name} all_gather blocking={blocking}", check_all_gather, dtype, blocking,
                  (2, 3))
            check(f"{name} all_to_all blocking={blocking}", check_all_to_all, dtype, blocking)
            check(f"{name} broadcast blocking={blocking}", check_broadcast, dtype, blocking)
        check(f"{name} all_gather 0-d", check_all_gather, dtype, True, ())
        check(f"{name} send/recv", check_send_recv, dtype)
    check(f"{label} non-blocking overlap", check_nonblocking_overlap)
    check(f"{label} groups", check_groups)
    check(f"{label} bucketer", check_bucketer)
    check(f"{label} mismatches", check_mismatches)


def main():
    if DEVICE == "cpu":
        run_suite("cpu")
        check("bad input", check_bad_input)
        check("zero-copy", check_zero_copy)
    else:
        assert pyflow.cuda.simulated(), "the cuda run expects NUMBA_ENABLE_CUDASIM=1"
        run_suite("cuda staged")
        check("staging buffers reused", check_staging_reused)
        cuda_aware._answer[:] = [(True, "forced by the test")]    # the direct path
        run_suite("cuda direct")
    W.barrier()
    check.report_and_exit()


if __name__ == "__main__":
    main()
