"""Global tensors: placement, SBP, eager boxing.

In-process tests cover the objects, argument errors, ``describe`` and a world
of one.  The real check, ``global_worker.py``, runs under ``mpirun -n 2`` and
``-n 4`` (through ``pyflow_run`` of test_distributed.py): every SBP pair
(S0, S1, B, P) on four dtypes against the single-rank tensor, randn_global,
backward through boxing, a sub-placement in reverse rank order, and errors
raised on every rank.
"""
import os
import pickle
import re

import numpy as np
import pytest

import pyflow
from pyflow.distributed import boxing, logical_shape, placement, randn_global
from pyflow.distributed import sbp as S

from ..rank_checks import assert_all_ranks_passed
from .test_distributed import HERE, pyflow_run

SBPS = [S.split(0), S.split(1), S.broadcast, S.partial_sum]


# ---------------------------------------------------------------- mpirun
@pytest.mark.cpu_only
@pytest.mark.parametrize("n", [2, 4])
def test_every_boxing_against_single_rank(n):
    proc = pyflow_run(n, os.path.join(HERE, "global_worker.py"))
    assert_all_ranks_passed(proc, n, 77)


# ---------------------------------------------------------------- sbp and placement
def test_sbp_objects():
    assert repr(S.split(1)) == "pyflow.sbp.split(dim=1)"
    assert (repr(S.broadcast), repr(S.partial_sum)) == ("pyflow.sbp.broadcast",
                                                        "pyflow.sbp.partial_sum")
    assert S.split(0) == S.split(0) != S.split(1) != S.broadcast != S.partial_sum
    assert len({S.split(0), S.split(0), S.broadcast, S.partial_sum}) == 3
    assert pickle.loads(pickle.dumps(S.broadcast)) is S.broadcast
    assert pickle.loads(pickle.dumps(S.split(2))) == S.split(2)
    with pytest.raises(AttributeError, match="immutable"):
        S.split(0).dim = 1


@pytest.mark.parametrize("dim", [-1, 1.0, "0", True, None])
def test_sbp_split_bad_dim(dim):
    with pytest.raises(ValueError, match=re.escape(f"sbp.split: dim must be a non-negative "
                                                   f"int, got {dim!r}")):
        S.split(dim)


def test_placement_objects():
    p = placement("cpu", [0, 1])
    assert repr(p) == 'pyflow.placement(type="cpu", ranks=[0, 1])'
    assert p == placement(type="cpu", ranks=(0, 1)) == placement("cpu", range(2))
    assert p != placement("cuda", [0, 1]) and p != placement("cpu", [1, 0])
    assert len({p, placement("cpu", [0, 1]), placement("cpu", [1])}) == 2
    assert (p.type, p.ranks, p.size, p.hierarchy) == ("cpu", [0, 1], 2, (2,))


def test_placement_bad_arguments():
    with pytest.raises(ValueError, match=r"type must be one of \('cpu', 'cuda'\), got 'tpu'"):
        placement("tpu", [0])
    with pytest.raises(ValueError, match=r"must be rectangular"):
        placement("cpu", [[0, 1], [2]])
    for bad in ([], [0, 0], [-1], [0.5]):
        with pytest.raises(ValueError, match=re.escape(f"distinct non-negative ints, got {bad!r}")):
            placement("cpu", bad)
    with pytest.raises(TypeError, match="ranks must be a list of ints, got 3"):
        placement("cpu", 3)
    with pytest.raises(ValueError, match=r"ranks \[5\] do not exist in a world of 1 rank"):
        pyflow.ones(2).to_global(placement("cpu", [0, 5]), S.broadcast)


# ---------------------------------------------------------------- a world of one
P1 = placement("cpu", [0])


@pytest.mark.parametrize("src", SBPS, ids=repr)
@pytest.mark.parametrize("dst", SBPS, ids=repr)
def test_world_of_one_conversions(src, dst):
    x = pyflow.arange(12.0).reshape(3, 4)
    g = x.to_global(P1, src)
    assert g.is_global and not x.is_global and x.placement is None and x.sbp is None
    assert (g.placement, g.sbp, logical_shape(g)) == (P1, (src,), (3, 4))
    y = g.to_global(sbp=dst)
    assert (y.placement, y.sbp, logical_shape(y)) == (P1, (dst,), (3, 4))
    np.testing.assert_array_equal(y.to_local().numpy(), x.numpy())
    assert y.to_local().is_local and y.to_local().data_ptr() == y.data_ptr()


def test_backward_through_boxing_world_of_one():
    x = pyflow.randn(2, 4, dtype=pyflow.float64, requires_grad=True)
    y = x.to_global(P1, S.split(1)).to_global(sbp=S.partial_sum).to_global(sbp=S.broadcast)
    (y.to_local() * 3).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), np.full((2, 4), 3.0))


def test_randn_global_equals_randn():
    pyflow.manual_seed(5)
    want = pyflow.randn(4, 6).numpy()
    for sbp in SBPS:
        pyflow.manual_seed(5)
        g = randn_global(4, 6, placement=P1, sbp=sbp, requires_grad=True)
        assert g.requires_grad and g.sbp == (sbp,)
        np.testing.assert_array_equal(g.to_local().detach().numpy(), want)


def test_global_refuses_implicit_gather():
    g = pyflow.ones(2).to_global(P1, S.split(0))
    for call in (g.numpy, g.tolist, lambda: np.asarray(g)):
        with pytest.raises(RuntimeError, match=re.escape(
                "global tensor: this rank only holds a piece (sbp (pyflow.sbp.split(dim=0),)). "
                "Call x.to_global(sbp=pyflow.sbp.broadcast).to_local().")):
            call()
    with pytest.raises(RuntimeError, match=r"item\(\) of a global tensor"):
        pyflow.ones(1).to_global(P1, S.broadcast).item()
    assert pyflow.ones(2).tolist() == [1.0, 1.0] and pyflow.ones(1).item() == 1.0


def test_to_global_bad_arguments():
    x = pyflow.ones(2, 2)
    with pytest.raises(ValueError, match="a local tensor needs both placement and sbp"):
        x.to_global(P1)
    with pytest.raises(TypeError, match=r"placement must be a pyflow.placement, got 'cpu'"):
        x.to_global("cpu", S.broadcast)
    with pytest.raises(TypeError, match=r"sbp must be pyflow.sbp.split\(dim\).* got 'B'"):
        x.to_global(P1, "B")
    with pytest.raises(TypeError, match=r"call it: pyflow.sbp.split\(0\)"):
        x.to_global(P1, S.split)
    with pytest.raises(ValueError, match=r"one entry per placement dimension \(1\), got 2"):
        x.to_global(P1, (S.broadcast, S.broadcast))
    with pytest.raises(ValueError, match=r"split\(dim=2\) needs a tensor with more than 2 "
                                         r"dims, got shape \(2, 2\)"):
        x.to_global(P1, S.split(2))
    with pytest.raises(ValueError, match=r"split\(dim=2\) needs a tensor with more than 2 dims"):
        x.to_global(P1, S.broadcast).to_global(sbp=S.split(2))
    with pytest.raises(RuntimeError, match="to_local: the tensor is not global"):
        x.to_local()
    with pytest.raises(NotImplementedError, match="changing the placement's device type"):
        x.to_global(P1, S.broadcast).to_global(placement("cuda", [0]))


# ---------------------------------------------------------------- describe
@pytest.mark.parametrize("src, dst, op, nbytes", [
    (S.partial_sum, S.broadcast, "all_reduce", 2 * 3 * 512 // 4),
    (S.partial_sum, S.split(0), "reduce_scatter", 3 * 512 // 4),
    (S.split(1), S.broadcast, "all_gather", 3 * 512 // 4),
    (S.split(0), S.split(1), "all_to_all", 3 * 512 // 16),
    (S.broadcast, S.split(0), "local_slice", 0),
    (S.broadcast, S.partial_sum, "local_zero_fill", 0),
    (S.split(0), S.partial_sum, "local_zero_fill", 0),
    (S.broadcast, S.broadcast, "identity", 0),
])
def test_describe_bytes_per_rank(src, dst, op, nbytes):
    # 8 x 16 float32 = 512 bytes over 4 ranks.
    assert boxing.describe(src, dst, (8, 16), pyflow.float32, 4) == (op, nbytes)


def test_describe_half_reductions_travel_as_float32():
    assert boxing.describe(S.partial_sum, S.broadcast, (8, 16), pyflow.bfloat16, 2).bytes == 512
    assert boxing.describe(S.split(0), S.broadcast, (8, 16), pyflow.bfloat16, 2).bytes == 128


@pytest.mark.slow
@pytest.mark.cpu_only
@pytest.mark.parametrize("n", [2, 4])
def test_ops_on_global_tensors_against_single_rank(n):
    """sbp_ops_worker.py: every op family under every input SBP, forward and
    backward, the deduction's choices, a tensor-parallel MLP and data-parallel
    training with global parameters, against one rank."""
    proc = pyflow_run(n, os.path.join(HERE, "sbp_ops_worker.py"))
    assert_all_ranks_passed(proc, n, 200)


@pytest.mark.slow
@pytest.mark.cpu_only
@pytest.mark.parametrize("n", [2, 4])
def test_every_op_on_global_tensors_against_single_rank(n):
    """sbp_every_op_worker.py: op by op, every Function class of pyflow.ops (and
    each unary elementwise op) under every input SBP, forward and backward, and
    in-place writes into split tensors; it fails if an op class has no case."""
    proc = pyflow_run(n, os.path.join(HERE, "sbp_every_op_worker.py"))
    assert_all_ranks_passed(proc, n, 500)
