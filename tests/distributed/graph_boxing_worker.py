"""Run under ``mpirun -n N python graph_boxing_worker.py``: a compiled
tensor-parallel GPT block (models/parallel_layout.py's ``tp`` layout:
Megatron's MLP split) boxes through explicit box nodes and never enters the
eager SBP dispatch when it runs.

Each rank builds the model twice from one seed: a reference trained eagerly on
one rank, and one laid out as ``tp`` and trained by an ``nn.Graph`` (float64,
AdamW).  After the first call (the compile), the eager dispatch's entries
(``dispatch.choose``, ``forward_global``, ``backward_global``,
``box_gradient``) and eager boxing (``boxing.box``, ``boxing.boxing``) are
replaced by functions that raise; the next steps must run and equal the
reference.  ``explain`` must list the box nodes with their collective and
bytes, and ``to_dot`` draw them.  Ends with ``rank r: N checks, F failures``.
"""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tests.rank_checks import RankChecks  # noqa: E402

import numpy as np  # noqa: E402

import pyflow  # noqa: E402
import pyflow.nn.functional as F  # noqa: E402
from models.gpt import GPT, GPTConfig  # noqa: E402
from models.parallel_layout import place_model, plan, whole  # noqa: E402
from pyflow.distributed import boxing, dispatch, env  # noqa: E402

RANK, SIZE = env.get_rank(), env.get_world_size()
check = RankChecks(RANK)
CONFIG = GPTConfig(block_size=8, vocab_size=16, n_layer=1, n_head=2, n_embd=8, dropout=0.0)
EAGER_ENTRIES = [(dispatch, "choose"), (dispatch, "forward_global"),
                 (dispatch, "backward_global"), (dispatch, "box_gradient"),
                 (boxing, "box"), (boxing, "boxing")]


def loss_of(model, x, y):
    logits = model(x)
    logits = logits[0] if isinstance(logits, tuple) else logits
    return F.cross_entropy(logits.reshape(-1, CONFIG.vocab_size), y.reshape(-1))


class Step(pyflow.nn.Graph):
    def __init__(self, model, opt, executor):
        super().__init__()
        self.model = model
        self.add_optimizer(opt)
        self.config.set_executor(executor)

    def build(self, x, y):
        loss = loss_of(self.model, x, y)
        loss.backward()
        return loss


def _refuse(name):
    def refuse(*args, **kwargs):
        raise AssertionError(f"a compiled step called the eager {name}")
    return refuse


def train(executor):
    """Returns the graph after 4 steps equal to eager one-rank training, the
    last 3 with the eager dispatch refused."""
    pyflow.manual_seed(0)
    ref = GPT(CONFIG).double()
    pyflow.manual_seed(0)
    model = GPT(CONFIG).double()
    layout = plan(model, "tp", "cpu", RANK, SIZE, SIZE)
    place_model(model, layout)
    opts = [pyflow.optim.AdamW(m.parameters(), lr=1e-2) for m in (ref, model)]
    step = Step(model, opts[1], executor)
    rng = np.random.default_rng(0)
    saved = [(mod, name, getattr(mod, name)) for mod, name in EAGER_ENTRIES]
    losses = []
    try:
        for k in range(4):
            x, y = (rng.integers(0, CONFIG.vocab_size, (2, CONFIG.block_size))
                    for _ in range(2))
            opts[0].zero_grad()
            want = loss_of(ref, pyflow.tensor(x), pyflow.tensor(y))
            want.backward()
            opts[0].step()
            gx, gy = layout.place(pyflow.tensor(x)), layout.place(pyflow.tensor(y))
            got = step(gx, gy)
            if k == 0:          # compiled: from now on the eager dispatch must not run
                for mod, name, _ in saved:
                    setattr(mod, name, _refuse(name))
            losses.append((got, want))
    finally:
        for mod, name, fn in saved:
            setattr(mod, name, fn)
    for got, want in losses:        # gathered with the eager dispatch back
        np.testing.assert_allclose(whole(got).numpy(), want.detach().numpy(), rtol=1e-9)
    for (name, a), b in zip(ref.named_parameters(), model.parameters()):
        np.testing.assert_allclose(whole(b).detach().numpy(), a.detach().numpy(), rtol=1e-8,
                                   atol=1e-12, err_msg=name)
    return step


def explain_lists_box_nodes():
    step = train("sequential")
    text = pyflow.explain(step)
    graph = step.plans[0].graph
    boxes = [n for n in graph.nodes if n.kind == "box"]
    assert boxes, text
    # The row-parallel c_proj gives a partial sum, which the deduction keeps through
    # the residual add and reduce_scatters into the next layer norm; its backward
    # all_gathers the gradient (the dual rule).  Each is a node of the logical graph
    # and a line of the box list, with the ring's bytes per rank: (n-1)/n T for a
    # logical tensor of T bytes.
    forward = [n for n in boxes if not n.attrs.get("backward")]
    backward = [n for n in boxes if n.attrs.get("backward")]
    for nodes, op, src, dst in ((forward, "reduce_scatter", "P", "S(0)"),
                                (backward, "all_gather", "S(0)", "B")):
        found = [n for n in nodes if n.attrs["step"].op == op]
        assert found, (op, text)
        for n in found:
            v = n.outputs[0]
            T = int(np.prod(v.shape)) * v.dtype.itemsize
            want = T * (SIZE - 1) // SIZE
            assert n.attrs["step"].bytes == want, (n.attrs["step"], want)
            assert f"box[{src}->{dst} {op}, {want:,} bytes]" in text, text
            shape = "x".join(map(str, v.shape))
            assert re.search(rf"{re.escape(n.name)}\s+{shape} \({re.escape(src)}\) -> "
                             rf"\({re.escape(dst)}\): {op}, {want:,} bytes", text), text
    assert "box nodes (compile time; collective, bytes sent per rank):" in text, text
    assert re.search(r"box nodes total: forward [\d,]+ bytes, backward [\d,]+ bytes", text)
    assert "insert_boxing" in text, text
    dot = step.plans[0].graph
    from pyflow.graph.explain import logical_dot
    drawn = logical_dot(dot)
    assert "fillcolor=pink" in drawn and "reduce_scatter" in drawn, drawn


check("tensor-parallel GPT block, graph (actors): no eager dispatch, equals one rank",
      train, "actors")
check("explain lists the box nodes (collective, bytes)", explain_lists_box_nodes)


def global_nodes_run_as_kernels():
    """The kernel-level plan lowers the global nodes whose ops run on the pieces as
    they are (their piece shapes), and the steps above equal one rank with it."""
    step = train("sequential")
    steps = step.plans[0].runnable_steps()
    on_pieces = {k.node.id for k in steps if k.node.attrs.get("signature") is not None}
    lowered = {k.node.op_name for k in steps if k.lowered and (
        k.node.id in on_pieces or k.node.attrs.get("forward") in on_pieces)}
    assert {"Linear", "LinearBackward", "LayerNorm", "Softmax"} <= lowered, lowered
    assert not any(k.lowered for k in steps if k.kind == "box")


check("global nodes run as kernels on their pieces (sequential), equal to one rank",
      global_nodes_run_as_kernels)
check.report_and_exit()
