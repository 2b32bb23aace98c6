"""Fréchet distance (FID) and kernel inception distance (KID) between two feature sets.

FID = ‖μ₁ − μ₂‖² + tr(Σ₁ + Σ₂ − 2(Σ₁Σ₂)^{1/2}) (Heusel et al. 2017). The matrix square root's trace
is computed from the eigenvalues of Σ₁^{1/2} Σ₂ Σ₁^{1/2}, which are real and ≥ 0 (symmetric PSD),
avoiding the complex round-off of a general ``sqrtm``.
KID = the unbiased MMD² with the cubic polynomial kernel k(a, b) = (aᵀb/d + 1)³ (Bińkowski et al.
2018), averaged over random subsets; reported with its standard deviation over subsets.
"""

from __future__ import annotations

import numpy as np

from featuredp._validate import check_int

__all__ = ["feature_statistics", "frechet_bootstrap", "frechet_distance", "frechet_from_features", "kernel_distance"]


def feature_statistics(features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and covariance (float64) of features (N, d); needs N ≥ 2."""
    f = np.asarray(features, dtype=np.float64)
    if f.ndim != 2 or len(f) < 2:
        raise ValueError(f"features must have shape (N >= 2, d), got {f.shape}")
    return f.mean(0), np.cov(f, rowvar=False)


def _psd_sqrt(m: np.ndarray) -> np.ndarray:
    w, v = np.linalg.eigh((m + m.T) / 2)
    return (v * np.sqrt(np.clip(w, 0, None))) @ v.T


def frechet_distance(mu1: np.ndarray, sigma1: np.ndarray, mu2: np.ndarray, sigma2: np.ndarray) -> float:
    """Fréchet distance between N(mu1, sigma1) and N(mu2, sigma2).

    >>> import numpy as np
    >>> frechet_distance(np.zeros(2), np.eye(2), np.ones(2), np.eye(2))  # ‖μ₁ − μ₂‖² = 2, equal covariances
    2.0
    >>> round(frechet_distance(np.zeros(1), np.eye(1), np.zeros(1), 4 * np.eye(1)), 6)  # (σ₁ − σ₂)² = 1
    1.0
    """
    mu1, mu2 = np.atleast_1d(mu1).astype(np.float64), np.atleast_1d(mu2).astype(np.float64)
    s1, s2 = np.atleast_2d(sigma1).astype(np.float64), np.atleast_2d(sigma2).astype(np.float64)
    if mu1.shape != mu2.shape or s1.shape != s2.shape or s1.shape != (len(mu1), len(mu1)):
        raise ValueError(f"shapes do not match: mu {mu1.shape}/{mu2.shape}, sigma {s1.shape}/{s2.shape}")
    r1 = _psd_sqrt(s1)
    eig = np.linalg.eigvalsh(r1 @ s2 @ r1)
    tr_sqrt = float(np.sqrt(np.clip(eig, 0, None)).sum())
    diff = mu1 - mu2
    return float(max(diff @ diff + np.trace(s1) + np.trace(s2) - 2 * tr_sqrt, 0.0))


def frechet_from_features(f1: np.ndarray, f2: np.ndarray) -> float:
    """FID between two feature sets (N₁, d) and (N₂, d)."""
    return frechet_distance(*feature_statistics(f1), *feature_statistics(f2))


def frechet_bootstrap(
    f1: np.ndarray, f2: np.ndarray, *, resamples: int = 200, level: float = 0.95, seed: int = 0
) -> tuple[float, float]:
    """Bootstrap interval for the expected FID(f1, f2) at f1's sample size n, over the rows of ``f1``
    (the generated set; the reference ``f2`` is held fixed).

    FID is biased upwards at finite n, and a resample drawn with replacement repeats rows, which adds
    more of the same bias: in 2,048-d Inception space at n = 500 the resampled values all sit well above
    the estimate, so the plain percentile interval does not even contain it (in a simulation with
    d = 24 and n = 80 it covered the expected FID in 4 draws of 100). The interval is therefore the
    *basic* bootstrap centred on the bootstrap mean: θ̂ − (q_hi − m*), θ̂ − (q_lo − m*), with q the
    resampled values' quantiles and m* their mean. It targets E[FID at this n], the quantity that rows
    with the same n compare, not FID at n = ∞ (which is lower).

    Σ₂^{1/2} is computed once. Each resample then needs only the eigenvalues of an n × n Gram matrix,
    not of a d × d product: with X the centred resample, Σ₂^{1/2} Σ₁ Σ₂^{1/2} = YᵀY for
    Y = X Σ₂^{1/2} / √(n − 1), which has the same non-zero eigenvalues as YYᵀ. For 2,048-d Inception
    features and n = 500 that is ~50× faster than two d × d eigendecompositions per resample.

    >>> rng = np.random.default_rng(0)
    >>> gen, ref = rng.normal(size=(500, 2)), rng.normal(size=(500, 2))
    >>> lo, hi = frechet_bootstrap(gen, ref, resamples=50)
    >>> 0 <= lo <= frechet_from_features(gen, ref) <= hi < 0.2
    True
    """
    a = np.asarray(f1, np.float64)
    resamples = check_int("resamples", resamples, minimum=2)
    if not 0 < level < 1:
        raise ValueError(f"level must lie in (0, 1), got {level!r}")
    mu2, s2 = feature_statistics(f2)
    if a.ndim != 2 or len(a) < 2 or a.shape[1] != len(mu2):
        raise ValueError(f"f1 must have shape (N >= 2, {len(mu2)}), got {a.shape}")
    r2, tr2 = _psd_sqrt(s2), float(np.trace(s2))
    n = len(a)

    def fid(x: np.ndarray) -> float:
        mu1 = x.mean(0)
        xc = x - mu1
        y = xc @ r2 / np.sqrt(n - 1)
        gram = y @ y.T if n <= y.shape[1] else y.T @ y
        tr_sqrt = float(np.sqrt(np.clip(np.linalg.eigvalsh(gram), 0, None)).sum())
        diff = mu1 - mu2
        return max(float(diff @ diff) + float((xc**2).sum()) / (n - 1) + tr2 - 2 * tr_sqrt, 0.0)

    rng = np.random.default_rng(seed)
    vals = np.array([fid(a[rng.integers(0, n, n)]) for _ in range(resamples)])
    q_lo, q_hi = np.quantile(vals, [(1 - level) / 2, (1 + level) / 2])
    theta, m = fid(a), float(vals.mean())
    return float(max(theta - (q_hi - m), 0.0)), float(theta - (q_lo - m))


def kernel_distance(
    f1: np.ndarray, f2: np.ndarray, *, subsets: int = 50, subset_size: int = 1000, seed: int = 0
) -> tuple[float, float]:
    """KID (mean, std over subsets): unbiased MMD² with the cubic polynomial kernel."""
    a, b = np.asarray(f1, np.float64), np.asarray(f2, np.float64)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1]:
        raise ValueError(f"features must be (N, d) with the same d, got {a.shape} and {b.shape}")
    subsets = check_int("subsets", subsets, minimum=1)
    m = min(check_int("subset_size", subset_size, minimum=2), len(a), len(b))
    if m < 2:
        raise ValueError(f"need at least 2 samples per set, got {len(a)} and {len(b)}")
    d = a.shape[1]
    rng = np.random.default_rng(seed)
    vals = []
    for _ in range(subsets):
        x = a[rng.choice(len(a), m, replace=False)]
        y = b[rng.choice(len(b), m, replace=False)]
        kxx = (x @ x.T / d + 1) ** 3
        kyy = (y @ y.T / d + 1) ** 3
        kxy = (x @ y.T / d + 1) ** 3
        vals.append((kxx.sum() - np.trace(kxx)) / (m * (m - 1)) + (kyy.sum() - np.trace(kyy)) / (m * (m - 1))
                    - 2 * kxy.mean())
    v = np.asarray(vals)
    return float(v.mean()), float(v.std())
