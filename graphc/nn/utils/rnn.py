"""Variable-length sequences for the recurrent layers, as torch.nn.utils.rnn.

`pad_sequence` stacks sequences of different lengths into one padded tensor;
`pack_padded_sequence` / `pack_sequence` make a `PackedSequence` (the valid steps of every
sequence, time-major, sequences sorted by decreasing length, `batch_sizes[t]` of them still
running at step t); `pad_packed_sequence` undoes it. `nn.RNN`, `nn.LSTM` and `nn.GRU` take a
`PackedSequence` and return one, with each sequence's last state in `h_n`, as PyTorch.

Packing and unpacking are gathers, slices and concatenations of graphc tensors, so gradients
flow through them; `batch_sizes`, `sorted_indices` and `unsorted_indices` are int64 tensors.

>>> import graphc
>>> from graphc.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
>>> x = graphc.arange(6.0).reshape(3, 2, 1)  # (T=3, B=2, 1): lengths 3 and 1
>>> packed = pack_padded_sequence(x, [3, 1])
>>> packed.data.flatten().tolist(), packed.batch_sizes.tolist()
([0.0, 1.0, 2.0, 4.0], [2, 1, 1])
>>> pad_packed_sequence(packed)[0].flatten().tolist()
[0.0, 1.0, 2.0, 0.0, 4.0, 0.0]
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from graphc.errors import ArgumentError, ShapeError, TraceError
from graphc.ops.movement import cat, stack
from graphc.ops.sources import full
from graphc.tensor import Tensor


def _constant(array: np.ndarray) -> Tensor:
    """A concrete int64 tensor, also inside a trace: the packing layout is Python data that
    a trace fixes (lengths, orders), read back with `_layout` while tracing."""
    return Tensor._wrap(np.ascontiguousarray(array, dtype=np.int64))


def _layout(t: Tensor) -> np.ndarray:
    """The values of a packing-layout tensor (batch_sizes, indices), also inside a trace,
    where they are constants of the graph; refused for a tensor the trace does not know."""
    if t.is_abstract:
        raise TraceError("a PackedSequence's batch_sizes and indices shape the computation, "
                         "so a trace needs their values: pack inside the compiled function "
                         "(lengths as Python data), or call the layer eagerly")
    return t._data


class PackedSequence(NamedTuple):
    """The valid steps of a batch of sequences (see the module docstring)."""

    data: Tensor
    batch_sizes: Tensor
    sorted_indices: Tensor | None = None
    unsorted_indices: Tensor | None = None


def _lengths(lengths) -> np.ndarray:
    if isinstance(lengths, Tensor):
        lengths = _layout(lengths)
    lengths = np.asarray(lengths)
    if lengths.ndim != 1 or not np.issubdtype(lengths.dtype, np.integer):
        raise ArgumentError(f"pack_padded_sequence: lengths must be a 1-D sequence of "
                            f"integers, got {lengths.dtype} of shape {list(lengths.shape)}")
    return lengths.astype(np.int64)


def pack_padded_sequence(input, lengths, batch_first: bool = False,  # noqa: A002
                         enforce_sorted: bool = True) -> PackedSequence:
    """Pack a padded (T, B, *) batch (or (B, T, *) with batch_first) of the given lengths."""
    lengths = _lengths(lengths)
    if enforce_sorted:
        if np.any(np.diff(lengths) > 0):
            raise ArgumentError(
                "`lengths` array must be sorted in decreasing order when `enforce_sorted` is "
                "True. You can pass `enforce_sorted=False` to pack_padded_sequence and/or "
                "pack_sequence to sidestep this requirement if you do not need ONNX "
                "exportability.")
        order = None
    else:
        order = np.argsort(-lengths, kind="stable")
        lengths = lengths[order]
    x = input.transpose(0, 1) if batch_first else input
    if lengths.shape[0] != x.shape[1]:
        raise ShapeError(f"pack_padded_sequence: {lengths.shape[0]} lengths for a batch of "
                         f"{x.shape[1]} sequences")
    if lengths.size and lengths.min() <= 0:
        raise ArgumentError("Length of all samples has to be greater than 0, but found an "
                            "element in 'lengths' that is <= 0")
    if lengths.size and lengths.max() > x.shape[0]:
        raise ShapeError(f"pack_padded_sequence: a length of {lengths.max()} is longer than "
                         f"the {x.shape[0]} steps of the input")
    if order is not None:
        x = x.index_select(1, _constant(order))
    batch_sizes = (lengths[None, :] > np.arange(int(lengths.max()))[:, None]).sum(1)
    data = cat([x[t, :size] for t, size in enumerate(batch_sizes)], 0)
    sorted_indices = unsorted_indices = None
    if order is not None:
        sorted_indices = _constant(order)
        unsorted_indices = _constant(np.argsort(order, kind="stable"))
    return PackedSequence(data, _constant(batch_sizes), sorted_indices, unsorted_indices)


def _padded_sorted(sequence: PackedSequence, padding_value: float = 0.0,
                   total_length: int | None = None):
    """(T, B, *) in the packed (sorted) order, and the sorted lengths as a numpy array."""
    batch_sizes = _layout(sequence.batch_sizes)
    batch, steps = int(batch_sizes[0]), len(batch_sizes)
    if total_length is not None:
        if total_length < steps:
            raise ArgumentError(f"Expected total_length to be at least the length of the "
                                f"longest sequence in input, but got total_length="
                                f"{total_length} and max sequence length being {steps}")
        steps = total_length
    data, rows, offset = sequence.data, [], 0
    tail = tuple(data.shape[1:])
    for t in range(steps):
        size = int(batch_sizes[t]) if t < len(batch_sizes) else 0
        row = data[offset:offset + size]
        offset += size
        if size < batch:
            fill = full((batch - size,) + tail, padding_value, dtype=data.dtype)
            row = cat([row, fill], 0) if size else fill
        rows.append(row)
    lengths = (batch_sizes[None, :] > np.arange(batch)[:, None]).sum(1)
    return stack(rows, 0), lengths


def pad_packed_sequence(sequence: PackedSequence, batch_first: bool = False,
                        padding_value: float = 0.0, total_length: int | None = None):
    """(padded (T, B, *) or (B, T, *), lengths): the inverse of pack_padded_sequence."""
    padded, lengths = _padded_sorted(sequence, padding_value, total_length)
    if sequence.unsorted_indices is not None:
        padded = padded.index_select(1, sequence.unsorted_indices)
        lengths = lengths[_layout(sequence.unsorted_indices)]
    if batch_first:
        padded = padded.transpose(0, 1)
    return padded, _constant(lengths)


def pad_sequence(sequences, batch_first: bool = False, padding_value: float = 0.0,
                 padding_side: str = "right"):
    """Stack (L_i, *) tensors into (max L, B, *) (or (B, max L, *)), padded on one side."""
    if padding_side not in ("left", "right"):
        raise ArgumentError(f"Expected padding_side to be one of left or right, but got "
                            f"{padding_side}.")
    sequences = list(sequences)
    if not sequences:
        raise ArgumentError("received an empty list of sequences")
    longest = max(s.shape[0] for s in sequences)
    rows = []
    for s in sequences:
        missing = longest - s.shape[0]
        if missing:
            fill = full((missing,) + tuple(s.shape[1:]), padding_value, dtype=s.dtype)
            s = cat([s, fill] if padding_side == "right" else [fill, s], 0)
        rows.append(s)
    return stack(rows, 0 if batch_first else 1)


def pack_sequence(sequences, enforce_sorted: bool = True) -> PackedSequence:
    """Pack a list of (L_i, *) tensors (pad_sequence, then pack_padded_sequence)."""
    lengths = [s.shape[0] for s in sequences]
    return pack_padded_sequence(pad_sequence(sequences), lengths,
                                enforce_sorted=enforce_sorted)


__all__ = ["PackedSequence", "pack_padded_sequence", "pack_sequence", "pad_packed_sequence",
           "pad_sequence"]
