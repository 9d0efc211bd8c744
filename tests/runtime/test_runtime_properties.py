"""Property: any random graph the runtime accepts gives the sequential answer,
never deadlocks, and never has more values in flight on an edge than its
registers; any graph it rejects really does deadlock when run unchecked."""
import time

from hypothesis import given
from hypothesis import strategies as st

from pyflow.runtime import NO_INITIAL, DeadlockError, GraphError, Port, Runtime, TaskGraph
from tests.runtime.conftest import stream_threads

STREAMS = ["compute", "copy", "comm", "data"]
DELAYS = [0.0, 0.0, 0.0001, 0.0005]


def make_fn(k, outputs, delay):
    def fn(*args):
        if delay:
            time.sleep(delay)
        v = ((k + 1) * sum(args) + k) % 997
        return v if outputs == 1 else (v, (3 * v + 1) % 997)
    return fn


@st.composite
def random_graphs(draw):
    """Sources s0.., actors a0..; a port with an initial value may feed any actor
    (even itself or an earlier one: a feedback edge); other ports only later ones."""
    n_iter = draw(st.integers(1, 5))
    n_sources = draw(st.integers(1, 2))
    n_actors = draw(st.integers(1, 6))
    sources = [dict(name=f"s{j}", values=[10 * j + i for i in range(n_iter)],
                    registers=draw(st.integers(1, 3)), stream=draw(st.sampled_from(STREAMS)))
               for j in range(n_sources)]
    actors = []
    for k in range(n_actors):
        outputs = draw(st.integers(1, 2))
        actors.append(dict(
            name=f"a{k}", outputs=outputs, stream=draw(st.sampled_from(STREAMS)),
            delay=draw(st.sampled_from(DELAYS)),
            registers=[draw(st.integers(1, 3)) for _ in range(outputs)],
            initial={i: draw(st.integers(0, 9)) for i in range(outputs)
                     if draw(st.integers(0, 3)) == 0}))
    for k, a in enumerate(actors):
        choices = [Port(s["name"]) for s in sources]
        for j, b in enumerate(actors):
            choices += [Port(b["name"], i) for i in range(b["outputs"])
                        if j < k or i in b["initial"]]
        a["inputs"] = draw(st.lists(st.sampled_from(choices), min_size=0, max_size=3))
    return n_iter, sources, actors


def build(sources, actors):
    g = TaskGraph()
    for s in sources:
        g.source(s["name"], s["values"], registers=s["registers"], stream=s["stream"])
    for k, a in enumerate(actors):
        g.actor(a["name"], make_fn(k, a["outputs"], a["delay"]),
                inputs=a["inputs"], outputs=a["outputs"], stream=a["stream"],
                registers=a["registers"],
                initial=a["initial"] if a["outputs"] > 1 else a["initial"].get(0, NO_INITIAL))
    ports = [Port(s["name"]) for s in sources] + [
        Port(a["name"], i) for a in actors for i in range(a["outputs"])]
    for p in ports:
        g.sink(f"sink_{p.actor}_{p.index}", p)
    return g, ports


def sequential(n_iter, sources, actors):
    """Evaluate iteration by iteration, actors in index order (they only read
    earlier actors within an iteration; initial-valued ports lag by one)."""
    out = {}                                  # Port -> list of values per iteration
    initial = {Port(a["name"], i): v for a in actors for i, v in a["initial"].items()}
    for s in sources:
        out[Port(s["name"])] = list(s["values"])

    def value(port, it):
        if port in initial:
            return initial[port] if it == 0 else out[port][it - 1]
        return out[port][it]

    for it in range(n_iter):
        for k, a in enumerate(actors):
            res = make_fn(k, a["outputs"], 0)(*[value(p, it) for p in a["inputs"]])
            res = (res,) if a["outputs"] == 1 else res
            for i, v in enumerate(res):
                out.setdefault(Port(a["name"], i), []).append(v)
    return {p: [value(p, it) for it in range(n_iter)] for p in out}


@given(random_graphs())
def test_random_graphs_match_sequential_evaluation(case):
    n_iter, sources, actors = case
    g, ports = build(sources, actors)
    try:
        rt = Runtime(g)
    except GraphError as exc:
        assert "deadlock" in str(exc)         # cycles always carry an initial value here
        # The build check is exact: unchecked, the same graph really deadlocks.
        try:
            Runtime(g, check=False).run(iterations=n_iter, timeout=20)
        except DeadlockError:
            return
        raise AssertionError(f"rejected graph ran to completion:\n{g}")
    result = rt.run(iterations=n_iter, timeout=20)
    expected = sequential(n_iter, sources, actors)
    for p in ports:
        assert result[f"sink_{p.actor}_{p.index}"] == expected[p], f"port {p}\n{g}"
    for edge, most in rt.stats.max_in_flight.items():
        assert most <= edge.registers, f"{edge}: {most} in flight > {edge.registers}\n{g}"
    assert not stream_threads()
