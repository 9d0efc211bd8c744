"""models/gpt.py: shapes, GPT-2's parameter names and count, equality with a
nanoGPT-style PyTorch model on the same weights (logits, loss, gradients), and
one training step in eager and graph mode."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pyflow as pf
from pyflow.models.gpt import GPT, GPTConfig, PRESETS
from pyflow.models.train import TrainGraph

from ..helpers import assert_close, needs_torch, to_numpy, torch

SMALL = dict(block_size=8, vocab_size=11, n_layer=2, n_head=2, n_embd=16)


def small_gpt(seed=0, **kw):
    pf.manual_seed(seed)
    return GPT(GPTConfig(**{**SMALL, **kw}))


def tokens(rng, batch, time, vocab=SMALL["vocab_size"]):
    return pf.tensor(rng.integers(0, vocab, (batch, time)))


# ---------------------------------------------------------------- config and shapes
def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match=r"n_embd \(10\) must be a multiple of n_head \(3\)"):
        GPTConfig(n_embd=10, n_head=3)
    with pytest.raises(ValueError, match="n_layer must be a positive int, got 0"):
        GPTConfig(n_layer=0)
    with pytest.raises(ValueError, match=r"dropout must be in \[0, 1\), got 1.5"):
        GPTConfig(dropout=1.5)
    with pytest.raises(TypeError, match="config must be a GPTConfig, got dict"):
        GPT(dict(SMALL))


def test_presets():
    tiny, mini = GPTConfig.tiny(), GPTConfig.mini()
    assert (tiny.block_size, tiny.n_layer, tiny.n_head, tiny.n_embd) == (64, 2, 2, 64)
    assert (mini.block_size, mini.n_layer, mini.n_head, mini.n_embd) == (128, 4, 4, 256)
    g = GPTConfig.gpt2()
    assert (g.block_size, g.vocab_size, g.n_layer, g.n_head, g.n_embd) == \
        (1024, 50257, 12, 12, 768)
    assert (PRESETS["gpt2-xl"]().n_layer, PRESETS["gpt2-xl"]().n_embd) == (48, 1600)
    assert GPTConfig.tiny(vocab_size=95).vocab_size == 95


@settings(max_examples=8, deadline=None)
@given(batch=st.integers(1, 3), time=st.integers(1, SMALL["block_size"]))
def test_output_shapes(batch, time):
    model = small_gpt()
    rng = np.random.default_rng(batch * 10 + time)
    logits, loss = model(tokens(rng, batch, time))
    assert tuple(logits.shape) == (batch, time, SMALL["vocab_size"]) and loss is None
    logits, loss = model(tokens(rng, batch, time), tokens(rng, batch, time))
    assert tuple(loss.shape) == () and np.isfinite(loss.item())


def test_bad_inputs():
    model = small_gpt()
    with pytest.raises(ValueError, match="sequence of length 9, the block size .* is only 8"):
        model(pf.zeros(2, 9, dtype=pf.int64))
    with pytest.raises(ValueError, match=r"idx must be \(batch, time\) token ids, got shape \(8,\)"):
        model(pf.zeros(8, dtype=pf.int64))


def test_parameter_names_and_tied_head():
    model = small_gpt()
    names = [n for n, _ in model.named_parameters()]
    block = ["ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
             "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
             "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"]
    assert names == (["transformer.wte.weight", "transformer.wpe.weight"]
                     + [f"transformer.h.{i}.{b}" for i in range(2) for b in block]
                     + ["transformer.ln_f.weight", "transformer.ln_f.bias"])
    assert model.lm_head.weight is model.transformer.wte.weight
    state = model.state_dict()
    assert "lm_head.weight" in state and "transformer.wte.weight" in state
    no_bias = small_gpt(bias=False)
    assert not any(n.endswith("bias") for n, _ in no_bias.named_parameters())


def test_gpt2_small_has_124m_parameters(monkeypatch):
    # Only the sizes count here, so the random numbers are not drawn (the two
    # initializations of 124M parameters took 15 s); test_init_follows_gpt2 checks them.
    from pyflow.nn import init
    monkeypatch.setattr(init, "_fill_drawn", lambda tensor, *args, **kwargs: tensor)
    model = GPT(GPTConfig.gpt2())
    assert model.num_params() == 124_439_808               # tied head counted once, wpe counted
    assert model.num_params(non_embedding=True) == 124_439_808 - 1024 * 768


def test_init_follows_gpt2():
    model = GPT(GPTConfig(**{**SMALL, "n_embd": 64, "n_layer": 4, "vocab_size": 500}))
    wte = to_numpy(model.transformer.wte.weight)
    proj = to_numpy(model.transformer.h[0].mlp.c_proj.weight)
    assert abs(wte.std() - 0.02) < 0.002
    assert abs(proj.std() - 0.02 / np.sqrt(8)) < 0.002      # scaled residual projections
    assert not to_numpy(model.transformer.h[0].attn.c_attn.bias).any()


# ---------------------------------------------------------------- PyTorch reference
def torch_gpt(cfg):
    """nanoGPT's model in PyTorch, with GPT-2's tanh GELU, the same names and tying."""
    tnn, F = torch.nn, torch.nn.functional

    class Attention(tnn.Module):
        def __init__(self):
            super().__init__()
            self.c_attn = tnn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)
            self.c_proj = tnn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)

        def forward(self, x):
            B, T, C = x.shape
            q, k, v = self.c_attn(x).split(C, dim=2)
            q, k, v = (t.view(B, T, cfg.n_head, C // cfg.n_head).transpose(1, 2) for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))

    class MLP(tnn.Module):
        def __init__(self):
            super().__init__()
            self.c_fc = tnn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias)
            self.c_proj = tnn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)

        def forward(self, x):
            return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))

    class Block(tnn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.attn = tnn.LayerNorm(cfg.n_embd, bias=cfg.bias), Attention()
            self.ln_2, self.mlp = tnn.LayerNorm(cfg.n_embd, bias=cfg.bias), MLP()

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class Model(tnn.Module):
        def __init__(self):
            super().__init__()
            self.transformer = tnn.ModuleDict(dict(
                wte=tnn.Embedding(cfg.vocab_size, cfg.n_embd),
                wpe=tnn.Embedding(cfg.block_size, cfg.n_embd),
                h=tnn.ModuleList([Block() for _ in range(cfg.n_layer)]),
                ln_f=tnn.LayerNorm(cfg.n_embd, bias=cfg.bias)))
            self.lm_head = tnn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
            self.transformer.wte.weight = self.lm_head.weight

        def forward(self, idx, targets):
            T = idx.shape[1]
            x = self.transformer.wte(idx) + self.transformer.wpe(torch.arange(T))
            for block in self.transformer.h:
                x = block(x)
            logits = self.lm_head(self.transformer.ln_f(x))
            return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1),
                                           ignore_index=-1)
    return Model()


@needs_torch
@pytest.mark.parametrize("bias", [True, False])
def test_matches_pytorch_reference(bias):
    model = small_gpt(seed=3, bias=bias)
    ref = torch_gpt(model.config)
    missing, unexpected = ref.load_state_dict(
        {k: torch.tensor(to_numpy(v)) for k, v in model.state_dict().items()}, strict=True)
    assert not missing and not unexpected
    rng = np.random.default_rng(0)
    idx, targets = tokens(rng, 3, 8), tokens(rng, 3, 8)
    targets[0, :2] = -1                                        # ignored positions, as nanoGPT
    logits, loss = model(idx, targets)
    loss.backward()
    ref_logits, ref_loss = ref(torch.tensor(to_numpy(idx)), torch.tensor(to_numpy(targets)))
    ref_loss.backward()
    assert_close(logits, ref_logits.detach().numpy(), rtol=1e-4, atol=1e-5, msg="logits")
    assert_close(loss, ref_loss.detach().numpy(), rtol=1e-5, atol=1e-6, msg="loss")
    ref_params = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        assert_close(p.grad, ref_params[name].grad.numpy(), rtol=1e-3, atol=2e-6,
                     msg=f"grad of {name}")


# ---------------------------------------------------------------- eager vs graph
def test_training_steps_eager_equal_graph():
    rng = np.random.default_rng(1)
    batches = [(tokens(rng, 4, 8), tokens(rng, 4, 8)) for _ in range(2)]
    results = []
    for graph_mode in (False, True):
        model = small_gpt(seed=5)
        opt = pf.optim.AdamW(model.parameters(), lr=1e-2)
        sched = pf.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (step + 1))
        graph = TrainGraph(model, opt, sched) if graph_mode else None
        losses = []
        for x, y in batches:
            if graph is not None:
                loss = graph(x, y)
            else:
                _, loss = model(x, y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                sched.step()
            losses.append(loss.item())
        results.append((losses, {n: to_numpy(p) for n, p in model.named_parameters()}))
    (eager_losses, eager_params), (graph_losses, graph_params) = results
    np.testing.assert_allclose(graph_losses, eager_losses, rtol=1e-6)
    assert eager_losses[1] != eager_losses[0]                  # the update did happen
    for name in eager_params:
        assert_close(graph_params[name], eager_params[name], rtol=1e-5, atol=1e-7, msg=name)
