"""Label-DP excess empirical risk vs n on Adult: Algorithm 1's split vs DP-SGD on the full loss.

The convex claim of the paper (SPEC §3 Thm 6, §4.1): for multinomial logistic regression
under label-DP, Algorithm 1 with ℓ_pub = LSE(Wᵀz) (public batch = all n rows, as in Thm 6)
and ℓ_priv = −(Wᵀz)_y (1-Lipschitz) needs √2 less noise than DP-SGD on the whole loss
(√2-Lipschitz) at the same (ε, δ), and with a fixed sampling rate p and T steps the noise
on the averaged gradient, σC/(pn), shrinks like 1/n, so the excess risk falls with n.

Setting: Adult training rows L2-normalised (+ intercept column), subsamples of n rows;
ε = 1, δ = 1e-5 (add-remove, PLD — the accounting of Thm 5); p = 0.02, 10 epochs
(T = 500), η_t = c/√t with c = 10, W = {‖W‖_F <= M = 10}, last iterate w_{T+1} (as in
Thm 6); 3 seeds. Excess risk = mean training cross-entropy of the released model minus
l* = min over W (accelerated projected gradient, run to convergence).

    nice python benchmarks/convex_excess_risk.py        # about 10 min on one busy core

Writes results/convex/excess_risk.csv and excess_risk.png (with Thm 6's bound per method).
"""

from __future__ import annotations

import os

# One BLAS thread before numpy loads: oversubscribed BLAS threads crawl on a shared 2-core machine.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import math
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
from convex_common import RESULTS, load, write_csv, write_markdown, write_png
from scipy import special
from tqdm.auto import tqdm

SIZES = (1000, 2000, 4000, 8000, 16000, 32561)
M, C_LR, P, EPOCHS, EPS, DELTA = 10.0, 10.0, 0.02, 10, 1.0, 1e-5


def mean_ce(logits: np.ndarray, y: np.ndarray) -> float:
    """Mean multinomial cross-entropy."""
    return float(np.mean(special.logsumexp(logits, axis=1) - logits[np.arange(len(y)), y]))


def constrained_optimum(Z: np.ndarray, y: np.ndarray, K: int, radius: float, iters: int = 4000) -> float:
    """min_{‖W‖_F <= radius} mean CE(ZW, y) by FISTA with projection (the loss is smooth and convex)."""
    n, d = Z.shape
    Y = np.eye(K)[y]
    smooth = 0.5 * np.linalg.eigvalsh(Z.T @ Z / n).max()  # softmax Hessian <= ½ I ⊗ ZᵀZ/n
    step = 1.0 / smooth

    def proj(W: np.ndarray) -> np.ndarray:
        nrm = np.linalg.norm(W)
        return W * (radius / nrm) if nrm > radius else W

    W = V = np.zeros((d, K))
    t = 1.0
    for _ in range(iters):
        G = Z.T @ (special.softmax(Z @ V, axis=1) - Y) / n
        W_new = proj(V - step * G)
        t_new = (1 + math.sqrt(1 + 4 * t * t)) / 2
        V = W_new + (t - 1) / t_new * (W_new - W)
        W, t = W_new, t_new
    return mean_ce(Z @ W, y)


def thm6_bound(d: int, noise_std: float, steps: int, lipschitz: float) -> float:
    """(M²/c + cτ'² + c·d·s²)(2 + log T)/√T with s the noise std on the averaged gradient."""
    return (M**2 / C_LR + C_LR * lipschitz**2 + C_LR * d * noise_std**2) * (2 + math.log(steps)) / math.sqrt(steps)


def run(sizes: list[int], seeds: int) -> pd.DataFrame:
    from featuredp.erm import NoisySGDClassifier

    Xall, yall, _, _ = load("adult")
    K = int(yall.max()) + 1
    rows = []
    for n in tqdm(sizes, desc="n"):
        idx = np.random.default_rng(12345).permutation(len(Xall))[:n]  # one fixed subsample per n
        X, y = Xall[idx], yall[idx]
        Z = np.hstack([X, np.ones((n, 1))]) / math.sqrt(2)  # the estimators' intercept augmentation
        l_star = constrained_optimum(Z, y, K, M)
        m = max(1, round(P * n))
        for method, kw in (("Alg. 1 (label split)", {"label_private": True}),
                           ("DP-SGD (full loss)", {"multi_class": "multinomial"})):
            for seed in range(seeds):
                est = NoisySGDClassifier(epsilon=EPS, delta=DELTA, data_norm=1.0, batch_size=m, epochs=EPOCHS,
                                         lr_scale=C_LR, radius=M, averaging="last", random_state=seed, **kw)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    est.fit(X, y)
                loss = mean_ce(est.decision_function(X), y)
                s = est.noise_multiplier_ * est.clip_norm_ / m
                rows.append(dict(n=n, method=method, seed=seed, train_loss=loss, l_star=l_star,
                                 excess_risk=loss - l_star, epsilon=est.epsilon_,
                                 noise_multiplier=est.noise_multiplier_, clip_norm=est.clip_norm_,
                                 steps=est.steps_, batch=m, noise_std=s,
                                 thm6_bound=thm6_bound(Z.shape[1] * K, s, est.steps_, math.sqrt(2))))
    return pd.DataFrame(rows)


def plot(df: pd.DataFrame, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    for (method, sub), color in zip(df.groupby("method", sort=False), ("C0", "C3")):
        g = sub.groupby("n").agg(mean=("excess_risk", "mean"), std=("excess_risk", "std"),
                                 bound=("thm6_bound", "mean")).reset_index()
        ax.errorbar(g["n"], g["mean"], yerr=g["std"], marker="o", color=color, capsize=2, label=method)
        ax2.plot(g["n"], g["bound"], ls="--", marker=".", color=color, label=f"Thm 6 bound, {method}")
        ax2.plot(g["n"], g["mean"], marker="o", color=color, label=f"measured, {method}")
    for a in (ax, ax2):
        a.set_xscale("log")
        a.set_yscale("log")
        a.set_xlabel("n (Adult subsample)")
        a.grid(alpha=0.3, which="both")
    ax.set_ylabel("excess empirical risk")
    ax.set_title(f"label-DP logistic regression, ε={EPS:g}, δ={DELTA:g}", fontsize=9)
    ax2.set_title("against Theorem 6's bound (c/√t, last iterate)", fontsize=9)
    ax.legend(fontsize=8)
    ax2.legend(fontsize=7)
    write_png(fig, path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)))
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args()
    out = Path(args.out)
    df = run([int(s) for s in args.sizes.split(",")], args.seeds)
    write_csv(df, out / "excess_risk.csv")
    summary = df.groupby(["n", "method"]).agg(excess_risk=("excess_risk", "mean"), std=("excess_risk", "std"),
                                              thm6_bound=("thm6_bound", "mean"), noise_std=("noise_std", "mean"),
                                              l_star=("l_star", "mean")).reset_index()
    write_markdown(summary, out / "excess_risk.md", "Label-DP excess empirical risk on Adult (ε = 1)")
    plot(df, out / "excess_risk.png")
    print(summary.to_string(index=False))


if __name__ == "__main__":
    main()
