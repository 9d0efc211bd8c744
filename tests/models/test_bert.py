"""models/bert.py: Hugging Face's parameter count and names, the same logits,
loss and gradients as a PyTorch reference on the same weights (padding mask,
ignored masked-LM labels, tied decoder), a training step in graph mode equal to
eager, and clear errors."""
import dataclasses

import numpy as np
import pytest

import pyflow as pf
from models.bert import BertConfig, BertForPreTraining
from tests.helpers import needs_torch, torch

NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def _np(t):
    return t.detach().cpu().numpy()


def _batch(config, B=2, T=8, seed=0):
    """Token ids, token types, a padding mask (the second sequence padded), masked-LM
    labels with -100 everywhere but a few positions, next-sentence labels."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, config.vocab_size, (B, T))
    types = np.zeros((B, T), np.int64)
    types[:, T // 2:] = 1
    mask = np.ones((B, T), np.int64)
    mask[1, T - 3:] = 0
    ids[1, T - 3:] = config.pad_token_id
    labels = np.full((B, T), -100)
    labels[0, [1, 4]] = rng.integers(0, config.vocab_size, 2)
    labels[1, 2] = rng.integers(0, config.vocab_size)
    nsp = np.arange(B) % 2
    return ids, types, mask, labels, nsp


# ------------------------------------------------------------------ a PyTorch reference
# A minimal Hugging Face BertForPreTraining (transformers is not a dependency),
# written independently of models/bert.py with HF's module names.
if torch is not None:
    tnn, tF = torch.nn, torch.nn.functional

    class TorchBertLayer(tnn.Module):
        def __init__(self, c):
            super().__init__()
            C, I, eps = c.hidden_size, c.intermediate_size, c.layer_norm_eps
            self.heads = c.num_attention_heads
            self.attention = tnn.Module()
            self.attention.self = tnn.Module()
            for name in ("query", "key", "value"):
                setattr(self.attention.self, name, tnn.Linear(C, C))
            self.attention.output = tnn.Module()
            self.attention.output.dense = tnn.Linear(C, C)
            self.attention.output.LayerNorm = tnn.LayerNorm(C, eps=eps)
            self.intermediate = tnn.Module()
            self.intermediate.dense = tnn.Linear(C, I)
            self.output = tnn.Module()
            self.output.dense = tnn.Linear(I, C)
            self.output.LayerNorm = tnn.LayerNorm(C, eps=eps)

        def forward(self, x, bias):
            B, T, C = x.shape
            s = self.attention.self
            q, k, v = (lin(x).view(B, T, self.heads, -1).transpose(1, 2)
                       for lin in (s.query, s.key, s.value))
            scores = q @ k.transpose(-1, -2) / (C // self.heads) ** 0.5 + bias
            y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, C)
            o = self.attention.output
            x = o.LayerNorm(o.dense(y) + x)
            h = tF.gelu(self.intermediate.dense(x))
            return self.output.LayerNorm(self.output.dense(h) + x)

    class TorchBertForPreTraining(tnn.Module):
        def __init__(self, c):
            super().__init__()
            C = c.hidden_size
            self.c = c
            self.bert = tnn.Module()
            e = self.bert.embeddings = tnn.Module()
            e.word_embeddings = tnn.Embedding(c.vocab_size, C, padding_idx=c.pad_token_id)
            e.position_embeddings = tnn.Embedding(c.max_position_embeddings, C)
            e.token_type_embeddings = tnn.Embedding(c.type_vocab_size, C)
            e.LayerNorm = tnn.LayerNorm(C, eps=c.layer_norm_eps)
            self.bert.encoder = tnn.Module()
            self.bert.encoder.layer = tnn.ModuleList(
                [TorchBertLayer(c) for _ in range(c.num_hidden_layers)])
            self.bert.pooler = tnn.Module()
            self.bert.pooler.dense = tnn.Linear(C, C)
            self.cls = tnn.Module()
            p = self.cls.predictions = tnn.Module()
            p.transform = tnn.Module()
            p.transform.dense = tnn.Linear(C, C)
            p.transform.LayerNorm = tnn.LayerNorm(C, eps=c.layer_norm_eps)
            p.decoder = tnn.Linear(C, c.vocab_size, bias=False)
            p.bias = tnn.Parameter(torch.zeros(c.vocab_size))
            p.decoder.bias = p.bias
            p.decoder.weight = e.word_embeddings.weight
            self.cls.seq_relationship = tnn.Linear(C, 2)

        def forward(self, ids, types, mask, labels, nsp):
            e, T = self.bert.embeddings, ids.shape[1]
            x = e.LayerNorm(e.word_embeddings(ids) + e.position_embeddings(torch.arange(T))
                            + e.token_type_embeddings(types))
            bias = (1.0 - mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
            for layer in self.bert.encoder.layer:
                x = layer(x, bias)
            pooled = torch.tanh(self.bert.pooler.dense(x[:, 0]))
            p = self.cls.predictions
            logits = p.decoder(p.transform.LayerNorm(tF.gelu(p.transform.dense(x))))
            nsp_logits = self.cls.seq_relationship(pooled)
            loss = (tF.cross_entropy(logits.view(-1, self.c.vocab_size), labels.view(-1))
                    + tF.cross_entropy(nsp_logits, nsp))
            return logits, nsp_logits, loss


# ------------------------------------------------------------------ architecture
def test_base_parameter_count_equals_hugging_face(monkeypatch):
    """BERT-base with the pre-training heads, the tied decoder counted once:
    109,482,240 in the encoder (HF's BertModel) + 624,188 in the heads.

    Only the sizes count here, so the random numbers are not drawn: BERT-base's
    two initializations (each Linear's own, then HF's) draw 220M of them, 8-19 s
    of the suite on 2 cores.  The other tests build models with the draws."""
    from pyflow.nn import init
    monkeypatch.setattr(init, "_fill_drawn", lambda tensor, *args, **kwargs: tensor)
    model = BertForPreTraining(BertConfig.base())
    assert sum(p.numel() for p in model.parameters()) == 110_106_428
    assert sum(p.numel() for p in model.bert.parameters()) == 109_482_240


def test_names_and_weight_tying():
    model = BertForPreTraining(BertConfig.tiny())
    sd = model.state_dict()
    for key in ["bert.embeddings.word_embeddings.weight",
                "bert.embeddings.position_embeddings.weight",
                "bert.embeddings.token_type_embeddings.weight", "bert.embeddings.LayerNorm.bias",
                "bert.encoder.layer.0.attention.self.query.weight",
                "bert.encoder.layer.1.attention.self.value.bias",
                "bert.encoder.layer.0.attention.output.dense.weight",
                "bert.encoder.layer.0.attention.output.LayerNorm.weight",
                "bert.encoder.layer.0.intermediate.dense.weight",
                "bert.encoder.layer.1.output.dense.weight",
                "bert.encoder.layer.1.output.LayerNorm.bias", "bert.pooler.dense.weight",
                "cls.predictions.transform.dense.weight",
                "cls.predictions.transform.LayerNorm.weight", "cls.predictions.decoder.weight",
                "cls.predictions.decoder.bias", "cls.predictions.bias",
                "cls.seq_relationship.weight", "cls.seq_relationship.bias"]:
        assert key in sd, key
    heads = model.cls.predictions
    assert heads.decoder.weight is model.bert.embeddings.word_embeddings.weight
    assert heads.decoder.bias is heads.bias
    # the padding token's embedding starts at zero (HF's init)
    assert float(model.bert.embeddings.word_embeddings.weight[0].abs().sum()) == 0.0


def test_output_shapes_and_loss_only_with_labels():
    config = BertConfig.tiny()
    model = BertForPreTraining(config)
    ids = pf.randint(0, config.vocab_size, (3, 10))
    mlm, nsp, loss = model(ids)
    assert tuple(mlm.shape) == (3, 10, config.vocab_size) and tuple(nsp.shape) == (3, 2)
    assert loss is None
    _, _, loss = model(ids, next_sentence_label=pf.tensor([0, 1, 1]))
    assert loss.ndim == 0 and float(loss) > 0


def test_config_presets():
    base = BertConfig.base()
    assert (base.vocab_size, base.hidden_size, base.num_hidden_layers, base.num_attention_heads,
            base.intermediate_size, base.max_position_embeddings, base.type_vocab_size) == \
        (30522, 768, 12, 12, 3072, 512, 2)
    tiny = BertConfig.tiny(num_hidden_layers=1)
    assert (tiny.vocab_size, tiny.hidden_size, tiny.num_hidden_layers) == (512, 64, 1)


# ------------------------------------------------------------------ against PyTorch
def _torch_twin(model, config, dtype):
    ref = TorchBertForPreTraining(config).to(dtype)
    sd = {k: torch.from_numpy(_np(v).copy()) for k, v in model.state_dict().items()}
    ref.load_state_dict(sd, strict=True)
    return ref


@needs_torch
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_logits_loss_and_gradients_match_pytorch(dtype):
    """Same weights, padded batch, ignored labels: logits, loss and every
    gradient (the tied word embeddings get both the lookup's and the decoder's
    share) equal the reference's."""
    config = BertConfig.tiny(**NO_DROPOUT)
    pf.manual_seed(0)
    model = BertForPreTraining(config)
    if dtype == "float64":
        model = model.double()
    ref = _torch_twin(model, config, getattr(torch, dtype))
    tol = dict(rtol=1e-9, atol=1e-11) if dtype == "float64" else dict(rtol=1e-4, atol=1e-5)

    ids, types, mask, labels, nsp = _batch(config)
    mlm, nsp_logits, loss = model(pf.tensor(ids), pf.tensor(types), pf.tensor(mask),
                                  pf.tensor(labels), pf.tensor(nsp))
    loss.backward()
    r_mlm, r_nsp, r_loss = ref(*(torch.from_numpy(a) for a in (ids, types, mask, labels, nsp)))
    r_loss.backward()

    np.testing.assert_allclose(_np(mlm), r_mlm.detach().numpy(), **tol)
    np.testing.assert_allclose(_np(nsp_logits), r_nsp.detach().numpy(), **tol)
    np.testing.assert_allclose(float(loss), r_loss.item(), rtol=tol["rtol"])
    ref_params = dict(ref.named_parameters())
    names = [n for n, _ in model.named_parameters()]
    assert sorted(names) == sorted(ref_params)
    for name, p in model.named_parameters():
        g = ref_params[name].grad.numpy()
        np.testing.assert_allclose(_np(p.grad), g, rtol=tol["rtol"],
                                   atol=tol["atol"] * max(1.0, np.abs(g).max()), err_msg=name)


def test_padding_changes_nothing_for_the_unpadded_tokens():
    """With the mask, a padded sequence's real tokens see exactly what they see
    in the unpadded sequence (the padding gets no attention)."""
    config = BertConfig.tiny(**NO_DROPOUT)
    model = BertForPreTraining(config)
    ids = pf.tensor([[5, 9, 13, 21, 0, 0]])
    mask = pf.tensor([[1, 1, 1, 1, 0, 0]])
    padded, _, _ = model(ids, attention_mask=mask)
    alone, _, _ = model(ids[:, :4])
    np.testing.assert_allclose(_np(padded)[:, :4], _np(alone), rtol=1e-5, atol=1e-5)
    as_bool, _, _ = model(ids, attention_mask=mask.to(pf.bool))
    np.testing.assert_array_equal(_np(as_bool), _np(padded))
    # every key masked: HF's finite mask value gives uniform attention, not NaN
    nothing, _, _ = model(ids, attention_mask=pf.zeros(1, 6, dtype=pf.int64))
    assert np.isfinite(_np(nothing)).all()


# ------------------------------------------------------------------ graph mode
class TrainGraph(pf.nn.Graph):
    def __init__(self, model, optimizer, executor):
        super().__init__()
        self.model = model
        self.add_optimizer(optimizer)
        self.config.set_executor(executor)

    def build(self, ids, types, mask, labels, nsp):
        _, _, loss = self.model(ids, types, mask, labels, nsp)
        loss.backward()
        return loss


@pytest.mark.cpu_only
@pytest.mark.parametrize("executor", ["sequential", "actors"])
def test_training_step_graph_equals_eager(executor):
    """Two AdamW steps of BERT-tiny (one layer, dropout on, the generator seeded
    alike before each step): eager and nn.Graph give the same losses and
    parameters, the tied embedding included."""
    config = BertConfig.tiny(num_hidden_layers=1)
    models = []
    for _ in range(2):
        pf.manual_seed(0)
        models.append(BertForPreTraining(config))
    eager, graphed = models
    opt = pf.optim.AdamW(eager.parameters(), lr=1e-3)
    graph = TrainGraph(graphed, pf.optim.AdamW(graphed.parameters(), lr=1e-3), executor)
    for step in range(2):
        batch = [pf.tensor(a) for a in _batch(config, seed=step)]
        pf.manual_seed(10 + step)
        opt.zero_grad()
        _, _, loss = eager(*batch)
        loss.backward()
        opt.step()
        pf.manual_seed(10 + step)
        np.testing.assert_allclose(float(graph(*batch)), float(loss), rtol=1e-5)
    for (name, a), b in zip(eager.named_parameters(), graphed.parameters()):
        np.testing.assert_allclose(_np(b), _np(a), rtol=1e-4, atol=1e-6, err_msg=name)
    assert graphed.cls.predictions.decoder.weight is graphed.bert.embeddings.word_embeddings.weight


# ------------------------------------------------------------------ bad input
def test_bad_inputs_raise_clear_errors():
    config = BertConfig.tiny()
    model = BertForPreTraining(config)
    ids = pf.randint(0, config.vocab_size, (2, 8))
    with pytest.raises(ValueError, match=r"input_ids of shape \(batch, seq_len\), got \(8,\)"):
        model(ids[0])
    with pytest.raises(TypeError, match="input_ids must be an integer tensor.*float32"):
        model(pf.randn(2, 8))
    with pytest.raises(ValueError, match="sequence length 65 exceeds max_position_embeddings"):
        model(pf.zeros(1, 65, dtype=pf.int64))
    with pytest.raises(ValueError, match=r"attention_mask must have the shape of input_ids "
                                         r"\(2, 8\), got \(2, 7\)"):
        model(ids, attention_mask=pf.ones(2, 7, dtype=pf.int64))
    with pytest.raises(ValueError, match=r"token_type_ids must have the shape"):
        model(ids, token_type_ids=pf.zeros(8, dtype=pf.int64))
    with pytest.raises(ValueError, match=r"masked_lm_labels must have shape \(2, 8\), got \(16,\)"):
        model(ids, masked_lm_labels=pf.zeros(16, dtype=pf.int64))
    with pytest.raises(TypeError, match="next_sentence_label must be an integer"):
        model(ids, next_sentence_label=pf.zeros(2))
    with pytest.raises(ValueError, match=r"hidden_size \(64\) must be a multiple of "
                                         r"num_attention_heads \(3\)"):
        BertConfig.tiny(num_attention_heads=3)
    assert dataclasses.replace(config, vocab_size=100).vocab_size == 100
