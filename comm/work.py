"""``Work``: the handle of a non-blocking operation.

``iall_reduce`` and the other non-blocking forms post MPI's non-blocking
call and return a ``Work``; ``wait()`` finishes it (copies staged results
back, narrows half precision, bumps versions) and returns the result.  Kept
apart from the collectives because it is the one object they all share, and
because under a timeout its ``wait`` polls instead of blocking
(``agreement.py``).
"""
import time

from mpi4py import MPI

from .agreement import TIMEOUT_ENV_VAR, CollectiveTimeoutError, poll
from .watchdog import enter as _enter, leave as _leave

__all__ = ["Work", "done"]


class Work:
    """Handle of a non-blocking operation (``torch.distributed.Work``-like)."""

    __slots__ = ("_request", "_finish", "_result", "_done", "_status", "_timeout", "_what",
                 "_ranks")

    def __init__(self, request, finish=None, result=None, timeout=None, what=None, ranks=None):
        self._request, self._finish, self._result = request, finish, result
        self._done = False
        self._status = MPI.Status()
        self._timeout, self._what = timeout, what
        self._ranks = ranks           # world ranks the wait needs (recorded for the watchdog)

    def wait(self):
        """Block until done; returns the result (the tensor for in-place ops).  With a
        timeout (the communicator's), raises CollectiveTimeoutError past it."""
        if not self._done:
            if self._request is not None:
                token = None if self._ranks is None else \
                    _enter(f"wait({self._what})", self._ranks, self._timeout)
                try:
                    self._wait()
                finally:
                    _leave(token)
            self._complete()
        return self._result

    def _wait(self):
        if self._timeout is None:
            self._request.Wait(self._status)
        elif not poll(lambda: self._request.Test(self._status),
                       time.monotonic() + self._timeout):
            if self._what and self._what.startswith("irecv"):
                self._request.Cancel()      # no late message may land in it now
                self._request.Wait()
                self._done = True
            raise CollectiveTimeoutError(
                f"{self._what or 'wait'}: not finished after {self._timeout:g} s "
                f"({TIMEOUT_ENV_VAR}); a peer stopped making progress")

    def test(self):
        """True (and the operation finished) if it has completed; never blocks."""
        if not self._done and (self._request is None or self._request.Test(self._status)):
            self._complete()
        return self._done

    is_completed = test

    def result(self):
        return self.wait()

    def _complete(self):
        self._done = True
        if self._finish is not None:
            finish, self._finish = self._finish, None
            out = finish(self._status)
            if out is not None:
                self._result = out


def done(result):
    w = Work(None, None, result)
    w._done = True
    return w

