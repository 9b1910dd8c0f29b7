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
from graphc.nn.modules.loss import (
    BCELoss,
    BCEWithLogitsLoss,
    CrossEntropyLoss,
    HuberLoss,
    KLDivLoss,
    L1Loss,
    MSELoss,
    NLLLoss,
    SmoothL1Loss,
)
from graphc.nn.modules.misc import Dropout, Flatten, Unflatten
from graphc.nn.modules.normalization import GroupNorm, LayerNorm, RMSNorm
from graphc.nn.modules.pooling import AvgPool2d, MaxPool2d
from graphc.nn.modules.sparse import Embedding
from graphc.nn.modules.transformer import (
    MultiheadAttention,
    Transformer,
    TransformerDecoder,
    TransformerDecoderLayer,
    TransformerEncoder,
    TransformerEncoderLayer,
)

__all__ = [
    "AvgPool2d", "BCELoss", "BCEWithLogitsLoss", "BatchNorm1d", "BatchNorm2d", "Conv2d",
    "CrossEntropyLoss", "Dropout", "Embedding", "Flatten", "GELU", "GroupNorm", "HuberLoss",
    "Identity", "KLDivLoss", "L1Loss", "LayerNorm", "LeakyReLU", "Linear", "LogSoftmax",
    "MSELoss", "MaxPool2d", "ModuleDict", "ModuleList", "MultiheadAttention", "NLLLoss", "RMSNorm",
    "ReLU", "Sequential", "Sigmoid", "SmoothL1Loss", "Softmax", "Tanh", "Transformer",
    "TransformerDecoder", "TransformerDecoderLayer", "TransformerEncoder",
    "TransformerEncoderLayer", "Unflatten",
]
from graphc.nn.modules.layers_issue12 import *  # noqa: E402,F401,F403  (issue 12 layers)
