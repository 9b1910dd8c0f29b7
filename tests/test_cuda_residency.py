"""State stays on the device across compiled cuda calls (issue 18, item 3), on the emulation.

Covers: host-device bytes per training step, counted by the runtime (gc_transfer_bytes):
after the first compiled step only the batch goes in and the loss (and the error word) comes
back; eager reads after compiled steps (numpy(), eager ops, `.grad`, state_dict) see the
current values; a host write between steps is uploaded; two executables sharing parameters
(a compiled training step and a compiled evaluation) see each other's values; GRAPHC_CHECK_NANS
turns residency off; `close()` fetches what only the device held; a steady call (its state
marked in its own slots) keeps the marks and uploads only what a host write unmarked, even
after its check; and the residency registry's view rule (a view of a marked array fetches it).
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

import graphc
from graphc import nn
from graphc.backends import residency
from tests.conftest import sgd_training_step
from tests.cuda_support import loaded_test_runtime

pytestmark = pytest.mark.usefixtures("cuda_backend")


@pytest.fixture(scope="module")
def rt():
    return loaded_test_runtime()


def _traffic(rt) -> tuple[int, int]:
    h2d, d2h = ctypes.c_int64(), ctypes.c_int64()
    rt.gc_transfer_bytes(ctypes.byref(h2d), ctypes.byref(d2h))
    return h2d.value, d2h.value


def _mlp():
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))


def _batch(rng):
    return (graphc.tensor(rng.standard_normal((4, 8)).astype(np.float32)),
            graphc.tensor(rng.integers(0, 3, 4)))


def _twins():
    (model, step), (ref_model, ref_step) = sgd_training_step(_mlp), sgd_training_step(_mlp)
    return (model, graphc.compile(step, backend="cuda"),
            ref_model, graphc.compile(ref_step, backend="interp"))


def test_after_the_first_step_only_the_batch_and_the_loss_cross(rt, rng):
    model, step, _, _ = _twins()
    params = sum(p.numel() for p in model.parameters()) * 4
    per_call = []
    for _ in range(5):
        x, y = _batch(rng)
        rt.gc_transfer_bytes_reset()
        loss = step(x, y)
        per_call.append(_traffic(rt))
    batch = x.numel() * 4 + y.numel() * 8
    error_word = 8  # the NLL target check's error word comes back every call
    # call 1 is the executable's first (graphc.jit.first_step makes the momentum buffers
    # before the trace): everything goes in (parameters, momentum, batch), the loss and the
    # .grads come back; the updated state stays on the device
    assert per_call[0] == (batch + 2 * params, 4 + params + error_word)
    # later calls are asynchronous: the loss, too, stays on the device until read
    for h2d, d2h in per_call[1:]:
        assert (h2d, d2h) == (batch, error_word), per_call
    rt.gc_transfer_bytes_reset()
    loss.item()
    assert _traffic(rt) == (0, 4)


def test_eager_reads_after_compiled_steps_see_the_current_values(rt, rng):
    model, step, ref_model, ref_step = _twins()
    for _ in range(4):
        x, y = _batch(rng)
        np.testing.assert_allclose(step(x, y).item(), ref_step(x, y).item(), rtol=1e-5)
    pairs = list(zip(model.parameters(), ref_model.parameters()))
    for p, _ in pairs:
        assert residency.marked_by(p._array) is not None  # the host copy is out of date
    w, w_ref = pairs[0]
    # an eager op, numpy(), .grad, state_dict and the optimizer state all see the device value
    np.testing.assert_allclose((w * 2).detach().numpy(), (w_ref * 2).detach().numpy(),
                               rtol=1e-5, atol=1e-6)
    for p, q in pairs:
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-5,
                                   atol=1e-6)
        np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-5, atol=1e-6)
        assert residency.marked_by(p._array) is None
    for key, value in model.state_dict().items():
        np.testing.assert_allclose(np.asarray(value), np.asarray(ref_model.state_dict()[key]),
                                   rtol=1e-5, atol=1e-6)
    # a write on the host between steps is what the next step reads
    with graphc.no_grad():
        w.mul_(0.5)
        w_ref.mul_(0.5)
    for _ in range(2):
        x, y = _batch(rng)
        np.testing.assert_allclose(step(x, y).item(), ref_step(x, y).item(), rtol=1e-5)
    print(repr(w))  # printing fetches too
    for p, q in pairs:
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-5,
                                   atol=1e-6)


def test_a_steady_call_keeps_the_state_marks_and_uploads_what_a_read_unmarked(rt, rng):
    """A compiled step runs through its first try (guard and plan under raw_reads); a call
    whose state is all marked in its own slots (the last call's) keeps those marks as they
    are, the same mark objects, and uploads only the batch; a parameter written on the host
    between calls (the read took its mark) is uploaded by the next call, and only it."""
    model, step, ref_model, ref_step = _twins()
    for _ in range(3):
        x, y = _batch(rng)
        step(x, y)
        ref_step(x, y)
    assert step._fast  # the cuda entry's first try
    marks = {id(p._array): residency.stale[id(p._array)] for p in model.parameters()}
    x, y = _batch(rng)
    batch = x.numel() * 4 + y.numel() * 8
    rt.gc_transfer_bytes_reset()
    loss = step(x, y)
    assert _traffic(rt)[0] == batch
    np.testing.assert_allclose(loss.item(), ref_step(x, y).item(), rtol=1e-5)
    assert all(residency.stale[key] is mark for key, mark in marks.items())
    w, w_ref = next(model.parameters()), next(ref_model.parameters())
    with graphc.no_grad():
        w.mul_(0.5)
        w_ref.mul_(0.5)
    x, y = _batch(rng)
    rt.gc_transfer_bytes_reset()
    loss = step(x, y)
    assert _traffic(rt)[0] == batch + w.numel() * 4
    np.testing.assert_allclose(loss.item(), ref_step(x, y).item(), rtol=1e-5)
    for p, q in zip(model.parameters(), ref_model.parameters()):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-5,
                                   atol=1e-6)


def test_a_fetch_after_the_steady_check_is_seen_under_the_lock(rt, rng, monkeypatch):
    """A parameter fetched and written on the host after a call found its state marked (as
    another thread could, before the call takes the lock) is uploaded all the same: the
    executable counts the state marks that went, and looks again when the count moved."""
    model, step, ref_model, ref_step = _twins()
    for _ in range(3):
        x, y = _batch(rng)
        step(x, y)
        ref_step(x, y)
    w, w_ref = next(model.parameters()), next(ref_model.parameters())
    with graphc.no_grad():
        w_ref.mul_(0.5)
    slots_of = residency.slots_of

    def slots_then_a_host_write(owner, arrays):
        slots = slots_of(owner, arrays)
        monkeypatch.setattr(residency, "slots_of", slots_of)
        residency.fresh_all([w._array])  # the fetch takes the mark
        w._array *= 0.5
        return slots

    monkeypatch.setattr(residency, "slots_of", slots_then_a_host_write)
    x, y = _batch(rng)
    np.testing.assert_allclose(step(x, y).item(), ref_step(x, y).item(), rtol=1e-5)
    assert residency.slots_of is slots_of  # the hook ran
    np.testing.assert_allclose(w.detach().numpy(), w_ref.detach().numpy(), rtol=1e-5,
                               atol=1e-6)


def test_gradients_accumulated_across_steps(rt, rng):
    """Without zero_grad the `.grad`s are state too (accumulated in place on the device)."""
    import graphc.nn.functional as F
    from graphc import optim

    def make():
        graphc.manual_seed(0)
        model = _mlp()
        opt = optim.SGD(model.parameters(), lr=0.05)

        def step(x, y):
            F.cross_entropy(model(x), y).backward()
            opt.step()

        return model, step

    (model, step), (ref_model, ref_step) = make(), make()
    step, ref_step = graphc.compile(step, backend="cuda"), graphc.compile(ref_step,
                                                                          backend="interp")
    for _ in range(4):
        x, y = _batch(rng)
        step(x, y)
        ref_step(x, y)
    for p, q in zip(model.parameters(), ref_model.parameters()):
        np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-5,
                                   atol=1e-6)


def test_two_executables_share_parameters(rt, rng):
    """A compiled evaluation reads the values the compiled training step left on the device
    (device to device: nothing crosses), and a step on another backend (the interpreter)
    sees them too."""
    model, step, ref_model, ref_step = _twins()
    evaluate = graphc.compile(lambda x: model(x), backend="cuda")
    evaluate_ref = graphc.compile(lambda x: model(x), backend="interp")
    for call in range(4):
        x, y = _batch(rng)
        rt.gc_transfer_bytes_reset()
        step(x, y)
        ref_step(x, y)
        with graphc.no_grad():
            got = evaluate(x).numpy()
            traffic = _traffic(rt)
            np.testing.assert_allclose(got, ref_model(x).numpy(), rtol=1e-5, atol=1e-6)
        if call >= 2:  # the evaluation copies the parameters device to device: only the
            # batches, the error word and the evaluation's output cross (the loss, unread,
            # stays on the device)
            assert traffic == (2 * x.numel() * 4 + y.numel() * 8, 8 + got.nbytes)
    with graphc.no_grad():  # the interpreter fetches them to the host
        np.testing.assert_allclose(evaluate_ref(x).numpy(), got, rtol=1e-5, atol=1e-6)
    assert not any(residency.marked_by(p._array) for p in model.parameters())


def test_check_nans_turns_residency_off(rt, rng, monkeypatch):
    model, step, ref_model, ref_step = _twins()
    monkeypatch.setenv("GRAPHC_CHECK_NANS", "1")
    for _ in range(3):
        x, y = _batch(rng)
        np.testing.assert_allclose(step(x, y).item(), ref_step(x, y).item(), rtol=1e-5)
        assert not any(residency.marked_by(p._array) for p in model.parameters())


def test_close_fetches_what_only_the_device_held(rt, rng):
    model, step, ref_model, ref_step = _twins()
    for _ in range(3):
        x, y = _batch(rng)
        step(x, y)
        ref_step(x, y)
    step.executable.close()
    for p, q in zip(model.parameters(), ref_model.parameters()):
        assert residency.marked_by(p._array) is None
        np.testing.assert_allclose(p._array, q.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_outputs_kept_on_the_device_leave_the_arena_in_batched_copies(rt, rng):
    """gc_memcpy_d2d_batch, which takes a call's kept outputs out of its arena: 40 copies
    (two launches of at most 32) of sizes 0 to 10^5 bytes, 16-byte aligned or not, give
    the bytes of 40 plain copies; a negative size is refused before anything runs."""
    from graphc.backends.cuda import rt as rtmod

    sizes = [0, 1, 3, 16, 17, 100_003] + [int(n) for n in rng.integers(1, 5000, 34)]
    offsets = [int(o) for o in rng.integers(0, 2, len(sizes)) * 16 + rng.integers(0, 2,
                                                                                  len(sizes))]
    total = sum(sizes) + 64 * len(sizes)
    source = rng.integers(0, 256, total, dtype=np.uint8)
    src, dst = ctypes.c_void_p(), ctypes.c_void_p()
    rt.gc_malloc(ctypes.byref(src), total)
    rt.gc_malloc(ctypes.byref(dst), total)
    try:
        rt.gc_memcpy_h2d(src, source.ctypes.data, total, None)
        rt.gc_memset(dst, 0, total, None)
        at, copies = 0, []
        for size, offset in zip(sizes, offsets):
            copies.append((dst.value + at + offset, src.value + at + (16 - offset) % 32, size))
            at += size + 64
        n = len(copies)
        dsts, srcs, nbytes = zip(*copies)
        rt.gc_memcpy_d2d_batch((ctypes.c_void_p * n)(*dsts), (ctypes.c_void_p * n)(*srcs),
                               (ctypes.c_int64 * n)(*nbytes), n, None)
        got = np.zeros(total, np.uint8)
        rt.gc_memcpy_d2h(got.ctypes.data, dst, total, None)
        rt.gc_device_synchronize()
        want = np.zeros(total, np.uint8)
        for d, s, size in copies:
            want[d - dst.value:d - dst.value + size] = source[s - src.value:s - src.value + size]
        assert got.tobytes() == want.tobytes()
        bad = (ctypes.c_int64 * 2)(8, -1)
        with pytest.raises(rtmod.CudaInvalidArgumentError, match=r"bytes\[1\] must be >= 0"):
            rt.gc_memcpy_d2d_batch((ctypes.c_void_p * 2)(dst, dst), (ctypes.c_void_p * 2)(src, src),
                                   bad, 2, None)
    finally:
        rt.gc_free(src)
        rt.gc_free(dst)


class _Owner:
    def __init__(self, value):
        self.value, self.fetched, self.forgotten = value, 0, []

    def fetch(self, slot, array):
        array[...] = self.value
        self.fetched += 1

    def forget(self, slot):
        self.forgotten.append(slot)


def test_views_of_a_marked_array_fetch_it():
    base = np.zeros(6, np.float32)
    t = graphc.Tensor._wrap(base)
    view = graphc.Tensor._wrap(base[2:4])  # made before the mark
    owner = _Owner(7.0)
    residency.mark(base, owner, "slot")
    assert view.numpy().tolist() == [7.0, 7.0] and owner.fetched == 1
    residency.mark(base, owner, "slot")
    with residency.raw_reads():
        assert t._data is base and owner.fetched == 1  # binding reads nothing
    assert t.sum().item() == 42.0 and owner.fetched == 2
    residency.mark(base, owner, "slot")
    del t, view, base  # the array dies: its mark goes, the owner is told
    assert owner.forgotten == ["slot"] and not residency.marked_by(np.zeros(1))
