"""pyflow.autocast against torch.autocast("cpu"): the op policy table, a small
model's dtypes, loss and gradients, the context manager's state rules, and a
graph traced under autocast."""
import threading

import numpy as np
import pytest

import pyflow as pf
from pyflow import nn
from pyflow.nn import functional as F

RNG = np.random.default_rng(0)


def _a(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _p(*shape):
    return RNG.uniform(0.05, 0.95, shape).astype(np.float32)


# name -> (the call, given a module with the op namespace, F and the arrays, arrays)
# The same lambda runs on pyflow (lib=pf, fn=F) and torch (lib=torch, fn=torch's F).
OPS = {
    "matmul": (lambda lib, fn, a: lib.matmul(*a), (_a(3, 4), _a(4, 5))),
    "matmul_3d_2d": (lambda lib, fn, a: lib.matmul(*a), (_a(2, 3, 4), _a(4, 5))),
    "mm": (lambda lib, fn, a: lib.mm(*a), (_a(3, 4), _a(4, 5))),
    "bmm": (lambda lib, fn, a: lib.bmm(*a), (_a(2, 3, 4), _a(2, 4, 5))),
    "mv": (lambda lib, fn, a: lib.mv(*a), (_a(3, 4), _a(4))),
    "dot": (lambda lib, fn, a: lib.dot(*a), (_a(4), _a(4))),
    "linear": (lambda lib, fn, a: fn.linear(*a), (_a(3, 4), _a(5, 4), _a(5))),
    "addmm": (lambda lib, fn, a: lib.addmm(*a), (_a(3, 5), _a(3, 4), _a(4, 5))),
    "baddbmm": (lambda lib, fn, a: lib.baddbmm(*a), (_a(2, 3, 5), _a(2, 3, 4), _a(2, 4, 5))),
    "conv2d": (lambda lib, fn, a: fn.conv2d(*a), (_a(1, 2, 5, 5), _a(3, 2, 3, 3), _a(3))),
    "scaled_dot_product_attention": (lambda lib, fn, a: fn.scaled_dot_product_attention(*a),
                                     (_a(1, 2, 4, 8), _a(1, 2, 4, 8), _a(1, 2, 4, 8))),
    "cross_entropy": (lambda lib, fn, a: fn.cross_entropy(a[0], lib.tensor([0, 1, 2, 3])),
                      (_a(4, 5),)),
    "cross_entropy_probs": (lambda lib, fn, a: fn.cross_entropy(*a), (_a(4, 5), _p(4, 5))),
    "nll_loss": (lambda lib, fn, a: fn.nll_loss(a[0], lib.tensor([0, 1, 2, 3])), (_a(4, 5),)),
    "mse_loss": (lambda lib, fn, a: fn.mse_loss(*a), (_a(4, 5), _a(4, 5))),
    "l1_loss": (lambda lib, fn, a: fn.l1_loss(*a), (_a(4, 5), _a(4, 5))),
    "binary_cross_entropy": (lambda lib, fn, a: fn.binary_cross_entropy(*a), (_p(4, 5), _p(4, 5))),
    "binary_cross_entropy_with_logits": (lambda lib, fn, a: fn.binary_cross_entropy_with_logits(*a),
                                         (_a(4, 5), _p(4, 5))),
    "prod": (lambda lib, fn, a: lib.prod(a[0]), (_p(4, 5),)),
    # pass-through: the inputs' dtype either way
    "softmax": (lambda lib, fn, a: fn.softmax(a[0], -1), (_a(4, 5),)),
    "log_softmax": (lambda lib, fn, a: fn.log_softmax(a[0], -1), (_a(4, 5),)),
    "layer_norm": (lambda lib, fn, a: fn.layer_norm(a[0], (5,)), (_a(4, 5),)),
    "gelu": (lambda lib, fn, a: fn.gelu(a[0]), (_a(4, 5),)),
    "relu": (lambda lib, fn, a: fn.relu(a[0]), (_a(4, 5),)),
    "sum": (lambda lib, fn, a: a[0].sum(), (_a(4, 5),)),
    "mean": (lambda lib, fn, a: a[0].mean(), (_a(4, 5),)),
    "exp": (lambda lib, fn, a: a[0].exp(), (_a(4, 5),)),
    "max_pool2d": (lambda lib, fn, a: fn.max_pool2d(a[0], 2), (_a(1, 2, 4, 4),)),
    "avg_pool2d": (lambda lib, fn, a: fn.avg_pool2d(a[0], 2), (_a(1, 2, 4, 4),)),
    "embedding": (lambda lib, fn, a: fn.embedding(lib.tensor([0, 1]), a[0]), (_a(4, 5),)),
}
LOWER = ["matmul", "matmul_3d_2d", "mm", "bmm", "linear", "addmm", "baddbmm", "conv2d",
         "scaled_dot_product_attention"]
FP32 = ["cross_entropy", "cross_entropy_probs", "nll_loss", "mse_loss", "l1_loss",
        "binary_cross_entropy", "binary_cross_entropy_with_logits", "prod"]


def _pf_dtype(torch, d):
    return {torch.float32: pf.float32, torch.bfloat16: pf.bfloat16}[d]


def _run_both(name, dtype_name):
    torch = pytest.importorskip("torch")
    call, arrays = OPS[name]
    tdt = getattr(torch, dtype_name)
    t_args = [torch.tensor(a).to(tdt) for a in arrays]
    p_args = [pf.tensor(a).to(getattr(pf, dtype_name)) for a in arrays]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        t_out = call(torch, torch.nn.functional, t_args)
    with pf.autocast("cpu"):
        p_out = call(pf, F, p_args)
    return torch, t_out, p_out


@pytest.mark.parametrize("name", sorted(OPS))
@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
def test_op_dtype_matches_torch(name, dtype_name):
    torch, t_out, p_out = _run_both(name, dtype_name)
    assert p_out.dtype is _pf_dtype(torch, t_out.dtype), \
        f"{name} on {dtype_name} inputs: pyflow gives {p_out.dtype}, torch {t_out.dtype}"
    np.testing.assert_allclose(p_out.float().numpy(), t_out.float().numpy(),
                               rtol=2e-2, atol=2e-2)


def test_the_lists_are_what_torch_does():
    """The two lists (docs/amp.md's table) are torch's: each LOWER op turns float32
    into bfloat16, each FP32 op bfloat16 into float32, and no other op does either."""
    torch = pytest.importorskip("torch")
    for name in OPS:
        _, lo, _ = _run_both(name, "float32")
        _, hi, _ = _run_both(name, "bfloat16")
        assert (lo.dtype is torch.bfloat16) == (name in LOWER), name
        assert (hi.dtype is torch.float32) == (name in FP32), name


def test_mixed_dtype_add_and_int_tensors_follow_promotion():
    torch = pytest.importorskip("torch")
    x, y = _a(4), _a(4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        t = torch.tensor(x) + torch.tensor(y).bfloat16()
        ti = torch.tensor([1, 2]) * 3
    with pf.autocast("cpu"):
        p = pf.tensor(x) + pf.tensor(y).bfloat16()
        pi = pf.tensor([1, 2]) * 3
        m = pf.matmul(pf.tensor([[1, 2]]), pf.tensor([[3], [4]]))    # ints are never cast
    assert p.dtype is _pf_dtype(torch, t.dtype) is pf.float32
    assert pi.dtype is pf.int64 and ti.dtype is torch.int64
    assert m.dtype is pf.int64 and m.item() == 11


def test_float64_is_not_cast():
    with pf.autocast("cpu"):
        out = pf.matmul(pf.randn(2, 3, dtype=pf.float64), pf.randn(3, 2, dtype=pf.float64))
    assert out.dtype is pf.float64


def test_off_by_default_and_outside():
    a, b = pf.randn(2, 3), pf.randn(3, 2)
    assert not pf.is_autocast_enabled("cpu")
    assert pf.matmul(a, b).dtype is pf.float32
    with pf.autocast("cpu"):
        assert pf.matmul(a, b).dtype is pf.bfloat16
    assert pf.matmul(a, b).dtype is pf.float32


# ------------------------------------------------------------------ a small model
def test_mlp_loss_and_grads_match_torch():
    torch = pytest.importorskip("torch")
    w1, b1, w2, b2 = _a(16, 8) * 0.3, _a(16) * 0.1, _a(5, 16) * 0.3, _a(5) * 0.1
    x, y = _a(12, 8), RNG.integers(0, 5, 12)

    tm = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 5))
    pm = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 5))
    with torch.no_grad():
        for p, v in zip(tm.parameters(), (w1, b1, w2, b2)):
            p.copy_(torch.tensor(v))
    with pf.no_grad():
        for p, v in zip(pm.parameters(), (w1, b1, w2, b2)):
            p.copy_(pf.tensor(v))

    with torch.autocast("cpu", dtype=torch.bfloat16):
        t_out = tm(torch.tensor(x))
        t_loss = torch.nn.functional.cross_entropy(t_out, torch.tensor(y))
    t_loss.backward()
    with pf.autocast("cpu"):
        p_out = pm(pf.tensor(x))
        p_loss = F.cross_entropy(p_out, pf.tensor(y))
    p_loss.backward()

    assert p_out.dtype is pf.bfloat16 and t_out.dtype is torch.bfloat16
    assert p_loss.dtype is pf.float32 and t_loss.dtype is torch.float32
    # bfloat16 keeps 8 bits: both run the same casts, so the losses agree to a few ulps
    assert abs(p_loss.item() - t_loss.item()) <= 1e-2 * abs(t_loss.item())
    for (name, pp), tp in zip(pm.named_parameters(), tm.parameters()):
        assert pp.grad.dtype is pf.float32, name
        np.testing.assert_allclose(pp.grad.numpy(), tp.grad.numpy(), rtol=5e-2, atol=5e-3,
                                   err_msg=name)


# ------------------------------------------------------------------ the state
def test_nesting_restores_and_disable_inside():
    a, b = pf.randn(2, 3), pf.randn(3, 2)
    with pf.autocast("cpu"):
        assert pf.is_autocast_enabled("cpu") and pf.get_autocast_dtype("cpu") is pf.bfloat16
        with pf.autocast("cpu", dtype=pf.float16):
            assert pf.get_autocast_dtype("cpu") is pf.float16
            assert pf.matmul(a, b).dtype is pf.float16
        assert pf.get_autocast_dtype("cpu") is pf.bfloat16
        with pf.autocast("cpu", enabled=False):
            assert not pf.is_autocast_enabled("cpu")
            assert pf.matmul(a, b).dtype is pf.float32
        assert pf.is_autocast_enabled("cpu")
        assert pf.matmul(a, b).dtype is pf.bfloat16
    assert not pf.is_autocast_enabled("cpu")


def test_state_is_restored_after_an_exception():
    with pytest.raises(KeyError):
        with pf.autocast("cpu"):
            raise KeyError("x")
    assert not pf.is_autocast_enabled("cpu")


def test_cuda_state_is_separate():
    assert pf.get_autocast_dtype("cuda") is pf.float16
    with pf.autocast("cuda"):
        assert pf.is_autocast_enabled("cuda") and not pf.is_autocast_enabled("cpu")
        # CPU tensors are not cast by CUDA autocast
        assert pf.matmul(pf.randn(2, 3), pf.randn(3, 2)).dtype is pf.float32


def test_decorator():
    @pf.autocast("cpu")
    def f(a, b):
        assert pf.is_autocast_enabled("cpu")
        return a @ b

    assert f(pf.randn(2, 3), pf.randn(3, 2)).dtype is pf.bfloat16
    assert not pf.is_autocast_enabled("cpu")
    assert pf.amp.autocast is pf.autocast


def test_thread_local():
    seen = []
    started, done = threading.Event(), threading.Event()

    def other():
        started.wait()
        seen.append(pf.is_autocast_enabled("cpu"))
        seen.append(pf.matmul(pf.randn(2, 3), pf.randn(3, 2)).dtype)
        done.set()

    t = threading.Thread(target=other)
    t.start()
    with pf.autocast("cpu"):
        started.set()
        done.wait(5)
    t.join()
    assert seen == [False, pf.float32]


def test_errors_name_the_argument():
    with pytest.raises(ValueError,
                       match=r"device_type must be one of \('cpu', 'cuda'\), got 'tpu'"):
        pf.autocast("tpu")
    with pytest.raises(TypeError, match="device_type must be a str"):
        pf.autocast(0)
    with pytest.raises(TypeError, match="dtype must be pyflow.bfloat16 or pyflow.float16 for "
                                        "device_type 'cpu', got pyflow.float32"):
        pf.autocast("cpu", dtype=pf.float32)
    with pytest.raises(TypeError, match="dtype must be pyflow.float16 or pyflow.bfloat16"):
        pf.autocast("cuda", dtype="int8")
    with pytest.raises(TypeError, match="enabled must be a bool"):
        pf.autocast("cpu", enabled="yes")
    with pytest.raises(ValueError, match="device_type must be one of"):
        pf.is_autocast_enabled("xpu")


def test_gradients_come_back_in_float32():
    w = pf.randn(3, 4, requires_grad=True)
    x = pf.randn(2, 3)
    with pf.autocast("cpu"):
        y = x @ w
    assert y.dtype is pf.bfloat16
    y.float().sum().backward()
    assert w.grad.dtype is pf.float32
    np.testing.assert_allclose(w.grad.numpy(), np.repeat(x.numpy().sum(0)[:, None], 4, 1),
                               rtol=1e-2, atol=1e-2)


# ------------------------------------------------------------------ graph mode
def test_graph_under_autocast_matches_eager():
    pf.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 5))
    x, y = pf.tensor(_a(12, 8)), pf.tensor(RNG.integers(0, 5, 12))

    class Step(nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = model

        def build(self, x, y):
            with pf.autocast("cpu"):
                out = self.model(x)
                loss = F.cross_entropy(out, y)
            return out, loss

    g_out, g_loss = Step()(x, y)
    with pf.autocast("cpu"):
        e_out = model(x)
        e_loss = F.cross_entropy(e_out, y)
    assert g_out.dtype is e_out.dtype is pf.bfloat16
    assert g_loss.dtype is e_loss.dtype is pf.float32
    assert g_loss.item() == e_loss.item()
    with pf.no_grad():      # and not the float32 loss: autocast was traced into the graph
        f_loss = F.cross_entropy(model(x), y).item()
    assert f_loss != g_loss.item()


def test_training_graph_under_autocast_matches_eager():
    """build() with forward under autocast, backward and an SGD step: the same
    losses and parameters as eager, step by step."""
    def make():
        pf.manual_seed(1)
        return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 5))

    eager, graphed = make(), make()
    o1 = pf.optim.SGD(eager.parameters(), lr=0.1)
    o2 = pf.optim.SGD(graphed.parameters(), lr=0.1)

    class Train(nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = graphed
            self.add_optimizer(o2)

        def build(self, x, y):
            with pf.autocast("cpu"):
                loss = F.cross_entropy(self.model(x), y)
            loss.backward()
            return loss

    graph = Train()
    for _ in range(3):
        x, y = pf.tensor(_a(12, 8)), pf.tensor(RNG.integers(0, 5, 12))
        o1.zero_grad()
        with pf.autocast("cpu"):
            expected = F.cross_entropy(eager(x), y)
        expected.backward()
        o1.step()
        assert eager[0].weight.grad.dtype is pf.float32
        np.testing.assert_allclose(float(graph(x, y)), float(expected), rtol=1e-6)
    for (name, p1), p2 in zip(eager.named_parameters(), graphed.parameters()):
        assert p2.dtype is pf.float32
        np.testing.assert_allclose(p2.detach().numpy(), p1.detach().numpy(), rtol=1e-5,
                                   atol=1e-6, err_msg=name)


def test_global_tensors_are_cast_the_same_way():
    pl = pf.placement("cpu", ranks=[0])
    w = pf.randn(5, 3, requires_grad=True)
    x = pf.randn(4, 3).to_global(placement=pl, sbp=pf.sbp.broadcast)
    target = pf.zeros(4, 5).to_global(placement=pl, sbp=pf.sbp.broadcast)
    with pf.autocast("cpu"):
        y = F.linear(x, w.to_global(placement=pl, sbp=pf.sbp.broadcast))
        loss = F.mse_loss(y, target)
    assert y.dtype is pf.bfloat16 and y.placement == pl
    assert loss.dtype is pf.float32
    loss.backward()
    assert w.grad.dtype is pf.float32 and w.grad.shape == (5, 3)
