"""Device completion: actors on different streams wait for each other's GPU
work with CUDA events, never by blocking a thread.

On a GPU a kernel launch returns before the kernel has run.  An actor's
firing therefore only *enqueues* its kernels on its stream's CUDA stream, and
its output register is "ready" while the kernels that fill it may still be
running.  Within one stream that is harmless: a CUDA stream runs its work in
launch order.  Across streams (``data`` -> ``compute``, ``compute`` <->
``copy``) the runtime links the CUDA streams with events, as OneFlow does:

* **ready**: after firing, an actor with a consumer on another stream
  records an event on its CUDA stream and sends it with the register; the
  consumer makes its own CUDA stream wait for that event
  (``cudaStreamWaitEvent``) before it launches anything.
* **free**: after firing, an actor that read a register of another stream
  records an event and sends it back with ``RegisterFree``; the producer's
  CUDA stream waits for it before the register lets go of its value.  The
  memory may then be reused by the producer's stream (CuPy's pool returns a
  block to the stream that allocated it), so its next kernels must come
  after the consumer's reads.
* **run**: at the start every other CUDA stream waits for the caller's
  current stream (where the inputs were made); at the end the caller's
  stream waits for every other one (where the outputs will be read).

The waits happen on the GPU: no thread blocks, so the host keeps launching
ahead while the device works.  Host code that reads device memory (a copy to
the CPU, an MPI call on a device buffer) synchronizes its own stream first,
which now includes the waits.  The stream whose loop runs on the caller's
thread (``compute``) keeps the caller's current CUDA stream; every other
actor stream gets one CUDA stream of its own, kept for later runs.

A device object has five methods, so tests can pass one that models a GPU's
asynchronous streams (tests/runtime/async_device.py) and check that every
wait is in place:

    current()               the calling thread's current stream
    stream(name)            the stream for actor stream ``name`` (made once)
    use(stream)             a context manager making ``stream`` current
    record(stream) -> event an event after the work enqueued on ``stream``
    wait(stream, event)     later work on ``stream`` waits for ``event``
"""
from ..device import backend_of



class CudaCompletion:
    """The device object for a real GPU, through CuPy's streams and events."""

    def __init__(self):
        self._cuda = backend_of("cuda").xp.cuda     # cupy.cuda
        self._streams = {}

    def current(self):
        return self._cuda.get_current_stream()

    def stream(self, name):
        s = self._streams.get(name)
        if s is None:
            s = self._streams[name] = self._cuda.Stream(non_blocking=True)
        return s

    def use(self, stream):
        return stream                 # a CuPy Stream is its own context manager

    def record(self, stream):
        event = self._cuda.Event(disable_timing=True)
        event.record(stream)
        return event

    def wait(self, stream, event):
        stream.wait_event(event)


def completion_for(devices):
    """The device object a run over tensors on ``devices`` needs: CUDA events
    on a real GPU; None on the CPU and in numba's simulator, whose kernels
    finish before their launch returns."""
    if not any(getattr(d, "type", d) == "cuda" for d in devices):
        return None
    cuda = backend_of("cuda")
    if cuda.simulated or cuda.unavailable_reason() is not None:
        return None
    return CudaCompletion()
