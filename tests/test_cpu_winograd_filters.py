"""The Winograd kernels' filter transforms FILTER_LANES filters a vector (graphc.backends.cpu.
winograd_filters.filters_by_vectors): the forward's U along its input channels where
they are a whole number of vectors (else one by one), the input gradient's transposed U
along the output channels in blocks with the rest one by one, the weight gradient's
gw = G^T dU G (conv_winograd.weight_out) from dU in either layout, and a forked filter
kernel's shares (whose ranges need not be whole vectors): against the interpreter, within
2x eager's distance from a float64 run, and the same bits as the loops one filter at a time
(FILTER_VECTORS off)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("llvmlite", reason="the CPU backend generates code with llvmlite")

from graphc.backends import compile as compile_graph  # noqa: E402
from graphc.backends.cpu import conv_winograd, threads, winograd_filters  # noqa: E402
from graphc.backends.cpu.threads import ThreadChooser  # noqa: E402
from tests.test_cpu_backend import compare, one_op_graph  # noqa: E402
from tests.test_cpu_conv_paths import _graphs  # noqa: E402
from tests.test_cpu_conv_winograd import check_winograd  # noqa: E402

ATTRS = {"stride": (1, 1), "padding": (1, 1), "dilation": (1, 1), "groups": 1}


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path / "cache"))


def _recording(monkeypatch, name: str = "filter_taps", flag: int = -1) -> list:
    """The `along_o` flag (argument `flag`) of every winograd_filters.`name` call (the
    vectors' loads of w's taps, or stores of gw's) emitted from now on."""
    taken = []
    emit = getattr(winograd_filters, name)

    def recording(*args, **kwargs):
        taken.append(args[flag])
        return emit(*args, **kwargs)

    monkeypatch.setattr(winograd_filters, name, recording)
    monkeypatch.setattr(conv_winograd, name, recording, raising=False)
    return taken


# (input, weight, WEIGHT_GRAD_NN, the vector forms taken: (along_o of w's taps: forward's
# rows, input gradient's transposed), (along_o of gw's stores: dU transposed by the NN form))
CASES = [
    ((2, 32, 4, 4), (40, 32, 3, 3), True, {False, True}, {True}),  # 2 vectors of c; 40 o:
    # 2 blocks + 8 one by one
    ((2, 20, 4, 6), (16, 20, 3, 3), True, {True}, {True}),  # 20 c: one by one; 16 o: one
    # block, no rest
    ((1, 16, 6, 4), (24, 16, 3, 3), True, {False, True}, {True}),  # 24 o: a block + 8
    ((2, 32, 4, 4), (24, 32, 3, 3), False, {False, True}, {False}),  # dU [xi][o][c]: gw
    # along c (the 512-channel layers' form)
    ((2, 24, 4, 4), (16, 24, 3, 3), False, {True}, set()),  # 24 c: gw one by one
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_filters_by_vectors_bit_for_bit(case, monkeypatch, tmp_path):
    xs, ws, nn, loads, stores = CASES[case]
    monkeypatch.setattr(conv_winograd, "WEIGHT_GRAD_NN", nn)
    taken = _recording(monkeypatch)
    stored = _recording(monkeypatch, "store_filter_taps", -2)
    check_winograd(xs, ws, (1, 1), (1, 1), 1)
    assert set(taken) == loads and set(stored) == stores, (taken, stored)
    rng = np.random.default_rng(case)
    gs, _ = _graphs(xs, ws, (1, 1), (1, 1), 1)
    for kind, shapes in {"fwd": [xs, ws], "gx": [gs, ws], "gw": [gs, xs]}.items():
        # scaled: a U element left unwritten (the arena's old values) cannot pass
        arrays = [rng.standard_normal(s).astype(np.float32) * (3.0 + case) for s in shapes]
        outs = []
        for on in (True, False):
            monkeypatch.setattr(winograd_filters, "FILTER_VECTORS", on)
            monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path / f"{kind}-{on}"))
            outs.append(compare(_graphs(xs, ws, (1, 1), (1, 1), 1)[1][kind], arrays,
                                rtol=1e-4).run(*arrays)[0])
        np.testing.assert_array_equal(outs[0], outs[1], err_msg=kind)


def _one_conv(op, shape, rng):
    """A one-op 3x3 `op` graph ("conv2d" or "conv2d_input_grad") of `shape` (n, c_in, c_out,
    plane) and its random arguments (the first scaled by 5)."""
    n, ci, co, hw = shape
    w = rng.standard_normal((co, ci, 3, 3)).astype(np.float32)
    if op == "conv2d":
        first, extra = (n, ci, hw, hw), {}
    else:
        first, extra = (n, co, hw, hw), {"input_hw": (hw, hw)}
    args = [rng.standard_normal(first).astype(np.float32) * 5.0, w]
    return one_op_graph(op, [(first, "float32"), (w.shape, "float32")], **extra, **ATTRS), args


# 128 -> 40 channels at 4x4, batch 8: one block, so the filter transform is a kernel of its
# own, forked over its output channels (16 x 40 x 128 elements, kernels.
# PARALLEL_MIN_ELEMENTS): on two cores shares of 20 output channels, one vector block and 4
# one by one each
@pytest.mark.parametrize("op", ["conv2d", "conv2d_input_grad"])
def test_forked_filter_shares_with_a_rest(op, monkeypatch, tmp_path):
    graph, args = _one_conv(op, (8, 128, 40, 4), np.random.default_rng(len(op)))
    taken = _recording(monkeypatch)
    want = compare(graph, args, rtol=1e-4).run(*args)[0]
    results = []
    for on in (True, False):
        monkeypatch.setattr(winograd_filters, "FILTER_VECTORS", on)
        monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path / f"cache_{on}"))
        exe = compile_graph(graph, "cpu")
        assert "conv2d_winograd_filter" in exe.lowered.ir_text
        for count in (1, threads.most_threads()):
            exe.thread_chooser = ThreadChooser(threads.most_threads(), fixed=count)
            results.append(np.array(exe.run(*[a.copy() for a in args])[0]))
    assert taken == [op == "conv2d_input_grad"] * len(taken) and taken, taken
    for got in results:
        np.testing.assert_array_equal(got, want)


# A streamed U (winograd_filters.streamed: stored non-temporally, the transposing walk a
# block of output channels at a time), taken here by lowering STREAMED_U_BYTES: the same bits
# as U stored as any array, the forward (vectors along c, 64-byte aligned) and the input
# gradient (vectors along o: aligned from 0 at one thread; a forked share of 20 output
# channels starts unaligned, stored by 8-byte movnti), in the kernel and forked
@pytest.mark.parametrize("op", ["conv2d", "conv2d_input_grad"])
@pytest.mark.parametrize("shape", [(8, 128, 40, 4), (2, 32, 48, 6)])
def test_streamed_u_bit_for_bit(op, shape, monkeypatch, tmp_path):
    graph, args = _one_conv(op, shape, np.random.default_rng(shape[1] + shape[2] + len(op)))
    want = compare(graph, args, rtol=1e-4).run(*args)[0]
    results = []
    for streamed in (True, False):
        monkeypatch.setattr(winograd_filters, "STREAMED_U_BYTES", 0 if streamed else 1 << 40)
        monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path / f"cache_{streamed}"))
        exe = compile_graph(graph, "cpu")
        assert ("!nontemporal" in exe.lowered.ir_text) == streamed
        for count in (1, threads.most_threads()):
            exe.thread_chooser = ThreadChooser(threads.most_threads(), fixed=count)
            results.append(np.array(exe.run(*[a.copy() for a in args])[0]))
    for got in results:
        np.testing.assert_array_equal(got, want)


# A streamed gw (conv_winograd.weight_out, STREAMED_GW: each filter's 9 taps stored
# non-temporally, 36 bytes at any 4-byte boundary) from dU in either layout, and the wide
# weight gradient's (conv_winograd_wide_grad, WIDE_CHANNELS lowered): the same bits as gw
# stored as any array, at one thread and forked
@pytest.mark.parametrize("form", ["nn", "nt", "wide"])
def test_streamed_gw_bit_for_bit(form, monkeypatch, tmp_path):
    from graphc.backends.cpu import conv_winograd_wide_grad

    monkeypatch.setattr(conv_winograd, "WEIGHT_GRAD_NN", form == "nn")
    monkeypatch.setattr(conv_winograd_wide_grad, "WIDE_CHANNELS",
                        32 if form == "wide" else conv_winograd_wide_grad.WIDE_CHANNELS)
    xs, ws = (4, 32, 4, 4), (48, 32, 3, 3)
    rng = np.random.default_rng(len(form))
    gs, _ = _graphs(xs, ws, (1, 1), (1, 1), 1)
    arrays = [rng.standard_normal(s).astype(np.float32) * 3.0 for s in (gs, xs)]
    results = []
    for streamed in (True, False):
        monkeypatch.setattr(winograd_filters, "STREAMED_U_BYTES", 0 if streamed else 1 << 40)
        monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path / f"cache_{streamed}"))
        exe = compare(_graphs(xs, ws, (1, 1), (1, 1), 1)[1]["gw"], arrays, rtol=1e-4)
        assert ("wide" in exe.lowered.ir_text) == (form == "wide")
        assert ("!nontemporal" in exe.lowered.ir_text) == streamed
        for count in (1, threads.most_threads()):
            exe.thread_chooser = ThreadChooser(threads.most_threads(), fixed=count)
            results.append(np.array(exe.run(*[a.copy() for a in arrays])[0]))
    for got in results[1:]:
        np.testing.assert_array_equal(got, results[0])
