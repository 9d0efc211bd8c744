"""The CUDA reduction kernels (``kernels/cuda/reduce.py``).

The kernels themselves run in numba's CUDA simulator in a child process
(``cudasim_reduce.py``: every registered kernel against its CPU twin, on
every layout and launch path).  This process checks the host side, which
needs no simulator: the kernel set and signatures match the CPU module, the
layout analysis, and the launch plans a real GPU would get.
"""
import inspect

import numpy as np
import pytest

import pyflow.kernels.cpu.reduce as cpu_reduce
from pyflow.kernels.cuda import reduce as cr
from pyflow.kernels.registry import _KERNELS
from tests.kernels.cudatools import run_in_simulator


@pytest.mark.slow
def test_every_reduction_kernel_in_the_simulator():
    out = run_in_simulator("cudasim_reduce.py")
    assert int(out.split(" checks")[0].split()[-1]) > 300, out


def _kernels(module):
    return {op: fn for (op, _), fn in _KERNELS.items() if fn.__module__ == module.__name__}


def test_every_cpu_reduction_has_a_cuda_kernel_with_its_signature():
    cpu, cuda = _kernels(cpu_reduce), _kernels(cr)
    assert set(cuda) == set(cpu)
    for op in cpu:
        assert inspect.signature(cuda[op]) == inspect.signature(cpu[op]), op


def test_merge_drops_ones_and_joins_contiguous_dims():
    assert cr._merge([(2, 12), (3, 4), (4, 1)]) == ((24,), (1,))
    assert cr._merge([(2, 12), (1, 99), (4, 1)]) == ((2, 4), (12, 1))
    assert cr._merge([(3, 1), (4, 3)]) == ((3, 4), (1, 3))          # transposed: kept apart
    assert cr._merge([(3, -4), (4, -1)]) == ((12,), (-1,))          # reversed: one run
    assert cr._merge([(1, 5)]) == ((1,), (0,))                       # nothing left: a placeholder
    assert cr._merge([]) == ((1,), (0,))


def test_column_kernel_when_results_are_the_contiguous_ones():
    # x (rows, cols) C-order: summing axis 1 reads rows (row kernel), axis 0 columns
    assert not cr._use_column(512, 1024, (1024,), (1,))
    assert cr._use_column(1024, 512, (1,), (1024,))
    assert cr._use_column(4096, 4, (4,), (1,))                  # short rows: thread per row
    assert not cr._use_column(1, 1 << 20, (0,), (1,))           # one result: row (+ split)


def test_launch_plans_for_a_gpu():
    # a full reduction of 16M elements: split over 512 blocks of 256 threads
    splits, chunk, blocks, threads = cr._plan(1, 1 << 24, column=False)
    assert (splits, blocks, threads) == (512, 512, (cr.ROW_THREADS, 1))
    assert splits * chunk >= 1 << 24 and (splits - 1) * chunk < 1 << 24
    # many short rows: a warp per row, 8 rows per block, no split
    assert cr._plan(10_000, 100, column=False) == (1, 100, 1250, (32, cr.ROWS_PER_BLOCK))
    # many long rows: a block per row
    assert cr._plan(4096, 4096, column=False)[2:] == (4096, (cr.ROW_THREADS, 1))
    # a column reduction of a 4096x4096 matrix: 128 groups of 32 results, split in 4
    splits, chunk, blocks, threads = cr._plan(4096, 4096, column=True)
    assert (splits, chunk, blocks, threads) == (4, 1024, 512, (32, cr.COL_ROWS))
    # an empty reduction still launches once per result (identity values)
    assert cr._plan(3, 0, column=False)[:2] == (1, 0)


def test_grids_never_exceed_the_block_cap():
    for n_out, n_red in [(10 ** 7, 10), (10 ** 7, 5000), (1, 10 ** 9)]:
        for column in (False, True):
            splits, chunk, blocks, threads = cr._plan(n_out, n_red, column)
            assert 1 <= blocks <= cr.MAX_BLOCKS and splits <= cr.MAX_SPLITS
            assert threads[0] * threads[1] <= 1024 and threads[0] % 32 == 0


def test_bad_arguments_are_refused_before_any_launch():
    x = np.ones((2, 3), np.float32)
    with pytest.raises(ValueError, match=r"dims must be a tuple of dims in \[0, 2\), got \(2,\)"):
        cr._check_dims((2,), 2, "sum")
    with pytest.raises(ValueError, match="dims must be a tuple"):
        cr._check_dims([0], 2, "sum")
    with pytest.raises(TypeError, match="sum: no CUDA reduction kernel for dtype complex64"):
        cr.sum_(x.astype(np.complex64), (0,), False, np.complex64)
    with pytest.raises(TypeError,
                       match=r"mean: expected a float16/float32/float64 input, got int64"):
        cr.mean(x.astype(np.int64), (0,), False)
    with pytest.raises(ValueError, match=r"argmax: expected a 3-D \(outer, n, inner\) array"):
        cr.argmax(x)
    with pytest.raises(TypeError, match="norm: expected a NumPy array"):
        cr.norm([1.0, 2.0], 2.0)
    with pytest.raises(ValueError, match="kernel shape must be 'row', 'column' or 'combine'"):
        cr.kernel_function(cr.kernel_specs()[0][1], "diagonal")
