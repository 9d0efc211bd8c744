"""No job hangs because one rank failed: uncaught errors, exits and stalls.

MPI does not notice that a rank stopped taking part while its process is
alive: the other ranks wait in their collective forever (spinning a core),
and the failed rank itself waits forever in ``MPI_Finalize`` for them.  A
process that dies (a signal, ``os._exit``) is Open MPI's business: ``prterun``
ends the job at once.  This module handles the rest, in every job of more
than one rank (under plain ``python`` nothing here runs):

* **An uncaught exception** prints its traceback and calls ``MPI_Abort(1)``
  (``sys.excepthook``; ``KeyboardInterrupt``: 130).

* **An exit** (``sys.exit(n)``, the script's end, a loop that ran out of data
  early).  An ``atexit`` handler runs before MPI is finalized (mpi4py
  finalizes in a C-level ``Py_AtExit`` callback, which runs after every
  ``atexit`` handler).  A non-zero status ``n`` prints ``pyflow: rank r exited
  with status n; aborting the MPI job`` and calls ``MPI_Abort(n)``: the job
  ends with status ``n``.  Status 0 does not abort: a rank 0 that writes a
  checkpoint for a minute after rank 1 finished is a normal job.  The rank
  tells every peer's watchdog that it left, then waits for the other ranks in
  a non-blocking barrier polled with sleeps, and only then lets
  ``MPI_Finalize`` run.  A peer whose thread waits in a collective or message
  that needs the departed rank (now, or later) aborts the job with ``pyflow:
  rank 1 exited (status 0) while rank 0 waits in all_reduce on ranks [0, 1];
  aborting the MPI job``, after ``EXIT_GRACE_S`` (1 s) in that wait: the rank
  may have finished that very collective just before it left.

  The status: ``atexit`` is not told it.  ``pyflow-run`` starts each rank
  through ``pyflow/distributed/run_rank.py``, which runs the script as
  ``python script.py`` would (``runpy``) and catches ``SystemExit``: exact
  for every way out.  Under ``mpirun python script.py``, importing
  ``pyflow.comm`` replaces ``sys.exit`` by ``_recording_exit``, which notes
  the status and watches, with a profile function that removes itself at the
  first event, whether its ``SystemExit`` ends the program (the next Python
  call is interpreter shutdown's) or is caught (anything else): so
  ``sys.exit(n)`` is exact there too, and a ``sys.exit`` caught by the
  program (argparse under pytest...) is forgotten.  ``raise SystemExit(n)``,
  ``exit(n)``, the script's end, and ``sys.exit`` inside a ``with`` block
  whose ``__exit__`` is Python code leave the status unknown, handled as 0
  (no abort; peers that wait for the rank say "status unknown"; ``prterun``
  still reports the process's own status when the job ends).  A program
  that calls ``MPI.Finalize()`` itself goes through the same steps first
  (``install`` wraps it), as with status 0.

* **A stall** (a rank that hangs, or never calls the collective).  The
  ``Communicator`` records what each thread waits for: the call, the world
  ranks it needs, since when (``enter``: a few stores into the thread's
  record, 0.2-0.4 us a call; no MPI, no lock).  A daemon thread per rank
  (``Watchdog``), started by ``pyflow.comm.world()``, wakes every ``POLL_S``
  (0.1 s).  When a wait lasts
  longer than ``PYFLOW_COMM_STALL_TIMEOUT`` seconds (default 600, as
  ``torch.distributed``'s; ``0`` or ``off``: never) it asks the watchdogs of
  the ranks it waits for what their process is doing, and aborts naming the
  ranks that did not arrive and what each does (in which call and for how
  long, or in none since when, or no answer).

The watchdogs talk over their own duplicate of ``MPI.COMM_WORLD``, with small
pickled messages polled by ``improbe``; they never make a blocking MPI call,
so they spin no core, and the collectives themselves stay plain MPI calls on
the caller's thread (mpi4py initialises MPI with ``MPI_THREAD_MULTIPLE``;
``start`` checks it).  The duplicate is made by the non-blocking ``Idup``,
which ``world()`` completes polled with sleeps, as a recorded wait (a rank
that never comes is a stall like any other); a rank that never called
``world()`` posts its ``Idup`` at exit, to meet the others'.  ``PYFLOW_ABORT_ON_ERROR=0``
turns all of this off.  ``PYFLOW_COMM_TIMEOUT`` (``communicator.py``) is a
different tool: catchable ``CollectiveTimeoutError``s by polled arrivals; on a
communicator with such a timeout ``T`` the watchdog waits at least ``T + 5``
s before it aborts, so that the error comes first.
"""
import atexit
import dis
import os
import sys
import threading
import time
import traceback

from mpi4py import MPI

__all__ = ["install", "start", "enter", "leave", "waiting", "note_exit", "exit_status",
           "stall_timeout", "Watchdog", "ABORT_ENV_VAR", "STALL_ENV_VAR", "DEFAULT_STALL_S"]

ABORT_ENV_VAR = "PYFLOW_ABORT_ON_ERROR"
STALL_ENV_VAR = "PYFLOW_COMM_STALL_TIMEOUT"
DEFAULT_STALL_S = 600.0
POLL_S = 0.1            # the watchdog's sleep between two looks
EXIT_GRACE_S = 1.0      # a wait for a rank that exited lasts this long before the abort
ANSWER_S = 1.0          # how long a stalled rank waits for its peers' answers
AFTER_TIMEOUT_S = 5.0   # with PYFLOW_COMM_TIMEOUT=T, the abort waits T + this
_TAG = 7

# ------------------------------------------------------------- what this process waits for
# One record per thread that ever waited: [what, world ranks needed,
# time.monotonic() at entry, the communicator's PYFLOW_COMM_TIMEOUT or None,
# inside].  Written by the Communicator around every call that waits for other
# ranks (the fields first, ``inside`` last); read whole (one unpacking, atomic
# under the GIL) by the watchdog thread.  After the call, ``what`` and the
# entry time stay: the last call this thread made.
records = {}            # thread id -> its record
_local = threading.local()
_monotonic = time.monotonic


def _new_record():
    rec = _local.rec = [None, (), 0.0, None, False]
    records[threading.get_ident()] = rec
    return rec


def enter(what, ranks, timeout=None):
    """Record that this thread now waits in ``what`` for world ``ranks``: the
    token for ``leave``.  A call inside a recorded one records nothing."""
    try:
        rec = _local.rec
    except AttributeError:
        rec = _new_record()
    if rec[4]:
        return None
    rec[1] = ranks
    rec[2] = _monotonic()
    rec[3] = timeout
    rec[0] = what
    rec[4] = True
    return rec


def leave(token):
    if token is not None:
        token[4] = False


def waiting():
    """[(record, what, ranks, since, timeout)] of the threads waiting now."""
    out = []
    for rec in list(records.values()):
        what, ranks, since, timeout, inside = rec
        if inside:
            out.append((rec, what, ranks, since, timeout))
    return out


# ------------------------------------------------------------- settings
def enabled():
    flag = os.environ.get(ABORT_ENV_VAR, "1").strip()
    if flag not in ("0", "1"):
        raise ValueError(f"{ABORT_ENV_VAR}: expected '0' or '1', got {flag!r}")
    return flag == "1"


def stall_timeout():
    """``PYFLOW_COMM_STALL_TIMEOUT`` in seconds (default 600), or None for never."""
    text = os.environ.get(STALL_ENV_VAR)
    if text is None or not text.strip():
        return DEFAULT_STALL_S
    if text.strip().lower() in ("0", "off", "none"):
        return None
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise ValueError(f"{STALL_ENV_VAR}: expected a positive number of seconds, 0 or 'off', "
                         f"got {text!r}")
    return value


# ------------------------------------------------------------- how the process exits
_exit_code = []         # the status, once known to end the process
_pending = []           # sys.exit's status while its SystemExit may still be caught
_RETURNS = {dis.opmap[name] for name in ("RETURN_VALUE", "RETURN_CONST") if name in dis.opmap}


def _recording_exit(status=None, /):
    """``sys.exit`` that notes ``status`` for the exit handler if its
    ``SystemExit`` ends the program (not when the program catches it)."""
    if sys.getprofile() is None:          # never in the way of a profiler
        _pending[:] = [status]
        sys.setprofile(_after_exit)
    raise SystemExit(status)


def _after_exit(frame, event, arg):
    """Profile function from ``sys.exit`` to the first event that tells what
    became of its ``SystemExit``; then it removes itself (no cost afterwards)."""
    code = frame.f_code
    if code is _recording_exit.__code__:
        return                            # sys.setprofile's own c_return
    if event == "return" and code.co_code[frame.f_lasti] not in _RETURNS:
        return                            # a frame left by the exception: it goes on
    if event == "call" and (code is _SHUTDOWN_CODE or code is _at_exit.__code__):
        note_exit(_pending[0])            # the interpreter shuts down: it ended the program
    sys.setprofile(None)                  # else it was caught: the program goes on
    _pending.clear()


def _status(code):
    """The process exit status Python makes of ``SystemExit(code)``."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code % 256
    return 1                          # a message: Python prints it and exits with 1


def note_exit(code):
    """The script ended with ``SystemExit(code)`` (``code`` 0: it ran to its
    end).  Called by ``pyflow/distributed/run_rank.py``."""
    _exit_code[:] = [_status(code)]


def exit_status():
    """This process's exit status, or None when it is not known."""
    return _exit_code[0] if _exit_code else None


def _status_text(status):
    return "status unknown" if status is None else f"status {status}"


def _abort(code, message):
    try:
        print(message, file=sys.stderr, flush=True)
        sys.stdout.flush()
    finally:
        MPI.COMM_WORLD.Abort(code)


# ------------------------------------------------------------- hooks
_installed = []


def install():
    """Install the exception hook, the exit handler, the ``sys.exit`` recorder
    and the ``MPI.Finalize`` wrapper (once; nothing with
    ``PYFLOW_ABORT_ON_ERROR=0``)."""
    if _installed or not enabled():
        return
    _installed.append(os.getpid())
    previous = sys.excepthook

    def abort_on_error(kind, value, tb):
        try:
            rank = MPI.COMM_WORLD.Get_rank()
            print(f"pyflow: uncaught {kind.__name__} on rank {rank}; aborting the MPI job",
                  file=sys.stderr)
            previous(kind, value, tb)
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            MPI.COMM_WORLD.Abort(130 if issubclass(kind, KeyboardInterrupt) else 1)

    abort_on_error._pyflow_abort = True
    sys.excepthook = abort_on_error
    if getattr(sys.exit, "__module__", None) == "sys":   # not replaced by someone else
        sys.exit = _recording_exit
    atexit.register(_at_exit)
    finalize = MPI.Finalize

    def finalize_after_the_others():
        """``MPI.Finalize()`` called by the program: first this rank's exit
        protocol (as at exit with status 0), so that no watchdog call races
        MPI_Finalize and no rank waits in vain for this one."""
        if os.getpid() in _installed and MPI.Is_initialized() and not MPI.Is_finalized():
            _leave_job(None)
        finalize()

    MPI.Finalize = finalize_after_the_others


def _at_exit():
    if os.getpid() not in _installed or not MPI.Is_initialized() or MPI.Is_finalized():
        return                         # a forked child, or MPI already gone
    status = exit_status()
    if status:
        _abort(status, f"pyflow: rank {MPI.COMM_WORLD.Get_rank()} exited with status "
                       f"{status}; aborting the MPI job")
    _leave_job(status)


def _leave_job(status):
    dog = start(MPI.COMM_WORLD, connect=False)   # a rank that never called world() too
    if dog is not None:
        dog.leave(status)


# Python's shutdown first calls threading._shutdown (threading is imported above).
_SHUTDOWN_CODE = getattr(getattr(threading, "_shutdown", None), "__code__", None)


# ------------------------------------------------------------- the watchdog thread
_dog = []


def start(world, connect=True):
    """The process's ``Watchdog`` (started on first call), or None when off or
    in a world of one.  ``connect``: also wait until every rank has made the
    watchdogs' communicator (``world()`` does; a wait like any other)."""
    if not _dog and world.Get_size() > 1 and enabled():
        if MPI.Query_thread() != MPI.THREAD_MULTIPLE:
            # Its MPI calls would race the caller's: do without it (exits with
            # status 0 and stalls then go unnoticed, as before this module).
            return None
        _dog.append(Watchdog(world, stall_timeout()))
        if connect:
            ranks = tuple(range(world.Get_size()))
            token = enter("pyflow.comm.world()", ranks)
            try:
                _dog[0].connect()
            finally:
                leave(token)
    return _dog[0] if _dog else None


class Watchdog:
    """The thread that watches this rank's waits and answers its peers."""

    def __init__(self, world, stall):
        self.rank, self.size = world.Get_rank(), world.Get_size()
        self.stall = stall
        # Non-blocking, completed by ``connect``.  Open MPI cannot have it pending
        # while the caller makes another communicator (MPI_ERR_TRUNCATE in its
        # schedule), nor may two threads test one request: connect() is called
        # by the thread that called start(), before it returns to the program.
        self.comm, self._dup = world.Idup()
        self.ready = threading.Event()     # set once the Idup has completed
        self.exited = {}                   # world rank -> (status, when we learned it)
        self._answers = {}                 # (question, rank) -> that rank's state
        self._question = 0
        self._sends = []
        self._leaving = None               # (status, since) once this rank exits
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="pyflow-comm-watchdog",
                                        daemon=True)
        self._thread.start()

    def _run(self):
        try:
            while not self._stop.wait(POLL_S):
                if self.ready.is_set():
                    self._drain()
                self._check()
        except Exception:  # noqa: BLE001 (a broken watchdog must not take the job down)
            print(f"pyflow: the comm watchdog of rank {self.rank} stopped:\n"
                  f"{traceback.format_exc()}", file=sys.stderr, flush=True)

    def connect(self, patience=float("inf")):
        """Wait (polled, sleeping) until every rank has made the watchdogs'
        communicator; False after ``patience`` seconds without."""
        deadline, pause = _monotonic() + patience, 0.001
        while not self._dup.Test():
            if _monotonic() > deadline:
                return False
            time.sleep(pause)
            pause = min(2 * pause, POLL_S / 2)
        self.ready.set()
        return True

    # ---------------------------------------------------------- messages
    def _send(self, peer, message):
        with self._lock:
            self._sends = [r for r in self._sends if not r.Test()]
            self._sends.append(self.comm.isend(message, peer, _TAG))

    def _drain(self):
        status = MPI.Status()
        while True:
            msg = self.comm.improbe(MPI.ANY_SOURCE, _TAG, status)
            if msg is None:
                return
            peer, body = status.Get_source(), msg.recv()
            if body[0] == "exit":
                self.exited[peer] = (body[1], _monotonic())
            elif body[0] == "ask":
                self._send(peer, ("state", body[1], self._state()))
            elif body[0] == "state":
                self._answers[body[1], peer] = body[2]

    def _state(self):
        """What this process does now, for a peer that asks."""
        now = _monotonic()
        last = max(list(records.values()), key=lambda rec: rec[2], default=None)
        return {"waits": [(what, list(ranks), now - since)
                          for _, what, ranks, since, _ in waiting()],
                "last": None if last is None or last[0] is None else (last[0], now - last[2]),
                "leaving": None if self._leaving is None else
                (self._leaving[0], now - self._leaving[1])}

    # ---------------------------------------------------------- the look
    def _limit(self, timeout):
        if self.stall is None:
            return None
        return self.stall if timeout is None else max(self.stall, timeout + AFTER_TIMEOUT_S)

    def _check(self):
        now = _monotonic()
        for wait in waiting():
            _, what, ranks, since, timeout = wait
            for r in ranks:
                gone = self.exited.get(r)
                if gone is not None and now - max(since, gone[1]) >= EXIT_GRACE_S:
                    _abort(1, f"pyflow: rank {r} exited ({_status_text(gone[0])}) while rank "
                              f"{self.rank} waits in {what} on ranks {list(ranks)}; aborting "
                              f"the MPI job")
            limit = self._limit(timeout)
            if limit is not None and now - since > limit:
                self._stalled(wait, limit)

    def _stalled(self, wait, limit):
        """Ask the ranks this wait needs what they do; abort naming those that
        did not arrive (unless the wait ends meanwhile)."""
        rec, what, ranks, since, _ = wait
        peers = [r for r in ranks if r != self.rank]
        asked = self.ready.is_set()          # else this wait is world() making our channel
        answers = self._ask(peers) if asked else {}
        if not rec[4] or rec[2] != since:
            return                                   # it finished after all
        missing, notes = [], []
        for r in peers:
            state = answers.get(r)
            if state is not None and any(w[0] == what and tuple(w[1]) == tuple(ranks)
                                         for w in state["waits"]):
                continue                             # it is in this call too
            missing.append(r)
            notes.append(_describe(r, state, self.exited.get(r)))
        if not asked:
            who = f"some of ranks {peers} have not called pyflow.comm.world() (or exited " \
                  f"without pyflow.comm)"
        elif missing:
            who = f"ranks {missing} did not arrive: " + "; ".join(notes)
        else:
            who = "every rank arrived (" + \
                "; ".join(_describe(r, answers.get(r), None) for r in peers) + ")"
        _abort(1, f"pyflow: rank {self.rank} waited {_monotonic() - since:.1f} s in {what} on "
                  f"ranks {list(ranks)} ({STALL_ENV_VAR}={limit:g}); {who}; aborting the MPI job")

    def _ask(self, peers):
        self._question += 1
        q = self._question
        for r in peers:
            self._send(r, ("ask", q))
        deadline = _monotonic() + ANSWER_S
        while _monotonic() < deadline and \
                any((q, r) not in self._answers and r not in self.exited for r in peers):
            time.sleep(0.02)
            self._drain()
        return {r: self._answers.pop((q, r)) for r in peers if (q, r) in self._answers}

    # ---------------------------------------------------------- this rank's exit
    def leave(self, status):
        """At exit with status 0 (or unknown): tell every peer, wait for the
        others without spinning, stop the thread.  MPI_Finalize comes next."""
        if self._stop.is_set():
            return                                   # done already (MPI.Finalize, then exit)
        self._leaving = (status, _monotonic())
        patience = self.stall if self.stall is not None else float("inf")
        if not self.ready.is_set() and not self.connect(patience):
            # This rank never called world(), and some rank has not reached
            # pyflow.comm in all this time: finalize as without this module.
            self.stop()
            return
        for peer in range(self.size):
            if peer != self.rank:
                self._send(peer, ("exit", status))
        done = self.comm.Ibarrier()
        while not done.Test():
            time.sleep(POLL_S / 2)
        self.stop()

    def stop(self):
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()
        deadline = _monotonic() + 1.0                 # notices are tiny: sent at once
        with self._lock:
            while self._sends and not MPI.Request.Testall(self._sends) and \
                    _monotonic() < deadline:
                time.sleep(0.01)


def _describe(rank, state, gone):
    """One rank's doing, from its answer to a stalled peer."""
    if gone is not None:
        return f"rank {rank} exited ({_status_text(gone[0])})"
    if state is None:
        return f"rank {rank} did not answer within {ANSWER_S:g} s"
    if state["leaving"] is not None:
        status, ago = state["leaving"]
        return f"rank {rank} is exiting ({_status_text(status)}) since {ago:.1f} s"
    if state["waits"]:
        return "; ".join(f"rank {rank} waits in {what} on ranks {ranks} for {age:.1f} s"
                         for what, ranks, age in state["waits"])
    if state["last"] is not None:
        return f"rank {rank} is in no collective (the last one it entered, " \
               f"{state['last'][0]}, {state['last'][1]:.1f} s ago)"
    return f"rank {rank} is in no collective (it has not entered one)"
