"""bench/gpu_check runs end to end in numba's simulator (--sim, tiny sizes), and
a part that runs out of time prints its row saying so while the others print
theirs.  The kernel checks it would run first are the tests in tests/kernels."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GPU_CHECK = os.path.join(ROOT, "bench", "gpu_check.py")


def run(*args):
    return subprocess.run([sys.executable, GPU_CHECK, "--sim", *args], capture_output=True,
                          text=True, timeout=900)


def test_gpu_check_runs_in_the_simulator():
    proc = run("--skip", "kernel-checks")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for row in ("version: numba-cuda", "GPU", "device copy (ceiling)", "elementwise add",
                "sum reduction", "softmax (rows)", "layer_norm (rows)", "numba GEMM",
                "launch overhead", "graph step, CUDA graphs on", "step time per node, replayed",
                "DLPerf (cuda-small) | skipped"):
        assert row in proc.stdout, proc.stdout


def test_a_part_out_of_time_says_so_and_the_others_still_print():
    proc = run("--skip", "memory-bound", "kernel-checks", "--part-timeout", "graph-step=2")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "| part graph-step | timed out after 2 s |" in proc.stdout, proc.stdout
    for row in ("version: numba", "numba GEMM 16^3 fp32", "DLPerf (cuda-small)"):
        assert row in proc.stdout, proc.stdout


def test_bad_part_timeouts_are_refused():
    proc = run("--part-timeout", "gemm")
    assert proc.returncode == 2 and "--part-timeout takes PART=SECONDS" in proc.stderr
