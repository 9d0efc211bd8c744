"""CPU kernels: numba ``@njit(nogil=True, cache=True)`` and NumPy/BLAS.

Why NumPy in places: numba's pip build of llvmlite has no SVML, so
``math.exp`` inside an njit loop is a scalar libm call, about 5x slower than
NumPy's SIMD ``np.exp`` (measured: 10.2 ms vs 1.8 ms on 4M float32).  Kernels
whose cost is transcendental functions or BLAS use NumPy; loops of arithmetic,
row kernels (softmax, norms), im2col, pooling, gathers and scatters are numba.
"""
import importlib
import pkgutil


def load_all():
    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{info.name}")
