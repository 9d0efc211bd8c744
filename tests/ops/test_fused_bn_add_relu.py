"""fused_batch_norm_add_relu: relu(batch_norm(x) + addend) (OneFlow's
normalization_add_relu), training and eval, with and without an addend:
float64 NumPy reference, finite differences, bit-for-bit equality with the
unfused batch_norm + add + relu in float32 (forward, every gradient, running
statistics), non-contiguous inputs, a graph, PyTorch, bad arguments."""
import numpy as np
import pytest

import pyflow as pf
from pyflow.ops.normalization import BatchNormAddRelu, fused_batch_norm_add_relu
from tests.helpers import assert_close, check_grad, needs_torch, to_numpy, torch

SHAPES = [(5, 3), (3, 2, 3, 4)]         # (N, C) and (N, C, H, W)
EPS = 1e-3


def np_reference(x, addend, mean, var, w=None, b=None, eps=EPS):
    shape = (1, -1) + (1,) * (x.ndim - 2)
    y = (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + eps)
    y = y * (1 if w is None else w.reshape(shape)) + (0 if b is None else b.reshape(shape))
    return np.maximum(y + (0 if addend is None else addend), 0)


def batch_stats(x):
    dims = (0,) + tuple(range(2, x.ndim))
    return x.mean(dims), x.var(dims)


def make_data(seed, shape, has_addend, training, margin=0.05, affine=True):
    """x, addend (or None), weight, bias, running mean and var, float64, with the
    relu's input at least ``margin`` away from 0 (finite differences never cross
    the kink): the addend (or, without one, x) is moved where it is not.  Without
    ``affine``, weight and bias are ones and zeros."""
    rng = np.random.default_rng(seed)
    C = shape[1]
    bshape = (1, -1) + (1,) * (len(shape) - 2)
    x = rng.standard_normal(shape)
    a = rng.standard_normal(shape) if has_addend else None
    w, b = rng.standard_normal(C), rng.standard_normal(C)
    if not affine:
        w, b = np.ones(C), np.zeros(C)
    rm, rv = rng.standard_normal(C), rng.uniform(0.5, 2, C)
    for _ in range(50):
        mean, var = batch_stats(x) if training else (rm, rv)
        pre = ((x - mean.reshape(bshape)) / np.sqrt(var.reshape(bshape) + EPS)
               * w.reshape(bshape) + b.reshape(bshape) + (0 if a is None else a))
        close = np.abs(pre) < margin
        if not close.any():
            break
        if a is not None:
            a = np.where(close, a + 4 * margin * np.sign(pre), a)
        else:
            x = np.where(close, x + 0.1 * rng.standard_normal(shape), x)
    assert not close.any()
    return x, a, w, b, rm, rv


def _call(training, rm, rv, eps=EPS, momentum=0.1):
    def fn(xt, at, wt, bt):
        return fused_batch_norm_add_relu(xt, at, pf.tensor(rm.copy()), pf.tensor(rv.copy()),
                                         wt, bt, training=training, momentum=momentum, eps=eps)
    return fn


# ------------------------------------------------------------------ float64 reference
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("has_addend", [True, False])
def test_forward_and_finite_differences(shape, training, has_addend):
    x, a, w, b, rm, rv = make_data(1, shape, has_addend, training)
    mean, var = batch_stats(x) if training else (rm, rv)
    fn = _call(training, rm, rv)
    out = fn(pf.tensor(x), None if a is None else pf.tensor(a), pf.tensor(w), pf.tensor(b))
    assert out.dtype is pf.float64 and tuple(out.shape) == shape
    assert_close(out, np_reference(x, a, mean, var, w, b), rtol=1e-10, atol=1e-12)
    assert (to_numpy(out) == 0).any() and (to_numpy(out) > 0).any()    # both relu sides
    if has_addend:
        check_grad(fn, [x, a, w, b], rtol=1e-4, atol=1e-6)
    else:
        check_grad(lambda xt, wt, bt: fn(xt, None, wt, bt), [x, w, b], rtol=1e-4, atol=1e-6)


def test_no_affine():
    x, a, _, _, rm, rv = make_data(2, (4, 3, 5), True, True, affine=False)
    out = fused_batch_norm_add_relu(pf.tensor(x), pf.tensor(a), None, None, training=True,
                                    eps=EPS)
    assert_close(out, np_reference(x, a, *batch_stats(x)), rtol=1e-10, atol=1e-12)
    check_grad(lambda xt, at: fused_batch_norm_add_relu(xt, at, None, None, training=True,
                                                        eps=EPS),
               [x, a], rtol=1e-4, atol=1e-6)


# ------------------------------------------------------------------ equal to the composition
def _run_both(x, a, w, b, rm, rv, g, training, affine, dtype=pf.float32):
    """(fused, unfused) results: out, grads of x, addend, weight, bias, then the
    running mean and var after the call."""
    results = []
    for fused in (True, False):
        xt = pf.tensor(x, dtype=dtype, requires_grad=True)
        at = None if a is None else pf.tensor(a, dtype=dtype, requires_grad=True)
        wt = pf.tensor(w, dtype=dtype, requires_grad=True) if affine else None
        bt = pf.tensor(b, dtype=dtype, requires_grad=True) if affine else None
        rmt, rvt = pf.tensor(rm, dtype=dtype), pf.tensor(rv, dtype=dtype)
        if fused:
            out = fused_batch_norm_add_relu(xt, at, rmt, rvt, wt, bt, training, 0.3, EPS)
        else:
            out = pf.batch_norm(xt, rmt, rvt, wt, bt, training, 0.3, EPS)
            out = pf.relu(out if at is None else out + at)
        out.backward(pf.tensor(g, dtype=dtype))
        grads = [t.grad for t in (xt, at, wt, bt) if t is not None]
        results.append([to_numpy(out)] + [to_numpy(t) for t in grads]
                       + [to_numpy(rmt), to_numpy(rvt)])
    return results


@pytest.mark.parametrize("shape", SHAPES + [(4, 3, 7)])
@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("has_addend", [True, False])
@pytest.mark.parametrize("affine", [True, False])
def test_float32_equals_unfused_bit_for_bit(shape, training, has_addend, affine):
    """Each kernel rounds op by op as batch_norm_apply, add, relu, relu's backward
    and batch_norm_backward do (the statistics in the same order): equal bits."""
    x, a, w, b, rm, rv = make_data(3, shape, has_addend, training, margin=0.0)
    g = np.random.default_rng(4).standard_normal(shape)
    fused, unfused = _run_both(x, a, w, b, rm, rv, g, training, affine)
    assert len(fused) == len(unfused) == 4 + has_addend + 2 * affine
    assert (fused[0] == 0).any() and (fused[0] > 0).any()
    for i, (p, q) in enumerate(zip(fused, unfused)):
        assert p.dtype == np.float32
        np.testing.assert_array_equal(p, q, err_msg=f"result {i}")


@pytest.mark.cpu_only
@pytest.mark.parametrize("training", [True, False])
def test_cpu_kernels_on_the_threads_and_on_one_thread_agree(training, monkeypatch):
    """The twin kernels (kernels/cpu/twin.py) give the same bits on the threads and
    on one thread, and both equal the unfused composition."""
    from pyflow.kernels.cpu import twin
    x, a, w, b, rm, rv = make_data(12, (4, 3, 6), True, training, margin=0.0)
    g = np.random.default_rng(13).standard_normal(x.shape)
    runs = []
    for threshold in (0, 1 << 60):
        monkeypatch.setattr(twin, "PARALLEL_MIN", threshold)
        runs.append(_run_both(x, a, w, b, rm, rv, g, training, True))
    for i, (p, q, r) in enumerate(zip(runs[0][0], runs[1][0], runs[0][1])):
        np.testing.assert_array_equal(p, q, err_msg=f"result {i}")
        np.testing.assert_array_equal(p, r, err_msg=f"result {i}")


def test_running_statistics_updated_in_place_as_batch_norm():
    rng = np.random.default_rng(5)
    rm, rv = pf.zeros(3), pf.ones(3)
    rm2, rv2 = pf.zeros(3), pf.ones(3)
    version = rm._version[0]
    for _ in range(3):
        x = pf.tensor(rng.standard_normal((4, 3, 2)) + 2, dtype=pf.float32)
        a = pf.tensor(rng.standard_normal((4, 3, 2)), dtype=pf.float32)
        fused_batch_norm_add_relu(x, a, rm, rv, training=True, momentum=0.2)
        pf.batch_norm(x, rm2, rv2, training=True, momentum=0.2)
    np.testing.assert_array_equal(to_numpy(rm), to_numpy(rm2))
    np.testing.assert_array_equal(to_numpy(rv), to_numpy(rv2))
    assert rm._version[0] == version + 3 and not rm.requires_grad
    # eval reads them and leaves them alone
    before = to_numpy(rm).copy()
    fused_batch_norm_add_relu(x, a, rm, rv, training=False)
    np.testing.assert_array_equal(to_numpy(rm), before)


# ------------------------------------------------------------------ layouts
@pytest.mark.parametrize("training", [True, False])
def test_non_contiguous_inputs(training):
    shape = (3, 4, 5)
    x, a, w, b, rm, rv = make_data(6, shape, True, training)
    mean, var = batch_stats(x) if training else (rm, rv)
    # x transposed in memory (N and C swapped), addend a step slice
    xt = pf.tensor(np.ascontiguousarray(x.transpose(1, 0, 2))).transpose(0, 1)
    big = np.zeros(shape[:-1] + (2 * shape[-1],))
    big[..., ::2] = a
    at = pf.tensor(big)[..., ::2]
    assert not xt.is_contiguous() and not at.is_contiguous()
    xt.requires_grad_()
    at.requires_grad_()
    out = fused_batch_norm_add_relu(xt, at, pf.tensor(rm), pf.tensor(rv), pf.tensor(w),
                                    pf.tensor(b), training=training, eps=EPS)
    assert_close(out, np_reference(x, a, mean, var, w, b), rtol=1e-10, atol=1e-12)
    g = np.random.default_rng(7).standard_normal(shape)
    out.backward(pf.tensor(g))
    x2, a2 = pf.tensor(x, requires_grad=True), pf.tensor(a, requires_grad=True)
    fused_batch_norm_add_relu(x2, a2, pf.tensor(rm), pf.tensor(rv), pf.tensor(w), pf.tensor(b),
                              training=training, eps=EPS).backward(pf.tensor(g))
    assert_close(xt.grad, x2.grad, rtol=1e-12, atol=1e-14)
    assert_close(at.grad, a2.grad, rtol=1e-12, atol=1e-14)


# ------------------------------------------------------------------ double backward
@pytest.mark.parametrize("training", [True, False])
def test_double_backward(training):
    """With create_graph the backward is written with ops (relu's mask, then
    batch_norm's differentiable backward) and gives the kernel's gradients."""
    x, a, w, b, rm, rv = make_data(8, (3, 2, 2), True, training)
    v = np.random.default_rng(9).standard_normal(x.shape)
    fn = _call(training, rm, rv)
    ts = [pf.tensor(t, requires_grad=True) for t in (x, a, w, b)]
    grads = pf.autograd.grad((fn(*ts) * pf.tensor(v)).sum(), ts, create_graph=True)
    us = [pf.tensor(t, requires_grad=True) for t in (x, a, w, b)]
    fn(*us).backward(pf.tensor(v))
    for g1, u in zip(grads, us):
        assert_close(g1, u.grad, rtol=1e-10, atol=1e-12)
    if training:        # d(dx)/dx: the batch statistics depend on x
        def first(xt):
            xt.requires_grad_()
            out = fn(xt, pf.tensor(a), pf.tensor(w), pf.tensor(b))
            return pf.autograd.grad((out * pf.tensor(v)).sum(), xt, create_graph=True)[0]
        check_grad(first, [x], rtol=1e-4, atol=1e-6)


# ------------------------------------------------------------------ graph
@pytest.mark.cpu_only
def test_traced_by_a_graph_like_batch_norm():
    """A graph traces it: the running statistics are assign nodes, the op one
    call node, and training steps equal eager ones."""
    class Block(pf.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = pf.nn.Linear(6, 4)
            self.bn = pf.nn.BatchNorm1d(4)
            self.head = pf.nn.Linear(4, 3)

        def forward(self, x):
            h = self.fc(x)
            h = fused_batch_norm_add_relu(h, h * 0.5, self.bn.running_mean,
                                          self.bn.running_var, self.bn.weight, self.bn.bias,
                                          self.training, 0.1, 1e-5)
            return self.head(h)

    class Train(pf.nn.Graph):
        def __init__(self, model, opt):
            super().__init__()
            self.model = model
            self.add_optimizer(opt)

        def build(self, x, y):
            loss = pf.nn.functional.cross_entropy(self.model(x), y)
            loss.backward()
            return loss

    pf.manual_seed(0)
    eager = Block()
    pf.manual_seed(0)
    graphed = Block()
    o1 = pf.optim.SGD(eager.parameters(), lr=0.1)
    graph = Train(graphed, pf.optim.SGD(graphed.parameters(), lr=0.1))
    rng = np.random.default_rng(10)
    for _ in range(3):
        x = pf.tensor(rng.standard_normal((8, 6)), dtype=pf.float32)
        y = pf.tensor(rng.integers(0, 3, 8))
        o1.zero_grad()
        loss = pf.nn.functional.cross_entropy(eager(x), y)
        loss.backward()
        o1.step()
        np.testing.assert_allclose(float(graph(x, y)), float(loss), rtol=1e-5)
    for (name, p1), p2 in zip(eager.state_dict().items(), graphed.state_dict().values()):
        np.testing.assert_allclose(to_numpy(p2), to_numpy(p1), rtol=1e-5, atol=1e-6,
                                   err_msg=name)
    nodes = graph.plans[0].graph.nodes
    assert [n for n in nodes if n.kind == "call" and n.target is BatchNormAddRelu]
    written = {n.attrs["state"].name for n in nodes if n.kind == "assign"}
    assert {"model.bn.running_mean", "model.bn.running_var"} <= written, written


# ------------------------------------------------------------------ PyTorch
@needs_torch
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("has_addend", [True, False])
def test_against_torch_over_several_steps(shape, has_addend):
    rng = np.random.default_rng(11)
    C = shape[1]
    w, b = rng.standard_normal(C).astype(np.float32), rng.standard_normal(C).astype(np.float32)
    rm, rv = pf.zeros(C), pf.ones(C)
    trm, trv = torch.zeros(C), torch.ones(C)
    for step in range(4):
        training = step < 3
        x = (rng.standard_normal(shape) * 2 + 1).astype(np.float32)
        a = rng.standard_normal(shape).astype(np.float32)
        g = rng.standard_normal(shape).astype(np.float32)
        arrays = (x, a, w, b) if has_addend else (x, w, b)
        ours = [pf.tensor(t, requires_grad=True) for t in arrays]
        theirs = [torch.tensor(t, requires_grad=True) for t in arrays]
        if not has_addend:
            ours.insert(1, None)
            theirs.insert(1, None)
        out = fused_batch_norm_add_relu(ours[0], ours[1], rm, rv, ours[2], ours[3], training,
                                        0.3, 1e-4)
        ref = torch.nn.functional.batch_norm(theirs[0], trm, trv, theirs[2], theirs[3],
                                             training, 0.3, 1e-4)
        ref = torch.relu(ref if theirs[1] is None else ref + theirs[1])
        out.backward(pf.tensor(g))
        ref.backward(torch.tensor(g))
        assert_close(out, ref.detach().cpu().numpy(), rtol=1e-4, atol=1e-5)
        for o, t in zip(ours, theirs):
            if o is not None:
                assert_close(o.grad, t.grad.cpu().numpy(), rtol=1e-4, atol=1e-4)
        assert_close(rm, trm.cpu().numpy(), rtol=1e-5, atol=1e-6)
        assert_close(rv, trv.cpu().numpy(), rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ bad arguments
def test_errors():
    op = fused_batch_norm_add_relu
    x, rm, rv = pf.ones(2, 3, 4), pf.zeros(3), pf.ones(3)
    with pytest.raises(RuntimeError, match=r"addend of the shape of input \[2, 3, 4\], "
                                           r"got \[2, 3, 5\]"):
        op(x, pf.ones(2, 3, 5), rm, rv)
    with pytest.raises(RuntimeError, match=r"addend of the shape of input \[2, 3, 4\], "
                                           r"got \[3, 4\]"):
        op(x, pf.ones(3, 4), rm, rv)        # no broadcasting
    with pytest.raises(RuntimeError, match=r"addend of input's dtype .*float32.*got .*float64"):
        op(x, pf.ones(2, 3, 4, dtype=pf.float64), rm, rv)
    with pytest.raises(TypeError, match="addend"):
        op(x, np.ones((2, 3, 4)), rm, rv)
    with pytest.raises(RuntimeError, match=r"fused_batch_norm_add_relu\(\): expected "
                                           r"running_mean of shape \[3\].*got \[4\]"):
        op(x, x, pf.zeros(4), rv)
    with pytest.raises(RuntimeError, match=r"expected running_var of shape \[3\].*got \[2\]"):
        op(x, x, rm, pf.ones(2))
    with pytest.raises(RuntimeError, match=r"expected weight of shape \[3\].*got \[3, 1\]"):
        op(x, x, rm, rv, pf.ones(3, 1))
    with pytest.raises(RuntimeError, match="must be given when training=False"):
        op(x, x, None, None)
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        op(pf.ones(1, 3), None, None, None, training=True)
    with pytest.raises(ValueError, match="at least 2 dims"):
        op(pf.ones(3), None, rm, rv)
    with pytest.raises(RuntimeError, match="floating point"):
        op(pf.ones(2, 3, dtype=pf.int64), None, rm, rv)
