"""Shared fixtures: a numpy Generator seeded from the test id, the optional torch module, and
the cuda backend's environment (`cuda_backend`, `cuda_runtime_built`).

The suite runs with GRAPHC_POISON=1 unless the environment sets it (`GRAPHC_POISON=0 pytest`
to run without): every cpu executable fills its outputs and arena with NaN / sentinels before
each run (graphc.backends.cpu.poison), so an element a kernel never writes fails a comparison
instead of passing on a value an earlier array left behind. Set here, at import, so that it
holds for every executable the suite makes, and for the processes tests start."""

from __future__ import annotations

import os
import zlib

import numpy as np
import pytest

os.environ.setdefault("GRAPHC_POISON", "1")


@pytest.fixture
def rng(request) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


def torch_or_skip():
    """The torch module, or a skip naming why parity cannot run."""
    try:
        import torch
    except ImportError:
        pytest.skip("PyTorch is not installed: parity needs `pip install torch==2.13.0`")
    return torch


@pytest.fixture(autouse=True, scope="session")
def _torch_single_thread():
    """PyTorch's thread pool makes tiny parity calls ~100x slower on this 2-core machine."""
    try:
        import torch
    except ImportError:
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture
def cuda_backend(tmp_path_factory, monkeypatch):
    """GRAPHC_CUDA names the kind under test (tests/cuda_support.cuda_test_kind) and compiled
    graphs cache under the session's temporary directory. A cuda test module asks for it with
    `pytestmark = pytest.mark.usefixtures("cuda_runtime_built", "cuda_backend")`."""
    from tests.cuda_support import cuda_test_kind

    monkeypatch.setenv("GRAPHC_CUDA", cuda_test_kind())
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


@pytest.fixture(scope="module")
def cuda_runtime_built():
    """The CUDA runtime library for the kind under test, built once; a skip (or, on a GPU run,
    a failure) naming why where it cannot be."""
    from tests.cuda_support import built_test_runtime

    return built_test_runtime()


def sgd_step(lib, model, lr: float = 0.05, momentum: float = 0.9, loss_fn=None):
    """`step(x, y)`: one SGD-momentum training step of `loss_fn(model(x), y)` (`lib`'s
    cross-entropy by default) with `lib`'s optimizer, graphc's or PyTorch's, returning the
    loss detached."""
    opt = lib.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    loss_fn = loss_fn or lib.nn.functional.cross_entropy

    def step(x, y):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    return step


def sgd_training_step(make_model, lr: float = 0.05, momentum: float = 0.9, loss_fn=None):
    """(model, step) with `step` graphc's `sgd_step` of the model; the model is built after
    seeding graphc with 0, so two calls give identical twins."""
    import graphc

    graphc.manual_seed(0)
    model = make_model()
    return model, sgd_step(graphc, model, lr, momentum, loss_fn)


def residual_block(channels: int, size: int):
    """A ResNet basic block of `channels` on `size` x `size` planes (conv-bn-relu, conv-bn,
    + the input, relu), then a linear head to 3 classes."""
    from graphc import nn

    class ResidualBlock(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
            self.bn1 = nn.BatchNorm2d(channels)
            self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
            self.bn2 = nn.BatchNorm2d(channels)
            self.head = nn.Linear(channels * size * size, 3)

        def forward(self, x):
            y = self.bn1(self.conv1(x)).relu()
            y = (self.bn2(self.conv2(y)) + x).relu()
            return self.head(y.reshape(x.shape[0], -1))

    return ResidualBlock()


def pass_training_steps(pass_module, pass_name: str, op: str, fuse: bool, monkeypatch,
                        make_model, x_shape: tuple, calls: int = 3):
    """`calls` SGD-momentum (lr 0.1) cross-entropy steps of `make_model()` on one seeded batch
    of `x_shape` (3 classes), compiled for the cpu with the pass `pass_module.<pass_name>` on
    or off (its module's FUSE): (the losses, every parameter and buffer after, the `op` nodes
    the pass made)."""
    import graphc

    monkeypatch.setattr(pass_module, "FUSE", fuse)
    made = []
    real = getattr(pass_module, pass_name)

    def spy(graph):
        out = real(graph)
        made.extend(n for n in out.nodes if n.op == op)
        return out

    monkeypatch.setattr(pass_module, pass_name, spy)
    model, train = sgd_training_step(make_model, lr=0.1)
    step = graphc.compile(train, backend="cpu")
    rng = np.random.default_rng(0)
    x = graphc.tensor(rng.standard_normal(x_shape).astype(np.float32))
    y = graphc.tensor(rng.integers(0, 3, x_shape[0]))
    losses = [step(x, y).detach().numpy() for _ in range(calls)]
    state = [v.detach().numpy().copy() for v in (*model.parameters(), *model.buffers())]
    return losses, state, made


def square_loss_gradients(model):
    """`step(x)` -> (sum(model(x) ** 2), each parameter's gradient): a forward and backward
    with no optimizer, whose every output a compiled run can be compared on."""

    def step(x):
        for p in model.parameters():
            p.grad = None
        loss = (model(x) ** 2).sum()
        loss.backward()
        return (loss.detach(),) + tuple(p.grad for p in model.parameters())

    return step


def cpu_executable_on(graph, count: int):
    """`graph` (a Graph or its text) parsed afresh, its buffers planned, compiled by the CPU
    backend with its calls held to `count` threads."""
    from graphc.backends.cpu import threads
    from graphc.backends.cpu.executable import CpuExecutable
    from graphc.ir import parse
    from graphc.passes.plan import plan_buffers

    graph = parse(str(graph))
    plan_buffers(graph)
    exe = CpuExecutable(graph)
    exe.thread_chooser = threads.ThreadChooser(threads.most_threads(), fixed=count)
    return exe
