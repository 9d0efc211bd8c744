"""pyflow.kernels: numba kernels only, one module per op family and device.

``kernels/cpu/*.py`` hold ``@njit`` kernels (NumPy/BLAS where it is the better
tool, each such choice explained where it is made); ``kernels/cuda/*.py`` will
mirror them with ``@cuda.jit`` kernels.  Ops reach kernels only through
:mod:`pyflow.kernels.registry`.
"""
