"""Checks run on every rank of an MPI test worker: each failure is recorded
(not raised, so every rank reaches every collective), then reported once as
``rank r: N checks, F failures`` with a non-zero exit on any failure."""
import sys
import traceback


def raises(exc, match, fn):
    """Assert that ``fn()`` raises ``exc`` with ``match`` in its message."""
    try:
        fn()
    except exc as e:
        assert match in str(e), f"message {str(e)!r} lacks {match!r}"
        return
    raise AssertionError(f"no {exc.__name__} raised")


class RankChecks:
    def __init__(self, rank):
        self.rank, self.count, self.failures = rank, 0, []

    def __call__(self, name, fn, *args):
        """Run ``fn(*args)``; an exception or a failed assert is a failure."""
        self.count += 1
        try:
            fn(*args)
        except Exception:  # noqa: BLE001 (report every failing check, not just the first)
            self.failures.append(f"{name}: {traceback.format_exc()}")

    def report_and_exit(self):
        for f in self.failures:
            print(f"rank {self.rank}: FAILED {f}", flush=True)
        print(f"rank {self.rank}: {self.count} checks, {len(self.failures)} failures", flush=True)
        sys.exit(1 if self.failures else 0)


def assert_all_ranks_passed(proc, n, min_checks):
    """The test side: ``proc`` (a finished MPI run of a RankChecks worker on ``n``
    ranks) printed a summary for every rank, no failure, at least ``min_checks``
    checks each, and exited with 0."""
    import re
    out = proc.stdout + proc.stderr
    summaries = {r: (int(c), int(f)) for r, c, f in re.findall(
        r"^rank (\d+): (\d+) checks, (\d+) failures$", proc.stdout, re.M)}
    assert sorted(summaries) == [str(r) for r in range(n)], f"rc {proc.returncode}:\n{out[-6000:]}"
    failed = "\n".join(line for line in proc.stdout.splitlines() if "FAILED" in line)
    assert all(f == 0 for _, f in summaries.values()) and proc.returncode == 0, \
        failed[-6000:] + out[-3000:]
    assert min(c for c, _ in summaries.values()) >= min_checks
