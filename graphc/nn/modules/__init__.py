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
from graphc.nn.modules.activation_extra import (
    ELU,
    Hardsigmoid,
    Hardswish,
    Hardtanh,
    Mish,
    PReLU,
    ReLU6,
    SiLU,
    Softplus,
)
from graphc.nn.modules.batchnorm import BatchNorm1d, BatchNorm2d, BatchNorm3d
from graphc.nn.modules.container import ModuleDict, ModuleList, Sequential
from graphc.nn.modules.conv import Conv1d, Conv2d, ConvTranspose1d, ConvTranspose2d
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
from graphc.nn.modules.padding import (
    CircularPad1d,
    CircularPad2d,
    ConstantPad1d,
    ConstantPad2d,
    ReflectionPad1d,
    ReflectionPad2d,
    ReplicationPad1d,
    ReplicationPad2d,
    ZeroPad1d,
    ZeroPad2d,
)
from graphc.nn.modules.pooling import (
    AdaptiveAvgPool1d,
    AdaptiveAvgPool2d,
    AdaptiveMaxPool1d,
    AdaptiveMaxPool2d,
    AvgPool2d,
    MaxPool2d,
)
from graphc.nn.modules.rnn import GRU, LSTM, RNN, GRUCell, LSTMCell, RNNBase, RNNCell, RNNCellBase
from graphc.nn.modules.sparse import Embedding
from graphc.nn.modules.transformer import (
    MultiheadAttention,
    Transformer,
    TransformerDecoder,
    TransformerDecoderLayer,
    TransformerEncoder,
    TransformerEncoderLayer,
)
from graphc.nn.modules.upsampling import (
    Dropout1d,
    Dropout2d,
    Upsample,
    UpsamplingBilinear2d,
    UpsamplingNearest2d,
)

__all__ = [
    "AdaptiveAvgPool1d", "AdaptiveAvgPool2d", "AdaptiveMaxPool1d", "AdaptiveMaxPool2d",
    "AvgPool2d", "BCELoss", "BCEWithLogitsLoss", "BatchNorm1d", "BatchNorm2d", "BatchNorm3d",
    "CircularPad1d", "CircularPad2d", "ConstantPad1d", "ConstantPad2d", "Conv1d", "Conv2d",
    "ConvTranspose1d", "ConvTranspose2d", "CrossEntropyLoss", "Dropout", "Dropout1d",
    "Dropout2d", "ELU", "Embedding", "Flatten", "GELU", "GRU", "GRUCell", "GroupNorm",
    "Hardsigmoid", "Hardswish", "Hardtanh", "HuberLoss", "Identity", "KLDivLoss", "L1Loss",
    "LSTM", "LSTMCell", "LayerNorm", "LeakyReLU", "Linear", "LogSoftmax", "MSELoss",
    "MaxPool2d", "Mish", "ModuleDict", "ModuleList", "MultiheadAttention", "NLLLoss", "PReLU",
    "RMSNorm", "RNN", "RNNBase", "RNNCell", "RNNCellBase", "ReLU", "ReLU6", "ReflectionPad1d",
    "ReflectionPad2d", "ReplicationPad1d", "ReplicationPad2d", "Sequential", "SiLU",
    "Sigmoid", "SmoothL1Loss", "Softmax", "Softplus", "Tanh", "Transformer",
    "TransformerDecoder", "TransformerDecoderLayer", "TransformerEncoder",
    "TransformerEncoderLayer", "Unflatten", "Upsample", "UpsamplingBilinear2d",
    "UpsamplingNearest2d", "ZeroPad1d", "ZeroPad2d",
]
