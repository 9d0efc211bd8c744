"""The agreement check and the timeouts: ranks that disagree or do not arrive
raise instead of hanging.

**Agreement check.**  Ranks that call a collective with different shapes or
dtypes would, in MPI, hang or silently corrupt memory.  Before each collective
every rank contributes a 13-integer descriptor (collective, dtype, op, root,
shape) to one ``Allgather`` and compares the table; a mismatch raises
``CollectiveMismatchError`` listing every rank's call, on every rank, before
any data moves (so the communicator stays usable).  Cost: one extra small
collective per call, a few microseconds between processes of one machine:
noticeable only for tiny tensors.  Turn it off per communicator
(``Communicator(..., check=False)`` or ``comm.check = False``), per call
(``check=False``) or for the process (``PYFLOW_COMM_CHECK=0``).
Point-to-point has no collective to piggy-back on: ``recv`` probes the incoming
message and raises on the receiving rank if its size differs (the message is
drained first, so the sender does not hang).

**Timeout.**  ``PYFLOW_COMM_TIMEOUT=<seconds>`` (or ``Communicator(...,
timeout=s)``, or ``comm.timeout = s`` on every rank) bounds how long a rank
waits for the others.  A blocking MPI call cannot be interrupted, so with a
timeout set the agreement descriptor is not exchanged by ``Allgather`` but by
small non-blocking point-to-point messages on a duplicate of the communicator
(``Isend`` to every peer, ``Irecv`` from every peer, one tag per collective),
polled until every peer's has arrived or the deadline passes; then the data
moves with the usual MPI call.  On a timeout, every rank that arrived raises
``CollectiveTimeoutError`` naming the ranks that did not (their world ranks
too).  The duplicate is made (collectively) when the communicator is built
with a timeout; set ``comm.timeout`` later only on every rank at once.
``barrier`` is guarded the same way; ``recv``/``send`` poll ``Iprobe``/
``Isend``; ``Work.wait()`` polls ``Test``.  Posting a non-blocking
collective with a timeout set waits (up to the timeout) until every rank has
posted it, so the data never moves between ranks that disagree.  Without a
timeout (the default) none of this runs: the fast path is the plain MPI call.
A timeout means the program is broken (a rank skipped a collective or
hangs): the communicator is not usable afterwards; let the error stop the job.

``PYFLOW_COMM_TIMEOUT=0`` (or ``off``) is the same as leaving it unset.

They are one topic, kept apart from the collectives (``communicator.py``):
both decide, before any data moves, whether every rank has come to the same
call, and with a timeout the agreement descriptor is what the arrival
messages carry.  ``Agreement`` is the part of ``Communicator`` that does it.
"""
import os
import time

import numpy as np
from mpi4py import MPI

from pyflow import dtypes as _dt

from .wire import REDUCE_OPS

__all__ = ["Agreement", "CollectiveMismatchError", "CollectiveTimeoutError", "CHECK_ENV_VAR",
           "TIMEOUT_ENV_VAR", "timeout_value", "poll", "check_default"]

CHECK_ENV_VAR = "PYFLOW_COMM_CHECK"
TIMEOUT_ENV_VAR = "PYFLOW_COMM_TIMEOUT"
_MAX_DIMS = 8                         # dims compared exactly by the agreement check
_MAX_DESCRIPTORS = 4096               # distinct calls whose descriptors a communicator keeps
_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "barrier")
_TAG_MOD = 32767                      # the smallest TAG_UB MPI guarantees
_DTYPE_CODES = {d.name: i for i, d in enumerate(_dt.ALL)}


class CollectiveMismatchError(RuntimeError):
    """Ranks called a collective with different shapes, dtypes, ops or roots."""


class CollectiveTimeoutError(RuntimeError):
    """Some ranks did not reach a collective (or a message) within the timeout."""


def timeout_value(value, where):
    """``value`` (seconds) as a positive float, or None for no timeout (None, 0,
    "", "off", "none")."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "off", "none")):
        return None
    try:
        t = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: expected a number of seconds, got {value!r}") from None
    if not (t >= 0 and t != float("inf")):
        raise ValueError(f"{where}: expected a finite number of seconds >= 0, got {value!r}")
    return t or None


def poll(test, deadline):
    """Call ``test()`` until it is true (True) or ``deadline`` passes (False).
    Spins briefly, then sleeps a little: ranks may outnumber the cores."""
    spins = 0
    while not test():
        if time.monotonic() > deadline:
            return test()
        spins += 1
        if spins > 50:
            time.sleep(min(1e-3, 2e-6 * spins))
    return True


def check_default():
    v = os.environ.get(CHECK_ENV_VAR, "1").strip()
    if v not in ("0", "1"):
        raise ValueError(f"{CHECK_ENV_VAR}: expected '0' or '1', got {v!r}")
    return v == "1"



class Agreement:
    """The agreement check and the arrival under a timeout, for ``Communicator``
    (which sets what these methods read: ``mpi``, ``rank``, ``size``, ``check``,
    ``_timeout``, ``_control``, ``_seq``, ``_stale``, ``_descriptors`` and
    ``world_ranks``)."""

    def _agree(self, fn, kind, t, op="", root=0, check=None):
        """Raise CollectiveMismatchError on every rank if the ranks' calls differ;
        with a timeout, CollectiveTimeoutError if some ranks do not arrive."""
        timed = self._timeout is not None and self.size > 1
        checked = (self.check if check is None else check) and self.size > 1
        if not (checked or timed):
            return
        desc, table, agreed, wired = self._descriptor(kind, t, op, root)
        if timed:
            table = self._arrive(fn, desc)
            if not checked:
                return
        else:
            self.mpi.Allgather(*wired)
        # Bytes, not NumPy: this check runs before every collective, and time
        # spent between two collectives costs more than itself (the ranks leave
        # the previous one skewed).  1 MB all_reduce streams: +18 us with an
        # elementwise NumPy comparison, +0-8 us like this (bench/allreduce.py).
        if table.tobytes() != agreed:
            raise CollectiveMismatchError(
                f"{fn}: ranks called collectives that do not match (rank {self.rank} of "
                f"{self.size} sees this): " + "; ".join(
                    f"rank {r}: {_describe(row)}" for r, row in enumerate(table)))

    def _descriptor(self, kind, t, op, root):
        """(descriptor, table to gather into, the table's bytes when every rank
        agrees, the two as typed MPI buffers) for this call, built once per
        distinct call and kept."""
        key = (kind, None, op, root, ()) if t is None else \
            (kind, t.dtype.name, op, root, tuple(t.shape))
        entry = self._descriptors.get(key)
        if entry is not None:
            return entry
        desc = np.zeros(5 + _MAX_DIMS, np.int64)
        if t is not None:
            shape = key[4]
            if len(shape) > _MAX_DIMS:    # beyond 8 dims the tail is compared by its product
                shape = shape[:_MAX_DIMS - 1] + (int(np.prod(shape[_MAX_DIMS - 1:])),)
            desc[:5] = (_KINDS.index(kind), _DTYPE_CODES[t.dtype.name],
                        REDUCE_OPS.index(op) if op else -1, root, t.ndim)
            desc[5:5 + len(shape)] = shape
        else:
            desc[:5] = (_KINDS.index(kind), -1, -1, -1, 0)
        if len(self._descriptors) >= _MAX_DESCRIPTORS:    # shapes that keep changing
            self._descriptors.clear()
        table = np.empty((self.size, desc.size), np.int64)
        entry = self._descriptors[key] = (desc, table, desc.tobytes() * self.size,
                                          ([desc, MPI.INT64_T], [table, MPI.INT64_T]))
        return entry

    def _arrive(self, fn, desc):
        """Exchange ``desc`` with every peer by non-blocking point-to-point messages
        on the control communicator; the table of every rank's descriptor, or
        CollectiveTimeoutError naming the ranks whose message did not come."""
        if self._control is None:     # timeout set after construction: on every rank, please
            self._control = self.mpi.Dup()
        ctl, me = self._control, self.rank
        self._seq += 1
        tag = self._seq % _TAG_MOD
        table = np.empty((self.size, desc.size), np.int64)
        table[me] = desc
        sends = [ctl.Isend([desc, MPI.INT64_T], peer, tag)
                 for peer in range(self.size) if peer != me]
        pending = {peer: ctl.Irecv([table[peer], MPI.INT64_T], peer, tag)
                   for peer in range(self.size) if peer != me}

        def all_arrived():
            for peer in [p for p, req in pending.items() if req.Test()]:
                del pending[peer]
            return not pending

        if not poll(all_arrived, time.monotonic() + self._timeout):
            missing = sorted(pending)
            for req in pending.values():          # nobody will match them now
                req.Cancel()
                req.Wait()
            self._stale.append((desc, sends))     # may never complete: keep the buffer alive
            arrived = [r for r in range(self.size) if r not in missing]
            in_world = self.world_ranks(missing)
            world_note = "" if in_world == missing else f" (world ranks {in_world})"
            raise CollectiveTimeoutError(
                f"{fn}: timed out after {self._timeout:g} s ({TIMEOUT_ENV_VAR}) on rank {me} "
                f"of {self.size}: ranks {missing}{world_note} did not arrive (arrived: "
                f"{arrived}). They skipped this collective, called another one, or hang")
        MPI.Request.Waitall(sends)
        return table


def _describe(row):
    kind, dtype, op, root, ndim = (int(v) for v in row[:5])
    if dtype < 0:
        return f"{_KINDS[kind]}()"
    text = f"{_KINDS[kind]}(shape={tuple(int(v) for v in row[5:5 + ndim])}, " \
           f"dtype={_dt.ALL[dtype].name}"
    if op >= 0:
        text += f", op={REDUCE_OPS[op]}"
    if _KINDS[kind] == "broadcast":
        text += f", root={root}"
    return text + ")"
