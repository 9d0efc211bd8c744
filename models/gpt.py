"""GPT-2, nanoGPT's ``model.py`` written against pyflow.

One file a reader finishes in one sitting: a config, the causal self-attention,
the MLP, the pre-norm block and the model.  Parameter names are those of the
GPT-2 checkpoints (and nanoGPT): ``transformer.wte``, ``transformer.wpe``,
``transformer.h.0.ln_1``, ``...attn.c_attn``, ``...attn.c_proj``,
``...mlp.c_fc``, ``...mlp.c_proj``, ``transformer.ln_f`` and ``lm_head``, whose
weight *is* ``transformer.wte.weight`` (weight tying), so a state dict maps one
to one onto nanoGPT's / Hugging Face's GPT-2 (whose Conv1D weights are the
transposes of these Linear weights).

GELU is the tanh approximation, GPT-2's own ``gelu_new`` (nanoGPT uses the exact
erf form; the difference is below 1e-3 and OpenAI's weights were trained with
the tanh one).

    model = GPT(GPTConfig.tiny(vocab_size=96))
    logits, loss = model(idx, targets)       # idx, targets: (B, T) int64
"""
import dataclasses
import math

import pyflow
from pyflow import nn
from pyflow.nn import functional as F

__all__ = ["GPTConfig", "GPT", "PRESETS"]


@dataclasses.dataclass
class GPTConfig:
    block_size: int = 1024     # the longest context (number of positions)
    vocab_size: int = 50257    # GPT-2's BPE vocabulary
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True          # biases in Linear layers and LayerNorms, as GPT-2

    def __post_init__(self):
        for name in ("block_size", "vocab_size", "n_layer", "n_head", "n_embd"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"GPTConfig: {name} must be a positive int, got {value!r}")
        if self.n_embd % self.n_head:
            raise ValueError(f"GPTConfig: n_embd ({self.n_embd}) must be a multiple of n_head "
                             f"({self.n_head})")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"GPTConfig: dropout must be in [0, 1), got {self.dropout!r}")

    # The GPT-2 family (nanoGPT's from_pretrained table) and two CPU-sized presets.
    @classmethod
    def gpt2(cls, **kw):          # 124M
        return cls(**{**dict(n_layer=12, n_head=12, n_embd=768), **kw})

    @classmethod
    def gpt2_medium(cls, **kw):   # 350M
        return cls(**{**dict(n_layer=24, n_head=16, n_embd=1024), **kw})

    @classmethod
    def gpt2_large(cls, **kw):    # 774M
        return cls(**{**dict(n_layer=36, n_head=20, n_embd=1280), **kw})

    @classmethod
    def gpt2_xl(cls, **kw):       # 1558M
        return cls(**{**dict(n_layer=48, n_head=25, n_embd=1600), **kw})

    @classmethod
    def mini(cls, **kw):          # bench/models_both.py's GPT-mini
        return cls(**{**dict(block_size=128, vocab_size=512, n_layer=4, n_head=4, n_embd=256),
                      **kw})

    @classmethod
    def tiny(cls, **kw):          # a character model that trains in a minute on 2 cores
        return cls(**{**dict(block_size=64, vocab_size=96, n_layer=2, n_head=2, n_embd=64),
                      **kw})

    def to_dict(self):
        return dataclasses.asdict(self)


PRESETS = {"tiny": GPTConfig.tiny, "mini": GPTConfig.mini, "gpt2": GPTConfig.gpt2,
           "gpt2-medium": GPTConfig.gpt2_medium, "gpt2-large": GPTConfig.gpt2_large,
           "gpt2-xl": GPTConfig.gpt2_xl}


class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        # q, k and v of every head come out of one matmul
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head, self.n_embd, self.dropout = config.n_head, config.n_embd, config.dropout

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        # (B, T, C) -> (B, n_head, T, head_size): heads become a batch dimension
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training
                                           else 0.0, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)     # heads side by side again
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU(approximate="tanh")
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        if not isinstance(config, GPTConfig):
            raise TypeError(f"GPT: config must be a GPTConfig, got {type(config).__name__}")
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight     # weight tying, as GPT-2
        self.apply(self._init_weights)
        # GPT-2's scaled init of the residual projections: the residual stream
        # is a sum of 2 * n_layer such outputs, so keep its variance from growing.
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module):
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_params(self, non_embedding=False):
        """Parameters, the tied head counted once; ``non_embedding`` leaves out
        the position embeddings (nanoGPT's convention for reporting sizes)."""
        n = sum(p.numel() for p in self.parameters())
        return n - self.transformer.wpe.weight.numel() if non_embedding else n

    def forward(self, idx, targets=None):
        """Logits (B, T, vocab) and, with ``targets`` (B, T), the mean cross
        entropy (targets of -1 are ignored, as nanoGPT)."""
        if idx.ndim != 2:
            raise ValueError(f"GPT: idx must be (batch, time) token ids, got shape "
                             f"{tuple(idx.shape)}")
        B, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(f"GPT: cannot forward a sequence of length {T}, the block size "
                             f"(context) is only {self.config.block_size}")
        pos = pyflow.arange(T, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(B * T, -1), targets.reshape(B * T),
                                   ignore_index=-1)
        return logits, loss
