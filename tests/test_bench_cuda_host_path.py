"""bench/cuda_host_path.py runs (simulated device, launches stubbed) and prints a
row per op with its Python calls and microseconds."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_cuda_host_path_bench_prints_every_op():
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "cuda_host_path.py"),
                           "--number", "3", "--repeats", "1"], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {line.split("|")[1].strip(): line.split("|")[2:4] for line in proc.stdout.splitlines()
            if line.startswith("| ") and not line.startswith("| op ")}
    assert set(rows) == {"add", "mul by a scalar", "broadcast add (16x16 + 16)", "relu", "matmul",
                         "softmax", "layer_norm", "mul, recorded for autograd"}, proc.stdout
    for calls, us in rows.values():
        assert int(calls) > 0 and float(us) > 0
