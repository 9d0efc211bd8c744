"""Kernels compiled for the threads and for one thread (kernels/cpu/twin.py)
give the same numbers: which one runs depends on sizes only.  Every op below
runs once with every twin on the threads and once with every twin on one
thread (the thresholds patched), forward and backward.  Bit for bit, except
the fast-math activation loops (GELU, SiLU: activation.py), which LLVM may
vectorize differently in the two compilations: there the backward differs in
the last bit or two (it did before twin.py too, with two copies of the source)."""
import numpy as np
import pytest

import pyflow as pf
import pyflow.nn.functional as F
from pyflow.kernels.cpu import activation, index, twin

pytestmark = pytest.mark.cpu_only


def _ops(activations=False):
    rng = np.random.default_rng(0)

    def t(*shape, grad=True):
        return pf.tensor(rng.standard_normal(shape).astype(np.float32), requires_grad=grad)
    x2, x4 = t(6, 40), t(2, 3, 8, 8)
    w, b = t(40), t(40)
    bn_w, bn_b = t(3), t(3)
    emb = t(11, 5)
    idx = pf.tensor(rng.integers(0, 11, (4, 6)))
    target = pf.tensor(rng.integers(0, 40, 6))
    lin_w, lin_b = t(7, 40), t(7)
    src = t(5, 9)
    gidx = pf.tensor(rng.integers(0, 9, (5, 4)))
    leaves = [x2, x4, w, b, bn_w, bn_b, emb, lin_w, lin_b, src]
    outs = [
        F.layer_norm(x2, (40,), w, b),
        F.softmax(x2, dim=-1), F.log_softmax(x2, dim=0), F.softmax(x4, dim=1),
        F.cross_entropy(x2, target), F.nll_loss(F.log_softmax(x2, -1), target),
        F.cross_entropy(x2, target, label_smoothing=0.1),
        F.embedding(idx, emb),
        F.batch_norm(x4, None, None, bn_w, bn_b, training=True),
        F.max_pool2d(x4, 2), F.avg_pool2d(x4, 3, stride=2, padding=1),
        F.linear(x2, lin_w, lin_b),
        pf.gather(src, 1, gidx), src.index_select(1, pf.tensor([0, 3, 3, 8])),
        F.rms_norm(x2, (40,), w), *F.fused_add_layer_norm(x2, x2 * 2.0, (40,), w, b),
    ]
    if activations:
        outs = [F.gelu(x2), F.silu(x4), F.gelu(x4, approximate="tanh"),
                F.fused_bias_add_gelu(x2, b), F.fused_bias_add_gelu(x2, w, approximate="tanh")]
    pf.manual_seed(0)
    outs.append(F.dropout(x2, 0.3))
    outs.append(F.fused_bias_dropout_add(x2, b, x2 * 2.0, p=0.3))
    loss = sum((o.float() * (k + 1)).sum() for k, o in enumerate(outs))
    loss.backward()
    return [o.detach().numpy() for o in outs] + [leaf.grad.numpy() for leaf in leaves
                                                  if leaf.grad is not None]


def _both(monkeypatch, activations):
    results = []
    for threshold in (0, 1 << 62):          # every twin on the threads; every one on one
        with monkeypatch.context() as m:
            m.setattr(twin, "PARALLEL_MIN", threshold)
            m.setattr(activation, "PARALLEL_MIN", threshold)
            m.setattr(index, "_PARALLEL_MIN", threshold)
            results.append(_ops(activations))
    assert len(results[0]) == len(results[1]) > 3
    return zip(*results)


def test_threads_and_one_thread_agree(monkeypatch):
    for k, (a, b) in enumerate(_both(monkeypatch, False)):
        np.testing.assert_array_equal(a, b, err_msg=f"result {k}")


def test_activation_loops_agree_to_the_last_bits(monkeypatch):
    for k, (a, b) in enumerate(_both(monkeypatch, True)):
        np.testing.assert_allclose(a, b, rtol=4e-7, atol=1e-7, err_msg=f"result {k}")


def test_the_work_decides():
    calls = []

    class Spy:
        def __init__(self, name):
            self.name = name

        def __call__(self, *args):
            calls.append(self.name)
    k = twin.Twin.__new__(twin.Twin)
    k.size_of, k.parallel, k.serial = 1, Spy("parallel"), Spy("serial")
    k(np.empty(1), np.empty(twin.PARALLEL_MIN))
    k(np.empty(twin.PARALLEL_MIN), np.empty(twin.PARALLEL_MIN - 1))
    assert calls == ["parallel", "serial"]
