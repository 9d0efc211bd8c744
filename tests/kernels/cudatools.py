"""Shared tools for testing CUDA kernels without a GPU.

- ``run_in_simulator(script)``: numba's simulator must be on before numba is
  imported, and the test process imported numba without it, so simulator
  checks are scripts run in a child process with NUMBA_ENABLE_CUDASIM=1.  A
  script prints ``N checks, F failures`` and exits non-zero on any failure.
- ``compile_ptx(kernel, signature, cc, monkeypatch)``: NVVM from the
  numba-cuda[cu12] wheels compiles PTX with no GPU; numba-cuda 0.30 still asks
  for "the current device" when a kernel calls device functions, so a stand-in
  of the target compute capability is patched in.
"""
import os
import subprocess
import sys
import types

import numba.cuda.dispatcher as cuda_dispatcher
from numba import cuda

HERE = os.path.dirname(os.path.abspath(__file__))
CCS = [(8, 0), (9, 0)]


def run_in_simulator(script, timeout=600):
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    proc = subprocess.run([sys.executable, "-W", "ignore::RuntimeWarning",
                           os.path.join(HERE, script)],   # (an absolute script path wins)
                          env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"simulator checks failed:\n{proc.stdout}\n{proc.stderr}"
    assert " 0 failures" in proc.stdout, proc.stdout
    return proc.stdout


def compile_ptx(kernel, signature, cc, monkeypatch):
    monkeypatch.setattr(cuda_dispatcher, "get_current_device",
                        lambda: types.SimpleNamespace(compute_capability=cc))
    ptx, _ = cuda.compile_ptx(kernel, signature, cc=cc)
    assert f".target sm_{cc[0]}{cc[1]}" in ptx, ptx[:400]
    return ptx
