"""Point-to-point messages: ``send``/``recv`` and their non-blocking forms.

Kept apart from the collectives because messages follow rules of their own:
there is no collective to piggy-back the agreement check on, so ``recv``
probes the incoming message and raises on the receiving rank if its size
differs (draining it first, so the sender does not hang); under a timeout
``recv`` polls ``Iprobe`` and ``send`` waits on an ``Isend``; a blocking
message to oneself is refused (it can deadlock).  ``PointToPoint`` is the part
of ``Communicator`` that sends and receives.
"""
import time

import numpy as np
from mpi4py import MPI

from .agreement import TIMEOUT_ENV_VAR, CollectiveMismatchError, CollectiveTimeoutError, poll
from .staging import MPIBuffer
from .watchdog import leave as _leave
from .wire import check_tensor, wire
from .work import Work

__all__ = ["PointToPoint"]


class PointToPoint:
    """Messages between two ranks, for ``Communicator`` (whose ``mpi``, ``rank``,
    ``_timeout``, ``_watched``, ``_world_ranks``, ``_enter``, ``_pair`` and
    ``_check_rank`` these methods use)."""

    def send(self, tensor, dst, tag=0):
        """Send ``tensor`` to rank ``dst`` (blocks until the buffer may be reused)."""
        self._p2p_args("send", tensor, dst, tag, blocking=True)
        buf = MPIBuffer(tensor._data, read=True, write=False)
        token = self._enter(f"send to rank {self._world_ranks[dst]} (tag {tag})",
                            self._pair(dst)) if self._watched else None
        try:
            if self._timeout is None:
                self.mpi.Send(wire(buf.mpi), dst, tag)
            else:
                Work(self.mpi.Isend(wire(buf.mpi), dst, tag), None, None, self._timeout,
                     f"send to rank {dst} (tag {tag})").wait()
        finally:
            _leave(token)
            buf.finish()

    def isend(self, tensor, dst, tag=0):
        self._p2p_args("isend", tensor, dst, tag)
        buf = MPIBuffer(tensor._data, read=True, write=False)
        return Work(self.mpi.Isend(wire(buf.mpi), dst, tag), lambda status: buf.finish(),
                    tensor, self._timeout, f"isend to rank {dst} (tag {tag})",
                    self._pair(dst) if self._watched else None)

    def recv(self, tensor, src, tag=0):
        """Receive into ``tensor`` (in place) from rank ``src``; returns it.  Raises on
        this rank if the message's size differs from the tensor's."""
        self._p2p_args("recv", tensor, src, tag, blocking=True)
        token = self._enter(f"recv from rank {self._world_ranks[src]} (tag {tag})",
                            self._pair(src)) if self._watched else None
        try:
            return self._recv(tensor, src, tag)
        finally:
            _leave(token)

    def _recv(self, tensor, src, tag):
        status = MPI.Status()
        if self._timeout is None:
            self.mpi.Probe(src, tag, status)
        elif not poll(lambda: self.mpi.Iprobe(src, tag, status),
                       time.monotonic() + self._timeout):
            raise CollectiveTimeoutError(
                f"recv: rank {self.rank} got no message from rank {src} (tag {tag}) within "
                f"{self._timeout:g} s ({TIMEOUT_ENV_VAR})")
        got = status.Get_count(MPI.BYTE)
        want = tensor._data.nbytes
        if got != want:
            self.mpi.Recv([np.empty(got, np.uint8), MPI.BYTE], src, tag)   # drain it
            raise CollectiveMismatchError(
                f"recv: rank {self.rank} expected {want} bytes (shape {tuple(tensor.shape)}, "
                f"{tensor.dtype}) from rank {src} with tag {tag}, but the message has "
                f"{got} bytes")
        buf = MPIBuffer(tensor._data, read=False, write=True)
        try:
            self.mpi.Recv(wire(buf.mpi), src, tag)
        finally:
            buf.finish()
        tensor._version[0] += 1
        return tensor

    def irecv(self, tensor, src, tag=0):
        """Non-blocking receive; ``wait()`` raises if the message was shorter than
        the tensor (a longer one is MPI's truncation error)."""
        self._p2p_args("irecv", tensor, src, tag)
        buf = MPIBuffer(tensor._data, read=False, write=True)
        want = tensor._data.nbytes

        def finish(status):
            buf.finish()
            tensor._version[0] += 1
            got = status.Get_count(MPI.BYTE)
            if got != want:
                raise CollectiveMismatchError(
                    f"irecv: rank {self.rank} expected {want} bytes from rank {src} with "
                    f"tag {tag}, got {got}")

        return Work(self.mpi.Irecv(wire(buf.mpi), src, tag), finish, tensor, self._timeout,
                    f"irecv from rank {src} (tag {tag})",
                    self._pair(src) if self._watched else None)

    def _p2p_args(self, fn, t, peer, tag, blocking=False):
        check_tensor(fn, t)
        peer = self._check_rank(fn, "dst" if "send" in fn else "src", peer)
        if isinstance(tag, bool) or not isinstance(tag, (int, np.integer)) or \
                not 0 <= tag <= MPI.COMM_WORLD.Get_attr(MPI.TAG_UB):
            raise ValueError(f"{fn}: tag must be an int in [0, MPI's TAG_UB], got {tag!r}")
        if blocking and peer == self.rank:
            raise ValueError(f"{fn}: the peer is this rank ({peer}); a blocking {fn} to "
                             f"itself can deadlock: use isend/irecv")
