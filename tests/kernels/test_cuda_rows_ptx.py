"""Every CUDA kernel listed in a module's ``kernel_specs()`` compiles to PTX for
sm_80 and sm_90: the row kernels (softmax, normalization, loss) and any new
``kernels/cuda`` module that lists its kernels the same way, found by
``cudatools.spec_modules()`` (no list here to edit).

``numba.cuda.compile_ptx`` needs no GPU, so this catches what the simulator
cannot: typing errors in compiled code, real warp shuffles (the simulator has
none and runs a Python stand-in), and float32 kernels quietly computing in
float64 (2x-64x slower on a GPU).  ``kernel_specs()`` returns
``[(label, plain Python function, numba signature)]``, with fresh device
functions; a label that says ``float32`` promises no float64 instruction.
ptxas then assembles the sm_90 PTX (``ptxas -v``): no kernel may spill to
local memory, and a float32 one may use at most 64 registers a thread.
"""
import numpy as np
import pytest

from pyflow.kernels.cuda import rows
from tests.kernels.cudatools import compile_ptx_all, ptxas_resources, spec_modules

MODULES = spec_modules()
SPECS = [(name, label) for name, module in MODULES.items() for label, _, _ in module.kernel_specs()]
# the row kernels whose labels name the ones built on a block reduction
ROW_MODULES = ("softmax", "normalization", "loss")


def ptx_kernels():
    """The plain kernel functions this file compiles (for tests/test_op_coverage.py)."""
    return [fn for module in MODULES.values() for _, fn, _ in module.kernel_specs()]


def test_the_row_modules_are_found():
    assert set(ROW_MODULES) <= set(MODULES), sorted(MODULES)


def _spec(module, label):
    for name, fn, signature in MODULES[module].kernel_specs():
        if name == label:
            return fn, signature
    raise KeyError(label)


@pytest.mark.parametrize("module,label", SPECS, ids=[f"{m}:{l}" for m, l in SPECS])
def test_row_kernel_compiles_to_ptx(module, label, monkeypatch):
    fn, signature = _spec(module, label)
    block_reduction = module in ROW_MODULES and any(
        k in label for k in ("rows", "layer_norm_forward", "cross_entropy", "channel_stats",
                             "batch_norm_backward", "backward_dx"))
    ptxes = compile_ptx_all(fn, signature, monkeypatch)
    for (major, minor), ptx in ptxes.items():
        sm = f"sm_{major}{minor}"
        if "float32" in label:   # float32 data never computed in float64
            f64 = [line for line in ptx.splitlines() if ".f64" in line]
            assert not f64, f"{label} {sm}: float64 instructions {f64[:3]}"
        if block_reduction:
            assert "shfl.sync.down" in ptx and "bar.sync" in ptx, \
                f"{label} {sm}: no block reduction"
    # ptxas -v for sm_90: nothing in local memory; float32 kernels within 64
    # registers a thread, so even a block of 1024 threads fits a multiprocessor
    used = ptxas_resources(ptxes[(9, 0)], (9, 0))
    assert used["spill_stores"] == used["spill_loads"] == used["stack"] == 0, \
        f"{label}: spills to local memory: {used}"
    if "float32" in label or "f32" in label:
        assert used["registers"] <= 64, f"{label}: {used['registers']} registers a thread"


def test_every_registered_cpu_row_kernel_has_a_cuda_twin():
    from pyflow.kernels import registry
    names = {"softmax", "log_softmax", "softmax_backward", "log_softmax_backward",
             "layer_norm", "layer_norm_backward", "batch_norm_stats", "batch_norm_apply",
             "batch_norm_backward", "cross_entropy", "cross_entropy_backward", "nll_loss",
             "nll_loss_backward", "bce_with_logits"}
    for name in names:
        cpu, gpu = registry.get(name, "cpu"), registry.get(name, "cuda")
        assert cpu.__code__.co_varnames[:cpu.__code__.co_argcount] == \
            gpu.__code__.co_varnames[:gpu.__code__.co_argcount], name


def test_launch_shapes():
    assert rows.row_threads(1) == 32 and rows.row_threads(33) == 64
    assert rows.row_threads(10 ** 6) == rows.MAX_ROW_THREADS
    assert rows.row_blocks(0) == 1 and rows.row_blocks(10 ** 9) == rows.MAX_ROW_BLOCKS
    assert rows._c_contiguous((2, 3), (24, 8), 8)
    assert not rows._c_contiguous((2, 3), (8, 16), 8)
    assert rows._c_contiguous((2, 1, 3), (24, 999, 8), 8)     # size-1 dims: any stride


def test_bad_dtype_is_a_clear_error():
    with pytest.raises(TypeError, match="float32 or float64 x, got int32"):
        rows.check_float(np.zeros(3, np.int32), "softmax")
