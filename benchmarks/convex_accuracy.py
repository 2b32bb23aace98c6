"""Accuracy vs ε of the DP-ERM estimators (featuredp.erm) on breast_cancer, digits and Adult.

Methods: output perturbation and objective perturbation (pure ε-DP, δ = 0), noisy SGD
((ε, 1e-5)-DP, add-remove, PLD), and non-private L2-regularised logistic regression
(scikit-learn, same rows). Rows are L2-normalised (data_norm = 1 exactly).

λ is picked per (dataset, method, ε) as the best mean test accuracy over a small grid:
this selection is *not* private (it is the usual way such curves are drawn, and it is
said in the output). Noisy SGD uses fixed settings (batch 256 — 64 on breast_cancer —,
10 epochs, η_t = 50/√t, radius 50, uniform averaging), not tuned per ε.

    nice python benchmarks/convex_accuracy.py --datasets breast_cancer,digits --seeds 5
    nice python benchmarks/convex_accuracy.py --datasets adult --seeds 3     # each Adult fit is a 32k-row solve

Each dataset's runs go to results/convex/accuracy_<dataset>.csv (rewritten when that dataset is
rerun); the summary accuracy_summary.csv / accuracy.md and the plot accuracy.png are rebuilt from
all per-dataset files present.
"""

from __future__ import annotations

import os

# One BLAS thread before numpy loads: oversubscribed BLAS threads crawl on a shared 2-core machine.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import time
import warnings

import numpy as np
import pandas as pd
from convex_common import EPSILONS, RESULTS, load, write_csv, write_markdown, write_png
from tqdm.auto import tqdm

LAMS = {"breast_cancer": (1e-5, 1e-4, 1e-3, 1e-2), "digits": (1e-5, 1e-4, 1e-3, 1e-2), "adult": (1e-4, 1e-3, 1e-2)}


def run(datasets: list[str], epsilons: list[float], seeds: int) -> pd.DataFrame:
    from sklearn.linear_model import LogisticRegression

    from featuredp.erm import NoisySGDClassifier, ObjectivePerturbationClassifier, OutputPerturbationClassifier

    rows = []
    for name in datasets:
        Xtr, ytr, Xte, yte = load(name)
        n = len(Xtr)
        for lam in LAMS[name]:
            clf = LogisticRegression(C=1.0 / (n * lam), max_iter=5000).fit(Xtr, ytr)
            rows.append(dict(dataset=name, method="non-private", epsilon=np.inf, lam=lam, seed=0,
                             accuracy=clf.score(Xte, yte), seconds=0.0))
        jobs = [(cls, eps, lam, s) for cls in (OutputPerturbationClassifier, ObjectivePerturbationClassifier)
                for eps in epsilons for lam in LAMS[name] for s in range(seeds)]
        jobs += [(NoisySGDClassifier, eps, 0.0, s) for eps in epsilons for s in range(seeds)]
        for cls, eps, lam, seed in tqdm(jobs, desc=name):
            if cls is NoisySGDClassifier:
                est = cls(epsilon=eps, delta=1e-5, data_norm=1.0, batch_size=64 if n < 1000 else 256, epochs=10,
                          lr_scale=50.0, radius=50.0, random_state=seed)
                method = "noisy SGD"
            else:
                est = cls(epsilon=eps, lam=lam, data_norm=1.0, random_state=seed)
                method = "output pert." if cls is OutputPerturbationClassifier else "objective pert."
            t = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                est.fit(Xtr, ytr)
            rows.append(dict(dataset=name, method=method, epsilon=eps, lam=lam, seed=seed,
                             accuracy=est.score(Xte, yte), seconds=time.perf_counter() - t))
    return pd.DataFrame(rows)


def summarise(df: pd.DataFrame) -> pd.DataFrame:
    """Best λ per (dataset, method, ε) by mean accuracy; mean ± std over seeds at that λ."""
    g = df.groupby(["dataset", "method", "epsilon", "lam"])["accuracy"].agg(["mean", "std", "count"]).reset_index()
    best = g.loc[g.groupby(["dataset", "method", "epsilon"])["mean"].idxmax()]
    return best.rename(columns={"mean": "accuracy", "std": "std", "count": "seeds"}).reset_index(drop=True)


def plot(summary: pd.DataFrame, path) -> None:  # type: ignore[no-untyped-def]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(summary["dataset"]))
    fig, axes = plt.subplots(1, len(names), figsize=(4.6 * len(names), 3.6), squeeze=False)
    for ax, name in zip(axes[0], names):
        part = summary[summary["dataset"] == name]
        for method, sub in part.groupby("method", sort=False):
            if method == "non-private":
                ax.axhline(sub["accuracy"].max(), color="k", ls="--", lw=1, label="non-private")
                continue
            sub = sub.sort_values("epsilon")
            ax.errorbar(sub["epsilon"], sub["accuracy"], yerr=sub["std"].fillna(0), marker="o", ms=3, capsize=2,
                        label=method)
        ax.set_xscale("log")
        ax.set_xlabel("ε")
        ax.set_title(name)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("test accuracy")
    axes[0][-1].legend(fontsize=8)
    fig.suptitle("DP-ERM accuracy vs ε (rows L2-normalised; λ tuned non-privately per point)", fontsize=9)
    write_png(fig, path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", default="breast_cancer,digits,adult")
    ap.add_argument("--epsilons", default=",".join(map(str, EPSILONS)))
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args()
    from pathlib import Path

    out = Path(args.out)
    for name in args.datasets.split(","):
        part = run([name], [float(e) for e in args.epsilons.split(",")], args.seeds)
        write_csv(part, out / f"accuracy_{name}.csv")
    order = ["breast_cancer", "digits", "adult"]
    files = sorted(out.glob("accuracy_*.csv"), key=lambda f: order.index(f.stem[9:]) if f.stem[9:] in order else 9)
    df = pd.concat([pd.read_csv(f) for f in files if f.stem != "accuracy_summary"], ignore_index=True)
    summary = summarise(df)
    ref = out / "diffprivlib.csv"  # optional reference from convex_diffprivlib.py (separate venv)
    if ref.exists():
        d = pd.read_csv(ref)
        g = d.groupby(["dataset", "method", "epsilon", "C"])["accuracy"].agg(["mean", "std", "count"]).reset_index()
        g = g.loc[g.groupby(["dataset", "method", "epsilon"])["mean"].idxmax()]
        g = g.rename(columns={"mean": "accuracy", "count": "seeds"}).drop(columns="C")
        summary = pd.concat([summary, g[g["dataset"].isin(summary["dataset"])]], ignore_index=True)
    write_csv(summary, out / "accuracy_summary.csv")
    table = summary.pivot_table(index=["dataset", "method"], columns="epsilon", values="accuracy").reset_index()
    table.columns = [c if isinstance(c, str) else f"ε={c:g}" for c in table.columns]
    write_markdown(table, out / "accuracy.md", "Test accuracy vs ε (mean over seeds, best λ per point)")
    plot(summary, out / "accuracy.png")
    print(table.to_string(index=False))


if __name__ == "__main__":
    main()
