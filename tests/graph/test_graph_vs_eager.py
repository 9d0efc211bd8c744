"""nn.Graph against eager mode: the same losses and parameters over several
training steps with fresh batches every step (a value baked into the graph
would show), for both executors, SGD and AdamW; inference graphs; one plan
per input signature; gradient accumulation."""
import numpy as np
import pytest

import pyflow as pf
from bench.models_both import small_cnn, transformer_block
from tests.helpers import executors

# "actors" merges each stream's consecutive actors into chains (the default);
# "actors-per-op" keeps one actor per op (pyflow.runtime.chains).
EXECUTORS = executors("sequential", "actors", "actors-per-op")


def set_executor(graph, executor):
    graph.config.set_executor("actors" if executor == "actors-per-op" else executor)
    graph.config.allow_fuse_actor_chains(executor != "actors-per-op")


def mlp():
    return pf.nn.Sequential(pf.nn.Linear(12, 32), pf.nn.GELU(), pf.nn.Linear(32, 32),
                            pf.nn.ReLU(), pf.nn.Linear(32, 5))


class TrainGraph(pf.nn.Graph):
    def __init__(self, model, loss_fn, optimizer, executor):
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn
        self.add_optimizer(optimizer)
        set_executor(self, executor)

    def build(self, x, y):
        loss = self.loss_fn(self.model(x), y)
        loss.backward()
        return loss


def _pair(make, seed=0):
    pf.manual_seed(seed)
    a = make()
    pf.manual_seed(seed)
    b = make()
    return a, b


def _optimizers(name, m1, m2):
    if name == "sgd":
        return (pf.optim.SGD(m1.parameters(), lr=0.05, momentum=0.9),
                pf.optim.SGD(m2.parameters(), lr=0.05, momentum=0.9))
    return (pf.optim.AdamW(m1.parameters(), lr=3e-3), pf.optim.AdamW(m2.parameters(), lr=3e-3))


def _lockstep(eager, opt, graph, batches, loss_fn=pf.nn.functional.cross_entropy, rtol=1e-5):
    """Train ``eager`` with ``opt`` and call ``graph`` on the same batches;
    the losses must agree at every step."""
    for x, y in batches:
        opt.zero_grad()
        expected = loss_fn(eager(x), y)
        expected.backward()
        opt.step()
        np.testing.assert_allclose(float(graph(x, y)), float(expected), rtol=rtol, atol=1e-6)


def _same_parameters(a, b, rtol=1e-5):
    for (name, p1), p2 in zip(a.named_parameters(), b.parameters()):
        np.testing.assert_allclose(p2.detach().cpu().numpy(), p1.detach().cpu().numpy(),
                                   rtol=rtol, atol=1e-6, err_msg=name)


def _train_both(make, loss_fn, batches, opt_name, executor, rtol=1e-5):
    eager, graphed = _pair(make)
    o1, o2 = _optimizers(opt_name, eager, graphed)
    graph = TrainGraph(graphed, loss_fn, o2, executor)
    _lockstep(eager, o1, graph, batches, loss_fn, rtol)
    for (name, p1), p2 in zip(eager.named_parameters(), graphed.parameters()):
        np.testing.assert_allclose(p2.detach().cpu().numpy(), p1.detach().cpu().numpy(),
                                   rtol=rtol, atol=1e-6, err_msg=name)
        np.testing.assert_allclose(p2.grad.cpu().numpy(), p1.grad.cpu().numpy(),
                                   rtol=rtol, atol=1e-6, err_msg=name + ".grad")
    return graph


def _class_batches(shape, classes, steps=3, seed=1):
    rng = np.random.default_rng(seed)
    return [(pf.tensor(rng.standard_normal(shape).astype(np.float32)),
             pf.tensor(rng.integers(0, classes, shape[0]))) for _ in range(steps)]


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("opt", ["sgd", "adamw"])
def test_mlp_training_matches_eager(executor, opt):
    graph = _train_both(mlp, pf.nn.CrossEntropyLoss(), _class_batches((16, 12), 5), opt,
                        executor)
    assert len(graph.plans) == 1


class HostBatchGraph(pf.nn.Graph):
    """Host batches moved to the model's device inside build(), the loss
    returned on the host: the copies run on the ``copy`` stream, and on a GPU
    CUDA events link it to ``compute`` (pyflow.runtime.device)."""

    def __init__(self, model, optimizer, executor):
        super().__init__()
        self.model = model
        self.add_optimizer(optimizer)
        set_executor(self, executor)

    def build(self, x, y):
        device = pf.get_default_device()
        loss = pf.nn.functional.cross_entropy(self.model(x.to(device)), y.to(device))
        loss.backward()
        return loss.to("cpu")


@pytest.mark.parametrize("executor", EXECUTORS)
def test_host_batches_moved_to_the_device_inside_the_graph(executor):
    eager, graphed = _pair(mlp)
    o1, o2 = _optimizers("sgd", eager, graphed)
    graph = HostBatchGraph(graphed, o2, executor)
    device = pf.get_default_device()
    for x, y in _class_batches((16, 12), 5, steps=4):
        x, y = x.to("cpu"), y.to("cpu")
        o1.zero_grad()
        expected = pf.nn.functional.cross_entropy(eager(x.to(device)), y.to(device))
        expected.backward()
        o1.step()
        loss = graph(x, y)
        assert loss.device.type == "cpu"
        np.testing.assert_allclose(float(loss), float(expected), rtol=1e-5, atol=1e-6)
    _same_parameters(eager, graphed)
    if device.type != "cpu" and executor != "sequential":
        streams = {spec.stream for spec in graph.plans[0].task_graph[0].specs.values()}
        assert "copy" in streams


@pytest.mark.cpu_only       # minutes in the cuda simulator; the MLP and BN tests cover cuda
@pytest.mark.parametrize("executor", EXECUTORS)
def test_small_cnn_training_matches_eager(executor):
    _train_both(lambda: small_cnn(pf.nn), pf.nn.CrossEntropyLoss(),
                _class_batches((4, 1, 28, 28), 10, steps=2), "adamw", executor, rtol=1e-4)


@pytest.mark.cpu_only
@pytest.mark.parametrize("executor", EXECUTORS)
def test_transformer_block_training_matches_eager(executor):
    rng = np.random.default_rng(2)
    batches = [(pf.tensor(rng.standard_normal((2, 8, 32)).astype(np.float32)),
                pf.tensor(rng.standard_normal((2, 8, 32)).astype(np.float32)))
               for _ in range(2)]
    _train_both(lambda: transformer_block(pf.nn, d=32, heads=4), pf.nn.MSELoss(), batches,
                "adamw", executor, rtol=1e-4)


class InferenceGraph(pf.nn.Graph):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def build(self, x):
        return self.model(x).softmax(-1)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_inference_graph_one_plan_per_shape(executor):
    pf.manual_seed(0)
    model = mlp()
    graph = InferenceGraph(model)
    set_executor(graph, executor)
    rng = np.random.default_rng(3)
    for batch in (4, 4, 7, 4, 7):
        x = pf.tensor(rng.standard_normal((batch, 12)).astype(np.float32))
        with pf.no_grad():
            expected = model(x).softmax(-1)
        np.testing.assert_allclose(graph(x).cpu().numpy(), expected.cpu().numpy(), rtol=1e-6)
    assert len(graph.plans) == 2          # batch 4 and batch 7


def test_train_eval_switch_compiles_a_new_plan():
    pf.manual_seed(0)
    model = pf.nn.Sequential(pf.nn.Linear(6, 6), pf.nn.Dropout(0.5))
    graph = InferenceGraph(model)
    x = pf.randn(3, 6)
    model.eval()
    with pf.no_grad():
        np.testing.assert_allclose(graph(x).cpu().numpy(), model(x).softmax(-1).cpu().numpy(),
                                   rtol=1e-6)
    model.train()
    graph(x)
    assert len(graph.plans) == 2


def test_dropout_in_a_graph_draws_the_eager_masks():
    """Each run draws fresh seeds from the generator, in eager order."""
    def make():
        return pf.nn.Sequential(pf.nn.Linear(6, 16), pf.nn.Dropout(0.3), pf.nn.Linear(16, 3))
    batches = [(pf.randn(5, 6), pf.randint(0, 3, (5,))) for _ in range(3)]
    eager, graphed = _pair(make)
    o1, o2 = _optimizers("sgd", eager, graphed)
    graph = TrainGraph(graphed, pf.nn.CrossEntropyLoss(), o2, "actors")
    for x, y in batches:
        pf.manual_seed(100)
        o1.zero_grad()
        l1 = pf.nn.functional.cross_entropy(eager(x), y)
        l1.backward()
        o1.step()
        pf.manual_seed(100)
        l2 = graph(x, y)
        np.testing.assert_allclose(float(l2), float(l1), rtol=1e-6)
    # different seeds give different masks, so the loss differs
    pf.manual_seed(1)
    a = float(graph(*batches[0]))
    pf.manual_seed(2)
    b = float(graph(*batches[0]))
    assert a != b


@pytest.mark.parametrize("executor", EXECUTORS)
def test_gradient_accumulation_equals_the_full_batch(executor):
    x, y = _class_batches((8, 12), 5, steps=1)[0]
    eager, graphed = _pair(mlp)
    o1, o2 = _optimizers("sgd", eager, graphed)
    graph = TrainGraph(graphed, pf.nn.CrossEntropyLoss(), o2, executor)
    graph.config.set_gradient_accumulation_steps(2)
    _lockstep(eager, o1, graph, [(x, y)] * 2)
    _same_parameters(eager, graphed)
    with pytest.raises(ValueError, match="not a multiple of 2"):
        graph(pf.randn(5, 12), pf.randint(0, 5, (5,)))


@pytest.mark.parametrize("executor", EXECUTORS)
def test_batch_norm_running_statistics_and_in_place_ops(executor):
    """batch_norm updates its buffers on every call (traced through: its
    running statistics are assign nodes, its backward a node of the autograd
    pass); in-place ops on intermediates and on a registered buffer are recorded."""
    class Net(pf.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = pf.nn.Conv2d(2, 4, 3, padding=1)
            self.bn = pf.nn.BatchNorm2d(4)
            self.fc = pf.nn.Linear(4 * 5 * 5, 3)
            self.register_buffer("calls", pf.zeros(1))

        def forward(self, x):
            h = self.bn(self.conv(x))
            h.relu_()
            self.calls.add_(1.0)
            return self.fc(h.flatten(1)) * 2.0

    batches = _class_batches((6, 2, 5, 5), 3, steps=3)
    eager, graphed = _pair(Net)
    o1, o2 = _optimizers("sgd", eager, graphed)
    graph = TrainGraph(graphed, pf.nn.CrossEntropyLoss(), o2, executor)
    _lockstep(eager, o1, graph, batches)
    for name, b1 in eager.named_buffers():
        b2 = dict(graphed.named_buffers())[name]
        np.testing.assert_allclose(b2.cpu().numpy(), b1.cpu().numpy(), rtol=1e-5, err_msg=name)
    assert float(graphed.calls) == 3.0
    nodes = graph.plans[0].graph.nodes
    from pyflow.ops.normalization import BatchNorm
    assert [n for n in nodes if n.kind == "call" and n.target is BatchNorm]
    # batch_norm and cross_entropy are traced through: no node runs with eager autograd
    assert not [n for n in nodes if n.kind == "fn" and n.attrs.get("differentiable")]
    written = {n.attrs["state"].name for n in nodes if n.kind == "assign"}
    assert {"model.bn.running_mean", "model.bn.running_var"} <= written, written


@pytest.mark.parametrize("executor", EXECUTORS)
def test_a_graph_checks_every_calls_class_targets(executor):
    """cross_entropy is traced through, and its target check runs in the loss
    node: a later call with a class index out of range is an error, not a
    wrong loss."""
    model = mlp()
    graph = TrainGraph(model, pf.nn.CrossEntropyLoss(), pf.optim.SGD(model.parameters(), lr=0.1),
                       executor)
    x = pf.randn(4, 12)
    graph(x, pf.tensor([0, 1, 2, 3]))
    with pytest.raises(Exception, match=r"target 7 is out of bounds for 5 classes"):
        graph(x, pf.tensor([0, 7, 2, 3]))


@pytest.mark.slow
@pytest.mark.parametrize("registers", [1, pytest.param(2, marks=pytest.mark.cpu_only),
                                       pytest.param(3, marks=pytest.mark.cpu_only)])
def test_pipelined_batches_equal_step_by_step(registers):
    """run_batches overlaps loading and compute across iterations; feedback
    edges from the optimizer update and the buffer writes keep it exact."""
    class Net(pf.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = pf.nn.Linear(12, 16), pf.nn.Linear(16, 5)
            self.bn = pf.nn.BatchNorm1d(16)
            self.register_buffer("seen", pf.zeros(1))

        def forward(self, x):
            self.seen.add_(1.0)
            return self.fc2(self.bn(self.fc1(x)).relu())

    batches = _class_batches((8, 12), 5, steps=5, seed=4)
    a, b = _pair(Net)
    oa, ob = _optimizers("adamw", a, b)
    stepwise = TrainGraph(a, pf.nn.CrossEntropyLoss(), oa, "actors")
    piped = TrainGraph(b, pf.nn.CrossEntropyLoss(), ob, "actors")
    expected = [float(stepwise(x, y)) for x, y in batches]
    losses = [float(l) for l in piped.run_batches(iter(batches), registers=registers)]
    np.testing.assert_allclose(losses, expected, rtol=1e-6)
    for (name, p1), p2 in zip(a.state_dict().items(), b.state_dict().values()):
        np.testing.assert_allclose(p2.cpu().numpy(), p1.cpu().numpy(), rtol=1e-6, err_msg=name)
    assert float(b.seen) == 5.0
    with pytest.raises(Exception, match="drop_last"):
        piped.run_batches([batches[0], (pf.randn(3, 12), pf.randint(0, 5, (3,)))])


@pytest.mark.parametrize("executor", EXECUTORS)
def test_add_to_output_fusion_matches_eager(executor):
    """Residual adds into Linear outputs become in-place AddToOutput nodes."""
    class Residual(pf.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2, self.head = (pf.nn.Linear(12, 12), pf.nn.Linear(12, 12),
                                             pf.nn.Linear(12, 5))

        def forward(self, x):
            h = self.fc1(x) + x
            h = self.fc2(h.relu()) + h
            return self.head(h)

    batches = _class_batches((8, 12), 5, steps=3, seed=5)
    eager, graphed = _pair(Residual)
    o1, o2 = _optimizers("adamw", eager, graphed)
    graph = TrainGraph(graphed, pf.nn.CrossEntropyLoss(), o2, executor)
    graph.config.allow_fuse_add_to_output(True)
    _lockstep(eager, o1, graph, batches)
    names = [n.op_name for n in graph.plans[0].graph.nodes]
    assert names.count("AddToOutput") == 2
    _same_parameters(eager, graphed)


def test_average_pools_in_a_graph_match_eager():
    """avg_pool2d / adaptive_avg_pool2d hand window tables to their Function as
    arrays: each is one recorded node, not a refused raw-array call."""
    nn = pf.nn
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.AvgPool2d(2), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(4, 2))

    class Infer(nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = model

        def build(self, x):
            return self.model(x)
    x = pf.randn(2, 3, 9, 9)
    np.testing.assert_allclose(Infer()(x).cpu().numpy(), model(x).detach().cpu().numpy(),
                               rtol=1e-6)
