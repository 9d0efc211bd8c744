"""Chains: consecutive actors of one stream merged into one actor.

All actors of a stream run on that stream's one thread (stream.py), one
firing at a time.  Between two of them that follow each other on the same
thread, the register messages buy nothing: no overlap is possible there, but
each firing still costs its messages (a RegisterReady per consumer, a
RegisterFree per input, their queueing), tens of microseconds of Python.  On
a GPT-mini training step that is ~350 actors, 20 ms a step, 9% of it.

OneFlow's actors are C++ and cost about a microsecond a firing; pyflow's
cost more, so lowering merges them, as OneFlow's compiler groups the ops of
one stream into chains: ``merge_chains(tg)`` replaces every maximal run of
consecutive plain actors (in the task graph's order, which lowering makes
topological) on one stream by one chain actor.  The chain fires when every
input its members read from outside is readable; it runs the members in
order, passing their values inside (each dropped after its last use, as the
sequential executor does), and writes the outputs read outside the chain.

What stays: sources, sinks and every actor on another stream (copies,
comm) keep their own actors and registers, so data loading still overlaps
compute, and a device copy still overlaps the compute stream.  An edge
back to an earlier member of the same chain (a streaming graph's per-
iteration token) is kept implicitly: the chain runs iteration i before
i + 1.  The trace still shows one slice per op, and an exception names the
op that raised (``ActorError.op``).

A chain runs as one generated Python function (``straight_line``): one line
per member, each value a local variable, ``del`` after its last use.  A
member whose function carries ``inline = (fn, template)`` is called as
``fn(...)`` with its arguments spelled out by the template (a kernel-level
plan's op reading a parameter's current array inline): no per-member list
building, indexing or wrapper call is left, which is what a compiled step of
many tiny ops costs (pyflow.graph.kernel_plan).  A traced run uses the slot
loop below instead, to time every member.

``pyflow.nn.Graph`` merges by default; ``graph.config.allow_fuse_actor_chains(False)``
keeps one actor per op (to watch every register move in a trace or in
``explain``).
"""
from time import perf_counter_ns

from .taskgraph import ActorSpec, GraphError, Port, TaskGraph, check_outputs


class ChainMemberError(Exception):
    """Carries the op of a chain that raised; the runtime unwraps it."""

    def __init__(self, op, exc):
        super().__init__(op)
        self.op = op
        self.exc = exc


class Chain:
    """The function of a chain actor: its members' functions run in order.

    ``members``: ActorSpecs in order.  ``inputs``: the external data Ports, in
    the chain actor's input order.  ``outputs``: the member Ports read outside.

    Values live in a list of slots, one per external input and member output,
    numbered here once: a firing indexes lists instead of hashing Ports (a
    ResNet-50 step runs 760 members, and Port is a dataclass whose hash is
    Python code).  A slot is cleared after its last reader inside the chain,
    so a chain holds no value longer than one actor per op would.
    """

    def __init__(self, members, inputs, outputs):
        self.members = [m.name for m in members]
        self.outputs = list(outputs)
        slot = {p: i for i, p in enumerate(inputs)}
        for m in members:
            for i in range(m.outputs):
                slot[Port(m.name, i)] = len(slot)
        keep = {slot[p] for p in outputs}
        last_use = {}
        for k, m in enumerate(members):
            for p in m.inputs:
                last_use[slot[p]] = k
        self._n_slots = len(slot)
        self._n_inputs = len(inputs)
        self._plan = []         # (name, fn, input slots, first output slot, outputs, drops)
        for k, m in enumerate(members):
            drop = tuple(i for i, last in last_use.items() if last == k and i not in keep)
            first = slot[Port(m.name, 0)] if m.outputs else None
            self._plan.append((m.name, m.fn, tuple(slot[p] for p in m.inputs), first,
                               m.outputs, drop))
        self._out_slots = tuple(slot[p] for p in outputs)
        self.tracer = None      # (tracer, stream name) while a traced run is on
        self._compiled = straight_line(self._plan, self._n_inputs, self._out_slots)

    def __call__(self, *values):
        if self.tracer is None:
            return self._compiled(*values)
        env = [None] * self._n_slots
        env[:self._n_inputs] = values
        trace = self.tracer
        for name, fn, ins, first, n_out, drop in self._plan:
            start = perf_counter_ns() if trace is not None else 0
            try:
                res = fn(*[env[i] for i in ins])
                if n_out > 1:
                    env[first:first + n_out] = check_outputs(name, n_out, res)
            except Exception as exc:
                raise ChainMemberError(name, exc) from exc
            if trace is not None:
                trace[0].record(name, trace[1], start, perf_counter_ns(), trace[2])
            if n_out == 1:
                env[first] = res
            res = None          # else it would keep this member's outputs alive through the next
            for i in drop:
                env[i] = None
        if len(self._out_slots) == 1:
            return env[self._out_slots[0]]
        return tuple(env[i] for i in self._out_slots)


def straight_line(plan, n_inputs, out_slots):
    """One Python function running ``plan`` (Chain's members: ``(name, fn, input
    slots, first output slot, outputs, slots to drop after it)``) on ``n_inputs``
    values; it returns the values of ``out_slots`` (one, or a tuple).  An
    exception in a member comes out as ``ChainMemberError`` naming it.

    Template items of an inlined member (``fn.inline = (fn, template)``): an int
    ``k`` (its k-th input), ``("data", k)`` (that input's ``._data``),
    ``("attr", obj, name)`` (``obj.name``, read at every call) or
    ``("const", value)``."""
    names = {"ChainMemberError": ChainMemberError, "check_outputs": check_outputs,
             "member_names": [m[0] for m in plan]}
    params = ", ".join(f"s{i}" for i in range(n_inputs))
    body = ["k = -1", "try:"]
    for k, (name, fn, ins, first, n_out, drop) in enumerate(plan):
        inline = getattr(fn, "inline", None)
        if inline is not None:
            fn, template = inline
            args = [_spelled(item, ins, names, f"c{k}_{j}") for j, item in enumerate(template)]
        else:
            args = [f"s{i}" for i in ins]
        names[f"f{k}"] = fn
        call = f"f{k}({', '.join(args)})"
        body.append(f"    k = {k}")
        if n_out == 0:
            body.append(f"    {call}")
        elif n_out == 1:
            body.append(f"    s{first} = {call}")
        else:       # an inlined member's own code returns its tuple: no check needed
            targets = ", ".join(f"s{first + j}" for j in range(n_out))
            body.append(f"    {targets} = {call}" if inline is not None else
                        f"    {targets} = check_outputs(member_names[k], {n_out}, {call})")
        body += [f"    del s{i}" for i in drop]
    body += ["except ChainMemberError:",       # a member that names its own failing op
             "    raise",
             "except Exception as exc:",
             "    raise ChainMemberError(member_names[k], exc) from exc"]
    outs = ", ".join(f"s{i}" for i in out_slots)
    body.append(f"return {outs}" if len(out_slots) == 1 else f"return ({outs}{',' if outs else ''})")
    source = f"def chain({params}):\n" + "\n".join("    " + line for line in body) + "\n"
    exec(compile(source, "<pyflow chain>", "exec"), names)  # noqa: S102 (code made here)
    fn = names.pop("chain")     # its globals need not hold it: no reference cycle
    fn.source = source
    return fn


def _spelled(item, ins, names, const_name):
    """The expression of one template item (see ``straight_line``)."""
    if type(item) is int:
        return f"s{ins[item]}"
    if item[0] == "data":
        return f"s{ins[item[1]]}._data"
    names[const_name] = item[1]
    if item[0] == "attr":
        return f"{const_name}.{item[2]}"
    return const_name


def merge_chains(tg):
    """A new TaskGraph with each run of consecutive same-stream actors merged
    (see the module doc); runs of one actor stay as they are.

    A chain fires only when every output it writes has a free register, which
    is stricter than its members were: around a cycle of initial values one
    member's full register could now hold back another member that a consumer
    waits for.  The merged graph is therefore checked (TaskGraph.check, exact);
    ``tg`` itself is returned when merging would deadlock it."""
    specs = list(tg.specs.values())
    runs, run = [], []
    for spec in specs:
        if spec.kind == "actor" and run and tg.stream_of(spec.name) == tg.stream_of(run[-1].name):
            run.append(spec)
        else:
            if run:
                runs.append(run)
            run = [spec] if spec.kind == "actor" else []
            if spec.kind != "actor":
                runs.append([spec])
    if run:
        runs.append(run)
    runs = [r for part in runs for r in _mergeable(part)]

    chain_of, port_map = {}, {}     # member name -> chain name; member Port -> chain Port
    consumers = {}                  # Port -> names of actors reading it (data or control)
    for spec in specs:
        for p in spec.inputs + spec.control:
            consumers.setdefault(p, set()).add(spec.name)
    plans = []
    for run in runs:
        if len(run) == 1:
            plans.append((run[0], None))
            continue
        name = f"{run[0].name}..{run[-1].name}"
        names = {m.name for m in run}
        for m in run:
            chain_of[m.name] = name
        outs = [Port(m.name, i) for m in run for i in range(m.outputs)
                if consumers.get(Port(m.name, i), set()) - names]
        for j, p in enumerate(outs):
            port_map[p] = Port(name, j)
        plans.append((run, (name, names, outs)))

    def mapped(p):
        return port_map.get(p, p)

    out = TaskGraph()
    for item, chain in plans:
        if chain is None:
            spec = item
            out._add(ActorSpec(spec.name, spec.kind, spec.fn, [mapped(p) for p in spec.inputs],
                               [mapped(p) for p in spec.control], spec.outputs, spec.stream,
                               list(spec.registers), dict(spec.initial), spec.iterable,
                               spec.iterations))
            continue
        name, names, outs = chain
        data, control = [], []
        for m in item:
            data += [p for p in m.inputs if p.actor not in names]
        data = list(dict.fromkeys(data))
        for m in item:
            control += [p for p in m.control
                        if p.actor not in names and p not in data]
        control = list(dict.fromkeys(control))
        by_name = {m.name: m for m in item}
        registers = [by_name[p.actor].registers[p.index] for p in outs]
        initial = {j: by_name[p.actor].initial[p.index] for j, p in enumerate(outs)
                   if p.index in by_name[p.actor].initial}
        fn = Chain(item, data, outs)
        out._add(ActorSpec(name, "actor", fn, [mapped(p) for p in data],
                           [mapped(p) for p in control], len(outs), item[0].stream,
                           registers, initial))
    try:
        out.check()
    except GraphError:
        return tg
    return out


def _mergeable(run):
    """The run, or its actors one by one when a member reads *data* that crosses
    iterations inside it: from a later member, or from a port with an initial
    value (read at iteration i, it holds iteration i-1's value; the chain
    would have to keep it between firings).  Lowering passes only control
    tokens across iterations, so its runs merge; hand-built graphs may not."""
    if len(run) < 2:
        return [run]
    position = {m.name: k for k, m in enumerate(run)}
    for k, m in enumerate(run):
        for p in m.inputs:
            at = position.get(p.actor)
            if at is not None and (at >= k or p.index in run[at].initial):
                return [[m] for m in run]
    return [run]
