"""Run under ``mpirun -n N python global_worker.py``: global tensors and eager
boxing checked against the single-rank tensor, on every rank.

The reference is a rank-independent seeded array X (integer-valued floats, so
partial sums are exact).  For every pair of SBPs (S0, S1, B, P) and a few
dtypes, each rank builds its piece of X for the source SBP, converts, and the
piece must be exactly the destination SBP's piece of X (for P: the all_gathered
pieces must sum to X).  Also: randn_global equals the single-rank randn slice,
backward through boxing, a placement of some ranks in reverse order, and errors
raised on every rank.  Ends with ``rank r: N checks, F failures``.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tests.rank_checks import RankChecks, raises  # noqa: E402

import numpy as np  # noqa: E402

import pyflow  # noqa: E402
from pyflow.distributed import env, logical_shape, placement, randn_global  # noqa: E402
from pyflow.distributed import sbp as S  # noqa: E402

RANK, SIZE = env.get_rank(), env.get_world_size()
SBPS = {"S0": S.split(0), "S1": S.split(1), "B": S.broadcast, "P": S.partial_sum}

check = RankChecks(RANK)


def reference(shape, seed=0):
    return np.random.default_rng(seed).integers(-50, 50, shape).astype(np.float64)


def piece(X, sbp, pos, n):
    """Position ``pos``'s piece of X under ``sbp`` (P: a rank-dependent split of X)."""
    if sbp == S.broadcast:
        return X
    if sbp == S.partial_sum:
        parts = [reference(X.shape, seed=10 + k) for k in range(n - 1)]
        return parts[pos] if pos < n - 1 else X - sum(parts, np.zeros_like(X))
    size = X.shape[sbp.dim] // n
    return np.take(X, range(pos * size, (pos + 1) * size), axis=sbp.dim)


def assert_piece(y, X, sbp, pos, n, group):
    """Check y's piece; collective (every rank gathers, before any assertion, so a
    failing check on one rank cannot leave the others waiting in a collective)."""
    local = y.to_local()
    got = np.asarray(local.float() if local.dtype is pyflow.bfloat16 else local, np.float64)
    gathered = group.all_gather(pyflow.tensor(got[None]))._data \
        if sbp == S.partial_sum and got.shape == X.shape else None
    assert y.is_global and y.sbp == (sbp,), (y.sbp, sbp)
    assert logical_shape(y) == X.shape, (logical_shape(y), X.shape)
    if sbp == S.partial_sum:
        np.testing.assert_array_equal(gathered.sum(0), X)
    else:
        np.testing.assert_array_equal(got, piece(X, sbp, pos, n))


def conversions(plc, tag):
    group = plc.comm
    if group is None:                         # not in this placement: an empty piece
        y = pyflow.tensor([1.0]).to_global(plc, S.broadcast).to_global(sbp=S.split(0))
        check(f"{tag}: outside the placement", lambda: (
            np.testing.assert_equal((y.is_global, y.to_local().numel()), (True, 0))))
        return
    n, pos = group.size, group.rank
    X = reference((2 * n, 2 * n, 3))
    for dtype in (pyflow.float64, pyflow.float32, pyflow.int64, pyflow.bfloat16):
        for src_name, src in SBPS.items():
            for dst_name, dst in SBPS.items():
                def run():
                    local = pyflow.tensor(piece(X, src, pos, n)).to(dtype)
                    x = local.to_global(plc, src)
                    y = x.to_global(sbp=dst)
                    assert_piece(x, X, src, pos, n, group)
                    assert_piece(y, X, dst, pos, n, group)
                check(f"{tag} {dtype} {src_name}->{dst_name}", run)
    # A non-contiguous local piece (transposed) converts the same way.
    def transposed():
        local = pyflow.tensor(np.ascontiguousarray(piece(X, S.split(1), pos, n).swapaxes(0, 1)))
        x = local.transpose(0, 1).to_global(plc, S.split(1))
        ys = {dst: x.to_global(sbp=dst) for dst in SBPS.values()}
        for dst, y in ys.items():
            assert_piece(y, X, dst, pos, n, group)
    check(f"{tag}: non-contiguous piece", transposed)


def randn_checks(plc, tag):
    n, pos = plc.size, plc.ranks.index(RANK) if RANK in plc.ranks else None
    pyflow.manual_seed(7)
    full = pyflow.randn(4 * n, 2 * n).numpy()
    for name, sbp in SBPS.items():
        def run():
            pyflow.manual_seed(7)
            g = randn_global(4 * n, 2 * n, placement=plc, sbp=sbp)
            if pos is None:
                assert g.to_local().numel() == 0
                return
            want = full if sbp == S.broadcast else (
                (full if pos == 0 else np.zeros_like(full)) if sbp == S.partial_sum
                else np.take(full, range(pos * full.shape[sbp.dim] // n,
                                         (pos + 1) * full.shape[sbp.dim] // n), axis=sbp.dim))
            b = g.to_global(sbp=S.broadcast).to_local().numpy()
            np.testing.assert_array_equal(g.to_local().numpy(), want)
            np.testing.assert_allclose(b, full, rtol=1e-6)
        check(f"{tag}: randn_global {name}", run)


def grad_check():
    plc = placement("cpu", list(range(SIZE)))
    X = reference((2 * SIZE, 3))
    W = reference((2 * SIZE, 3), seed=5)
    x = pyflow.tensor(X, requires_grad=True)
    y = x.to_global(plc, S.broadcast).to_global(sbp=S.split(0)).to_local()
    (y * pyflow.tensor(piece(W, S.split(0), RANK, SIZE))).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), W)     # d(sum of every rank's loss)/dX
    z = pyflow.tensor(piece(X, S.partial_sum, RANK, SIZE), requires_grad=True)
    out = z.to_global(plc, S.partial_sum).to_global(sbp=S.broadcast).to_local()
    (out * pyflow.tensor(W)).sum().backward()
    # Every rank's loss is out . W with out = sum of the z pieces: the sum of the
    # SIZE losses has gradient SIZE * W with respect to each rank's z.
    np.testing.assert_array_equal(z.grad.numpy(), SIZE * W)


def expect_error(name, exc, match, fn):
    check(name, raises, exc, match, fn)


def errors():
    plc = placement("cpu", list(range(SIZE)))
    differing = pyflow.tensor([1.0, 2.0 + (RANK == SIZE - 1)])
    expect_error("broadcast of differing tensors", ValueError,
                 f"tensors of ranks [{SIZE - 1}] differ from rank 0's",
                 lambda: differing.to_global(plc, S.broadcast))
    ragged = pyflow.zeros(2 + RANK % 2, 2)
    expect_error("split of different shapes", ValueError, "same dtype and shape on every rank",
                 lambda: ragged.to_global(plc, S.split(0)))
    expect_error("uneven boxing", ValueError, "divisible",
                 lambda: pyflow.zeros(3, SIZE + 1).to_global(plc, S.broadcast)
                 .to_global(sbp=S.split(1)))
    expect_error("missing rank", ValueError, "do not exist",
                 lambda: pyflow.zeros(2).to_global(placement("cpu", [0, SIZE]), S.broadcast))
    g = pyflow.zeros(2).to_global(plc, S.broadcast)
    expect_error("numpy of global", RuntimeError, "to_global(sbp=pyflow.sbp.broadcast)",
                 lambda: g.numpy())
    check("placement change (reversed ranks)", lambda: np.testing.assert_array_equal(
        g.to_global(placement("cpu", list(range(SIZE))[::-1])).to_local().numpy(), [0, 0]))
    # The job is still usable after the errors: one more conversion works.
    check("usable after errors", lambda: np.testing.assert_array_equal(
        g.to_global(sbp=S.partial_sum).to_global(sbp=S.broadcast).to_local().numpy(), [0, 0]))


conversions(placement("cpu", list(range(SIZE))), "world")
if SIZE > 2:      # some ranks, in reverse order: position 0 is rank 2
    conversions(placement("cpu", [2, 0]), "ranks [2, 0]")
randn_checks(placement("cpu", list(range(SIZE))), "world")
if SIZE > 2:
    randn_checks(placement("cpu", [2, 0]), "ranks [2, 0]")
check("backward through boxing", grad_check)
errors()

check.report_and_exit()
