"""Lowering: a compiled Graph becomes a task graph of actors (pyflow.runtime).

* a source actor ``inputs`` yields the tuple of input tensors of each run,
  and ``unpack_inputs`` hands each one to its consumers (on stream ``data``
  when streaming batches from a loader, else on ``compute``);
* one actor per node, on stream ``copy`` for device transfers and ``compute``
  for everything else.  Its data inputs are the Values it reads (the
  registers between actors); a backward actor also reads its forward actor's
  autograd context, an extra output of that forward actor;
* side effects are ordered by control edges: reads and writes of each state
  tensor keep their program order (``assign``, batch_norm's running
  statistics), and the optimizer ``update`` waits for every actor without
  consumers (so for the whole iteration);
* a sink ``outputs`` collects what ``build()`` returns;
* then (``chains``, the default) each run of consecutive actors on one
  stream becomes one chain actor (pyflow.runtime.chains: on one thread the
  messages between them buy no overlap and cost ~50 us a firing).

Actors fire when their inputs are readable and their output registers free;
nothing else schedules them.  On a GPU the runtime links the streams' kernels
with CUDA events (pyflow.runtime.device), so ``copy`` and ``data`` overlap
``compute`` on the device too.  ``PYFLOW_TRACE=path.json`` writes a Chrome
trace of the firings (pyflow.runtime.trace).
"""
from ..ops.transfer import ToDevice
from ..runtime import NO_INITIAL, Port, Runtime, TaskGraph, completion_for, merge_chains
from ..tensor import Tensor
from .ir import substitute
from .kernel_plan import as_tensor


class _Feed:
    """The source's iterable: the inputs of the current run."""

    def __init__(self):
        self.items = []

    def __iter__(self):
        return iter(self.items)


def _stream(step):
    return "copy" if step.kind == "call" and step.node.target is ToDevice else "compute"


def lower(graph, steps, registers=1, streaming=False, chains=True):
    """Return (TaskGraph, feed, output Values) for ``graph``'s steps.

    ``streaming``: the task graph runs many iterations back to back (a data
    loader feeding it), with ``registers`` slots per edge so they overlap.
    Then every writer of state (the optimizer update, ``assign``, batch_norm)
    also emits a token that starts full (``initial``): each other actor
    touching that state at iteration i+1 waits for the writer's iteration i.
    That feedback edge is what keeps a pipelined training loop exact."""
    tg = TaskGraph()
    feed = _Feed()
    # One call's inputs are already in memory: a data stream would only add a
    # thread hand-off per run.  Streaming runs load the next batch there.
    data = "data" if streaming else "compute"
    src = tg.source("inputs", feed, stream=data, registers=max(registers, 2))
    n_in = len(graph.inputs)
    ports = {}
    if n_in:
        unpacked = tg.actor("unpack_inputs", lambda xs: tuple(xs) if n_in > 1 else xs[0],
                            inputs=[src], outputs=n_in, stream=data, registers=registers)
        unpacked = unpacked if n_in > 1 else (unpacked,)
        ports = {v.id: p for v, p in zip(graph.inputs, unpacked)}
    ctx_port, consumers = {}, {}
    after = _state_order(steps)
    feedback, last_writers = _feedback(graph, steps) if streaming else ({}, set())
    by_name = {st.name: st for st in steps}
    token_of = {}
    # Over global tensors any step may run a collective, and MPI needs every rank
    # to post them in the same order: each step then also waits for the one
    # before it (they share the compute stream's thread, so little is lost).
    ordered, previous = getattr(graph, "is_global", False), None
    for step in steps:
        node = step.node
        inputs = [ports[v.id] for v in step.feeds]
        if step.wants_ctx:
            inputs.append(ctx_port[node.attrs["forward"]])
        control = [] if inputs else [src]
        control += [Port(name, 0) for name in after.get(step.name, ())]
        if ordered and previous is not None:
            control.append(Port(previous, token_of[previous]))
        control += [Port(writer, _token_index(by_name[writer]))
                    for writer in feedback.get(step.name, ())]
        n_data = len(node.outputs) + (1 if step.emits_ctx else 0)
        writes_back = step.name in last_writers
        n = n_data + (1 if writes_back and n_data else 0)
        n = max(n, 1)       # side-effect actors emit a token other actors can wait for
        token_of[step.name] = n - 1 if n_data else 0
        if node.kind == "update":
            terminal = [name for name in token_of if name != step.name
                        and not consumers.get(name)]
            control += [Port(name, token_of[name]) for name in terminal]
        initial = {token_of[step.name]: None} if writes_back else NO_INITIAL
        tg.actor(step.name, _actor_fn(step, writes_back and n_data > 0), inputs=inputs,
                 outputs=n, stream=_stream(step), control=control, initial=initial,
                 registers=max(registers, 2) if writes_back else registers)
        for p in inputs + control:
            consumers.setdefault(p.actor, []).append(step.name)
        previous = step.name
        for i, v in enumerate(node.outputs):
            ports[v.id] = Port(step.name, i)
        if step.emits_ctx:
            ctx_port[node.id] = Port(step.name, len(node.outputs))
    out_values = [v for v in graph.output_values() if v.kind in ("input", "node")]
    if out_values:
        tg.sink("outputs", _gather(tg, [ports[v.id] for v in out_values], registers))
    return (merge_chains(tg) if chains else tg), feed, out_values


def _token_index(step):
    n_data = len(step.node.outputs) + (1 if step.emits_ctx else 0)
    return n_data if n_data else 0


def _writes(graph, step):
    """State Value ids ``step`` writes; the optimizer update writes every
    parameter that requires grad."""
    if step.kind == "update":
        return {v.id for v in graph.state if v.tensor.requires_grad}
    return {v.id for v in step.node.writes}


def _feedback(graph, steps):
    """({step name: [last writer of each state it touches]}, {last writers}):
    the waits across iterations."""
    last_writer, touches = {}, {}
    for step in steps:
        written = _writes(graph, step)
        for vid in written:
            last_writer[vid] = step.name
        touches[step.name] = written | {v.id for v in step.node.inputs if v.kind == "state"}
    out = {}
    for step in steps:
        writers = sorted({last_writer[v] for v in touches[step.name] if v in last_writer}
                         - {step.name})
        if writers:
            out[step.name] = writers
    return out, set(last_writer.values())


def _actor_fn(step, token):
    """The actor's function: the Step's outputs (one value or a tuple), plus a
    token when the actor feeds state writes forward (streaming).  A kernel-level
    step's own ``actor_fn`` is that function already (and a chain inlines it)."""
    if not token and hasattr(step, "actor_fn"):
        return step.actor_fn

    def run(*values):
        res = step(*values)
        if token:
            res = res + (None,)
        if not res:
            return None
        return res[0] if len(res) == 1 else res
    run.__name__ = step.name
    return run


def _state_order(steps):
    """{step name: names of steps it must wait for} so that reads and writes of
    each state tensor (assign, batch_norm's running statistics) happen in
    program order: a write after the reads before it, a read after the write
    before it."""
    after, last_writer, readers = {}, {}, {}
    for step in steps:
        node = step.node
        written = {v.id for v in node.writes}
        for v in node.inputs:
            if v.kind == "state" and v.id not in written and v.id in last_writer:
                after.setdefault(step.name, set()).add(last_writer[v.id])
        for v in node.inputs:
            if v.kind == "state" and v.id not in written:
                readers.setdefault(v.id, []).append(step.name)
        for vid in written:
            wait = set(readers.pop(vid, [])) | ({last_writer[vid]} if vid in last_writer else set())
            wait.discard(step.name)
            after.setdefault(step.name, set()).update(wait)
            last_writer[vid] = step.name
    return {k: sorted(v) for k, v in after.items()}


def one_chain(tg):
    """True when every actor of ``tg`` (sources and sinks aside) is one chain:
    then its nodes run in graph order, one iteration at a time, which the
    buffers of a kernel-level plan need."""
    return sum(spec.kind == "actor" for spec in tg.specs.values()) == 1


def _gather(tg, ports, registers):
    """One actor packing several output Values into a tuple for the sink."""
    return tg.actor("pack_outputs", lambda *vs: vs, inputs=ports, stream="compute",
                    registers=registers)


def _runtime(tg, plan):
    """A Runtime for ``tg``, with CUDA events between streams when ``plan``
    holds tensors on a GPU."""
    graph = plan.graph
    values = list(graph.inputs) + list(graph.state) + \
        [v for step in plan.steps for v in step.node.outputs]
    return Runtime(tg, device=completion_for({v.device for v in values}))


def run_actors(plan, inputs):
    """One run of ``plan``'s task graph on ``inputs``; returns build()'s outputs."""
    if getattr(plan, "_runtime", None) is None:
        tg, feed, out_values = plan.task_graph
        plan._runtime = (_runtime(tg, plan), feed, out_values)
    runtime, feed, out_values = plan._runtime
    feed.items = [tuple(inputs)]
    result = runtime.run(iterations=1)
    feed.items = []
    env = {}
    if out_values:
        (packed,) = result["outputs"]
        env = {v.id: x for v, x in zip(out_values, packed)}
    env.update({v.id: x for v, x in zip(plan.graph.inputs, inputs)})

    return substitute(plan.graph.outputs, lambda v: as_tensor(v, env.get(v.id)))


def run_stream(plan, batches, registers=2, signature=None):
    """Run ``plan`` once per item of ``batches`` (each a tuple of build()'s
    arguments) as one pipelined actor run: the ``inputs`` source pulls the next
    batch on the data stream while the compute stream works, up to
    ``registers`` iterations in flight.  Returns build()'s outputs per batch."""
    tg, feed, out_values = lower(plan.graph, plan.runnable_steps(), registers, streaming=True,
                                 chains=plan.fuse_actor_chains)
    if plan.kernel_plan and plan.fuse_actor_chains and not one_chain(tg):
        tg, feed, out_values = lower(plan.graph, plan.kernel_steps(pool=False), registers,
                                     streaming=True, chains=True)

    class Batches:
        def __iter__(self):
            for i, batch in enumerate(batches):
                batch = batch if isinstance(batch, (tuple, list)) else (batch,)
                if signature is not None and signature(batch) != signature.expected:
                    raise ValueError(
                        f"batch {i} does not match the compiled plan (shapes, dtypes, devices "
                        f"or non-tensor arguments differ from the first batch); use equal "
                        f"batch sizes, e.g. DataLoader(..., drop_last=True)")
                yield tuple(x for x in batch if isinstance(x, Tensor))
    feed.items = Batches()
    result = _runtime(tg, plan).run()
    outs = []
    packed_all = result.get("outputs", [])
    for k in range(len(packed_all) if out_values else 0):
        env = {v.id: x for v, x in zip(out_values, packed_all[k])}
        outs.append(substitute(plan.graph.outputs, lambda v: as_tensor(v, env.get(v.id))))
    return outs
