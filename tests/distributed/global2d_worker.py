"""Run under ``mpirun -n 4 python global2d_worker.py``: N-D placements, N-D boxing,
placement changes and randn_global, checked on every rank against the
single-rank tensor.

How a result is checked: every rank's piece is gathered (mpi4py's pickled
``allgather``, independent of the code under test) and ``assemble`` rebuilds
the logical tensor from the pieces with NumPy, by the nd-sbp rule (axis 0's
SBP applies first, then axis 1's on that piece): split pieces are
concatenated, broadcast pieces must be *equal* and partial pieces are summed.
That rebuilt tensor must equal X exactly (integer-valued float64 data).  Ends
with ``rank r: N checks, F failures``.
"""
import itertools
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tests.rank_checks import RankChecks, raises  # noqa: E402

import numpy as np  # noqa: E402

import pyflow  # noqa: E402
import pyflow.comm as comm  # noqa: E402
from pyflow.distributed import boxing, env, logical_shape, placement, randn_global  # noqa: E402
from pyflow.distributed import sbp as S  # noqa: E402

RANK, SIZE = env.get_rank(), env.get_world_size()
assert SIZE == 4, "global2d_worker.py runs on 4 ranks"
W = comm.world()
SBPS = {"S0": S.split(0), "S1": S.split(1), "B": S.broadcast, "P": S.partial_sum}
GRID = placement("cpu", [[0, 1], [2, 3]])
check = RankChecks(RANK)


def reference(shape, seed=0):
    return np.random.default_rng(seed).integers(-50, 50, shape).astype(np.float64)


def piece_np(X, hierarchy, sbp, coords, seed=100):
    """The piece at ``coords`` of X under nd-sbp, in NumPy (P: a coordinate-dependent
    split of the current piece whose parts sum to it)."""
    cur = X
    for axis, (s, n, c) in enumerate(zip(sbp, hierarchy, coords)):
        if s == S.partial_sum:
            parts = [reference(cur.shape, seed + 10 * axis + k) for k in range(n - 1)]
            cur = parts[c] if c < n - 1 else cur - sum(parts, np.zeros_like(cur))
        elif s.is_split:
            size = cur.shape[s.dim] // n
            cur = np.take(cur, range(c * size, (c + 1) * size), axis=s.dim)
    return cur


def assemble(pieces, hierarchy, sbp):
    """The logical tensor from ``{coords: piece}`` (NumPy, the rule of the docstring)."""
    if not hierarchy:
        return pieces[()]
    subs = [assemble({k[1:]: v for k, v in pieces.items() if k[0] == c}, hierarchy[1:], sbp[1:])
            for c in range(hierarchy[0])]
    s = sbp[0]
    if s.is_split:
        return np.concatenate(subs, axis=s.dim)
    if s == S.partial_sum:
        return sum(subs[1:], subs[0].copy())
    for c, sub in enumerate(subs[1:], 1):
        np.testing.assert_array_equal(sub, subs[0], err_msg=f"broadcast replica {c} differs")
    return subs[0]


def as_float64(t):
    t = t.to_local() if t.is_global else t
    return np.asarray(t.float() if t.dtype is pyflow.bfloat16 else t, np.float64)


def gathered(y, plc):
    """Every rank's piece (collective over the world), assembled for ``plc``."""
    mine = as_float64(y) if plc.comm is not None else None
    everyone = W.mpi.allgather(mine)
    return assemble({plc.coords(r): everyone[r] for r in plc.flat_ranks}, plc.hierarchy,
                    y.sbp)


def assert_global(y, X, plc, sbp):
    """Collective: gather first, assert after (a failed assertion on one rank must
    not leave the others waiting in a collective)."""
    got = gathered(y, plc)
    assert y.is_global and y.placement == plc and y.sbp == tuple(sbp), (y.placement, y.sbp)
    if plc.comm is not None:
        assert logical_shape(y) == X.shape, (logical_shape(y), X.shape)
        assert tuple(y.to_local().shape) == boxing.local_shape(X.shape, plc, sbp)
    else:
        assert y.to_local().numel() == 0
    np.testing.assert_array_equal(got, X)


def make_global(X, plc, sbp, dtype=pyflow.float64):
    coords = plc.coords()
    local = piece_np(X, plc.hierarchy, sbp, coords) if coords is not None else X
    return pyflow.tensor(local).to(dtype).to_global(plc, sbp)


# ---------------------------------------------------------------- placements
def placement_checks():
    assert GRID.hierarchy == (2, 2) and GRID.ranks == [[0, 1], [2, 3]] and GRID.size == 4
    assert GRID.flat_ranks == [0, 1, 2, 3] and GRID.coords() == divmod(RANK, 2)
    assert repr(GRID) == 'pyflow.placement(type="cpu", ranks=[[0, 1], [2, 3]])'
    row, col = GRID.sub_comm(1), GRID.sub_comm(0)            # axis 1: my row; axis 0: column
    assert (row.size, row.rank, col.size, col.rank) == (2, RANK % 2, 2, RANK // 2)
    assert GRID.sub_comm(-1) is row and GRID.comm.size == 4
    assert placement("cpu", [[0, 1], [2, 3]]).sub_comm(1) is row, "cached per rank layout"
    got = row.all_gather(pyflow.tensor([float(RANK)])).tolist()
    assert got == [float(RANK - RANK % 2), float(RANK - RANK % 2 + 1)], got
    got = col.all_gather(pyflow.tensor([float(RANK)])).tolist()
    assert got == [float(RANK % 2), float(RANK % 2 + 2)], got
    # A transposed grid: axis 0 of [[3, 1], [2, 0]] pairs 3 with 2 and 1 with 0.
    odd = placement("cpu", [[3, 1], [2, 0]])
    got = odd.sub_comm(0).all_gather(pyflow.tensor([float(RANK)])).tolist()
    assert got == {3: [3.0, 2.0], 2: [3.0, 2.0], 1: [1.0, 0.0], 0: [1.0, 0.0]}[RANK], got
    # Ranks outside a placement get None from every communicator.
    half = placement("cpu", [[2], [0]])
    subs = (half.comm, half.sub_comm(0), half.sub_comm(1))
    if RANK in (0, 2):
        assert subs[0].size == 2 and subs[1].size == 2 and subs[2].size == 1
    else:
        assert subs == (None, None, None)


# ---------------------------------------------------------------- boxing
def every_pair(plc, tag, dtypes=(pyflow.float64,)):
    """Every (src, dst) pair of nd-sbps over {S0, S1, B, P}, against X."""
    X = reference((4, 4, 3))
    names = list(SBPS)
    for dtype in dtypes:
        for src_names in itertools.product(names, repeat=plc.ndim):
            src = tuple(SBPS[n] for n in src_names)
            x = None

            def build():
                nonlocal x
                x = make_global(X, plc, src, dtype)
                assert_global(x, X, plc, src)
            check(f"{tag} {dtype} build {src_names}", build)
            for dst_names in itertools.product(names, repeat=plc.ndim):
                dst = tuple(SBPS[n] for n in dst_names)
                check(f"{tag} {dtype} {src_names} -> {dst_names}",
                      lambda: assert_global(x.to_global(sbp=dst), X, plc, dst))


def order_rule():
    """(S0, S0) on [[0, 1], [2, 3]] is S0 on [0, 1, 2, 3]: axis 0 slices first."""
    X = reference((8, 2))
    x = make_global(X, GRID, (S.split(0), S.split(0)))
    np.testing.assert_array_equal(x.to_local().numpy(), X[2 * RANK:2 * RANK + 2])
    assert boxing.piece_offsets((8, 2), GRID, (S.split(0), S.split(0)), (1, 0)) == \
        [(0, 4, 4), (0, 0, 2)]     # offsets within the previous piece
    y = x.to_global(sbp=(S.split(1), S.split(0)))           # through a gather of axis 1
    np.testing.assert_array_equal(y.to_local().numpy(), X[4 * (RANK % 2):4 * (RANK % 2) + 4,
                                                          RANK // 2:RANK // 2 + 1])


def box_is_boxing_in_1d():
    line = placement("cpu", [0, 1, 2, 3])
    x = pyflow.tensor(reference((4, 3))[RANK:RANK + 1])
    a = boxing.box(x, line, (S.split(0),), (S.broadcast,))
    b = boxing.boxing(x, S.split(0), S.broadcast, line.comm)
    np.testing.assert_array_equal(a.numpy(), b.numpy())
    np.testing.assert_array_equal(a.numpy(), reference((4, 3)))


def three_d():
    cube = placement("cpu", [[[0], [1]], [[2], [3]]])       # hierarchy (2, 2, 1)
    X = reference((4, 4, 2), seed=3)
    for src, dst in [((S.split(0), S.split(0), S.broadcast), (S.split(1), S.partial_sum,
                                                              S.split(0))),
                     ((S.partial_sum, S.split(1), S.split(1)), (S.broadcast,) * 3)]:
        x = make_global(X, cube, src)
        assert_global(x.to_global(sbp=dst), X, cube, dst)


# ---------------------------------------------------------------- randn_global
def randn_checks():
    pyflow.manual_seed(11)
    full = pyflow.randn(4, 8).numpy()
    for names in [("S0", "S1"), ("S1", "S1"), ("P", "S0"), ("B", "P"), ("B", "B")]:
        sbp = tuple(SBPS[n] for n in names)

        def run():
            pyflow.manual_seed(11)
            g = randn_global(4, 8, placement=GRID, sbp=sbp)
            want = piece_np(full, GRID.hierarchy, tuple(S.broadcast if s == S.partial_sum
                                                        else s for s in sbp), GRID.coords())
            if any(s == S.partial_sum and c for s, c in zip(sbp, GRID.coords())):
                want = np.zeros_like(want)
            np.testing.assert_array_equal(g.to_local().numpy(), want)
            assert_global(g, full.astype(np.float64), GRID, sbp)
        check(f"randn_global {names}", run)


# ---------------------------------------------------------------- placement changes
MOVES = [  # (src placement, src sbp, dst placement, dst sbp)
    ([0, 1], ("S0",), [2, 3], ("S0",)),                      # disjoint ranks
    ([0, 1], ("P",), [1, 0], ("S1",)),                       # same ranks, other order
    ([[0, 1], [2, 3]], ("S0", "S1"), [3], ("B",)),           # 2-D to a single rank
    ([0, 1, 2, 3], ("S1",), [[3, 2], [1, 0]], ("S1", "P")),  # 1-D to 2-D, reordered
    ([2], ("B",), [[0, 1], [2, 3]], ("P", "S0")),            # one rank to 2-D
    ([[0, 1], [2, 3]], ("B", "P"), [[1], [3]], ("S0", "B")),  # overlapping, 2-D to 2-D
]


def move_checks():
    X = reference((4, 4, 3), seed=9)
    for a, a_sbp, b, b_sbp in MOVES:
        pa, pb = placement("cpu", a), placement("cpu", b)
        sa, sb = tuple(SBPS[n] for n in a_sbp), tuple(SBPS[n] for n in b_sbp)

        def run():
            x = make_global(X, pa, sa)
            y = x.to_global(placement=pb, sbp=sb)
            assert_global(y, X, pb, sb)
            z = y.to_global(placement=pa, sbp=sa)            # and back
            assert_global(z, X, pa, sa)
        check(f"move {a} {a_sbp} -> {b} {b_sbp}", run)
    # A missing sbp keeps the current one (same number of dims).
    check("move keeps sbp", lambda: assert_global(
        make_global(X, placement("cpu", [3, 1]), (S.split(1),)).to_global(
            placement=placement("cpu", [0, 2])), X, placement("cpu", [0, 2]), (S.split(1),)))
    check("move bfloat16", lambda: assert_global(
        make_global(X, GRID, (S.split(0), S.broadcast), pyflow.bfloat16).to_global(
            placement=placement("cpu", [1, 3]), sbp=S.split(1)), X, placement("cpu", [1, 3]),
        (S.split(1),)))


def move_backward():
    """loss = sum over the ranks of the destination of (y . Wt), y = X replicated:
    dloss/dX = (number of destination ranks) * Wt, each source rank's slice."""
    X, Wt = reference((4, 3)), reference((4, 3), seed=5)
    src, dst = placement("cpu", [0, 1]), placement("cpu", [[1], [2]])
    x = pyflow.tensor(piece_np(X, (2,), (S.split(0),), (RANK % 2,)), requires_grad=True)
    y = x.to_global(src, S.split(0)).to_global(placement=dst, sbp=(S.broadcast, S.broadcast))
    local = y.to_local()
    if RANK == 3:                        # in neither placement: nothing to differentiate
        assert not local.requires_grad and local.numel() == 0
        return
    loss = (local * pyflow.tensor(Wt)).sum() if RANK in (1, 2) else local.sum()
    loss.backward()
    if RANK in (0, 1):
        np.testing.assert_array_equal(x.grad.numpy(), 2 * Wt[2 * RANK:2 * RANK + 2])
    else:
        assert x.grad is None


def boxing_backward():
    """loss = sum over the 4 ranks of (y . Wt piece), y = X as (B, S1): X is used
    twice (axis 0 replicates), so d loss / dX = 2 Wt, each rank's (S0, B) rows."""
    a, b = GRID.coords()
    X, Wt = reference((4, 4)), reference((4, 4), seed=5)
    x = pyflow.tensor(X[2 * a:2 * a + 2], requires_grad=True)
    y = x.to_global(GRID, (S.split(0), S.broadcast)).to_global(sbp=(S.broadcast, S.split(1)))
    (y.to_local() * pyflow.tensor(Wt[:, 2 * b:2 * b + 2])).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), 2 * Wt[2 * a:2 * a + 2])


# ---------------------------------------------------------------- errors
def errors():
    X = reference((4, 4, 3))
    raise_ = lambda name, exc, match, fn: check(name, raises, exc, match, fn)  # noqa: E731
    raise_("uneven 2-D split", ValueError, "split(dim=1) on axis 1 needs dim 1 of the piece "
           "(4, 1, 3) (after the axes before it) divisible by 2; logical shape (4, 2, 3)",
           lambda: make_global(X[:, :2], GRID, (S.broadcast, S.broadcast))
           .to_global(sbp=(S.split(1), S.split(1))))
    raise_("sbp per axis", ValueError, "one entry per placement dimension (2), got 1",
           lambda: pyflow.ones(2).to_global(GRID, S.broadcast))
    differing = pyflow.tensor([1.0, float(RANK == 3)])      # equal within rows: (S0, B) fails
    raise_("broadcast axis differs", ValueError, "rank 3 differs from rank 2",
           lambda: differing.to_global(GRID, (S.split(0), S.broadcast)))
    check("differs only along a split axis is fine", lambda: pyflow.tensor(
        [float(RANK // 2)]).to_global(GRID, (S.split(0), S.broadcast)))
    g = make_global(X, GRID, (S.broadcast, S.broadcast))
    raise_("ndim change needs sbp", ValueError, "needs sbp, got sbp=None",
           lambda: g.to_global(placement=placement("cpu", [0, 1])))
    raise_("device type change", NotImplementedError, "changing the placement's device type",
           lambda: g.to_global(placement=placement("cuda", [[0, 1], [2, 3]])))
    raise_("ragged placement", ValueError, "rectangular",
           lambda: placement("cpu", [[0, 1], [2]]))
    raise_("sub_comm axis", ValueError, "axis must be an int in [0, 2)",
           lambda: GRID.sub_comm(2))
    check("usable after errors", lambda: assert_global(
        g.to_global(sbp=(S.partial_sum, S.split(1))), X, GRID, (S.partial_sum, S.split(1))))


check("placements and sub-communicators", placement_checks)
check("nd-sbp order rule", order_rule)
check("box is boxing on 1-D", box_is_boxing_in_1d)
every_pair(GRID, "2x2")
every_pair(placement("cpu", [[3, 1], [0, 2]]), "2x2 reordered", ())        # builds only
check("some pairs on [[3, 1], [0, 2]]", lambda: [assert_global(
    make_global(reference((4, 4, 3)), placement("cpu", [[3, 1], [0, 2]]), (a, b)).to_global(
        sbp=(b, a)), reference((4, 4, 3)), placement("cpu", [[3, 1], [0, 2]]), (b, a))
    for a, b in [(S.split(0), S.split(1)), (S.partial_sum, S.split(0)),
                 (S.split(1), S.broadcast)]])
check("bfloat16 and int64 pairs", lambda: [assert_global(
    make_global(reference((4, 4, 3)), GRID, src, dt).to_global(sbp=dst), reference((4, 4, 3)),
    GRID, dst) for dt in (pyflow.bfloat16, pyflow.int64)
    for src, dst in [((S.split(0), S.split(0)), (S.split(1), S.partial_sum)),
                     ((S.partial_sum, S.partial_sum), (S.split(0), S.split(0)))]])
check("3-D placement", three_d)
randn_checks()
move_checks()
check("backward through a placement change", move_backward)
check("backward through 2-D boxing", boxing_backward)
errors()
W.barrier()
check.report_and_exit()
