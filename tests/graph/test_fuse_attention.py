"""The fuse_attention pass (pyflow/graph/passes/attention.py): nanoGPT's
hand-written causal attention becomes one FusedAttention node in graph mode,
with the loss, gradients and updated parameters of eager mode and of the
unfused graph; chains that differ from the pattern in a way that matters are
left alone; off by default.  CPU only: the fused kernel is the CPU's (other devices keep the
chain, which test_graph_vs_eager covers)."""
import math

import numpy as np
import pytest

import pyflow as pf
import pyflow.nn.functional as F
from tests.helpers import executors

pytestmark = pytest.mark.cpu_only


class Attention(pf.nn.Module):
    """nanoGPT's CausalSelfAttention; ``variant`` bends one step of the pattern."""

    def __init__(self, d=16, heads=2, block=8, variant="nanogpt"):
        super().__init__()
        self.c_attn = pf.nn.Linear(d, 3 * d)
        self.c_proj = pf.nn.Linear(d, d)
        self.heads, self.d, self.variant = heads, d, variant
        self.register_buffer("bias", pf.tril(pf.ones(block, block)).view(1, 1, block, block))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.d, dim=2)
        k = k.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        q = q.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        v = v.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        if self.variant == "div":
            att = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
        elif self.variant == "no_scale":
            att = q @ k.transpose(-2, -1)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        fill = -1e9 if self.variant == "finite_fill" else float("-inf")
        if self.variant != "no_mask":
            att = att.masked_fill(self.bias[:, :, :T, :T] == 0, fill)
        att = F.softmax(att, dim=-1)
        y = att @ v
        if self.variant == "probs_reused":
            y = y + att.sum(-1, keepdim=True)        # the probabilities are read twice
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class Step(pf.nn.Graph):
    def __init__(self, model, opt, fuse, executor="sequential"):
        super().__init__()
        self.model = model
        self.add_optimizer(opt)
        self.config.allow_fuse_attention(fuse)
        self.config.set_executor(executor)

    def build(self, x, target):
        loss = ((self.model(x) - target) ** 2).mean()
        loss.backward()
        return loss


def _setup(variant, dtype=pf.float32, seed=0):
    pf.manual_seed(seed)
    model = Attention(variant=variant).to(dtype)
    # SGD, not Adam: the key projection's bias gets a gradient that is 0 in exact
    # arithmetic (softmax ignores a shift of a whole row), so both modes hold
    # rounding noise there, which Adam's normalisation would blow up to +-lr.
    opt = pf.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    rng = np.random.default_rng(seed)
    x = pf.tensor(rng.standard_normal((3, 8, 16)), dtype=dtype)
    target = pf.tensor(rng.standard_normal((3, 8, 16)), dtype=dtype)
    return model, opt, x, target


def _train(mode, variant, steps=3, dtype=pf.float32, executor="sequential"):
    model, opt, x, target = _setup(variant, dtype)
    losses = []
    if mode == "eager":
        for _ in range(steps):
            opt.zero_grad()
            loss = ((model(x) - target) ** 2).mean()
            loss.backward()
            opt.step()
            losses.append(float(loss))
        return losses, model, None
    graph = Step(model, opt, fuse=(mode == "fused"), executor=executor)
    for _ in range(steps):
        losses.append(float(graph(x, target)))
    return losses, model, graph


def _fused_chains(graph):
    text = pf.explain(graph)
    line = next(ln for ln in text.splitlines() if ln.strip().startswith("fuse_attention"))
    return int(line.split("fused")[1].split()[0]) if " fused " in line else 0


@pytest.mark.parametrize("executor", executors("actors", "sequential"))
@pytest.mark.parametrize("variant", ["nanogpt", "div", "no_scale", "no_mask"])
def test_fused_attention_trains_like_eager_and_the_chain(variant, executor):
    eager, m_eager, _ = _train("eager", variant)
    fused, m_fused, g = _train("fused", variant, executor=executor)
    chain, m_chain, g_chain = _train("chain", variant, executor=executor)
    assert _fused_chains(g) == 1
    assert _fused_chains(g_chain) == 0 and "off (graph.config)" in pf.explain(g_chain)
    assert "FusedAttention" in str(g.plans[0].graph)
    np.testing.assert_allclose(fused, eager, rtol=2e-5)
    np.testing.assert_allclose(chain, eager, rtol=2e-5)
    for (name, p), q in zip(m_fused.named_parameters(), m_eager.parameters()):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-4, atol=1e-5,
                                   err_msg=name)


def test_fused_attention_float64_gradients_match_eager_closely():
    model, opt, x, target = _setup("nanogpt", pf.float64)
    loss = ((model(x) - target) ** 2).mean()
    loss.backward()
    eager = {n: p.grad.numpy().copy() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = None

    class GradOnly(pf.nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = model
            self.config.allow_fuse_attention(True)

        def build(self, x, target):
            loss = ((self.model(x) - target) ** 2).mean()
            loss.backward()
            return loss

    graph = GradOnly()
    graph(x, target)
    assert _fused_chains(graph) == 1
    for n, p in model.named_parameters():
        np.testing.assert_allclose(p.grad.numpy(), eager[n], rtol=1e-10, atol=1e-12, err_msg=n)


@pytest.mark.parametrize("variant", ["finite_fill", "probs_reused"])
def test_chains_that_differ_are_left_alone(variant):
    eager, _, _ = _train("eager", variant, steps=2)
    fused, _, g = _train("fused", variant, steps=2)
    assert _fused_chains(g) == 0
    np.testing.assert_allclose(fused, eager, rtol=2e-5)


def test_off_by_default():
    model, opt, x, target = _setup("nanogpt")

    class Default(pf.nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = model

        def build(self, x):
            return self.model(x)

    graph = Default()
    graph(x)
    assert "fuse_attention         off (graph.config)" in pf.explain(graph)


def test_a_row_masked_everywhere_is_nan_as_in_eager():
    pf.manual_seed(0)
    model = Attention()
    model.bias.zero_()                         # every score masked: softmax of all -inf

    class Forward(pf.nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = model
            self.config.allow_fuse_attention(True)

        def build(self, x):
            return self.model(x)

    x = pf.randn(2, 8, 16)
    with pf.no_grad():
        eager = model(x).numpy()
    graph = Forward()
    out = graph(x).numpy()
    assert _fused_chains(graph) == 1
    assert np.isnan(eager).all() and np.isnan(out).all()
