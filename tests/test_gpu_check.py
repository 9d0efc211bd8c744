"""bench/gpu_check runs end to end (its --sim mode: numba's simulator, tiny sizes).
The kernel checks it would run first are the tests in tests/kernels already."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_gpu_check_runs_in_the_simulator():
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "gpu_check.py"), "--sim",
                           "--skip-checks"], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for row in ("device copy (ceiling)", "elementwise add", "sum reduction", "softmax (rows)",
                "layer_norm (rows)", "numba GEMM", "launch overhead",
                "graph step, CUDA graphs on", "step time per node, replayed"):
        assert row in proc.stdout, proc.stdout
