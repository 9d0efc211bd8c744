"""Thread pools when NumPy or PyTorch was imported before pyflow (pyflow/_threads.py).

Each case runs in a fresh interpreter: the settings are read once per process,
when the libraries load, so the import order is the thing under test.
"""
import json
import os
import subprocess
import sys

import pytest

from pyflow import _threads

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROBE = """
import json, sys
for name in sys.argv[1:]:
    __import__(name)
import numpy as np
from pyflow import _threads, backends
a = np.arange(256 * 256, dtype=np.float64).reshape(256, 256) / 65536
print(json.dumps({"timeout": _threads.openblas_thread_timeout(),
                  "report": backends.cpu.threads,
                  "gemm_ok": bool(np.allclose(a @ a, np.einsum("ij,jk->ik", a, a)))}))
"""


def _probe(*imports, guard=None):
    env = {k: v for k, v in os.environ.items()        # a user's shell: nothing set for us
           if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OPENBLAS_THREAD_TIMEOUT",
                        "PYFLOW_THREAD_GUARD")}
    if guard is not None:
        env["PYFLOW_THREAD_GUARD"] = guard
    out = subprocess.run([sys.executable, "-c", PROBE, *imports, "pyflow"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.cpu_only
def test_pyflow_first_sets_the_short_openblas_timeout():
    got = _probe()
    assert got["timeout"] == [int(_threads.OPENBLAS_TIMEOUT)]
    assert got["report"]["numpy imported before pyflow"] is False
    assert got["report"]["OpenBLAS"] == "none needed"
    assert got["report"]["OpenMP"] == (f"GOMP_SPINCOUNT={_threads.OPENMP_SPINCOUNT} "
                                       "(spin, then sleep)")


@pytest.mark.cpu_only
def test_numpy_first_openblas_pool_is_restarted_with_the_short_timeout():
    got = _probe("numpy")
    assert got["timeout"] == [int(_threads.OPENBLAS_TIMEOUT)], \
        "OpenBLAS kept its spinning default (timeout 0)"
    assert got["report"]["numpy imported before pyflow"] is True
    assert f"restarted with OPENBLAS_THREAD_TIMEOUT={_threads.OPENBLAS_TIMEOUT}" in got["report"]["OpenBLAS"]
    assert got["gemm_ok"]


@pytest.mark.cpu_only
def test_guard_off_leaves_the_preloaded_pool_spinning():
    got = _probe("numpy", guard="0")
    assert got["timeout"] == [0]
    assert "PYFLOW_THREAD_GUARD=0" in got["report"]["OpenBLAS"]


@pytest.mark.cpu_only
def test_torch_first():
    pytest.importorskip("torch")
    got = _probe("torch")
    assert got["timeout"] == [int(_threads.OPENBLAS_TIMEOUT)]
    assert got["report"]["torch imported before pyflow"] is True
    assert got["report"]["OpenMP"].startswith("loaded before pyflow")
    assert got["gemm_ok"]


@pytest.mark.cpu_only
def test_ranks_sharing_the_machine_get_passive_openmp_waits():
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    env["OMPI_COMM_WORLD_LOCAL_SIZE"] = "2"
    out = subprocess.run([sys.executable, "-c", "import os, pyflow; print(os.environ['OMP_WAIT_POLICY'])"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "PASSIVE", out.stderr


def _env_after_import(**env_changes):
    """os.environ's OpenMP settings in a fresh process after ``import pyflow``."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMPI_COMM_WORLD_LOCAL_SIZE")}
    env.update(env_changes)
    code = ("import os, pyflow; print(os.environ.get('OMP_WAIT_POLICY'), "
            "os.environ.get('GOMP_SPINCOUNT'), pyflow.backends.cpu.threads['OpenMP'])")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.split(maxsplit=2)


@pytest.mark.cpu_only
def test_one_rank_gets_a_short_openmp_spin():
    policy, spin, report = _env_after_import()
    assert (policy, spin) == ("None", _threads.OPENMP_SPINCOUNT)
    assert report.strip() == f"GOMP_SPINCOUNT={_threads.OPENMP_SPINCOUNT} (spin, then sleep)"
    # what the user set wins: a spin count of their own, or a wait policy (no spin count added)
    assert _env_after_import(GOMP_SPINCOUNT="500")[1] == "500"
    assert _env_after_import(OMP_WAIT_POLICY="ACTIVE")[:2] == ["ACTIVE", "None"]
    assert _env_after_import(OMPI_COMM_WORLD_LOCAL_SIZE="2")[:2] == ["PASSIVE", "None"]


@pytest.mark.cpu_only
def test_bad_guard_value_is_an_error():
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    env["PYFLOW_THREAD_GUARD"] = "yes"
    out = subprocess.run([sys.executable, "-c", "import numpy, pyflow"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "PYFLOW_THREAD_GUARD: expected '0' or '1', got 'yes'" in out.stderr
