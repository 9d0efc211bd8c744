"""Thread pools sharing a few cores: how pyflow sets them up, and what it
does when PyTorch (or anything that imports NumPy) started them first.

A CPU training step alternates between three kinds of parallel work: numba
kernels (numba's ``omp`` layer, GNU OpenMP), MKL's GEMMs (GNU OpenMP too, the
same pool: ``kernels/cpu/blas.py``) and OpenBLAS's GEMMs (NumPy's BLAS, a
pthread pool of its own).  A pool that *spins* after its work waiting for
more keeps its cores from the pool that runs next.  Both runtimes read their
spin settings from the environment once, when they are loaded:

* ``OPENBLAS_THREAD_TIMEOUT=20`` (``OPENBLAS_TIMEOUT``): OpenBLAS workers
  spin 2^20 cycles (about 0.3 ms) after a GEMM, then sleep, instead of
  spinning 2^28 (about 90 ms; small-CNN training step 58 ms -> 12.6 ms when
  that was cut).  Until 2026-12-03 (session 13) pyflow set 4, sleeping at
  once: then each of a small GPT's ~40 GEMMs per step paid for waking a
  sleeping worker.  Measured on 2 cores (AMD EPYC, quiet machine, three
  alternating runs of ``bench/small_models.py --worker``): small GPT step
  eager 8.6-8.9 ms -> 7.5-8.0 ms, graph 6.1-6.7 -> 5.3-5.6 ms; MNIST CNN
  (50-56 ms) and ResNet-18 (413-418 ms) unchanged; 12 and 16 behaved as 4.
  ``import pyflow`` sets it (unless set) before NumPy loads.
* ``GOMP_SPINCOUNT=30000`` (``OPENMP_SPINCOUNT``): numba's OpenMP workers
  spin 30,000 rounds after a parallel kernel, then sleep, instead of
  libgomp's default 300,000 (libgomp's own estimate is 100,000 rounds a
  millisecond: ~0.3 ms, as OpenBLAS's timeout above, against ~3 ms).  A
  worker that spins keeps its core from the OpenBLAS GEMM that often comes
  next (NumPy's BLAS, a pool of its own): one GEMM of ResNet-50's weight
  gradient, (512, 32) @ (32, 4608), took 2.05 ms alone, 3.28 ms right after
  a numba ``prange`` kernel with the default spin, 1.80 ms with 10,000 and
  1.44 ms with ``OMP_WAIT_POLICY=PASSIVE``.  Sleeping sooner costs where
  numba kernels come back to back, as the workers must be woken each time:
  PASSIVE made a small GPT step 43-52 ms instead of 24-31 ms, a small CNN
  31-54 instead of 23-31 (2026-12-03).  Measured on 2 cores (AMD EPYC,
  2026-12-04, a shared and noisy machine, alternating processes, medians of
  step-time medians), default spin -> 30,000: ResNet-50 (DLPerf CPU preset)
  eager step 488 -> 354 ms (four runs each; 10,000: 365) and 402 -> 318 (three
  runs); GPT-2 (DLPerf CPU preset) 1,190 -> 1,058 ms (three runs); ResNet-18
  at 32x32 (direct numba convolutions back to back, where a shorter spin
  means more wake-ups) 601 -> 628, 676 -> 780 (with other work on the
  machine) and 651 -> 619 ms: no clear cost; the small GPT and the MNIST
  CNN, eager and graph, within the noise (their steps ranged +-30% run to
  run that day).
* ``OMP_WAIT_POLICY=PASSIVE`` where several ranks share the machine
  (``OMPI_COMM_WORLD_LOCAL_SIZE`` > 1, as under ``pyflow-run``/``mpirun``):
  a spinning worker there takes the core of another rank.

When NumPy was imported first -- ``import torch`` imports it, so does a data
pipeline -- OpenBLAS has already read its environment and spins.  That is the
case that made two frameworks in one process slow: a small GPT training step
on pyflow went from 8.3 ms to 139 ms with PyTorch imported before it, and
PyTorch's own step from 5 ms to 80 ms (both libraries' OpenMP threads and
OpenBLAS's spinning threads fighting for 2 cores).

The remedy restarts OpenBLAS's pool with the short timeout: set the variable,
call OpenBLAS's ``openblas_read_env`` (the function its loader runs) and
``blas_thread_shutdown_`` / ``blas_thread_init`` (the pair OpenBLAS itself
runs around ``fork()``), once, at import, before any pyflow kernel runs.  Where
the library lacks those entry points, OpenBLAS is limited to one thread
(threadpoolctl) instead, so that none of its threads can spin.  MKL and numba
share libgomp with PyTorch (its CPU build loads the system's GNU OpenMP), so
there is one OpenMP pool in the process, not two.

``PYFLOW_THREAD_GUARD=0`` leaves a pre-loaded OpenBLAS alone (to measure the
difference: ``bench/coexist.py``).  ``report()`` says what import found and did
(``pyflow.backends.cpu.threads``).
"""
import ctypes
import os
import sys

GUARD_ENV_VAR = "PYFLOW_THREAD_GUARD"
OPENBLAS_TIMEOUT = "20"     # 2^20 cycles of spin before an idle worker sleeps
OPENMP_SPINCOUNT = "30000"  # libgomp spin rounds before an idle worker sleeps

_found = {}


def set_wait_policies():
    """Set the runtimes' environment, noting which were loaded before pyflow."""
    _found.update(numpy_first="numpy" in sys.modules, torch_first="torch" in sys.modules,
                  user_timeout=os.environ.get("OPENBLAS_THREAD_TIMEOUT"),
                  openmp_first=_loaded("libgomp"),
                  user_wait_policy=os.environ.get("OMP_WAIT_POLICY"))
    os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", OPENBLAS_TIMEOUT)
    if _ranks_on_this_machine() > 1:
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    elif "OMP_WAIT_POLICY" not in os.environ:   # a policy the user set keeps its own spin
        os.environ.setdefault("GOMP_SPINCOUNT", OPENMP_SPINCOUNT)


def _ranks_on_this_machine():
    value = os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE", "")
    return int(value) if value.strip().isdigit() else 1


def restart_preloaded_openblas():
    """Restart a spinning OpenBLAS pool that NumPy started before pyflow."""
    if not _found["numpy_first"] or _found["user_timeout"] is not None:
        _found["action"] = "none needed"
        return
    flag = os.environ.get(GUARD_ENV_VAR, "1").strip()
    if flag not in ("0", "1"):
        raise ValueError(f"{GUARD_ENV_VAR}: expected '0' or '1', got {flag!r}")
    if flag == "0":
        _found["action"] = f"none ({GUARD_ENV_VAR}=0): OpenBLAS threads spin"
        return
    _found["action"] = _restart_openblas()


def _loaded(name):
    """Whether a shared library whose file name contains ``name`` is mapped."""
    try:
        with open("/proc/self/maps") as maps:
            return any(name in line for line in maps)
    except OSError:                   # not Linux: unknown, say no
        return False


def _openblas_libraries():
    from threadpoolctl import ThreadpoolController
    return ThreadpoolController().select(internal_api="openblas")


def _restart_openblas():
    """Re-read OpenBLAS's environment and restart its threads; returns what was done."""
    openblas = _openblas_libraries()
    done = []
    for controller in openblas.lib_controllers:
        lib = ctypes.CDLL(controller.filepath)
        try:
            read_env, shutdown, init = (lib.openblas_read_env, lib.blas_thread_shutdown_,
                                        lib.blas_thread_init)
        except AttributeError:        # a build without the entry points: no threads, no spin
            controller.set_num_threads(1)
            done.append(f"{os.path.basename(controller.filepath)} limited to 1 thread")
            continue
        read_env()
        shutdown()
        init()
        done.append(f"{os.path.basename(controller.filepath)} restarted with "
                    f"OPENBLAS_THREAD_TIMEOUT={os.environ['OPENBLAS_THREAD_TIMEOUT']}")
    return "; ".join(done) or "no OpenBLAS found"


def openblas_thread_timeout():
    """OpenBLAS's timeout setting as the library holds it (0: its long default)."""
    values = []
    for controller in _openblas_libraries().lib_controllers:
        fn = getattr(ctypes.CDLL(controller.filepath), "openblas_thread_timeout", None)
        if fn is not None:
            fn.restype = ctypes.c_int
            values.append(fn())
    return values


def report():
    """What ``import pyflow`` found already loaded and what it did about it."""
    if not _found.get("openmp_first"):
        policy, spin = os.environ.get("OMP_WAIT_POLICY"), os.environ.get("GOMP_SPINCOUNT")
        openmp = (f"OMP_WAIT_POLICY={policy}" if policy else
                  f"GOMP_SPINCOUNT={spin} (spin, then sleep)" if spin else
                  "default wait (a short spin, then sleep)")
    elif _found.get("user_wait_policy"):
        openmp = f"loaded before pyflow, OMP_WAIT_POLICY={_found['user_wait_policy']}"
    else:      # libgomp has no call to change it once loaded
        openmp = "loaded before pyflow with its default wait (a short spin, then sleep)"
    return {"numpy imported before pyflow": _found.get("numpy_first"),
            "torch imported before pyflow": _found.get("torch_first"),
            "OpenMP": openmp, "OpenBLAS": _found.get("action"),
            "OPENBLAS_THREAD_TIMEOUT": os.environ.get("OPENBLAS_THREAD_TIMEOUT")}
