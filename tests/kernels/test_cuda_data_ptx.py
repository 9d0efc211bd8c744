"""Every CUDA data-movement kernel (copy, index, join, embedding, dropout, cast,
optim) compiles to PTX for sm_80 and sm_90, for the dtypes it is launched with.

``numba.cuda.compile_ptx`` needs no GPU (NVVM comes with the numba-cuda[cu12]
wheels), so typing errors in code the simulator runs as plain Python (float16
stores, uint32 bit tricks of the bf16 cast and of Philox, atomics on each
dtype, float32 staying float32) are caught here.  Arguments have the types
the host code passes: 1-D C-contiguous spans, int64 offsets, tuples of int64
strides (3 dims here; the index loops are the same for any count), scalars of
the data's dtype.
"""
import pytest
from numba import types as nb

from pyflow.kernels.cuda import cast, copy, dropout, embedding, index, join, optim

from .cudatools import compile_ptx, compile_ptx_all

i64 = nb.int64
U2, U3 = nb.UniTuple(i64, 2), nb.UniTuple(i64, 3)
F16, F32, F64 = nb.float16, nb.float32, nb.float64
I32, I64, B, W16, W32 = nb.int32, nb.int64, nb.boolean, nb.uint16, nb.uint32
STORAGE = [B, W16, F16, F32, F64, I32, I64]       # every storage dtype (bf16 is uint16 words)
ATOMIC = [F32, F64, I32, I64]
FLOATS = [F32, F64]


def a(t):
    return t[::1]


def _specs():
    """(label, fresh python function, signature) of every kernel launch type."""
    specs = []

    def add(module, name, sig, label=None):
        fns = getattr(module, "KERNEL_FUNCTIONS", None)
        fn = fns[name] if fns else module.KERNEL_FACTORIES[name]()
        specs.append((f"{module.__name__.rsplit('.', 1)[1]}.{label or name}", fn, sig))

    # copy: every storage dtype pair (the casts), contiguous and strided
    for src in STORAGE:
        for dst in STORAGE:
            to_bool = dst == B and src != B
            label = f"{src}->{dst}"
            copy_fns = copy.KERNEL_FUNCTIONS
            specs.append((f"copy.contiguous {label}", copy_fns[("contiguous", to_bool)],
                          (a(dst), a(src))))
            if src == dst or src in (F32, F64) or dst == B:
                specs.append((f"copy.strided {label}", copy_fns[("strided", to_bool)],
                              (a(dst), i64, U3, a(src), i64, U3, i64, U3)))
    # index
    add(index, "minmax_rows", (a(I64), i64, a(I64)))
    for t in STORAGE:
        add(index, "gather3", (a(t), a(t), i64, U3, a(I64), U3), f"gather3 {t}")
        add(index, "scatter3", (a(t), i64, U3, a(I64), a(t), i64, U3, U3), f"scatter3 {t}")
        add(index, "advanced_gather", (a(t), a(t), i64, U3, U3, U3, a(I64), i64, U2, U2),
            f"advanced_gather {t}")
    for t in ATOMIC:
        add(index, "scatter3_add", (a(t), i64, U3, a(I64), a(t), i64, U3, U3), f"scatter3_add {t}")
        add(index, "index_add3", (a(t), i64, U3, a(I64), a(t), i64, U3, U3), f"index_add3 {t}")
    add(index, "scatter3_or", (a(B), i64, U3, a(I64), a(B), i64, U3, U3))
    add(index, "index_add3_or", (a(B), i64, U3, a(I64), a(B), i64, U3, U3))
    # join
    for t in STORAGE:
        add(join, "remap", (a(t), a(t), i64, U3, U3, U3, U3), f"remap {t}")
        add(join, "triangle", (a(t), a(t), i64, U3, U3, i64, i64), f"triangle {t}")
        add(join, "pad", (a(t), a(t), i64, U3, U3, U3, U3, t), f"pad {t}")
        add(join, "fill", (a(t), t), f"fill {t}")
    add(join, "one_hot", (a(I64), a(I64), i64))
    # embedding
    for t in FLOATS:
        add(embedding, "gather_rows", (a(t), a(t), i64, U2, a(I64), i64), f"gather_rows {t}")
        add(embedding, "scatter_add_rows", (a(t), a(t), a(I64), i64, i64),
            f"scatter_add_rows {t}")
        add(embedding, "scatter_add_rows_scaled", (a(t), a(t), a(I64), i64, i64, a(I64)),
            f"scatter_add_rows_scaled {t}")
    add(embedding, "count_rows", (a(I64), a(I64)))
    # dropout: masked_scale is the registered ``dropout``, bias_dropout_add_philox the
    # registered ``dropout_philox`` and ``bias_dropout_add_philox`` (mask drawn on the
    # device), philox_words its known-answer kernel
    for t in [F16, F32, F64]:
        add(dropout, "masked_scale", (a(t), a(t), a(B), t, t), f"masked_scale {t}")
        add(dropout, "bias_dropout_add_philox", (a(t), a(B), a(t), a(t), a(t), B, B, i64, F32,
                                                 t, t, W32, W32, W32, W32),
            f"bias_dropout_add_philox {t}")
    add(dropout, "philox_words", (a(W32),) + (W32,) * 6)
    # cast (bfloat16 bit kernels; the rest are copies)
    add(cast, "f32_bits_to_bf16", (a(W16), a(W32)))
    add(cast, "bf16_to_f32_bits", (a(W32), a(W16)))
    # optim
    for t in FLOATS:
        add(optim, "adam", (a(t),) * 5 + (t,) * 8 + (B,) * 4, f"adam {t}")
        add(optim, "sgd", (a(t),) * 3 + (t,) * 4 + (B,) * 5, f"sgd {t}")
        W = optim.TUPLE_WIDTH
        A = nb.UniTuple(a(t), W)
        add(optim, "adam_multi", (A,) * 5 + (nb.UniTuple(t, W * optim.ADAM_HP),
                                             nb.UniTuple(B, W * optim.ADAM_FLAGS), i64),
            f"adam_multi {t}")
        add(optim, "sgd_multi", (A,) * 3 + (nb.UniTuple(t, W * optim.SGD_HP),
                                            nb.UniTuple(B, W * optim.SGD_FLAGS), i64),
            f"sgd_multi {t}")
    return specs


SPECS = _specs()


def ptx_kernels():
    """The plain kernel functions this file compiles (for tests/test_op_coverage.py)."""
    return [fn for _, fn, _ in SPECS]


@pytest.mark.parametrize("label", [s[0] for s in SPECS])
def test_kernel_compiles_to_ptx(label, monkeypatch):
    fn, sig = next((f, s) for lab, f, s in _specs() if lab == label)   # fresh device functions
    compile_ptx_all(fn, sig, monkeypatch)


def test_every_kernel_function_has_a_spec():
    covered = {lab.split(" ")[0] for lab, _, _ in SPECS}
    for module in (index, join, embedding, cast, optim):
        for name in module.KERNEL_FUNCTIONS:
            assert f"{module.__name__.rsplit('.', 1)[1]}.{name}" in covered, name
    for name in dropout.KERNEL_FACTORIES:
        assert f"dropout.{name}" in covered, name
    assert {"copy.contiguous", "copy.strided"} <= covered


@pytest.mark.parametrize("label", ["optim.adam float32", "optim.sgd float32",
                                   "dropout.masked_scale float32",
                                   "dropout.bias_dropout_add_philox float32",
                                   "embedding.scatter_add_rows float32"])
def test_float32_kernels_stay_in_float32(label, monkeypatch):
    """float32 math must not fall back to float64 (2x-64x slower on a GPU)."""
    fn, sig = next((f, s) for lab, f, s in _specs() if lab == label)
    ptx = compile_ptx(fn, sig, (9, 0), monkeypatch)
    f64 = [line for line in ptx.splitlines() if ".f64" in line]
    assert not f64, f"{label}: float64 instructions {f64[:3]}"


def test_bfloat16_cast_is_integer_only(monkeypatch):
    fn, sig = next((f, s) for lab, f, s in _specs() if lab == "cast.f32_bits_to_bf16")
    ptx = compile_ptx(fn, sig, (8, 0), monkeypatch)
    assert not [line for line in ptx.splitlines() if ".f32" in line or ".f64" in line]
