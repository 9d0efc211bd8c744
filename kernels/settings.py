"""Switches of the kernels, exposed to users as ``pyflow.backends`` (whose
docstring describes them).

They live here, in the kernel layer, because kernels read them
(``kernels/cuda/linalg.py`` asks ``cuda.matmul`` who computes a GEMM) and a
kernel may import nothing above ``kernels/`` and the device level;
``pyflow/backends.py`` re-exports the same objects.
"""

__all__ = ["cuda"]


class MatmulChoice(str):
    """``pyflow.backends.cuda.matmul``: the name of who computes GEMMs ("numba" or
    "cublas", compared as a string), carrying PyTorch's
    ``torch.backends.cuda.matmul`` flags so that code setting them runs:
    ``allow_tf32`` (False, as PyTorch's default),
    ``allow_fp16_reduced_precision_reduction`` and
    ``allow_bf16_reduced_precision_reduction`` (True).  They are accepted and
    kept, and change nothing yet: pyflow's numba GEMM computes in full float32,
    and the cuBLAS route runs CuPy's default (no TF32 unless CuPy is told by
    its own CUPY_TF32 variable)."""

    FLAGS = {"allow_tf32": False, "allow_fp16_reduced_precision_reduction": True,
             "allow_bf16_reduced_precision_reduction": True}

    def __new__(cls, name, flags=None):
        choice = super().__new__(cls, name)
        for flag, default in cls.FLAGS.items():
            object.__setattr__(choice, flag, (flags or {}).get(flag, default))
        return choice

    def __setattr__(self, name, value):
        if name not in self.FLAGS:
            raise AttributeError(f"pyflow.backends.cuda.matmul has no flag {name!r}; flags: "
                                 f"{sorted(self.FLAGS)}")
        if not isinstance(value, bool):
            raise TypeError(f"pyflow.backends.cuda.matmul.{name} must be True or False, "
                            f"got {value!r}")
        object.__setattr__(self, name, value)

    def flags(self):
        return {flag: getattr(self, flag) for flag in self.FLAGS}


class CudaSettings:
    """Settings of the ``cuda`` device's kernels."""

    MATMUL_CHOICES = ("numba", "cublas")
    matmul = MatmulChoice("numba")

    def __setattr__(self, name, value):
        if name == "matmul":
            if not isinstance(value, str) or value not in self.MATMUL_CHOICES:
                raise ValueError(f"pyflow.backends.cuda.matmul must be one of "
                                 f"{list(self.MATMUL_CHOICES)}, got {value!r}")
            value = MatmulChoice(str(value), self.matmul.flags())   # the flags stay
        elif not hasattr(type(self), name) or name.isupper():
            raise AttributeError(f"pyflow.backends.cuda has no setting {name!r}; "
                                 f"settings: ['matmul']")
        object.__setattr__(self, name, value)

    def __repr__(self):
        return f"pyflow.backends.cuda(matmul={str(self.matmul)!r})"


cuda = CudaSettings()
