"""Backend switches, in the style of ``torch.backends``.

``pyflow.backends.cuda.matmul`` picks who computes matrix products (matmul,
bmm, linear) on the ``cuda`` device:

* ``"numba"`` (the default): pyflow's own tiled numba.cuda GEMM
  (``kernels/cuda/linalg.py``), which also runs in numba's simulator;
* ``"cublas"``: cuBLAS through ``cupy.matmul`` (tensor cores where CuPy
  enables them).  It needs a real GPU: under the simulator the GEMM raises.

Assignments are validated, so a typo fails where it is made instead of
silently keeping the default.

``pyflow.backends.cpu.threads`` reports the CPU thread pools' settings and
what ``import pyflow`` did about pools that another library (PyTorch, or any
import of NumPy) had started before it (``pyflow/_threads.py``).
"""
from . import _threads

__all__ = ["cpu", "cuda"]


class _CpuBackend:
    """What pyflow's CPU kernels run on (read-only)."""

    @property
    def threads(self):
        """The thread pools' wait settings, and whether NumPy or PyTorch was
        imported before pyflow and what was done about it."""
        return _threads.report()

    def __repr__(self):
        return f"pyflow.backends.cpu(threads={self.threads!r})"


cpu = _CpuBackend()


class _CudaBackend:
    """Settings of the ``cuda`` device's kernels."""

    MATMUL_CHOICES = ("numba", "cublas")
    matmul = "numba"

    def __setattr__(self, name, value):
        if name == "matmul":
            if not isinstance(value, str) or value not in self.MATMUL_CHOICES:
                raise ValueError(f"pyflow.backends.cuda.matmul must be one of "
                                 f"{list(self.MATMUL_CHOICES)}, got {value!r}")
        elif not hasattr(type(self), name) or name.isupper():
            raise AttributeError(f"pyflow.backends.cuda has no setting {name!r}; "
                                 f"settings: ['matmul']")
        object.__setattr__(self, name, value)

    def __repr__(self):
        return f"pyflow.backends.cuda(matmul={self.matmul!r})"


cuda = _CudaBackend()
