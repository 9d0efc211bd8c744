"""TaskGraph: the actors, their streams and the register edges between them.

A TaskGraph is only a description; `Runtime(graph).run()` (runtime.py) turns
it into live actors and threads, as often as you like.

    g = TaskGraph()
    x = g.source("data", batches, stream="data", registers=2)     # -> Port
    h = g.actor("double", lambda v: v * 2, inputs=[x], registers=2)
    s = g.actor("add", lambda a, b: a + b, inputs=[h, x])
    g.sink("out", s)

A `Port` names one output of one actor ("double:0").  `g.actor(...)` returns
its Port, or a tuple of Ports when `outputs > 1`.  Inputs may name actors not
added yet (`"acc"` or `g.port("acc", 1)`): that is how feedback loops are
written.  Every output has its own register count (`registers`, an int or
one per output).

Feedback: an output with an `initial` value starts with one register already
full, so every consumer of that output reads the initial value at iteration 0
and the value written at iteration i-1 at iteration i.  A cycle of actors can
only run if one of its edges has such an initial value; a training graph
feeds the updated parameters of step i to step i+1 this way.

Control inputs (`control=[port]`) order firings like data inputs but pass no
value to the function.

`check()` (run by `Runtime`) rejects graphs that could never finish a single
iteration: a cycle without an initial value, or too few registers to move the
tokens around a cycle (a self-loop `acc -> acc` with an initial value needs 2
registers: one to read the old value while writing the new one).  The test is
exact: actors and register edges form a *marked graph* (a Petri net in which
every place has one producer and one consumer), which is live iff every actor
can fire once from the initial marking; firing them once greedily decides it.
"""
from dataclasses import dataclass, field


class GraphError(ValueError):
    """The task graph is malformed or could never run to completion."""


class _NoInitial:
    def __repr__(self):
        return "NO_INITIAL"


NO_INITIAL = _NoInitial()


def check_outputs(name, n, result):
    """``result`` as the values of actor ``name``'s ``n`` (> 1) outputs."""
    if not isinstance(result, (tuple, list)) or len(result) != n:
        got = f"{type(result).__name__} of length {len(result)}" \
            if isinstance(result, (tuple, list)) else type(result).__name__
        raise TypeError(f"actor '{name}' has {n} outputs, so its function must "
                        f"return a tuple of {n} values; got {got}")
    return result


@dataclass(frozen=True)
class Port:
    """Output `index` of actor `actor`."""
    actor: str
    index: int = 0

    def __str__(self):
        return f"{self.actor}:{self.index}"


@dataclass(frozen=True)
class Edge:
    """Producer output -> one input of a consumer; `registers` is the producer output's."""
    producer: Port
    consumer: str
    input: int             # index among the consumer's inputs (data first, then control)
    control: bool
    registers: int
    initial: bool

    def __str__(self):
        kind = "ctl" if self.control else "in"
        return f"{self.producer} -> {self.consumer}.{kind}{self.input}"


@dataclass
class ActorSpec:
    name: str
    kind: str              # "actor", "source" or "sink"
    fn: object
    inputs: list
    control: list
    outputs: int
    stream: str | None     # None: a sink placed on its producer's stream
    registers: list
    initial: dict = field(default_factory=dict)
    iterable: object = None
    iterations: int | None = None


def _as_port(ref, what):
    if isinstance(ref, Port):
        return ref
    if isinstance(ref, str):
        return Port(ref, 0)
    raise TypeError(f"{what} must be a Port (returned by TaskGraph.actor/source) or an "
                    f"actor name, got {type(ref).__name__}")


class TaskGraph:
    def __init__(self):
        self.specs = {}        # name -> ActorSpec, in insertion order

    # -- building ------------------------------------------------------------
    def actor(self, name, fn, inputs=(), *, outputs=1, stream="compute", registers=1,
              initial=NO_INITIAL, control=()):
        """Add an actor running `fn(*input values)`; returns its Port(s)."""
        if not callable(fn):
            raise TypeError(f"actor '{name}': fn must be callable, got {type(fn).__name__}")
        if not isinstance(outputs, int) or isinstance(outputs, bool) or outputs < 0:
            raise ValueError(f"actor '{name}': outputs must be an int >= 0, got {outputs!r}")
        regs = self._registers(name, registers, outputs)
        if initial is NO_INITIAL:
            init = {}
        elif outputs == 1:
            init = {0: initial}
        elif isinstance(initial, dict) and all(
                isinstance(k, int) and 0 <= k < outputs for k in initial):
            init = dict(initial)
        else:
            raise ValueError(f"actor '{name}' has {outputs} outputs: initial must be a dict "
                             f"{{output index: value}} with indices in [0, {outputs}), "
                             f"got {initial!r}")
        spec = ActorSpec(name, "actor", fn,
                         [_as_port(p, f"actor '{name}': input") for p in inputs],
                         [_as_port(p, f"actor '{name}': control input") for p in control],
                         outputs, self._stream(name, stream), regs, init)
        self._add(spec)
        ports = tuple(Port(name, i) for i in range(outputs))
        return ports[0] if outputs == 1 else ports

    def source(self, name, iterable, *, stream="data", registers=2, iterations=None):
        """Add a source producing one value per item of `iterable`.

        Each run calls `iter(iterable)` again: a list or range restarts, a
        generator or data-loader iterator continues where the last run stopped.
        `iterations` caps the values taken per run.
        """
        if not hasattr(iterable, "__iter__"):
            raise TypeError(f"source '{name}': iterable must be iterable, "
                            f"got {type(iterable).__name__}")
        if iterations is not None and (not isinstance(iterations, int) or iterations < 0):
            raise ValueError(f"source '{name}': iterations must be an int >= 0 or None, "
                             f"got {iterations!r}")
        spec = ActorSpec(name, "source", None, [], [], 1, self._stream(name, stream),
                         self._registers(name, registers, 1), iterable=iterable,
                         iterations=iterations)
        self._add(spec)
        return Port(name, 0)

    def sink(self, name, input, *, stream=None):
        """Add a sink collecting every value of `input`; `run()` returns them under `name`."""
        spec = ActorSpec(name, "sink", None, [_as_port(input, f"sink '{name}': input")], [],
                         0, None if stream is None else self._stream(name, stream), [])
        self._add(spec)

    def port(self, name, index=0):
        """A reference to output `index` of actor `name`, which may be added later."""
        return Port(name, index)

    def _add(self, spec):
        if not isinstance(spec.name, str) or not spec.name:
            raise ValueError(f"actor names must be non-empty strings, got {spec.name!r}")
        if spec.name in self.specs:
            raise GraphError(f"an actor named '{spec.name}' already exists")
        self.specs[spec.name] = spec

    @staticmethod
    def _registers(name, registers, outputs):
        regs = [registers] * outputs if isinstance(registers, int) else list(registers)
        if len(regs) != outputs or not all(
                isinstance(r, int) and not isinstance(r, bool) and r >= 1 for r in regs):
            raise ValueError(f"actor '{name}': registers must be an int >= 1 or a list of "
                             f"{outputs} such ints (one per output), got {registers!r}")
        return regs

    @staticmethod
    def _stream(name, stream):
        if not isinstance(stream, str) or not stream:
            raise ValueError(f"actor '{name}': stream must be a non-empty string, "
                             f"got {stream!r}")
        return stream

    # -- structure -----------------------------------------------------------
    def stream_of(self, name):
        spec = self.specs[name]
        if spec.stream is None:                      # a sink: beside its producer
            return self.stream_of(spec.inputs[0].actor)
        return spec.stream

    @property
    def streams(self):
        """Stream names, in order of first use."""
        return list(dict.fromkeys(self.stream_of(n) for n in self.specs))

    @property
    def edges(self):
        """Every edge, in actor order then input order (ports must resolve: see check)."""
        out = []
        for spec in self.specs.values():
            refs = [(p, False) for p in spec.inputs] + [(p, True) for p in spec.control]
            for i, (port, control) in enumerate(refs):
                prod = self.specs[port.actor]
                out.append(Edge(port, spec.name, i, control, prod.registers[port.index],
                                port.index in prod.initial))
        return out

    def check(self, liveness=True):
        """Raise GraphError unless every input resolves and (liveness) the graph can run."""
        for spec in self.specs.values():
            for port in spec.inputs + spec.control:
                prod = self.specs.get(port.actor)
                if prod is None:
                    raise GraphError(f"'{spec.name}' reads '{port}', but there is no actor "
                                     f"named '{port.actor}'")
                if not 0 <= port.index < prod.outputs:
                    raise GraphError(f"'{spec.name}' reads '{port}', but '{port.actor}' has "
                                     f"{prod.outputs} output(s)")
        if liveness:
            _check_cycles_have_initial_values(self)
            _check_one_round_fires(self)

    def never_ending(self):
        """Actors that could never end without an iteration cap, in graph order.

        An actor ends when an input ends or when all its consumers have ended
        (actor.py); sources end when their iterable does.  What cannot be
        reached that way, e.g. a loop fed by no source, would run forever.
        """
        ends = {n for n, spec in self.specs.items() if spec.kind == "source"}
        edges = self.edges
        changed = True
        while changed:
            changed = False
            for n in self.specs:
                if n in ends:
                    continue
                feeds = [e.consumer for e in edges if e.producer.actor == n]
                if any(e.producer.actor in ends for e in edges if e.consumer == n) or \
                        (feeds and all(c in ends for c in feeds)):
                    ends.add(n)
                    changed = True
        return [n for n in self.specs if n not in ends]

    # -- looking at it -------------------------------------------------------
    def describe(self):
        """Text listing actors with their streams, and edges with register counts."""
        n = len(self.streams)
        lines = [f"TaskGraph: {len(self.specs)} actors on {n} stream{'s' * (n != 1)} "
                 f"({', '.join(self.streams)})", "actors:"]
        width = max((len(n) for n in self.specs), default=0)
        swidth = max((len(s) for s in self.streams), default=0)
        for spec in self.specs.values():
            outs = ", ".join(
                f"out{i}[registers={r}{', initial' if i in spec.initial else ''}]"
                for i, r in enumerate(spec.registers)) or "no outputs"
            stream = self.stream_of(spec.name)
            members = getattr(spec.fn, "members", None)       # a chain actor (chains.py)
            kind = "chain" if members else spec.kind
            ops = f"  ({len(members)} ops)" if members else ""
            lines.append(f"  {spec.name:<{width}}  {kind:<6}  stream={stream:<{swidth}}"
                         f"  {outs}{ops}")
        lines.append("edges:")
        for e in self.edges:
            extra = (" initial" if e.initial else "") + (" control" if e.control else "")
            lines.append(f"  {str(e):<{2 * width + 12}}  registers={e.registers}{extra}")
        return "\n".join(lines)

    __str__ = describe

    def to_dot(self):
        """Graphviz text: one cluster per stream, edges labelled with register counts."""
        q = lambda s: '"' + str(s).replace("\\", "\\\\").replace('"', '\\"') + '"'  # noqa: E731
        shape = {"source": "invhouse", "sink": "house", "actor": "box"}
        lines = ["digraph taskgraph {", "  rankdir=LR;", "  node [fontname=Helvetica];"]
        for i, stream in enumerate(self.streams):
            lines.append(f"  subgraph cluster_{i} {{")
            lines.append(f"    label={q('stream ' + stream)}; style=rounded;")
            for spec in self.specs.values():
                if self.stream_of(spec.name) == stream:
                    lines.append(f"    {q(spec.name)} [shape={shape[spec.kind]}];")
            lines.append("  }")
        for e in self.edges:
            label = f"{e.producer.index}: r={e.registers}" + (", initial" if e.initial else "")
            style = ", style=dashed" if e.control else ""
            style += ", color=red" if e.initial else ""
            lines.append(f"  {q(e.producer.actor)} -> {q(e.consumer)} [label={q(label)}{style}];")
        lines.append("}")
        return "\n".join(lines) + "\n"


def _check_cycles_have_initial_values(graph):
    """A cycle whose edges all start empty can never fire: find one and say so."""
    succ = {n: [] for n in graph.specs}
    for e in graph.edges:
        if not e.initial:
            succ[e.producer.actor].append(e.consumer)
    color, stack = {}, []

    def visit(n):                 # iterative DFS would be longer; graphs here are small
        color[n] = "grey"
        stack.append(n)
        for m in succ[n]:
            if color.get(m) == "grey":
                cycle = stack[stack.index(m):] + [m]
                raise GraphError(
                    "cycle without an initial value: " + " -> ".join(cycle) + ". No actor on "
                    "it can ever fire, since each waits for the one before; give one output "
                    "on the cycle an initial value (initial=...) so the first iteration can "
                    "start")
            if m not in color:
                visit(m)
        stack.pop()
        color[n] = "black"

    for n in graph.specs:
        if n not in color:
            visit(n)


def _check_one_round_fires(graph):
    """Play one round of the token game; every actor must fire once (see module doc)."""
    edges = graph.edges
    tokens = [1 if e.initial else 0 for e in edges]
    ins = {n: [] for n in graph.specs}
    outs = {n: [] for n in graph.specs}
    for i, e in enumerate(edges):
        ins[e.consumer].append(i)
        outs[e.producer.actor].append(i)

    def enabled(n):
        return all(tokens[i] > 0 for i in ins[n]) and \
            all(tokens[i] < edges[i].registers for i in outs[n])

    waiting = list(graph.specs)
    progress = True
    while waiting and progress:
        progress = False
        for n in list(waiting):
            if enabled(n):
                for i in ins[n]:
                    tokens[i] -= 1
                for i in outs[n]:
                    tokens[i] += 1
                waiting.remove(n)
                progress = True
    if waiting:
        reasons = []
        for n in waiting:
            for i in ins[n]:
                if tokens[i] == 0:
                    reasons.append(f"'{n}' waits for a value from '{edges[i].producer}'")
            for i in outs[n]:
                if tokens[i] >= edges[i].registers:
                    reasons.append(f"'{n}' waits for a free register of '{edges[i].producer}' "
                                   f"(registers={edges[i].registers}, all unread by "
                                   f"'{edges[i].consumer}')")
        raise GraphError(
            f"deadlock: actors {waiting} can never complete their first iteration: "
            + "; ".join(reasons) + ". Around a cycle, values need a free register to move "
            "into: raise `registers` on an output of the cycle (a self-loop with an initial "
            "value needs registers=2)")
