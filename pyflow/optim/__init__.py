"""pyflow.optim: optimizers (SGD, Adam, AdamW) and learning-rate schedulers,
with torch.optim's classes, signatures and state_dict layout."""
from . import lr_scheduler
from .adam import Adam, AdamW
from .optimizer import Optimizer
from .sgd import SGD

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "lr_scheduler"]
