"""graphc.nn: modules, layers, parameters, functional ops and initialisers, as torch.nn.

PyTorch model code runs with only its imports changed:
`import graphc.nn as nn`, `import graphc.nn.functional as F`.

>>> import graphc
>>> import graphc.nn as nn
>>> net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
>>> sum(p.numel() for p in net.parameters())
58
"""

from graphc.nn import functional, init, utils
from graphc.nn.module import Module, ModuleAssignmentError, StateDictError
from graphc.nn.modules import *  # noqa: F403
from graphc.nn.modules import __all__ as _modules_all
from graphc.nn.parameter import Buffer, Parameter

__all__ = ["Buffer", "Module", "ModuleAssignmentError", "Parameter", "StateDictError",
           "functional", "init", "utils", *_modules_all]
