"""Is the MPI library CUDA-aware?  Asked once, at run time.

A CUDA-aware MPI reads and writes GPU memory itself, so a cuda tensor's device
buffer is handed to MPI directly (after the stream is synchronised).  Otherwise
pyflow stages the bytes through reused pinned host buffers (``staging.py``).

The answer, in order of precedence:

1. ``PYFLOW_CUDA_AWARE_MPI=0|1`` in the environment (an MPI that misreports,
   or a test forcing one path);
2. ``MPI.Query_cuda_support()`` where mpi4py exposes it (mpi4py >= 4 built
   against an MPI that has it);
3. Open MPI's ``MPIX_Query_cuda_support()`` looked up with ctypes in the
   ``libmpi`` that mpi4py loaded (a run-time answer: it is 0 when Open MPI was
   built with CUDA but finds no CUDA library at run time);
4. otherwise False: staging is always correct, only slower.
"""
import ctypes
import ctypes.util
import os

__all__ = ["cuda_aware_mpi", "ENV_VAR"]

ENV_VAR = "PYFLOW_CUDA_AWARE_MPI"
_answer = []          # [(bool, how it was decided)] once asked


def cuda_aware_mpi(explain=False):
    """True if MPI can take CUDA device buffers; with ``explain=True`` returns
    ``(answer, reason)``."""
    if not _answer:
        _answer.append(_decide())
    return _answer[0] if explain else _answer[0][0]


def _decide():
    forced = os.environ.get(ENV_VAR)
    if forced is not None and forced.strip() != "":
        if forced.strip() not in ("0", "1"):
            raise ValueError(f"{ENV_VAR}: expected '0' or '1', got {forced!r}")
        return forced.strip() == "1", f"{ENV_VAR}={forced.strip()}"
    from mpi4py import MPI
    query = getattr(MPI, "Query_cuda_support", None)
    if query is not None:
        try:
            return bool(query()), "MPI.Query_cuda_support()"
        except Exception:  # noqa: BLE001 (not implemented by this MPI: ask ctypes)
            pass
    fn = _mpix_query()
    if fn is not None:
        return bool(fn()), "MPIX_Query_cuda_support() (ctypes)"
    return False, "no CUDA-awareness query in this MPI"


def _loaded_libmpi():
    """Path of the libmpi this process has loaded (mpi4py's), else a guess."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1]
                if os.path.basename(path).startswith("libmpi.so"):
                    return path
    except OSError:
        pass
    return ctypes.util.find_library("mpi")


def _mpix_query():
    from mpi4py import MPI  # noqa: F401  (make sure libmpi is loaded first)
    path = _loaded_libmpi()
    if not path:
        return None
    try:
        fn = ctypes.CDLL(path).MPIX_Query_cuda_support
    except (OSError, AttributeError):
        return None
    fn.restype, fn.argtypes = ctypes.c_int, []
    return fn
