"""Tensors cross to numpy and PyTorch without copies: __array__, the array interface and
DLPack, both ways."""

import numpy as np
import pytest

import graphc


def test_numpy_reads_graphc_memory_without_a_copy():
    t = graphc.arange(6.0).reshape(2, 3)
    for view in (np.asarray(t), np.from_dlpack(t)):
        t.numpy()[0, 0] = 42.0
        assert view[0, 0] == 42.0 and view.shape == (2, 3)


def test_from_dlpack_shares_and_widens():
    a = np.arange(3.0)
    t = graphc.from_dlpack(a)
    a[1] = -1.0
    assert t.tolist() == [0.0, -1.0, 2.0] and t.dtype is graphc.float64
    small = graphc.from_dlpack(np.arange(3, dtype=np.int32))
    assert small.dtype is graphc.int64 and small.tolist() == [0, 1, 2]
    with pytest.raises(TypeError, match="graphc.from_dlpack: cannot take"):
        graphc.from_dlpack([1, 2])


def test_torch_takes_graphc_tensors_and_gives_them_back():
    torch = pytest.importorskip("torch")
    t = graphc.arange(6.0).reshape(2, 3)
    shared = [torch.as_tensor(t), torch.from_dlpack(t)]
    t.numpy()[1, 2] = 9.0
    assert all(s[1, 2].item() == 9.0 and s.dtype == torch.float32 for s in shared)
    back = graphc.from_dlpack(torch.arange(4.0))
    assert back.tolist() == [0.0, 1.0, 2.0, 3.0]
    model = torch.nn.Linear(3, 2)
    weights = {"weight": graphc.ones(2, 3), "bias": graphc.zeros(2)}
    model.load_state_dict({k: torch.as_tensor(v) for k, v in weights.items()})
    assert model.weight.sum().item() == 6.0


def test_a_trace_refuses_to_hand_out_memory():
    f = graphc.compile(lambda x: np.asarray(x) + 1, backend="interp")
    with pytest.raises(graphc.TraceError if hasattr(graphc, "TraceError") else Exception):
        f(graphc.ones(2))
