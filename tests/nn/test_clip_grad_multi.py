"""clip_grad_norm_ / get_total_norm over the multi-tensor kernels
(``kernels/*/grad_norm.py``): against PyTorch, against the op path they replace
(bit for bit for the clipped gradients), and the CPU kernels against a float64
NumPy reference.  The CUDA kernels run in numba's simulator in a child process
(``cudasim_clip_grad.py``).
"""
import math
import os

import numpy as np
import pytest

import pyflow as pf
from pyflow import nn
from pyflow.kernels import registry
from pyflow.kernels.cpu import grad_norm as cpu_grad_norm
from pyflow.kernels.cpu.optim import TUPLE_WIDTH
from pyflow.nn.utils import clip_grad as clip_module
from pyflow.nn.utils import clip_grad_norm_, get_total_norm
from tests.kernels.cudatools import run_in_simulator

torch = pytest.importorskip("torch")

NORMS = (1.0, 2.0, math.inf)
TORCH_DTYPES = {pf.float32: torch.float32, pf.float64: torch.float64,
                pf.float16: torch.float16, pf.bfloat16: torch.bfloat16}


def shapes(n, seed=0):
    rng = np.random.default_rng(seed)
    return [tuple(int(s) for s in rng.integers(1, 9, rng.integers(1, 4))) for _ in range(n)]


def make_pair(values, dtypes, transposed=()):
    """(pyflow params, torch params) with these gradient values; the grads at the
    indices ``transposed`` are non-contiguous (every other column of a wider one)."""
    ours, ref = [], []
    for i, v in enumerate(values):
        dt = dtypes[i % len(dtypes)]
        p = nn.Parameter(pf.zeros(*v.shape, dtype=dt))
        if i in transposed:
            wide = np.zeros(v.shape[:-1] + (2 * v.shape[-1],))
            wide[..., ::2] = v
            p.grad = pf.tensor(wide, dtype=dt)[..., ::2]
            assert not p.grad.is_contiguous()
        else:
            p.grad = pf.tensor(v, dtype=dt)
        ours.append(p)
        tp = torch.nn.Parameter(torch.zeros(v.shape, dtype=TORCH_DTYPES[dt]))
        tp.grad = torch.tensor(v, dtype=TORCH_DTYPES[dt])
        ref.append(tp)
    return ours, ref


def host(t):
    return t.detach().float().cpu().numpy() if t.dtype is pf.bfloat16 else t.cpu().numpy()


def assert_matches_torch(total, ttotal, ours, ref, rtol):
    assert str(total.dtype).split(".")[-1] == str(ttotal.dtype).split(".")[-1]
    got, want = total.item(), ttotal.item()
    assert (math.isnan(got) and math.isnan(want)) or got == pytest.approx(want, rel=rtol)
    for p, tp in zip(ours, ref):
        if p.grad is None:
            assert tp.grad is None
            continue
        np.testing.assert_allclose(host(p.grad), tp.grad.float().numpy(), rtol=rtol,
                                   atol=1e-30, equal_nan=True)


@pytest.fixture
def calls(monkeypatch):
    """The names of the kernels clip_grad asks the registry for."""
    seen = []

    def spy(name, device_type):
        seen.append(name)
        return registry.get(name, device_type)
    monkeypatch.setattr(clip_module, "kernel", spy)
    return seen


# ------------------------------------------------------------------ against PyTorch
@pytest.mark.parametrize("norm_type", [1.0, 2.0, math.inf, 3.0, "inf"])
@pytest.mark.parametrize("max_norm", [0.5, 1e4])
def test_many_float32_grads_match_torch(norm_type, max_norm, calls):
    rng = np.random.default_rng(1)
    values = [rng.standard_normal(s) for s in shapes(40)]
    ours, ref = make_pair(values, [pf.float32], transposed={3, 17})
    nt = float(norm_type)
    total = clip_grad_norm_(ours, max_norm, norm_type=nt)
    ttotal = torch.nn.utils.clip_grad_norm_(ref, max_norm, norm_type=nt)
    assert_matches_torch(total, ttotal, ours, ref, rtol=2e-6)
    # one norm call (not for p = 3: the op path) and one scale call for the one group
    want = ["multi_tensor_scale"] if nt == 3.0 else ["multi_tensor_norm", "multi_tensor_scale"]
    assert [c for c in calls if c.startswith("multi_tensor")] == want


@pytest.mark.parametrize("norm_type", [1.0, 2.0, math.inf, 3.0])
def test_mixed_float32_float64_grads_match_torch(norm_type, calls):
    rng = np.random.default_rng(2)
    values = [rng.standard_normal(s) * 5 for s in shapes(9, seed=2)]
    ours, ref = make_pair(values, [pf.float32, pf.float64, pf.float64])
    total = clip_grad_norm_(ours, 1.0, norm_type=norm_type)
    ttotal = torch.nn.utils.clip_grad_norm_(ref, 1.0, norm_type=norm_type)
    assert total.dtype is pf.float64                       # the promotion, as torch's
    assert_matches_torch(total, ttotal, ours, ref, rtol=2e-6)
    assert calls.count("multi_tensor_scale") == 2          # one per (device, dtype) group
    assert calls.count("multi_tensor_norm") == (0 if norm_type == 3.0 else 2)


@pytest.mark.parametrize("norm_type", NORMS)
@pytest.mark.parametrize("dtype", [pf.float16, pf.bfloat16])
def test_half_grads_match_torch(dtype, norm_type):
    rng = np.random.default_rng(3)
    values = [rng.standard_normal(s) for s in shapes(6, seed=3)]
    ours, ref = make_pair(values, [dtype])
    total = clip_grad_norm_(ours, 0.5, norm_type=norm_type)
    ttotal = torch.nn.utils.clip_grad_norm_(ref, 0.5, norm_type=norm_type)
    assert total.dtype is dtype
    assert_matches_torch(total, ttotal, ours, ref, rtol=1e-2)


@pytest.mark.parametrize("norm_type", [1.0, 2.0, math.inf, 3.0])
def test_get_total_norm_matches_torch(norm_type):
    rng = np.random.default_rng(4)
    values = [rng.standard_normal(s) for s in shapes(12, seed=4)]
    ours, ref = make_pair(values, [pf.float32])
    total = get_total_norm([p.grad for p in ours], norm_type)
    ttotal = torch.nn.utils.get_total_norm([p.grad for p in ref], norm_type)
    assert total.dtype is pf.float32 and total.item() == pytest.approx(ttotal.item(), rel=2e-6)
    assert get_total_norm(ours[0].grad, norm_type).item() == pytest.approx(
        torch.nn.utils.get_total_norm(ref[0].grad, norm_type).item(), rel=2e-6)


@pytest.mark.filterwarnings("ignore:invalid value encountered")
@pytest.mark.parametrize("norm_type", [1.0, 2.0, math.inf, 3.0])
@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan])
def test_nonfinite_grads_match_torch(bad, norm_type):
    rng = np.random.default_rng(5)
    values = [rng.standard_normal(s) for s in shapes(5, seed=5)]
    values[2].reshape(-1)[0] = bad
    ours, ref = make_pair(values, [pf.float32])
    total = clip_grad_norm_(ours, 1.0, norm_type=norm_type)
    ttotal = torch.nn.utils.clip_grad_norm_(ref, 1.0, norm_type=norm_type)
    assert_matches_torch(total, ttotal, ours, ref, rtol=2e-6)   # NaN norm: NaN grads
    ours, _ = make_pair(values, [pf.float32])
    with pytest.raises(RuntimeError, match=f"total norm of order {norm_type} for gradients "
                                           f"from `parameters` is non-finite"):
        clip_grad_norm_(ours, 1.0, norm_type=norm_type, error_if_nonfinite=True)


def test_empty_and_missing_grads_match_torch():
    for norm_type in NORMS:
        total = clip_grad_norm_([], 1.0, norm_type)
        ttotal = torch.nn.utils.clip_grad_norm_([], 1.0, norm_type)
        assert total.dtype is pf.float32 and total.item() == ttotal.item() == 0.0
        assert get_total_norm([], norm_type).item() == 0.0
    rng = np.random.default_rng(6)
    values = [rng.standard_normal(s) * 4 for s in shapes(4, seed=6)]
    ours, ref = make_pair(values, [pf.float32])
    ours.insert(1, nn.Parameter(pf.ones(3)))
    ref.insert(1, torch.nn.Parameter(torch.ones(3)))
    total = clip_grad_norm_(iter(ours), 1.0)
    ttotal = torch.nn.utils.clip_grad_norm_(iter(ref), 1.0)
    assert_matches_torch(total, ttotal, ours, ref, rtol=2e-6)
    # only parameters without grads, and an empty gradient
    assert clip_grad_norm_([nn.Parameter(pf.ones(2))], 1.0).item() == 0.0
    p = nn.Parameter(pf.zeros(0))
    p.grad = pf.zeros(0)
    assert clip_grad_norm_(p, 1.0).item() == 0.0


# ------------------------------------------------------------------ against the op path
@pytest.mark.parametrize("dtype", [pf.float32, pf.float64, pf.float16, pf.bfloat16])
@pytest.mark.parametrize("norm_type", NORMS)
def test_clipped_grads_are_bit_identical_to_the_op_path(dtype, norm_type, monkeypatch):
    """The kernels' scaling is ``g.mul_(coef)`` bit for bit; the norm differs only
    by float64 accumulation (and is the same dtype)."""
    rng = np.random.default_rng(7)
    values = [rng.standard_normal(s) * 3 for s in shapes(30, seed=7)]
    fast, _ = make_pair(values, [dtype], transposed={4})
    slow, _ = make_pair(values, [dtype], transposed={4})
    total = clip_grad_norm_(fast, 0.7, norm_type)
    with monkeypatch.context() as m:
        m.setattr(clip_module, "_kernel_groups", lambda tensors: None)
        want = clip_grad_norm_(slow, 0.7, norm_type)
    assert total.dtype is want.dtype
    rtol = 1e-6 if dtype in (pf.float32, pf.float64) else 1e-2
    assert total.item() == pytest.approx(want.item(), rel=rtol)
    coef = min(0.7 / (total.item() + 1e-6), 1.0)
    with monkeypatch.context() as m:       # the same coefficient through mul_
        m.setattr(clip_module, "_kernel_groups", lambda tensors: None)
        again, _ = make_pair(values, [dtype], transposed={4})
        with pf.no_grad():
            for p in again:
                p.grad.mul_(coef)
    for a, b in zip(fast, again):
        assert np.array_equal(host(a.grad), host(b.grad))
        assert a.grad.is_contiguous() == b.grad.is_contiguous()


def test_versions_are_bumped():
    p = nn.Parameter(pf.zeros(3))
    p.grad = pf.tensor([3.0, 4.0, 0.0])
    before = p.grad._version[0]
    clip_grad_norm_([p], 1.0)
    assert p.grad._version[0] == before + 1


def test_global_grads_take_the_op_path(calls):
    plc = pf.placement("cpu", ranks=[0])
    p = nn.Parameter(pf.zeros(2).to_global(plc, pf.sbp.broadcast))
    p.grad = pf.tensor([3.0, 4.0]).to_global(plc, pf.sbp.broadcast)
    total = clip_grad_norm_([p], 1.0)
    assert total.is_global and total.to_local().item() == pytest.approx(5.0)
    np.testing.assert_allclose(p.grad.to_local().numpy(), [0.6, 0.8], rtol=1e-6)
    assert not any(c.startswith("multi_tensor") for c in calls)


# ------------------------------------------------------------------ the CPU kernels
def reference(arrays, norm_type):
    x = np.concatenate([np.asarray(a, np.float64).reshape(-1) for a in arrays] + [np.zeros(0)])
    if x.size == 0:
        return 0.0
    if norm_type == math.inf:
        return float(np.abs(x).max())
    return float((np.abs(x) ** norm_type).sum() ** (1 / norm_type))


def kernel_arrays(dtype, seed=0):
    """Many arrays (more than one tuple chunk), one of several work blocks, a
    transposed and a sliced one, an empty one."""
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal(s).astype(dtype) for s in shapes(TUPLE_WIDTH + 5, seed)]
    arrays.append(rng.standard_normal(3 * cpu_grad_norm.BLOCK + 12345).astype(dtype))
    arrays.append(rng.standard_normal((6, 5)).astype(dtype).T)
    arrays.append(rng.standard_normal((4, 10)).astype(dtype)[:, ::3])
    arrays.append(np.zeros((0, 4), dtype))
    return arrays


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("norm_type", NORMS)
def test_cpu_norm_kernel_matches_float64_numpy(dtype, norm_type):
    arrays = kernel_arrays(dtype)
    got = registry.get("multi_tensor_norm", "cpu")(arrays, norm_type)
    assert isinstance(got, float)
    assert got == pytest.approx(reference(arrays, norm_type), rel=1e-12)
    readonly = [a.copy() for a in arrays[:3]]
    for a in readonly:
        a.flags.writeable = False
    assert registry.get("multi_tensor_norm", "cpu")(readonly, norm_type) == \
        pytest.approx(reference(readonly, norm_type), rel=1e-12)


@pytest.mark.parametrize("norm_type", NORMS)
def test_cpu_norm_kernel_nonfinite_and_empty(norm_type):
    norm = registry.get("multi_tensor_norm", "cpu")
    assert norm([], norm_type) == 0.0 and norm([np.zeros(0, np.float32)], norm_type) == 0.0
    a = np.ones(cpu_grad_norm.BLOCK + 3, np.float32)
    b = np.ones((3, 4), np.float64).T
    a[7] = np.inf
    assert norm([a, b], norm_type) == math.inf
    for arrays in ([a, np.array([np.nan], np.float32)], [np.array([np.nan, np.inf]), a]):
        assert math.isnan(norm(arrays, norm_type))
    c = np.ones((2, 5), np.float16)[:, ::2]
    c[0, 0] = np.nan
    assert math.isnan(norm([np.ones(3, np.float32), c], norm_type))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cpu_norm_threads_and_one_thread_agree_bit_for_bit(dtype):
    k = cpu_grad_norm._norm_partials_kernel
    arrays = [a.reshape(-1) for a in kernel_arrays(dtype)[:TUPLE_WIDTH - 1]] + \
        [np.random.default_rng(1).standard_normal(5 * cpu_grad_norm.BLOCK + 7).astype(dtype)]
    for padded, work, _ in cpu_grad_norm._chunks(arrays, np.dtype(dtype)):
        for mode in (0, 1, 2):
            p1, p2 = np.empty(len(work)), np.empty(len(work))
            k.parallel(padded, work, mode, p1)
            k.serial(padded, work, mode, p2)
            assert np.array_equal(p1, p2)


@pytest.mark.parametrize("norm_type", NORMS)
def test_cpu_kernels_on_the_threads_give_the_one_thread_result(norm_type, monkeypatch):
    norm, scale = registry.get("multi_tensor_norm", "cpu"), registry.get("multi_tensor_scale",
                                                                          "cpu")
    arrays = kernel_arrays(np.float32, seed=5)
    copies = [a.copy() for a in arrays]
    one = norm(arrays, norm_type)
    scale(arrays, 0.3)
    monkeypatch.setattr(cpu_grad_norm, "PARALLEL_MIN", 0)
    assert norm(copies, norm_type) == one
    scale(copies, 0.3)
    assert all(np.array_equal(a, b) for a, b in zip(arrays, copies))


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_cpu_scale_kernel_is_mul_by_the_coefficient_in_the_dtype(dtype):
    arrays = kernel_arrays(dtype, seed=3)
    arrays[0].reshape(-1)[0] = np.nan
    want = [(a.astype(np.float32) * np.float32(0.37)).astype(dtype) if dtype == np.float16
            else a * np.dtype(dtype).type(0.37) for a in arrays]
    registry.get("multi_tensor_scale", "cpu")(arrays, 0.37)
    for a, w in zip(arrays, want):
        assert a.dtype == w.dtype and np.array_equal(a, w, equal_nan=True)


def test_cpu_kernels_reject_bad_arguments():
    norm, scale = registry.get("multi_tensor_norm", "cpu"), registry.get("multi_tensor_scale",
                                                                          "cpu")
    with pytest.raises(TypeError, match="must be a list of arrays"):
        norm(np.ones(3), 2.0)
    with pytest.raises(TypeError, match=r"'arrays\[1\]' must be float16, float32 or float64"):
        norm([np.ones(3), np.ones(3, np.int32)], 2.0)
    with pytest.raises(ValueError, match="'norm_type' must be 1, 2 or inf"):
        norm([np.ones(3)], 3.0)
    with pytest.raises(TypeError, match="'coef' must be a real number"):
        scale([np.ones(3)], "2")
    ro = np.ones(3)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="must be writeable"):
        scale([ro], 2.0)


# ------------------------------------------------------------------ the CUDA kernels
@pytest.mark.slow
def test_cuda_kernels_in_the_simulator():
    out = run_in_simulator(os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                        "cudasim_clip_grad.py"))
    assert int(out.split(" checks,")[0].split()[-1]) >= 39, out
