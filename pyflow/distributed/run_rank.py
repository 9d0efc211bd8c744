"""How ``pyflow-run`` starts each rank: ``python run_rank.py script.py args...``.

Runs ``script.py`` as ``python script.py args...`` would (``runpy``:
``__name__ == "__main__"``, ``sys.argv``, the script's folder first on
``sys.path``; ``python -m mpi4py script.py`` does the same) and tells
``pyflow.comm`` how it ended: ``SystemExit(n)`` in any form (``sys.exit``,
``raise SystemExit``, ``exit()``, argparse's errors), ``KeyboardInterrupt``
(130), another exception (1), or its end (0).  Python hands ``atexit`` no exit
status, and ``pyflow.comm``'s exit handler needs it: a rank that exits with a
non-zero status aborts the job with that status, one that exits with 0 waits
for the others (``comm/watchdog.py``).  The only differences from plain
``python script.py`` are this file's and ``runpy``'s frames at the top of a
traceback.

It is run as a file, not with ``-m``: ``-m pyflow.distributed.run_rank`` would
import the ``pyflow`` package before the script, which may set environment
variables (thread counts...) before it imports pyflow.  For the same reason it
imports nothing of pyflow: when the script never imported ``pyflow.comm``,
there is nobody to tell.
"""
import os
import runpy
import sys

__all__ = ["main", "PATH"]

PATH = os.path.abspath(__file__)


def _tell_comm(code):
    watchdog = sys.modules.get("pyflow.comm.watchdog")
    if watchdog is not None:
        watchdog.note_exit(code)


def main():
    if len(sys.argv) < 2:
        sys.stderr.write(f"usage: {sys.executable} {PATH} script.py [args...]\n")
        return 2
    script = sys.argv[1]
    sys.argv[:] = sys.argv[1:]
    if getattr(sys.flags, "safe_path", False) or sys.flags.isolated:
        del sys.path[0]                    # python -P / -I: no script folder first
    else:
        sys.path[0] = os.path.dirname(os.path.realpath(script))
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        _tell_comm(e.code)
        raise
    except KeyboardInterrupt:
        _tell_comm(130)
        raise
    except BaseException:
        _tell_comm(1)                      # the exception hook aborts the job first
        raise
    _tell_comm(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
