"""CUDA kernels: ``numba.cuda`` kernels mirroring ``kernels/cpu/`` module by module.

On a machine with a GPU they run on device memory handed over through
``__cuda_array_interface__``; with ``NUMBA_ENABLE_CUDASIM=1`` and no GPU the
very same kernels run in numba's simulator on NumPy arrays (that is how CI
exercises them).  The math of elementwise ops is shared with the CPU backend:
both are generated from ``kernels/scalar.py``.
"""
import importlib
import pkgutil

from . import _simulator

_simulator.install()   # warp shuffles for numba's simulator (a no-op on a GPU)


def load_all():
    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{info.name}")
