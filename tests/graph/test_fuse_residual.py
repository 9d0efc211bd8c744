"""graph.config.allow_fuse_residual (pyflow/graph/passes/residual.py):
dropout + add and add + layer_norm become the fused ops, and the compiled step
gives eager mode's losses and gradients, on every executor."""
import numpy as np
import pytest

import pyflow as pf
import pyflow.nn as nn
import pyflow.nn.functional as F
from pyflow.graph import trace
from pyflow.graph.passes import fuse_batch_norm_relu, fuse_residual
from pyflow.ops.fused import FusedBiasDropoutAdd
from pyflow.ops.normalization import FusedAddLayerNorm, LayerNorm
from tests.helpers import executors, to_numpy

# The pass is the same on every device, and the fused ops' cuda kernels are
# checked op by op on the simulator (tests/ops); whole simulated training runs
# (minutes each there) are kept to the CPU.
cpu_only = pytest.mark.cpu_only


class Block(nn.Module):
    """A pre-LN residual block with dropout, as GPT's (two fusable spots each kind)."""

    def __init__(self, d=16, p=0.2):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.fc, self.proj = nn.Linear(d, d), nn.Linear(d, d)
        self.drop = nn.Dropout(p)

    def forward(self, x):
        x = x + self.drop(self.fc(self.ln_1(x)))
        x = self.drop(self.proj(F.gelu(self.ln_2(x)))) + x       # the other order
        return x


def _model(seed=0, p=0.2):
    pf.manual_seed(seed)
    return nn.Sequential(Block(p=p), Block(p=p), nn.LayerNorm(16), nn.Linear(16, 5))


def _targets(node_list):
    return [n.target for n in node_list if n.kind == "call"]


def test_with_dropout_every_residual_add_is_a_dropout_add():
    model = _model()
    x = pf.randn(4, 16)
    graph = fuse_residual(trace(lambda x: model(x), [x]))
    targets = _targets(graph.nodes)
    assert targets.count(FusedBiasDropoutAdd) == 4
    assert targets.count(FusedAddLayerNorm) == 0 and targets.count(LayerNorm) == 5
    assert graph.history[-1][1].startswith("4 fused: dropout_")


def test_without_dropout_every_norm_of_a_sum_fuses_with_its_add():
    model = _model(p=0.0)           # nn.Dropout(0.0) records nothing
    x = pf.randn(4, 16)
    graph = fuse_residual(trace(lambda x: model(x), [x]))
    targets = _targets(graph.nodes)
    # ln_2 of each block, block 2's ln_1 and the final norm read a residual sum;
    # only block 1's ln_1 reads the input
    assert targets.count(FusedAddLayerNorm) == 4 and targets.count(LayerNorm) == 1
    assert FusedBiasDropoutAdd not in targets


def test_add_then_layer_norm_becomes_one_node_with_two_outputs():
    w, b = pf.randn(8), pf.randn(8)

    def fn(a, r):
        s = a + r
        return F.layer_norm(s, (8,), w, b) * s

    a, r = pf.randn(3, 8), pf.randn(3, 8)
    graph = fuse_residual(trace(fn, [a, r]))
    (fused,) = [n for n in graph.nodes if n.kind == "call" and n.target is FusedAddLayerNorm]
    assert len(fused.outputs) == 2 and LayerNorm not in _targets(graph.nodes)


def test_broadcast_adds_and_shared_dropouts_are_left_alone():
    def fn(x, b, r):
        d = F.dropout(x, 0.5)
        return F.layer_norm(x + b, (8,)) + (d + r) * d      # d read twice; x + b broadcasts

    args = [pf.randn(3, 8), pf.randn(8), pf.randn(3, 8)]
    graph = fuse_residual(trace(fn, args))
    assert FusedBiasDropoutAdd not in _targets(graph.nodes)
    assert FusedAddLayerNorm not in _targets(graph.nodes)
    assert graph.history[-1] == ("fuse_residual", "0 fused")


class TrainStep(nn.Graph):
    def __init__(self, model, opt, fuse):
        super().__init__()
        self.model = model
        self.add_optimizer(opt)
        self.config.allow_fuse_residual(fuse)

    def build(self, x, y):
        loss = F.cross_entropy(self.model(x), y)
        loss.backward()
        return loss


@cpu_only
@pytest.mark.parametrize("p", [0.2, 0.0])
@pytest.mark.parametrize("executor", executors("sequential", "actors"))
def test_fused_graph_trains_as_eager_and_as_the_unfused_graph(executor, p):
    rng = np.random.default_rng(0)
    x = pf.tensor(rng.standard_normal((6, 16)).astype(np.float32))
    y = pf.tensor(rng.integers(0, 5, 6))
    models = [_model(p=p) for _ in range(3)]
    opts = [pf.optim.AdamW(m.parameters(), lr=1e-2) for m in models]
    steps = [TrainStep(models[k], opts[k], fuse) for k, fuse in ((1, True), (2, False))]
    for s in steps:
        s.config.set_executor(executor)
    pf.manual_seed(5)
    for _ in range(3):
        opts[0].zero_grad()
        loss = F.cross_entropy(models[0](x), y)
        loss.backward()
        opts[0].step()
    losses = []
    for s in steps:
        pf.manual_seed(5)
        losses.append([to_numpy(s(x, y)) for _ in range(3)][-1])
    fused_nodes = _targets(steps[0].plans[0].stages[-1][1].nodes)
    assert (FusedBiasDropoutAdd if p else FusedAddLayerNorm) in fused_nodes
    assert "fuse_residual" in pf.explain(steps[0])
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(losses[0], to_numpy(loss), rtol=1e-6, atol=1e-7)
    for p, q in zip(models[1].parameters(), models[0].parameters()):
        np.testing.assert_allclose(to_numpy(p), to_numpy(q), rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ batch_norm + add + relu
def _resnet(seed=0):
    from pyflow.models import resnet
    pf.manual_seed(seed)
    return resnet.ResNet(resnet.BasicBlock, (1, 1, 1, 1), num_classes=5, width=4)


@cpu_only
def test_every_batch_norm_relu_of_a_resnet_fuses():
    from pyflow.ops.normalization import BatchNormAddRelu
    model = _resnet()
    graph = fuse_batch_norm_relu(trace(lambda x: model(x), [pf.randn(2, 3, 16, 16)]))
    targets = _targets(graph.nodes)
    # the stem's bn+relu, and in each of 4 blocks bn1+relu and bn2+add+relu
    assert targets.count(BatchNormAddRelu) == 9
    assert "batchnorm" in graph.history[-1][1] and "+add_" in graph.history[-1][1]


class ResNetStep(nn.Graph):
    def __init__(self, model, opt, fuse):
        super().__init__()
        self.model = model
        self.add_optimizer(opt)
        self.config.allow_fuse_batch_norm_relu(fuse)

    def build(self, x, y):
        loss = F.cross_entropy(self.model(x), y)
        loss.backward()
        return loss


@cpu_only
def test_fused_resnet_graph_trains_as_eager():
    rng = np.random.default_rng(0)
    x = pf.tensor(rng.standard_normal((4, 3, 16, 16)).astype(np.float32))
    y = pf.tensor(rng.integers(0, 5, 4))
    eager, fused = _resnet(), _resnet()
    opt = pf.optim.SGD(eager.parameters(), lr=0.1, momentum=0.9)
    step = ResNetStep(fused, pf.optim.SGD(fused.parameters(), lr=0.1, momentum=0.9), True)
    for _ in range(3):
        opt.zero_grad()
        loss = F.cross_entropy(eager(x), y)
        loss.backward()
        opt.step()
        np.testing.assert_allclose(to_numpy(step(x, y)), to_numpy(loss), rtol=1e-5, atol=1e-6)
    for (name, a), b in zip(eager.state_dict().items(), fused.state_dict().values()):
        np.testing.assert_allclose(to_numpy(b), to_numpy(a), rtol=1e-4, atol=1e-5, err_msg=name)
    assert "BatchNormAddRelu" in str(step.plans[0].stages[-1][1])
