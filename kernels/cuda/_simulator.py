"""Warp shuffles for numba's CUDA simulator, which (numba-cuda 0.30) has none.

Installed into the simulator's fake ``cuda`` module when the package is
imported under NUMBA_ENABLE_CUDASIM=1, so kernels call the real API
(``cuda.shfl_down_sync``, ``shfl_up_sync``, ``shfl_sync``) in both modes; the
real shuffles are checked in the PTX tests.  Like on hardware, all threads of a
warp must call a shuffle together (never under a per-thread branch).  Relies
on two private attributes of the simulator's threads (``thread_id``,
``_manager``).
"""
import threading

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


def install():
    from numba import config
    if config.ENABLE_CUDASIM:
        _install_simulated_shuffles()
