"""nn.init: PyTorch's distributions (bounds, standard deviations, gains, fans),
in place under no_grad, reproducible through pyflow's generators."""
import math

import numpy as np
import pytest

import pyflow as pf
from pyflow import nn
from pyflow.nn import init
from tests.helpers import needs_torch, torch


def values(t):
    return np.asarray(t.detach()._compute(), dtype=np.float64)


def test_calculate_gain_table():
    assert init.calculate_gain("linear") == 1 and init.calculate_gain("conv2d") == 1
    assert init.calculate_gain("sigmoid") == 1
    assert init.calculate_gain("tanh") == pytest.approx(5 / 3)
    assert init.calculate_gain("relu") == pytest.approx(math.sqrt(2))
    assert init.calculate_gain("leaky_relu") == pytest.approx(math.sqrt(2 / (1 + 0.01 ** 2)))
    assert init.calculate_gain("leaky_relu", math.sqrt(5)) == pytest.approx(math.sqrt(1 / 3))
    assert init.calculate_gain("selu") == 0.75
    with pytest.raises(ValueError, match="Unsupported nonlinearity softsign"):
        init.calculate_gain("softsign")
    with pytest.raises(ValueError, match="negative_slope x not a valid number"):
        init.calculate_gain("leaky_relu", "x")


@needs_torch
@pytest.mark.parametrize("name,param", [("linear", None), ("tanh", None), ("relu", None),
                                        ("leaky_relu", None), ("leaky_relu", 0.2), ("selu", None)])
def test_calculate_gain_matches_torch(name, param):
    assert init.calculate_gain(name, param) == pytest.approx(
        torch.nn.init.calculate_gain(name, param))


@pytest.mark.parametrize("shape,fans", [((3, 5), (5, 3)), ((4, 2, 3, 3), (18, 36)),
                                        ((6, 1, 5), (5, 30))])
def test_fan_in_and_fan_out(shape, fans):
    assert init._calculate_fan_in_and_fan_out(pf.empty(*shape)) == fans
    if torch is not None:
        assert torch.nn.init._calculate_fan_in_and_fan_out(torch.empty(*shape)) == fans


def test_fan_needs_two_dims():
    with pytest.raises(ValueError, match="fewer than 2 dimensions"):
        init.xavier_uniform_(pf.empty(5))
    with pytest.raises(ValueError, match="Mode fan_avg not supported"):
        init.kaiming_uniform_(pf.empty(3, 3), mode="fan_avg")


def test_uniform_normal_constant():
    pf.manual_seed(0)
    t = pf.empty(300, 200)
    init.uniform_(t, -2.0, 3.0)
    v = values(t)
    assert v.min() >= -2 and v.max() <= 3 and v.min() < -1.99 and v.max() > 2.99
    assert abs(v.mean() - 0.5) < 0.03
    init.normal_(t, 1.0, 0.5)
    v = values(t)
    assert abs(v.mean() - 1.0) < 0.01 and abs(v.std() - 0.5) < 0.01
    assert init.constant_(t, 0.25) is t and np.all(values(t) == 0.25)
    init.ones_(t)
    assert np.all(values(t) == 1)
    init.zeros_(t)
    assert np.all(values(t) == 0)
    init.eye_(t)
    assert values(t).trace() == 200 and values(t).sum() == 200
    with pytest.raises(ValueError, match="expects a <= b"):
        init.uniform_(t, 1.0, 0.0)


def test_in_place_on_parameters_without_recording():
    p = nn.Parameter(pf.empty(4, 4))
    for fn in (init.uniform_, init.normal_, init.xavier_uniform_, init.kaiming_normal_,
               init.zeros_, init.trunc_normal_):
        assert fn(p) is p
        assert p.grad_fn is None and p.requires_grad and p.is_leaf


def test_generator_and_manual_seed_reproducible():
    a, b = pf.empty(5, 5), pf.empty(5, 5)
    pf.manual_seed(7)
    init.kaiming_uniform_(a)
    pf.manual_seed(7)
    init.kaiming_uniform_(b)
    np.testing.assert_array_equal(values(a), values(b))
    g = pf.Generator().manual_seed(3)
    init.normal_(a, generator=g)
    init.normal_(b, generator=pf.Generator().manual_seed(3))
    np.testing.assert_array_equal(values(a), values(b))


def test_works_on_non_float32_and_views():
    t = pf.empty(6, 6, dtype=pf.float64)
    init.uniform_(t[::2], 5.0, 6.0)
    v = values(t)
    assert np.all((v[::2] >= 5) & (v[::2] <= 6))
    bf = pf.empty(10, 10, dtype=pf.bfloat16)
    init.uniform_(bf, -1, 1)
    assert bf.dtype is pf.bfloat16 and np.all(np.abs(values(bf)) <= 1)


@pytest.mark.parametrize("mode,nonlin,a", [("fan_in", "leaky_relu", 0), ("fan_out", "relu", 0),
                                           ("fan_in", "leaky_relu", math.sqrt(5))])
def test_kaiming(mode, nonlin, a):
    pf.manual_seed(1)
    t = pf.empty(200, 100, 3)
    fan = 300 if mode == "fan_in" else 600
    std = init.calculate_gain(nonlin, a) / math.sqrt(fan)
    init.kaiming_uniform_(t, a=a, mode=mode, nonlinearity=nonlin)
    v = values(t)
    bound = math.sqrt(3) * std
    assert np.abs(v).max() <= bound * (1 + 1e-6) and np.abs(v).max() > 0.99 * bound
    init.kaiming_normal_(t, a=a, mode=mode, nonlinearity=nonlin)
    assert abs(values(t).std() / std - 1) < 0.02


def test_xavier():
    pf.manual_seed(2)
    t = pf.empty(300, 200)
    init.xavier_uniform_(t, gain=2.0)
    bound = 2.0 * math.sqrt(6 / 500)
    v = values(t)
    assert np.abs(v).max() <= bound * (1 + 1e-6) and np.abs(v).max() > 0.99 * bound
    init.xavier_normal_(t)
    assert abs(values(t).std() / math.sqrt(2 / 500) - 1) < 0.02


def test_trunc_normal():
    pf.manual_seed(3)
    t = pf.empty(200, 200)
    init.trunc_normal_(t, mean=0.5, std=1.0, a=0.0, b=1.5)
    v = values(t)
    assert v.min() >= 0 and v.max() <= 1.5
    # mean of N(0.5, 1) truncated to [0, 1.5] is 0.5 + (phi(-0.5) - phi(1)) / (Phi(1) - Phi(-0.5))
    phi = lambda x: math.exp(-x * x / 2) / math.sqrt(2 * math.pi)  # noqa: E731
    Phi = lambda x: 0.5 * (1 + math.erf(x / math.sqrt(2)))  # noqa: E731
    expected = 0.5 + (phi(-0.5) - phi(1.0)) / (Phi(1.0) - Phi(-0.5))
    assert abs(v.mean() - expected) < 0.01
    with pytest.raises(ValueError, match="expects a < b"):
        init.trunc_normal_(t, a=1.0, b=0.0)


def test_zero_element_kaiming_is_a_noop():
    with pytest.warns(UserWarning, match="zero-element"):
        init.kaiming_uniform_(pf.empty(0, 3))


def test_bad_tensor_argument():
    with pytest.raises(TypeError, match="argument 'tensor' must be a Tensor, not list"):
        init.normal_([1.0, 2.0])


@needs_torch
@pytest.mark.parametrize("layer,args", [("Linear", (50, 40)), ("Conv2d", (6, 8, 3))])
def test_default_layer_init_distribution_matches_torch(layer, args):
    """kaiming_uniform_(a=sqrt(5)) weight and U(+-1/sqrt(fan_in)) bias: the same
    bounds as PyTorch's layers and (statistically) the same spread."""
    pf.manual_seed(0)
    torch.manual_seed(0)
    ours, ref = getattr(nn, layer)(*args), getattr(torch.nn, layer)(*args)
    fan_in = init._calculate_fan_in_and_fan_out(ours.weight)[0]
    bound = 1 / math.sqrt(fan_in)
    for name in ("weight", "bias"):
        v, tv = values(getattr(ours, name)), getattr(ref, name).detach().cpu().numpy()
        assert np.abs(v).max() <= bound * (1 + 1e-6)
        assert np.abs(tv).max() <= bound * (1 + 1e-6)
        if name == "weight":   # U(-b, b) has std b/sqrt(3)
            assert abs(v.std() / (bound / math.sqrt(3)) - 1) < 0.1


def test_uniform_normal_numbers_for_a_seed_are_pinned():
    # the numbers of the one-draw implementation (before uniform_/normal_ drew in
    # pieces); the half types round through float32 as their compute dtype does
    g = pf.Generator().manual_seed(1234)
    assert init.uniform_(pf.empty(4), -2.0, 3.0, generator=g).tolist() == pytest.approx(
        [0.7862846851348877, -0.8813188076019287, -0.5333271026611328, 0.8987787961959839],
        rel=0, abs=0)
    assert init.normal_(pf.empty(3), 0.5, 2.0, generator=g).tolist() == pytest.approx(
        [-0.7389341592788696, 2.246140241622925, -3.9132933616638184], rel=0, abs=0)
    g = pf.Generator().manual_seed(1234)
    assert init.uniform_(pf.empty(4, dtype=pf.bfloat16), -2.0, 3.0, generator=g).tolist() == \
        [0.78515625, -0.8828125, -0.53515625, 0.8984375]
    assert init.normal_(pf.empty(3, dtype=pf.bfloat16), 0.5, 2.0, generator=g).tolist() == \
        [-0.73828125, 2.25, -3.90625]
    # more than one piece (pyflow.random.DRAW_CHUNK), into a non-contiguous view: the
    # numbers of one draw of that size
    t = pf.empty(300, 700).t()
    init.normal_(t, 1.0, 3.0, generator=pf.Generator().manual_seed(5))
    ref = np.random.Generator(np.random.Philox(5)).normal(1.0, 3.0, size=(700, 300))
    np.testing.assert_array_equal(t.numpy(), ref.astype(np.float32))


def test_uniform_normal_make_no_float64_copy():
    import tracemalloc
    t = pf.empty(1_000_000)                  # 4 MB; a float64 copy alone is 8 MB
    tracemalloc.start()
    try:
        init.uniform_(t, -1.0, 1.0)
        init.normal_(t)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 7_000_000, peak
