"""The CUDA row kernels (softmax, normalization, loss) in numba's CUDA simulator.

The simulator must be on before numba is first imported, and this process
imported numba without it, so ``cudasim_rows.py`` (every row kernel against
the CPU kernel of the same name) runs in a child process.  The tests below it
need no simulator: argument checks that fail before any launch.
"""
import re

import numpy as np
import pytest

from pyflow.kernels.cuda import loss, normalization, softmax
from tests.kernels.cudatools import run_in_simulator


@pytest.mark.slow
def test_every_row_kernel_in_the_simulator():
    out = run_in_simulator("cudasim_rows.py")
    checks = int(out.split(" checks,")[0].split()[-1])
    assert checks >= 100, out       # the script really ran its cases


X = np.ones((2, 3), np.float32)


@pytest.mark.parametrize("call,exc,text", [
    (lambda: softmax.softmax(np.ones(3, np.float16), 0), TypeError,
     "softmax: CUDA kernel takes float32 or float64 x, got float16"),
    (lambda: softmax.log_softmax(X, -1), ValueError, "dim must be in [0, 2)"),
    (lambda: softmax.softmax_backward(X, X.astype(np.float64), 1), ValueError,
     "y must match g"),
    (lambda: normalization.layer_norm(np.ones(3, np.float32), None, None, 1e-5), ValueError,
     "x must be 2-D (rows, n)"),
    (lambda: normalization.layer_norm_backward(X[:1], X, None, None, None), ValueError,
     "g must have the shape of x (2, 3)"),
    (lambda: normalization.batch_norm_stats(X), ValueError, "x must be 3-D (N, C, S)"),
    (lambda: normalization.batch_norm_backward(X[None], X[None, :1], None, None, None, True),
     ValueError, "g must have the shape of x"),
    (lambda: loss.cross_entropy(X, np.zeros(2, np.float32), None, -100, 0.0), TypeError,
     "target must hold integer class indices, got float32"),
    (lambda: loss.cross_entropy_backward(np.ones(2, np.float32), X, np.zeros(5, np.int64),
                                         None, -100, 0.0, None),
     ValueError, "target must have shape (2,)"),
    (lambda: loss.nll_loss(X[0], np.zeros(2, np.int64), None, -100), ValueError,
     "x must be 2-D (M, C)"),
    (lambda: loss.nll_loss_backward(np.ones(3, np.float32), np.zeros(2, np.int64), None, -100, 4),
     ValueError, "one element per row"),
    (lambda: loss.bce_with_logits(np.ones(3, np.int64), np.ones(3, np.int64), None), TypeError,
     "bce_with_logits: CUDA kernel takes float32 or float64 x, got int64"),
])
def test_bad_arguments_fail_before_any_launch(call, exc, text):
    with pytest.raises(exc, match=re.escape(text)):
        call()
