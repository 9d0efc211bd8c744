"""The CUDA GEMM, convolution and pooling kernels compile to PTX for sm_80 and sm_90.

``numba.cuda.compile_ptx`` needs no GPU (NVVM comes with the numba-cuda[cu12]
wheels), so this catches what the simulator never compiles: float16 loads
into float32 accumulators, integer GEMMs, the production tile sizes (the
simulator runs a 16-thread tile), shared/local array shapes from closures.
"""
import numpy as np
import pytest
from numba import types as nbtypes

from pyflow.kernels.cuda import conv, linalg, pool
from tests.kernels.cudatools import compile_ptx, compile_ptx_all, ptxas_resources


def _gemm_specs():
    """(dtype, tile, A's k contiguous, B's n contiguous, bias): the production tiles
    of each dtype, both load layouts of each operand, with and without the epilogue."""
    specs = []
    for dtype in linalg.DTYPES:
        for tile in linalg.tiles(dtype):
            specs += [(dtype, tile, True, True, False), (dtype, tile, False, False, True)]
    return specs


def ptx_kernels():
    """The plain kernel functions this file compiles (for tests/test_op_coverage.py)."""
    fns = [linalg.gemm_function(*spec) for spec in _gemm_specs()]
    fns += [fn for module in (conv, pool) for dtype in conv.DTYPES
            for fn, _ in module.signatures(dtype).values()]
    return fns + [linalg._add_rows_function()]


@pytest.mark.parametrize("spec", _gemm_specs(),
                         ids=lambda s: f"{s[0].name}-{s[1].BM}x{s[1].BN}-{int(s[2])}{int(s[3])}"
                                       f"{'-bias' if s[4] else ''}")
def test_gemm_compiles(spec, monkeypatch):
    """Compiled as the kernel cache compiles it (with its launch bounds), each GEMM
    keeps to 128 registers a thread without spilling (ptxas -v for sm_90): two
    blocks of 256 threads per multiprocessor."""
    dtype, tile = spec[:2]
    bounds = linalg.gemm_launch_bounds(dtype, tile)
    ptxes = compile_ptx_all(linalg.gemm_function(*spec), linalg.gemm_signature(dtype, 2),
                            monkeypatch, launch_bounds=bounds)
    for (major, minor), ptx in ptxes.items():      # tiles go through shared memory
        assert "ld.shared" in ptx and "bar.sync" in ptx, f"sm_{major}{minor}: no shared tiles"
    used = ptxas_resources(ptxes[(9, 0)], (9, 0))
    assert used["registers"] <= 128, f"{spec}: {used['registers']} registers a thread"
    assert used["spill_stores"] == used["spill_loads"] == used["stack"] == 0, \
        f"{spec}: spills to local memory: {used}"
    assert bounds == (256, 2)


def test_float32_gemm_stays_in_registers_and_float32(monkeypatch):
    """The register block must not spill to local memory, nor the math widen to float64."""
    for tile in (linalg.LARGE_TILE, linalg.SMALL_TILE):
        ptx = compile_ptx(linalg.gemm_function(np.float32, tile, True, True, True),
                          linalg.gemm_signature(np.float32, 1), (9, 0), monkeypatch)
        assert ".local" not in ptx, f"{tile}: the accumulators spilled to local memory"
        assert not [line for line in ptx.splitlines() if ".f64" in line]
        # one multiply-add per output per k step, unrolled over the register block
        assert ptx.count("fma.rn.f32") >= tile.TM * tile.TN


@pytest.mark.parametrize("dtype", conv.DTYPES, ids=str)
@pytest.mark.parametrize("module", [conv, pool], ids=["conv", "pool"])
def test_conv_and_pool_kernels_compile(module, dtype, monkeypatch):
    kernels = module.signatures(dtype)
    assert len(kernels) == 5
    for name, (fn, signature) in kernels.items():
        for (major, minor), ptx in compile_ptx_all(fn, signature, monkeypatch).items():
            if dtype == np.float32:
                f64 = [line for line in ptx.splitlines() if ".f64" in line]
                assert not f64, \
                    f"{name} sm_{major}{minor}: float64 instructions in a float32 kernel: {f64[:3]}"


def test_cublas_bias_kernel_compiles(monkeypatch):
    arr = nbtypes.float32[::1]
    compile_ptx_all(linalg._add_rows_function(), (arr, arr, nbtypes.int64), monkeypatch)


def test_production_tiles_fit_a_block():
    for tile in (linalg.LARGE_TILE, linalg.SMALL_TILE, linalg.SIM_TILE):
        threads = (tile.BM // tile.TM) * (tile.BN // tile.TN)
        assert threads <= 1024
        shared = 2 * tile.BK * (max(tile.BM, tile.BN) + 4) * 8      # padded rows, float64
        assert shared <= 48 * 1024


def test_the_resource_table_in_the_docs_covers_every_gemm_variant():
    """docs/cuda.md keeps the table tests/kernels/cuda_resources.py prints: a row
    per variant ``launch_gemm`` can compile, each within the budget."""
    from tests.kernels import cuda_resources
    doc = cuda_resources.DOC.read_text()
    table = doc.split(cuda_resources.BEGIN)[1].split(cuda_resources.END)[0]
    rows = {line.split("|")[1].strip(): line.split("|")[2:-1]
            for line in table.splitlines() if line.startswith("| gemm")}
    for spec in cuda_resources.gemm_specs():
        label = cuda_resources.gemm_label(*spec)
        assert label in rows, f"docs/cuda.md lacks {label!r}: run " \
                              f"python tests/kernels/cuda_resources.py --write"
        registers, _, spilled, _ = (cell.strip() for cell in rows[label])
        assert int(registers) <= 128 and spilled == "0", (label, rows[label])
