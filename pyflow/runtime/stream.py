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

Threads are pooled per stream name and outlive a run: a compiled graph runs
once per training step, and a fresh thread per step would pay more than its
start-up.  Kernels keep per-thread state: OpenMP (numba's parallel loops) and
OpenBLAS build a worker team for each new calling thread, which cost a GPT
step 60% more time with fresh threads.  A pooled thread is named
``pyflow-stream-<name>`` while it runs a loop and ``pyflow-idle-<name>``
between runs.  The ``compute`` stream's loop runs on the caller's own thread
(runtime.py says why), so its kernels share the OpenMP team of eager code.
"""
import queue
import threading
from collections import deque

from .messages import Stop

IDLE_S = 0.05                # how long a watching loop waits for a message before looking


class Stream:
    def __init__(self, name, run):
        self.name = name
        self.run = run            # the _Run: aborted flag, fail()
        self.queue = queue.Queue()
        self.local = deque()
        self.busy = True          # until the loop first waits on its queue
        self.taken = 0            # messages taken so far
        self.finished = threading.Event()
        self.device = None        # its CUDA stream when the run has a device object (device.py)

    def start(self, sync=None):
        """Run this stream's message loop on a pooled thread (with its CUDA
        stream current there when ``sync``, the run's device object, is given)."""
        def loop_on_device():
            with sync.use(self.device):
                self.loop()
        _submit(self.name, self.loop if sync is None else loop_on_device, self.finished)

    def join(self, timeout):
        return self.finished.wait(timeout)

    def loop(self, idle=None):
        """Handle messages until Stop.  ``idle``: called whenever no message has
        come for ``IDLE_S`` (the caller's loop watches the run that way)."""
        run, local = self.run, self.local
        while True:
            if local:
                target, msg = local.popleft()
            else:
                self.busy = False
                if idle is None:
                    target, msg = self.queue.get()
                else:
                    try:
                        target, msg = self.queue.get(timeout=IDLE_S)
                    except queue.Empty:
                        idle()
                        continue
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


# ---------------------------------------------------------------- the thread pool
class _Worker:
    def __init__(self, name):
        self.jobs = queue.Queue()
        self.thread = threading.Thread(target=self._serve, name=f"pyflow-idle-{name}",
                                       daemon=True)
        self.thread.start()

    def _serve(self):
        while True:
            self.jobs.get()()


_idle = {}                   # stream name -> idle workers
_idle_lock = threading.Lock()


def run_pooled(name, fn, role="stream"):
    """Run ``fn()`` on a pooled thread named ``pyflow-<role>-<name>`` while it
    runs; returns an Event set when it has returned."""
    finished = threading.Event()
    _submit(name, fn, finished, role)
    return finished


def _submit(name, loop, finished, role="stream"):
    with _idle_lock:
        workers = _idle.setdefault(name, [])
        worker = workers.pop() if workers else _Worker(name)

    def job():
        worker.thread.name = f"pyflow-{role}-{name}"
        try:
            loop()
        finally:
            worker.thread.name = f"pyflow-idle-{name}"
            with _idle_lock:
                _idle[name].append(worker)
            finished.set()
    worker.jobs.put(job)
