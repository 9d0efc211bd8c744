"""conv2d and 2-D pooling: direct-loop float64 NumPy references, finite
differences, hypothesis over stride/padding/dilation/groups, non-contiguous
inputs, double backward, PyTorch where installed, and bad-input errors."""
import math

import numpy as np
import pytest
from hypothesis import given, strategies as st

import pyflow as pf
from tests.helpers import assert_close, check_grad, make_input, needs_torch, torch


# ------------------------------------------------------------------ NumPy references
def conv2d_ref(x, w, b=None, stride=(1, 1), pads=(0, 0, 0, 0), dilation=(1, 1), groups=1):
    """Direct loop over output positions; pads = (top, bottom, left, right)."""
    N, C, H, W = x.shape
    O, Cg, kh, kw = w.shape
    (sh, sw), (dh, dw), (pt, pb, pl, pr) = stride, dilation, pads
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    Ho = (H + pt + pb - dh * (kh - 1) - 1) // sh + 1
    Wo = (W + pl + pr - dw * (kw - 1) - 1) // sw + 1
    out = np.zeros((N, O, Ho, Wo))
    Og = O // groups
    for n in range(N):
        for o in range(O):
            c0 = (o // Og) * Cg
            for oh in range(Ho):
                for ow in range(Wo):
                    win = xp[n, c0:c0 + Cg, oh * sh:oh * sh + dh * (kh - 1) + 1:dh,
                             ow * sw:ow * sw + dw * (kw - 1) + 1:dw]
                    out[n, o, oh, ow] = np.sum(win * w[o]) + (0 if b is None else b[o])
    return out


def pool_out(size, k, p, s, d, ceil_mode):
    """Output size from PyTorch's documented formula (float division)."""
    f = (size + 2 * p - d * (k - 1) - 1) / s + 1
    out = math.ceil(f) if ceil_mode else math.floor(f)
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    return out


def max_pool_ref(x, k, s, p, d, ceil_mode):
    """Max and flat argmax (first maximum in row-major order) of each window."""
    H, W = x.shape[-2:]
    Ho, Wo = (pool_out(n, kk, pp, ss, dd, ceil_mode) for n, kk, pp, ss, dd in zip((H, W), k, p, s, d))
    xp = np.pad(x, ((0, 0), (0, 0), (p[0], p[0] + k[0] * d[0]), (p[1], p[1] + k[1] * d[1])),
                constant_values=-np.inf)
    flat = np.pad(np.arange(H * W).reshape(H, W), ((p[0], p[0] + k[0] * d[0]),
                                                   (p[1], p[1] + k[1] * d[1])))
    out, idx = np.zeros(x.shape[:2] + (Ho, Wo)), np.zeros(x.shape[:2] + (Ho, Wo), np.int64)
    for oh in range(Ho):
        for ow in range(Wo):
            sl = (slice(oh * s[0], oh * s[0] + d[0] * (k[0] - 1) + 1, d[0]),
                  slice(ow * s[1], ow * s[1] + d[1] * (k[1] - 1) + 1, d[1]))
            win = xp[(..., ) + sl].reshape(x.shape[:2] + (-1,))
            am = np.argmax(win, axis=-1)
            out[..., oh, ow] = np.take_along_axis(win, am[..., None], -1)[..., 0]
            # a window entirely in the padding (possible with dilation) has no
            # position: pyflow says -1 (PyTorch returns an out-of-plane index)
            idx[..., oh, ow] = np.where(out[..., oh, ow] == -np.inf, -1, flat[sl].reshape(-1)[am])
    return out, idx


def avg_pool_ref(x, k, s, p, ceil_mode, count_include_pad, divisor_override):
    """Window sums of the zero-padded input; the divisor counts window cells
    inside input+padding (count_include_pad) or inside the input."""
    H, W = x.shape[-2:]
    Ho, Wo = (pool_out(n, kk, pp, ss, 1, ceil_mode) for n, kk, pp, ss in zip((H, W), k, p, s))
    extra = ((p[0], p[0] + k[0]), (p[1], p[1] + k[1]))
    xp = np.pad(x, ((0, 0), (0, 0)) + extra)
    inside = np.pad(np.ones((H, W)), extra)
    padded = np.pad(np.ones((H + 2 * p[0], W + 2 * p[1])), ((0, k[0]), (0, k[1])))
    out = np.zeros(x.shape[:2] + (Ho, Wo))
    for oh in range(Ho):
        for ow in range(Wo):
            sl = (slice(oh * s[0], oh * s[0] + k[0]), slice(ow * s[1], ow * s[1] + k[1]))
            div = divisor_override or (padded if count_include_pad else inside)[sl].sum()
            out[..., oh, ow] = xp[(...,) + sl].sum(axis=(-1, -2)) / div
    return out


def adaptive_avg_ref(x, oh, ow):
    H, W = x.shape[-2:]
    out = np.zeros(x.shape[:-2] + (oh, ow))
    for i in range(oh):
        for j in range(ow):
            hs, he = math.floor(i * H / oh), math.ceil((i + 1) * H / oh)
            ws, we = math.floor(j * W / ow), math.ceil((j + 1) * W / ow)
            out[..., i, j] = x[..., hs:he, ws:we].mean(axis=(-1, -2))
    return out


# ------------------------------------------------------------------ conv2d
@st.composite
def conv_configs(draw):
    groups = draw(st.sampled_from([1, 2]))
    cg, og = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    sh, sw = draw(st.integers(1, 3)), draw(st.integers(1, 2))
    dh, dw = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    ph, pw = draw(st.integers(0, 2)), draw(st.integers(0, 1))
    H = draw(st.integers(max(1, dh * (kh - 1) + 1 - 2 * ph), 6))
    W = draw(st.integers(max(1, dw * (kw - 1) + 1 - 2 * pw), 5))
    n = draw(st.integers(1, 2))
    return dict(x=(n, cg * groups, H, W), w=(og * groups, cg, kh, kw), stride=(sh, sw),
                padding=(ph, pw), dilation=(dh, dw), groups=groups,
                bias=draw(st.booleans()), layout=draw(st.sampled_from(
                    ["contiguous", "transposed", "sliced", "expanded"])))


@given(cfg=conv_configs(), seed=st.integers(0, 2**16))
def test_conv2d_hypothesis(cfg, seed):
    rng = np.random.default_rng(seed)
    x, tx = make_input(rng, cfg["x"], cfg["layout"])
    w, tw = make_input(rng, cfg["w"], "transposed")
    b = rng.standard_normal(cfg["w"][0]) if cfg["bias"] else None
    kw = dict(stride=cfg["stride"], padding=cfg["padding"], dilation=cfg["dilation"],
              groups=cfg["groups"])
    pads = (cfg["padding"][0],) * 2 + (cfg["padding"][1],) * 2
    ref = conv2d_ref(x, w, b, cfg["stride"], pads, cfg["dilation"], cfg["groups"])
    out = pf.conv2d(tx, tw, None if b is None else pf.tensor(b), **kw)
    assert_close(out, ref, rtol=1e-10, atol=1e-12)
    args = [x, w] + ([b] if b is not None else [])
    check_grad(lambda *t: pf.conv2d(*t, **kw), args)


@pytest.mark.parametrize("kernel,dilation", [((2, 3), (1, 1)), ((3, 2), (2, 1)), ((1, 1), (1, 1))])
def test_conv2d_padding_same_and_valid(kernel, dilation):
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((1, 2, 5, 4)), rng.standard_normal((3, 2) + kernel)
    out = pf.conv2d(pf.tensor(x), pf.tensor(w), padding="same", dilation=dilation)
    assert tuple(out.shape) == (1, 3, 5, 4)
    pads = []
    for d, k in zip(dilation, kernel):          # the odd pixel goes to the end
        pads += [d * (k - 1) // 2, d * (k - 1) - d * (k - 1) // 2]
    assert_close(out, conv2d_ref(x, w, None, (1, 1), pads, dilation), rtol=1e-10, atol=1e-12)
    check_grad(lambda a, b: pf.conv2d(a, b, padding="same", dilation=dilation), [x, w])
    assert_close(pf.conv2d(pf.tensor(x), pf.tensor(w), padding="valid"),
                 conv2d_ref(x, w), rtol=1e-10, atol=1e-12)


def test_conv2d_unbatched_input():
    rng = np.random.default_rng(1)
    x, w, b = rng.standard_normal((2, 4, 4)), rng.standard_normal((3, 2, 2, 2)), rng.standard_normal(3)
    out = pf.conv2d(pf.tensor(x), pf.tensor(w), pf.tensor(b), padding=1)
    assert tuple(out.shape) == (3, 5, 5)
    assert_close(out, conv2d_ref(x[None], w, b, pads=(1, 1, 1, 1))[0], rtol=1e-10)
    check_grad(lambda a, c, d: pf.conv2d(a, c, d, padding=1), [x, w, b])


def test_conv2d_depthwise_and_big_stride():
    rng = np.random.default_rng(2)
    x, w = rng.standard_normal((2, 4, 7, 6)), rng.standard_normal((8, 1, 3, 3))
    kw = dict(stride=(3, 2), padding=1, groups=4)
    assert_close(pf.conv2d(pf.tensor(x), pf.tensor(w), **kw),
                 conv2d_ref(x, w, None, (3, 2), (1, 1, 1, 1), (1, 1), 4), rtol=1e-10)
    check_grad(lambda a, b: pf.conv2d(a, b, **kw), [x[:1, :, :4, :4], w])


def test_conv2d_fused_and_differentiable_backward_agree():
    """loss.backward() takes one fused kernel; create_graph=True takes the
    differentiable Functions.  Both must give the same gradients."""
    rng = np.random.default_rng(3)
    x = pf.tensor(rng.standard_normal((2, 4, 6, 5)), requires_grad=True)
    w = pf.tensor(rng.standard_normal((6, 2, 3, 2)), requires_grad=True)
    b = pf.tensor(rng.standard_normal(6), requires_grad=True)

    def loss():
        return (pf.conv2d(x, w, b, stride=2, padding=(1, 0), dilation=(1, 2), groups=2) ** 2).sum()
    fused = pf.autograd.grad(loss(), [x, w, b])
    graph = pf.autograd.grad(loss(), [x, w, b], create_graph=True)
    for f, g in zip(fused, graph):
        assert_close(f, g, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("channels", [(2, 3), (48, 48)])   # the two weight-gradient forms
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_conv2d_pointwise_path(channels, layout):
    """1x1, stride 1, unpadded, >= POINTWISE_MIN_PIXELS output pixels: per-image
    GEMMs on the NCHW layout instead of im2col (kernels/cpu/conv.py)."""
    from pyflow.kernels.cpu import conv as conv_kernels
    C, O = channels
    H, W = 4, 5
    assert H * W >= conv_kernels.POINTWISE_MIN_PIXELS
    assert conv_kernels._pointwise((O, C, 1, 1), (1, 1), (0, 0), 1, (H, W))
    # (2, 3): per-image products summed; (48, 48): one GEMM over every pixel
    assert (O * C <= H * W * (O + C)) == (C == 2)
    rng = np.random.default_rng(11)
    x, tx = make_input(rng, (2, C, H, W), layout)
    w, b = rng.standard_normal((O, C, 1, 1)), rng.standard_normal(O)
    assert_close(pf.conv2d(tx, pf.tensor(w), pf.tensor(b)), conv2d_ref(x, w, b), rtol=1e-10)
    check_grad(lambda a, k, c: pf.conv2d(a, k, c), [x, w, b])


def test_conv2d_keeps_or_recomputes_im2col(monkeypatch):
    from pyflow.ops import conv as conv_ops
    rng = np.random.default_rng(4)
    x, w = rng.standard_normal((2, 2, 5, 5)), rng.standard_normal((3, 2, 3, 3))
    grads = []
    for limit in (0, 1 << 30):                  # recompute, keep
        monkeypatch.setattr(conv_ops, "KEEP_COLS_BYTES", limit)
        tx, tw = pf.tensor(x, requires_grad=True), pf.tensor(w, requires_grad=True)
        pf.conv2d(tx, tw, padding=1).sum().backward()
        grads.append((tx.grad.cpu().numpy(), tw.grad.cpu().numpy()))
    assert_close(grads[0][0], grads[1][0], rtol=1e-12)
    assert_close(grads[0][1], grads[1][1], rtol=1e-12)


def test_conv2d_double_backward_against_finite_differences():
    rng = np.random.default_rng(5)
    x0, w0 = rng.standard_normal((1, 2, 4, 4)), rng.standard_normal((2, 1, 2, 2))
    kw = dict(padding=1, groups=2)

    def grad_norm(xv, wv, device=None):  # sum(dL/dx ** 2) for L = sum(conv(x, w) ** 2)
        tx = pf.tensor(xv, requires_grad=True, device=device)
        tw = pf.tensor(wv, requires_grad=True, device=device)
        (gx,) = pf.autograd.grad((pf.conv2d(tx, tw, **kw) ** 2).sum(), tx, create_graph=True)
        return (gx ** 2).sum(), tx, tw
    val, tx, tw = grad_norm(x0, w0)         # the default device's double backward
    gx, gw = pf.autograd.grad(val, [tx, tw])
    # The finite differences are only the reference: 80 calls, on the CPU (on the
    # simulated cuda device they took 50 s; the CPU run checks them as before).
    eps = 1e-6
    for arr, g, which in ((x0, gx, 0), (w0, gw, 1)):
        num = np.zeros_like(arr)
        for idx in np.ndindex(arr.shape):
            ap, am = arr.copy(), arr.copy()
            ap[idx] += eps
            am[idx] -= eps
            args_p = (ap, w0) if which == 0 else (x0, ap)
            args_m = (am, w0) if which == 0 else (x0, am)
            num[idx] = (grad_norm(*args_p, device="cpu")[0].item()
                        - grad_norm(*args_m, device="cpu")[0].item()) / (2 * eps)
        assert_close(g, num, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dt", [pf.float16, pf.bfloat16])
def test_conv2d_half_types_compute_in_float32(dt):
    rng = np.random.default_rng(6)
    x, w = rng.standard_normal((1, 2, 5, 5)), rng.standard_normal((3, 2, 3, 3))
    tx = pf.tensor(x, dtype=dt, requires_grad=True)
    out = pf.conv2d(tx, pf.tensor(w, dtype=dt), padding=1)
    assert out.dtype is dt
    assert_close(out.float(), conv2d_ref(x, w, pads=(1, 1, 1, 1)), rtol=3e-2, atol=0.15)
    out.float().sum().backward()
    assert tx.grad.dtype is dt


def test_conv2d_errors():
    x, w = pf.ones(1, 4, 5, 5), pf.ones(2, 4, 3, 3)
    with pytest.raises(RuntimeError, match="3-D .* or 4-D .* got a 2-D tensor of shape"):
        pf.conv2d(pf.ones(5, 5), w)
    with pytest.raises(RuntimeError, match="4-D weight"):
        pf.conv2d(x, pf.ones(2, 4, 3))
    with pytest.raises(RuntimeError, match="channels divisible by groups.*with 4 channels"):
        pf.conv2d(x, pf.ones(3, 1, 3, 3), groups=3)
    with pytest.raises(RuntimeError, match=r"divisible by 2 at dimension 0.*\(3, 2, 3, 3\)"):
        pf.conv2d(x, pf.ones(3, 2, 3, 3), groups=2)
    with pytest.raises(RuntimeError, match=r"expects input with 6 channels.*has 4 channels"):
        pf.conv2d(x, pf.ones(2, 6, 3, 3))
    with pytest.raises(RuntimeError, match=r"kernel size can't be greater.*\(5 x 5\).*\(7 x 7\)"):
        pf.conv2d(x, pf.ones(2, 4, 7, 7))
    with pytest.raises(RuntimeError, match="stride must be positive"):
        pf.conv2d(x, w, stride=0)
    with pytest.raises(RuntimeError, match="padding must be non-negative"):
        pf.conv2d(x, w, padding=-1)
    with pytest.raises(RuntimeError, match="dilation must be positive"):
        pf.conv2d(x, w, dilation=(1, 0))
    with pytest.raises(RuntimeError, match="groups must be a positive int"):
        pf.conv2d(x, w, groups=0)
    with pytest.raises(TypeError, match="stride must be an int or a tuple of 2 ints"):
        pf.conv2d(x, w, stride=1.5)
    with pytest.raises(ValueError, match="not supported for strided"):
        pf.conv2d(x, w, stride=2, padding="same")
    with pytest.raises(ValueError, match="'valid' or 'same'"):
        pf.conv2d(x, w, padding="full")
    with pytest.raises(RuntimeError, match=r"bias of shape \(2,\).*\(3,\)"):
        pf.conv2d(x, w, pf.ones(3))
    with pytest.raises(RuntimeError, match="floating point input"):
        pf.conv2d(pf.ones(1, 4, 5, 5, dtype=pf.int64), w)
    with pytest.raises(TypeError, match="argument 'weight' must be a Tensor"):
        pf.conv2d(x, np.ones((2, 4, 3, 3)))


@needs_torch
@pytest.mark.parametrize("kw", [dict(), dict(stride=2, padding=1), dict(padding="same", dilation=2),
                                dict(stride=(2, 1), padding=(0, 2), dilation=(1, 2), groups=2),
                                dict(groups=4, padding=1)])
def test_conv2d_against_torch(kw):
    rng = np.random.default_rng(7)
    groups = kw.get("groups", 1)
    x = rng.standard_normal((2, 4, 9, 8)).astype(np.float32)
    w = rng.standard_normal((8, 4 // groups, 3, 3)).astype(np.float32)
    b = rng.standard_normal(8).astype(np.float32)
    ps = [pf.tensor(v, requires_grad=True) for v in (x, w, b)]
    ts = [torch.tensor(v, requires_grad=True) for v in (x, w, b)]
    out, ref = pf.conv2d(*ps, **kw), torch.nn.functional.conv2d(*ts, **kw)
    assert_close(out, ref.detach().cpu().numpy(), rtol=1e-4, atol=1e-4)
    g = rng.standard_normal(tuple(ref.shape)).astype(np.float32)
    out.backward(pf.tensor(g))
    ref.backward(torch.tensor(g))
    for p, t in zip(ps, ts):
        assert_close(p.grad, t.grad.cpu().numpy(), rtol=1e-4, atol=1e-4)


@needs_torch
def test_conv2d_double_backward_against_torch():
    rng = np.random.default_rng(8)
    x = rng.standard_normal((1, 2, 5, 5))
    w = rng.standard_normal((4, 1, 3, 3))
    px, pw = pf.tensor(x, requires_grad=True), pf.tensor(w, requires_grad=True)
    tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    pgx, pgw = pf.autograd.grad((pf.conv2d(px, pw, stride=2, padding=1, groups=2) ** 2).sum(),
                                [px, pw], create_graph=True)
    tgx, tgw = torch.autograd.grad((torch.nn.functional.conv2d(tx, tw, stride=2, padding=1,
                                                               groups=2) ** 2).sum(),
                                   [tx, tw], create_graph=True)
    p2 = pf.autograd.grad((pgx * pgx).sum() + (pgw ** 3).sum(), [px, pw])
    t2 = torch.autograd.grad((tgx * tgx).sum() + (tgw ** 3).sum(), [tx, tw])
    for a, b in zip(p2, t2):
        assert_close(a, b.cpu().numpy(), rtol=1e-10, atol=1e-10)


# ------------------------------------------------------------------ pooling
@st.composite
def pool_configs(draw, with_dilation=True):
    k = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    s = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    p = (draw(st.integers(0, k[0] // 2)), draw(st.integers(0, k[1] // 2)))
    d = (draw(st.integers(1, 2)), draw(st.integers(1, 2))) if with_dilation else (1, 1)
    H = draw(st.integers(max(1, d[0] * (k[0] - 1) + 1 - 2 * p[0]), 7))
    W = draw(st.integers(max(1, d[1] * (k[1] - 1) + 1 - 2 * p[1]), 6))
    return dict(shape=(draw(st.integers(1, 2)), draw(st.integers(1, 3)), H, W), k=k, s=s, p=p,
                d=d, ceil_mode=draw(st.booleans()),
                layout=draw(st.sampled_from(["contiguous", "transposed", "sliced"])))


@given(cfg=pool_configs(), seed=st.integers(0, 2**16))
def test_max_pool2d_hypothesis(cfg, seed):
    rng = np.random.default_rng(seed)
    x, tx = make_input(rng, cfg["shape"], cfg["layout"])
    kw = dict(kernel_size=cfg["k"], stride=cfg["s"], padding=cfg["p"], dilation=cfg["d"],
              ceil_mode=cfg["ceil_mode"])
    ref, ref_idx = max_pool_ref(x, cfg["k"], cfg["s"], cfg["p"], cfg["d"], cfg["ceil_mode"])
    out, idx = pf.max_pool2d(tx, return_indices=True, **kw)
    assert_close(out, ref, rtol=0, atol=0)
    assert idx.dtype is pf.int64 and (idx.cpu().numpy() == ref_idx).all()
    if np.isfinite(ref).all():       # -inf outputs (all-padding windows) have no derivative
        check_grad(lambda t: pf.max_pool2d(t, **kw), [x])


@given(cfg=pool_configs(with_dilation=False), seed=st.integers(0, 2**16),
       count_include_pad=st.booleans(), divisor=st.sampled_from([None, 3, -2]))
def test_avg_pool2d_hypothesis(cfg, seed, count_include_pad, divisor):
    rng = np.random.default_rng(seed)
    x, tx = make_input(rng, cfg["shape"], cfg["layout"])
    kw = dict(kernel_size=cfg["k"], stride=cfg["s"], padding=cfg["p"],
              ceil_mode=cfg["ceil_mode"], count_include_pad=count_include_pad,
              divisor_override=divisor)
    ref = avg_pool_ref(x, cfg["k"], cfg["s"], cfg["p"], cfg["ceil_mode"], count_include_pad,
                       divisor)
    assert_close(pf.avg_pool2d(tx, **kw), ref, rtol=1e-12, atol=1e-12)
    check_grad(lambda t: pf.avg_pool2d(t, **kw), [x])


@given(shape=st.tuples(st.integers(1, 2), st.integers(1, 7), st.integers(1, 7)),
       out_hw=st.tuples(st.integers(1, 5), st.integers(1, 5)), seed=st.integers(0, 2**16),
       layout=st.sampled_from(["contiguous", "transposed", "sliced"]))
def test_adaptive_avg_pool2d_hypothesis(shape, out_hw, seed, layout):
    rng = np.random.default_rng(seed)
    x, tx = make_input(rng, shape, layout)                 # unbatched (C, H, W)
    assert_close(pf.adaptive_avg_pool2d(tx, out_hw), adaptive_avg_ref(x, *out_hw), rtol=1e-12)
    check_grad(lambda t: pf.adaptive_avg_pool2d(t, out_hw), [x])


def test_adaptive_avg_pool2d_output_size_forms():
    x = np.random.default_rng(9).standard_normal((2, 3, 5, 4))
    t = pf.tensor(x)
    assert_close(pf.adaptive_avg_pool2d(t, 1), x.mean(axis=(-1, -2), keepdims=True), rtol=1e-12)
    assert_close(pf.adaptive_avg_pool2d(t, (None, 2)), adaptive_avg_ref(x, 5, 2), rtol=1e-12)
    assert_close(pf.adaptive_avg_pool2d(t, 3), adaptive_avg_ref(x, 3, 3), rtol=1e-12)


def test_pool_double_backward():
    """The backward of max pooling scatters, whose backward gathers; avg pooling's
    backward is its own adjoint.  Second derivatives of a quadratic go through both."""
    rng = np.random.default_rng(10)
    x = pf.tensor(rng.standard_normal((1, 2, 4, 4)), requires_grad=True)
    for pool in (lambda t: pf.max_pool2d(t, 2), lambda t: pf.avg_pool2d(t, 3, 1, 1),
                 lambda t: pf.adaptive_avg_pool2d(t, 3)):
        (g,) = pf.autograd.grad((pool(x) ** 2).sum(), x, create_graph=True)
        (gg,) = pf.autograd.grad((g * x).sum(), x)
        # d/dx sum(x * d/dx sum(pool(x)^2)) = 2 * d/dx sum(pool(x)^2) for a linear/piecewise-linear pool
        assert_close(gg, 2 * g.detach().cpu().numpy(), rtol=1e-12, atol=1e-12)


def test_max_pool2d_nan_and_half():
    x = pf.tensor([[[[1.0, float("nan")], [3.0, 2.0]]]])
    assert math.isnan(pf.max_pool2d(x, 2).item())
    h = pf.tensor(np.arange(16.0).reshape(1, 1, 4, 4), dtype=pf.bfloat16)
    out = pf.max_pool2d(h, 2)
    assert out.dtype is pf.bfloat16 and out.float().tolist() == [[[[5.0, 7.0], [13.0, 15.0]]]]


def test_pool_errors():
    x = pf.ones(1, 2, 5, 5)
    with pytest.raises(RuntimeError, match="3-D .* or 4-D"):
        pf.max_pool2d(pf.ones(5, 5), 2)
    with pytest.raises(RuntimeError, match="pad should be at most half of kernel size"):
        pf.max_pool2d(x, 2, padding=2)
    with pytest.raises(RuntimeError, match="stride must be positive"):
        pf.avg_pool2d(x, 2, stride=0)
    with pytest.raises(RuntimeError, match="kernel_size must be positive"):
        pf.max_pool2d(x, 0)
    with pytest.raises(RuntimeError, match="output size .* too small"):
        pf.max_pool2d(x, 3, dilation=3)
    with pytest.raises(RuntimeError, match="divisor_override must be a non-zero int"):
        pf.avg_pool2d(x, 2, divisor_override=0)
    with pytest.raises(RuntimeError, match="output_size must be positive"):
        pf.adaptive_avg_pool2d(x, (0, 2))
    with pytest.raises(TypeError, match="output_size must be an int or a pair"):
        pf.adaptive_avg_pool2d(x, (1, 2, 3))
    with pytest.raises(RuntimeError, match="floating point input"):
        pf.avg_pool2d(pf.ones(1, 1, 4, 4, dtype=pf.int64), 2)


@needs_torch
@pytest.mark.parametrize("kw", [dict(kernel_size=3), dict(kernel_size=(3, 2), stride=2, padding=1,
                                                          ceil_mode=True),
                                dict(kernel_size=2, dilation=2, padding=1, stride=1)])
def test_max_pool2d_against_torch(kw):
    rng = np.random.default_rng(11)
    x = rng.standard_normal((2, 3, 9, 8)).astype(np.float32)
    px, tx = pf.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    (out, idx), (ref, ref_idx) = (pf.max_pool2d(px, return_indices=True, **kw),
                                  torch.nn.functional.max_pool2d(tx, return_indices=True, **kw))
    assert_close(out, ref.detach().cpu().numpy(), rtol=0, atol=0)
    assert (idx.cpu().numpy() == ref_idx.cpu().numpy()).all()
    g = rng.standard_normal(tuple(ref.shape)).astype(np.float32)
    out.backward(pf.tensor(g))
    ref.backward(torch.tensor(g))
    assert_close(px.grad, tx.grad.cpu().numpy(), rtol=1e-6, atol=1e-6)


@needs_torch
@pytest.mark.parametrize("kw", [dict(kernel_size=3), dict(kernel_size=3, stride=2, padding=1,
                                                          ceil_mode=True, count_include_pad=False),
                                dict(kernel_size=(2, 3), padding=(1, 1), ceil_mode=True),
                                dict(kernel_size=2, divisor_override=3)])
def test_avg_pools_against_torch(kw):
    rng = np.random.default_rng(12)
    x = rng.standard_normal((2, 3, 9, 8)).astype(np.float32)
    F = torch.nn.functional
    for ours, theirs in ((lambda t: pf.avg_pool2d(t, **kw), lambda t: F.avg_pool2d(t, **kw)),
                         (lambda t: pf.adaptive_avg_pool2d(t, (4, None)),
                          lambda t: F.adaptive_avg_pool2d(t, (4, None)))):
        px, tx = pf.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
        out, ref = ours(px), theirs(tx)
        assert_close(out, ref.detach().cpu().numpy(), rtol=1e-5, atol=1e-6)
        g = rng.standard_normal(tuple(ref.shape)).astype(np.float32)
        out.backward(pf.tensor(g))
        ref.backward(torch.tensor(g))
        assert_close(px.grad, tx.grad.cpu().numpy(), rtol=1e-5, atol=1e-6)
