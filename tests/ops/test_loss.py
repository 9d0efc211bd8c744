"""Losses: float64 NumPy references over random shapes, weights, ignore_index
and label smoothing; finite differences; PyTorch values and gradients; the
edge cases (all targets ignored, huge logits) and bad input."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

import pyflow as pf
from tests.helpers import assert_close, check_grad, layouts, make_input, needs_torch, torch

IGNORE = -100


def np_log_softmax(x, axis):
    m = x.max(axis, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis, keepdims=True))


def np_cross_entropy(x, t, w=None, ignore_index=IGNORE, reduction="mean", smoothing=0.0):
    """PyTorch's definition for class-index targets; x (N, C, ...), t (N, ...)."""
    C = x.shape[1]
    logp = np.moveaxis(np_log_softmax(x, 1), 1, -1).reshape(-1, C)
    tt = t.reshape(-1)
    w = np.ones(C) if w is None else w
    keep = tt != ignore_index
    safe = np.where(keep, tt, 0)
    nll = -w[safe] * logp[np.arange(tt.size), safe]
    smooth = -(logp * w).sum(1)
    loss = np.where(keep, (1 - smoothing) * nll + smoothing / C * smooth, 0.0)
    if reduction == "none":
        return loss.reshape(t.shape)
    if reduction == "sum":
        return loss.sum()
    with np.errstate(invalid="ignore"):
        return loss.sum() / (w[safe] * keep).sum()


def np_bce_with_logits(x, y, w=None, pw=None):
    """The naive definition (fine for moderate x)."""
    s = 1 / (1 + np.exp(-x))
    pw = 1.0 if pw is None else pw
    loss = -(pw * y * np.log(s) + (1 - y) * np.log(1 - s))
    return loss * (1.0 if w is None else w)


@st.composite
def class_problem(draw):
    """Logits (N, C, d...), targets with some ignored, optional class weights."""
    N, C = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    extra = draw(st.lists(st.integers(1, 3), max_size=2).map(tuple))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    layout = draw(layouts())
    x, tx = make_input(rng, (N, C) + extra, layout, low=-3, high=3)
    t = rng.integers(0, C, (N,) + extra)
    t[rng.random(t.shape) < 0.25] = IGNORE
    w = rng.uniform(0.5, 2.0, C) if draw(st.booleans()) else None
    return x, tx, t, w


@given(problem=class_problem(), reduction=st.sampled_from(["mean", "sum", "none"]),
       smoothing=st.sampled_from([0.0, 0.25]))
def test_cross_entropy_against_reference(problem, reduction, smoothing):
    x, tx, t, w = problem
    pw = None if w is None else pf.tensor(w)
    out = pf.cross_entropy(tx, pf.tensor(t), pw, reduction=reduction, label_smoothing=smoothing)
    ref = np_cross_entropy(x, t, w, reduction=reduction, smoothing=smoothing)
    assert_close(out, ref, rtol=1e-10, atol=1e-12)
    if reduction != "mean" or (t != IGNORE).any():
        check_grad(lambda a: pf.cross_entropy(a, pf.tensor(t), pw, reduction=reduction,
                                              label_smoothing=smoothing), [x])


@given(problem=class_problem(), reduction=st.sampled_from(["mean", "sum", "none"]))
def test_nll_loss_against_reference(problem, reduction):
    x, tx, t, w = problem
    logp = np_log_softmax(x, 1)
    pw = None if w is None else pf.tensor(w)
    out = pf.nll_loss(pf.tensor(logp), pf.tensor(t), pw, reduction=reduction)
    assert_close(out, np_cross_entropy(x, t, w, reduction=reduction), rtol=1e-10, atol=1e-12)
    check_grad(lambda a: pf.nll_loss(a, pf.tensor(t), pw, reduction="sum"), [logp])


def test_cross_entropy_float32_and_huge_logits():
    x = np.array([[1000.0, 0.0, -1000.0], [0.5, 0.25, 0.0]])
    t = np.array([1, 2])
    out = pf.cross_entropy(pf.tensor(x, dtype=pf.float32), pf.tensor(t), reduction="none")
    assert out.dtype is pf.float32
    assert_close(out, np_cross_entropy(x, t, reduction="none"), rtol=1e-6)
    rng = np.random.default_rng(0)
    x, t = rng.standard_normal((9, 70)) * 3, rng.integers(0, 70, 9)
    a = pf.tensor(x, dtype=pf.float32, requires_grad=True)
    pf.cross_entropy(a, pf.tensor(t), label_smoothing=0.1).backward()
    b = pf.tensor(x, requires_grad=True)
    pf.cross_entropy(b, pf.tensor(t), label_smoothing=0.1).backward()
    assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-7)


@pytest.mark.cpu_only          # 70,000 rows: far too many for the CUDA simulator
@pytest.mark.parametrize("dt", ["float16", "bfloat16"])
def test_half_mean_over_many_rows_does_not_overflow(dt):
    """70,000 rows of loss ~1.4 sum past float16's 65,504: the mean is taken in
    float32 and stored in the logits' dtype."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((70000, 3)).astype(np.float32)
    t = rng.integers(0, 3, 70000)
    logits = pf.tensor(x).to(getattr(pf, dt))
    got = pf.nn.functional.cross_entropy(logits, pf.tensor(t))
    assert got.dtype is logits.dtype
    want = np_cross_entropy(logits.float().cpu().numpy().astype(np.float64), t)
    assert abs(float(got) - want) < 1e-2 * abs(want)


def test_all_ignored_and_unbatched():
    x = pf.tensor([[1.0, 2.0], [0.0, 1.0]])
    t = pf.tensor([IGNORE, IGNORE])
    assert np.isnan(pf.cross_entropy(x, t).item())
    assert np.isnan(pf.nll_loss(x, t).item())
    assert pf.cross_entropy(x, t, reduction="sum").item() == 0.0
    xr = pf.tensor([[1.0, 2.0]], requires_grad=True)
    pf.cross_entropy(xr, pf.tensor([IGNORE]), reduction="sum").backward()
    assert xr.grad.tolist() == [[0.0, 0.0]]
    one = pf.cross_entropy(pf.tensor([1.0, 2.0, 0.5]), pf.tensor(2))
    assert one.shape == () and abs(one.item() - np_cross_entropy(
        np.array([[1.0, 2.0, 0.5]]), np.array([2]))) < 1e-6
    assert pf.cross_entropy(pf.tensor([1.0, 2.0]), pf.tensor(0), ignore_index=0, reduction="none").item() == 0


def test_probability_targets():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 4, 2))
    q = rng.random((3, 4, 2))
    q /= q.sum(1, keepdims=True)
    w = rng.uniform(0.5, 2, 4)
    logp = np_log_softmax(x, 1)
    for s in (0.0, 0.3):
        qs = q * (1 - s) + s / 4
        ref = -(logp * qs * w[None, :, None]).sum(1).mean()
        out = pf.cross_entropy(pf.tensor(x), pf.tensor(q), pf.tensor(w), label_smoothing=s)
        assert_close(out, ref, rtol=1e-10)
        check_grad(lambda a, b: pf.cross_entropy(a, b, pf.tensor(w), label_smoothing=s), [x, q])


@pytest.mark.parametrize("name", ["cross_entropy", "nll_loss"])
def test_double_backward(name):
    """Squaring the per-sample losses makes the incoming gradient depend on x, so the
    differentiable backward (and the scatter's own backward) are exercised."""
    rng = np.random.default_rng(7)
    x, w = rng.standard_normal((4, 3)), rng.uniform(0.5, 2, 3)
    t = pf.tensor(np.array([0, 2, IGNORE, 1]))
    kw = {"label_smoothing": 0.2} if name == "cross_entropy" else {}

    def first(a):
        a.requires_grad_()
        per = getattr(pf, name)(a, t, pf.tensor(w), reduction="none", **kw)
        return pf.autograd.grad((per * per).sum(), a, create_graph=True)[0]
    check_grad(first, [x], rtol=1e-5, atol=1e-6)
    fused = pf.tensor(x, requires_grad=True)    # the differentiable form gives the same grad
    per = getattr(pf, name)(fused, t, pf.tensor(w), reduction="none", **kw)
    (per * per).sum().backward()
    assert_close(first(pf.tensor(x)), fused.grad, rtol=1e-10, atol=1e-12)


def test_legacy_reduction_arguments():
    x, t = pf.tensor([[1.0, 2.0], [3.0, 0.0]]), pf.tensor([0, 1])
    per = pf.cross_entropy(x, t, reduction="none")
    assert_close(pf.cross_entropy(x, t, size_average=False), per.sum())
    assert_close(pf.cross_entropy(x, t, reduce=False), per)
    assert_close(pf.mse_loss(x, x * 2, size_average=True), (x * x).mean())


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_mse_and_l1(reduction):
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    red = {"mean": np.mean, "sum": np.sum, "none": lambda v: v}[reduction]
    assert_close(pf.mse_loss(pf.tensor(a), pf.tensor(b), reduction=reduction), red((a - b) ** 2))
    assert_close(pf.l1_loss(pf.tensor(a), pf.tensor(b), reduction=reduction), red(np.abs(a - b)))
    check_grad(lambda u, v: pf.mse_loss(u, v, reduction=reduction), [a, b])
    check_grad(lambda u, v: pf.l1_loss(u, v, reduction=reduction), [a, b])


@given(data=st.data())
def test_bce_with_logits_against_reference(data):
    shape = data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    x, tx = make_input(rng, shape, data.draw(layouts()), low=-4, high=4)
    y = rng.random(shape)
    w = rng.uniform(0.5, 2, shape[-1:]) if data.draw(st.booleans()) else None
    pw = rng.uniform(0.5, 3, shape[-1:]) if data.draw(st.booleans()) else None
    reduction = data.draw(st.sampled_from(["mean", "sum", "none"]))
    as_t = (lambda a: None if a is None else pf.tensor(a))
    out = pf.binary_cross_entropy_with_logits(tx, pf.tensor(y), as_t(w), reduction=reduction,
                                              pos_weight=as_t(pw))
    ref = np_bce_with_logits(x, y, w, pw)
    ref = {"mean": np.mean, "sum": np.sum, "none": lambda v: v}[reduction](ref)
    assert_close(out, ref, rtol=1e-10, atol=1e-12)
    inputs = [x, y] + [a for a in (w, pw) if a is not None]

    def fn(*ts):
        it = iter(ts[2:])
        wt = next(it) if w is not None else None
        pwt = next(it) if pw is not None else None
        return pf.binary_cross_entropy_with_logits(ts[0], ts[1], wt, reduction=reduction,
                                                   pos_weight=pwt)
    check_grad(fn, inputs)


def test_bce_with_logits_is_stable_and_zero_logit_grad():
    x = pf.tensor([-200.0, 200.0, 0.0], dtype=pf.float32, requires_grad=True)
    y = pf.tensor([1.0, 0.0, 1.0], dtype=pf.float32)
    out = pf.binary_cross_entropy_with_logits(x, y, reduction="none")
    assert_close(out, [200.0, 200.0, np.log(2.0)], rtol=1e-6)
    out.sum().backward()
    assert_close(x.grad, [-1.0, 1.0, -0.5], rtol=1e-6)


def test_binary_cross_entropy():
    p, y = np.array([0.2, 0.9, 0.5]), np.array([0.0, 1.0, 0.3])
    ref = -(y * np.log(p) + (1 - y) * np.log(1 - p))
    assert_close(pf.binary_cross_entropy(pf.tensor(p), pf.tensor(y), reduction="none"), ref)
    check_grad(lambda a: pf.binary_cross_entropy(a, pf.tensor(y)), [p])
    assert pf.binary_cross_entropy(pf.tensor([0.0]), pf.tensor([1.0])).item() == 100.0
    with pytest.raises(RuntimeError, match="between 0 and 1"):
        pf.binary_cross_entropy(pf.tensor([1.5]), pf.tensor([1.0]))


def test_errors_are_clear():
    x = pf.ones(2, 3)
    with pytest.raises(IndexError, match="target 3 is out of bounds for 3 classes"):
        pf.cross_entropy(x, pf.tensor([0, 3]))
    with pytest.raises(IndexError, match="target -1 is out of bounds"):
        pf.nll_loss(x, pf.tensor([-1, 0]))
    with pytest.raises(ValueError, match=r"batch_size \(2\) to match target batch_size \(3\)"):
        pf.cross_entropy(x, pf.tensor([0, 1, 2]))
    with pytest.raises(RuntimeError, match="probability"):
        pf.cross_entropy(x, pf.ones(2, 4))
    with pytest.raises(TypeError, match="integer tensor"):
        pf.nll_loss(x, pf.tensor([True, False]))
    with pytest.raises(RuntimeError, match="weight must be a 1-D tensor of 3"):
        pf.cross_entropy(x, pf.tensor([0, 1]), weight=pf.ones(2))
    with pytest.raises(ValueError, match="not a valid value for reduction"):
        pf.mse_loss(x, x, reduction="avg")
    with pytest.raises(ValueError, match="label_smoothing"):
        pf.cross_entropy(x, pf.tensor([0, 1]), label_smoothing=1.5)
    with pytest.raises(ValueError, match="must be the same as input size"):
        pf.binary_cross_entropy_with_logits(x, pf.ones(3))
    with pytest.raises(RuntimeError, match="not broadcastable"):
        pf.mse_loss(x, pf.ones(4))


# ------------------------------------------------------------------ PyTorch
@needs_torch
@pytest.mark.parametrize("shape", [(6, 5), (3, 4, 2, 3)])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("smoothing", [0.0, 0.2])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_against_torch(shape, weighted, smoothing, reduction):
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(shape) * 2).astype(np.float32)
    t = rng.integers(0, shape[1], (shape[0],) + shape[2:])
    t.reshape(-1)[::4] = 1                 # custom ignore_index below
    w = rng.uniform(0.5, 2, shape[1]).astype(np.float32) if weighted else None
    a = pf.tensor(x, requires_grad=True)
    ta = torch.tensor(x, requires_grad=True)
    out = pf.cross_entropy(a, pf.tensor(t), None if w is None else pf.tensor(w), ignore_index=1,
                           reduction=reduction, label_smoothing=smoothing)
    ref = torch.nn.functional.cross_entropy(ta, torch.tensor(t), None if w is None else
                                            torch.tensor(w), ignore_index=1, reduction=reduction,
                                            label_smoothing=smoothing)
    assert_close(out, ref.detach().cpu().numpy(), rtol=1e-5, atol=1e-6)
    g = rng.standard_normal(tuple(ref.shape)).astype(np.float32)
    out.backward(pf.tensor(g))
    ref.backward(torch.tensor(g))
    assert_close(a.grad, ta.grad.cpu().numpy(), rtol=1e-4, atol=1e-6)


@needs_torch
@pytest.mark.parametrize("smoothing", [0.0, 0.2])
def test_probability_targets_against_torch(smoothing):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((4, 3, 2)).astype(np.float32)
    q = rng.random((4, 3, 2)).astype(np.float32)
    w = rng.uniform(0.5, 2, 3).astype(np.float32)
    a, b = pf.tensor(x, requires_grad=True), pf.tensor(q, requires_grad=True)
    ta, tb = torch.tensor(x, requires_grad=True), torch.tensor(q, requires_grad=True)
    out = pf.cross_entropy(a, b, pf.tensor(w), label_smoothing=smoothing)
    ref = torch.nn.functional.cross_entropy(ta, tb, torch.tensor(w), label_smoothing=smoothing)
    out.backward()
    ref.backward()
    assert_close(out, ref.item(), rtol=1e-5)
    assert_close(a.grad, ta.grad.cpu().numpy(), rtol=1e-4, atol=1e-6)
    assert_close(b.grad, tb.grad.cpu().numpy(), rtol=1e-4, atol=1e-6)


@needs_torch
def test_nll_mse_l1_against_torch():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((5, 4, 3)).astype(np.float32)
    t = rng.integers(0, 4, (5, 3))
    w = rng.uniform(0.5, 2, 4).astype(np.float32)
    a, ta = pf.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    y = rng.standard_normal((5, 4, 3)).astype(np.float32)
    F = torch.nn.functional
    out = (pf.nll_loss(a, pf.tensor(t), pf.tensor(w)) + pf.mse_loss(a, pf.tensor(y))
           + pf.l1_loss(a, pf.tensor(y), reduction="sum"))
    ref = (F.nll_loss(ta, torch.tensor(t), torch.tensor(w)) + F.mse_loss(ta, torch.tensor(y))
           + F.l1_loss(ta, torch.tensor(y), reduction="sum"))
    out.backward()
    ref.backward()
    assert_close(out, ref.item(), rtol=1e-5)
    assert_close(a.grad, ta.grad.cpu().numpy(), rtol=1e-4, atol=1e-6)


@needs_torch
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_bce_with_logits_against_torch(reduction):
    rng = np.random.default_rng(6)
    x = (rng.standard_normal((4, 3)) * 5).astype(np.float32)
    y = rng.random((4, 3)).astype(np.float32)
    w = rng.uniform(0.5, 2, (4, 1)).astype(np.float32)
    pw = rng.uniform(0.5, 3, 3).astype(np.float32)
    ours = [pf.tensor(v, requires_grad=True) for v in (x, y, w, pw)]
    theirs = [torch.tensor(v, requires_grad=i < 2) for i, v in enumerate((x, y, w, pw))]
    out = pf.binary_cross_entropy_with_logits(ours[0], ours[1], ours[2], reduction=reduction,
                                              pos_weight=ours[3])
    ref = torch.nn.functional.binary_cross_entropy_with_logits(
        theirs[0], theirs[1], theirs[2], reduction=reduction, pos_weight=theirs[3])
    assert_close(out, ref.detach().cpu().numpy(), rtol=1e-5, atol=1e-6)
    out.sum().backward()
    ref.sum().backward()
    for o, t in zip(ours, theirs):
        if t.requires_grad:    # PyTorch has none for weight, pos_weight (ours: checked above)
            assert_close(o.grad, t.grad.cpu().numpy(), rtol=1e-4, atol=1e-5)
