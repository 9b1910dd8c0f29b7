"""The layers added for today's vision and recurrent models (issue 12), gathered here so the
package `__init__` files re-export them with one line each: convolution (Conv1d,
ConvTranspose1d/2d), adaptive pooling, activations, padding, resizing, channel dropout and the
recurrent layers."""

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
from graphc.nn.modules.conv import Conv1d, ConvTranspose1d, ConvTranspose2d
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
)
from graphc.nn.modules.rnn import GRU, LSTM, RNN, GRUCell, LSTMCell, RNNBase, RNNCell, RNNCellBase
from graphc.nn.modules.upsampling import (
    Dropout1d,
    Dropout2d,
    Upsample,
    UpsamplingBilinear2d,
    UpsamplingNearest2d,
)

__all__ = [
    "AdaptiveAvgPool1d", "AdaptiveAvgPool2d", "AdaptiveMaxPool1d", "AdaptiveMaxPool2d",
    "CircularPad1d", "CircularPad2d", "ConstantPad1d", "ConstantPad2d", "Conv1d",
    "ConvTranspose1d", "ConvTranspose2d", "Dropout1d", "Dropout2d", "ELU", "GRU", "GRUCell",
    "Hardsigmoid", "Hardswish", "Hardtanh", "LSTM", "LSTMCell", "Mish", "PReLU", "RNN",
    "RNNBase", "RNNCell", "RNNCellBase", "ReLU6", "ReflectionPad1d", "ReflectionPad2d",
    "ReplicationPad1d", "ReplicationPad2d", "SiLU", "Softplus", "Upsample",
    "UpsamplingBilinear2d", "UpsamplingNearest2d", "ZeroPad1d", "ZeroPad2d",
]
