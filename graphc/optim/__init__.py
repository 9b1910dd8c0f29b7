"""graphc.optim: optimizers with PyTorch's semantics, whose updates are graphc ops.

`SGD`, `Adam` and `AdamW` follow `torch.optim` formula for formula (see each module's
docstring); `Optimizer` is the base (parameter groups, state, zero_grad, state_dict). Because
every update is written with graphc tensor ops under `no_grad`, a trace of a training step
records the optimizer update as graph ops, and the whole step can compile into one executable.

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

from graphc.optim.adam import Adam, AdamW
from graphc.optim.optimizer import Optimizer, required
from graphc.optim.sgd import SGD

__all__ = ["Adam", "AdamW", "Optimizer", "SGD", "required"]
