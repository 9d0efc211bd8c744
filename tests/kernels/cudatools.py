"""Shared tools for testing CUDA kernels without a GPU.

- ``run_in_simulator(script)``: numba's simulator must be on before numba is
  imported, and the test process imported numba without it, so simulator
  checks are scripts run in a child process with NUMBA_ENABLE_CUDASIM=1.  A
  script prints ``N checks, F failures`` and exits non-zero on any failure.
- ``compile_ptx(kernel, signature, cc, monkeypatch)``: NVVM from the
  numba-cuda[cu12] wheels compiles PTX with no GPU; numba-cuda 0.30 still asks
  for "the current device" when a kernel calls device functions, so a stand-in
  of the target compute capability is patched in.
- ``compile_ptx_all(kernel, signature, monkeypatch)``: ``{cc: PTX}`` for every
  cc in ``CCS``.  About 80% of a compile is numba's typing and lowering to
  NVVM IR, which does not depend on the arch; only the last step, NVVM, runs
  per arch.  So the kernel is typed and lowered once (for the first cc) and
  the resulting code library is asked for each cc's PTX.  (numba-cuda's
  lowering reads the cc only to choose between code paths at cc 6.0 and 7.5,
  so both of our ccs get the same IR as separate compiles would.)  This uses
  numba-cuda's private ``_compile_pyfunc_with_fixup``, the first half of
  ``numba.cuda.compile``; with a numba-cuda that lacks it, each cc is compiled
  separately instead, which is slower but checks the same.
"""
import os
import subprocess
import sys
import types

import numba.cuda.compiler as cuda_compiler
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


def _stand_in_device(cc, monkeypatch):
    monkeypatch.setattr(cuda_dispatcher, "get_current_device",
                        lambda: types.SimpleNamespace(compute_capability=cc))


def _check_target(ptx, cc):
    target = f".target sm_{cc[0]}{cc[1]}"
    assert target in ptx, f"no {target} in the PTX:\n{ptx[:400]}"


def compile_ptx(kernel, signature, cc, monkeypatch):
    _stand_in_device(cc, monkeypatch)
    ptx, _ = cuda.compile_ptx(kernel, signature, cc=cc)
    _check_target(ptx, cc)
    return ptx


def compile_ptx_all(kernel, signature, monkeypatch, ccs=CCS):
    compile_once = getattr(cuda_compiler, "_compile_pyfunc_with_fixup", None)
    if compile_once is None:
        return {cc: compile_ptx(kernel, signature, cc, monkeypatch) for cc in ccs}
    _stand_in_device(ccs[0], monkeypatch)
    # the arguments cuda.compile_ptx passes: a kernel, numba ABI, no LTO
    library, _ = compile_once(kernel, signature, device=False, cc=ccs[0], abi="numba",
                              lto=False)
    ptxes = {}
    for cc in ccs:
        codes = library.get_asm_strs(cc=cc)
        assert len(codes) == 1, f"sm_{cc[0]}{cc[1]}: {len(codes)} PTX modules, expected one"
        _check_target(codes[0], cc)
        ptxes[cc] = codes[0]
    return ptxes
