"""Small synthetic tabular datasets, loss splits and noise sources for the engine tests (no files, fixed seeds)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from featuredp import sampling
from featuredp.data import TabularDataset
from featuredp.losses import LossSplit, forward
from featuredp.noise import ChaCha20Generator, SecureNoise, TorchNoise


def make_tabular(n: int = 300, seed: int = 0, *, codes: bool = False, n_classes: int = 2) -> TabularDataset:
    """Two numeric columns (age, hours) + categoricals sex (2) and race (3); label depends on all four.

    ``codes=True`` mimics ``categorical="codes"``: X holds the numeric columns, X_cat the codes.
    """
    rng = np.random.default_rng(seed)
    age, hours = rng.normal(size=n), rng.normal(size=n)
    sex, race = rng.integers(0, 2, n), rng.integers(0, 3, n)
    logit = 1.5 * age - 1.0 * hours + 1.2 * (sex == 1) - 0.8 * (race == 2)
    if n_classes == 2:
        y = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.int64)
    else:
        cuts = np.quantile(logit, np.linspace(0, 1, n_classes + 1)[1:-1])
        y = np.digitize(logit + rng.normal(scale=0.5, size=n), cuts)
    classes = [f"c{k}" for k in range(n_classes)]
    if codes:
        return TabularDataset(
            name="synthetic", X=np.stack([age, hours], 1), y=y, feature_names=["age", "hours"],
            feature_sources=["age", "hours"], label_name="label", classes=classes,
            X_cat=np.stack([sex, race], 1), cat_sources=["sex", "race"], cat_cardinalities=[2, 3],
            default_private=["sex", "race"],
        )
    X = np.stack([age, hours, sex == 0, sex == 1, race == 0, race == 1, race == 2], 1).astype(np.float32)
    return TabularDataset(
        name="synthetic", X=X, y=y,
        feature_names=["age", "hours", "sex=F", "sex=M", "race=a", "race=b", "race=c"],
        feature_sources=["age", "hours", "sex", "sex", "race", "race", "race"],
        label_name="label", classes=classes, default_private=["sex", "race"],
    )


class ZeroSplit(LossSplit):
    """ℓ = ℓ_pub = 0·logits: every gradient is exactly zero, so an update is pure noise (the noise tests)."""

    name = "zero"

    def loss(self, model, batch, draws):
        return 0.0 * forward(model, batch).sum(-1)

    def _public_loss(self, model, view, draws):
        return 0.0 * forward(model, view).sum(-1)


class LinearSplit(LossSplit):
    """ℓ = logit₀ − logit₁: every record's gradient is the same at every θ, so two runs on neighbouring datasets
    differ only by the extra record's clipped gradient (never by the model drifting apart): the replay tests."""

    name = "linear"

    def loss(self, model, batch, draws):
        out = forward(model, batch)
        return out[:, 0] - out[:, 1]

    def _public_loss(self, model, view, draws):
        return self.loss(model, view, draws)


def torch_source(seed: int) -> TorchNoise:
    """A TorchNoise source on a seeded CPU generator."""
    return TorchNoise(torch.Generator().manual_seed(seed))


def secure_source(key: int) -> SecureNoise:
    """A SecureNoise source on a fixed ChaCha20 key."""
    return SecureNoise(ChaCha20Generator(bytes([key]) * 32))


def record_noise(monkeypatch: Any, cls: type) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Record what a correlated-noise class is given (the flat gradient sums, float64) and what it draws (w_t)."""
    sums: list[torch.Tensor] = []
    noises: list[torch.Tensor] = []
    real_add, real_sample = cls.add, cls.sample

    def add(self, s, std):
        sums.append(torch.cat([v.reshape(-1) for v in s.values()]).double())
        return real_add(self, s, std)

    def sample(self, device=None):
        w = real_sample(self, device)
        noises.append(w.clone())
        return w

    monkeypatch.setattr(cls, "add", add)
    monkeypatch.setattr(cls, "sample", sample)
    return sums, noises


def record_cyclic(monkeypatch: Any) -> list[np.ndarray]:
    """Record every batch the run's cyclic sampler (BandMF's and BLT's) draws, in order."""
    rec: list[np.ndarray] = []

    class Recording(sampling.BMinSepSampler):
        def sample(self):
            idx = super().sample()
            rec.append(idx.copy())
            return idx

    monkeypatch.setattr(sampling, "BMinSepSampler", Recording)
    return rec
