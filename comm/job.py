"""The job: the world communicator, and what stops the job when a rank fails.

**A rank that raises, exits or stalls stops the job** (``watchdog.py``).  In a
job of more than one rank, an uncaught exception aborts the job; a rank that
exits with a non-zero status aborts it with that status; a rank that exits
with status 0 tells the other ranks, and a rank that waits for it (in a
collective or a message) aborts the job naming it; a wait longer than
``PYFLOW_COMM_STALL_TIMEOUT`` (default 600 s) aborts the job naming the ranks
that did not arrive and what they do.  ``PYFLOW_ABORT_ON_ERROR=0`` turns all
of it off.

This module builds the world communicator once (starting the watchdog thread
in a job of more than one rank) and installs the hooks as soon as MPI is
initialised.  It is kept apart from ``communicator.py`` because it is about
the process and the job, not about moving tensors.
"""
from mpi4py import MPI

from . import watchdog as _wd
from .communicator import Communicator

__all__ = ["world", "install_abort_hook"]

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
