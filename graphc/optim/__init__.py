"""graphc.optim: optimizers with PyTorch's semantics, whose updates are graphc ops.

`SGD`, `Adam`, `AdamW`, `RMSprop` and `Adagrad` follow `torch.optim` formula for formula
(see each module's docstring); `Optimizer` is the base (parameter groups, state, zero_grad,
state_dict); `lr_scheduler` holds PyTorch's learning-rate schedulers, whose rates are runtime
inputs of a compiled step. Because every update is written with graphc tensor ops under
`no_grad`, a trace of a training step records the optimizer update as graph ops, and the whole
step can compile into one executable.

>>> import graphc
>>> from graphc import optim
>>> w = graphc.tensor([3.0], requires_grad=True)
>>> opt = optim.SGD([w], lr=0.25)
>>> for _ in range(2):
...     opt.zero_grad()
...     (w * w).sum().backward()
...     opt.step()
>>> w
tensor([0.7500], requires_grad=True)
"""

from graphc.optim import lr_scheduler
from graphc.optim.adagrad import Adagrad
from graphc.optim.adam import Adam, AdamW
from graphc.optim.optimizer import Optimizer, required
from graphc.optim.rmsprop import RMSprop
from graphc.optim.sgd import SGD

__all__ = ["Adagrad", "Adam", "AdamW", "Optimizer", "RMSprop", "SGD", "lr_scheduler", "required"]
