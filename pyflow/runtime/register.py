"""Registers: the buffer slots on an edge, and the back-pressure they give.

A producer output owns a fixed number of `Register` slots (its register
count).  Writing a value takes a free slot and makes it readable by every
consumer edge of that output; the slot's `readers` counts the edges that have
not read it yet.  When the count reaches zero the slot is free again and the
producer may write into it.

That fixed count is the whole flow control of the runtime: a producer that
runs ahead of its slowest consumer by `count` values has no free slot and
simply does not fire (back-pressure).  With one register, producer and
consumer alternate; with two or more, the producer computes iteration i+1
while the consumer still reads iteration i (pipelining).

Consumers read in write order, so slots free in write order too; a deque of
free slots is enough.  `in_flight` counts, per consumer edge, the values
written and not yet handed back (the quantity the back-pressure bounds); its
maximum is kept so tests and `explain` can show it never exceeds `count`.
"""
from collections import deque


class Register:
    """One buffer slot of a producer output."""
    __slots__ = ("port", "slot", "value", "iteration", "readers", "event")

    def __init__(self, port, slot):
        self.port = port          # the Port (producer, output index) that owns it
        self.slot = slot          # 0 .. count-1, for traces and error messages
        self.value = None
        self.iteration = None     # producer iteration that wrote it (-1 = initial value)
        self.readers = 0          # consumer edges that still have to read it
        self.event = None         # device event after the kernels that wrote it (device.py)

    def __repr__(self):
        return (f"Register({self.port}#{self.slot}, iteration={self.iteration}, "
                f"readers={self.readers})")


class OutputRegisters:
    """The `count` register slots of one producer output, shared by its consumer edges."""

    def __init__(self, port, count):
        self.port = port
        self.count = count
        self.free = deque(Register(port, i) for i in range(count))
        self.edges = []           # (consumer actor, its input index), one per consumer edge
        self.live = []            # per edge: False once that consumer has ended
        self.in_flight = []       # per edge: values written, not yet freed by it
        self.max_in_flight = []
        self.written = 0          # values written over the run, initial value included

    def add_edge(self, consumer, input_index):
        self.edges.append((consumer, input_index))
        self.live.append(True)
        self.in_flight.append(0)
        self.max_in_flight.append(0)
        return len(self.edges) - 1

    def write(self, value, iteration, event=None):
        """Put `value` into a free slot (the caller checked `free`); return the register.
        ``event``: the device event after the kernels that computed it (device.py)."""
        reg = self.free.popleft()
        reg.value, reg.iteration, reg.event = value, iteration, event
        readers = 0
        for e, live in enumerate(self.live):
            if live:
                readers += 1
                n = self.in_flight[e] + 1
                self.in_flight[e] = n
                if n > self.max_in_flight[e]:
                    self.max_in_flight[e] = n
        reg.readers = readers
        self.written += 1
        if readers == 0:          # nobody reads this output: the slot is free at once
            self._recycle(reg)
        return reg

    def release(self, reg, edge):
        """Consumer edge `edge` has read `reg`."""
        self.in_flight[edge] -= 1
        reg.readers -= 1
        if reg.readers == 0:
            self._recycle(reg)

    def drop(self, edge):
        """Consumer edge `edge` has ended: later writes do not wait for it."""
        self.live[edge] = False

    def all_consumers_gone(self):
        return bool(self.edges) and not any(self.live)

    def _recycle(self, reg):
        reg.value = reg.event = None  # drop the reference so the value can be freed early
        self.free.append(reg)
