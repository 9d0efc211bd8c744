"""Run under ``mpirun -n N python parallel_worker.py``: the model zoo's BERT and
ResNet trained with parallelism expressed through SBP equal one rank.

Each case builds the model twice from one seed, trains the reference on one
rank (every rank computes it whole) and the other with global parameters and
batches, and compares every step's loss and the final parameters.  BERT: data
parallel (parameters broadcast, batch split) in eager mode, tensor parallel
(Megatron's split of each layer's feed-forward) in graph mode, and on 4 ranks
data x tensor parallel on a 2x2 grid.  ResNet-18 (narrow): data parallel in
eager and graph mode, BatchNorm's running statistics included.  float64, SGD
with momentum, dropout off.  Ends with ``rank r: N checks, F failures``.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tests.rank_checks import RankChecks  # noqa: E402

import numpy as np  # noqa: E402

import pyflow  # noqa: E402
from models.bert import BertConfig, BertForPreTraining  # noqa: E402
from models.resnet import BasicBlock, ResNet  # noqa: E402
from pyflow.distributed import env, placement  # noqa: E402

RANK, SIZE = env.get_rank(), env.get_world_size()
B, S = pyflow.sbp.broadcast, pyflow.sbp.split
check = RankChecks(RANK)


def bert_megatron(name):
    if ".intermediate.dense." in name:
        return S(0)
    if ".output.dense.weight" in name and ".attention." not in name:
        return S(1)
    return B


def make_global(model, plc, sbp_of):
    whole = (B,) * plc.ndim
    for name, p in list(model.named_parameters()):
        p.data = p.detach().to_global(plc, whole).to_global(sbp=sbp_of(name))
    for b in model.buffers():
        b.data = b.to_global(plc, whole)


class Step(pyflow.nn.Graph):
    def __init__(self, model, opt, loss_fn):
        super().__init__()
        self.model, self.loss_fn = model, loss_fn
        self.add_optimizer(opt)
        self.config.set_executor("sequential")

    def build(self, *batch):
        loss = self.loss_fn(self.model, *batch)
        loss.backward()
        return loss


def train_both(make_model, loss_fn, batches, plc, param_sbp, batch_sbp, graph):
    pyflow.manual_seed(0)
    ref = make_model().double()
    pyflow.manual_seed(0)
    model = make_model().double()
    make_global(model, plc, param_sbp)
    opts = [pyflow.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in (ref, model)]
    step = Step(model, opts[1], loss_fn) if graph else None
    whole = (B,) * plc.ndim
    for batch in batches:
        opts[0].zero_grad()
        want = loss_fn(ref, *[pyflow.tensor(a) for a in batch])
        want.backward()
        opts[0].step()
        glob = [pyflow.tensor(a).to_global(plc, whole).to_global(sbp=batch_sbp) for a in batch]
        if graph:
            got = step(*glob)
        else:
            opts[1].zero_grad()
            got = loss_fn(model, *glob)
            got.backward()
            opts[1].step()
        got = got.to_global(sbp=whole).to_local().detach().numpy()
        np.testing.assert_allclose(got, want.detach().numpy(), rtol=1e-9)
    for (name, a), b in zip(ref.state_dict().items(), model.state_dict().values()):
        b = b.to_global(sbp=whole).to_local() if b.is_global else b
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-8, atol=1e-12, err_msg=name)


def bert_case(plc, param_sbp, batch_sbp, graph):
    config = BertConfig.tiny(num_hidden_layers=1, hidden_dropout_prob=0.0,
                             attention_probs_dropout_prob=0.0)
    rng = np.random.default_rng(0)
    batches = []
    for _ in range(2):
        n, T = 4, 8
        ids = rng.integers(1, config.vocab_size, (n, T))
        labels = np.where(rng.random((n, T)) < 0.3, rng.integers(0, config.vocab_size, (n, T)),
                          -100)
        batches.append((ids, np.zeros((n, T), np.int64), np.ones((n, T), np.int64), labels,
                        np.arange(n) % 2))

    def loss_fn(model, ids, types, mask, labels, nsp):
        return model(ids, types, mask, labels, nsp)[2]
    train_both(lambda: BertForPreTraining(config), loss_fn, batches, plc, param_sbp, batch_sbp,
               graph)


def resnet_case(graph):
    plc = placement("cpu", list(range(SIZE)))
    rng = np.random.default_rng(1)
    batches = [(rng.standard_normal((4, 3, 16, 16)), rng.integers(0, 10, 4)) for _ in range(2)]

    def loss_fn(model, x, y):
        return pyflow.nn.functional.cross_entropy(model(x), y)
    train_both(lambda: ResNet(BasicBlock, [1, 1, 1, 1], num_classes=10, width=4), loss_fn,
               batches, plc, lambda name: B, (S(0),), graph)


line = placement("cpu", list(range(SIZE)))
check("BERT data parallel (eager)", bert_case, line, lambda name: (B,), (S(0),), False)
check("BERT tensor parallel (graph)", bert_case, line, lambda name: (bert_megatron(name),),
      (B,), True)
if SIZE == 4:
    check("BERT data x tensor parallel on 2x2 (eager)", bert_case,
          placement("cpu", [[0, 1], [2, 3]]), lambda name: (B, bert_megatron(name)),
          (S(0), B), False)
check("ResNet data parallel (eager)", resnet_case, False)
check("ResNet data parallel (graph)", resnet_case, True)
check.report_and_exit()
