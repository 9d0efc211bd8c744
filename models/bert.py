"""BERT for pre-training (masked LM + next sentence), in one file.

The architecture and parameter names are Hugging Face's ``BertForPreTraining``
(post-norm encoder, exact-erf GELU, learned absolute positions, token types),
so its state dicts load one to one::

    bert.embeddings.word_embeddings.weight
    bert.encoder.layer.0.attention.self.query.weight
    bert.encoder.layer.0.attention.output.dense.weight / .LayerNorm.weight
    bert.encoder.layer.0.intermediate.dense.weight
    bert.encoder.layer.0.output.dense.weight / .LayerNorm.weight
    bert.pooler.dense.weight
    cls.predictions.transform.dense.weight / .LayerNorm.weight
    cls.predictions.decoder.weight      (the word embeddings, tied)
    cls.predictions.bias                (== cls.predictions.decoder.bias, as in HF)
    cls.seq_relationship.weight

Usage::

    from pyflow.models.bert import BertConfig, BertForPreTraining
    model = BertForPreTraining(BertConfig.tiny())
    mlm_logits, nsp_logits, loss = model(input_ids, masked_lm_labels=labels,
                                         next_sentence_label=is_next)
"""
from dataclasses import dataclass

import numpy as np

import pyflow
from pyflow import nn
from pyflow.nn import functional as F

__all__ = ["BertConfig", "BertEmbeddings", "BertSelfAttention", "BertLayer", "BertModel",
           "BertForPreTraining"]


@dataclass
class BertConfig:
    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    initializer_range: float = 0.02
    pad_token_id: int = 0

    def __post_init__(self):
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"BertConfig: hidden_size ({self.hidden_size}) must be a multiple "
                             f"of num_attention_heads ({self.num_attention_heads})")

    @classmethod
    def base(cls, **overrides):
        """BERT-base (uncased): 110,106,428 parameters with the pre-training heads."""
        return cls(**overrides)

    @classmethod
    def large(cls, **overrides):
        return cls(**{**dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                             intermediate_size=4096), **overrides})

    @classmethod
    def tiny(cls, **overrides):
        """A toy size for tests and CPU demos (113,154 parameters)."""
        return cls(**{**dict(vocab_size=512, hidden_size=64, num_hidden_layers=2,
                             num_attention_heads=2, intermediate_size=128,
                             max_position_embeddings=64), **overrides})


class BertEmbeddings(nn.Module):
    """word + position + token type embeddings, then LayerNorm and dropout."""

    def __init__(self, config):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size,
                                            padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings,
                                                config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids, token_type_ids):
        positions = pyflow.arange(input_ids.shape[1], device=input_ids.device)
        x = (self.word_embeddings(input_ids) + self.position_embeddings(positions)
             + self.token_type_embeddings(token_type_ids))
        return self.dropout(self.LayerNorm(x))


class BertSelfAttention(nn.Module):
    """Multi-head attention with separate query/key/value projections (HF's names)."""

    def __init__(self, config):
        super().__init__()
        self.num_attention_heads = config.num_attention_heads
        self.attention_head_size = config.hidden_size // config.num_attention_heads
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout_p = config.attention_probs_dropout_prob

    def forward(self, x, mask_bias):
        B, T, C = x.shape
        H, D = self.num_attention_heads, self.attention_head_size
        q, k, v = (proj(x).view(B, T, H, D).transpose(1, 2)
                   for proj in (self.query, self.key, self.value))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask_bias,
                                           dropout_p=self.dropout_p if self.training else 0.0)
        return y.transpose(1, 2).reshape(B, T, C)


class BertSelfOutput(nn.Module):
    """Projection back to the residual stream, dropout, residual add, LayerNorm (post-norm)."""

    def __init__(self, config, in_features):
        super().__init__()
        self.dense = nn.Linear(in_features, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, h, residual):
        return self.LayerNorm(self.dropout(self.dense(h)) + residual)


class BertAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.self = BertSelfAttention(config)
        self.output = BertSelfOutput(config, config.hidden_size)

    def forward(self, x, mask_bias):
        return self.output(self.self(x, mask_bias), x)


class BertIntermediate(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)

    def forward(self, x):
        return F.gelu(self.dense(x))


class BertLayer(nn.Module):
    """attention -> add & norm -> feed-forward (GELU) -> add & norm."""

    def __init__(self, config):
        super().__init__()
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        # HF calls the feed-forward's second half "output", like the attention's.
        self.output = BertSelfOutput(config, config.intermediate_size)

    def forward(self, x, mask_bias):
        x = self.attention(x, mask_bias)
        return self.output(self.intermediate(x), x)


class BertEncoder(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.layer = nn.ModuleList([BertLayer(config) for _ in range(config.num_hidden_layers)])

    def forward(self, x, mask_bias):
        for layer in self.layer:
            x = layer(x, mask_bias)
        return x


class BertPooler(nn.Module):
    """tanh(dense(hidden state of [CLS])): the sentence summary for next-sentence."""

    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, x):
        return F.tanh(self.dense(x[:, 0]))


class BertModel(nn.Module):
    """The encoder: ``forward(input_ids, token_type_ids, attention_mask)`` returns
    ``(sequence_output (B, T, C), pooled_output (B, C))``."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(config)

    def forward(self, input_ids, token_type_ids=None, attention_mask=None):
        _check_inputs(self.config, input_ids, token_type_ids, attention_mask)
        if token_type_ids is None:
            token_type_ids = pyflow.zeros_like(input_ids)
        mask_bias = None
        if attention_mask is not None:
            # 1 = attend, 0 = padding.  HF adds the dtype's most negative number rather
            # than -inf, so a row with every key masked stays finite (uniform) not NaN.
            keep = attention_mask.reshape(attention_mask.shape[0], 1, 1, attention_mask.shape[1])
            dtype = self.embeddings.word_embeddings.weight.dtype
            mask_bias = (1.0 - keep.to(dtype)) * _most_negative(dtype)
        x = self.encoder(self.embeddings(input_ids, token_type_ids), mask_bias)
        return x, self.pooler(x)


class BertPredictionHeadTransform(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, x):
        return self.LayerNorm(F.gelu(self.dense(x)))


class BertLMPredictionHead(nn.Module):
    """transform, then the decoder: the word embeddings (tied) plus an output bias."""

    def __init__(self, config, word_embeddings):
        super().__init__()
        self.transform = BertPredictionHeadTransform(config)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.decoder.weight = word_embeddings.weight            # tied: one tensor, two names
        self.bias = nn.Parameter(pyflow.zeros(config.vocab_size))
        self.decoder.bias = self.bias                           # as HF: both names, one tensor

    def forward(self, x):
        return self.decoder(self.transform(x))


class BertPreTrainingHeads(nn.Module):
    def __init__(self, config, word_embeddings):
        super().__init__()
        self.predictions = BertLMPredictionHead(config, word_embeddings)
        self.seq_relationship = nn.Linear(config.hidden_size, 2)

    def forward(self, sequence_output, pooled_output):
        return self.predictions(sequence_output), self.seq_relationship(pooled_output)


class BertForPreTraining(nn.Module):
    """BERT with the masked-LM and next-sentence heads.

    ``forward`` returns ``(prediction_logits (B, T, vocab), seq_relationship_logits
    (B, 2), loss)``; ``loss`` is None without labels, else the sum of the masked-LM
    cross entropy (positions labelled -100 are ignored, as in HF) and the
    next-sentence cross entropy, over whichever labels are given.
    """

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.bert = BertModel(config)
        self.cls = BertPreTrainingHeads(config, self.bert.embeddings.word_embeddings)
        self.apply(self._init_weights)

    def _init_weights(self, module):
        """HF's init: N(0, initializer_range) weights, zero biases, LayerNorm at 1/0."""
        std = self.config.initializer_range
        if module is self.cls.predictions.decoder:
            return      # its weight is the word embeddings, initialized (padding row 0) as those
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=std)
            if module.padding_idx is not None:
                with pyflow.no_grad():
                    module.weight[module.padding_idx].fill_(0)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)

    def forward(self, input_ids, token_type_ids=None, attention_mask=None,
                masked_lm_labels=None, next_sentence_label=None):
        sequence_output, pooled_output = self.bert(input_ids, token_type_ids, attention_mask)
        prediction_logits, seq_relationship_logits = self.cls(sequence_output, pooled_output)
        loss = None
        if masked_lm_labels is not None:
            _check_labels("masked_lm_labels", masked_lm_labels, tuple(input_ids.shape))
            loss = F.cross_entropy(prediction_logits.view(-1, self.config.vocab_size),
                                   masked_lm_labels.reshape(-1), ignore_index=-100)
        if next_sentence_label is not None:
            _check_labels("next_sentence_label", next_sentence_label, (input_ids.shape[0],))
            nsp_loss = F.cross_entropy(seq_relationship_logits, next_sentence_label.reshape(-1))
            loss = nsp_loss if loss is None else loss + nsp_loss
        return prediction_logits, seq_relationship_logits, loss


# ---------------------------------------------------------------- argument checks
def _most_negative(dtype):
    """HF's mask value, torch.finfo(dtype).min (NumPy has no bfloat16)."""
    if dtype is pyflow.bfloat16:
        return -3.3895313892515355e38
    return float(np.finfo(dtype.name).min)


def _check_inputs(config, input_ids, token_type_ids, attention_mask):
    """Shape and dtype checks (no data reads, so they also hold inside a graph)."""
    if not isinstance(input_ids, pyflow.Tensor):
        raise TypeError(f"BERT: input_ids must be a Tensor, not {type(input_ids).__name__}")
    if input_ids.ndim != 2:
        raise ValueError(f"BERT: expected input_ids of shape (batch, seq_len), got "
                         f"{tuple(input_ids.shape)}")
    if input_ids.dtype.is_floating_point or input_ids.dtype is pyflow.bool:
        raise TypeError(f"BERT: input_ids must be an integer tensor (token ids), got "
                        f"{input_ids.dtype}")
    T = input_ids.shape[1]
    if T > config.max_position_embeddings:
        raise ValueError(f"BERT: sequence length {T} exceeds max_position_embeddings "
                         f"({config.max_position_embeddings})")
    for name, t in (("token_type_ids", token_type_ids), ("attention_mask", attention_mask)):
        if t is not None and tuple(t.shape) != tuple(input_ids.shape):
            raise ValueError(f"BERT: {name} must have the shape of input_ids "
                             f"{tuple(input_ids.shape)}, got {tuple(t.shape)}")
    if token_type_ids is not None and token_type_ids.dtype.is_floating_point:
        raise TypeError(f"BERT: token_type_ids must be an integer tensor, got "
                        f"{token_type_ids.dtype}")


def _check_labels(name, labels, shape):
    if tuple(labels.shape) != shape:
        raise ValueError(f"BERT: {name} must have shape {shape}, got {tuple(labels.shape)}")
    if labels.dtype.is_floating_point:
        raise TypeError(f"BERT: {name} must be an integer tensor (class indices), got "
                        f"{labels.dtype}")
