"""Run with NUMBA_ENABLE_CUDASIM=1: one training step of each model of the zoo on
the ``cuda`` device (numba's simulator) equals the same step on the CPU.

Tiny configurations (the simulator runs every CUDA thread as an OS thread),
float32 (ResNet float64), SGD; eager mode for all three and graph mode for GPT; and
``Module.to(device)`` moving parameters and buffers.  Prints
``N checks, F failures``.
"""
import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np  # noqa: E402

import pyflow  # noqa: E402
from models.bert import BertConfig, BertForPreTraining  # noqa: E402
from models.gpt import GPT, GPTConfig  # noqa: E402
from models.resnet import BasicBlock, ResNet  # noqa: E402

assert pyflow.cuda.is_available(), "run with NUMBA_ENABLE_CUDASIM=1"
checks, failures = 0, []


def step_on(device, make, batch, loss_fn, graph=False):
    pyflow.manual_seed(0)
    model = make().to(device)
    if batch[0].dtype == np.float64:
        model.double()
    opt = pyflow.optim.SGD(model.parameters(), lr=0.1)
    batch = [pyflow.tensor(a).to(device) for a in batch]
    if graph:
        class Step(pyflow.nn.Graph):
            def __init__(self):
                super().__init__()
                self.model = model
                self.add_optimizer(opt)

            def build(self, *b):
                loss = loss_fn(self.model, *b)
                loss.backward()
                return loss
        loss = Step()(*batch)
    else:
        loss = loss_fn(model, *batch)
        loss.backward()
        opt.step()
    return float(loss.cpu()), {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()}


def check(name, make, batch, loss_fn, graph=False):
    global checks
    checks += 1
    try:
        want_loss, want = step_on("cpu", make, batch, loss_fn, graph)
        got_loss, got = step_on("cuda", make, batch, loss_fn, graph)
        np.testing.assert_allclose(got_loss, want_loss, rtol=1e-4)
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-3, atol=1e-5, err_msg=k)
    except Exception:  # noqa: BLE001 (report every failing check)
        failures.append(f"{name}: {traceback.format_exc()}")


def module_to_device():
    """``net.to(device)`` / ``cuda()`` / ``cpu()`` move every parameter and buffer,
    keeping the Parameter objects (optimizers hold them)."""
    net = pyflow.nn.Sequential(pyflow.nn.Linear(3, 2), pyflow.nn.BatchNorm1d(2))
    w = net[0].weight
    assert net.cuda() is net and w.device.type == "cuda" and net[0].weight is w
    assert net[1].running_mean.device.type == "cuda"
    assert net.to("cpu") is net and w.device.type == "cpu"
    assert net[1].running_mean.device.type == "cpu"


checks += 1
try:
    module_to_device()
except Exception:  # noqa: BLE001
    failures.append(f"module to device: {traceback.format_exc()}")

rng = np.random.default_rng(0)
gpt_config = GPTConfig(block_size=8, vocab_size=16, n_layer=1, n_head=2, n_embd=8, dropout=0.0)
gpt_batch = (rng.integers(0, 16, (2, 8)), rng.integers(0, 16, (2, 8)))


def gpt_loss(model, x, y):
    return model(x, y)[1]


check("gpt eager", lambda: GPT(gpt_config), gpt_batch, gpt_loss)
check("gpt graph", lambda: GPT(gpt_config), gpt_batch, gpt_loss, graph=True)

bert_config = BertConfig.tiny(vocab_size=16, hidden_size=8, num_hidden_layers=1,
                              num_attention_heads=2, intermediate_size=16,
                              max_position_embeddings=8, hidden_dropout_prob=0.0,
                              attention_probs_dropout_prob=0.0)
ids = rng.integers(1, 16, (2, 6))
labels = np.where(rng.random((2, 6)) < 0.5, rng.integers(0, 16, (2, 6)), -100)
bert_batch = (ids, np.zeros((2, 6), np.int64), np.ones((2, 6), np.int64), labels, np.arange(2))
check("bert eager", lambda: BertForPreTraining(bert_config), bert_batch,
      lambda m, *b: m(*b)[2])

# float64: with 2 images the last stages' BatchNorm normalizes over two numbers,
# which magnifies float32 rounding differences beyond any useful tolerance
resnet_batch = (rng.standard_normal((2, 3, 8, 8)), rng.integers(0, 3, 2))
check("resnet eager", lambda: ResNet(BasicBlock, [1, 1, 1, 1], num_classes=3, width=2),
      resnet_batch, lambda m, x, y: pyflow.nn.functional.cross_entropy(m(x), y))

for f in failures:
    print("FAILED", f)
print(f"{checks} checks, {len(failures)} failures")
sys.exit(1 if failures else 0)
