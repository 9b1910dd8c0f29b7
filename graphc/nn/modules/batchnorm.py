"""Batch normalisation: `BatchNorm1d` (N, C) / (N, C, L), `BatchNorm2d` (N, C, H, W) and
`BatchNorm3d` (N, C, D, H, W).

As in PyTorch: `running_mean`, `running_var` and `num_batches_tracked` are buffers (when
`track_running_stats`); `momentum=None` makes the running statistics a cumulative average
(factor 1 / num_batches_tracked); training normalises with the batch statistics, evaluation
with the running ones (or the batch's when no running statistics are kept).
"""

from __future__ import annotations

import graphc
from graphc.errors import ArgumentError
from graphc.nn import functional as F
from graphc.nn import init
from graphc.nn.module import Module
from graphc.nn.parameter import Parameter
from graphc.types import int64


class _BatchNorm(Module):
    _version = 2

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1,
                 affine: bool = True, track_running_stats: bool = True, device=None,
                 dtype=None, *, bias: bool = True) -> None:
        super().__init__()
        kw = {"dtype": dtype} if dtype is not None else {}
        self.num_features = num_features
        self.eps = eps
        self.momentum = momentum
        self.affine = affine
        self.track_running_stats = track_running_stats
        if affine:
            self.weight = Parameter(graphc.empty(num_features, **kw))
            if bias:
                self.bias = Parameter(graphc.empty(num_features, **kw))
            else:
                self.register_parameter("bias", None)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        if track_running_stats:
            self.register_buffer("running_mean", graphc.zeros(num_features, **kw))
            self.register_buffer("running_var", graphc.ones(num_features, **kw))
            self.register_buffer("num_batches_tracked", graphc.tensor(0, dtype=int64))
        else:
            self.register_buffer("running_mean", None)
            self.register_buffer("running_var", None)
            self.register_buffer("num_batches_tracked", None)
        self.reset_parameters()

    def reset_running_stats(self) -> None:
        if self.track_running_stats:
            self.running_mean.zero_()
            self.running_var.fill_(1)
            self.num_batches_tracked.zero_()

    def reset_parameters(self) -> None:
        self.reset_running_stats()
        if self.affine:
            init.ones_(self.weight)
            if self.bias is not None:
                init.zeros_(self.bias)

    def _check_input_dim(self, input) -> None:  # noqa: A002
        """The base class takes any (N, C, ...) input; each subclass narrows the rank."""
        if input.dim() < 2:
            raise ArgumentError(f"expected 2D or more input (got {input.dim()}D input)")

    def forward(self, input):  # noqa: A002
        self._check_input_dim(input)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            with graphc.no_grad():
                self.num_batches_tracked.add_(1)
            if self.momentum is None:  # cumulative moving average
                # a 0-d tensor, not a float read off the buffer: a compiled step keeps it
                # per call (PyTorch computes the same 1 / n in double)
                factor = 1.0 / self.num_batches_tracked.to(self.running_mean.dtype)
        if self.training:
            bn_training = True
        else:
            bn_training = self.running_mean is None and self.running_var is None
        use_running = not self.training or self.track_running_stats
        return F.batch_norm(input, self.running_mean if use_running else None,
                            self.running_var if use_running else None, self.weight, self.bias,
                            bn_training, factor, self.eps)

    def extra_repr(self) -> str:
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, "
                f"affine={self.affine}, bias={self.bias is not None}, "
                f"track_running_stats={self.track_running_stats}")

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs) -> None:
        version = local_metadata.get("version", None)
        if (version is None or version < 2) and self.track_running_stats:
            # Checkpoints from before num_batches_tracked existed: start it at 0 (PyTorch).
            key = prefix + "num_batches_tracked"
            if key not in state_dict:
                state_dict[key] = (self.num_batches_tracked
                                   if self.num_batches_tracked is not None
                                   else graphc.tensor(0, dtype=int64))
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)


class BatchNorm1d(_BatchNorm):
    """Batch norm over (N, C) or (N, C, L) inputs.

    >>> import graphc.nn as nn
    >>> nn.BatchNorm1d(4)
    BatchNorm1d(4, eps=1e-05, momentum=0.1, affine=True, bias=True, track_running_stats=True)
    """

    def _check_input_dim(self, input) -> None:  # noqa: A002
        if input.dim() != 2 and input.dim() != 3:
            raise ArgumentError(f"expected 2D or 3D input (got {input.dim()}D input)")


class BatchNorm2d(_BatchNorm):
    """Batch norm over (N, C, H, W) inputs, one mean and variance per channel."""

    def _check_input_dim(self, input) -> None:  # noqa: A002
        if input.dim() != 4:
            raise ArgumentError(f"expected 4D input (got {input.dim()}D input)")


class BatchNorm3d(_BatchNorm):
    """Batch norm over (N, C, D, H, W) inputs (volumes), one mean and variance per channel."""

    def _check_input_dim(self, input) -> None:  # noqa: A002
        if input.dim() != 5:
            raise ArgumentError(f"expected 5D input (got {input.dim()}D input)")
