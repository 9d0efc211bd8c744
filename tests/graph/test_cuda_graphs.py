"""One CUDA graph per step (pyflow.graph.cuda_graph).

On the cuda device (the simulator pass, ``make test-cuda-sim``) the captured
step runs through ``pyflow/_simcapture.py``, a capture with CUDA's rules: work
is recorded and not run while capturing, host reads are refused, and a replay
runs the recording into the captured arrays.  Captured and uncaptured steps
must give the same numbers, step after step, with new inputs each time.  On
the cpu device nothing is captured, and ``explain`` says so.
"""
import numpy as np
import pytest

import pyflow
import pyflow.nn as nn
import pyflow.nn.functional as F
from pyflow.graph import cuda_graph
from pyflow.ops.loss import CrossEntropy

ON_CUDA = pyflow.get_default_device().type == "cuda"
cuda_only = pytest.mark.skipif(not ON_CUDA, reason="captures on the cuda device: run by the "
                                                   "simulator pass (make test-cuda-sim)")


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 8)
        self.l1 = nn.Linear(8, 16)
        self.ln = nn.LayerNorm(16)
        self.drop = nn.Dropout(0.25)
        self.l2 = nn.Linear(16, 10)

    def forward(self, i):
        return self.l2(self.drop(F.gelu(self.ln(self.l1(self.emb(i))))))


class Step(nn.Graph):
    def __init__(self, net, opt, cuda_graphs, accumulation=1):
        super().__init__()
        self.net = net
        self.add_optimizer(opt)
        self.config.allow_cuda_graphs(cuda_graphs)
        self.config.set_gradient_accumulation_steps(accumulation)

    def build(self, i, t):
        logits = self.net(i)
        loss = F.cross_entropy(logits, t)
        loss.backward()
        return loss, logits


def _batches(n, rows=4):
    rng = np.random.default_rng(1)
    return [(pyflow.tensor(rng.integers(0, 10, (rows,))), pyflow.tensor(rng.integers(0, 10, (rows,))))
            for _ in range(n)]


def _train(cuda_graphs, steps=4, accumulation=1):
    pyflow.manual_seed(0)
    net = Net()
    step = Step(net, pyflow.optim.AdamW(net.parameters(), lr=1e-2), cuda_graphs, accumulation)
    outs = [step(i, t) for i, t in _batches(steps, 4 * accumulation)]
    return step, outs, [p.detach().cpu().numpy() for p in net.parameters()]


def _plan(graph):
    (plan,) = graph._plans.values()
    return plan


@pytest.fixture(scope="module")
def uncaptured():
    """Four steps with CUDA graphs off: the reference (trained once per module)."""
    return _train(False)


@cuda_only
def test_captured_steps_give_the_uncaptured_numbers(uncaptured):
    g, outs, params = _train(True)
    ref, ref_outs, ref_params = uncaptured
    # (compared after the last step: what a step handed out survives the replays after it)
    for (loss, logits), (ref_loss, ref_logits) in zip(outs, ref_outs):
        assert float(loss) == float(ref_loss)
        np.testing.assert_array_equal(logits.cpu().numpy(), ref_logits.cpu().numpy())
    for p, r in zip(params, ref_params):
        np.testing.assert_array_equal(p, r)
    units = _plan(g).captured_units()
    segs = [u for u in units if isinstance(u, cuda_graph.Segment)]
    assert segs and all(s.graph is not None for s in segs)       # captured, then replayed
    assert sum(len(s.members) for s in segs) >= 10
    # what stays outside: the seed and its dropout, the ops that read targets or
    # indices on the host (and their backwards), .grad, the optimizer
    outside = {u.node.kind for u in units if not isinstance(u, cuda_graph.Segment)}
    assert outside == {"seed", "call", "fn", "backward", "set_grad", "update"}
    assert not _plan(g).refused_capture
    assert "cuda graphs: 6 captured segment(s) holding 13 of 29 nodes" in pyflow.explain(g)
    # the opt-out captured nothing
    assert _plan(ref).captured_units() is None
    assert "cuda graphs: off (graph.config.allow_cuda_graphs(False))" in pyflow.explain(ref)


@cuda_only
def test_gradient_accumulation_keeps_each_micro_batch_gradient():
    _, outs, params = _train(True, steps=2, accumulation=2)     # warm-up, capture, 2 replays
    _, ref_outs, ref_params = _train(False, steps=2, accumulation=2)
    assert [float(o[0]) for o in outs] == [float(o[0]) for o in ref_outs]
    for p, r in zip(params, ref_params):
        np.testing.assert_array_equal(p, r)


@cuda_only
def test_a_node_that_reads_on_the_host_is_found_while_capturing(monkeypatch, uncaptured):
    monkeypatch.delattr(CrossEntropy, "reads_on_host")    # undeclared: found by the capture
    g, outs, params = _train(True)
    _, ref_outs, ref_params = uncaptured
    assert [float(o[0]) for o in outs] == [float(o[0]) for o in ref_outs]
    for p, r in zip(params, ref_params):
        np.testing.assert_array_equal(p, r)
    plan = _plan(g)
    assert list(plan.refused_capture.values()) == ["crossentropy_8"]
    assert "refused while capturing (they read device data on the host): crossentropy_8" in \
        pyflow.explain(g)
    segs = [u for u in plan.captured_units() if isinstance(u, cuda_graph.Segment)]
    assert all(s.graph is not None for s in segs)


@pytest.mark.cpu_only           # the cuda device's explain is checked with its captures above
def test_explain_says_whether_the_step_is_captured():
    g, _, _ = _train(True, steps=1)
    assert "cuda graphs: not used: the step's tensors are not all local on one cuda " \
           "device" in pyflow.explain(g)
    assert _plan(g).captured_units() is None


@pytest.mark.cpu_only           # a graph config's signature: the same on every device
def test_cuda_graphs_are_part_of_the_signature():
    pyflow.manual_seed(0)
    net = Net()
    g = Step(net, pyflow.optim.SGD(net.parameters(), lr=0.1), True)
    i, t = _batches(1)[0]
    g(i, t)
    g.config.allow_cuda_graphs(False)
    g(i, t)
    assert len(g._plans) == 2
    assert sorted(p.cuda_graphs for p in g._plans.values()) == [False, True]


# ------------------------------------------------------------------ the simulator's capture
@cuda_only
def test_simulated_capture_records_work_and_refuses_host_reads():
    from pyflow.device import backend_of
    from pyflow._simcapture import CaptureError, SimulatedDeviceArray
    from pyflow.kernels import registry
    be = backend_of("cuda")
    xp = be.xp
    a = be.to_device(np.arange(6, dtype=np.float32))
    b = be.to_device(np.ones(6, dtype=np.float32))
    out = be.zeros((6,), np.float32)
    scale = 2.0
    be.begin_capture()
    try:
        c = xp.multiply(a, scale)                       # a new array: made, poisoned
        assert np.isnan(c.view(np.ndarray)).all()
        registry.get("add", "cuda")(c, b, out=out)      # a kernel launch: recorded, not run
        assert (out.view(np.ndarray) == 0).all()
        row_sums = out.reshape(2, 3).sum(axis=1)        # a view, then a reduction
        out[0] = 7                                      # item assignment: recorded
        for read in (lambda: float(row_sums[0]), lambda: be.to_host(out), lambda: bool(a.any()),
                     lambda: xp.asarray(np.ones(3, np.float32)), lambda: out[out > 1]):
            with pytest.raises(CaptureError, match="while capturing a CUDA graph"):
                read()
    finally:
        graph = be.end_capture()
    assert "__getitem__" not in SimulatedDeviceArray.__dict__     # the class is itself again
    assert "to_host" not in vars(be)
    graph.launch()
    np.testing.assert_array_equal(out.view(np.ndarray), [7, 3, 5, 7, 9, 11])
    np.testing.assert_array_equal(row_sums.view(np.ndarray), [9, 27])   # summed before out[0] = 7
    a[...] = 10                     # new data in the captured input: the replay reads it
    scale = 3.0                     # a host value changed after capture: the replay keeps 2.0
    graph.launch()
    np.testing.assert_array_equal(out.view(np.ndarray), [7, 21, 21, 21, 21, 21])
    assert scale == 3.0
