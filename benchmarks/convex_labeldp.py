"""Label-DP on Adult and digits over ε: RR, RR-with-prior, LP-2ST, Algorithm 1's split, DP-SGD.

Every method is ε-label-DP (δ = 0) or (ε, δ = 1e-5)-label-DP under the *replace-one*
relation (neighbours differ in one label), so the numbers are comparable:

* RR / LP-2ST (``featuredp.mechanisms.labeldp.LabelDPClassifier``): noisy labels, then scikit-learn
  logistic regression (C = 10) on them (post-processing).
* RR-with-prior (class prior): 10% of ε buys a Laplace-noised class histogram (sensitivity 2
  under replace-one), its normalisation is the prior of RR-with-prior at 90% of ε (sequential
  composition). A per-row prior needs a model; that is LP-2ST.
* Alg. 1 (label split) and DP-SGD (full loss): ``NoisySGDClassifier`` (multinomial logistic,
  batch 256, 10 epochs, η_t = 50/√t, radius 50, uniform averaging; Alg. 1's public batch
  1024 rows), accounted with PLD under replace-one (sensitivity 2C, conservative for both:
  a label change moves either gradient by at most √2·‖x‖).

    nice python benchmarks/convex_labeldp.py            # about 15 min on one busy core

Writes results/convex/labeldp.csv, labeldp.md and labeldp.png.
"""

from __future__ import annotations

import os

# One BLAS thread before numpy loads: oversubscribed BLAS threads crawl on a shared 2-core machine.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
from convex_common import EPSILONS, RESULTS, load, write_csv, write_markdown, write_png
from tqdm.auto import tqdm

LR_C = 10.0


class ClassPrior:
    """A fitted 'model' whose predict_proba is the same class distribution for every row."""

    def __init__(self, probs: np.ndarray) -> None:
        self.probs = probs
        self.classes_ = np.arange(len(probs))

    def predict_proba(self, X: np.ndarray) -> np.ndarray:
        return np.tile(self.probs, (len(X), 1))


def dp_class_prior(y: np.ndarray, K: int, epsilon: float, rng: np.random.Generator) -> ClassPrior:
    """Laplace histogram of the labels (replace-one L1 sensitivity 2), clipped and normalised."""
    counts = np.bincount(y, minlength=K) + rng.laplace(0.0, 2.0 / epsilon, K)
    counts = np.maximum(counts, 1.0)
    return ClassPrior(counts / counts.sum())


def run(datasets: list[str], epsilons: list[float], seeds: int) -> pd.DataFrame:
    from sklearn.linear_model import LogisticRegression

    from featuredp.erm import NoisySGDClassifier
    from featuredp.mechanisms.labeldp import LabelDPClassifier

    rows = []
    for name in datasets:
        Xtr, ytr, Xte, yte = load(name)
        K = int(ytr.max()) + 1
        base = LogisticRegression(C=LR_C, max_iter=2000)
        ref = LogisticRegression(C=LR_C, max_iter=2000).fit(Xtr, ytr).score(Xte, yte)
        rows.append(dict(dataset=name, method="non-private", epsilon=np.inf, seed=0, accuracy=ref))
        sgd = dict(delta=1e-5, data_norm=1.0, batch_size=256, epochs=10, lr_scale=50.0, radius=50.0,
                   relation="replace-one")
        jobs = [(m, e, s) for e in epsilons for s in range(seeds)
                for m in ("RR", "RR-with-prior (class prior)", "LP-2ST", "Alg. 1 (label split)", "DP-SGD (full loss)")]
        for method, eps, seed in tqdm(jobs, desc=name):
            if method == "RR":
                est = LabelDPClassifier(base, epsilon=eps, method="rr", random_state=seed)
            elif method == "LP-2ST":
                est = LabelDPClassifier(base, epsilon=eps, method="lp-2st", random_state=seed)
            elif method.startswith("RR-with-prior"):
                prior = dp_class_prior(ytr, K, 0.1 * eps, np.random.default_rng(1000 + seed))
                est = LabelDPClassifier(base, epsilon=0.9 * eps, method="rr-prior", prior_model=prior,
                                        random_state=seed)
            elif method.startswith("Alg. 1"):
                est = NoisySGDClassifier(epsilon=eps, label_private=True, public_batch_size=1024, random_state=seed,
                                         **sgd)
            else:
                est = NoisySGDClassifier(epsilon=eps, multi_class="multinomial", random_state=seed, **sgd)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                est.fit(Xtr, ytr)
            rows.append(dict(dataset=name, method=method, epsilon=eps, seed=seed, accuracy=est.score(Xte, yte)))
    return pd.DataFrame(rows)


def plot(df: pd.DataFrame, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(df["dataset"]))
    fig, axes = plt.subplots(1, len(names), figsize=(5 * len(names), 3.8), squeeze=False)
    for ax, name in zip(axes[0], names):
        part = df[df["dataset"] == name]
        for method, sub in part.groupby("method", sort=False):
            if method == "non-private":
                ax.axhline(sub["accuracy"].iloc[0], color="k", ls="--", lw=1, label="non-private")
                continue
            g = sub.groupby("epsilon")["accuracy"].agg(["mean", "std"]).reset_index()
            ax.errorbar(g["epsilon"], g["mean"], yerr=g["std"], marker="o", ms=3, capsize=2, label=method)
        ax.set_xscale("log")
        ax.set_xlabel("ε (label-DP, replace-one)")
        ax.set_title(name)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("test accuracy")
    axes[0][-1].legend(fontsize=7)
    write_png(fig, path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", default="adult,digits")
    ap.add_argument("--epsilons", default=",".join(map(str, EPSILONS)))
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args()
    out = Path(args.out)
    df = run(args.datasets.split(","), [float(e) for e in args.epsilons.split(",")], args.seeds)
    write_csv(df, out / "labeldp.csv")
    table = df.pivot_table(index=["dataset", "method"], columns="epsilon", values="accuracy").reset_index()
    table.columns = [c if isinstance(c, str) else f"ε={c:g}" for c in table.columns]
    write_markdown(table, out / "labeldp.md", "Label-DP test accuracy vs ε (mean over seeds)")
    plot(df, out / "labeldp.png")
    print(table.to_string(index=False))


if __name__ == "__main__":
    main()
