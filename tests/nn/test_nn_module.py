"""nn.Module: registration, iteration, state_dict / load_state_dict, hooks, modes,
dtype conversion, repr -- against PyTorch's behaviour (and PyTorch itself where
installed)."""
import copy
import re
from collections import OrderedDict

import numpy as np
import pytest

import pyflow as pf
from pyflow import nn
from tests.helpers import assert_close, needs_torch, torch


class Net(nn.Module):
    """A small model touching every registry: params, (non-)persistent buffers, children."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 3)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(3, 2, bias=False)
        self.scale = nn.Parameter(pf.ones(2))
        self.register_buffer("count", pf.zeros(1))
        self.register_buffer("scratch", pf.zeros(2), persistent=False)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x))) * self.scale


# ------------------------------------------------------------------ registration
def test_setattr_registers_parameters_buffers_and_children():
    net = Net()
    assert list(net._parameters) == ["scale"]
    assert list(net._buffers) == ["count", "scratch"]
    assert list(net._modules) == ["fc1", "act", "fc2"]
    assert [n for n, _ in net.named_parameters()] == ["scale", "fc1.weight", "fc1.bias",
                                                      "fc2.weight"]
    assert [n for n, _ in net.named_buffers()] == ["count", "scratch"]
    assert [n for n, _ in net.named_children()] == ["fc1", "act", "fc2"]
    assert [n for n, _ in net.named_modules()] == ["", "fc1", "act", "fc2"]
    assert list(net.parameters(recurse=False)) == [net.scale]
    assert net.fc2.bias is None and "bias" in net.fc2._parameters
    assert isinstance(net.fc1.weight, nn.Parameter) and net.fc1.weight.requires_grad


def test_reassigning_and_deleting_attributes():
    net = Net()
    net.fc2 = nn.Linear(3, 5)                      # replace a child
    assert net.fc2.out_features == 5 and "fc2" in net._modules
    with pytest.raises(TypeError, match="cannot assign 'Tensor' as parameter 'scale'"):
        net.scale = pf.ones(2)                     # a plain tensor is not a parameter
    net.scale = None
    assert net.scale is None and "scale" in net._parameters
    with pytest.raises(TypeError, match="cannot assign 'int' as child module 'act'"):
        net.act = 3
    with pytest.raises(TypeError, match="cannot assign 'str' as buffer 'count'"):
        net.count = "x"
    net.count = pf.ones(1)
    assert net.count.item() == 1
    del net.fc1
    assert "fc1" not in net._modules
    with pytest.raises(AttributeError, match="has no attribute 'fc1'"):
        net.fc1


def test_registration_errors():
    m = nn.Module()
    with pytest.raises(KeyError, match=r'contain "\."'):
        m.register_parameter("a.b", nn.Parameter(pf.ones(1)))
    with pytest.raises(TypeError, match="pyflow.nn.Parameter or None required"):
        m.register_parameter("w", pf.ones(1))
    with pytest.raises(TypeError, match="is not a Module subclass"):
        m.add_module("c", 3)
    with pytest.raises(KeyError, match="already exists"):
        m.register_buffer("training", pf.ones(1))

    class Early(nn.Module):
        def __init__(self):
            self.w = nn.Parameter(pf.ones(1))

    with pytest.raises(AttributeError, match=r"before Module.__init__\(\) call"):
        Early()
    with pytest.raises(NotImplementedError, match='missing the required "forward"'):
        nn.Module()(pf.ones(1))


def test_shared_parameters_come_once():
    lin = nn.Linear(3, 3)
    seq = nn.Sequential(lin, nn.ReLU(), lin)
    assert len(list(seq.parameters())) == 2
    assert len(list(seq.modules())) == 3       # Sequential, Linear, ReLU
    assert [n for n, _ in seq.named_parameters(remove_duplicate=False)] == [
        "0.weight", "0.bias", "2.weight", "2.bias"]
    tied = nn.Module()
    tied.a, tied.b = nn.Linear(2, 2), nn.Linear(2, 2)
    tied.b.weight = tied.a.weight
    assert [n for n, _ in tied.named_parameters()] == ["a.weight", "a.bias", "b.bias"]
    assert list(tied.state_dict()) == ["a.weight", "a.bias", "b.weight", "b.bias"]


def test_parameter_repr_and_print(capsys):
    p = nn.Parameter(pf.tensor([1.0, 2.0]))
    print(p)
    out = capsys.readouterr().out
    assert out.startswith("Parameter containing:\ntensor([1., 2.], requires_grad=True)")
    assert repr(p) == out.rstrip("\n")
    assert not nn.Parameter(pf.ones(1), requires_grad=False).requires_grad


def test_get_submodule_and_parameter():
    seq = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.Linear(2, 3)))
    assert seq.get_submodule("1.0").out_features == 3
    assert seq.get_parameter("1.0.bias").shape == (3,)
    with pytest.raises(AttributeError, match="has no attribute `7`"):
        seq.get_submodule("7")


# ------------------------------------------------------------------ state dict
def test_state_dict_keys_order_and_detached():
    net = Net()
    sd = net.state_dict()
    assert isinstance(sd, OrderedDict)
    assert list(sd) == ["scale", "count", "fc1.weight", "fc1.bias", "fc2.weight"]
    for k, v in sd.items():
        assert not v.requires_grad and v.grad_fn is None
    # values share memory with the parameters (like PyTorch's detach())
    with pf.no_grad():
        net.fc1.bias.fill_(3.0)
    assert np.all(sd["fc1.bias"].cpu().numpy() == 3.0)
    assert net.state_dict(keep_vars=True)["fc1.weight"] is net.fc1.weight
    assert list(net.state_dict(prefix="model."))[0] == "model.scale"


def test_load_state_dict_copies_in_place():
    src, dst = Net(), Net()
    w = dst.fc1.weight
    version = w._version[0]
    res = dst.load_state_dict(src.state_dict())
    assert res.missing_keys == [] and res.unexpected_keys == []
    assert dst.fc1.weight is w and w._version[0] > version and w.grad_fn is None
    assert w.requires_grad
    for k, v in src.state_dict().items():
        assert_close(dst.state_dict()[k], v, rtol=0)
    # a copy, not an alias
    with pf.no_grad():
        src.fc1.weight.fill_(7.0)
    assert not np.any(dst.fc1.weight.detach().cpu().numpy() == 7.0)


def test_load_state_dict_missing_and_unexpected_keys():
    net = Net()
    sd = net.state_dict()
    del sd["fc1.bias"]
    sd["fc1.extra"] = pf.ones(1)
    sd["nothere.weight"] = pf.ones(1)
    with pytest.raises(RuntimeError) as e:
        Net().load_state_dict(sd)
    msg = str(e.value)
    assert msg.startswith("Error(s) in loading state_dict for Net:")
    assert 'Missing key(s) in state_dict: "fc1.bias".' in msg
    # PyTorch's order: the root module reports its own strays before its children's
    assert 'Unexpected key(s) in state_dict: "nothere.weight", "fc1.extra".' in msg
    res = Net().load_state_dict(sd, strict=False)
    assert res.missing_keys == ["fc1.bias"]
    assert sorted(res.unexpected_keys) == ["fc1.extra", "nothere.weight"]


def test_load_state_dict_shape_mismatch_always_raises():
    sd = Net().state_dict()
    sd["fc1.weight"] = pf.zeros(5, 4)
    for strict in (True, False):
        with pytest.raises(RuntimeError, match=re.escape(
                "size mismatch for fc1.weight: copying a param with shape pyflow.Size([5, 4]) "
                "from checkpoint, the shape in current model is pyflow.Size([3, 4]).")):
            Net().load_state_dict(sd, strict=strict)
    sd = Net().state_dict()
    sd["fc1.bias"] = np.zeros(3)
    with pytest.raises(RuntimeError, match='parameter named "fc1.bias", expected pyflow.Tensor'):
        Net().load_state_dict(sd)
    with pytest.raises(TypeError, match="Expected state_dict to be dict-like"):
        Net().load_state_dict([1, 2])


def test_non_persistent_buffer_not_saved_nor_expected():
    net = Net()
    assert "scratch" not in net.state_dict()
    net.load_state_dict(Net().state_dict())  # no "scratch" key needed
    sd = Net().state_dict()
    sd["scratch"] = pf.zeros(2)
    with pytest.raises(RuntimeError, match='Unexpected key.*"scratch"'):
        net.load_state_dict(sd)


@needs_torch
def test_state_dict_keys_match_torch():
    def build(lib):
        return lib.nn.Sequential(OrderedDict([
            ("conv", lib.nn.Conv2d(3, 4, 3, padding=1, bias=False)),
            ("bn", lib.nn.BatchNorm2d(4)),
            ("act", lib.nn.ReLU()),
            ("pool", lib.nn.AdaptiveAvgPool2d(1)),
            ("flat", lib.nn.Flatten()),
            ("blocks", lib.nn.ModuleList([lib.nn.Linear(4, 4), lib.nn.LayerNorm(4),
                                          lib.nn.BatchNorm1d(4, affine=False)])),
            ("heads", lib.nn.ModuleDict({"a": lib.nn.Linear(4, 2), "b": lib.nn.Identity()})),
            ("emb", lib.nn.Embedding(10, 4, padding_idx=0)),
            ("drop", lib.nn.Dropout(0.1)),
            ("loss", lib.nn.CrossEntropyLoss(weight=lib.ones(2))),
        ]))
    ours, ref = build(pf).state_dict(), build(torch).state_dict()
    assert list(ours) == list(ref)
    for k in ref:
        assert tuple(ours[k].shape) == tuple(ref[k].shape), k
        assert str(ours[k].dtype).split(".")[-1] == str(ref[k].dtype).split(".")[-1], k
    assert [n for n, _ in build(pf).named_parameters()] == \
        [n for n, _ in build(torch).named_parameters()]
    assert [n for n, _ in build(pf).named_modules()] == \
        [n for n, _ in build(torch).named_modules()]


@needs_torch
def test_repr_matches_torch():
    def build(lib):
        return lib.nn.Sequential(
            lib.nn.Conv2d(3, 8, 3, stride=2, padding=1, bias=False), lib.nn.BatchNorm2d(8),
            lib.nn.ReLU(inplace=True), lib.nn.MaxPool2d(2), lib.nn.AvgPool2d(2),
            lib.nn.AdaptiveAvgPool2d((1, 1)), lib.nn.Flatten(),
            lib.nn.Sequential(lib.nn.Linear(8, 4), lib.nn.GELU(approximate="tanh"),
                              lib.nn.Dropout(0.2)),
            lib.nn.ModuleList([lib.nn.LayerNorm(4), lib.nn.SiLU(), lib.nn.Tanh(),
                               lib.nn.Sigmoid()]),
            lib.nn.ModuleDict({"sm": lib.nn.Softmax(dim=-1), "lsm": lib.nn.LogSoftmax(1)}),
            lib.nn.Embedding(10, 4, padding_idx=0), lib.nn.Identity(), lib.nn.BatchNorm1d(4),
            lib.nn.CrossEntropyLoss(), lib.nn.MSELoss(), lib.nn.NLLLoss(),
            lib.nn.BCEWithLogitsLoss(), lib.nn.ModuleList())
    assert repr(build(pf)) == repr(build(torch))


# ------------------------------------------------------------------ hooks and call
def test_forward_hooks():
    lin = nn.Linear(2, 2)
    calls = []

    def pre(mod, args):
        calls.append("pre")
        return (args[0] * 0,)                    # replace the input

    def post(mod, args, out):
        calls.append("post")
        assert mod is lin and len(args) == 1
        return out + 1                           # replace the output

    h1 = lin.register_forward_pre_hook(pre)
    h2 = lin.register_forward_hook(post)
    out = lin(pf.ones(1, 2))
    assert calls == ["pre", "post"]
    assert_close(out, lin.bias.detach().reshape(1, 2) + 1)
    h1.remove()
    h2.remove()
    h2.remove()                                  # removing twice is harmless
    calls.clear()
    assert_close(lin(pf.zeros(1, 2)), lin.bias.detach().reshape(1, 2))
    assert calls == []


def test_hook_order_kwargs_and_context_manager():
    ident = nn.Identity()
    order = []
    ident.register_forward_hook(lambda m, a, o: order.append(1))
    ident.register_forward_hook(lambda m, a, o: order.append(0), prepend=True)
    with ident.register_forward_pre_hook(lambda m, a, k: ((a[0] + 1,), k), with_kwargs=True):
        assert ident(1) == 2
    assert ident(1) == 1
    assert order == [0, 1, 0, 1]
    seen = {}
    ident.register_forward_hook(lambda m, a, k, o: seen.update(k=k, o=o), with_kwargs=True)
    ident(input=5)
    assert seen == {"k": {"input": 5}, "o": 5}


def test_hook_sees_intermediate_activations():
    mlp = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    acts = {}
    for name, m in mlp.named_children():
        m.register_forward_hook(lambda mod, a, o, name=name: acts.__setitem__(name, o))
    out = mlp(pf.randn(5, 3))
    assert list(acts) == ["0", "1", "2"] and acts["2"] is out
    assert np.all(acts["1"].detach().cpu().numpy() >= 0)


# ------------------------------------------------------------------ modes and conversion
def test_train_eval_apply_and_requires_grad():
    net = Net()
    assert net.training and net.fc1.training
    assert net.eval() is net
    assert not any(m.training for m in net.modules())
    net.train()
    assert all(m.training for m in net.modules())
    with pytest.raises(ValueError, match="expected to be boolean"):
        net.train("no")
    seen = []
    net.apply(lambda m: seen.append(type(m).__name__))
    assert seen == ["Linear", "ReLU", "Linear", "Net"]
    net.requires_grad_(False)
    assert not any(p.requires_grad for p in net.parameters())


def test_zero_grad():
    net = Net()
    net(pf.randn(3, 4)).sum().backward()
    assert all(p.grad is not None for p in net.parameters())
    net.zero_grad(set_to_none=False)
    assert all(np.all(p.grad.cpu().numpy() == 0) for p in net.parameters())
    net.zero_grad()
    assert all(p.grad is None for p in net.parameters())


def test_to_double_keeps_parameter_objects():
    net = Net()
    bn = nn.BatchNorm1d(3)
    net.bn = bn
    w = net.fc1.weight
    before = w.detach().cpu().numpy().copy()
    assert net.to(pf.float64) is net
    assert net.fc1.weight is w and w.dtype is pf.float64 and w.requires_grad
    np.testing.assert_array_equal(w.detach().cpu().numpy(), before)
    assert net.count.dtype is pf.float64 and bn.running_mean.dtype is pf.float64
    assert bn.num_batches_tracked.dtype is pf.int64       # integers keep their dtype
    out = net(pf.randn(2, 4, dtype=pf.float64))
    assert out.dtype is pf.float64
    net.float()
    assert w.dtype is pf.float32
    net.double()
    assert w.dtype is pf.float64
    net.to(dtype=pf.float32)
    assert all(p.dtype is pf.float32 for p in net.parameters())
    assert net.to("cpu") is net and net.cpu() is net
    with pytest.raises(TypeError, match="only accepts floating point"):
        net.to(pf.int64)
    with pytest.raises(RuntimeError, match="cuda"):
        net.to("cuda")


def test_deepcopy_gives_independent_parameters():
    lin = nn.Linear(2, 2)
    clone = copy.deepcopy(lin)
    assert clone.weight is not lin.weight and isinstance(clone.weight, nn.Parameter)
    with pf.no_grad():
        clone.weight.fill_(0)
    assert np.any(lin.weight.detach().cpu().numpy() != 0)


# ------------------------------------------------------------------ against torch
@needs_torch
def test_custom_module_training_step_matches_torch():
    class TNet(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = torch.nn.Linear(4, 3)
            self.act = torch.nn.ReLU()
            self.fc2 = torch.nn.Linear(3, 2, bias=False)
            self.scale = torch.nn.Parameter(torch.ones(2))
            self.register_buffer("count", torch.zeros(1))

        def forward(self, x):
            return self.fc2(self.act(self.fc1(x))) * self.scale

    ref = TNet().double()
    net = Net().double()
    net.load_state_dict({k: pf.tensor(v.cpu().numpy()) for k, v in ref.state_dict().items()})
    x = np.random.default_rng(0).standard_normal((6, 4))
    out, tout = net(pf.tensor(x)), ref(torch.tensor(x))
    assert_close(out, tout.detach().cpu().numpy(), rtol=1e-12)
    out.square().sum().backward()
    tout.square().sum().backward()
    tparams = dict(ref.named_parameters())
    for name, p in net.named_parameters():
        assert_close(p.grad, tparams[name].grad.cpu().numpy(), rtol=1e-10, msg=name)

