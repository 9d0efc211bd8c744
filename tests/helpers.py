"""Shared test tools: NumPy float64 references, finite-difference gradient
checks, hypothesis strategies for shapes and non-contiguous inputs, and an
optional PyTorch reference.

Typical op test::

    @given(data=st.data())
    def test_mul(data):
        a, b = data.draw(broadcastable_pair())
        check_forward(pf.mul, np.multiply, [a, b])
        check_grad(pf.mul, [a, b])
"""
import os

import numpy as np
import pytest
from hypothesis import strategies as st

import pyflow as pf

try:
    import torch
except ImportError:  # the reference is optional; tests that need it skip cleanly
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="PyTorch (the reference) is not installed")

# The op tests run twice: on the CPU, then with every tensor on the cuda device
# under numba's simulator (``make test-cuda-sim``), where a case costs ~50x more.
ON_SIMULATED_CUDA = (os.environ.get("PYFLOW_TEST_DEVICE") == "cuda"
                     and os.environ.get("NUMBA_ENABLE_CUDASIM") == "1")


def cases(every, simulated):
    """Parametrize values: ``every`` one on the CPU, the ``simulated`` subset in the
    simulated cuda run.  For long lists of shapes whose CPU cases check the
    arithmetic, while the simulator needs only one of each kernel path."""
    missing = [v for v in simulated if v not in every]
    if missing:
        raise ValueError(f"cases: simulated values {missing} are not among {every}")
    return list(simulated) if ON_SIMULATED_CUDA else list(every)


# ----------------------------------------------------------------- strategies
def shapes(min_dims=0, max_dims=4, min_side=1, max_side=5):
    return st.lists(st.integers(min_side, max_side), min_size=min_dims,
                    max_size=max_dims).map(tuple)


@st.composite
def broadcastable_pair(draw, min_dims=0, max_dims=4, max_side=4):
    """Two shapes that broadcast against each other (with size-1 and missing dims)."""
    shape = draw(shapes(min_dims, max_dims, 1, max_side))
    a, b = list(shape), list(shape)
    for i in range(len(shape)):
        r = draw(st.integers(0, 3))
        if r == 1:
            a[i] = 1
        elif r == 2:
            b[i] = 1
    drop = draw(st.integers(0, len(b)))
    return tuple(a), tuple(b[drop:])


def layouts():
    return st.sampled_from(["contiguous", "transposed", "sliced", "expanded"])


def make_input(rng, shape, layout="contiguous", dtype=np.float64, low=-2.0, high=2.0):
    """A float64 NumPy array of ``shape`` and a pyflow tensor of the same values
    laid out non-contiguously as asked (transposed, step-sliced or expanded)."""
    values = rng.uniform(low, high, size=shape).astype(dtype)
    pdt = pf.dtypes.from_numpy(np.dtype(dtype))
    if layout == "transposed" and len(shape) >= 2:
        base = pf.tensor(np.ascontiguousarray(np.swapaxes(values, -1, -2)), dtype=pdt)
        t = base.transpose(-1, -2)
    elif layout == "sliced" and len(shape) >= 1:
        big = np.zeros(shape[:-1] + (shape[-1] * 2,), dtype)
        big[..., ::2] = values
        t = pf.tensor(big, dtype=pdt)[..., ::2]
    elif layout == "expanded" and len(shape) >= 1 and shape[0] > 1:
        values = np.broadcast_to(values[:1], shape).copy()
        t = pf.tensor(values[:1], dtype=pdt).expand(*shape)
    else:
        t = pf.tensor(values, dtype=pdt)
    return values, t


# ----------------------------------------------------------------- graph executors
def executors(*names):
    """``names`` as parameters of a test's "executor" argument.  Executors
    differ only in how they schedule the same kernels, which the CPU run
    tests; the simulated-cuda run (``-m "not cpu_only"``) takes the default
    executor, "actors", alone, so its minutes go to the kernels."""
    return [n if n == "actors" else pytest.param(n, marks=pytest.mark.cpu_only) for n in names]


# ----------------------------------------------------------------- checks
def to_numpy(t):
    return np.asarray(t.detach()._host()) if isinstance(t, pf.Tensor) else np.asarray(t)


def assert_close(actual, expected, rtol=1e-6, atol=1e-8, msg=""):
    a, e = to_numpy(actual), to_numpy(expected)
    assert a.shape == e.shape, f"{msg} shape {a.shape} != expected {e.shape}"
    np.testing.assert_allclose(a.astype(np.float64) if a.dtype != bool else a,
                               e.astype(np.float64) if e.dtype != bool else e,
                               rtol=rtol, atol=atol, err_msg=msg)


def check_forward(pf_fn, np_fn, np_inputs, tensors, rtol=1e-6, atol=1e-8, **kwargs):
    """pf_fn(*tensors) equals the float64 NumPy reference np_fn(*np_inputs)."""
    out = pf_fn(*tensors, **kwargs)
    ref = np_fn(*np_inputs)
    assert_close(out, ref, rtol=rtol, atol=atol, msg=getattr(pf_fn, "__name__", ""))
    return out


def numerical_grad(fn, inputs, eps=1e-6):
    """Central differences of sum(fn(*inputs) * w) for a fixed random w,
    one element at a time (two forwards per element)."""
    rng = np.random.default_rng(0)
    out = fn(*[pf.tensor(x) for x in inputs])
    w = rng.standard_normal(tuple(out.shape))
    grads = []
    for i, x in enumerate(inputs):
        g = np.zeros_like(x)
        it = np.nditer(x, flags=["multi_index"])
        for _ in it:
            idx = it.multi_index
            xp = [y.copy() for y in inputs]
            xm = [y.copy() for y in inputs]
            xp[i][idx] += eps
            xm[i][idx] -= eps
            fp = to_numpy(fn(*[pf.tensor(y) for y in xp]))
            fm = to_numpy(fn(*[pf.tensor(y) for y in xm]))
            g[idx] = np.sum((fp - fm) * w) / (2 * eps)
        grads.append(g)
    return w, grads


DIRECTIONS = 3


def _check_directional(fn, inputs, rtol, atol, eps):
    """On a non-CPU default device (the simulated cuda device runs two forwards
    per element far too slowly): the backward's gradient against central
    differences along random directions v, <grad, v> = (f(x + eps v) -
    f(x - eps v)) / (2 eps), all on that device.  Every input gets its own
    direction, and each input is also checked alone, so a wrong gradient of any
    one input shows."""
    rng = np.random.default_rng(0)
    ts = [pf.tensor(x, requires_grad=True) for x in inputs]
    out = fn(*ts)
    w = rng.standard_normal(tuple(out.shape))
    out.backward(pf.tensor(w))
    grads = []
    for i, t in enumerate(ts):
        assert t.grad is not None, f"input {i} got no gradient"
        grads.append(to_numpy(t.grad))
    which = [[i] for i in range(len(inputs))] + ([list(range(len(inputs)))] * DIRECTIONS
                                                  if len(inputs) > 1 else [[0]] * (DIRECTIONS - 1))
    for moved in which:
        vs = [rng.standard_normal(x.shape) if i in moved else np.zeros(x.shape)
              for i, x in enumerate(inputs)]
        f = [to_numpy(fn(*[pf.tensor(x + sign * eps * v) for x, v in zip(inputs, vs)]))
             for sign in (1, -1)]
        numeric = np.sum((f[0] - f[1]) * w) / (2 * eps)
        analytic = sum(np.sum(g * v) for g, v in zip(grads, vs))
        scale = sum(np.sum(np.abs(g * v)) for g, v in zip(grads, vs))
        assert abs(analytic - numeric) <= atol * 10 + rtol * max(scale, abs(numeric)), (
            f"directional derivative along inputs {moved}: backward gives {analytic}, finite "
            f"differences {numeric}")


def check_grad(fn, inputs, rtol=1e-5, atol=1e-6, eps=1e-6):
    """Backward of ``fn`` in float64 against central finite differences.

    ``inputs`` are float64 NumPy arrays; ``fn`` maps pyflow tensors to one tensor.
    On the CPU every element is checked; on another default device, random
    directional derivatives (``_check_directional``).
    """
    inputs = [np.asarray(x, np.float64) for x in inputs]
    if pf.get_default_device().type != "cpu":
        return _check_directional(fn, inputs, rtol, atol, eps)
    w, expected = numerical_grad(fn, inputs, eps)
    ts = [pf.tensor(x, requires_grad=True) for x in inputs]
    out = fn(*ts)
    out.backward(pf.tensor(w))
    for i, (t, e) in enumerate(zip(ts, expected)):
        assert t.grad is not None, f"input {i} got no gradient"
        assert_close(t.grad, e, rtol=rtol, atol=atol, msg=f"grad of input {i}")


def to_torch(t, requires_grad=False):
    x = torch.tensor(to_numpy(t))
    return x.requires_grad_(requires_grad)
