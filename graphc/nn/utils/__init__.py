"""graphc.nn.utils: gradient clipping and variable-length sequences (`rnn`), as torch.nn.utils.

>>> import graphc
>>> import graphc.nn as nn
>>> w = graphc.tensor([3.0, 4.0], requires_grad=True)
>>> w.grad = graphc.tensor([3.0, 4.0])
>>> nn.utils.clip_grad_norm_([w], max_norm=1.0)
tensor(5.)
"""

from graphc.nn.utils import rnn
from graphc.nn.utils.clip_grad import clip_grad_norm_, clip_grad_value_, get_total_norm

__all__ = ["clip_grad_norm_", "clip_grad_value_", "get_total_norm", "rnn"]
