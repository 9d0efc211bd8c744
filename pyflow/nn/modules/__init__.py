"""The layers of pyflow.nn, one small module per family (PyTorch's names)."""
from .activation import GELU, LogSoftmax, ReLU, Sigmoid, SiLU, Softmax, Tanh
from .container import ModuleDict, ModuleList, Sequential
from .conv import Conv2d
from .dropout import Dropout
from .flatten import Flatten, Unflatten
from .linear import Identity, Linear
from .loss import BCEWithLogitsLoss, CrossEntropyLoss, L1Loss, MSELoss, NLLLoss
from .normalization import BatchNorm1d, BatchNorm2d, GroupNorm, LayerNorm, RMSNorm
from .pooling import AdaptiveAvgPool2d, AvgPool2d, MaxPool2d
from .sparse import Embedding

__all__ = ["GELU", "LogSoftmax", "ReLU", "Sigmoid", "SiLU", "Softmax", "Tanh", "ModuleDict",
           "ModuleList", "Sequential", "Conv2d", "Dropout", "Flatten", "Unflatten", "Identity",
           "Linear", "BCEWithLogitsLoss", "CrossEntropyLoss", "L1Loss", "MSELoss", "NLLLoss",
           "BatchNorm1d", "BatchNorm2d", "GroupNorm", "LayerNorm", "RMSNorm", "AdaptiveAvgPool2d",
           "AvgPool2d", "MaxPool2d", "Embedding"]
