"""Every layer against PyTorch, step by step: the torch module's weights are copied
into ours (state_dict through NumPy), both run in float64 on the same input, and
outputs, input gradients, parameter gradients and buffers must agree.
"""
import numpy as np
import pytest

import pyflow as pf
import pyflow.nn.functional as F
from pyflow import nn
from tests.helpers import assert_close, needs_torch, torch


def copy_from_torch(ours, ref):
    """Load ``ref``'s state dict into ``ours`` through NumPy arrays."""
    sd = {k: pf.tensor(v.detach().cpu().numpy()) for k, v in ref.state_dict().items()}
    res = ours.load_state_dict(sd)
    assert res.missing_keys == [] and res.unexpected_keys == []


def run_both(ours, ref, *inputs, grad_inputs=True, rtol=1e-10, atol=1e-12, steps=1,
             backward=True, target=None):
    """Forward (and backward with one random upstream gradient) through both modules,
    ``steps`` times; compare everything that is observable."""
    rng = np.random.default_rng(0)
    for step in range(steps):
        pins, tins = [], []
        for x in inputs:
            x = x() if callable(x) else x
            floating = np.issubdtype(x.dtype, np.floating)
            rg = grad_inputs and floating and backward
            pins.append(pf.tensor(x, requires_grad=rg))
            tins.append(torch.tensor(x, requires_grad=rg))
        out, tout = ours(*pins), ref(*tins)
        assert_close(out, tout.detach().cpu().numpy(), rtol=rtol, atol=atol, msg=f"output step {step}")
        if backward:
            w = rng.standard_normal(tuple(tout.shape))
            (out * pf.tensor(w)).sum().backward()
            (tout * torch.tensor(w)).sum().backward()
            for i, (p, t) in enumerate(zip(pins, tins)):
                if t.requires_grad:
                    assert_close(p.grad, t.grad.cpu().numpy(), rtol=rtol, atol=atol,
                                 msg=f"grad of input {i}")
            tparams = dict(ref.named_parameters())
            for name, p in ours.named_parameters():
                tg = tparams[name].grad
                if tg is None:
                    assert p.grad is None or np.all(p.grad.cpu().numpy() == 0), name
                else:
                    assert_close(p.grad, tg.cpu().numpy(), rtol=rtol, atol=atol, msg=f"grad {name}")
        tbufs = dict(ref.named_buffers())
        for name, b in ours.named_buffers():
            assert_close(b, tbufs[name].cpu().numpy(), rtol=rtol, atol=atol, msg=f"buffer {name}")
    return out, tout


def pair(cls_name, *args, **kwargs):
    """The same layer built in both libraries, weights copied, both in float64."""
    ref = getattr(torch.nn, cls_name)(*args, **kwargs).double()
    ours = getattr(nn, cls_name)(*args, **kwargs).double()
    copy_from_torch(ours, ref)
    return ours, ref


def randn(*shape, seed=1):
    return np.random.default_rng(seed).standard_normal(shape)


# ------------------------------------------------------------------ linear & activations
@needs_torch
@pytest.mark.parametrize("bias", [True, False])
def test_linear_2d(bias):
    ours, ref = pair("Linear", 5, 3, bias=bias)
    run_both(ours, ref, randn(4, 5))


@needs_torch
def test_linear_batched_3d():
    ours, ref = pair("Linear", 5, 3)
    run_both(ours, ref, randn(2, 4, 5))


def test_linear_bad_input():
    with pytest.raises(RuntimeError, match=r"input of shape \(2, 4\).*in_features=5"):
        nn.Linear(5, 3)(pf.randn(2, 4))
    with pytest.raises(ValueError, match="in_features must be a non-negative int"):
        nn.Linear(-1, 3)


@needs_torch
@pytest.mark.parametrize("name,args", [("ReLU", ()), ("GELU", ()), ("GELU", ("tanh",)),
                                       ("SiLU", ()), ("Tanh", ()), ("Sigmoid", ()),
                                       ("Identity", ()), ("Flatten", ()), ("Flatten", (0, 1))])
def test_elementwise_layers(name, args):
    ours, ref = pair(name, *args)
    run_both(ours, ref, randn(3, 4, 2))


@needs_torch
@pytest.mark.parametrize("name", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_softmax_layers(name, dim):
    ours, ref = pair(name, dim=dim)
    run_both(ours, ref, randn(3, 4, 2))


def test_relu_inplace_and_gelu_bad_arg():
    x = pf.tensor([-1.0, 2.0])
    y = nn.ReLU(inplace=True)(x)
    assert y is x and x.tolist() == [0.0, 2.0]
    with pytest.raises(ValueError, match="approximate must be 'none' or 'tanh'"):
        nn.GELU("fast")


@needs_torch
def test_mlp_training_steps_match_torch():
    """Three SGD steps of a Sequential MLP: weights stay equal to torch's."""
    def build(lib):
        return lib.nn.Sequential(lib.nn.Linear(6, 8), lib.nn.GELU(), lib.nn.Linear(8, 8),
                                 lib.nn.Tanh(), lib.nn.Linear(8, 1)).double()
    ref, ours = build(torch), build(pf)
    copy_from_torch(ours, ref)
    x, y = randn(10, 6), randn(10, 1, seed=2)
    for _ in range(3):
        loss = ((ours(pf.tensor(x)) - pf.tensor(y)) ** 2).mean()
        tloss = ((ref(torch.tensor(x)) - torch.tensor(y)) ** 2).mean()
        assert_close(loss, tloss.item(), rtol=1e-10)
        ours.zero_grad()
        ref.zero_grad()
        loss.backward()
        tloss.backward()
        with pf.no_grad(), torch.no_grad():
            for p, tp in zip(ours.parameters(), ref.parameters()):
                p.sub_(p.grad * 0.1)
                tp.sub_(tp.grad * 0.1)
    for (k, v), (tk, tv) in zip(ours.state_dict().items(), ref.state_dict().items()):
        assert k == tk
        assert_close(v, tv.cpu().numpy(), rtol=1e-9, msg=k)


# ------------------------------------------------------------------ containers
def test_sequential_indexing_len_append_and_slices():
    a, b, c = nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1)
    seq = nn.Sequential(a, b)
    assert len(seq) == 2 and seq[0] is a and seq[-1] is b
    seq.append(c)
    assert len(seq) == 3 and seq[2] is c and list(seq) == [a, b, c]
    sub = seq[1:]
    assert isinstance(sub, nn.Sequential) and list(sub) == [b, c]
    assert list(sub._modules) == ["1", "2"]            # PyTorch keeps the original keys
    del seq[0]
    assert list(seq._modules) == ["0", "1"] and seq[0] is b
    seq[0] = nn.Tanh()
    assert isinstance(seq[0], nn.Tanh)
    seq.insert(0, a)
    assert seq[0] is a and len(seq) == 3
    with pytest.raises(IndexError, match="out of range"):
        seq[3]
    named = nn.Sequential(__import__("collections").OrderedDict([("fc", a), ("act", b)]))
    assert list(named.state_dict()) == ["fc.weight", "fc.bias"] and named.fc is a
    out = nn.Sequential(a, b, c)(pf.randn(4, 2))
    assert tuple(out.shape) == (4, 1)


def test_module_list_and_dict():
    layers = nn.ModuleList([nn.Linear(2, 2) for _ in range(3)])
    assert len(layers) == 3 and len(list(layers.parameters())) == 6
    layers.append(nn.ReLU())
    layers += [nn.Tanh()]
    assert len(layers) == 5 and isinstance(layers[-1], nn.Tanh)
    assert [n for n, _ in layers.named_parameters()][-1] == "2.bias"
    assert isinstance(layers[1:3], nn.ModuleList) and len(layers[1:3]) == 2
    layers.insert(1, nn.Identity())
    assert isinstance(layers[1], nn.Identity) and list(layers._modules)[-1] == "5"
    with pytest.raises(TypeError, match="should be called with an iterable"):
        layers.extend(nn.ReLU())
    heads = nn.ModuleDict({"a": nn.Linear(2, 1)})
    heads["b"] = nn.Linear(2, 3)
    heads.update([("c", nn.ReLU())])
    assert list(heads) == ["a", "b", "c"] and "b" in heads and len(heads) == 3
    assert list(heads.state_dict()) == ["a.weight", "a.bias", "b.weight", "b.bias"]
    assert isinstance(heads.pop("c"), nn.ReLU) and len(heads) == 2
    with pytest.raises(ValueError, match="should be a \\(key, module\\) pair"):
        heads.update([1])


# ------------------------------------------------------------------ conv & pooling
@needs_torch
@pytest.mark.parametrize("kwargs", [dict(), dict(stride=2, padding=1), dict(padding=1, bias=False),
                                    dict(groups=2, dilation=2, padding=2),
                                    dict(padding="same"), dict(padding="valid", stride=(1, 2))])
def test_conv2d(kwargs):
    ours, ref = pair("Conv2d", 4, 6, 3, **kwargs)
    run_both(ours, ref, randn(2, 4, 7, 6), rtol=1e-9, atol=1e-10)


@needs_torch
@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel")
def test_conv2d_same_even_kernel_and_padding_modes():
    ours, ref = pair("Conv2d", 2, 3, (2, 4), padding="same")
    run_both(ours, ref, randn(1, 2, 5, 6), rtol=1e-9, atol=1e-10)
    ours, ref = pair("Conv2d", 2, 3, 3, padding=1, padding_mode="reflect")
    run_both(ours, ref, randn(1, 2, 5, 6), rtol=1e-9, atol=1e-10)


def test_conv2d_bad_arguments():
    with pytest.raises(ValueError, match="in_channels must be divisible by groups"):
        nn.Conv2d(3, 4, 3, groups=2)
    with pytest.raises(ValueError, match="padding_mode must be one of"):
        nn.Conv2d(3, 4, 3, padding_mode="mirror")
    with pytest.raises(ValueError, match="not supported for strided"):
        nn.Conv2d(3, 4, 3, stride=2, padding="same")
    with pytest.raises(RuntimeError, match="expected input with 3 channels"):
        nn.Conv2d(3, 4, 3)(pf.randn(1, 2, 5, 5))
    with pytest.raises(RuntimeError, match="expected 3D \\(unbatched\\) or 4D"):
        nn.Conv2d(3, 4, 3)(pf.randn(5, 5))


@needs_torch
@pytest.mark.parametrize("kwargs", [dict(kernel_size=2), dict(kernel_size=3, stride=2, padding=1),
                                    dict(kernel_size=2, ceil_mode=True)])
def test_max_pool2d(kwargs):
    ours, ref = pair("MaxPool2d", **kwargs)
    run_both(ours, ref, randn(2, 3, 7, 6))


@needs_torch
@pytest.mark.parametrize("kwargs", [dict(kernel_size=2), dict(kernel_size=3, stride=2, padding=1),
                                    dict(kernel_size=3, padding=1, count_include_pad=False)])
def test_avg_pool2d(kwargs):
    ours, ref = pair("AvgPool2d", **kwargs)
    run_both(ours, ref, randn(2, 3, 7, 6))


@needs_torch
@pytest.mark.parametrize("size", [1, (2, 3), (3, 3)])
def test_adaptive_avg_pool2d(size):
    ours, ref = pair("AdaptiveAvgPool2d", size)
    run_both(ours, ref, randn(2, 3, 7, 6))


# ------------------------------------------------------------------ normalization
@needs_torch
@pytest.mark.parametrize("cls,shape", [("BatchNorm1d", (6, 4)), ("BatchNorm1d", (5, 4, 3)),
                                       ("BatchNorm2d", (3, 4, 2, 3))])
@pytest.mark.parametrize("kwargs", [dict(), dict(momentum=None), dict(affine=False),
                                    dict(track_running_stats=False), dict(momentum=0.5, eps=1e-3)])
def test_batchnorm_train_then_eval(cls, shape, kwargs):
    ours, ref = pair(cls, 4, **kwargs)
    if "affine" not in kwargs:  # non-trivial affine parameters
        with pf.no_grad(), torch.no_grad():
            ref.weight.uniform_(0.5, 1.5)
            ref.bias.uniform_(-1, 1)
        copy_from_torch(ours, ref)
    seeds = iter(range(100))
    # three training steps: batch statistics, running stats updated (and compared)
    run_both(ours, ref, lambda: randn(*shape, seed=next(seeds)) * 2 + 1, steps=3,
             rtol=1e-9, atol=1e-11)
    ours.eval()
    ref.eval()
    run_both(ours, ref, lambda: randn(*shape, seed=next(seeds)), steps=1, rtol=1e-9, atol=1e-11)


def test_batchnorm_buffers_and_bad_input():
    bn = nn.BatchNorm2d(3)
    assert list(bn.state_dict()) == ["weight", "bias", "running_mean", "running_var",
                                     "num_batches_tracked"]
    assert bn.num_batches_tracked.dtype is pf.int64
    with pytest.raises(ValueError, match=r"expected 4D input \(got 3D input\)"):
        bn(pf.randn(2, 3, 4))
    with pytest.raises(ValueError, match=r"expected 2D or 3D input \(got 4D input\)"):
        nn.BatchNorm1d(3)(pf.randn(2, 3, 4, 4))
    with pytest.raises(ValueError, match="expected input with 3 features"):
        bn(pf.randn(2, 5, 4, 4))
    # an old checkpoint (no version metadata) without num_batches_tracked still loads...
    sd = dict(bn.state_dict())
    del sd["num_batches_tracked"]
    assert nn.BatchNorm2d(3).load_state_dict(sd).missing_keys == []
    # ...but one saved by this version must have it
    sd = bn.state_dict()
    del sd["num_batches_tracked"]
    with pytest.raises(RuntimeError, match='Missing key.*"num_batches_tracked"'):
        nn.BatchNorm2d(3).load_state_dict(sd)


@needs_torch
@pytest.mark.parametrize("shape,norm", [((4, 5), 5), ((2, 3, 4), (3, 4))])
@pytest.mark.parametrize("kwargs", [dict(), dict(elementwise_affine=False), dict(bias=False)])
def test_layernorm(shape, norm, kwargs):
    ours, ref = pair("LayerNorm", norm, **kwargs)
    if kwargs.get("elementwise_affine", True):
        with pf.no_grad(), torch.no_grad():
            ref.weight.uniform_(0.5, 1.5)
        copy_from_torch(ours, ref)
    run_both(ours, ref, randn(*shape), rtol=1e-9, atol=1e-11)


# ------------------------------------------------------------------ embedding & dropout
@needs_torch
@pytest.mark.parametrize("padding_idx", [None, 0, -1])
def test_embedding(padding_idx):
    ours, ref = pair("Embedding", 7, 3, padding_idx=padding_idx)
    idx = np.array([[0, 2, 6], [6, 1, 0]], dtype=np.int64)
    run_both(ours, ref, idx)


def test_embedding_init():
    pf.manual_seed(0)
    emb = nn.Embedding(400, 50, padding_idx=3)
    w = emb.weight.detach().cpu().numpy()
    assert np.all(w[3] == 0)
    rest = np.delete(w, 3, axis=0)
    assert abs(rest.mean()) < 0.02 and abs(rest.std() - 1) < 0.02      # N(0, 1), as PyTorch
    assert emb.padding_idx == 3 and nn.Embedding(5, 2, padding_idx=-1).padding_idx == 4
    with pytest.raises(AssertionError, match="Padding_idx must be within num_embeddings"):
        nn.Embedding(5, 2, padding_idx=5)
    frozen = nn.Embedding.from_pretrained(pf.ones(4, 2))
    assert not frozen.weight.requires_grad and tuple(frozen.weight.shape) == (4, 2)


def test_dropout_train_and_eval():
    pf.manual_seed(0)
    drop = nn.Dropout(0.25)
    x = pf.ones(200, 50, requires_grad=True)
    y = drop(x)
    vals = y.detach().cpu().numpy()
    kept = vals != 0
    assert set(np.unique(vals)) <= {0.0, np.float32(1 / 0.75)}
    assert abs(kept.mean() - 0.75) < 0.02
    y.sum().backward()
    np.testing.assert_allclose(x.grad.cpu().numpy(), kept / 0.75, rtol=1e-6)  # grad follows the mask
    drop.eval()
    assert drop(x) is x                                                   # identity in eval


def test_dropout_eval_and_bad_p():
    drop = nn.Dropout(0.5).eval()
    x = pf.randn(3, 3)
    assert drop(x) is x
    assert nn.Dropout(0.0)(x) is x
    with pytest.raises(ValueError, match="between 0 and 1, but got 1.5"):
        nn.Dropout(1.5)


def test_train_eval_switch_on_a_model():
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Dropout(0.5))
    x = pf.randn(8, 4)
    model.eval()
    a, b = model(x), model(x)
    assert_close(a, b, rtol=0)                   # deterministic in eval
    assert model[1].num_batches_tracked.item() == 0
    model.train()
    model(x)
    assert model[1].num_batches_tracked.item() == 1


# ------------------------------------------------------------------ losses
def _class_problem(n=6, c=4, seed=3):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, c)), rng.integers(0, c, n).astype(np.int64)


@needs_torch
@pytest.mark.parametrize("kwargs", [dict(), dict(reduction="sum"), dict(reduction="none"),
                                    dict(ignore_index=1), dict(label_smoothing=0.1),
                                    dict(weight=[1.0, 2.0, 0.5, 1.0])])
def test_cross_entropy_loss(kwargs):
    logits, target = _class_problem()
    w = kwargs.pop("weight", None)
    ref = torch.nn.CrossEntropyLoss(
        weight=None if w is None else torch.tensor(w, dtype=torch.float64), **kwargs)
    ours = nn.CrossEntropyLoss(weight=None if w is None else pf.tensor(w, dtype=pf.float64),
                               **kwargs)
    run_both(ours, ref, logits, target)


@needs_torch
@pytest.mark.parametrize("kwargs", [dict(), dict(reduction="sum"), dict(ignore_index=0)])
def test_nll_loss(kwargs):
    logits, target = _class_problem()
    logp = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    run_both(nn.NLLLoss(**kwargs), torch.nn.NLLLoss(**kwargs), logp, target)


@needs_torch
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_mse_loss(reduction):
    run_both(nn.MSELoss(reduction=reduction), torch.nn.MSELoss(reduction=reduction),
             randn(3, 4), randn(3, 4, seed=5))


@needs_torch
@pytest.mark.parametrize("pos_weight", [None, [1.0, 3.0, 0.5]])
def test_bce_with_logits_loss(pos_weight):
    target = (randn(4, 3, seed=6) > 0).astype(np.float64)
    ref = torch.nn.BCEWithLogitsLoss(
        pos_weight=None if pos_weight is None else torch.tensor(pos_weight, dtype=torch.float64))
    ours = nn.BCEWithLogitsLoss(
        pos_weight=None if pos_weight is None else pf.tensor(pos_weight, dtype=pf.float64))
    run_both(ours, ref, randn(4, 3), target, grad_inputs=True)


def test_loss_reduction_validation():
    with pytest.raises(ValueError, match="avg is not a valid value for reduction"):
        nn.MSELoss(reduction="avg")
    assert nn.MSELoss(size_average=False).reduction == "sum"
    assert nn.MSELoss(reduce=False).reduction == "none"
    with pytest.raises(ValueError, match="label_smoothing must be between"):
        nn.CrossEntropyLoss(label_smoothing=2.0)


# ------------------------------------------------------------------ functional
def test_functional_is_the_ops():
    x = pf.tensor([-1.0, 0.5])
    assert F.relu(x).tolist() == [0.0, 0.5]
    assert_close(F.gelu(x, approximate="tanh"), pf.gelu(x, approximate="tanh"), rtol=0)
    assert F.linear is pf.linear
    assert F.sigmoid is not None and F.reshape is pf.reshape      # any other pyflow op
    with pytest.raises(AttributeError, match="has no attribute 'no_such_op'"):
        F.no_such_op


def test_functional_softmax_implicit_dim_warns():
    x = pf.randn(2, 3)
    with pytest.warns(UserWarning, match="Implicit dimension choice for softmax"):
        y = F.softmax(x)
    assert_close(y.sum(1), np.ones(2), rtol=1e-6)
