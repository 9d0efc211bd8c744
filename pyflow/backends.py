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

The cuda settings object is defined in ``kernels/settings.py``, beside the
kernels that read it (a kernel imports nothing above the device level), and
re-exported here.
"""
from . import _threads
from .kernels import settings as _kernel_settings

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


cuda = _kernel_settings.cuda     # the object kernels/cuda/linalg.py reads
