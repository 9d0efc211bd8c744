"""``Communicator``: MPI collectives and point-to-point on pyflow Tensors.

Every byte between ranks moves in an MPI call (mpi4py); this module only
decides which buffer to hand over (``staging.MPIBuffer``), converts half
precision for reductions, and checks that the ranks agree before a collective.

Conventions (those of ``torch.distributed`` where it has one):

* ``all_reduce``, ``broadcast`` and ``recv`` work **in place** and return the
  tensor; ``all_gather``, ``reduce_scatter`` and ``all_to_all`` return a new
  tensor on the input's device.
* ``all_gather`` **concatenates** along dim 0 (``all_gather_into_tensor``):
  ``(n, *rest)`` on each rank gives ``(size * n, *rest)``, rank r's piece at
  rows ``[r*n, (r+1)*n)``; a 0-d tensor gives shape ``(size,)``.  That is the
  S(0) -> B boxing step.
* ``reduce_scatter`` and ``all_to_all`` split dim 0 into ``size`` equal chunks
  (dim 0 must be divisible by ``size``): chunk j goes to rank j.
* ``op``: ``"sum" | "avg" | "max" | "min"``.  On bool tensors sum and max are
  a logical or and min a logical and (MPI has no arithmetic on bool); avg needs
  a floating point tensor.
* float16 and bfloat16 (stored as uint16 words) **reductions** run in float32:
  each rank converts to float32 on its device, MPI reduces float32, the result
  is rounded back once.  MPI has no 16-bit float arithmetic, a user-defined
  MPI op would run Python per chunk, and rounding once at the end is also more
  accurate than rounding at every hop; the price is twice the bytes on the
  wire.  Data movement (gather, broadcast, all_to_all, send/recv) sends the
  16-bit words unchanged.
* Non-blocking forms (``iall_reduce``, ``iall_gather``, ``ireduce_scatter``,
  ``iall_to_all``, ``ibroadcast``, ``isend``, ``irecv``, ``ibarrier``) post
  MPI's non-blocking operation (``Iallreduce``...) and return a ``Work``:
  ``wait()`` finishes it and returns the result (the tensor for in-place
  forms), ``test()`` says whether it is done.  Do not touch the tensor before
  ``wait()``.

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

**A rank that raises, exits or stalls stops the job** (``watchdog.py``).  In a
job of more than one rank, an uncaught exception aborts the job; a rank that
exits with a non-zero status aborts it with that status; a rank that exits
with status 0 tells the other ranks, and a rank that waits for it (in a
collective or a message) aborts the job naming it; a wait longer than
``PYFLOW_COMM_STALL_TIMEOUT`` (default 600 s) aborts the job naming the ranks
that did not arrive and what they do.  For that, every call that waits for
other ranks records what it waits for (``watchdog.enter``/``leave``: a few
stores into the thread's record, no MPI call, no lock) for the watchdog
thread, which polls; the collectives stay plain MPI calls on the caller's
thread.  ``PYFLOW_ABORT_ON_ERROR=0`` turns all of it off.
"""
import functools
import os
import time

import numpy as np
from mpi4py import MPI

from pyflow import dtypes as _dt
from pyflow.tensor import Tensor

from . import watchdog as _wd
from .staging import MPIBuffer, is_host_array
from .watchdog import ABORT_ENV_VAR  # noqa: F401 (re-exported)
from .watchdog import enter as _enter, leave as _leave

__all__ = ["Communicator", "Work", "CollectiveMismatchError", "CollectiveTimeoutError", "world",
           "REDUCE_OPS"]

CHECK_ENV_VAR = "PYFLOW_COMM_CHECK"
TIMEOUT_ENV_VAR = "PYFLOW_COMM_TIMEOUT"
REDUCE_OPS = ("sum", "avg", "max", "min")
_MAX_DIMS = 8                         # dims compared exactly by the agreement check
_MAX_DESCRIPTORS = 4096               # distinct calls whose descriptors a communicator keeps
_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "barrier")
_TAG_MOD = 32767                      # the smallest TAG_UB MPI guarantees
_DTYPE_CODES = {d.name: i for i, d in enumerate(_dt.ALL)}

# What MPI sees for each storage dtype.  float16 travels as 16-bit words (MPI
# has no float16; reductions convert to float32 first, see the module docstring).
_WIRE = {np.dtype(np.float32): MPI.FLOAT, np.dtype(np.float64): MPI.DOUBLE,
         np.dtype(np.float16): MPI.UINT16_T, np.dtype(np.uint16): MPI.UINT16_T,
         np.dtype(np.int32): MPI.INT32_T, np.dtype(np.int64): MPI.INT64_T,
         np.dtype(np.bool_): MPI.C_BOOL}
_ARITH_OPS = {"sum": MPI.SUM, "avg": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}
_DIRECT_OPS = ("sum", "max", "min")        # all_reduce's direct path (no avg division)
_DIRECT_DTYPES = (_dt.float32, _dt.float64, _dt.int32, _dt.int64)
_BOOL_OPS = {"sum": MPI.LOR, "max": MPI.LOR, "min": MPI.LAND}


class CollectiveMismatchError(RuntimeError):
    """Ranks called a collective with different shapes, dtypes, ops or roots."""


class CollectiveTimeoutError(RuntimeError):
    """Some ranks did not reach a collective (or a message) within the timeout."""


def _timeout_value(value, where):
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


def _poll(test, deadline):
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


def _check_default():
    v = os.environ.get(CHECK_ENV_VAR, "1").strip()
    if v not in ("0", "1"):
        raise ValueError(f"{CHECK_ENV_VAR}: expected '0' or '1', got {v!r}")
    return v == "1"


def _wire(a):
    """``[buffer, datatype]`` for mpi4py (an explicit type, so float16 words and
    device arrays need no typecode guessing)."""
    return [a, _WIRE[a.dtype]]


# --------------------------------------------------------------------- Work
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
        elif not _poll(lambda: self._request.Test(self._status),
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


def _done(result):
    w = Work(None, None, result)
    w._done = True
    return w


# --------------------------------------------------------------------- helpers
def _check_tensor(fn, t, argname="tensor"):
    if not isinstance(t, Tensor):
        raise TypeError(f"{fn}: {argname} must be a pyflow Tensor, got {type(t).__name__}")
    if t.dtype.storage not in _WIRE:
        raise TypeError(f"{fn}: {argname} has unsupported dtype {t.dtype}")


def _check_op(fn, op, dtype):
    if not isinstance(op, str) or op.lower() not in REDUCE_OPS:
        raise ValueError(f"{fn}: op must be one of {REDUCE_OPS}, got {op!r}")
    op = op.lower()
    if op == "avg" and not dtype.is_floating_point:
        raise TypeError(f"{fn}: op 'avg' needs a floating point tensor, got {dtype}; "
                        f"use 'sum' and divide")
    return op


def _mpi_op(op, dtype):
    return _BOOL_OPS[op] if dtype is _dt.bool else _ARITH_OPS[op]


def _is_half(dtype):
    return dtype is _dt.float16 or dtype is _dt.bfloat16


def _cast(array, device_type, src, dst):
    from pyflow.kernels.registry import get
    return get("cast", device_type)(array, src, dst)


def _empty_like_device(shape, storage, like):
    """Uninitialised storage of ``shape`` on the device of array ``like``."""
    if is_host_array(like):
        return np.empty(shape, storage)
    from pyflow.kernels.cuda._memory import empty
    return empty(shape, storage)


def _divide(a, n):
    from pyflow.ops._util import array_module
    xp = array_module(a)
    xp.divide(a, a.dtype.type(n), out=a)


def _chunked(fn, t, size):
    if t.ndim == 0 or t.shape[0] % size:
        raise ValueError(f"{fn}: dim 0 of the tensor must be divisible by the group size "
                         f"{size}, got shape {tuple(t.shape)}")


def _waits(what):
    """Decorate a Communicator method that waits for the other ranks: record
    (for the watchdog) that the calling thread waits in ``what`` meanwhile."""
    def wrap(method):
        @functools.wraps(method)
        def call(self, *args, **kwargs):
            token = self._enter(what)
            try:
                return method(self, *args, **kwargs)
            finally:
                _leave(token)
        return call
    return wrap


# --------------------------------------------------------------------- Communicator
class Communicator:
    """A group of ranks: the world, or a sub-group made by ``group(ranks)``."""

    def __init__(self, mpi_comm, check=None, timeout=None):
        self.mpi = mpi_comm
        self.rank = mpi_comm.Get_rank()
        self.size = mpi_comm.Get_size()
        self.check = _check_default() if check is None else bool(check)
        self._groups = {}
        self._control = None          # duplicate communicator for arrival messages
        self._seq = 0                 # collectives so far under a timeout (the tag)
        self._stale = []              # sends to ranks that never arrived (kept alive)
        self._descriptors = {}        # agreement check: call -> (descriptor, table, bytes)
        self.timeout = os.environ.get(TIMEOUT_ENV_VAR) if timeout is None else timeout
        # World ranks, named in the watchdog's records and messages.
        self._world_ranks = tuple(self.world_ranks(range(self.size)))
        self._watched = self.size > 1 and _wd.enabled()
        if self._timeout is not None and self.size > 1:
            # Dup is collective: make it now, while every rank is constructing this
            # communicator, not at a collective that some rank may skip.
            self._control = mpi_comm.Dup()

    def __repr__(self):
        return f"Communicator(rank={self.rank}, size={self.size})"

    @property
    def timeout(self):
        """Seconds a rank waits for the others in a collective, or None (forever)."""
        return self._timeout

    @timeout.setter
    def timeout(self, value):
        self._timeout = _timeout_value(value, f"{TIMEOUT_ENV_VAR} / Communicator.timeout")

    @_waits("split")
    def split(self, color, key=0):
        """MPI's ``Comm_Split``: the ranks that pass the same ``color`` form a new
        communicator, ordered by ``key``; ``color=None`` gives None.  Collective:
        every rank calls it (one collective for any number of groups)."""
        if color is not None and (isinstance(color, bool) or not isinstance(color, int)
                                  or color < 0):
            raise ValueError(f"split: color must be a non-negative int or None, got {color!r}")
        new = self.mpi.Split(MPI.UNDEFINED if color is None else color, key)
        return None if new == MPI.COMM_NULL else Communicator(new, self.check, self._timeout)

    def _enter(self, what, ranks=None):
        """Record that this thread waits in ``what`` for ``ranks`` (world ranks;
        default: this communicator's); the token for ``_leave``."""
        if not self._watched:
            return None
        return _wd.enter(what, self._world_ranks if ranks is None else ranks, self._timeout)

    def _pair(self, peer):
        """The world ranks of this rank and ``peer`` (what a message needs)."""
        return (self._world_ranks[self.rank], self._world_ranks[peer])

    def world_ranks(self, ranks):
        """The world ranks of ranks ``ranks`` of this communicator."""
        return list(MPI.Group.Translate_ranks(self.mpi.Get_group(), list(ranks),
                                              MPI.COMM_WORLD.Get_group()))

    # ----------------------------------------------------------------- groups
    @_waits("group")
    def group(self, ranks):
        """The sub-communicator of ``ranks`` (ranks of this communicator; their
        order gives the new ranks), or None on ranks not in it.  Collective: every
        rank of this communicator calls it with the same list.  Cached per list,
        so calling it again is free."""
        try:
            ranks = tuple(int(r) for r in ranks)
        except TypeError:
            raise TypeError(f"group: ranks must be a list of ints, got {ranks!r}") from None
        if not ranks or len(set(ranks)) != len(ranks) or \
                any(r < 0 or r >= self.size for r in ranks):
            raise ValueError(f"group: ranks must be distinct ranks in [0, {self.size}), "
                             f"got {list(ranks)}")
        if ranks in self._groups:
            return self._groups[ranks]
        if self.check:
            key = np.zeros(self.size + 1, np.int64)
            key[0] = len(ranks)
            key[1:len(ranks) + 1] = ranks
            table = np.empty((self.size, key.size), np.int64)
            self.mpi.Allgather(key, table)
            if (table != table[0]).any():
                calls = "; ".join(f"rank {r}: {row[1:row[0] + 1].tolist()}"
                                  for r, row in enumerate(table))
                raise CollectiveMismatchError(f"group: ranks called it with different rank "
                                              f"lists: {calls}")
        mpi_group = self.mpi.Get_group().Incl(list(ranks))
        new = self.mpi.Create(mpi_group)
        mpi_group.Free()
        sub = None if new == MPI.COMM_NULL else Communicator(new, self.check, self._timeout)
        self._groups[ranks] = sub
        return sub

    # ----------------------------------------------------------------- agreement
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

        if not _poll(all_arrived, time.monotonic() + self._timeout):
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

    # ----------------------------------------------------------------- all_reduce
    def all_reduce(self, tensor, op="sum", check=None):
        """Reduce ``tensor`` over all ranks, in place; returns it."""
        data = getattr(tensor, "_data", None)
        if type(data) is np.ndarray and data.flags.c_contiguous and op in _DIRECT_OPS \
                and type(tensor) is Tensor and tensor.dtype in _DIRECT_DTYPES:
            # The common case straight to MPI, with no Work, MPIBuffer or closure:
            # Python time between two collectives costs several times itself (the
            # ranks leave the previous one skewed).  4 MB streams, check off:
            # +3.2-4.7% over raw mpi4py through _all_reduce, +0.9-2.1% like this.
            token = _enter("all_reduce", self._world_ranks, self._timeout) \
                if self._watched else None
            try:
                self._agree("all_reduce", "all_reduce", tensor, op, check=check)
                self.mpi.Allreduce(MPI.IN_PLACE, [data, _WIRE[data.dtype]], _ARITH_OPS[op])
            finally:
                if token is not None:
                    token[4] = False                # watchdog.leave, inline
            tensor._version[0] += 1
            return tensor
        token = self._enter("all_reduce")
        try:
            return self._all_reduce("all_reduce", tensor, op, check, blocking=True).wait()
        finally:
            _leave(token)

    @_waits("iall_reduce")
    def iall_reduce(self, tensor, op="sum", check=None):
        return self._all_reduce("iall_reduce", tensor, op, check, blocking=False)

    def _all_reduce(self, fn, t, op, check, blocking):
        _check_tensor(fn, t)
        op = _check_op(fn, op, t.dtype)
        self._agree(fn, "all_reduce", t, op, check=check)
        dev = t.device.type
        half = _is_half(t.dtype)
        work_array = _cast(t._data, dev, t.dtype, _dt.float32) if half else t._data
        buf = MPIBuffer(work_array, read=True, write=True)
        args = (MPI.IN_PLACE, _wire(buf.mpi), _mpi_op(op, t.dtype))

        def finish(status):
            if op == "avg":
                _divide(buf.mpi, self.size)
            buf.finish()
            if half:
                t._data[...] = _cast(work_array, dev, _dt.float32, t.dtype)
            t._version[0] += 1

        return self._post(blocking, self.mpi.Allreduce, self.mpi.Iallreduce, args, finish, t,
                          fn)

    # ----------------------------------------------------------------- all_gather
    @_waits("all_gather")
    def all_gather(self, tensor, check=None):
        """Every rank's ``tensor`` concatenated along dim 0 (a new tensor)."""
        return self._all_gather("all_gather", tensor, check, blocking=True).wait()

    @_waits("iall_gather")
    def iall_gather(self, tensor, check=None):
        return self._all_gather("iall_gather", tensor, check, blocking=False)

    def _all_gather(self, fn, t, check, blocking):
        _check_tensor(fn, t)
        self._agree(fn, "all_gather", t, check=check)
        shape = tuple(t.shape) or (1,)
        out_shape = (self.size * shape[0],) + shape[1:]
        inp = MPIBuffer(t._data.reshape(shape), read=True, write=False)
        out_array = _empty_like_device(out_shape, t.dtype.storage, t._data)
        out = MPIBuffer(out_array, read=False, write=True)
        result = Tensor._make(out_array, t.dtype, t.device)
        return self._post(blocking, self.mpi.Allgather, self.mpi.Iallgather,
                          (_wire(inp.mpi), _wire(out.mpi)), _finisher(inp, out), result, fn)

    # ----------------------------------------------------------------- reduce_scatter
    @_waits("reduce_scatter")
    def reduce_scatter(self, tensor, op="sum", check=None):
        """Reduce over ranks, then rank r keeps chunk r of dim 0 (a new tensor of
        ``shape[0] // size`` rows)."""
        return self._reduce_scatter("reduce_scatter", tensor, op, check, True).wait()

    @_waits("ireduce_scatter")
    def ireduce_scatter(self, tensor, op="sum", check=None):
        return self._reduce_scatter("ireduce_scatter", tensor, op, check, False)

    def _reduce_scatter(self, fn, t, op, check, blocking):
        _check_tensor(fn, t)
        op = _check_op(fn, op, t.dtype)
        _chunked(fn, t, self.size)
        self._agree(fn, "reduce_scatter", t, op, check=check)
        dev, half = t.device.type, _is_half(t.dtype)
        src = _cast(t._data, dev, t.dtype, _dt.float32) if half else t._data
        out_shape = (t.shape[0] // self.size,) + tuple(t.shape[1:])
        out_array = _empty_like_device(out_shape, src.dtype, t._data)
        inp = MPIBuffer(src, read=True, write=False)
        out = MPIBuffer(out_array, read=False, write=True)

        def finish(status):
            if op == "avg":
                _divide(out.mpi, self.size)
            inp.finish()
            out.finish()
            data = _cast(out_array, dev, _dt.float32, t.dtype) if half else out_array
            return Tensor._make(data, t.dtype, t.device)

        return self._post(blocking, self.mpi.Reduce_scatter_block,
                          self.mpi.Ireduce_scatter_block,
                          (_wire(inp.mpi), _wire(out.mpi), _mpi_op(op, t.dtype)), finish, None,
                          fn)

    # ----------------------------------------------------------------- all_to_all
    @_waits("all_to_all")
    def all_to_all(self, tensor, check=None):
        """Chunk j of dim 0 goes to rank j; the result's chunk i came from rank i."""
        return self._all_to_all("all_to_all", tensor, check, True).wait()

    @_waits("iall_to_all")
    def iall_to_all(self, tensor, check=None):
        return self._all_to_all("iall_to_all", tensor, check, False)

    def _all_to_all(self, fn, t, check, blocking):
        _check_tensor(fn, t)
        _chunked(fn, t, self.size)
        self._agree(fn, "all_to_all", t, check=check)
        inp = MPIBuffer(t._data, read=True, write=False)
        out_array = _empty_like_device(tuple(t.shape), t.dtype.storage, t._data)
        out = MPIBuffer(out_array, read=False, write=True)
        result = Tensor._make(out_array, t.dtype, t.device)
        return self._post(blocking, self.mpi.Alltoall, self.mpi.Ialltoall,
                          (_wire(inp.mpi), _wire(out.mpi)), _finisher(inp, out), result, fn)

    # ----------------------------------------------------------------- broadcast
    @_waits("broadcast")
    def broadcast(self, tensor, root=0, check=None):
        """Copy ``root``'s tensor into every rank's ``tensor`` (in place); returns it."""
        return self._broadcast("broadcast", tensor, root, check, True).wait()

    @_waits("ibroadcast")
    def ibroadcast(self, tensor, root=0, check=None):
        return self._broadcast("ibroadcast", tensor, root, check, False)

    def _broadcast(self, fn, t, root, check, blocking):
        _check_tensor(fn, t)
        root = self._check_rank(fn, "root", root)
        self._agree(fn, "broadcast", t, root=root, check=check)
        is_root = self.rank == root
        buf = MPIBuffer(t._data, read=is_root, write=not is_root)

        def finish(status):
            buf.finish()
            if not is_root:
                t._version[0] += 1

        return self._post(blocking, self.mpi.Bcast, self.mpi.Ibcast, (_wire(buf.mpi), root),
                          finish, t, fn)

    # ----------------------------------------------------------------- point to point
    def send(self, tensor, dst, tag=0):
        """Send ``tensor`` to rank ``dst`` (blocks until the buffer may be reused)."""
        self._p2p_args("send", tensor, dst, tag, blocking=True)
        buf = MPIBuffer(tensor._data, read=True, write=False)
        token = self._enter(f"send to rank {self._world_ranks[dst]} (tag {tag})",
                            self._pair(dst)) if self._watched else None
        try:
            if self._timeout is None:
                self.mpi.Send(_wire(buf.mpi), dst, tag)
            else:
                Work(self.mpi.Isend(_wire(buf.mpi), dst, tag), None, None, self._timeout,
                     f"send to rank {dst} (tag {tag})").wait()
        finally:
            _leave(token)
            buf.finish()

    def isend(self, tensor, dst, tag=0):
        self._p2p_args("isend", tensor, dst, tag)
        buf = MPIBuffer(tensor._data, read=True, write=False)
        return Work(self.mpi.Isend(_wire(buf.mpi), dst, tag), lambda status: buf.finish(),
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
        elif not _poll(lambda: self.mpi.Iprobe(src, tag, status),
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
            self.mpi.Recv(_wire(buf.mpi), src, tag)
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

        return Work(self.mpi.Irecv(_wire(buf.mpi), src, tag), finish, tensor, self._timeout,
                    f"irecv from rank {src} (tag {tag})",
                    self._pair(src) if self._watched else None)

    # ----------------------------------------------------------------- barrier
    @_waits("barrier")
    def barrier(self):
        """Wait for every rank (guarded by the timeout when one is set).  With the
        agreement check on, its Allgather is the barrier (no rank leaves it before
        every rank has sent its row), so a rank that calls another collective
        meanwhile raises CollectiveMismatchError instead of hanging."""
        if self.size > 1 and (self._timeout is not None or self.check):
            self._agree("barrier", "barrier", None)       # arrival of every rank, named
            return
        self.mpi.Barrier()

    @_waits("ibarrier")
    def ibarrier(self):
        if self._timeout is not None and self.size > 1:
            self._agree("ibarrier", "barrier", None)
            return _done(None)
        return Work(self.mpi.Ibarrier())

    # ----------------------------------------------------------------- internals
    def _check_rank(self, fn, argname, r):
        if isinstance(r, bool) or not isinstance(r, (int, np.integer)) or not 0 <= r < self.size:
            raise ValueError(f"{fn}: {argname} must be a rank in [0, {self.size}), got {r!r}")
        return int(r)

    def _p2p_args(self, fn, t, peer, tag, blocking=False):
        _check_tensor(fn, t)
        peer = self._check_rank(fn, "dst" if "send" in fn else "src", peer)
        if isinstance(tag, bool) or not isinstance(tag, (int, np.integer)) or \
                not 0 <= tag <= MPI.COMM_WORLD.Get_attr(MPI.TAG_UB):
            raise ValueError(f"{fn}: tag must be an int in [0, MPI's TAG_UB], got {tag!r}")
        if blocking and peer == self.rank:
            raise ValueError(f"{fn}: the peer is this rank ({peer}); a blocking {fn} to "
                             f"itself can deadlock: use isend/irecv")

    def _post(self, blocking, run, post, args, finish, result, fn=None):
        if blocking:
            run(*args)
            w = Work(None, finish, result)
            w._complete()
            return w
        return Work(post(*args), finish, result, self._timeout, fn,
                    self._world_ranks if self._watched else None)


def _finisher(*buffers):
    def finish(status):
        for b in buffers:
            b.finish()
    return finish


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


_world = []


def world():
    """The communicator of every rank (``MPI.COMM_WORLD``); a world of one under
    plain ``python``.  In a job of more than one rank the first call starts the
    watchdog thread (``watchdog.py``)."""
    if not _world:
        _world.append(Communicator(MPI.COMM_WORLD))
        if _world[0].size > 1:
            install_abort_hook()
            _wd.start(MPI.COMM_WORLD)
    return _world[0]


def install_abort_hook():
    """Make a rank that raises or exits stop the whole job (``watchdog.install``:
    the exception hook, the exit handler, the ``sys.exit`` recorder).  Off with
    ``PYFLOW_ABORT_ON_ERROR=0``; installed once."""
    _wd.install()


# MPI is initialised once this module imports mpi4py.MPI: from here on, a rank
# that raises or exits must not leave the others waiting (see watchdog.py).
if MPI.COMM_WORLD.Get_size() > 1:
    install_abort_hook()
