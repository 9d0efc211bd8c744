"""Actors: a function plus the rule for when it may run.

An actor fires when every input has a readable register (the oldest one,
so iterations stay in order) and every output has a free register.  Firing
calls `fn` on the input values, writes the results into the free output
registers, tells each consumer that a register is ready, and hands every
consumed input register back to its producer.  That is the whole algorithm;
there is no scheduler deciding who runs next, only messages (messages.py).

An actor ends, and tells its consumers how many values it wrote
(`EndOfData`) and its producers that it reads no more (`ConsumerDone`), when
  - one of its inputs has ended and every value of it has been read, or
  - it has fired `limit` times (`Runtime.run(iterations=N)`), or
  - every consumer of every output has ended (nobody needs its values).
An ended actor hands back at once any register it still receives.

All methods run on the stream thread the actor is placed on (stream.py), so
an actor's state needs no lock.

On a GPU, an actor linked to another stream also records and waits for CUDA
events around its firing (device.py): ``sync`` is that run's device object.
"""
from collections import deque
from time import perf_counter_ns

from .chains import Chain
from .messages import ConsumerDone, EndOfData, RegisterFree, RegisterReady
from .taskgraph import check_outputs


class InputEdge:
    """The consumer end of one edge: the registers readable by one input."""
    __slots__ = ("producer", "output", "edge", "control", "ready", "consumed", "length",
                 "cross")

    def __init__(self, producer, output, edge, control):
        self.producer = producer  # producing Actor
        self.output = output      # its output index
        self.edge = edge          # edge index within that output (for RegisterFree)
        self.control = control    # control edges order firings but pass no value to fn
        self.ready = deque()      # readable registers, oldest first
        self.consumed = 0
        self.length = None        # set by EndOfData: values this input carries in all
        self.cross = False        # producer on another stream, with device events between

    def exhausted(self):
        return self.length is not None and self.consumed >= self.length and not self.ready


class Actor:
    """A runtime actor: built by `Runtime.run` from an actor spec of a TaskGraph."""

    def __init__(self, name, fn, stream, outputs, limit, run):
        self.name = name
        self.fn = fn
        self.stream = stream      # the Stream whose thread runs this actor
        self.inputs = []          # InputEdge per input (data inputs first, then control)
        self.outputs = outputs    # OutputRegisters per output
        self.limit = limit        # most firings allowed (None: until end of data)
        self.run = run            # the _Run: tracer, actor_ended()
        self.fired = 0
        self.ended = False
        self.chain = fn if isinstance(fn, Chain) else None   # traced op by op
        self.sync = None          # the device object (device.py) when linked to another stream

    # -- messages ------------------------------------------------------------
    def handle(self, msg):
        kind = type(msg)
        if kind is RegisterReady:
            if self.ended:        # nobody will read it: hand it straight back
                edge = self.inputs[msg.input]
                self.send(edge.producer, RegisterFree(edge.output, msg.register, edge.edge))
                return
            self.inputs[msg.input].ready.append(msg.register)
        elif kind is RegisterFree:
            if msg.event is not None:     # the reader's kernels come before any reuse
                self.sync.wait(self.stream.device, msg.event)
            self.outputs[msg.output].release(msg.register, msg.edge)
        elif kind is EndOfData:
            self.inputs[msg.input].length = msg.length
        elif kind is ConsumerDone:
            self.outputs[msg.output].drop(msg.edge)
        if not self.ended:        # Start needs nothing but this
            self.advance()

    def send(self, target, msg):
        if target.stream is self.stream:
            self.stream.local.append((target, msg))
        else:
            target.stream.queue.put((target, msg))

    # -- firing --------------------------------------------------------------
    def advance(self):
        """Fire as long as possible, then end if there is nothing left to do."""
        run = self.run
        while not run.aborted and self.can_fire():
            self.fire()
        if self.should_end():
            self.end()

    def can_fire(self):
        if self.limit is not None and self.fired >= self.limit:
            return False
        for inp in self.inputs:
            if not inp.ready:
                return False
        for out in self.outputs:
            if not out.free:
                return False
        return True

    def fire(self):
        regs = [inp.ready.popleft() for inp in self.inputs]
        sync = self.sync
        if sync is not None:      # launch after the kernels that wrote other streams' inputs
            for reg, inp in zip(regs, self.inputs):
                if inp.cross and reg.event is not None:
                    sync.wait(self.stream.device, reg.event)
        args = [reg.value for reg, inp in zip(regs, self.inputs) if not inp.control]
        iteration = self.fired
        tracer = self.run.tracer
        chain = self.chain
        if chain is not None:
            chain.tracer = None if tracer is None else (tracer, self.stream.name, iteration)
        start = perf_counter_ns()
        result = self.fn(*args)
        if tracer is not None and chain is None:
            tracer.record(self.name, self.stream.name, start, perf_counter_ns(), iteration)
        self.fired += 1
        event = None if sync is None else sync.record(self.stream.device)
        self.write_outputs(result, iteration, event)
        for reg, inp in zip(regs, self.inputs):
            inp.consumed += 1
            self.send(inp.producer, RegisterFree(inp.output, reg, inp.edge,
                                                 event if inp.cross else None))

    def write_outputs(self, result, iteration, event=None):
        n = len(self.outputs)
        if n == 0:
            return
        values = (result,) if n == 1 else check_outputs(self.name, n, result)
        for out, value in zip(self.outputs, values):
            reg = out.write(value, iteration, event)
            for edge, (consumer, input_index) in enumerate(out.edges):
                if out.live[edge]:
                    self.send(consumer, RegisterReady(input_index, reg))

    def preload(self, index, value):
        """Fill one register of output `index` with an initial value before the run."""
        out = self.outputs[index]
        reg = out.write(value, -1)
        for consumer, input_index in out.edges:
            self.send(consumer, RegisterReady(input_index, reg))

    # -- ending --------------------------------------------------------------
    def should_end(self):
        if self.limit is not None and self.fired >= self.limit:
            return True
        for inp in self.inputs:
            if inp.exhausted():
                return True
        return bool(self.outputs) and all(out.all_consumers_gone() for out in self.outputs)

    def end(self):
        self.ended = True
        for out in self.outputs:
            for edge, (consumer, input_index) in enumerate(out.edges):
                if out.live[edge]:
                    self.send(consumer, EndOfData(input_index, out.written))
        for inp in self.inputs:
            while inp.ready:
                self.send(inp.producer, RegisterFree(inp.output, inp.ready.popleft(), inp.edge))
            self.send(inp.producer, ConsumerDone(inp.output, inp.edge))
        self.run.actor_ended(self)

    def state(self):
        """One line saying what this actor waits for (for deadlock/timeout errors)."""
        if self.ended:
            return f"{self.name}: ended after {self.fired} firings"
        waits = []
        for i, inp in enumerate(self.inputs):
            if not inp.ready:
                waits.append(f"a value on input {i} from '{inp.producer.name}:{inp.output}'")
        for i, out in enumerate(self.outputs):
            if not out.free:
                waits.append(f"a free register of output {i} ({out.count} in use)")
        what = ", ".join(waits) if waits else "nothing (ready to fire)"
        return f"{self.name}: fired {self.fired} times, waits for {what}"


class SourceActor(Actor):
    """Produces one value per item of an iterable; ends when it is exhausted."""

    def __init__(self, name, iterable, stream, outputs, limit, run):
        super().__init__(name, None, stream, outputs, limit, run)
        self.iterator = iter(iterable)
        self.exhausted = False

    def can_fire(self):
        return not self.exhausted and self.outputs[0].free and \
            (self.limit is None or self.fired < self.limit)

    def fire(self):
        start = perf_counter_ns()
        try:
            value = next(self.iterator)
        except StopIteration:
            self.exhausted = True
            return
        if self.run.tracer is not None:
            self.run.tracer.record(self.name, self.stream.name, start, perf_counter_ns(),
                                   self.fired)
        iteration = self.fired
        self.fired += 1
        sync = self.sync
        self.write_outputs(value, iteration, None if sync is None else
                           sync.record(self.stream.device))

    def should_end(self):
        return self.exhausted or super().should_end()


class SinkActor(Actor):
    """Collects every value it receives, in iteration order."""

    def __init__(self, name, stream, limit, run):
        self.values = []
        super().__init__(name, self.values.append, stream, [], limit, run)
