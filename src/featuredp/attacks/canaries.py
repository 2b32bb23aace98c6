"""Canary designs for audits (numpy only): which records to plant, and how to score them.

Three kinds of canary:

* **mislabelled records** (:func:`mislabelled_canaries`): real inputs with a wrong label;
  the model can only fit them by memorising, so their loss reveals inclusion (record-level DP).
* **feature-DP canaries** (:func:`feature_canaries`): pairs of records that differ *only* in
  their private attributes, i.e. FDP's replacement neighbours (same Ψ(x), same label). Each
  canary's coin decides which version is trained on; the attack compares the two losses.
  The certified ε must be compared with the *replace-one* feature-DP ε of the training.
* **gradient canaries for DP-SGD** (:func:`simulate_dpsgd_gradient_canaries`): the white-box
  "Dirac canary" audit of the mechanism itself — each canary is a gradient of norm C along its
  own coordinate that no real record touches, and the auditor sees every noisy step. This is
  the worst case of Poisson-subsampled Gaussian DP-SGD, so its lower bound should approach the
  accountant's ε when the design is strong enough.

Each design returns the inclusion bits; guesses are made from scores with
:func:`featuredp.attacks.bounds.one_run_audit` (one run) or
:func:`featuredp.attacks.bounds.multi_run_epsilon_lower_bound` (many runs).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from featuredp._validate import check_int, check_positive, check_sampling_rate


@dataclass(frozen=True)
class CanarySet:
    """Planted canaries: inputs of both versions, labels, and the secret inclusion bits.

    For mislabelled canaries ``X_alt`` is None: bit 1 = inserted, bit 0 = left out.
    For feature-DP canaries bit b means ``X_alt`` (b = 1) or ``X`` (b = 0) was trained on.
    """

    kind: str
    X: np.ndarray
    y: np.ndarray
    bits: np.ndarray
    X_alt: np.ndarray | None = None
    source_index: np.ndarray | None = None

    def training_rows(self) -> tuple[np.ndarray, np.ndarray]:
        """The rows to add to the training set (per the secret bits)."""
        if self.X_alt is None:
            return self.X[self.bits], self.y[self.bits]
        X = np.where(self.bits[:, None], self.X_alt, self.X)
        return X, self.y.copy()


def mislabelled_canaries(
    X: np.ndarray, y: np.ndarray, n_classes: int, m: int, rng: np.random.Generator
) -> CanarySet:
    """``m`` records drawn from (X, y) without replacement, each given a different random label;
    each is inserted with probability ½."""
    X = np.asarray(X)
    y = np.asarray(y).astype(np.int64)
    m = check_int("m", m, minimum=1)
    k = check_int("n_classes", n_classes, minimum=2)
    if m > X.shape[0]:
        raise ValueError(f"m must be <= the number of candidate records {X.shape[0]}, got {m}")
    idx = rng.choice(X.shape[0], size=m, replace=False)
    shift = rng.integers(1, k, size=m)
    labels = (y[idx] + shift) % k  # always a wrong label
    bits = rng.random(m) < 0.5
    return CanarySet("mislabelled", X[idx].copy(), labels, bits, None, idx)


def feature_canaries(
    X: np.ndarray,
    y: np.ndarray,
    private_groups: list[np.ndarray],
    m: int,
    rng: np.random.Generator,
    *,
    flip_label: bool = False,
    n_classes: int | None = None,
) -> CanarySet:
    """Pairs that differ only in private one-hot attributes (FDP's replacement neighbours).

    ``private_groups`` lists, per private categorical attribute, the column indices of its
    one-hot block in ``X``. Version 0 keeps the record's values; version 1 moves every
    private attribute to a different category drawn uniformly. Public columns and the label
    are identical in both versions, so Ψ(x0) = Ψ(x1). With ``flip_label`` the shared label
    is replaced by a wrong one (both versions), which makes the records atypical and the
    private difference easier to memorise — still a valid pair of FDP neighbours.
    """
    X = np.asarray(X, dtype=np.float32)
    y = np.asarray(y).astype(np.int64)
    m = check_int("m", m, minimum=1)
    if not private_groups:
        raise ValueError("private_groups must list at least one attribute's one-hot columns, got []")
    for i, g in enumerate(private_groups):
        if len(g) < 2:
            raise ValueError(f"private_groups[{i}] must have >= 2 one-hot columns, got {list(g)}")
    if m > X.shape[0]:
        raise ValueError(f"m must be <= the number of candidate records {X.shape[0]}, got {m}")
    idx = rng.choice(X.shape[0], size=m, replace=False)
    x0 = X[idx].copy()
    x1 = x0.copy()
    for g in private_groups:
        g = np.asarray(g)
        cur = np.argmax(x0[:, g], axis=1)
        new = (cur + rng.integers(1, g.size, size=m)) % g.size
        block = np.zeros((m, g.size), dtype=np.float32)
        block[np.arange(m), new] = 1.0
        x1[:, g] = block
    labels = y[idx].copy()
    if flip_label:
        k = check_int("n_classes", n_classes, minimum=2)
        labels = (labels + rng.integers(1, k, size=m)) % k
    bits = rng.random(m) < 0.5
    return CanarySet("feature", x0, labels, bits, x1, idx)


def feature_canary_scores(loss_x0: object, loss_x1: object) -> np.ndarray:
    """Score of "version 1 was trained on": loss(x0) − loss(x1)."""
    a = np.asarray(loss_x0, dtype=float).ravel()
    b = np.asarray(loss_x1, dtype=float).ravel()
    if a.shape != b.shape:
        raise ValueError(f"loss_x1 must have the shape of loss_x0 {a.shape}, got {b.shape}")
    return a - b


def simulate_dpsgd_gradient_canaries(
    m: int,
    noise_multiplier: float,
    sampling_rate: float,
    steps: int,
    rng: np.random.Generator,
    *,
    chunk: int = 256,
) -> tuple[np.ndarray, np.ndarray]:
    """White-box Dirac gradient canaries through Poisson-subsampled Gaussian DP-SGD.

    Each canary i owns coordinate i (no real record touches it); if included (bit 1,
    probability ½) it is sampled at each step with probability ``sampling_rate`` and then
    adds its clipped gradient, of norm 1 in units of C, to that coordinate. Each step the
    auditor observes coordinate i plus N(0, σ²). The score is the exact log-likelihood
    ratio of the whole trajectory, Σ_t log(1 − p + p·exp((2 z_t − 1)/(2σ²))), the most
    powerful test for one canary (Neyman–Pearson). Returns ``(scores, bits)``.
    """
    m = check_int("m", m, minimum=1)
    sigma = check_positive("noise_multiplier", noise_multiplier)
    p = check_sampling_rate("sampling_rate", sampling_rate)
    t = check_int("steps", steps, minimum=1)
    chunk = check_int("chunk", chunk, minimum=1)
    bits = rng.random(m) < 0.5
    scores = np.zeros(m)
    for start in range(0, t, chunk):
        n = min(chunk, t - start)
        sampled = rng.random((m, n)) < p
        z = rng.normal(0.0, sigma, size=(m, n)) + (sampled & bits[:, None])
        # log(1 − p + p·e^x) computed stably with logaddexp
        x = (2.0 * z - 1.0) / (2.0 * sigma * sigma)
        if p < 1.0:
            scores += np.logaddexp(np.log1p(-p), np.log(p) + x).sum(axis=1)
        else:
            scores += x.sum(axis=1)
    return scores, bits
