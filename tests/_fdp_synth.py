"""Small synthetic tabular datasets for the engine tests (no files, fixed seeds)."""

from __future__ import annotations

import numpy as np

from featuredp.data import TabularDataset
from featuredp.losses import LossSplit, forward


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
