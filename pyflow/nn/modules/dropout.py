"""Dropout: zero elements with probability p while training, scale the rest by 1/(1-p)."""
from .. import functional as F
from ..module import Module

__all__ = ["Dropout"]


class Dropout(Module):
    def __init__(self, p=0.5, inplace=False):
        super().__init__()
        if not isinstance(p, (int, float)):     # PyTorch: a TypeError from its comparison
            raise TypeError(f"Dropout: p must be a number between 0 and 1, got "
                            f"{type(p).__name__}")
        if not 0 <= p <= 1:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
        self.p = p
        self.inplace = inplace

    def forward(self, input):
        if not self.training or self.p == 0:
            return self._check_input(input)  # identity, no op call: eval mode costs nothing
        return F.dropout(input, self.p, self.training, self.inplace)

    def extra_repr(self):
        return f"p={self.p}, inplace={self.inplace}"
