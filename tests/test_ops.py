"""Generic op tests driven by the OpInfo table (tests/opinfo.py)."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

import graphc
from graphc.ops.registry import REGISTRY
from tests.conftest import torch_or_skip
from tests.opinfo import COVERAGE_EXEMPT, OP_INFOS, OpInfo, Sample

IDS = [info.name for info in OP_INFOS]


def _rng(info: OpInfo, kind: str) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(f"{info.name}/{kind}".encode()))


def _map_arrays(value, fn):
    if isinstance(value, np.ndarray):
        return fn(value)
    if isinstance(value, (list, tuple)) and any(isinstance(v, np.ndarray) for v in value):
        return type(value)(_map_arrays(v, fn) for v in value)
    return value


def _to_graphc(sample: Sample, dtype=None, requires_grad_idx=()):
    def convert(a):
        if dtype is not None and np.issubdtype(a.dtype, np.floating):
            a = a.astype(dtype)
        return graphc.tensor(a)

    args = [_map_arrays(a, convert) for a in sample.args]
    for i in requires_grad_idx:
        args[i].requires_grad_(True)
    return args, dict(sample.kwargs)


def _outputs(result) -> list:
    return list(result) if isinstance(result, (tuple, list)) else [result]


def _grad_args(sample: Sample) -> tuple[int, ...]:
    if sample.grad_args is not None:
        return sample.grad_args
    return tuple(i for i, a in enumerate(sample.args)
                 if isinstance(a, np.ndarray) and np.issubdtype(a.dtype, np.floating))


def _skip_if(info: OpInfo, kind: str) -> None:
    if kind in info.skips:
        pytest.skip(info.skips[kind])


@pytest.mark.parametrize("info", OP_INFOS, ids=IDS)
def test_eager_matches_reference(info: OpInfo):
    _skip_if(info, "ref")
    for sample in info.samples(_rng(info, "ref")):
        args, kwargs = _to_graphc(sample)
        got = _outputs(info.op(*args, **kwargs))
        ref_args = [_map_arrays(a, lambda x: x.astype(np.float64)
                                if np.issubdtype(x.dtype, np.floating) else x)
                    for a in sample.args]
        want = _outputs(info.ref(*ref_args, **sample.kwargs))
        assert len(got) == len(want), f"{info.name} {sample.desc}: output count"
        for g, w in zip(got, want):
            w = np.asarray(w)
            assert tuple(g.shape) == w.shape, f"{info.name} {sample.desc}: shape"
            if info.exact or not np.issubdtype(w.dtype, np.floating):
                np.testing.assert_array_equal(g.numpy(), w, err_msg=f"{info.name} {sample.desc}")
            else:
                np.testing.assert_allclose(g.detach().numpy(), w, atol=info.atol,
                                           rtol=info.rtol, err_msg=f"{info.name} {sample.desc}")


@pytest.mark.parametrize("info", [i for i in OP_INFOS if i.differentiable],
                         ids=[i.name for i in OP_INFOS if i.differentiable])
def test_gradcheck_float64(info: OpInfo):
    _skip_if(info, "gradcheck")
    for sample in info.samples(_rng(info, "grad")):
        idx = _grad_args(sample)
        if not idx:
            continue
        args, kwargs = _to_graphc(sample, np.float64, idx)

        def fn(*tensors):
            full = list(args)
            for i, t in zip(idx, tensors):
                full[i] = t
            return info.op(*full, **kwargs)

        assert graphc.autograd.gradcheck(fn, tuple(args[i] for i in idx),
                                         atol=info.grad_atol, rtol=info.grad_rtol), sample.desc


def _torch_args(torch, sample: Sample, grad_idx=()):
    def convert(a):
        return torch.from_numpy(np.array(a, copy=True))

    args = [_map_arrays(a, convert) for a in sample.args]
    for i in grad_idx:
        args[i].requires_grad_(True)
    return args


@pytest.mark.parametrize("info", [i for i in OP_INFOS if i.torch_fn is not None],
                         ids=[i.name for i in OP_INFOS if i.torch_fn is not None])
def test_torch_parity(info: OpInfo):
    torch = torch_or_skip()
    _skip_if(info, "torch")
    for sample in info.samples(_rng(info, "torch")):
        idx = _grad_args(sample) if info.differentiable else ()
        gargs, kwargs = _to_graphc(sample, None, idx)
        targs = _torch_args(torch, sample, idx)
        got = _outputs(info.op(*gargs, **kwargs))
        want = _outputs(info.torch_fn(*targs, **kwargs))
        for g, w in zip(got, want):
            w_np = w.detach().numpy()
            assert tuple(g.shape) == w_np.shape, f"{info.name} {sample.desc}: shape"
            np.testing.assert_allclose(g.detach().numpy(), w_np, atol=info.atol,
                                       rtol=info.rtol, err_msg=f"{info.name} {sample.desc}")
        if not idx or "torch_grad" in info.skips:
            continue
        seeds = [np.random.default_rng(k).standard_normal(tuple(g.shape)).astype(np.float32)
                 for k, g in enumerate(got) if g.requires_grad]
        gouts = [g for g in got if g.requires_grad]
        touts = [w for w, g in zip(want, got) if g.requires_grad]
        graphc.autograd.backward(gouts, [graphc.tensor(s) for s in seeds])
        torch.autograd.backward(touts, [torch.from_numpy(s.astype(w.detach().numpy().dtype))
                                        for s, w in zip(seeds, touts)])
        for i in idx:
            tg = targs[i].grad
            gg = gargs[i].grad
            assert (gg is None) == (tg is None), f"{info.name} {sample.desc}: grad of arg {i}"
            if tg is not None:
                np.testing.assert_allclose(gg.numpy(), tg.numpy(), atol=max(info.atol, 1e-5),
                                           rtol=max(info.rtol, 1e-4),
                                           err_msg=f"{info.name} {sample.desc}: grad arg {i}")


ERROR_CASES = [(info, k) for info in OP_INFOS if info.error_inputs is not None
               for k in range(len(info.error_inputs(np.random.default_rng(0))))]


@pytest.mark.parametrize("info,k", ERROR_CASES, ids=[f"{i.name}-{k}" for i, k in ERROR_CASES])
def test_error_inputs(info: OpInfo, k: int):
    case = info.error_inputs(np.random.default_rng(0))[k]
    args, kwargs = _to_graphc(case.sample)
    with pytest.raises(case.error, match=case.match) as excinfo:
        info.op(*args, **kwargs)
    assert isinstance(excinfo.value, (graphc.GraphcError, TypeError, ValueError)), \
        "errors should be graphc errors or builtin argument errors"


def test_every_registered_op_is_covered():
    covered = {name for info in OP_INFOS for name in info.registry_ops}
    missing = sorted(set(REGISTRY) - covered - set(COVERAGE_EXEMPT))
    assert not missing, f"registry ops without an OpInfo entry: {missing}"


def test_opinfo_names_registered_ops():
    unknown = sorted({n for info in OP_INFOS for n in info.registry_ops} - set(REGISTRY))
    assert not unknown, f"OpInfo entries name ops the registry lacks: {unknown}"
