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
- ``ptxas_resources(ptx, cc)``: what ``ptxas -v`` (from the nvidia-cuda-nvcc-cu12
  wheel) reports for a kernel's PTX: registers, spill bytes, stack, shared
  memory; ``occupancy(...)`` turns those into sm_90's theoretical occupancy.
  The PTX tests hold kernels to register budgets with it (docs/cuda.md).
- ``kernel_bodies(path)`` and ``cuda_kernel_modules()``: the CUDA kernels
  written in ``kernels/cuda/*.py``, found in the source, so the PTX coverage
  test (tests/test_op_coverage.py) sees a new kernel without a list to edit.
- ``spec_modules()``: the ``kernels/cuda`` modules that list their kernels in
  ``kernel_specs()`` as (label, plain function, numba signature);
  test_cuda_rows_ptx.py compiles every one of them.
"""
import ast
import importlib
import inspect
import os
import pathlib
import pkgutil
import re
import shutil
import subprocess
import sys
import tempfile
import traceback
import types

import numba.cuda.compiler as cuda_compiler
import numba.cuda.dispatcher as cuda_dispatcher
from numba import cuda

import pyflow.kernels.cuda as cuda_kernels

HERE = os.path.dirname(os.path.abspath(__file__))
CCS = [(8, 0), (9, 0)]


class Checks:
    """Named checks of a simulator child process (``run_in_simulator``): each
    runs at once; a failure is printed with its traceback and counted instead
    of raised, so one run reports every case.  ``@check("name")`` on a function
    runs it; ``check.report()`` prints the "N checks, M failures" line that
    ``run_in_simulator`` reads and returns the exit status."""

    def __init__(self):
        self.count, self.failures = 0, []

    def __call__(self, name):
        def run(fn):
            self.count += 1
            try:
                fn()
            except Exception:                       # noqa: BLE001 (reported, then counted)
                self.failures.append(name)
                print(f"FAIL {name}\n{traceback.format_exc()}")
            return fn
        return run

    def report(self):
        print(f"{self.count} checks, {len(self.failures)} failures")
        return 1 if self.failures else 0


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


def compile_ptx(kernel, signature, cc, monkeypatch, launch_bounds=None):
    _stand_in_device(cc, monkeypatch)
    ptx, _ = cuda.compile_ptx(kernel, signature, cc=cc, launch_bounds=launch_bounds)
    _check_target(ptx, cc)
    if cc == (9, 0):
        assert_no_spills(ptx, getattr(kernel, "__name__", kernel))
    return ptx


def compile_ptx_all(kernel, signature, monkeypatch, ccs=CCS, launch_bounds=None):
    """``launch_bounds``: as the kernel's ``cuda.jit`` gets them (they go into the
    PTX as .maxntid/.minnctapersm, which is what ptxas allocates registers by)."""
    compile_once = getattr(cuda_compiler, "_compile_pyfunc_with_fixup", None)
    if compile_once is None:
        return {cc: compile_ptx(kernel, signature, cc, monkeypatch, launch_bounds)
                for cc in ccs}
    _stand_in_device(ccs[0], monkeypatch)
    # the arguments cuda.compile_ptx passes: a kernel, numba ABI, no LTO
    library, _ = compile_once(kernel, signature, device=False, cc=ccs[0], abi="numba",
                              lto=False, launch_bounds=launch_bounds)
    ptxes = {}
    for cc in ccs:
        codes = library.get_asm_strs(cc=cc)
        assert len(codes) == 1, f"sm_{cc[0]}{cc[1]}: {len(codes)} PTX modules, expected one"
        _check_target(codes[0], cc)
        ptxes[cc] = codes[0]
    if (9, 0) in ptxes:
        assert_no_spills(ptxes[(9, 0)], getattr(kernel, "__name__", kernel))
    return ptxes


# ------------------------------------------------------------------ ptxas resources
# sm_90 (H100/H200) per multiprocessor: registers, threads, resident blocks, shared
# memory (228 KiB, 1 KiB of it reserved per block); registers are allocated per
# warp in units of 256.
SM90 = {"registers": 65536, "threads": 2048, "blocks": 32, "shared": 233472,
        "shared_per_block_reserved": 1024}


def ptxas():
    """The ptxas of the nvidia-cuda-nvcc-cu12 wheel (numba-cuda[cu12] installs
    it), else one on PATH, else None."""
    try:
        import nvidia.cuda_nvcc as nvcc
        path = pathlib.Path(list(nvcc.__path__)[0]) / "bin" / "ptxas"
        if path.exists():
            return str(path)
    except ImportError:
        pass
    return shutil.which("ptxas")


def ptxas_resources(ptx, cc=(9, 0)):
    """What ``ptxas -v`` reports for the one kernel in ``ptx``: {"registers",
    "spill_stores", "spill_loads", "stack", "shared"} (bytes but registers), and
    "relocatable": whether the kernel calls a function linked in at load time
    (then assembled alone, with ``-c``)."""
    exe = ptxas()
    assert exe is not None, "no ptxas (pip install numba-cuda[cu12] brings one)"
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.ptx")
        pathlib.Path(path).write_text(ptx)
        command = [exe, "-v", f"-arch=sm_{cc[0]}{cc[1]}", path,
                   "-o", os.path.join(tmp, "kernel.cubin")]
        proc = subprocess.run(command, capture_output=True, text=True, timeout=300)
        relocatable = "Unresolved extern function" in proc.stderr
        if relocatable:
            # float16 arithmetic calls numba-cuda's cuda_fp16 wrappers, linked in
            # when the kernel is loaded: assemble the kernel alone (-c); the
            # numbers are then the kernel's without those (inlined) callees
            proc = subprocess.run(command[:1] + ["-c"] + command[1:], capture_output=True,
                                  text=True, timeout=300)
    assert proc.returncode == 0, f"ptxas failed:\n{proc.stderr}"
    assert re.search(r"Used \d+ registers", proc.stderr), f"no ptxas -v report:\n{proc.stderr}"
    found = {"relocatable": relocatable}
    for key, pattern in (("stack", r"(\d+) bytes stack frame"),
                         ("spill_stores", r"(\d+) bytes spill stores"),
                         ("spill_loads", r"(\d+) bytes spill loads"),
                         ("registers", r"Used (\d+) registers"),
                         ("shared", r"(\d+) bytes smem")):
        m = re.search(pattern, proc.stderr)
        found[key] = int(m.group(1)) if m else 0
    return found


def assert_no_spills(ptx, name, cc=(9, 0)):
    """Every kernel the PTX tests compile is assembled for sm_90 too: no register
    may spill to local memory (100x slower than a register).  A stack frame is
    allowed only where it is not a spill: libdevice's sin/cos/tan reduce huge
    arguments (|x| > ~1e5) through a small local array, as CUDA C's sinf does
    (the PTX then holds its 2/pi table ``__cudart_i2opi_*``), and a kernel
    assembled alone (``relocatable``) passes arguments to its load-time-linked
    callees on the stack."""
    used = ptxas_resources(ptx, cc)
    sm = f"sm_{cc[0]}{cc[1]}"
    assert used["spill_stores"] == used["spill_loads"] == 0, \
        f"{name}: registers spill to local memory on {sm}: {used}"
    if used["stack"]:
        assert used["relocatable"] or "__cudart_i2opi_" in ptx, \
            f"{name}: a {used['stack']}-byte stack frame on {sm}: {used}"
    return used


def occupancy(registers, shared, threads, sm=SM90):
    """Theoretical occupancy (resident threads / the multiprocessor's maximum) of a
    kernel using ``registers`` a thread and ``shared`` bytes a block of ``threads``."""
    warps = -(-threads // 32)
    regs_per_warp = -(-max(registers, 1) * 32 // 256) * 256
    by_regs = sm["registers"] // (regs_per_warp * warps)
    by_threads = sm["threads"] // (warps * 32)
    by_shared = sm["shared"] // (shared + sm["shared_per_block_reserved"])
    blocks = min(by_regs, by_threads, by_shared, sm["blocks"])
    return blocks * threads / sm["threads"]


# ------------------------------------------------------------------ discovery
# Attributes only code running on a GPU thread reads.
_THREAD_INDEX = {"grid", "gridsize", "threadIdx", "blockIdx", "blockDim", "gridDim"}


def _own_nodes(fn):
    """The nodes of function ``fn``'s body, not those of functions nested in it."""
    stack = [n for n in fn.body if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    while stack:
        node = stack.pop()
        yield node
        stack += [c for c in ast.iter_child_nodes(node)
                  if not isinstance(c, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))]


def kernel_bodies(path):
    """The CUDA kernels written in the source file ``path``: [(name, first line)].

    A kernel is a function (at any nesting: most are made by factories) that
    reads ``cuda.grid``/``cuda.threadIdx``/... and returns no value: numba
    refuses a kernel that returns one, while the device functions that read
    thread indices (block reductions) return their result.  The first line is
    the one Python gives ``fn.__code__.co_firstlineno`` (a decorator's, if any).
    Kernels generated from source text at run time (elementwise.py, fused.py)
    are not in the file; their generators have their own PTX tests over every op.
    """
    found = []
    for fn in ast.walk(ast.parse(pathlib.Path(path).read_text(), str(path))):
        if not isinstance(fn, ast.FunctionDef):
            continue
        nodes = list(_own_nodes(fn))
        reads_index = any(isinstance(n, ast.Attribute) and n.attr in _THREAD_INDEX
                          and isinstance(n.value, ast.Name) and n.value.id == "cuda"
                          for n in nodes)
        returns_value = any(isinstance(n, ast.Return) and n.value is not None for n in nodes)
        if reads_index and not returns_value:
            first = min([fn.lineno] + [d.lineno for d in fn.decorator_list])
            found.append((fn.name, first))
    return found


def cuda_kernel_modules():
    """{module short name: path} of every ``kernels/cuda`` module that holds
    kernels (the ``_``-prefixed ones are memory and simulator helpers)."""
    base = pathlib.Path(cuda_kernels.__file__).parent
    return {info.name: base / f"{info.name}.py" for info in pkgutil.iter_modules([str(base)])
            if not info.name.startswith("_")}


def spec_modules():
    """{short name: module} of the ``kernels/cuda`` modules whose ``kernel_specs()``
    lists (label, plain Python function, numba signature) triples.  (reduce.py's
    ``kernel_specs()`` lists reduction specs instead; test_cuda_reduce_ptx.py
    turns them into kernels.)"""
    found = {}
    for name in cuda_kernel_modules():
        module = importlib.import_module(f"{cuda_kernels.__name__}.{name}")
        specs = getattr(module, "kernel_specs", None)
        if specs is not None and all(inspect.isfunction(fn) for _, fn, _ in specs()):
            found[name] = module
    return found
