"""The multi-tensor norm and scale kernels of ``kernels/cuda/grad_norm.py`` in
numba's CUDA simulator, and ``clip_grad_norm_`` on cuda tensors against cpu.

Run by ``test_clip_grad_multi.py`` in its own process (``NUMBA_ENABLE_CUDASIM=1``
must be set before numba is imported)::

    NUMBA_ENABLE_CUDASIM=1 python tests/nn/cudasim_clip_grad.py

Checks: ``multi_tensor_norm`` (p = 1, 2, inf) against a float64 NumPy reference
over float16/float32/float64, contiguous and sliced arrays, empty arrays, many
arrays, inf and NaN, and the same value on a second call; ``multi_tensor_scale``
cuda == cpu bit for bit; ``clip_grad_norm_`` on cuda == on cpu.  Tiny shapes.
Prints failures, then ``N checks, F failures``; exits 1 on any.
"""
import math
import os
import sys

if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
    sys.exit("set NUMBA_ENABLE_CUDASIM=1 before running this script")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np  # noqa: E402
from numba import config  # noqa: E402

import pyflow as pf  # noqa: E402
from pyflow import nn  # noqa: E402
from pyflow.kernels import registry  # noqa: E402
from pyflow.kernels.cuda._memory import to_device, to_host  # noqa: E402
from pyflow.nn.utils import clip_grad_norm_  # noqa: E402
from tests.kernels.cudatools import Checks  # noqa: E402

assert config.ENABLE_CUDASIM, "numba did not pick up NUMBA_ENABLE_CUDASIM=1"

check = Checks()
rng = np.random.default_rng(0)
NORMS = (1.0, 2.0, math.inf)
gpu_norm, cpu_norm = registry.get("multi_tensor_norm", "cuda"), registry.get("multi_tensor_norm",
                                                                               "cpu")
gpu_scale, cpu_scale = registry.get("multi_tensor_scale", "cuda"), \
    registry.get("multi_tensor_scale", "cpu")


def reference(hosts, norm_type):
    x = np.concatenate([np.asarray(h, np.float64).reshape(-1) for h in hosts] + [np.zeros(0)])
    if x.size == 0:
        return 0.0
    if norm_type == math.inf:
        return float(np.abs(x).max())
    return float((np.abs(x) ** norm_type).sum() ** (1 / norm_type))


def host_arrays(dtype, sizes=((3, 5), (70,), (0,), (2, 3, 4))):
    return [rng.standard_normal(s).astype(dtype) for s in sizes]


def sliced(h):
    """A device array with the values of ``h`` in every other column."""
    big = np.zeros(h.shape[:-1] + (2 * h.shape[-1],), h.dtype)
    big[..., ::2] = h
    return to_device(big)[..., ::2]


def close(got, want, rtol):
    assert (math.isnan(got) and math.isnan(want)) or math.isclose(got, want, rel_tol=rtol), \
        (got, want)


for dtype in (np.float32, np.float64, np.float16):
    for norm_type in NORMS:
        @check(f"multi_tensor_norm {np.dtype(dtype)} p={norm_type}")
        def _(dtype=dtype, norm_type=norm_type):
            hosts = host_arrays(dtype)
            devs = [to_device(h) for h in hosts] + [sliced(hosts[0])]
            hosts = hosts + [hosts[0]]
            got = gpu_norm(devs, norm_type)
            close(got, reference(hosts, norm_type), 1e-12)
            close(got, cpu_norm(hosts, norm_type), 1e-12)
            assert gpu_norm(devs, norm_type) == got          # deterministic

for norm_type in NORMS:
    @check(f"multi_tensor_norm many arrays p={norm_type}")
    def _(norm_type=norm_type):
        hosts = [rng.standard_normal(int(n)).astype(np.float32)
                 for n in rng.integers(1, 90, 40)]
        close(gpu_norm([to_device(h) for h in hosts], norm_type), reference(hosts, norm_type),
              1e-12)

    @check(f"multi_tensor_norm inf and nan p={norm_type}")
    def _(norm_type=norm_type):
        a, b = np.ones(40, np.float32), np.ones(9, np.float32)
        a[17] = np.inf
        assert gpu_norm([to_device(a), to_device(b)], norm_type) == math.inf
        b[3] = np.nan
        assert math.isnan(gpu_norm([to_device(a), to_device(b)], norm_type))
        a[17] = 1.0
        assert math.isnan(gpu_norm([to_device(b), to_device(a)], norm_type))

    @check(f"multi_tensor_norm no elements p={norm_type}")
    def _(norm_type=norm_type):
        assert gpu_norm([], norm_type) == 0.0
        assert gpu_norm([to_device(np.zeros((0, 3), np.float32))], norm_type) == 0.0

for dtype in (np.float32, np.float64, np.float16):
    @check(f"multi_tensor_scale cuda == cpu {np.dtype(dtype)}")
    def _(dtype=dtype):
        hosts = host_arrays(dtype)
        devs = [to_device(h) for h in hosts]
        big = np.zeros((3, 10), dtype)
        big[..., ::2] = hosts[0]
        dev_big = to_device(big)
        gpu_scale(devs + [dev_big[..., ::2]], 0.1234567891234)
        cpu_scale(hosts + [big[..., ::2]], 0.1234567891234)
        for d, h in zip(devs + [dev_big], hosts + [big]):
            got = to_host(d)
            assert got.dtype == h.dtype and np.array_equal(got, h, equal_nan=True)


@check("multi_tensor_scale by nan and by 0 of an inf")
def _():
    a = to_device(np.array([1.0, np.inf, -2.0], np.float32))
    gpu_scale([a], float("nan"))
    assert np.isnan(to_host(a)).all()
    b = to_device(np.array([1.0, np.inf], np.float32))
    gpu_scale([b], 0.0)
    assert to_host(b)[0] == 0.0 and np.isnan(to_host(b)[1])


def grads_on(device, dtypes, seed):
    r = np.random.default_rng(seed)
    params = []
    for i, shape in enumerate([(4, 3), (5,), (2, 3, 2), (7,)]):
        dt = dtypes[i % len(dtypes)]
        p = nn.Parameter(pf.zeros(*shape, dtype=dt, device=device))
        p.grad = pf.tensor(r.standard_normal(shape) * 3, dtype=dt, device=device)
        params.append(p)
    params.append(nn.Parameter(pf.zeros(3, device=device)))          # no grad: skipped
    return params


for dtypes in ([pf.float32], [pf.float64], [pf.float32, pf.float64], [pf.float16]):
    for norm_type in NORMS + (3.0,):
        @check(f"clip_grad_norm_ cuda == cpu {[str(d) for d in dtypes]} p={norm_type}")
        def _(dtypes=dtypes, norm_type=norm_type):
            on_gpu, on_cpu = grads_on("cuda", dtypes, 1), grads_on("cpu", dtypes, 1)
            t_gpu = clip_grad_norm_(on_gpu, 1.0, norm_type)
            t_cpu = clip_grad_norm_(on_cpu, 1.0, norm_type)
            assert t_gpu.device.type == "cuda" and t_gpu.dtype is t_cpu.dtype
            close(t_gpu.item(), t_cpu.item(), 1e-6 if norm_type == 3.0 else 1e-12)
            for a, b in zip(on_gpu[:-1], on_cpu[:-1]):
                np.testing.assert_allclose(a.grad.float().cpu().numpy(),
                                           b.grad.float().cpu().numpy(), rtol=1e-6)
            assert on_gpu[-1].grad is None


@check("clip_grad_norm_ on cuda: a NaN gradient spreads NaN; error_if_nonfinite raises")
def _():
    p = nn.Parameter(pf.zeros(3, device="cuda"))
    p.grad = pf.tensor([1.0, float("nan"), 2.0], device="cuda")
    assert math.isnan(clip_grad_norm_([p], 1.0).item())
    assert np.isnan(p.grad.cpu().numpy()).all()
    p.grad = pf.tensor([1.0, float("inf"), 2.0], device="cuda")
    try:
        clip_grad_norm_([p], 1.0, error_if_nonfinite=True)
    except RuntimeError as e:
        assert "non-finite" in str(e)
    else:
        raise AssertionError("no error")


sys.exit(check.report())
