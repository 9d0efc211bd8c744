"""models/resnet.py: torchvision's parameter counts and names, the same numbers
as a PyTorch reference on the same weights (forward, gradients, BN running
statistics), a training step in graph mode equal to eager, and clear errors."""
import numpy as np
import pytest

import pyflow as pf
from models import resnet
from tests.helpers import needs_torch, torch


def _np(t):
    return t.detach().cpu().numpy()


def _small_bottleneck_resnet(num_classes=10):
    """A ResNet-50-shaped net (v1.5 bottlenecks, downsample on every stage) small
    enough for a test: one block per stage at a quarter of the width."""
    return resnet.ResNet(resnet.Bottleneck, (1, 1, 1, 1), num_classes=num_classes, width=16)


# ------------------------------------------------------------------ a PyTorch reference
# A minimal torchvision ResNet (torchvision is not a dependency), written
# independently of models/resnet.py, with torchvision's module names.
if torch is not None:
    tnn = torch.nn

    class TorchBasicBlock(tnn.Module):
        expansion = 1

        def __init__(self, cin, planes, stride=1, downsample=None):
            super().__init__()
            self.conv1 = tnn.Conv2d(cin, planes, 3, stride, 1, bias=False)
            self.bn1 = tnn.BatchNorm2d(planes)
            self.conv2 = tnn.Conv2d(planes, planes, 3, 1, 1, bias=False)
            self.bn2 = tnn.BatchNorm2d(planes)
            self.downsample = downsample

        def forward(self, x):
            idt = x if self.downsample is None else self.downsample(x)
            out = torch.relu(self.bn1(self.conv1(x)))
            return torch.relu(self.bn2(self.conv2(out)) + idt)

    class TorchBottleneck(tnn.Module):
        expansion = 4

        def __init__(self, cin, planes, stride=1, downsample=None):
            super().__init__()
            self.conv1 = tnn.Conv2d(cin, planes, 1, bias=False)
            self.bn1 = tnn.BatchNorm2d(planes)
            self.conv2 = tnn.Conv2d(planes, planes, 3, stride, 1, bias=False)   # v1.5
            self.bn2 = tnn.BatchNorm2d(planes)
            self.conv3 = tnn.Conv2d(planes, planes * 4, 1, bias=False)
            self.bn3 = tnn.BatchNorm2d(planes * 4)
            self.downsample = downsample

        def forward(self, x):
            idt = x if self.downsample is None else self.downsample(x)
            out = torch.relu(self.bn1(self.conv1(x)))
            out = torch.relu(self.bn2(self.conv2(out)))
            return torch.relu(self.bn3(self.conv3(out)) + idt)

    class TorchResNet(tnn.Module):
        def __init__(self, block, layers, num_classes=1000, width=64):
            super().__init__()
            self.conv1 = tnn.Conv2d(3, width, 7, 2, 3, bias=False)
            self.bn1 = tnn.BatchNorm2d(width)
            self.maxpool = tnn.MaxPool2d(3, 2, 1)
            cin = width
            for i, n in enumerate(layers):
                planes, stride = width * 2 ** i, 1 if i == 0 else 2
                blocks = []
                for j in range(n):
                    down = None
                    if j == 0 and (stride != 1 or cin != planes * block.expansion):
                        down = tnn.Sequential(
                            tnn.Conv2d(cin, planes * block.expansion, 1, stride, bias=False),
                            tnn.BatchNorm2d(planes * block.expansion))
                    blocks.append(block(cin, planes, stride if j == 0 else 1, down))
                    cin = planes * block.expansion
                setattr(self, f"layer{i + 1}", tnn.Sequential(*blocks))
            self.fc = tnn.Linear(cin, num_classes)

        def forward(self, x):
            x = self.maxpool(torch.relu(self.bn1(self.conv1(x))))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            return self.fc(torch.flatten(x.mean((2, 3)), 1))


def _torch_twin(model, block, layers, num_classes, width=64):
    """The torch reference with ``model``'s parameters and buffers, loaded by name."""
    ref = TorchResNet(block, layers, num_classes, width).double()
    sd = {k: torch.from_numpy(_np(v).copy()) for k, v in model.state_dict().items()}
    ref.load_state_dict(sd, strict=True)
    return ref


# ------------------------------------------------------------------ architecture
@pytest.mark.parametrize("make, expected", [(resnet.resnet18, 11_689_512),
                                            (resnet.resnet34, 21_797_672),
                                            (resnet.resnet50, 25_557_032)])
def test_parameter_counts_equal_torchvision(make, expected):
    model = make()
    assert sum(p.numel() for p in model.parameters()) == expected
    assert tuple(model.fc.weight.shape) == (1000, 512 * (4 if make is resnet.resnet50 else 1))


@needs_torch
@pytest.mark.parametrize("make, block, layers", [
    (resnet.resnet18, "TorchBasicBlock", (2, 2, 2, 2)),
    (resnet.resnet50, "TorchBottleneck", (3, 4, 6, 3))])
def test_state_dict_keys_and_shapes_are_torchvisions(make, block, layers):
    """Every key, in order, with its shape: a torchvision checkpoint loads as it is."""
    ref = TorchResNet(globals()[block], layers)
    model = make()
    ours = model.state_dict()
    assert list(ours) == list(ref.state_dict())
    assert all(tuple(ours[k].shape) == tuple(v.shape) for k, v in ref.state_dict().items())
    model.load_state_dict({k: pf.tensor(v.numpy()) for k, v in ref.state_dict().items()})
    np.testing.assert_array_equal(_np(model.layer4[1].conv2.weight),
                                  ref.layer4[1].conv2.weight.detach().numpy())
    # the v1.5 bottleneck strides in its 3x3 conv
    if make is resnet.resnet50:
        block0 = make().layer2[0]
        assert block0.conv1.stride == (1, 1) and block0.conv2.stride == (2, 2)


def test_output_shape_and_zero_init_residual():
    pf.manual_seed(0)
    model = resnet.resnet18(num_classes=10, zero_init_residual=True)
    assert all(float(b.bn2.weight.abs().sum()) == 0.0
               for layer in (model.layer1, model.layer4) for b in layer)
    assert float(model.bn1.weight.sum()) == 64.0
    assert tuple(model(pf.randn(2, 3, 32, 32)).shape) == (2, 10)
    small = _small_bottleneck_resnet(num_classes=7)
    assert tuple(small(pf.randn(1, 3, 40, 24)).shape) == (1, 7)
    assert float(resnet.resnet50(zero_init_residual=True).layer3[5].bn3.weight.abs().sum()) == 0


# ------------------------------------------------------------------ against PyTorch
@needs_torch
@pytest.mark.parametrize("kind", ["resnet18", "bottleneck"])
def test_forward_and_gradients_match_pytorch(kind):
    """Train-mode forward (batch statistics), loss, every gradient and the BN
    running statistics equal the torch reference's on the same float64 weights;
    then eval-mode logits, which use the running statistics."""
    pf.manual_seed(0)
    if kind == "resnet18":
        model, block, layers, width = resnet.resnet18(num_classes=10), TorchBasicBlock, \
            (2, 2, 2, 2), 64
    else:
        model, block, layers, width = _small_bottleneck_resnet(), TorchBottleneck, \
            (1, 1, 1, 1), 16
    model = model.double()
    ref = _torch_twin(model, block, layers, 10, width)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 32, 32))
    y = np.array([3, 7])

    logits = model(pf.tensor(x))
    loss = pf.nn.functional.cross_entropy(logits, pf.tensor(y))
    loss.backward()
    ref_logits = ref(torch.from_numpy(x))
    ref_loss = torch.nn.functional.cross_entropy(ref_logits, torch.from_numpy(y))
    ref_loss.backward()

    np.testing.assert_allclose(_np(logits), ref_logits.detach().numpy(), rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(float(loss), ref_loss.item(), rtol=1e-10)
    ref_params = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        g = ref_params[name].grad.numpy()
        np.testing.assert_allclose(_np(p.grad), g, rtol=1e-6, atol=1e-9 * np.abs(g).max(),
                                   err_msg=name)
    ref_state = ref.state_dict()
    for name, b in model.named_buffers():
        np.testing.assert_allclose(_np(b), ref_state[name].numpy(), rtol=1e-8, atol=1e-12,
                                   err_msg=name)

    model.eval()
    ref.eval()
    with pf.no_grad(), torch.no_grad():
        np.testing.assert_allclose(_np(model(pf.tensor(x))), ref(torch.from_numpy(x)).numpy(),
                                   rtol=1e-8, atol=1e-10)


@needs_torch
def test_float32_matches_pytorch():
    """The float32 path (what training runs) against torch in float64, the exact
    answer: pyflow's float32 gradients must be within 1e-4 (relative, whole
    tensor) of it; they are ~1e-5 off, as close as torch's own float32 on an
    AVX-512 machine.  The reference is not torch float32 because that one is
    machine dependent: on an AVX2-only CPU, oneDNN's float32 convolutions are
    ~2e-3 off (seen in CI; reproduced here with DNNL_MAX_CPU_ISA=AVX2).
    64x64 pixels, not 32x32: at 32x32 layer4 is 1x1, so its BatchNorm
    normalizes two numbers per channel, which amplifies rounding ~1000x."""
    pf.manual_seed(1)
    model = resnet.resnet18(num_classes=10)
    ref = _torch_twin(model, TorchBasicBlock, (2, 2, 2, 2), 10)
    x = np.random.default_rng(1).standard_normal((2, 3, 64, 64)).astype(np.float32)
    y = np.array([1, 8])
    logits = model(pf.tensor(x))
    assert logits.dtype == pf.float32
    pf.nn.functional.cross_entropy(logits, pf.tensor(y)).backward()
    ref_logits = ref(torch.from_numpy(x).double())
    torch.nn.functional.cross_entropy(ref_logits, torch.from_numpy(y)).backward()

    def rel_err(ours, exact):
        return np.linalg.norm(ours - exact) / np.linalg.norm(exact)

    assert rel_err(_np(logits), ref_logits.detach().numpy()) < 1e-5
    ref_params = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        assert p.grad.dtype == pf.float32, name
        assert rel_err(_np(p.grad), ref_params[name].grad.numpy()) < 1e-4, name


# ------------------------------------------------------------------ graph mode
class TrainGraph(pf.nn.Graph):
    def __init__(self, model, optimizer, executor):
        super().__init__()
        self.model = model
        self.add_optimizer(optimizer)
        self.config.set_executor(executor)

    def build(self, x, y):
        loss = pf.nn.functional.cross_entropy(self.model(x), y)
        loss.backward()
        return loss


@pytest.mark.cpu_only
@pytest.mark.parametrize("executor", ["sequential", "actors"])
def test_training_step_graph_equals_eager(executor):
    """Two SGD-momentum steps of the small bottleneck ResNet: eager and
    nn.Graph give the same losses, parameters and BN running statistics."""
    models = []
    for _ in range(2):
        pf.manual_seed(0)
        models.append(_small_bottleneck_resnet())
    eager, graphed = models
    opt = pf.optim.SGD(eager.parameters(), lr=0.05, momentum=0.9)
    graph = TrainGraph(graphed, pf.optim.SGD(graphed.parameters(), lr=0.05, momentum=0.9),
                       executor)
    rng = np.random.default_rng(3)
    for _ in range(2):
        x = pf.tensor(rng.standard_normal((2, 3, 32, 32)).astype(np.float32))
        y = pf.tensor(rng.integers(0, 10, 2))
        opt.zero_grad()
        loss = pf.nn.functional.cross_entropy(eager(x), y)
        loss.backward()
        opt.step()
        np.testing.assert_allclose(float(graph(x, y)), float(loss), rtol=1e-5)
    for (name, a), b in zip(eager.state_dict().items(), graphed.state_dict().values()):
        np.testing.assert_allclose(_np(b), _np(a), rtol=1e-4, atol=1e-6, err_msg=name)


# ------------------------------------------------------------------ bad input
def test_bad_inputs_raise_clear_errors():
    model = _small_bottleneck_resnet()
    with pytest.raises(ValueError,
                       match=r"expected input of shape \(N, 3, H, W\), got \(3, 32, 32\)"):
        model(pf.randn(3, 32, 32))
    with pytest.raises(ValueError, match=r"\(N, 3, H, W\), got \(2, 1, 32, 32\)"):
        model(pf.randn(2, 1, 32, 32))
    with pytest.raises(TypeError, match="floating point input.*int64"):
        model(pf.zeros(2, 3, 32, 32, dtype=pf.int64))
    with pytest.raises(ValueError, match="blocks of the 4 stages"):
        resnet.ResNet(resnet.BasicBlock, (2, 2, 2))
