"""The one import table: ONNX op type -> the function that runs it with graphc ops.

It joins the six parts: graphc.onnx.import_ops (elementwise and reductions), import_nn
(contractions, convolution, pooling, normalisation), import_shape (constants, shapes and
movement), import_extra (Attention, Resize and the losses), import_rnn (RNN, GRU, LSTM) and
import_quant (integer quantization).
An op type missing here is refused at load time with UnsupportedOnnxOp.
"""

from __future__ import annotations

from graphc.onnx.import_extra import EXTRA_IMPORTERS
from graphc.onnx.import_nn import NN_IMPORTERS
from graphc.onnx.import_ops import ELEMENTWISE_IMPORTERS
from graphc.onnx.import_quant import QUANT_IMPORTERS
from graphc.onnx.import_rnn import RNN_IMPORTERS
from graphc.onnx.import_shape import SHAPE_IMPORTERS

IMPORTERS = {**ELEMENTWISE_IMPORTERS, **NN_IMPORTERS, **SHAPE_IMPORTERS, **EXTRA_IMPORTERS,
             **RNN_IMPORTERS, **QUANT_IMPORTERS}
