"""Stream threads: one thread per stream runs the message loop of its actors.

A stream ("compute", "copy", "comm", "data", ...) is an ordered lane of work,
like a CUDA stream: the actors placed on it run one at a time, in the order
their messages arrive.  Different streams run in different threads, so they
overlap whenever an actor's function releases the GIL (numba kernels compiled
with `nogil=True`, NumPy's BLAS, MPI calls, `time.sleep`, file reads).

Messages between two actors of the same stream skip the thread-safe queue and
go to a plain deque (`local`) that the loop empties first; a message to
another stream goes into that stream's `queue.Queue`.  Each (sender, receiver)
pair always uses the same path, so messages between them stay in order.

`busy` and `taken` let the runtime notice quiescence (no thread working, no
message waiting, nothing taken since its last look) while actors are still
alive: a deadlock, reported instead of hanging.
"""
import queue
import threading
from collections import deque

from .messages import Stop


class Stream:
    def __init__(self, name, run):
        self.name = name
        self.run = run            # the _Run: aborted flag, fail()
        self.queue = queue.Queue()
        self.local = deque()
        self.busy = True          # until the loop first waits on its queue
        self.taken = 0            # messages taken so far
        self.thread = threading.Thread(target=self.loop, name=f"pyflow-stream-{name}",
                                       daemon=True)

    def loop(self):
        run, local = self.run, self.local
        while True:
            if local:
                target, msg = local.popleft()
            else:
                self.busy = False
                target, msg = self.queue.get()
                self.busy = True
            self.taken += 1
            if type(msg) is Stop or run.aborted:
                break
            try:
                target.handle(msg)
            except BaseException as exc:  # noqa: BLE001 -- reported to the caller of run()
                run.fail(target, exc)
                break
        self.busy = False
