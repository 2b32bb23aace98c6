"""Private aggregation of votes: GNMax, LNMax, Confident-GNMax, with accounting and a budget stop.

Used by PATE (:mod:`featuredp.mechanisms.pate`: teachers trained on disjoint partitions vote on public
queries) and by DP in-context learning (one prompt per member). The guarantee rests on one
fact: a private record lives in exactly one member, so adding, removing or replacing it changes
at most one member's vote — the histogram moves by at most L1 = 2, L2 = √2, L∞ = 1.

::

    vote_histogram(votes, n_classes) -> np.ndarray            # (n_classes,) or (n_queries, n_classes), float64
    gnmax(histogram, sigma, rng) -> int                       # argmax(h + N(0, σ²I))
    lnmax(histogram, scale, rng) -> int                       # argmax(h + Lap(b)^K)
    VoteAggregator(n_classes, *, mechanism="gnmax", sigma=, scale=, threshold=, sigma_threshold=,
                   delta=1e-5, max_epsilon=None, ledger=None, secure_rng=False, seed=None)
        .answer(votes) -> int | None                          # None: Confident-GNMax threshold not passed
        .answer_all(votes_matrix, *, stop_at_budget=True) -> np.ndarray   # -1: not answered / not asked
        .epsilon, .queries_asked, .queries_answered, .event(), .describe()
        VoteAggregator.calibrate(n_classes, *, epsilon, delta, queries, mechanism="gnmax", ...)

Accounting is data-independent and conservative (every asked query is charged its full event);
docs/pate.md has the details.
"""

from __future__ import annotations

from featuredp.aggregation.aggregator import (
    MECHANISMS,
    VoteAggregator,
    aggregation_event,
    calibrate_scale,
    calibrate_sigma,
    epsilon_for_queries,
    query_event,
)
from featuredp.aggregation.noisy_argmax import (
    ABSTAIN,
    gnmax,
    lnmax,
    noisy_histogram,
    noisy_max_passes,
    resolve_rng,
    vote_histogram,
)

__all__ = [
    "ABSTAIN",
    "MECHANISMS",
    "VoteAggregator",
    "aggregation_event",
    "calibrate_scale",
    "calibrate_sigma",
    "epsilon_for_queries",
    "gnmax",
    "lnmax",
    "noisy_histogram",
    "noisy_max_passes",
    "query_event",
    "resolve_rng",
    "vote_histogram",
]
