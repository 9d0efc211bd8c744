"""``Communicator``: MPI collectives on pyflow Tensors.

Every byte between ranks moves in an MPI call (mpi4py); this module only
decides which buffer to hand over (``staging.MPIBuffer``), converts half
precision for reductions, and checks that the ranks agree before a collective.
Its neighbours hold the other topics: ``agreement.py`` the agreement check
and the timeouts, ``p2p.py`` point-to-point messages, ``work.py`` the
non-blocking handle, ``wire.py`` what MPI sees of a tensor, ``job.py`` the
world communicator and what stops a job when a rank fails.

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

**A rank that raises, exits or stalls stops the job** (``watchdog.py``,
installed by ``job.py``).  For that, every call that waits for other ranks
records what it waits for (``watchdog.enter``/``leave``: a few stores into the
thread's record, no MPI call, no lock) for the watchdog thread, which polls;
the collectives stay plain MPI calls on the caller's thread.
"""
import functools
import os

import numpy as np
from mpi4py import MPI

from pyflow import dtypes as _dt

from . import watchdog as _wd
from .agreement import (CHECK_ENV_VAR, TIMEOUT_ENV_VAR, Agreement,  # noqa: F401 (re-exported)
                        CollectiveMismatchError, CollectiveTimeoutError, check_default,
                        timeout_value)
from .p2p import PointToPoint
from .staging import MPIBuffer
from .watchdog import ABORT_ENV_VAR  # noqa: F401 (re-exported)
from .watchdog import enter as _enter, leave as _leave
from .wire import (ARITH_OPS, DIRECT_DTYPES, DIRECT_OPS, REDUCE_OPS, WIRE, cast, check_chunked,
                   check_op, check_tensor, divide, empty_like, is_half, mpi_op, new_tensor, wire)
from .work import Work, done

__all__ = ["Communicator", "Work", "CollectiveMismatchError", "CollectiveTimeoutError",
           "REDUCE_OPS"]


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
class Communicator(Agreement, PointToPoint):
    """A group of ranks: the world, or a sub-group made by ``group(ranks)``.  The
    agreement check and the timeouts come from ``Agreement``, messages from
    ``PointToPoint``; the collectives are here."""

    def __init__(self, mpi_comm, check=None, timeout=None):
        self.mpi = mpi_comm
        self.rank = mpi_comm.Get_rank()
        self.size = mpi_comm.Get_size()
        self.check = check_default() if check is None else bool(check)
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
        self._timeout = timeout_value(value, f"{TIMEOUT_ENV_VAR} / Communicator.timeout")

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

    # ----------------------------------------------------------------- all_reduce
    def all_reduce(self, tensor, op="sum", check=None):
        """Reduce ``tensor`` over all ranks, in place; returns it."""
        data = getattr(tensor, "_data", None)
        if type(data) is np.ndarray and data.flags.c_contiguous and op in DIRECT_OPS \
                and type(tensor.dtype) is _dt.dtype and tensor.dtype in DIRECT_DTYPES:
            # The common case straight to MPI, with no Work, MPIBuffer or closure:
            # Python time between two collectives costs several times itself (the
            # ranks leave the previous one skewed).  4 MB streams, check off:
            # +3.2-4.7% over raw mpi4py through _all_reduce, +0.9-2.1% like this.
            token = _enter("all_reduce", self._world_ranks, self._timeout) \
                if self._watched else None
            try:
                self._agree("all_reduce", "all_reduce", tensor, op, check=check)
                self.mpi.Allreduce(MPI.IN_PLACE, [data, WIRE[data.dtype]], ARITH_OPS[op])
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
        check_tensor(fn, t)
        op = check_op(fn, op, t.dtype)
        self._agree(fn, "all_reduce", t, op, check=check)
        dev = t.device.type
        half = is_half(t.dtype)
        work_array = cast(t._data, dev, t.dtype, _dt.float32) if half else t._data
        buf = MPIBuffer(work_array, read=True, write=True)
        args = (MPI.IN_PLACE, wire(buf.mpi), mpi_op(op, t.dtype))

        def finish(status):
            if op == "avg":
                divide(buf.mpi, self.size)
            buf.finish()
            if half:
                t._data[...] = cast(work_array, dev, _dt.float32, t.dtype)
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
        check_tensor(fn, t)
        self._agree(fn, "all_gather", t, check=check)
        shape = tuple(t.shape) or (1,)
        out_shape = (self.size * shape[0],) + shape[1:]
        inp = MPIBuffer(t._data.reshape(shape), read=True, write=False)
        out_array = empty_like(out_shape, t.dtype.storage, t._data)
        out = MPIBuffer(out_array, read=False, write=True)
        result = new_tensor(t, out_array)
        return self._post(blocking, self.mpi.Allgather, self.mpi.Iallgather,
                          (wire(inp.mpi), wire(out.mpi)), finisher(inp, out), result, fn)

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
        check_tensor(fn, t)
        op = check_op(fn, op, t.dtype)
        check_chunked(fn, t, self.size)
        self._agree(fn, "reduce_scatter", t, op, check=check)
        dev, half = t.device.type, is_half(t.dtype)
        src = cast(t._data, dev, t.dtype, _dt.float32) if half else t._data
        out_shape = (t.shape[0] // self.size,) + tuple(t.shape[1:])
        out_array = empty_like(out_shape, src.dtype, t._data)
        inp = MPIBuffer(src, read=True, write=False)
        out = MPIBuffer(out_array, read=False, write=True)

        def finish(status):
            if op == "avg":
                divide(out.mpi, self.size)
            inp.finish()
            out.finish()
            data = cast(out_array, dev, _dt.float32, t.dtype) if half else out_array
            return new_tensor(t, data)

        return self._post(blocking, self.mpi.Reduce_scatter_block,
                          self.mpi.Ireduce_scatter_block,
                          (wire(inp.mpi), wire(out.mpi), mpi_op(op, t.dtype)), finish, None,
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
        check_tensor(fn, t)
        check_chunked(fn, t, self.size)
        self._agree(fn, "all_to_all", t, check=check)
        inp = MPIBuffer(t._data, read=True, write=False)
        out_array = empty_like(tuple(t.shape), t.dtype.storage, t._data)
        out = MPIBuffer(out_array, read=False, write=True)
        result = new_tensor(t, out_array)
        return self._post(blocking, self.mpi.Alltoall, self.mpi.Ialltoall,
                          (wire(inp.mpi), wire(out.mpi)), finisher(inp, out), result, fn)

    # ----------------------------------------------------------------- broadcast
    @_waits("broadcast")
    def broadcast(self, tensor, root=0, check=None):
        """Copy ``root``'s tensor into every rank's ``tensor`` (in place); returns it."""
        return self._broadcast("broadcast", tensor, root, check, True).wait()

    @_waits("ibroadcast")
    def ibroadcast(self, tensor, root=0, check=None):
        return self._broadcast("ibroadcast", tensor, root, check, False)

    def _broadcast(self, fn, t, root, check, blocking):
        check_tensor(fn, t)
        root = self._check_rank(fn, "root", root)
        self._agree(fn, "broadcast", t, root=root, check=check)
        is_root = self.rank == root
        buf = MPIBuffer(t._data, read=is_root, write=not is_root)

        def finish(status):
            buf.finish()
            if not is_root:
                t._version[0] += 1

        return self._post(blocking, self.mpi.Bcast, self.mpi.Ibcast, (wire(buf.mpi), root),
                          finish, t, fn)

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
            return done(None)
        return Work(self.mpi.Ibarrier())

    # ----------------------------------------------------------------- internals
    def _check_rank(self, fn, argname, r):
        if isinstance(r, bool) or not isinstance(r, (int, np.integer)) or not 0 <= r < self.size:
            raise ValueError(f"{fn}: {argname} must be a rank in [0, {self.size}), got {r!r}")
        return int(r)

    def _post(self, blocking, run, post, args, finish, result, fn=None):
        if blocking:
            run(*args)
            w = Work(None, finish, result)
            w._complete()
            return w
        return Work(post(*args), finish, result, self._timeout, fn,
                    self._world_ranks if self._watched else None)


def finisher(*buffers):
    """A Work's finish step that finishes every ``MPIBuffer`` of the call."""
    def finish(status):
        for b in buffers:
            b.finish()
    return finish

