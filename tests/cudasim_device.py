"""The cuda device under numba's simulator (run by test_cuda_device.py in a child
process with NUMBA_ENABLE_CUDASIM=1): transfers, dtypes, memory statistics,
streams/events, and elementwise ops with autograd against the CPU."""
import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

import pyflow as pf  # noqa: E402

checks, failures = 0, []


def check(name):
    def deco(fn):
        global checks
        checks += 1
        try:
            fn()
        except Exception:  # noqa: BLE001 (report every failing check, not just the first)
            failures.append(f"{name}:\n{traceback.format_exc()}")
        return fn
    return deco


@check("availability")
def _():
    assert pf.cuda.is_available() and pf.cuda.device_count() == 1
    assert pf.cuda.unavailable_reason() is None


@check("round trip of every dtype")
def _():
    for dt in (pf.float32, pf.float64, pf.float16, pf.bfloat16, pf.int32, pf.int64, pf.bool):
        host = pf.tensor([[1, 0, 3], [4, 5, 0]], dtype=dt)
        dev = host.to("cuda")
        assert dev.device == pf.device("cuda:0") and dev.dtype is dt and dev.is_cuda
        back = dev.cpu()
        assert back.device.type == "cpu" and back.dtype is dt
        assert back.tolist() == host.tolist(), (dt, back.tolist())
        assert pf.zeros(2, 3, dtype=dt, device="cuda").tolist() == [[0] * 3] * 2 or dt is pf.bool


@check("numpy() of a cuda tensor is refused, item/tolist/repr copy")
def _():
    t = pf.tensor([2.5], device="cuda")
    try:
        t.numpy()
        raise AssertionError("numpy() did not raise")
    except TypeError as e:
        assert "cpu()" in str(e)
    assert t.item() == 2.5 and "device='cuda:0'" in repr(t)


@check("memory statistics")
def _():
    import gc
    gc.collect()
    base = pf.cuda.memory_allocated()
    pf.cuda.reset_peak_memory_stats()
    t = pf.empty(1000, device="cuda")
    assert pf.cuda.memory_allocated() >= base + 4000
    assert pf.cuda.max_memory_allocated() >= base + 4000
    del t
    gc.collect()
    assert pf.cuda.memory_allocated() == base


@check("stream and events")
def _():
    s = pf.cuda.Stream()
    start, end = pf.cuda.Event(enable_timing=True), pf.cuda.Event(enable_timing=True)
    with s:
        start.record()
        pf.ones(4, device="cuda") + 1
        end.record()
    end.synchronize()
    pf.cuda.synchronize()
    assert start.elapsed_time(end) >= 0


@check("elementwise ops and autograd agree with the cpu")
def _():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((2, 3)), rng.standard_normal((3,))
    results = {}
    for dev in ("cpu", "cuda"):
        x = pf.tensor(a, device=dev, requires_grad=True)
        y = pf.tensor(b, device=dev, requires_grad=True)
        out = ((x * y + 1).sigmoid() * x.tanh() - y / 3).gelu()
        out.backward(pf.ones_like(out))
        results[dev] = (out.detach().cpu().numpy(), x.grad.cpu().numpy(), y.grad.cpu().numpy())
        assert out.device.type == dev and x.grad.device.type == dev
    for c, g in zip(results["cpu"], results["cuda"]):
        np.testing.assert_allclose(g, c, rtol=1e-10, atol=1e-12)


@check("mixing devices is a clear error")
def _():
    try:
        pf.ones(2) + pf.ones(2, device="cuda")
        raise AssertionError("no error")
    except RuntimeError as e:
        assert "same device" in str(e)



@check("every op family refuses mixed devices, naming the op and the fix")
def _():
    F = pf.nn.functional
    x = pf.randn(4, 5, device="cuda")
    cases = {
        "matmul": lambda: x @ pf.randn(5, 2),
        "cat": lambda: pf.cat([x, pf.randn(4, 5)]),
        "linear": lambda: F.linear(x, pf.randn(3, 5)),
        "cross_entropy": lambda: F.cross_entropy(x, pf.tensor([0, 1, 2, 3])),
        "nll_loss": lambda: F.nll_loss(x, pf.tensor([0, 1, 2, 3])),
        "embedding": lambda: F.embedding(pf.tensor([0, 1]), x),
        "scaled_dot_product_attention": lambda: F.scaled_dot_product_attention(
            x[None], x[None], x[None], attn_mask=pf.ones(4, 4, dtype=pf.bool)),
        "where": lambda: pf.where(pf.ones(4, 5) > 0, x, x),
    }
    for op, call in cases.items():
        try:
            call()
        except RuntimeError as e:
            msg = str(e)
            assert "same device" in msg and "cuda" in msg and "cpu" in msg, (op, msg)
            if op in ("cross_entropy", "nll_loss", "embedding", "scaled_dot_product_attention"):
                assert op in msg and ".to(" in msg, (op, msg)
        else:
            raise AssertionError(f"{op}: mixing devices did not raise")


@check("a dtype the kernels do not take is a clear error")
def _():
    try:
        pf.softmax(pf.tensor([1, 2, 3], device="cuda"), 0)
        raise AssertionError("no error")
    except (TypeError, RuntimeError) as e:
        assert "softmax" in str(e) and "int64" in str(e), str(e)



@check("save/load keeps the device; map_location='cpu' loads on the CPU")
def _():
    import os
    import tempfile
    path = os.path.join(tempfile.mkdtemp(), "ckpt.safetensors")
    x = pf.randn(3, 2, device="cuda")
    pf.save({"x": x, "cpu": pf.ones(2)}, path)
    back = pf.load(path)
    assert back["x"].device.type == "cuda" and back["cpu"].device.type == "cpu"
    np.testing.assert_array_equal(back["x"].cpu().numpy(), x.cpu().numpy())
    assert pf.load(path, map_location="cpu")["x"].device.type == "cpu"


@check("optimizers step non-contiguous cuda state and grads on the device")
def _():
    start, grad = pf.randn(4, 3), pf.randn(3, 4)
    results = {}
    for dev in ("cpu", "cuda"):
        p = pf.nn.Parameter(start.to(dev, copy=True))
        opt = pf.optim.AdamW([p], lr=0.1)
        for _ in range(2):
            p.grad = grad.to(dev).t()                    # a transposed (non-contiguous) grad
            opt.step()
        assert p.device.type == dev and opt.state[p]["exp_avg"].device.type == dev
        results[dev] = p.detach().cpu().numpy()
    np.testing.assert_allclose(results["cuda"], results["cpu"], rtol=1e-6)


for f in failures:
    print("FAIL", f)
print(f"{checks} checks, {len(failures)} failures")
sys.exit(1 if failures else 0)
