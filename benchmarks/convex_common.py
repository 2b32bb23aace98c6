"""Shared helpers of the convex benchmarks: datasets with L2-normalised rows, result files.

Rows are scaled to unit L2 norm (a per-row map that reads no other row, so it costs no
privacy), which makes ``data_norm=1`` hold exactly, as the DP-ERM analyses require.
"""

from __future__ import annotations

import os
from pathlib import Path

# One BLAS thread: the measurement machines are shared and small.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np
import pandas as pd

from featuredp._io import atomic_path, atomic_write_text

RESULTS = Path(__file__).resolve().parents[1] / "results" / "convex"
EPSILONS = (0.1, 0.5, 1.0, 2.0, 5.0, 10.0)


def unit_rows(X: np.ndarray) -> np.ndarray:
    """Scale every row to L2 norm 1 (all-zero rows stay zero)."""
    X = np.asarray(X, dtype=np.float64)
    norms = np.linalg.norm(X, axis=1, keepdims=True)
    return X / np.where(norms > 0, norms, 1.0)


def load(name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(X_train, y_train, X_test, y_test) with unit-norm rows.

    breast_cancer and digits: a stratified 70/30 split with seed 0; Adult: its bundled
    train/test split (featuredp.data).
    """
    if name == "adult":
        from featuredp.data import load_dataset

        train, test = load_dataset("adult")
        return unit_rows(train.X), train.y, unit_rows(test.X), test.y
    from sklearn.datasets import load_breast_cancer, load_digits
    from sklearn.model_selection import train_test_split

    loader = {"breast_cancer": load_breast_cancer, "digits": load_digits}[name]
    X, y = loader(return_X_y=True)
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.3, random_state=0, stratify=y)
    return unit_rows(Xtr), ytr, unit_rows(Xte), yte


def write_csv(df: pd.DataFrame, path: Path) -> None:
    """Write a CSV atomically."""
    with atomic_path(path) as tmp:
        df.to_csv(tmp, index=False)


def write_png(fig, path: Path) -> None:  # type: ignore[no-untyped-def]
    """Save a matplotlib figure atomically as PNG."""
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=130, bbox_inches="tight")


def write_markdown(df: pd.DataFrame, path: Path, title: str) -> None:
    """A small Markdown table (no tabulate dependency)."""
    cols = list(df.columns)
    lines = [f"# {title}", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, row in df.iterrows():
        cells = [f"{v:.3f}" if isinstance(v, float) else str(v) for v in row]
        lines.append("| " + " | ".join(cells) + " |")
    atomic_write_text(path, "\n".join(lines) + "\n")
