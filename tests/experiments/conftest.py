"""Fixtures shared by the experiments tests."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest


@pytest.fixture
def tiny_csv(tmp_path):
    """A 400-row CSV (a, b numeric; s private, categorical; label hi/lo) and the loader options for it."""
    rng = np.random.default_rng(0)
    n = 400
    df = pd.DataFrame({"a": rng.normal(size=n), "b": rng.normal(size=n), "s": rng.choice(["x", "y"], n)})
    df["label"] = np.where(df["a"] + (df["s"] == "x") > 0.5, "hi", "lo")
    path = tmp_path / "tiny.csv"
    df.to_csv(path, index=False)
    return {"path": str(path), "label": "label", "private": ["s"], "categories": {"s": ["x", "y"]}}
