"""Recurrent model families trained 5 steps against PyTorch (the issue-12 criterion, see
tests/model_parity_support.py): a character LSTM language model (embedding, 2-layer LSTM,
linear head), and a bidirectional GRU sequence classifier."""

from __future__ import annotations

from tests.model_parity_support import STEPS, run_family


def lstm_lm(nn, vocab=16, emb=8, hidden=16):
    class LanguageModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(vocab, emb)
            self.lstm = nn.LSTM(emb, hidden, num_layers=2, batch_first=True)
            self.head = nn.Linear(hidden, vocab)

        def forward(self, idx):
            out, _ = self.lstm(self.embed(idx))
            return self.head(out)

    return LanguageModel()


def next_char_loss(F, model, batch):
    idx, target = batch
    logits = model(idx)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


def gru_classifier(nn, features=5, hidden=8, classes=3):
    class Classifier(nn.Module):
        def __init__(self):
            super().__init__()
            self.gru = nn.GRU(features, hidden, bidirectional=True)
            self.head = nn.Linear(2 * hidden, classes)

        def forward(self, x):
            _, h = self.gru(x)  # (2, N, hidden): last state of each direction
            return self.head(h.permute(1, 0, 2).reshape(x.shape[1], -1))

    return Classifier()


def classify(F, model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


def test_lstm_language_model(rng):
    batches = []
    for _ in range(STEPS):
        text = rng.integers(0, 16, (3, 7))
        batches.append((text[:, :-1], text[:, 1:]))
    run_family(lstm_lm, next_char_loss, batches, optimizer="adam", lr=1e-2)


def test_gru_classifier(rng):
    batches = [(rng.standard_normal((5, 4, 5)), rng.integers(0, 3, 4)) for _ in range(STEPS)]
    run_family(gru_classifier, classify, batches, lr=0.1)
