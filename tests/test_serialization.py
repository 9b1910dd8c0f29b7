"""graphc.save / graphc.load: PyTorch's checkpoint formats both ways, safetensors, files of
older graphc versions, and hostile or broken files refused without running anything."""

import collections
import io
import os
import pickle
import struct
import zipfile

import numpy as np
import pytest

import graphc
import graphc.nn as nn
from graphc.errors import ArgumentError, GraphcError
from graphc.serialization import SaveError, UnsafeCheckpointError


def _model():
    graphc.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3), nn.ReLU(), nn.Linear(3, 2))


def _same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and tuple(a[k].shape) == tuple(b[k].shape), k
        np.testing.assert_array_equal(a[k].numpy(), b[k].numpy(), err_msg=k)


# ---- graphc round trips --------------------------------------------------------------------
def test_a_state_dict_round_trips_and_loads_into_a_new_model(tmp_path):
    model = _model()
    graphc.save(model.state_dict(), tmp_path / "m.pt")
    loaded = graphc.load(tmp_path / "m.pt")
    assert isinstance(loaded, collections.OrderedDict)
    _same(loaded, model.state_dict())
    fresh = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3), nn.ReLU(), nn.Linear(3, 2))
    fresh.load_state_dict(loaded)
    _same(fresh.state_dict(), model.state_dict())


def test_nested_objects_numbers_and_flags_round_trip():
    w = graphc.randn(3, 2, requires_grad=True)
    obj = {"state": {0: {"step": graphc.tensor(3.0), "buf": graphc.zeros(2)}},
           "groups": [{"lr": 0.01, "betas": (0.9, 0.999), "params": [0, 1], "name": "g",
                       "nesterov": False, "foreach": None, "big": 2**70, "neg": -5}],
           "w": w, "p": nn.Parameter(graphc.ones(2)), "t": w.detach().t()}
    buffer = io.BytesIO()
    graphc.save(obj, buffer)
    back = graphc.load(io.BytesIO(buffer.getvalue()))
    assert back["groups"] == obj["groups"]
    assert back["w"].requires_grad and not back["t"].requires_grad
    assert isinstance(back["p"], nn.Parameter)
    np.testing.assert_array_equal(back["t"].numpy(), w.detach().numpy().T)
    np.testing.assert_array_equal(back["state"][0]["buf"].numpy(), np.zeros(2, np.float32))


def test_tied_weights_stay_one_storage():
    w = graphc.randn(4, 4)
    buffer = io.BytesIO()
    graphc.save({"a": w, "b": w}, buffer)
    with zipfile.ZipFile(io.BytesIO(buffer.getvalue())) as archive:
        assert [n for n in archive.namelist() if "/data/" in n] == ["archive/data/0"]


def test_safetensors_round_trip(tmp_path):
    model = _model()
    path = tmp_path / "m.safetensors"
    graphc.save(model.state_dict(), path)
    _same(graphc.load(path), model.state_dict())


def test_safetensors_needs_a_flat_dict_of_tensors(tmp_path):
    with pytest.raises(SaveError, match="flat dict of tensors"):
        graphc.save({"a": {"b": graphc.ones(1)}}, tmp_path / "x.safetensors")


def test_modules_and_arbitrary_objects_are_refused_with_what_to_do(tmp_path):
    with pytest.raises(SaveError, match=r"save model.state_dict\(\)"):
        graphc.save(_model(), tmp_path / "m.pt")
    assert not (tmp_path / "m.pt").exists()  # nothing half-written
    with pytest.raises(SaveError, match=r"obj\['x'\] is a builtins.object"):
        graphc.save({"x": object()}, io.BytesIO())


def test_files_of_older_graphc_versions_still_load(tmp_path):
    path = tmp_path / "old.pkl"
    path.write_bytes(pickle.dumps({"w": graphc.ones(2), "p": nn.Parameter(graphc.zeros(1))}))
    back = graphc.load(path)
    np.testing.assert_array_equal(back["w"].numpy(), np.ones(2, np.float32))
    assert isinstance(back["p"], nn.Parameter)


# ---- hostile and broken files ------------------------------------------------------------------
class _RunsCode:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_pickle_that_would_run_code_is_refused_with_or_without_weights_only(tmp_path):
    marker = tmp_path / "ran"
    path = tmp_path / "evil.pt"
    path.write_bytes(pickle.dumps({"w": _RunsCode(marker)}))
    for kwargs in ({}, {"weights_only": True}):
        with pytest.raises(UnsafeCheckpointError, match=r"asks to call posix\.system") as err:
            graphc.load(path, **kwargs)
        assert "weights_only=False" in str(err.value)
        assert isinstance(err.value, pickle.UnpicklingError)
    assert not marker.exists()


def test_a_zip_checkpoint_whose_pickle_would_run_code_is_refused(tmp_path):
    marker = tmp_path / "ran"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("archive/data.pkl", pickle.dumps(_RunsCode(marker), protocol=2))
    with pytest.raises(UnsafeCheckpointError):
        graphc.load(buffer.getvalue())
    assert not marker.exists()


def test_numpy_object_arrays_are_refused():
    payload = pickle.dumps(np.array([1, "x"], dtype=object))
    with pytest.raises(UnsafeCheckpointError, match="Python objects"):
        graphc.load(payload)


@pytest.mark.parametrize("cut", [10, 100, -30, -5])
def test_a_truncated_checkpoint_is_a_clear_error(cut):
    buffer = io.BytesIO()
    graphc.save({"w": graphc.randn(8, 8)}, buffer)
    data = buffer.getvalue()[:cut]
    with pytest.raises(GraphcError, match="truncated|corrupt|neither"):
        graphc.load(data)


def test_a_storage_shorter_than_its_tensor_is_refused():
    buffer = io.BytesIO()
    graphc.save({"w": graphc.randn(8)}, buffer)
    original = zipfile.ZipFile(io.BytesIO(buffer.getvalue()))
    damaged = io.BytesIO()
    with zipfile.ZipFile(damaged, "w") as archive:
        for name in original.namelist():
            data = original.read(name)
            archive.writestr(name, data[:8] if name.endswith("/data/0") else data)
    with pytest.raises(GraphcError, match="holds 8 bytes, expected 32"):
        graphc.load(damaged.getvalue())


@pytest.mark.parametrize("data, message", [
    (b"", "is empty"),
    (b"hello world, not a checkpoint", "neither a PyTorch checkpoint nor a safetensors"),
    (struct.pack("<Q", 5) + b"{bad}", "not a valid safetensors file"),
])
def test_a_file_that_is_no_checkpoint_says_so(data, message):
    with pytest.raises(GraphcError, match=message):
        graphc.load(data)


def test_map_location_other_than_the_host_is_refused():
    buffer = io.BytesIO()
    graphc.save({"w": graphc.ones(1)}, buffer)
    assert graphc.load(io.BytesIO(buffer.getvalue()), map_location="cpu")["w"].shape == (1,)
    with pytest.raises(ArgumentError, match="map_location='cuda:1'"):
        graphc.load(io.BytesIO(buffer.getvalue()), map_location="cuda:1")


# ---- PyTorch, both ways --------------------------------------------------------------------
@pytest.fixture
def torch():
    return pytest.importorskip("torch", reason="PyTorch parity needs the parity extra")


def _torch_model(torch):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3),
                               torch.nn.ReLU(), torch.nn.Linear(3, 2))


@pytest.mark.parametrize("legacy", [False, True])
def test_torch_save_files_load_into_graphc_models_and_agree(torch, tmp_path, legacy):
    tm = _torch_model(torch)
    tm.train()
    tm(torch.randn(6, 4))  # running statistics move
    path = tmp_path / "t.pt"
    torch.save(tm.state_dict(), path, _use_new_zipfile_serialization=not legacy)
    sd = graphc.load(path)
    gm = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3), nn.ReLU(), nn.Linear(3, 2))
    gm.load_state_dict(sd)
    gm.eval()
    tm.eval()
    x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    np.testing.assert_allclose(gm(graphc.tensor(x)).detach().numpy(),
                               tm(torch.from_numpy(x)).detach().numpy(), rtol=1e-5, atol=1e-6)


def test_graphc_save_files_load_in_torch_with_weights_only(torch, tmp_path):
    model = _model()
    path = tmp_path / "g.pt"
    graphc.save({"model": model.state_dict(), "epoch": 7, "p": nn.Parameter(graphc.ones(2))},
                path)
    back = torch.load(path, weights_only=True)
    assert back["epoch"] == 7 and isinstance(back["p"], torch.nn.Parameter)
    tm = _torch_model(torch)
    tm.load_state_dict(back["model"])
    for k, v in model.state_dict().items():
        np.testing.assert_array_equal(back["model"][k].numpy(), v.numpy(), err_msg=k)


def test_a_torch_optimizer_checkpoint_loads_and_goes_back(torch, tmp_path):
    tm = _torch_model(torch)
    opt = torch.optim.Adam(tm.parameters(), lr=0.01)
    tm(torch.randn(6, 4)).sum().backward()
    opt.step()
    torch.save(opt.state_dict(), tmp_path / "opt.pt")
    state = graphc.load(tmp_path / "opt.pt")
    assert state["param_groups"][0]["betas"] == (0.9, 0.999)
    graphc.save(state, tmp_path / "again.pt")
    again = torch.load(tmp_path / "again.pt", weights_only=True)
    torch.testing.assert_close(again["state"][0]["exp_avg"], opt.state_dict()["state"][0][
        "exp_avg"])


@pytest.mark.parametrize("name", ["SGD", "Adam", "AdamW", "RMSprop"])
def test_optimizer_state_dicts_interchange_both_ways(torch, tmp_path, name):
    """A PyTorch optimizer checkpoint resumes in graphc and a graphc one in PyTorch: the next
    step of each matches the other library's."""
    kwargs = {"SGD": {"lr": 0.1, "momentum": 0.9}, "Adam": {"lr": 0.01},
              "AdamW": {"lr": 0.01}, "RMSprop": {"lr": 0.01}}[name]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 3)).astype(np.float32)

    def torch_side():
        torch.manual_seed(0)
        m = torch.nn.Linear(3, 2)
        return m, getattr(torch.optim, name)(m.parameters(), **kwargs)

    def graphc_side(like):
        m = nn.Linear(3, 2)
        m.load_state_dict({k: graphc.tensor(v.detach().numpy()) for k, v in
                           like.state_dict().items()})
        return m, getattr(graphc.optim, name)(m.parameters(), **kwargs)

    def torch_step(m, opt):
        opt.zero_grad()
        (m(torch.from_numpy(x)) ** 2).sum().backward()
        opt.step()

    def graphc_step(m, opt):
        opt.zero_grad()
        (m(graphc.tensor(x)) ** 2).sum().backward()
        opt.step()

    tm, topt = torch_side()
    torch_step(tm, topt)  # one step in PyTorch, then its checkpoint resumes in graphc
    torch.save({"model": tm.state_dict(), "opt": topt.state_dict()}, tmp_path / "t.pt")
    ck = graphc.load(tmp_path / "t.pt")
    gm, gopt = graphc_side(tm)
    gm.load_state_dict(ck["model"])
    gopt.load_state_dict(ck["opt"])
    graphc_step(gm, gopt)
    torch_step(tm, topt)
    for g, t in zip(gm.parameters(), tm.parameters()):
        np.testing.assert_allclose(g.detach().numpy(), t.detach().numpy(), rtol=1e-5,
                                   atol=1e-6)
    # and back: graphc's checkpoint resumes in PyTorch
    graphc.save({"model": gm.state_dict(), "opt": gopt.state_dict()}, tmp_path / "g.pt")
    back = torch.load(tmp_path / "g.pt", weights_only=True)
    tm2, topt2 = torch_side()
    tm2.load_state_dict(back["model"])
    topt2.load_state_dict(back["opt"])
    torch_step(tm2, topt2)
    graphc_step(gm, gopt)
    for g, t in zip(gm.parameters(), tm2.parameters()):
        np.testing.assert_allclose(g.detach().numpy(), t.detach().numpy(), rtol=1e-5,
                                   atol=1e-6)
