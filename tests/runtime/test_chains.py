"""merge_chains (pyflow/runtime/chains.py): a stream's consecutive actors run
as one chain actor with the same results, the same errors (naming the op) and
one trace slice per op; random graphs give the unmerged graph's answer."""
import pytest
from hypothesis import given

from pyflow.runtime import ActorError, Chain, Port, Runtime, TaskGraph, Tracer, merge_chains
from tests.runtime.test_runtime_properties import build, random_graphs, sequential


def _pipeline(fail_at=None):
    """data -> double -> inc (compute) -> copy_out (copy) -> square -> add (compute) -> out;
    ``add`` also reads ``double``'s value, from across the copy actor."""
    def inc(v):
        if v == fail_at:
            raise ValueError(f"bad value {v}")
        return v + 1
    g = TaskGraph()
    x = g.source("data", range(5), stream="data", registers=2)
    d = g.actor("double", lambda v: 2 * v, inputs=[x])
    i = g.actor("inc", inc, inputs=[d])
    c = g.actor("copy_out", lambda v: v, inputs=[i], stream="copy")
    s = g.actor("square", lambda v: v * v, inputs=[c])
    a = g.actor("add", lambda u, v: u + v, inputs=[s, d])
    g.sink("out", a)
    return g


def test_runs_of_one_stream_merge_and_results_stay():
    g = _pipeline()
    merged = merge_chains(g)
    assert list(merged.specs) == ["data", "double..inc", "copy_out", "square..add", "out"]
    chain = merged.specs["double..inc"].fn
    assert isinstance(chain, Chain) and chain.members == ["double", "inc"]
    # double's value leaves the chain (add reads it), so the chain has two outputs
    assert chain.outputs == [Port("double", 0), Port("inc", 0)]
    expected = Runtime(g).run(timeout=10)["out"]
    assert Runtime(merged).run(timeout=10)["out"] == expected == \
        [(2 * v + 1) ** 2 + 2 * v for v in range(5)]
    assert "double..inc  chain" in merged.describe() and "(2 ops)" in merged.describe()


def test_an_exception_names_the_op_inside_the_chain():
    with pytest.raises(ActorError, match=r"op 'inc' of actor 'double\.\.inc'.*bad value 4") \
            as info:
        Runtime(merge_chains(_pipeline(fail_at=4))).run(timeout=10)
    assert info.value.op == "inc" and info.value.actor == "double..inc"
    assert isinstance(info.value.__cause__, ValueError)


@pytest.mark.parametrize("returned", [(1, 2, 3), 7])
def test_a_member_returning_the_wrong_number_of_outputs_is_named(returned):
    """Members write their outputs into numbered slots: a wrong count must be an
    error naming the op, never values shifted into other members' slots."""
    g = TaskGraph()
    x = g.source("data", range(3), stream="data")
    g.actor("pair", lambda v: returned, inputs=[x], outputs=2)
    s = g.actor("sum", lambda a, b: a + b, inputs=[Port("pair", 0), Port("pair", 1)])
    g.sink("out", g.actor("after", lambda v: v, inputs=[s]))
    merged = merge_chains(g)
    assert isinstance(merged.specs["pair..after"].fn, Chain)
    with pytest.raises(ActorError, match=r"op 'pair' .*'pair' has 2 outputs.*got") as info:
        Runtime(merged).run(timeout=10)
    assert isinstance(info.value.__cause__, TypeError)


def test_trace_keeps_one_slice_per_op():
    tracer = Tracer()
    Runtime(merge_chains(_pipeline())).run(tracer=tracer, timeout=10)
    for op in ("double", "inc", "square", "add"):
        assert sorted(f["iteration"] for f in tracer.firings(op)) == [0, 1, 2, 3, 4]


def test_a_value_fed_back_inside_a_run_keeps_the_actors_apart():
    g = TaskGraph()
    x = g.source("data", range(4))
    s = g.actor("acc", lambda a, v: a + v, inputs=["scale", x], initial=0)
    g.actor("scale", lambda v: v, inputs=[s], registers=2)
    g.sink("out", s)
    merged = merge_chains(g)
    assert list(merged.specs) == list(g.specs)
    assert Runtime(merged).run(timeout=10)["out"] == Runtime(g).run(timeout=10)["out"] == \
        [0, 0, 1, 3, 6]        # the initial value, then the running sums


def test_a_token_fed_back_inside_a_run_is_kept_by_the_order():
    """The shape of a streaming training graph: forward waits for the last
    iteration's update by a control token with an initial value."""
    log = []
    g = TaskGraph()
    x = g.source("data", range(3), registers=2)
    f = g.actor("forward", lambda v: log.append(("f", v)) or v, inputs=[x],
                control=[Port("update", 0)])
    g.actor("update", lambda v: log.append(("u", v)), inputs=[f], initial=None, registers=2)
    merged = merge_chains(g)
    assert list(merged.specs) == ["data", "forward..update"]
    Runtime(merged).run(timeout=10)
    assert log == [("f", 0), ("u", 0), ("f", 1), ("u", 1), ("f", 2), ("u", 2)]


@given(random_graphs())
def test_random_graphs_merged_give_the_same_answer(case):
    n_iter, sources, actors = case
    g, ports = build(sources, actors)
    try:
        Runtime(g)
    except Exception:
        return                   # rejected graphs are test_runtime_properties' business
    result = Runtime(merge_chains(g)).run(iterations=n_iter, timeout=20)
    expected = sequential(n_iter, sources, actors)
    for p in ports:
        assert result[f"sink_{p.actor}_{p.index}"] == expected[p], f"port {p}\n{g}"


def test_merging_that_would_deadlock_is_not_done():
    """``late`` starts with its one register full (initial value), read by
    ``join`` only together with ``early``'s value: apart, ``early`` fires first;
    merged, the chain would wait for ``late``'s register, ``join`` for the chain."""
    g = TaskGraph()
    x = g.source("data", range(3))
    e = g.actor("early", lambda v: v, inputs=[x])
    lt = g.actor("late", lambda v: 10 * v, inputs=[x], initial=-1)
    j = g.actor("join", lambda u, w: (u, w), inputs=[e, lt], stream="copy")
    g.sink("out", j)
    assert merge_chains(g) is g
    assert Runtime(g).run(timeout=10)["out"] == [(0, -1), (1, 0), (2, 10)]
