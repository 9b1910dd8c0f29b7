"""Smoke tests of the model-family examples (issue 12): each runs a few small steps on its
real data (scikit-learn's digits, the standard library's source) and produces finite losses;
one compiled run shows the --compile path of a recurrent program."""

from __future__ import annotations

import numpy as np
import pytest

from tests.test_examples import load

pytest.importorskip("sklearn", reason="the image examples train on scikit-learn's digits")


def test_resnet_example_trains():
    losses, accuracy = load("resnet").main(["--steps", "3", "--batch-size", "8", "--width", "4",
                                            "--blocks", "1", "--size", "16"])
    assert len(losses) == 3 and np.isfinite(losses).all() and 0 <= accuracy <= 1


def test_lstm_lm_example_trains_and_samples():
    losses, text = load("lstm_lm").main(["--steps", "3", "--seq-len", "8", "--batch-size", "4",
                                         "--hidden", "16", "--chars", "5000", "--sample", "10"])
    assert np.isfinite(losses).all() and text.startswith("def ") and len(text) == 14


def test_lstm_lm_example_compiled():
    losses, _ = load("lstm_lm").main(["--steps", "2", "--seq-len", "4", "--batch-size", "2",
                                      "--hidden", "8", "--chars", "2000", "--sample", "2",
                                      "--compile"])
    assert np.isfinite(losses).all()


def test_vae_example_trains():
    losses = load("vae").main(["--steps", "3", "--batch-size", "8"])
    assert np.isfinite(losses).all()


def test_dcgan_example_trains():
    history = load("dcgan").main(["--steps", "2", "--batch-size", "4", "--width", "4",
                                  "--nz", "4"])
    assert np.isfinite(history).all()
