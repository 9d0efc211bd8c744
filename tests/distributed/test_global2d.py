"""N-D placements, N-D (2-D) SBP boxing and placement changes.

The real check, ``global2d_worker.py``, runs under ``mpirun -n 4`` (one launch
for everything: launches cost seconds): every (src, dst) pair of 2-D SBPs
over {S0, S1, B, P} on a 2x2 placement, rebuilt from every rank's piece and
compared with the single-rank tensor; a reordered grid, a 3-D placement,
bfloat16/int64, randn_global, placement changes (disjoint, reordered, 1-D <->
2-D, to and from one rank) there and back, backward through a placement
change, and errors on every rank.  In-process tests cover the objects, the
shape rules, the boxing plan, ``describe_nd`` and a world of one.
"""
import os
import re

import numpy as np
import pytest

import pyflow
from pyflow.distributed import boxing, logical_shape, placement, randn_global
from pyflow.distributed import sbp as S

from ..rank_checks import assert_all_ranks_passed
from .test_distributed import HERE, pyflow_run

S0, S1, B, P = S.split(0), S.split(1), S.broadcast, S.partial_sum


@pytest.mark.cpu_only
def test_every_2d_boxing_and_placement_change_on_4_ranks():
    proc = pyflow_run(4, os.path.join(HERE, "global2d_worker.py"))
    assert_all_ranks_passed(proc, 4, 290)      # 16 x 16 pairs and the rest


# ---------------------------------------------------------------- placement objects
def test_nd_placement_objects():
    p = placement("cpu", [[0, 1], [2, 3]])
    assert (p.hierarchy, p.ndim, p.size, p.ranks, p.flat_ranks) == \
        ((2, 2), 2, 4, [[0, 1], [2, 3]], [0, 1, 2, 3])
    assert repr(p) == 'pyflow.placement(type="cpu", ranks=[[0, 1], [2, 3]])'
    assert p == placement("cpu", np.array([[0, 1], [2, 3]])) != placement("cpu", [0, 1, 2, 3])
    assert len({p, placement("cpu", ((0, 1), (2, 3))), placement("cpu", [[0, 1, 2, 3]])}) == 2
    assert [p.coords(r) for r in range(5)] == [(0, 0), (0, 1), (1, 0), (1, 1), None]
    cube = placement("cpu", [[[4], [1]], [[2], [0]]])
    assert cube.hierarchy == (2, 2, 1) and cube.coords(0) == (1, 1, 0)
    one = placement("cpu", [3, 1])
    assert (one.hierarchy, one.ranks, one.coords(1)) == ((2,), [3, 1], (1,))


@pytest.mark.parametrize("ranks, exc, message", [
    ([[0, 1], [2]], ValueError, "must be rectangular (every row the same length), got shapes "
                                "[[2], [1]] in ranks"),
    ([[0, 1], [1, 2]], ValueError, "distinct non-negative ints, got [[0, 1], [1, 2]]"),
    ([[0, 1], []], ValueError, "non-empty list of distinct non-negative ints, got ranks[1]=[]"),
    ([[0, -1]], ValueError, "distinct non-negative ints"),
    ([[0, 1.5]], ValueError, "distinct non-negative ints"),
    ("01", TypeError, "ranks must be a list of ints, got '01' (or a nested list of ints for "
                      "an N-D placement)"),
    ([], ValueError, "ranks must be a non-empty list of distinct non-negative ints, got []"),
])
def test_nd_placement_bad_ranks(ranks, exc, message):
    with pytest.raises(exc, match=re.escape(message)):
        placement("cpu", ranks)


def test_sub_comm_world_of_one():
    p = placement("cpu", [[0]])
    assert p.sub_comm(0).size == p.sub_comm(1).size == 1 and p.comm.size == 1
    assert placement("cpu", [0]).sub_comm(0) is placement("cpu", [0]).comm
    with pytest.raises(ValueError, match=re.escape("axis must be an int in [0, 2) for "
                                                   "hierarchy (1, 1), got 2")):
        p.sub_comm(2)
    with pytest.raises(ValueError, match=r"ranks \[1\] do not exist in a world of 1"):
        placement("cpu", [[0], [1]]).sub_comm(0)


# ---------------------------------------------------------------- shape rules
def test_local_and_logical_shape():
    h = (2, 2)
    assert boxing.local_shape((8, 6), h, (S0, S0)) == (2, 6)
    assert boxing.local_shape((8, 6), h, (S0, S1), (1, 1)) == (4, 3)
    assert boxing.local_shape((8, 6), h, (P, B)) == (8, 6)
    assert boxing.logical_shape_of((2, 6), h, (S0, S0)) == (8, 6)
    assert boxing.logical_shape_of((4, 3), placement("cpu", [[0, 1], [2, 3]]), (S1, S0)) == (8, 6)
    assert boxing.piece_offsets((8, 6), h, (S0, S0), (1, 1)) == [(0, 4, 4), (0, 2, 2)]
    with pytest.raises(ValueError, match=re.escape(
            "local_shape: sbp (pyflow.sbp.split(dim=0), pyflow.sbp.split(dim=0)) on hierarchy "
            "(2, 2): pyflow.sbp.split(dim=0) on axis 1 needs dim 0 of the piece (3, 6) (after "
            "the axes before it) divisible by 2; logical shape (6, 6)")):
        boxing.local_shape((6, 6), h, (S0, S0))
    with pytest.raises(ValueError, match="one entry per placement dimension \\(2\\), got 1"):
        boxing.local_shape((8, 6), h, S0)
    with pytest.raises(ValueError, match=r"split\(dim=2\) needs a tensor with more than 2 dims"):
        boxing.logical_shape_of((2, 6), h, (S.split(2), B))


def test_slice_piece_matches_numpy():
    full = pyflow.arange(48.0).reshape(8, 6)
    a = full.numpy()
    np.testing.assert_array_equal(boxing.slice_piece(full, (2, 2), (S0, S0), (1, 0)).numpy(),
                                  a[4:6])
    np.testing.assert_array_equal(boxing.slice_piece(full, (2, 2), (S1, S0), (0, 1)).numpy(),
                                  a[4:8, 0:3])
    np.testing.assert_array_equal(boxing.slice_piece(full, (2, 2), (P, S1), (1, 0)).numpy(),
                                  np.zeros((8, 3)))
    got = boxing.slice_piece(full, (2, 2), (B, B), (0, 0))
    assert got.data_ptr() != full.data_ptr(), "a new tensor, never a view"


# ---------------------------------------------------------------- the plan and its bytes
def test_plan_gathers_inner_splits_of_the_same_dim_first():
    assert boxing.plan((S0, S0), (S1, S1)) == [(1, S0, B), (0, S0, S1), (1, B, S1)]
    assert boxing.plan((B, S0), (S0, B)) == [(1, S0, B), (0, B, S0)]
    assert boxing.plan((S0, S1), (B, S1)) == [(0, S0, B)]            # S1 inside commutes
    assert boxing.plan((P, S0), (B, S0)) == [(0, P, B)]              # all_reduce of slices
    assert boxing.plan((S1, P), (S1, P)) == []


@pytest.mark.parametrize("src, dst, steps", [
    # 8 x 16 float32 = 512 bytes on a 2 x 2 placement
    ((S0, S0), (B, B), [(1, S0, B, "all_gather", 128), (0, S0, B, "all_gather", 256)]),
    ((P, P), (B, B), [(0, P, B, "all_reduce", 512), (1, P, B, "all_reduce", 512)]),
    ((B, S1), (S1, B), [(1, S1, B, "all_gather", 256), (0, B, S1, "local_slice", 0)]),
    ((S0, S1), (S1, S0), [(1, S1, B, "all_gather", 128), (0, S0, S1, "all_to_all", 128),
                          (1, B, S0, "local_slice", 0)]),
    ((P, S0), (S1, S0), [(0, P, S1, "reduce_scatter", 128)]),
    ((B, B), (B, B), []),
])
def test_describe_nd_bytes_per_rank(src, dst, steps):
    got = boxing.describe_nd(src, dst, (8, 16), pyflow.float32, (2, 2))
    assert [tuple(s) for s in got] == steps
    assert all(isinstance(s, boxing.BoxingStep) for s in got)


def test_describe_nd_1d_equals_describe():
    for src in (S0, S1, B, P):
        for dst in (S0, S1, B, P):
            got = boxing.describe_nd(src, dst, (8, 16), pyflow.bfloat16, (4,))
            want = boxing.describe(src, dst, (8, 16), pyflow.bfloat16, 4)
            assert sum(s.bytes for s in got) == want.bytes
            assert [s.op for s in got] == ([] if src == dst else [want.op])


# ---------------------------------------------------------------- a world of one
P11 = placement("cpu", [[0]])
PAIRS = [(a, b) for a in (S0, S1, B, P) for b in (S0, S1, B, P)]


@pytest.mark.parametrize("src", PAIRS[::3], ids=repr)
@pytest.mark.parametrize("dst", PAIRS[1::3], ids=repr)
def test_world_of_one_2d_conversions(src, dst):
    x = pyflow.arange(12.0).reshape(3, 4)
    g = x.to_global(P11, src)
    assert (g.placement, g.sbp, logical_shape(g)) == (P11, src, (3, 4))
    y = g.to_global(sbp=dst)
    assert (y.placement, y.sbp, logical_shape(y)) == (P11, dst, (3, 4))
    np.testing.assert_array_equal(y.to_local().numpy(), x.numpy())


def test_world_of_one_placement_change_and_randn():
    x = pyflow.arange(6.0).reshape(2, 3)
    g = x.to_global(placement("cpu", [0]), S1)
    y = g.to_global(placement=P11, sbp=(P, S0))
    assert (y.placement, y.sbp, logical_shape(y)) == (P11, (P, S0), (2, 3))
    np.testing.assert_array_equal(y.to_local().numpy(), x.numpy())
    pyflow.manual_seed(3)
    want = pyflow.randn(2, 4).numpy()
    pyflow.manual_seed(3)
    r = randn_global(2, 4, placement=P11, sbp=(S1, P))
    np.testing.assert_array_equal(r.to_local().numpy(), want)


def test_backward_through_placement_change_world_of_one():
    x = pyflow.randn(2, 4, dtype=pyflow.float64, requires_grad=True)
    y = x.to_global(placement("cpu", [0]), S1).to_global(placement=P11, sbp=(B, S0))
    (y.to_local() * 3).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), np.full((2, 4), 3.0))


def test_box_bad_arguments():
    x = pyflow.ones(2, 2)
    with pytest.raises(TypeError, match="box: placement must be a pyflow.placement, got 'cpu'"):
        boxing.box(x, "cpu", (B,), (S0,))
    with pytest.raises(ValueError, match=r"box: sbp must have one entry per placement "
                                         r"dimension \(2\), got 1"):
        boxing.box(x, P11, (B,), (S0, B))
    with pytest.raises(ValueError, match="needs sbp, got sbp=None"):
        x.to_global(P11, (B, B)).to_global(placement=placement("cpu", [0]))
