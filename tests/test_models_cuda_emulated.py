"""The model families of the issue-12 criterion compiled for the cuda backend, run on the
CPU emulation of graphc's CUDA runtime (GRAPHC_CUDA=emu): each trains 5 steps from PyTorch's
weights and must end as close to PyTorch float64 as the cpu-compiled run must (see
tests/model_parity_support.py). The GPT family's emulated run is in
tests/test_models_transformer.py."""

from __future__ import annotations

import numpy as np
import pytest

from tests import test_models_recurrent as recurrent
from tests import test_models_vision as vision
from tests.cuda_support import built_test_runtime, cuda_test_kind
from tests.model_parity_support import STEPS, run_family


@pytest.fixture
def emulated_cuda(monkeypatch, tmp_path):
    monkeypatch.setenv("GRAPHC_CUDA", cuda_test_kind())
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path / "cache"))
    built_test_runtime()


def _image_batches(rng, shape):
    return vision.image_batches(rng, shape)


FAMILIES = {
    "resnet": lambda rng: dict(build=vision.resnet, step=vision.classify,
                               batches=_image_batches(rng, (2, 1, 8, 8))),
    "mobilenet": lambda rng: dict(build=vision.mobilenet, step=vision.classify,
                                  batches=_image_batches(rng, (2, 1, 16, 16))),
    "vae": lambda rng: dict(build=vision.vae, step=vision.vae_loss, optimizer="adam", lr=1e-2,
                            batches=[(rng.random((8, 64)), rng.standard_normal((8, 4)))
                                     for _ in range(STEPS)]),
    "dcgan": lambda rng: dict(build=vision.dcgan, step=vision.gan_loss, optimizer="adam",
                              lr=2e-3, batches=[(np.tanh(rng.standard_normal((2, 1, 16, 16))),
                                                 rng.standard_normal((2, 8, 1, 1)))
                                                for _ in range(STEPS)]),
    "lstm": lambda rng: dict(build=recurrent.lstm_lm, step=recurrent.next_char_loss,
                             optimizer="adam", lr=1e-2,
                             batches=[(t[:, :-1], t[:, 1:]) for t in
                                      (rng.integers(0, 16, (3, 7)) for _ in range(STEPS))]),
    "gru": lambda rng: dict(build=recurrent.gru_classifier, step=recurrent.classify, lr=0.1,
                            batches=[(rng.standard_normal((5, 4, 5)), rng.integers(0, 3, 4))
                                     for _ in range(STEPS)]),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_trains_on_emulated_cuda(rng, emulated_cuda, family):
    case = FAMILIES[family](rng)
    run_family(case.pop("build"), case.pop("step"), case.pop("batches"), backend="cuda",
               **case)
