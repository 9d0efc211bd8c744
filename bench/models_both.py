"""Benchmark models written once against the PyTorch API and built for either
framework by passing its ``nn`` module: the same code runs on pyflow and torch."""
def mlp(nn):
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024),
                         nn.ReLU(), nn.Linear(1024, 10))


def small_cnn(nn):
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(32 * 7 * 7, 10))


def transformer_block(nn, d=256, heads=4):
    F = nn.functional

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x):
            B, T, C = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
            q, k, v = (t.view(B, T, heads, C // heads).transpose(1, 2) for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).contiguous().view(B, T, C))
            return x + self.out(F.gelu(self.fc(self.ln2(x))))
    return Block()


def gpt_mini(nn, vocab=512, layers=4, d=256, heads=4, context=128):
    """A GPT of ``layers`` pre-norm transformer blocks over token and position
    embeddings, with a tied LM head; ``model(idx)`` returns logits."""
    lib = nn.Module.__module__.split(".")[0]
    arange = __import__(lib).arange

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(context, d)
            self.blocks = nn.ModuleList([transformer_block(nn, d, heads) for _ in range(layers)])
            self.ln = nn.LayerNorm(d)

        def forward(self, idx):
            x = self.tok(idx) + self.pos(arange(idx.shape[1]))
            for block in self.blocks:
                x = block(x)
            return nn.functional.linear(self.ln(x), self.tok.weight)    # tied head
    return GPT()


__all__ = ["mlp", "small_cnn", "transformer_block", "gpt_mini"]
