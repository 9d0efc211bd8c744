"""Switches of the kernels, exposed to users as ``pyflow.backends`` (whose
docstring describes them).

They live here, in the kernel layer, because kernels read them
(``kernels/cuda/linalg.py`` asks ``cuda.matmul`` who computes a GEMM) and a
kernel may import nothing above ``kernels/`` and the device level;
``pyflow/backends.py`` re-exports the same objects.
"""

__all__ = ["cuda"]


class CudaSettings:
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


cuda = CudaSettings()
