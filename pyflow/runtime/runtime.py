"""Runtime: build live actors and stream threads from a TaskGraph, and run them.

    result = Runtime(graph).run()                 # {sink name: [value per iteration]}
    result = Runtime(graph).run(iterations=10, timeout=30, tracer=Tracer())

`Runtime(graph)` checks the graph once (taskgraph.py: every input resolves,
no cycle without an initial value, enough registers to go round every cycle).
Each `run()` then creates fresh actors, preloads the initial values, sends
every actor `Start`, and runs one message loop per stream; from then on the
actors only react to each other's messages.  The caller's own thread runs the
loop of the ``compute`` stream (``run(caller_stream=...)`` names another, or
None for none) and every other stream gets a pooled thread (stream.py).

Why the caller runs compute: OpenMP (numba's parallel loops, MKL) keeps a
team of worker threads per calling thread.  Had a graph's kernels run on a
thread of their own, a process that also traced or ran eager code on its main
thread would keep two teams whose idle workers compete for the same cores.
Under ``OMP_WAIT_POLICY=active`` (HPC sites often set it; pyflow leaves
libgomp's short default spin in one process, PASSIVE where ranks share the
machine: pyflow/_threads.py) they spin: GPT-mini graph steps took 451-462
ms against 242-255 ms for the sequential executor; with the caller running
compute, 263-267 ms against 261-262 ms (bench/graph_step.py's model, separate
processes, medians of 12 steps).  With the passive policy the two differed
by no more than the machine's noise.

Who watches: the caller's own loop when it runs a stream and no timeout is
set (it looks whenever no message came for 50 ms, so a run costs no extra
thread), else a pooled watchdog thread (or the caller, when it runs no
stream):

- all actors ended            -> stop the threads, join them, return the sinks;
- an actor raised             -> every thread leaves its loop at its next
  message; `ActorError` naming the actor, chained to the original exception
  (so its traceback prints), is raised in the caller;
- nothing moves, actors alive -> `DeadlockError` with what each actor waits for
  (only graphs built with `check=False` or blocking user functions get here);
- `timeout` seconds passed    -> `RunTimeoutError`, the same description.

A thread cannot be interrupted inside a Python call: after an error or a
timeout, a stream busy in a long function leaves its loop when that call
returns; `run()` waits up to JOIN_S per pooled thread for it (they are daemon
threads, so none can keep the process alive), and for the caller's own stream
until its current call returns.

On a GPU (``Runtime(graph, device=...)``, which the graph lowering passes
when a graph holds CUDA tensors) actors on different streams are linked by
CUDA events instead of blocking: device.py says how.

One iteration on one thread needs no messages.  When every actor lives on the
caller's stream, none has an initial value and the run is one iteration
(a compiled graph's call: ``run(iterations=1)``), the message loop could only
fire them in an order where each comes after what it reads, on the caller's
thread: ``run`` then does exactly that, directly (``_run_inline``), without
building live actors, registers and queues (they cost a graph call ~150 us
of fixed overhead; bench/graph_overhead.py).  Results, errors and stats are
those of the message run.  A traced run, a device run or several iterations
always take the message path.

`PYFLOW_TRACE=path.json` makes `run()` trace every firing and write a Chrome
trace there when no tracer is passed (trace.py).  `runtime.stats` holds the
firings per actor and the most values ever in flight on each edge.
"""
import os
import threading
import time
from dataclasses import dataclass

from .actor import Actor, InputEdge, SinkActor, SourceActor
from .messages import START, STOP
from .register import OutputRegisters
from .stream import Stream, run_pooled
from .chains import ChainMemberError
from .taskgraph import Port, check_outputs
from .trace import TRACE_ENV, Tracer

POLL_S = 0.05                     # how often the watchdog looks for deadlock/timeout
JOIN_S = 1.0                      # how long to wait for each thread when stopping
CALLER_STREAM = "compute"         # the stream whose loop run()'s caller runs itself
DEVICE_METHODS = ("current", "stream", "use", "record", "wait")   # device.py's protocol


class ActorError(RuntimeError):
    """An actor's function raised; `__cause__` is the original exception.
    ``op``: the op that raised inside a chain actor (chains.py), else the actor."""

    def __init__(self, message, actor, op=None):
        super().__init__(message)
        self.actor = actor
        self.op = op or actor


class DeadlockError(RuntimeError):
    """Actors are alive but no message is moving: the run can never finish."""


class RunTimeoutError(TimeoutError):
    """`run(timeout=...)` expired."""


@dataclass
class RunStats:
    firings: dict            # actor name -> times fired
    max_in_flight: dict      # Edge -> most values written and not yet freed by its consumer
    wall_s: float


class Runtime:
    def __init__(self, graph, *, check=True, device=None):
        """`check=False` skips the liveness check (to watch a deadlock get reported).
        ``device``: a device object (device.py) whose events link the streams'
        device work; None when kernels finish before their launch returns (CPU)."""
        missing = [] if device is None else \
            [m for m in DEVICE_METHODS if not callable(getattr(device, m, None))]
        if missing:
            raise TypeError(f"Runtime(device=...) must have the methods {DEVICE_METHODS} "
                            f"(pyflow/runtime/device.py); {type(device).__name__} lacks "
                            f"{missing}")
        graph.check(liveness=check)
        self.graph = graph
        self.device = device
        self._last_run = None
        self._stats = None
        self._inline = {}           # caller stream -> actors in firing order, or None

    @property
    def stats(self):
        """RunStats of the last run (computed on first access: a compiled graph
        runs once per training step and rarely asks)."""
        if self._stats is None and self._last_run is not None:
            self._stats = self._last_run.stats()
        return self._stats

    def describe(self):
        return self.graph.describe()

    __str__ = describe

    def run(self, *, iterations=None, timeout=None, tracer=None, caller_stream=CALLER_STREAM):
        """Run until every actor has ended; return {sink name: [values]}.

        ``caller_stream``: the stream whose message loop runs on the calling
        thread (None, or a name the graph does not use: the caller only watches)."""
        if iterations is not None and (not isinstance(iterations, int) or iterations < 0):
            raise ValueError(f"iterations must be an int >= 0 or None, got {iterations!r}")
        if timeout is not None and not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds or None, got {timeout!r}")
        if caller_stream is not None and not isinstance(caller_stream, str):
            raise TypeError(f"caller_stream must be a stream name (str) or None, got "
                            f"{caller_stream!r}")
        if iterations is None and self.graph.never_ending():
            raise ValueError(f"actors {self.graph.never_ending()} would never end: they are "
                             "fed by no source; pass run(iterations=N)")
        trace_path = None
        if tracer is None and os.environ.get(TRACE_ENV):
            trace_path, tracer = os.environ[TRACE_ENV], Tracer()
        if iterations == 1 and tracer is None and self.device is None:
            order = self._inline_order(caller_stream)
            if order is not None:
                run = _InlineRun(self.graph, order)
                self._last_run, self._stats = run, None
                return run.execute()
        run = _Run(self.graph, iterations, tracer, self.device)
        try:
            return run.execute(timeout, caller_stream)
        finally:
            self._last_run, self._stats = run, None
            if trace_path:
                tracer.write(trace_path)


    def _inline_order(self, caller_stream):
        """The specs in an order where each comes after every actor it reads
        (data or control), when the graph can run inline (module doc), else None."""
        if caller_stream not in self._inline:
            g, order, seen = self.graph, [], set()
            for name, spec in g.specs.items():
                if g.stream_of(name) != caller_stream or spec.initial or \
                        any(p.actor not in seen for p in spec.inputs + spec.control):
                    order = None
                    break
                seen.add(name)
                order.append(spec)
            self._inline[caller_stream] = order
        return self._inline[caller_stream]


def actor_error(actor, stream, exc, iteration):
    """The ActorError for ``exc`` raised by ``actor`` (naming the op of a chain
    that raised), chained to the original exception."""
    op = None
    if isinstance(exc, ChainMemberError):
        op, exc = exc.op, exc.exc
    where = f"op '{op}' of actor '{actor}'" if op else f"actor '{actor}'"
    error = ActorError(f"{where} (stream '{stream}') failed at iteration {iteration}: "
                       f"{type(exc).__name__}: {exc}", actor, op)
    error.__cause__ = exc
    return error


class _InlineRun:
    """One iteration of a one-stream graph run directly (``Runtime.run``)."""

    def __init__(self, graph, order):
        self.graph = graph
        self.order = order
        self.fired = {}
        self.started = time.perf_counter()

    def execute(self):
        values, results = {}, {}
        for spec in self.order:
            ports = spec.inputs + spec.control
            if spec.kind == "sink":
                results[spec.name] = [values[p] for p in spec.inputs] if all(
                    p in values for p in ports) else []
                self.fired[spec.name] = len(results[spec.name])
                continue
            if any(p not in values for p in ports):    # upstream had nothing (an empty source)
                self.fired[spec.name] = 0
                continue
            if spec.kind == "source":
                if spec.iterations == 0:
                    self.fired[spec.name] = 0
                    continue
                try:
                    res = next(iter(spec.iterable))
                except StopIteration:
                    self.fired[spec.name] = 0
                    continue
            else:
                try:
                    res = spec.fn(*[values[p] for p in spec.inputs])
                    if spec.outputs > 1:
                        res = check_outputs(spec.name, spec.outputs, res)
                except Exception as exc:
                    raise actor_error(spec.name, self.graph.stream_of(spec.name), exc, 0)
            self.fired[spec.name] = 1
            if spec.outputs == 1:
                values[Port(spec.name, 0)] = res
            else:
                for i in range(spec.outputs):
                    values[Port(spec.name, i)] = res[i]
        self.carried = values
        return results

    def stats(self):
        carried = {e: 1 for e in self.graph.edges if e.producer in self.carried}
        return RunStats(dict(self.fired), carried, time.perf_counter() - self.started)


class _Run:
    """The live state of one `Runtime.run` call."""

    def __init__(self, graph, iterations, tracer, device=None):
        self.graph = graph
        self.tracer = tracer
        self.device = device
        self.aborted = False
        self.error = None                 # (actor, exception, iteration) of the first failure
        self.done = threading.Event()
        self.lock = threading.Lock()
        self.alive = len(graph.specs)
        self.streams = {name: Stream(name, self) for name in graph.streams}
        self.actors = {name: self._make_actor(spec, iterations)
                       for name, spec in graph.specs.items()}
        for spec in graph.specs.values():  # wire producer outputs to consumer inputs
            consumer = self.actors[spec.name]
            refs = [(p, False) for p in spec.inputs] + [(p, True) for p in spec.control]
            for i, (port, control) in enumerate(refs):
                producer = self.actors[port.actor]
                edge = producer.outputs[port.index].add_edge(consumer, i)
                consumer.inputs.append(InputEdge(producer, port.index, edge, control))
                if device is not None and producer.stream is not consumer.stream:
                    consumer.inputs[-1].cross = True
                    consumer.sync = producer.sync = device
        self.started = None
        self.watch_error = None           # a timeout or deadlock the watchdog found
        self._last_taken = None           # messages taken at _idle_check's last look

    def _make_actor(self, spec, iterations):
        stream = self.streams[self.graph.stream_of(spec.name)]
        outputs = [OutputRegisters(Port(spec.name, i), r) for i, r in enumerate(spec.registers)]
        if spec.kind == "source":
            limits = [n for n in (spec.iterations, iterations) if n is not None]
            return SourceActor(spec.name, spec.iterable, stream, outputs,
                               min(limits) if limits else None, self)
        if spec.kind == "sink":
            return SinkActor(spec.name, stream, iterations, self)
        return Actor(spec.name, spec.fn, stream, outputs, iterations, self)

    # -- called from stream threads -------------------------------------------
    def actor_ended(self, actor):
        with self.lock:
            self.alive -= 1
            if self.alive == 0:
                self.done.set()
                self.stop_streams()

    def stop_streams(self):
        for s in self.streams.values():
            s.queue.put((None, STOP))

    def fail(self, actor, exc):
        with self.lock:
            if self.error is None:
                self.error = (actor, exc, actor.fired)
        self.abort()

    def abort(self):
        self.aborted = True
        self.stop_streams()
        self.done.set()

    # -- called from the caller's thread --------------------------------------
    def execute(self, timeout, caller_stream=None):
        self.started = time.perf_counter()
        for spec in self.graph.specs.values():
            for index, value in spec.initial.items():
                self.actors[spec.name].preload(index, value)
        own = self.streams.get(caller_stream)
        pooled = [s for s in self.streams.values() if s is not own]
        device = self.device
        if device is not None:        # every stream starts after the caller's work so far
            caller = device.current()
            started = device.record(caller)
            for s in self.streams.values():
                s.device = caller if s is own else device.stream(s.name)
                if s is not own:
                    device.wait(s.device, started)
        for s in pooled:
            s.start(device)
        watchdog = None
        try:
            for actor in self.actors.values():
                actor.stream.queue.put((actor, START))
            if self.alive == 0:           # an empty graph: nothing will ever end
                self.stop_streams()
            if own is None:
                self._watch(timeout)
            elif timeout is None:         # the caller's loop looks for deadlock when idle
                own.loop(idle=self._idle_check)
            else:
                watchdog = run_pooled("watchdog", lambda: self._watch_in_background(timeout),
                                      role="watch")
                own.loop()
        except BaseException:
            self.abort()
            raise
        finally:
            for s in pooled:
                s.join(JOIN_S)
            if device is not None:    # the caller's later work comes after every stream's
                for s in pooled:
                    device.wait(caller, device.record(s.device))
            if watchdog is not None:
                self.done.set()           # the loop returned: nothing left to watch
                if self.aborted:          # a timeout or deadlock it found: wait for it
                    watchdog.wait(JOIN_S)
                # else it leaves at once, on its own: waiting for it made a short
                # run's fixed cost 283 us instead of 150-168 (bench/graph_overhead.py;
                # 109-124 us with no watchdog thread, as when timeout is None)
        results = self._let_go() if all(s.finished.is_set() for s in pooled) else None
        if self.watch_error is not None:
            raise self.watch_error
        if self.error is not None:
            actor, exc, iteration = self.error
            if own is not None and actor.stream is own and \
                    isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise exc                 # Ctrl-C in the caller's own loop stays Ctrl-C
            raise actor_error(actor.name, actor.stream.name, exc, iteration)
        if results is None:               # a pooled thread is still in its loop
            results = {n: a.values for n, a in self.actors.items() if isinstance(a, SinkActor)}
        return results

    def _let_go(self):
        """Hand the sinks' values to the caller and drop the sources' iterators.

        Actors, streams and the run refer to each other (cycles), so only the
        cyclic garbage collector frees a finished run, and not soon: the run
        outlives a few collections and reaches the oldest generation.  Whatever
        it still held (each step's input batch) would pile up there.  Called
        only once every pooled thread has left its loop.  Returns {sink: values}."""
        results = {}
        for name, a in self.actors.items():
            if isinstance(a, SinkActor):
                results[name], a.values = a.values, []
                a.fn = a.values.append
            elif isinstance(a, SourceActor):
                a.iterator = iter(())
        return results

    def _idle_check(self):
        """One look for a deadlock (by the watchdog every POLL_S, or by the
        caller's own loop after IDLE_S without a message): DeadlockError if
        still nothing moved since the last look."""
        taken = self._quiescent_taken()
        if taken is not None and taken == self._last_taken:
            self.abort()
            raise DeadlockError("deadlock: actors are alive but no message is moving:\n"
                                + self.state())
        self._last_taken = taken

    def _watch_in_background(self, timeout):
        try:
            self._watch(timeout)
        except (RunTimeoutError, DeadlockError) as exc:
            self.watch_error = exc        # raised by the caller once its loop returns

    def _watch(self, timeout):
        if self.alive == 0:               # an empty graph: nothing will ever end
            return
        deadline = None if timeout is None else self.started + timeout
        while not self.done.wait(POLL_S):
            if deadline is not None and time.perf_counter() > deadline:
                self.abort()
                raise RunTimeoutError(f"run did not finish within {timeout} s:\n"
                                      + self.state())
            self._idle_check()

    def _quiescent_taken(self):
        """Messages taken so far if no thread is busy and no message waits, else None.

        Seen twice with the same count, nothing moved in between and nothing
        can move any more (stream.py).  Flags first, queues second, count last.
        """
        streams = list(self.streams.values())
        if any(s.busy for s in streams) or any(s.local or not s.queue.empty() for s in streams):
            return None
        return sum(s.taken for s in streams)

    def state(self):
        return "\n".join("  " + a.state() for a in self.actors.values())

    def stats(self):
        firings = {name: a.fired for name, a in self.actors.items()}
        max_in_flight = {}
        for e in self.graph.edges:
            out = self.actors[e.producer.actor].outputs[e.producer.index]
            for k, (consumer, input_index) in enumerate(out.edges):
                if consumer.name == e.consumer and input_index == e.input:
                    max_in_flight[e] = out.max_in_flight[k]
        wall = 0.0 if self.started is None else time.perf_counter() - self.started
        return RunStats(firings, max_in_flight, wall)
