"""bench/fused_ops.py runs end to end (tiny sizes, one round) and writes its
table: every case, both libraries, into a results section."""
import os
import subprocess
import sys

from tests.helpers import needs_torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@needs_torch
def test_fused_ops_bench_prints_every_case(tmp_path):
    results = tmp_path / "RESULTS.md"
    results.write_text("# results\n\n## Fused ops\n\nold\n")
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "fused_ops.py"),
                           "--rounds", "1", "--repeats", "1", "--rows", "64", "--cols", "32",
                           "--results", str(results)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for case in ("bias + GELU", "bias + dropout + residual", "add + layer_norm", "rms_norm",
                 "scale + mask + softmax", "cross_entropy"):
        row = next(line for line in proc.stdout.splitlines() if line.startswith(f"| {case}"))
        cells = [c.strip() for c in row.split("|")[1:-1]]
        assert all(float(cells[i]) > 0 for i in (1, 2, 4)), row
    out = results.read_text()
    assert "old" not in out and out.count("## Fused ops") == 1 and "bias + GELU" in out
