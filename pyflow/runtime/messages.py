"""The messages actors send each other (OneFlow's actor protocol, in Python).

Actors never call each other: they only post these small records to the
message queue of the stream thread that runs the receiver.  Messages carry
references to registers, never copies of data.

    producer --RegisterReady-->  consumer     "register r is readable by your input i"
    producer <--RegisterFree---  consumer     "I have read r; you may reuse it"
    producer --EndOfData------>  consumer     "input i will carry `length` values in all"
    producer <--ConsumerDone---  consumer     "I have ended; do not wait for me any more"
    runtime  --Start/Stop----->  every actor / every stream thread

`ConsumerDone` is not in OneFlow's list: it is what lets a producer stop when
nobody reads its output any more (an endless data loader feeding a graph that
ran its N iterations), and lets it reuse registers an ended reader will never
free.

Between streams on a GPU, the register of `RegisterReady` and the
`RegisterFree` message also carry a CUDA event (device.py): "the kernels
behind this message are enqueued up to here".
"""
from dataclasses import dataclass

from .register import Register


@dataclass(slots=True)
class RegisterReady:
    input: int            # which of the receiver's inputs (data inputs first, then control)
    register: Register


@dataclass(slots=True)
class RegisterFree:
    output: int           # which of the receiver's outputs owns the register
    register: Register
    edge: int             # which consumer edge of that output has read it
    event: object = None  # device event after the reader's kernels (device.py), if any


@dataclass(slots=True)
class EndOfData:
    input: int
    length: int           # values this input carries over the whole run (initial value included)


@dataclass(slots=True)
class ConsumerDone:
    output: int
    edge: int


@dataclass(slots=True)
class Start:
    """Sent once to every actor: sources begin reading, input-less actors fire."""


@dataclass(slots=True)
class Stop:
    """Sent to every stream thread: leave the message loop."""


START = Start()
STOP = Stop()
