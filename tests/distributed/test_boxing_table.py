"""The boxing table: one ``(source SBP kind, target SBP kind) -> conversion`` row
drives both the boxing (which function runs) and its description (collective,
bytes per rank), for 1-D and N-D placements.

In process: the rows against the conversions the design names, a recording
communicator that checks each conversion calls exactly the collective
``describe`` names and hands it the buffer whose ring cost ``describe`` counts,
a patched row that every entry point (``boxing``, ``box``, ``describe``,
``describe_nd``, ``explain``'s boxing text) must follow, and the docs' copy of
the table.  The collectives themselves run on 2 and 4 ranks in
``global_worker.py``/``global2d_worker.py`` (test_global.py, test_global2d.py).
"""
import pathlib

import numpy as np
import pytest

import pyflow
from pyflow.distributed import boxing, placement
from pyflow.distributed import sbp as S
from pyflow.graph.explain import boxing_text

S0, S1, B, P = S.split(0), S.split(1), S.broadcast, S.partial_sum
SBPS = (S0, S1, B, P)
DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs" / "sbp.md"

# The design's table (ARCHITECTURE.md), written out here as the specification.
WANT = {("P", "B"): "all_reduce", ("P", "S"): "reduce_scatter", ("S", "B"): "all_gather",
        ("S", "S"): "all_to_all", ("B", "S"): "local_slice", ("B", "P"): "local_zero_fill",
        ("S", "P"): "local_zero_fill"}


def test_rows_are_the_designed_conversions():
    assert {k: row.collective for k, row in boxing.CONVERSIONS.items()} == WANT
    for (src, dst), row in boxing.CONVERSIONS.items():
        assert (row.src, row.dst) == (src, dst)
        assert isinstance(row, boxing.Conversion) and callable(row.run)
    assert [boxing.kind_of(s) for s in SBPS] == ["S", "S", "B", "P"]


@pytest.mark.parametrize("src", SBPS, ids=repr)
@pytest.mark.parametrize("dst", SBPS, ids=repr)
def test_every_sbp_pair_has_one_conversion(src, dst):
    row = boxing.conversion(src, dst)
    if src == dst:
        assert row is boxing.IDENTITY
    else:
        assert row is boxing.CONVERSIONS[boxing.kind_of(src), boxing.kind_of(dst)]


# ---------------------------------------------------------------- runs == described
class RecordingComm:
    """A communicator of ``size`` ranks in one process: records each collective
    and the bytes it was handed, and returns a piece of the right shape (the
    values are not the point here; global_worker.py checks them on real ranks)."""

    def __init__(self, size, rank=0):
        self.size, self.rank, self.calls = size, rank, []

    def _record(self, name, t):
        self.calls.append((name, t.numel() * t.dtype.itemsize))

    def all_reduce(self, t, check=True):
        self._record("all_reduce", t)
        return t

    def reduce_scatter(self, t, check=True):
        self._record("reduce_scatter", t)
        return pyflow.narrow(t, 0, 0, t.shape[0] // self.size).contiguous()

    def all_gather(self, t, check=True):
        self._record("all_gather", t)
        return pyflow.cat([t] * self.size, dim=0)

    def all_to_all(self, t, check=True):
        self._record("all_to_all", t)
        return t.clone()


def ring_bytes(collective, handed, n):
    """Bytes one rank sends in a ring collective handed ``handed`` bytes: all_reduce
    2(n-1)/n of its buffer, reduce_scatter (n-1)/n of it, all_gather and
    all_to_all (n-1) times / (n-1)/n of their (per-rank) piece."""
    return {"all_reduce": 2 * handed * (n - 1) // n,
            "reduce_scatter": handed * (n - 1) // n,
            "all_gather": handed * (n - 1),
            "all_to_all": handed * (n - 1) // n}[collective]


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("dtype", [pyflow.float32, pyflow.float64], ids=str)
@pytest.mark.parametrize("src", SBPS, ids=repr)
@pytest.mark.parametrize("dst", SBPS, ids=repr)
def test_boxing_calls_what_describe_names(src, dst, dtype, n):
    shape = (8, 16)
    comm = RecordingComm(n)
    piece = pyflow.zeros(boxing.local_shape(shape, (n,), src), dtype=dtype)
    out = boxing.boxing(piece, src, dst, comm)
    assert tuple(out.shape) == boxing.local_shape(shape, (n,), dst)
    cost = boxing.describe(src, dst, shape, dtype, n)
    if cost.op in ("identity", "local_slice", "local_zero_fill"):
        assert comm.calls == [] and cost.bytes == 0
    else:
        [(name, handed)] = comm.calls
        assert name == cost.op
        assert ring_bytes(name, handed, n) == cost.bytes


# ---------------------------------------------------------------- one table drives all
P11 = placement("cpu", [[0]])           # a world of one, 2-D


def test_a_changed_row_changes_boxing_and_its_description(monkeypatch):
    calls = []

    def run(x, comm, a, b):
        calls.append((a, b))
        return x * 2

    row = boxing.CONVERSIONS["P", "B"]._replace(collective="my_all_reduce",
                                                  bytes=lambda T, n: 7 * T, run=run)
    monkeypatch.setitem(boxing.CONVERSIONS, ("P", "B"), row)
    x = pyflow.ones(2, 3)
    np.testing.assert_array_equal(boxing.boxing(x, P, B, P11.sub_comm(0)).numpy(), 2.0)
    np.testing.assert_array_equal(boxing.box(x, P11, (P, S0), (B, S0)).numpy(), 2.0)
    assert calls == [(P, B), (P, B)]
    assert boxing.describe(P, B, (2, 3), pyflow.float32, 2) == ("my_all_reduce", 7 * 24)
    assert [tuple(s) for s in boxing.describe_nd((P, S0), (B, S0), (4, 3), pyflow.float32,
                                                 (2, 2))] == [(0, P, B, "my_all_reduce", 168)]
    assert boxing_text((P, S0), (B, S0), (4, 3), pyflow.float32, (2, 2)) == (
        "4x3 (P, S(0)) -> (B, S(0)): my_all_reduce, 168 bytes", 168)


def test_docs_print_the_table():
    text = DOCS.read_text()
    assert boxing.table_markdown() in text, "docs/sbp.md: paste boxing.table_markdown()"
    assert text.count("| from | to | collective |") == 1


# ---------------------------------------------------------------- the compile-time entry
def test_describe_nd_from_shapes_alone():
    """What a compile-time pass calls: sbp tuples, logical shape, dtype, axis sizes."""
    steps = boxing.describe_nd((S0, S1), (S1, S0), (8, 16), pyflow.float32, (2, 2))
    assert [tuple(s) for s in steps] == [(1, S1, B, "all_gather", 128),
                                         (0, S0, S1, "all_to_all", 128),
                                         (1, B, S0, "local_slice", 0)]
    assert steps == boxing.describe_nd((S0, S1), (S1, S0), (8, 16), pyflow.float32,
                                       placement("cpu", [[0, 1], [2, 3]]))
    assert boxing.describe_nd(P, B, (8, 16), pyflow.float32, (4,)) == \
        [(0, P, B, "all_reduce", 768)]
    assert boxing.describe_nd((B, S1), (B, S1), (8, 16), pyflow.float32, (2, 2)) == []
    # half floats are summed as float32: twice the bytes, for the reductions only
    assert boxing.describe_nd(P, S0, (8, 16), pyflow.bfloat16, (4,))[0].bytes == 384
    assert boxing.describe_nd(S0, B, (8, 16), pyflow.bfloat16, (4,))[0].bytes == 192


def test_run_step_runs_a_described_step_world_of_one():
    x = pyflow.arange(12.0).reshape(3, 4)
    for src, dst in [((P, S0), (B, S0)), ((S0, S1), (S1, B)), ((B, B), (P, S1))]:
        y = x
        for step in boxing.describe_nd(src, dst, (3, 4), pyflow.float32, P11):
            y = boxing.run_step(y, P11, step)
        np.testing.assert_array_equal(y.numpy(), x.numpy())
