"""The CUDA elementwise kernels, run in numba's CUDA simulator (no GPU needed).

The simulator must be switched on before numba is first imported, and this
process imported numba without it, so the checks run in a child process:
``cudasim_elementwise.py`` (every op x dtype x layout against the CPU kernels).
"""
import os
import subprocess
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.slow
def test_every_elementwise_kernel_in_the_simulator():
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    proc = subprocess.run([sys.executable, "-W", "ignore::RuntimeWarning",
                           os.path.join(HERE, "cudasim_elementwise.py")],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"simulator checks failed:\n{proc.stdout}\n{proc.stderr}"
    assert " 0 failures" in proc.stdout, proc.stdout


# Host-side pieces that need no simulator: layout analysis and launch sizes.
from pyflow.kernels.cuda import elementwise as ew  # noqa: E402
from pyflow.kernels.cuda import layout  # noqa: E402


def test_coalesce_merges_contiguous_dims_and_keeps_broadcast_ones():
    # out (2,3,4) contiguous; input broadcast along the middle dim
    shape, strides = layout.coalesce([2, 3, 4], [[12, 4, 1], [4, 0, 1]])
    assert shape == (2, 3, 4) and strides == [(12, 4, 1), (4, 0, 1)]
    shape, strides = layout.coalesce([2, 1, 3, 4], [[12, 12, 4, 1], [12, 0, 4, 1]])
    assert shape == (24,) and strides == [(1,), (1,)]
    shape, strides = layout.coalesce([3, 4], [[4, 1], [1, 3]])          # transposed input
    assert shape == (3, 4) and strides == [(4, 1), (1, 3)]


def test_element_strides_zero_along_broadcast_dims():
    a = np.ones((3, 1), np.float32)
    assert layout.element_strides(a.shape, a.strides, a.dtype, (2, 3, 5), "x") == [0, 1, 0]
    with pytest.raises(ValueError, match="not a multiple of the item size"):
        layout.element_strides((3,), (6,), np.dtype(np.float32), (3,), "input 0")


def test_span_covers_negative_strides():
    base = np.arange(12.0).reshape(3, 4)
    rev = base[::-1, ::2]
    view, offset = layout.span(rev, rev.shape, rev.strides, rev.dtype)
    assert view[0] == 0.0 and view.size == 11 and view[offset] == rev[0, 0]


def test_launch_config():
    assert ew.launch_config(1) == (1, 32)
    assert ew.launch_config(1000) == (4, 256)
    assert ew.launch_config(1 << 30) == (ew.MAX_BLOCKS, 256)
