"""The direct convolution kernels (kernels/cpu/conv_direct.py) against a float64
reference written tap by tap (no im2col), and the dispatcher that chooses them
(kernels/cpu/conv.py's ``direct_ok``) through ``pyflow.conv2d``.

Sizes are tiny and odd on purpose: channel counts that leave partial 16- (or
8-) lane blocks, a pixel count that leaves a partial 6-pixel tile, stride 2
phases of unequal sizes.
"""
import numpy as np
import pytest

import pyflow as pf
from pyflow.kernels.cpu import conv as conv_kernels
from pyflow.kernels.cpu import conv_direct, twin
from tests.helpers import check_grad


# ------------------------------------------------------------------ float64 reference
def _out_size(size, k, s, p_before, p_after, d):
    return (size + p_before + p_after - d * (k - 1) - 1) // s + 1


def reference(x, w, gy, b, stride, pads, dilation):
    """(y, dx, dw) in float64, one kernel tap at a time; pads = (top, bottom, left, right)."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    N, C, H, W = x.shape
    O, _, kh, kw = w.shape
    (sh, sw), (dh, dw), (pt, pb, pl, pr) = stride, dilation, pads
    Ho, Wo = _out_size(H, kh, sh, pt, pb, dh), _out_size(W, kw, sw, pl, pr, dw)
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    y = np.zeros((N, O, Ho, Wo))
    gxp = np.zeros_like(xp)
    gw = np.zeros_like(w)
    gy = None if gy is None else gy.astype(np.float64)
    for i in range(kh):
        for j in range(kw):
            window = (slice(None), slice(None),
                      slice(i * dh, i * dh + (Ho - 1) * sh + 1, sh),
                      slice(j * dw, j * dw + (Wo - 1) * sw + 1, sw))
            y += np.einsum("nchw,oc->nohw", xp[window], w[:, :, i, j])
            if gy is not None:
                gxp[window] += np.einsum("nohw,oc->nchw", gy, w[:, :, i, j])
                gw[:, :, i, j] = np.einsum("nohw,nchw->oc", gy, xp[window])
    if b is not None:
        y += b[None, :, None, None]
    return y, gxp[:, :, pt:pt + H, pl:pl + W], gw, (Ho, Wo)


def assert_matches(got, want, dtype):
    """Elementwise, scaled by the result's magnitude: float32 accumulation over
    a few hundred terms stays within ~1e-6 of it, float64 within ~1e-15."""
    tol = 2e-5 if dtype == np.float32 else 1e-12
    assert got.dtype == dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=0, atol=tol * max(1.0, np.abs(want).max()))


# (N, C, O, H, W, (kh, kw), stride, (top, bottom, left, right), dilation)
CASES = [
    (2, 3, 5, 7, 6, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),      # 3x3 s1 p1, O < one block
    (1, 17, 18, 5, 9, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1)),    # s2 p1, partial channel blocks
    (3, 2, 3, 6, 5, (3, 3), (2, 2), (0, 0, 0, 0), (1, 1)),      # s2 p0, odd sizes
    (1, 1, 32, 9, 9, (3, 3), (1, 1), (0, 0, 0, 0), (1, 1)),     # one input channel, two blocks
    (2, 4, 33, 8, 8, (1, 1), (2, 2), (0, 0, 0, 0), (1, 1)),     # 1x1 s2: three empty phases
    (2, 20, 17, 7, 7, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1)),    # 1x1 s1
    (1, 3, 2, 5, 5, (1, 1), (1, 1), (1, 1, 1, 1), (1, 1)),      # 1x1 padded: border of bias
    (2, 5, 4, 9, 8, (3, 3), (3, 2), (2, 2, 2, 2), (2, 1)),      # stride 3, dilation 2
    (2, 3, 4, 6, 5, (2, 3), (1, 1), (0, 1, 1, 1), (1, 1)),      # 'same' for 2x3: bottom pad only
    (2, 3, 7, 5, 19, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),     # row-wise forward, rows 16 + 3
    (1, 1, 5, 4, 10, (3, 3), (1, 1), (0, 0, 0, 0), (1, 1)),     # row-wise in float64 only (8 lanes)
]


# The cases whose forward runs along rows (_row_product), in these dtypes: a
# short reduction at stride 1 with rows of a vector (16 float32, 8 float64).
ROW_WISE = {CASES[-2]: (np.float32, np.float64), CASES[-1]: (np.float64,)}


def _ids(case):
    N, C, O, H, W, k, s, p, d = case
    return f"n{N}c{C}o{O}_{H}x{W}_k{k[0]}{k[1]}_s{s[0]}{s[1]}_p{''.join(map(str, p))}_d{d[0]}{d[1]}"


def _inputs(case, seed):
    N, C, O, H, W, (kh, kw), stride, pads, dilation = case
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((N, C, H, W))
    w = rng.standard_normal((O, C, kh, kw))
    b = rng.standard_normal(O)
    y, _, _, out_hw = reference(x, w, None, b, stride, pads, dilation)
    gy = rng.standard_normal(y.shape)
    return x, w, b, gy, out_hw


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_kernels_equal_the_reference(case, dtype, monkeypatch):
    stride, pads, dilation = case[6], case[7], case[8]
    x, w, b, gy, out_hw = _inputs(case, 0)
    rows = []           # which forward kernel ran: the row-wise one where row_wise says
    monkeypatch.setattr(conv_direct, "_row_product",
                        lambda *a, _f=conv_direct._row_product: rows.append(1) or _f(*a))
    y_ref, gx_ref, gw_ref, _ = reference(x, w, gy, b, stride, pads, dilation)
    x, w, b, gy = (a.astype(dtype) for a in (x, w, b, gy))
    padding = (pads[0], pads[2])
    assert_matches(conv_direct.forward(x, w, b, stride, padding, dilation, out_hw), y_ref, dtype)
    assert_matches(conv_direct.forward(x, w, None, stride, padding, dilation, out_hw),
                   y_ref - b.astype(np.float64)[None, :, None, None], dtype)
    assert_matches(conv_direct.input_grad(gy, w, x.shape, stride, padding, dilation), gx_ref,
                   dtype)
    assert_matches(conv_direct.weight_grad(x, gy, w.shape, stride, padding, dilation), gw_ref,
                   dtype)
    assert len(rows) == (2 if dtype in ROW_WISE.get(case, ()) else 0)


def test_kernels_read_non_contiguous_arrays():
    """Transposed weights and input, a broadcast (zero-stride) grad_out, as
    autograd may hand them over: the kernels copy what they must."""
    N, C, O, H, W = 2, 9, 20, 7, 6
    rng = np.random.default_rng(1)
    x = np.swapaxes(rng.standard_normal((N, C, W, H)).astype(np.float32), 2, 3)
    w = rng.standard_normal((O, 3, 3, C)).astype(np.float32).transpose(0, 3, 1, 2)
    for p in (1, 0):        # unpadded, a contiguous x would be read in place
        stride, padding, dilation = (2, 2), (p, p), (1, 1)
        _, _, _, out_hw = reference(x, w, None, None, stride, (p,) * 4, dilation)
        gy = np.broadcast_to(rng.standard_normal((1, O) + out_hw).astype(np.float32),
                             (N, O) + out_hw)
        y_ref, gx_ref, gw_ref, _ = reference(x, w, gy, None, stride, (p,) * 4, dilation)
        assert not (x.flags.c_contiguous or w.flags.c_contiguous or gy.flags.c_contiguous)
        assert_matches(conv_direct.forward(x, w, None, stride, padding, dilation, out_hw),
                       y_ref, np.float32)
        assert_matches(conv_direct.input_grad(gy, w, x.shape, stride, padding, dilation),
                       gx_ref, np.float32)
        assert_matches(conv_direct.weight_grad(x, gy, w.shape, stride, padding, dilation),
                       gw_ref, np.float32)


def test_copies_on_the_threads_or_one_thread_agree(monkeypatch):
    """The padding and re-layout copies are twins (kernels/cpu/twin.py): on the
    threads or on one, the three kernels give the same bits."""
    case = (2, 17, 18, 7, 6, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1))
    x, w, _, gy, out_hw = (a.astype(np.float32) if isinstance(a, np.ndarray) else a
                           for a in _inputs(case, 8))
    geo = ((2, 2), (1, 1), (1, 1))
    results = []
    for threshold in (0, 1 << 62):
        monkeypatch.setattr(twin, "PARALLEL_MIN", threshold)
        results.append((conv_direct.forward(x, w, None, *geo, out_hw),
                        conv_direct.input_grad(gy, w, x.shape, *geo),
                        conv_direct.weight_grad(x, gy, w.shape, *geo)))
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("shape,which,limit", [
    ((1, 256, 16, 6), "forward", 3e-7),      # a reduction over 2304 (channel, tap) pairs
    ((8, 2, 16, 32), "weight", 4e-7),        # a reduction over 8192 pixels
])
def test_float32_error_does_not_grow_with_the_reduction(shape, which, limit):
    """Sums run in chunks of REDUCTION_RUN terms: the RMS error against float64
    stays at MKL's level (~2e-7) where one long chain of FMAs drifted to 5e-7
    (forward) and 1.2e-6 (weight gradient); that drift flipped a ReLU in
    tests/models/test_resnet.py::test_float32_matches_pytorch."""
    N, C, O, H = shape
    rng = np.random.default_rng(7)
    x = np.maximum(rng.standard_normal((N, C, H, H)), 0)
    w = rng.standard_normal((O, C, 3, 3)) * np.sqrt(2 / (C * 9))
    gy = rng.standard_normal((N, O, H, H))
    y, _, gw, _ = reference(x, w, gy, None, (1, 1), (1, 1, 1, 1), (1, 1))
    f = np.float32
    if which == "forward":
        got, want = conv_direct.forward(x.astype(f), w.astype(f), None, (1, 1), (1, 1), (1, 1),
                                        (H, H)), y
    else:
        got, want = conv_direct.weight_grad(x.astype(f), gy.astype(f), w.shape, (1, 1), (1, 1),
                                            (1, 1)), gw
    rms = np.sqrt(np.mean((got - want) ** 2)) / np.sqrt(np.mean(want ** 2))
    assert rms < limit


# ------------------------------------------------------------------ the dispatcher
@pytest.mark.parametrize("x_shape,w_shape,stride,out_hw,dtype,direct", [
    ((16, 64, 32, 32), (64, 64, 3, 3), (1, 1), (32, 32), np.float32, True),     # ResNet layer1
    ((16, 256, 8, 8), (512, 256, 3, 3), (2, 2), (4, 4), np.float32, True),      # layer4 entry
    ((16, 512, 4, 4), (512, 512, 3, 3), (1, 1), (4, 4), np.float64, True),      # 2*256 >= 512
    ((8, 512, 4, 4), (512, 512, 3, 3), (1, 1), (4, 4), np.float32, False),      # fewer pixels
    ((16, 3, 32, 32), (64, 3, 3, 3), (1, 1), (32, 32), np.float32, True),       # the stem
    ((64, 1, 28, 28), (32, 1, 3, 3), (1, 1), (26, 26), np.float32, True),      # MNIST conv1
    ((16, 3, 32, 32), (64, 3, 3, 3), (2, 2), (16, 16), np.float32, False),      # short, strided
    ((16, 3, 14, 14), (64, 3, 3, 3), (1, 1), (14, 14), np.float32, False),      # short, narrow
    ((16, 3, 10, 10), (64, 3, 3, 3), (1, 1), (10, 10), np.float64, True),       # 8 f64 lanes
    ((16, 64, 32, 32), (128, 64, 1, 1), (2, 2), (16, 16), np.float32, False),   # 1x1 downsample
    ((16, 64, 32, 32), (64, 64, 3, 3), (3, 3), (11, 11), np.float32, False),    # stride 3
    ((16, 64, 32, 32), (64, 64, 3, 3), (1, 1), (32, 32), np.float16, False),
])
def test_direct_ok_rule(x_shape, w_shape, stride, out_hw, dtype, direct):
    assert conv_kernels.direct_ok(x_shape, w_shape, stride, (1, 1), (1, 1), 1, out_hw,
                                  dtype) is direct


def test_direct_ok_needs_groups_1_and_no_dilation():
    args = ((16, 64, 32, 32), (64, 64, 3, 3), (1, 1), (1, 1))
    assert conv_kernels.direct_ok(*args, (1, 1), 1, (32, 32), np.float32)
    assert not conv_kernels.direct_ok(*args, (2, 2), 1, (30, 30), np.float32)
    assert not conv_kernels.direct_ok((16, 64, 32, 32), (64, 32, 3, 3), (1, 1), (1, 1), (1, 1),
                                      2, (32, 32), np.float32)


OP_CASES = [   # shapes the dispatcher sends to the direct kernels
    dict(x=(2, 8, 7, 6), w=(10, 8, 3, 3), stride=1, padding=1),
    dict(x=(1, 9, 9, 8), w=(17, 9, 3, 3), stride=2, padding=1),
    dict(x=(3, 8, 6, 7), w=(4, 8, 3, 3), stride=(2, 1), padding=(0, 1)),
    dict(x=(2, 3, 5, 9), w=(7, 3, 3, 3), stride=1, padding=1),   # short: row-wise, col2im dx
]


def _op_inputs(case, seed=3):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(case["x"]), rng.standard_normal(case["w"]),
            rng.standard_normal(case["w"][0]))


@pytest.mark.cpu_only
@pytest.mark.parametrize("case", OP_CASES)
def test_conv2d_takes_the_direct_path_and_matches_im2col(case, monkeypatch):
    """pf.conv2d forward and backward (the fused backward, and the differentiable
    one create_graph takes) on the direct kernels equal the reference and the
    im2col path's results."""
    x, w, b = _op_inputs(case)
    s, p = case["stride"], case["padding"]
    s2, p2 = (s, s) if isinstance(s, int) else s, (p, p) if isinstance(p, int) else p
    y_ref, _, _, out_hw = reference(x, w, None, b, s2, (p2[0], p2[0], p2[1], p2[1]), (1, 1))
    assert conv_kernels.direct_ok(x.shape, w.shape, s2, p2, (1, 1), 1, out_hw, np.float64)
    calls = []
    monkeypatch.setattr(conv_kernels.conv_direct, "forward",
                        lambda *a, _f=conv_direct.forward: calls.append(1) or _f(*a))
    results = {}
    for direct in (True, False):
        monkeypatch.setattr(conv_kernels, "DIRECT", direct)
        tx, tw, tb = (pf.tensor(a, requires_grad=True) for a in (x, w, b))
        y = pf.conv2d(tx, tw, tb, stride=s, padding=p)
        fused = pf.autograd.grad((y ** 2).sum(), [tx, tw, tb])
        y = pf.conv2d(tx, tw, tb, stride=s, padding=p)
        graph = pf.autograd.grad((y ** 2).sum(), [tx, tw, tb], create_graph=True)
        results[direct] = [t.detach().cpu().numpy() for t in (y,) + tuple(fused) + tuple(graph)]
    assert len(calls) == 2                       # both forwards of the DIRECT=True round
    np.testing.assert_allclose(results[True][0], y_ref, rtol=1e-12, atol=1e-12)
    for got, want in zip(results[True], results[False]):
        np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-11)


@pytest.mark.cpu_only
def test_conv2d_direct_gradients_against_finite_differences():
    case = OP_CASES[1]
    x, w, b = _op_inputs(case, 4)
    x, w = x[:, :, :5, :5], w[:9]                      # 9 output channels: a partial block
    assert conv_kernels.direct_ok(x.shape, w.shape, (2, 2), (1, 1), (1, 1), 1, (3, 3),
                                  np.float64)
    check_grad(lambda a, k, c: pf.conv2d(a, k, c, stride=2, padding=1), [x, w, b[:9]])


@pytest.mark.cpu_only
def test_conv2d_direct_double_backward():
    """The backward's own Functions (create_graph) run on the direct kernels too:
    the gradient of a function of (dL/dx, dL/dw) against finite differences."""
    x, w, _ = _op_inputs(OP_CASES[0], 5)
    x, w = x[:1, :, :4, :5], w[:2]
    assert conv_kernels.direct_ok(x.shape, w.shape, (1, 1), (1, 1), (1, 1), 1, (4, 5),
                                  np.float64)

    def grad_norms(a, k):
        a = a if a.requires_grad else a.detach().requires_grad_()   # finite differences
        k = k if k.requires_grad else k.detach().requires_grad_()
        gx, gw = pf.autograd.grad((pf.conv2d(a, k, padding=1) ** 2).sum(), [a, k],
                                  create_graph=True)
        return (gx ** 2).sum() + (gw ** 2).sum()
    check_grad(grad_norms, [x, w])


def test_backward_uses_a_kept_im2col_matrix():
    """Handed an im2col matrix (a forward that kept one), the direct backward's
    weight gradient is the GEMM that reads it, and equals the direct kernel's."""
    case = (2, 8, 12, 7, 6, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1))
    x, w, _, gy, out_hw = _inputs(case, 6)
    geo = ((1, 1), (1, 1), (1, 1), 1)
    assert conv_kernels.direct_ok(x.shape, w.shape, *geo[:3], 1, out_hw, np.float64)
    cols = conv_kernels._im2col(x, 3, 3, *geo[:3], out_hw)
    from_cols = conv_kernels.conv2d_backward(None, w, gy, cols, x.shape, w.shape, *geo,
                                             True, True, True)
    direct = conv_kernels.conv2d_backward(x, w, gy, None, x.shape, w.shape, *geo,
                                          True, True, True)
    _, gx_ref, gw_ref, _ = reference(x, w, gy, None, (1, 1), (1, 1, 1, 1), (1, 1))
    for got in (from_cols, direct):
        assert_matches(got[0], gx_ref, np.float64)
        assert_matches(got[1], gw_ref, np.float64)
        assert_matches(got[2], gy.sum(axis=(0, 2, 3)), np.float64)
