"""`graphc.save` / `graphc.load`: pickle tensors, state dicts and modules to a file.

Tensors pickle as their array plus `requires_grad` (graphc.Tensor.__reduce_ex__), so a saved
`state_dict()` loads back into a model with `load_state_dict`. As with any pickle, only load
files you trust.
"""

from __future__ import annotations

import io
import os
import pickle
from typing import Any, BinaryIO


def save(obj: Any, f: str | os.PathLike | BinaryIO) -> None:
    """Write `obj` (tensors, dicts of tensors, modules, optimizer state) to a path or file."""
    if isinstance(f, (str, os.PathLike)):
        with open(f, "wb") as fh:
            pickle.dump(obj, fh, protocol=pickle.HIGHEST_PROTOCOL)
    else:
        pickle.dump(obj, f, protocol=pickle.HIGHEST_PROTOCOL)


def load(f: str | os.PathLike | BinaryIO | bytes, map_location=None, weights_only=None) -> Any:
    """Read back what `save` wrote. `map_location` and `weights_only` are accepted for
    PyTorch compatibility; graphc has only the CPU and always unpickles fully."""
    if isinstance(f, (bytes, bytearray)):
        return pickle.load(io.BytesIO(f))
    if isinstance(f, (str, os.PathLike)):
        with open(f, "rb") as fh:
            return pickle.load(fh)
    return pickle.load(f)
