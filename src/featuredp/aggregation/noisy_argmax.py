"""Vote histograms and their noisy argmax: GNMax (Gaussian), LNMax (Laplace) and the noisy threshold test.

The neighbouring relation behind every number here: one private record lives in exactly one
*member* — one teacher's partition (PATE) or one prompt (DP in-context learning) — so adding,
removing or replacing it can change only that member's vote. A vote moving from class a to
class b changes the histogram by −1 at a and +1 at b: L1 = 2, L2 = √2, L∞ = 1. With abstentions
(vote −1) a vote can also go from "abstain" to a class (or back): L1 = L2 = L∞ = 1, within those
bounds. The largest count max_j h_j moves by at most 1 either way.

* GNMax: argmax(h + N(0, σ²I)) is post-processing of the Gaussian mechanism on h with L2
  sensitivity √2: one Gaussian event with noise multiplier σ/√2.
* LNMax: argmax(h + Lap(b)^K) is post-processing of the Laplace mechanism with L1 sensitivity 2:
  pure ε = 2/b per query (a Laplace event with noise multiplier b/2).
* Threshold test (Confident-GNMax): max_j h_j + N(0, σ₁²) >= T, a Gaussian release with
  sensitivity 1 (noise multiplier σ₁).

The accounting lives in :mod:`featuredp.aggregation.aggregator`. Noise comes from the ``rng``
passed in: a ``numpy.random.Generator`` or a :class:`featuredp.noise.ChaCha20Generator`; ``None``
draws a fresh generator from OS entropy (never a default seed: the noise is what hides the votes).
"""

from __future__ import annotations

from typing import Any, TypeAlias

import numpy as np

from featuredp._validate import check_int, check_positive, check_real
from featuredp.errors import DataValidationError
from featuredp.noise.sources import ChaCha20Generator
from featuredp.sampling import warn_private_seed

__all__ = [
    "ABSTAIN",
    "Rng",
    "gnmax",
    "lnmax",
    "noisy_histogram",
    "noisy_max_passes",
    "resolve_rng",
    "vote_histogram",
]

#: the vote of a member that does not answer a query (counted nowhere in the histogram)
ABSTAIN = -1

Rng: TypeAlias = np.random.Generator | ChaCha20Generator


def resolve_rng(rng: object, *, stacklevel: int = 3) -> Rng:
    """The noise generator for ``rng``: a Generator / ChaCha20Generator as is, ``None`` → fresh OS entropy.

    An integer is a *seed* of the private noise: reproducible, so it warns
    (``PrivacyRiskWarning``); anyone who learns it can replay the noise.
    """
    if rng is None:
        return np.random.default_rng()  # SeedSequence() from OS entropy
    if isinstance(rng, np.random.Generator | ChaCha20Generator):
        return rng
    if isinstance(rng, int | np.integer) and not isinstance(rng, bool):
        seed = check_int("rng", rng, minimum=0)
        warn_private_seed("rng", seed, stacklevel=stacklevel + 1)
        return np.random.default_rng(seed)
    raise TypeError(f"rng must be None, a numpy.random.Generator or a featuredp.noise.ChaCha20Generator, got {rng!r}")


def _normal(rng: Rng, shape: tuple[int, ...]) -> np.ndarray:
    size = int(np.prod(shape))
    return np.asarray(rng.standard_normal(size), dtype=np.float64).reshape(shape)


def _laplace(rng: Rng, shape: tuple[int, ...]) -> np.ndarray:
    size = int(np.prod(shape))
    if isinstance(rng, np.random.Generator):
        return rng.laplace(0.0, 1.0, size).reshape(shape)
    # Lap(1) = E1 − E2 with independent Exp(1); 1 − u lies in (0, 1], so the log stays finite.
    u = rng.random(2 * size).reshape(2, size)
    e = -np.log1p(-u)
    return (e[0] - e[1]).reshape(shape)


def vote_histogram(votes: Any, n_classes: int) -> np.ndarray:
    """Counts of each class among the members' votes, as float64.

    ``votes``: integers of shape ``(n_members,)`` (one query) or ``(n_queries, n_members)``, each a
    class index in ``[0, n_classes)`` or ``-1`` (:data:`ABSTAIN`: the member does not vote; it is
    counted nowhere). Returns shape ``(n_classes,)`` or ``(n_queries, n_classes)``. ``n_classes`` is
    the declared, public class count — never read from the votes, which depend on private data.
    A vote outside ``[-1, n_classes)`` or a non-integer array raises ``DataValidationError``.

    >>> vote_histogram([0, 2, 2, -1], 3).tolist()
    [1.0, 0.0, 2.0]
    >>> vote_histogram([[0, 1], [1, 1]], 2).tolist()
    [[1.0, 1.0], [0.0, 2.0]]
    """
    k = check_int("n_classes", n_classes, minimum=2)
    v = np.asarray(votes)
    if v.ndim not in (1, 2):
        raise DataValidationError(f"votes must have shape (n_members,) or (n_queries, n_members), got {v.shape}")
    if v.size and (v.dtype == np.bool_ or not np.issubdtype(v.dtype, np.integer)):
        raise DataValidationError(f"votes must be integer class indices (-1 = abstain), got dtype {v.dtype}")
    v = v.astype(np.int64, copy=False)
    if v.size and (v.min() < ABSTAIN or v.max() >= k):
        bad = v[(v < ABSTAIN) | (v >= k)]
        raise DataValidationError(
            f"votes must be class indices in 0..{k - 1} or -1 (abstain) for n_classes={k}, got {int(bad[0])} "
            f"({bad.size} vote(s) out of range)"
        )
    rows = v.reshape(1, -1) if v.ndim == 1 else v
    n_q = rows.shape[0]
    # one bincount over (query, class) pairs; abstentions go to a spare column that is dropped
    flat = np.where(rows >= 0, rows, k) + (k + 1) * np.arange(n_q)[:, None]
    counts = np.bincount(flat.ravel(), minlength=n_q * (k + 1)).reshape(n_q, k + 1)[:, :k]
    hist = counts.astype(np.float64)
    return hist[0] if v.ndim == 1 else hist


def _check_histogram(histogram: Any) -> np.ndarray:
    h = np.asarray(histogram, dtype=np.float64)
    if h.ndim not in (1, 2) or h.shape[-1] < 2:
        raise DataValidationError(f"histogram must have shape (n_classes,) or (n_queries, n_classes) with "
                                  f"n_classes >= 2, got {h.shape}")  # fmt: skip
    if not np.all(np.isfinite(h)):
        raise DataValidationError("histogram must hold finite counts")
    return h


def noisy_histogram(
    histogram: Any, *, sigma: float | None = None, scale: float | None = None, rng: object = None
) -> np.ndarray:
    """``histogram`` plus i.i.d. N(0, σ²) (``sigma``) or Laplace(b) (``scale``) noise on every count.

    Give exactly one of ``sigma`` and ``scale``. This is the mechanism's internal state: releasing
    the noisy counts themselves is the Gaussian / Laplace mechanism on the histogram (the same
    event as the argmax, which is its post-processing), but callers should release only the argmax.
    """
    h = _check_histogram(histogram)
    if (sigma is None) == (scale is None):
        raise ValueError(f"give exactly one of sigma (Gaussian) and scale (Laplace), got sigma={sigma!r}, "
                         f"scale={scale!r}")  # fmt: skip
    gen = resolve_rng(rng)
    if sigma is not None:
        return h + check_positive("sigma", sigma) * _normal(gen, h.shape)
    return h + check_positive("scale", scale) * _laplace(gen, h.shape)


def gnmax(histogram: Any, sigma: float, rng: object = None) -> int:
    """GNMax: argmax_j (h_j + N(0, σ²)) of one vote histogram.

    One query is the Gaussian mechanism with L2 sensitivity √2 (one member's vote moves),
    post-processed: a Gaussian event with noise multiplier σ/√2.

    >>> gnmax([0.0, 250.0, 0.0], sigma=1.0, rng=np.random.default_rng(0))
    1
    """
    h = _check_histogram(histogram)
    if h.ndim != 1:
        raise DataValidationError(f"gnmax takes one histogram of shape (n_classes,), got {h.shape}")
    return int(np.argmax(noisy_histogram(h, sigma=sigma, rng=resolve_rng(rng))))


def lnmax(histogram: Any, scale: float, rng: object = None) -> int:
    """LNMax: argmax_j (h_j + Laplace(b)) of one vote histogram.

    One query is the Laplace mechanism with L1 sensitivity 2: pure ε = 2/b.

    >>> lnmax([0.0, 250.0, 0.0], scale=1.0, rng=np.random.default_rng(0))
    1
    """
    h = _check_histogram(histogram)
    if h.ndim != 1:
        raise DataValidationError(f"lnmax takes one histogram of shape (n_classes,), got {h.shape}")
    return int(np.argmax(noisy_histogram(h, scale=scale, rng=resolve_rng(rng))))


def noisy_max_passes(histogram: Any, threshold: float, sigma_threshold: float, rng: object = None) -> Any:
    """The threshold test of Confident-GNMax: max_j h_j + N(0, σ₁²) >= T (per row for a 2-D input).

    The largest count has sensitivity 1, so the test is a Gaussian release with noise multiplier σ₁.
    Returns a bool (one histogram) or a bool array (one per row).

    >>> bool(noisy_max_passes([0.0, 250.0], threshold=100.0, sigma_threshold=1.0, rng=np.random.default_rng(0)))
    True
    """
    h = _check_histogram(histogram)
    t = check_real("threshold", threshold)
    s = check_positive("sigma_threshold", sigma_threshold)
    top = h.max(axis=-1)
    noise = _normal(resolve_rng(rng), top.shape if top.ndim else (1,))
    passed = top + s * noise.reshape(top.shape) >= t
    return bool(passed) if h.ndim == 1 else passed
