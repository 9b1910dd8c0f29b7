"""The OpInfo sweep through ONNX: every sample of every OpInfo entry, traced and exported with
graphc.onnx, passes onnx.checker (full_check), gives graphc's eager outputs in onnxruntime,
and reads back through graphc.onnx.load to the same outputs. An export may only be refused
for a reason the export table gives (random, backward, training-mode and fused ops), and a
sample only skipped when it cannot be traced (a boolean-mask index: a data-dependent shape)."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

pytest.importorskip("onnx", reason="ONNX tests need the [onnx] extra: pip install onnx")
ort = pytest.importorskip("onnxruntime", reason="parity needs the [onnx] extra (onnxruntime)")

import graphc  # noqa: E402
import graphc.onnx  # noqa: E402
from graphc.onnx.export_ops import REFUSED  # noqa: E402
from tests.opinfo import OP_INFOS, OpInfo  # noqa: E402

ALLOWED = ("a random op", "a backward op", "training mode", "a fused group")


def _call(info: OpInfo, sample):
    """(fn, tensors): fn(*tensors) calls the op with the sample's top-level arrays as inputs;
    arrays inside lists (cat, stack) are constants of the trace."""
    positions = [i for i, a in enumerate(sample.args) if isinstance(a, np.ndarray)]

    def convert(a):
        if isinstance(a, (list, tuple)):
            return type(a)(graphc.tensor(v) if isinstance(v, np.ndarray) else v for v in a)
        return a

    def fn(*tensors):
        args = [tensors[positions.index(i)] if i in positions else convert(a)
                for i, a in enumerate(sample.args)]
        return info.op(*args, **sample.kwargs)

    return fn, tuple(graphc.tensor(sample.args[i]) for i in positions)


def _outputs(result) -> list:
    return list(result) if isinstance(result, (tuple, list)) else [result]


def _close(got, want, info: OpInfo, what: str):
    assert got.shape == want.shape, what
    np.testing.assert_allclose(got, want, rtol=max(info.rtol, 1e-4), atol=max(info.atol, 1e-5),
                               equal_nan=True, err_msg=what)


@pytest.mark.parametrize("info", OP_INFOS, ids=[i.name for i in OP_INFOS])
def test_opinfo_exports_match_onnxruntime(info: OpInfo):
    rng = np.random.default_rng(zlib.crc32(f"{info.name}/onnx".encode()))
    exported = 0
    for sample in info.samples(rng):
        fn, tensors = _call(info, sample)
        what = f"{info.name} {sample.desc}"
        try:
            with graphc.no_grad():
                want = [t.numpy() for t in _outputs(fn(*tensors))]
            model = graphc.onnx.to_model(fn, tensors)
        except graphc.TraceError as err:
            assert "depends on the mask" in str(err), f"{what}: {err}"
            continue
        except graphc.onnx.OnnxExportError as err:
            assert any(reason in str(err) for reason in ALLOWED), f"{what}: {err}"
            continue
        exported += 1
        session = ort.InferenceSession(model.SerializeToString(),
                                       providers=["CPUExecutionProvider"])
        feed = {i.name: t.numpy() for i, t in zip(session.get_inputs(), tensors)}
        got = session.run(None, feed)
        assert len(got) == len(want), what
        for g, w in zip(got, want):
            _close(g, w, info, f"{what} (onnxruntime)")
        with graphc.no_grad():
            back = _outputs(graphc.onnx.load(model)(*tensors))
        for g, w in zip(back, want):
            _close(g.numpy(), w, info, f"{what} (graphc.onnx.load)")
    if not any(op in REFUSED for op in info.registry_ops) and info.name not in (
            "getitem", "setitem"):
        assert exported, f"{info.name}: no sample exported"
