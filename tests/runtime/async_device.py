"""A model of a GPU's asynchronous streams, to test the runtime's CUDA events
(pyflow/runtime/device.py) on a machine without a GPU.

Each stream is a worker thread that runs the work launched on it in launch
order; ``launch(fn)`` returns at once, like a kernel launch.  An event is set
when its stream's worker reaches it; ``wait(stream, event)`` makes the
stream's worker wait for it, as ``cudaStreamWaitEvent`` does.  A missing wait
therefore lets a "kernel" read a buffer before another stream has filled it,
or overwrite one another stream still has to read: the tests see wrong
numbers, as they would on a GPU.
"""
import contextlib
import queue
import threading


class AsyncStream:
    def __init__(self, name):
        self.name = name
        self.work = queue.Queue()
        self.thread = threading.Thread(target=self._serve, name=f"async-device-{name}",
                                       daemon=True)
        self.thread.start()

    def _serve(self):
        while True:
            job = self.work.get()
            if job is None:
                return
            job()

    def close(self):
        self.work.put(None)
        self.thread.join()


class AsyncDevice:
    """The runtime's device protocol (current, stream, use, record, wait),
    plus ``launch`` and ``synchronize`` for the tests' kernels."""

    def __init__(self):
        self.default = AsyncStream("default")
        self.streams = {}
        self.local = threading.local()
        self.waits = 0

    # -- the runtime's protocol -------------------------------------------------
    def current(self):
        return getattr(self.local, "stream", self.default)

    def stream(self, name):
        if name not in self.streams:
            self.streams[name] = AsyncStream(name)
        return self.streams[name]

    @contextlib.contextmanager
    def use(self, stream):
        before = self.current()
        self.local.stream = stream
        try:
            yield stream
        finally:
            self.local.stream = before

    def record(self, stream):
        event = threading.Event()
        stream.work.put(event.set)
        return event

    def wait(self, stream, event):
        self.waits += 1
        stream.work.put(event.wait)

    # -- for the tests --------------------------------------------------------------
    def launch(self, fn):
        """Enqueue ``fn`` on the calling thread's current stream; return at once."""
        self.current().work.put(fn)

    def synchronize(self):
        for s in [self.default, *self.streams.values()]:
            done = threading.Event()
            s.work.put(done.set)
            done.wait()

    def close(self):
        self.synchronize()
        for s in [self.default, *self.streams.values()]:
            s.close()
