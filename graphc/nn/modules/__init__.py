"""The layers of graphc.nn, one group per file (re-exported as graphc.nn.<Layer>)."""

from graphc.nn.modules.activation import (
    GELU,
    LeakyReLU,
    LogSoftmax,
    ReLU,
    Sigmoid,
    Softmax,
    Tanh,
)
from graphc.nn.modules.batchnorm import BatchNorm1d, BatchNorm2d
from graphc.nn.modules.container import ModuleDict, ModuleList, Sequential
from graphc.nn.modules.conv import Conv2d
from graphc.nn.modules.linear import Identity, Linear
from graphc.nn.modules.loss import BCEWithLogitsLoss, CrossEntropyLoss, MSELoss, NLLLoss
from graphc.nn.modules.misc import Dropout, Flatten, Unflatten
from graphc.nn.modules.pooling import AvgPool2d, MaxPool2d
from graphc.nn.modules.sparse import Embedding

__all__ = [
    "AvgPool2d", "BCEWithLogitsLoss", "BatchNorm1d", "BatchNorm2d", "Conv2d", "CrossEntropyLoss",
    "Dropout", "Embedding", "Flatten", "GELU", "Identity", "LeakyReLU", "Linear", "LogSoftmax",
    "MSELoss", "MaxPool2d", "ModuleDict", "ModuleList", "NLLLoss", "ReLU", "Sequential",
    "Sigmoid", "Softmax", "Tanh", "Unflatten",
]
from graphc.nn.modules.layers_issue12 import *  # noqa: E402,F401,F403  (issue 12 layers)
