"""Backend switches, in the style of ``torch.backends``.

``pyflow.backends.cuda.matmul`` picks who computes matrix products (matmul,
bmm, linear) on the ``cuda`` device:

* ``"numba"`` (the default): pyflow's own tiled numba.cuda GEMM
  (``kernels/cuda/linalg.py``), which also runs in numba's simulator;
* ``"cublas"``: cuBLAS through ``cupy.matmul`` (tensor cores where CuPy
  enables them).  It needs a real GPU: under the simulator the GEMM raises.

Assignments are validated, so a typo fails where it is made instead of
silently keeping the default.  ``matmul`` also carries PyTorch's flags
(``pyflow.backends.cuda.matmul.allow_tf32`` ...), and ``pyflow.backends.cudnn``
has PyTorch's cuDNN switches (``benchmark``, ``deterministic``, ...): both are
accepted so PyTorch code runs, and change nothing (pyflow uses no cuDNN, and
its GEMMs compute in full float32).

``pyflow.backends.cpu.threads`` reports the CPU thread pools' settings and
what ``import pyflow`` did about pools that another library (PyTorch, or any
import of NumPy) had started before it (``pyflow/_threads.py``).
``pyflow.backends.cpu.blas`` reports which BLAS runs CPU matrix products
(MKL above measured size thresholds, or NumPy's) and why: measured on this
machine, read from the cache, or forced by ``PYFLOW_BLAS``
(``kernels/cpu/blas.py``).

The cuda settings object is defined in ``kernels/settings.py``, beside the
kernels that read it (a kernel imports nothing above the device level), and
re-exported here.
"""
from . import _threads
from .kernels import settings as _kernel_settings

__all__ = ["cpu", "cuda", "cudnn"]


class _CpuBackend:
    """What pyflow's CPU kernels run on (read-only)."""

    @property
    def threads(self):
        """The thread pools' wait settings, and whether NumPy or PyTorch was
        imported before pyflow and what was done about it."""
        return _threads.report()

    @property
    def blas(self):
        """Which BLAS runs matrix products and why: library, MKL's size
        thresholds, source ("cache", "measured", "forced", "no MKL"), the cache
        file, the measured times.  The first read chooses, as the first matrix
        product would: from the cache, or by measuring (about 1-2 s)."""
        return _blas().report()

    def __repr__(self):
        # Not the BLAS report before the choice is made: a repr must not measure.
        blas = self.blas if _blas().chosen() else "(chosen at the first matrix product)"
        return f"pyflow.backends.cpu(threads={self.threads!r}, blas={blas!r})"


def _blas():
    # Imported on use: ``python -m pyflow.kernels.cpu.blas`` must find it not yet
    # imported by ``import pyflow`` (runpy warns otherwise).
    from .kernels.cpu import blas
    return blas


cpu = _CpuBackend()


cuda = _kernel_settings.cuda     # the object kernels/cuda/linalg.py reads


class _CudnnBackend:
    """``torch.backends.cudnn``'s switches, accepted so that PyTorch code setting
    them runs.  pyflow does not use cuDNN (its convolutions and pooling are its
    own numba kernels), so ``is_available()`` is False, ``version()`` None, and
    the switches are kept but change nothing: ``enabled`` (True), ``benchmark``
    (False), ``deterministic`` (False), ``allow_tf32`` (True), PyTorch's
    defaults."""

    SETTINGS = {"enabled": True, "benchmark": False, "deterministic": False,
                "allow_tf32": True}

    def __init__(self):
        for name, default in self.SETTINGS.items():
            object.__setattr__(self, name, default)

    def __setattr__(self, name, value):
        if name not in self.SETTINGS:
            raise AttributeError(f"pyflow.backends.cudnn has no setting {name!r}; settings: "
                                 f"{sorted(self.SETTINGS)}")
        if not isinstance(value, bool):
            raise TypeError(f"pyflow.backends.cudnn.{name} must be True or False, got {value!r}")
        object.__setattr__(self, name, value)

    @staticmethod
    def is_available():
        return False

    @staticmethod
    def version():
        return None

    def __repr__(self):
        return ("pyflow.backends.cudnn(" + ", ".join(f"{k}={getattr(self, k)!r}"
                                                     for k in self.SETTINGS) + ")")


cudnn = _CudnnBackend()
