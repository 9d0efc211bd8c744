"""Three changes to numba's CUDA simulator: warp shuffles, a block scheduler
that waits instead of polling, and shared arrays allocated under a lock.

Warp shuffles: the simulator (numba-cuda 0.30) has none.

Installed into the simulator's fake ``cuda`` module when the package is
imported under NUMBA_ENABLE_CUDASIM=1, so kernels call the real API
(``cuda.shfl_down_sync``, ``shfl_up_sync``, ``shfl_sync``) in both modes; the
real shuffles are checked in the PTX tests.  Like on hardware, all threads of a
warp must call a shuffle together (never under a per-thread branch).  Relies
on two private attributes of the simulator's threads (``thread_id``,
``_manager``).
"""
import sys
import threading

import numpy as np

WARP = 32
builtins_min = min
_board_lock = threading.Lock()


def _simulated_shuffle(value, source_lane):
    """Every thread of the warp posts ``value``; each reads ``source_lane``'s post
    (its own value when that lane is outside the warp).  A barrier per warp
    (cheaper than the simulator's block-wide syncthreads) separates the posts
    from the reads; posts alternate between two boards, so a fast thread's
    next post cannot overwrite one that a slow thread has still to read (it
    would first have to pass the next barrier, which waits for that thread)."""
    thread = threading.current_thread()
    me = thread.thread_id
    lane = me % WARP
    manager = thread._manager
    with _board_lock:
        warps = manager.__dict__.setdefault("_shuffle_warps", {})
        warp = warps.get(me - lane)
        if warp is None:
            block = manager._block_dim
            size = builtins_min(WARP, block[0] * block[1] * block[2] - (me - lane))
            warp = warps[me - lane] = ({}, {}, threading.Barrier(size))
    turn = thread.__dict__.get("_shuffle_turn", 0)
    thread._shuffle_turn = 1 - turn
    posts = warp[turn]
    posts[lane] = value
    warp[2].wait()
    return posts.get(source_lane, value) if 0 <= source_lane < WARP else value


def _install_simulated_shuffles():
    from numba.cuda.simulator import kernelapi
    fake = kernelapi.FakeCUDAModule
    if not hasattr(fake, "shfl_down_sync"):
        fake.shfl_down_sync = lambda self, mask, value, delta: _simulated_shuffle(
            value, threading.current_thread().thread_id % WARP + delta)
    if not hasattr(fake, "shfl_up_sync"):
        fake.shfl_up_sync = lambda self, mask, value, delta: _simulated_shuffle(
            value, threading.current_thread().thread_id % WARP - delta)
    if not hasattr(fake, "shfl_sync"):
        fake.shfl_sync = lambda self, mask, value, lane: _simulated_shuffle(value, lane)


def _event_driven_run(self, grid_point, *args):
    """BlockManager.run without its busy loop.

    The simulator runs each CUDA thread of a block as a Python thread; its block
    manager polls every thread's ``is_alive()`` in a tight loop to notice when
    all of them wait in ``syncthreads()``.  The polling holds the GIL the
    worker threads need, so a kernel with a few barriers took seconds.  Here
    threads notify the manager (a Condition) when they block or finish, and
    the manager sleeps until then.  Semantics are the simulator's: release all
    threads once every live thread waits at the barrier; re-raise the first
    thread exception after aborting the others."""
    from numba.cuda.simulator.kernel import BlockThread
    changed = threading.Condition()
    self._changed = changed

    def target():
        try:
            self._f(*args)
        finally:
            with changed:
                threading.current_thread()._finished_kernel = True
                changed.notify()

    threads = [BlockThread(target, self, grid_point, block_point, self._debug)
               for block_point in np.ndindex(*self._block_dim)]
    for t in threads:
        t._finished_kernel = False
        t.start()
    with changed:
        while True:
            failed = next((t for t in threads if t.exception), None)
            if failed is not None:
                for t in threads:
                    t.abort = True
                    t.syncthreads_blocked = False
                    t.syncthreads_event.set()
                raise failed.exception[0].with_traceback(failed.exception[1])
            live = [t for t in threads if not t._finished_kernel]
            if not live:
                break
            if all(t.syncthreads_blocked for t in live):
                for t in live:
                    t.syncthreads_blocked = False
                    t.syncthreads_event.set()
            changed.wait(0.05)      # the timeout only guards against a missed notify
    for t in threads:
        t.join()
        if t.exception:
            raise t.exception[0].with_traceback(t.exception[1])


def _notifying_syncthreads(self):
    """BlockThread.syncthreads that wakes the event-driven block manager."""
    if self.abort:
        raise RuntimeError("abort flag set on syncthreads call")
    with self._manager._changed:
        self.syncthreads_blocked = True
        self._manager._changed.notify()
    self.syncthreads_event.wait()
    self.syncthreads_event.clear()
    if self.abort:
        raise RuntimeError("abort flag set on syncthreads clear")


def _install_event_driven_blocks():
    from numba.cuda.simulator import kernel
    if getattr(kernel.BlockManager.run, "__name__", "") != "_event_driven_run":
        kernel.BlockManager.run = _event_driven_run
        kernel.BlockThread.syncthreads = _notifying_syncthreads


_shared_lock = threading.Lock()


def _locked_shared_array(self, shape, dtype, alignment=None):
    """FakeCUDAShared.array with its look-up-then-insert under a lock.

    The simulator keys a block's shared arrays by the (file, line) that asks for
    one and creates the array when the key is missing.  Unlocked, two threads of
    a block could both find it missing and each keep an array of its own: a
    block whose threads do not share memory, which made a GEMM output element
    wrong about once in a few hundred launches under load.  The caller is read
    from ``sys._getframe(1)`` (the simulator reads ``extract_stack()[-2]``, the
    same frame, slower)."""
    if alignment is not None:
        raise RuntimeError("Array alignment is not supported in cudasim")
    from numba.np import numpy_support
    from numba.core import types
    if isinstance(dtype, types.Type):
        dtype = numpy_support.as_dtype(dtype)
    if shape == 0:                  # dynamic shared memory: one buffer, no race
        count = self._dynshared_size // dtype.itemsize
        return np.frombuffer(self._dynshared.data, dtype=dtype, count=count)
    frame = sys._getframe(1)
    caller = (frame.f_code.co_filename, frame.f_lineno)
    with _shared_lock:
        found = self._allocations.get(caller)
        if found is None:
            found = self._allocations[caller] = np.empty(shape, dtype)
    return found


def _install_locked_shared_arrays():
    from numba.cuda.simulator import kernelapi
    if kernelapi.FakeCUDAShared.array is not _locked_shared_array:
        kernelapi.FakeCUDAShared.array = _locked_shared_array


def install():
    from numba import config
    if config.ENABLE_CUDASIM:
        _install_simulated_shuffles()
        _install_event_driven_blocks()
        _install_locked_shared_arrays()
