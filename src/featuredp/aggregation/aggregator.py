"""Private aggregation of members' votes (PATE teachers, in-context-learning prompts) with a budget.

:class:`VoteAggregator` answers queries — one vote per member per query — with GNMax, LNMax or
Confident-GNMax (:mod:`featuredp.aggregation.noisy_argmax`), keeps the privacy spent and refuses
a query that would take ε above ``max_epsilon`` *before* anything is released for it.

Accounting (data-independent, conservative). Every query asked is charged its full event,
whether it was answered or not:

* GNMax with std σ: ``GaussianDpEvent(σ/√2)`` (L2 sensitivity √2);
* LNMax with scale b: ``LaplaceDpEvent(b/2)`` (L1 sensitivity 2: ε = 2/b per query);
* Confident-GNMax: ``GaussianDpEvent(σ₁)`` for the threshold test (the top count has sensitivity 1)
  composed with ``GaussianDpEvent(σ₂/√2)`` for the argmax — on *every* query, also those that
  failed the test. Charging only the answered ones would need a privacy filter (the number of
  answered queries depends on the data); we do not build one, so the conservative charge is kept.

The events are composed by :func:`featuredp.accounting.compute_epsilon` (add-remove; Gaussian
compositions in closed form, Laplace ones with a pessimistic PLD), at the aggregator's ``delta``.
The per-query events are stated relative to sensitivity 1 for *one member's vote changing*, which
is what adding, removing or replacing one private record does: ε is the same under add-remove
and replace-one of a record. No data-dependent (smooth-sensitivity) analysis is offered: the
reported ε never looks at the votes.
"""

from __future__ import annotations

import hashlib
import math
import os
from typing import Any

import dp_accounting
import numpy as np
from scipy import optimize

from featuredp._keys import Uncopyable
from featuredp._validate import check_choice, check_int, check_open_unit, check_positive, check_real
from featuredp.accounting import BudgetLedger, DpEvent, compute_epsilon
from featuredp.accounting._gaussian import gaussian_delta
from featuredp.aggregation.noisy_argmax import _laplace, _normal, vote_histogram
from featuredp.errors import BudgetExceededError, DataValidationError, UnreachableTargetError
from featuredp.noise.sources import ChaCha20Generator
from featuredp.sampling import warn_private_seed

__all__ = [
    "MECHANISMS",
    "VoteAggregator",
    "aggregation_event",
    "calibrate_scale",
    "calibrate_sigma",
    "epsilon_for_queries",
    "query_event",
]

MECHANISMS: tuple[str, ...] = ("gnmax", "lnmax")
#: default σ₁/σ₂ of Confident-GNMax in :meth:`VoteAggregator.calibrate` (the threshold test costs ~2% of a query)
DEFAULT_SIGMA_THRESHOLD_RATIO = 5.0
_SQRT2 = math.sqrt(2.0)
_NOT_COPIED = (
    "VoteAggregator holds a noise key and a query budget; a copy would answer with the same noise under the same "
    "budget: share one featuredp.accounting.BudgetLedger(path, ...) between processes instead"
)
# the most queries a budget search considers (a Gaussian at σ = 10⁴ affords ~10⁸ at ε = 1)
_MAX_QUERIES = 10**9


def query_event(
    mechanism: str = "gnmax",
    *,
    sigma: float | None = None,
    scale: float | None = None,
    sigma_threshold: float | None = None,
) -> DpEvent:
    """The privacy event of one query (data-independent; charged whether it is answered or not).

    >>> query_event("gnmax", sigma=2.0)
    GaussianDpEvent(noise_multiplier=1.414...)
    >>> query_event("lnmax", scale=4.0)
    LaplaceDpEvent(noise_multiplier=2.0)
    """
    mechanism = check_choice("mechanism", mechanism, MECHANISMS)
    if mechanism == "lnmax":
        if sigma is not None or sigma_threshold is not None:
            raise ValueError(f"mechanism='lnmax' takes scale, not sigma/sigma_threshold; got sigma={sigma!r}, "
                             f"sigma_threshold={sigma_threshold!r}")  # fmt: skip
        if scale is None:
            raise ValueError("mechanism='lnmax' needs scale (the Laplace scale b > 0)")
        # L1 sensitivity 2 → noise multiplier b/2 relative to sensitivity 1 (ε = 2/b)
        return dp_accounting.LaplaceDpEvent(check_positive("scale", scale) / 2.0)
    if scale is not None:
        raise ValueError(f"mechanism='gnmax' takes sigma, not scale; got scale={scale!r}")
    if sigma is None:
        raise ValueError("mechanism='gnmax' needs sigma (the Gaussian noise std > 0)")
    argmax = dp_accounting.GaussianDpEvent(check_positive("sigma", sigma) / _SQRT2)  # L2 sensitivity √2
    if sigma_threshold is None:
        return argmax
    # the threshold test releases max_j h_j + N(0, σ₁²): sensitivity 1
    return dp_accounting.ComposedDpEvent(
        [dp_accounting.GaussianDpEvent(check_positive("sigma_threshold", sigma_threshold)), argmax]
    )


def aggregation_event(per_query: DpEvent, queries: int) -> DpEvent:
    """``queries`` self-compositions of one query's event (``NoOpDpEvent`` for none)."""
    q = check_int("queries", queries, minimum=0)
    if q == 0:
        return dp_accounting.NoOpDpEvent()
    return per_query if q == 1 else dp_accounting.SelfComposedDpEvent(per_query, q)


def epsilon_for_queries(
    queries: int,
    delta: float,
    *,
    mechanism: str = "gnmax",
    sigma: float | None = None,
    scale: float | None = None,
    sigma_threshold: float | None = None,
) -> float:
    """ε at ``delta`` after ``queries`` queries (data-independent, every query charged).

    >>> round(epsilon_for_queries(100, 1e-5, sigma=40.0), 3)
    1.356
    """
    event = query_event(mechanism, sigma=sigma, scale=scale, sigma_threshold=sigma_threshold)
    return compute_epsilon(aggregation_event(event, queries), check_open_unit("delta", delta))


def calibrate_sigma(
    epsilon: float, delta: float, queries: int, *, sigma_threshold_ratio: float | None = None
) -> tuple[float, float | None]:
    """(σ, σ₁) such that ``queries`` GNMax queries cost at most ``epsilon`` at ``delta`` (and >= 0.99·ε).

    ``sigma_threshold_ratio`` r (Confident-GNMax): the threshold test's σ₁ = r·σ is charged too;
    None: plain GNMax (σ₁ = None). Closed form: Q queries are μ-GDP with μ = √Q·√(2 + 1/r²)/σ.

    >>> sigma, _ = calibrate_sigma(1.0, 1e-5, 100)
    >>> round(sigma, 2), epsilon_for_queries(100, 1e-5, sigma=sigma) <= 1.0
    (52.76, True)
    """
    eps = check_positive("epsilon", epsilon)
    d = check_open_unit("delta", delta)
    q = check_int("queries", queries, minimum=1)
    ratio = None if sigma_threshold_ratio is None else check_positive("sigma_threshold_ratio", sigma_threshold_ratio)
    per_query = 2.0 + (0.0 if ratio is None else 1.0 / ratio**2)  # μ² of one query × σ²
    # δ(ε) of μ-GDP grows with μ: find the μ that spends exactly ε at δ
    hi = 1.0
    while gaussian_delta(eps, hi) < d:
        hi *= 2.0
    mu = optimize.brentq(lambda m: gaussian_delta(eps, m) - d, 1e-12, hi, xtol=1e-14, rtol=1e-12)
    sigma = math.sqrt(q * per_query) / mu

    def spent(s: float) -> float:
        return epsilon_for_queries(q, d, sigma=s, sigma_threshold=None if ratio is None else ratio * s)

    while spent(sigma) > eps:  # the closed form's root may sit a hair on the wrong side
        sigma *= 1.0 + 1e-9
    return sigma, (None if ratio is None else ratio * sigma)


def calibrate_scale(epsilon: float, delta: float, queries: int) -> float:
    """The Laplace scale b such that ``queries`` LNMax queries cost at most ``epsilon`` at ``delta`` (PLD).

    Never above the target; within 0.1% of the smallest such b. Pure composition (b = 2Q/ε) is the
    starting upper bracket; the PLD's advanced-composition behaviour allows less noise for many queries.

    >>> b = calibrate_scale(1.0, 1e-5, 1)
    >>> 2.0 <= b < 2.01
    True
    """
    eps = check_positive("epsilon", epsilon)
    d = check_open_unit("delta", delta)
    q = check_int("queries", queries, minimum=1)

    def spent(b: float) -> float:
        return epsilon_for_queries(q, d, mechanism="lnmax", scale=b)

    hi = 2.0 * q / eps
    while spent(hi) > eps:  # PLD discretisation can add a little over pure composition
        hi *= 1.5
    lo = hi / 2.0
    while spent(lo) <= eps:
        hi, lo = lo, lo / 2.0
        if lo < 1e-12:
            raise UnreachableTargetError(f"epsilon={eps!r} is reached with any Laplace scale (bug?)")
    while hi / lo > 1.0 + 1e-3:
        mid = math.sqrt(hi * lo)
        if spent(mid) <= eps:
            hi = mid
        else:
            lo = mid
    return hi


def _open_ledger(ledger: object) -> BudgetLedger | None:
    if ledger is None or isinstance(ledger, BudgetLedger):
        return ledger
    if isinstance(ledger, str | os.PathLike):
        if not os.path.exists(ledger):
            raise FileNotFoundError(
                f"ledger={str(ledger)!r} does not exist: create it once with its total budget, e.g. "
                f"BudgetLedger({str(ledger)!r}, total_epsilon=4.0, delta=1e-5)"
            )
        return BudgetLedger(ledger)
    raise TypeError(f"ledger must be None, a featuredp.accounting.BudgetLedger or the path of one, got {ledger!r}")


def _make_rng(secure_rng: bool, seed: int | None) -> np.random.Generator | ChaCha20Generator:
    if secure_rng:
        if seed is None:
            return ChaCha20Generator()  # 256-bit key from os.urandom
        key = hashlib.sha256(b"featuredp.aggregation:" + str(seed).encode()).digest()
        return ChaCha20Generator(key)
    return np.random.default_rng(seed)  # seed None: SeedSequence() from OS entropy


class VoteAggregator(Uncopyable):
    """Answer queries by a noisy argmax of members' votes, with data-independent accounting and a budget stop.

    Args:
        n_classes: the declared number of classes K (public: from the task's class list, never
            read from the votes).
        mechanism: ``"gnmax"`` (Gaussian noise, std ``sigma``) or ``"lnmax"`` (Laplace, scale ``scale``).
        sigma, scale: the noise of the argmax (σ₂ for Confident-GNMax).
        threshold, sigma_threshold: Confident-GNMax (``gnmax`` only): a query is answered only
            when max_j h_j + N(0, σ₁²) >= T; otherwise :meth:`answer` returns None. Both or neither.
        delta: the δ at which :attr:`epsilon` is reported and ``max_epsilon`` is enforced.
        max_epsilon: refuse (``BudgetExceededError``) a query that would take ε above this, before
            anything is computed for it. None: no limit of the aggregator's own.
        ledger: a :class:`featuredp.accounting.BudgetLedger` (or its path): every :meth:`answer`
            reserves one query's event before the query, every :meth:`answer_all` the batch's, and
            the ledger refuses what does not fit its total. Its ε is computed under the ledger's
            own relation: ``"replace-one"`` doubles the sensitivity (conservative for GNMax;
            LNMax's Laplace event is refused there by the PLD accountant).
        secure_rng: draw the noise from a ChaCha20 keystream (:class:`featuredp.noise.ChaCha20Generator`)
            instead of numpy's PCG64; both are seeded from OS entropy by default.
        seed: research only: makes the noise reproducible, warns (``PrivacyRiskWarning``) and is
            never stored or written anywhere (only ``seeded`` is).

    One aggregator, one process. It holds the noise key and counts the budget itself, so a copy
    would answer with the same noise under a budget of its own: pickling and ``copy``/``deepcopy``
    raise ``TypeError``, and in a process forked from the one that created it the aggregator
    re-keys its noise from OS entropy and refuses to answer (``BudgetExceededError``) unless it has
    a ``ledger``, which the processes then share (its file lock serialises the reservations).

    Attributes:
        queries_asked: queries charged so far (answered or not).
        queries_answered: queries that returned a label (all asked ones without a threshold).

    >>> agg = VoteAggregator(3, sigma=20.0, delta=1e-5, max_epsilon=1.0)
    >>> agg.answer([2] * 240 + [0] * 10)
    2
    >>> agg.queries_asked, round(agg.epsilon, 3), agg.max_queries
    (1, 0.234, 14)
    """

    _not_copied = _NOT_COPIED

    def __init__(
        self,
        n_classes: int,
        *,
        mechanism: str = "gnmax",
        sigma: float | None = None,
        scale: float | None = None,
        threshold: float | None = None,
        sigma_threshold: float | None = None,
        delta: float = 1e-5,
        max_epsilon: float | None = None,
        ledger: Any = None,
        secure_rng: bool = False,
        seed: int | None = None,
    ) -> None:
        self.n_classes = check_int("n_classes", n_classes, minimum=2)
        self.mechanism = check_choice("mechanism", mechanism, MECHANISMS)
        if (threshold is None) != (sigma_threshold is None):
            raise ValueError(f"Confident-GNMax needs both threshold and sigma_threshold (or neither); got "
                             f"threshold={threshold!r}, sigma_threshold={sigma_threshold!r}")  # fmt: skip
        if threshold is not None and self.mechanism != "gnmax":
            raise ValueError(f"threshold is a Confident-GNMax setting: it needs mechanism='gnmax', got "
                             f"mechanism={self.mechanism!r}")  # fmt: skip
        self.threshold = None if threshold is None else check_real("threshold", threshold)
        if self.threshold is not None and not math.isfinite(self.threshold):
            raise ValueError(f"threshold must be finite, got {threshold!r}")
        self._per_query = query_event(self.mechanism, sigma=sigma, scale=scale, sigma_threshold=sigma_threshold)
        self.sigma = None if sigma is None else float(sigma)
        self.scale = None if scale is None else float(scale)
        self.sigma_threshold = None if sigma_threshold is None else float(sigma_threshold)
        self.delta = check_open_unit("delta", delta)
        self.max_epsilon = None if max_epsilon is None else check_positive("max_epsilon", max_epsilon)
        self.ledger = _open_ledger(ledger)
        if not isinstance(secure_rng, bool):
            raise TypeError(f"secure_rng must be True or False, got {secure_rng!r}")
        self.secure_rng = secure_rng
        if seed is not None:
            seed = check_int("seed", seed, minimum=0)
            warn_private_seed("seed", seed)
        self.seeded = seed is not None  # whether, never the seed itself
        self._rng = _make_rng(secure_rng, seed)
        # the process this aggregator's budget belongs to, and the one its noise key was last drawn in
        self._pid = self._rng_pid = os.getpid()
        self.queries_asked = 0
        self.queries_answered = 0
        self._eps_cache: dict[int, float] = {0: 0.0}
        self._max_queries: int | None = None

    # ------------------------------------------------------------------ construction
    @classmethod
    def calibrate(
        cls,
        n_classes: int,
        *,
        epsilon: float,
        delta: float = 1e-5,
        queries: int,
        mechanism: str = "gnmax",
        threshold: float | None = None,
        sigma_threshold_ratio: float = DEFAULT_SIGMA_THRESHOLD_RATIO,
        **kwargs: Any,
    ) -> VoteAggregator:
        """An aggregator whose noise makes ``queries`` queries cost at most ``epsilon`` at ``delta``.

        GNMax: σ in closed form (:func:`calibrate_sigma`); with ``threshold`` (Confident-GNMax)
        σ₁ = ``sigma_threshold_ratio``·σ₂ and both are charged on every query. LNMax: the Laplace
        scale by PLD (:func:`calibrate_scale`). ``max_epsilon`` defaults to ``epsilon``, so query
        ``queries + 1`` is refused. Other keyword arguments go to the constructor (``ledger``,
        ``secure_rng``, ``seed``, ``max_epsilon``).

        >>> agg = VoteAggregator.calibrate(10, epsilon=2.0, delta=1e-5, queries=500)
        >>> round(agg.sigma, 1), agg.epsilon_after(500) <= 2.0 < agg.epsilon_after(501)
        (63.0, True)
        """
        mechanism = check_choice("mechanism", mechanism, MECHANISMS)
        kwargs.setdefault("max_epsilon", epsilon)
        if mechanism == "lnmax":
            if threshold is not None:
                raise ValueError("threshold is a Confident-GNMax setting: it needs mechanism='gnmax'")
            return cls(n_classes, mechanism="lnmax", scale=calibrate_scale(epsilon, delta, queries), delta=delta,
                       **kwargs)  # fmt: skip
        ratio = None if threshold is None else sigma_threshold_ratio
        sigma, sigma_threshold = calibrate_sigma(epsilon, delta, queries, sigma_threshold_ratio=ratio)
        return cls(n_classes, mechanism="gnmax", sigma=sigma, threshold=threshold, sigma_threshold=sigma_threshold,
                   delta=delta, **kwargs)  # fmt: skip

    # ------------------------------------------------------------------ accounting
    @property
    def query_event(self) -> DpEvent:
        """The event charged for every query asked."""
        return self._per_query

    def event(self) -> DpEvent:
        """The composed event of every query asked so far (``NoOpDpEvent`` before the first)."""
        return aggregation_event(self._per_query, self.queries_asked)

    def epsilon_after(self, queries: int) -> float:
        """ε at :attr:`delta` once ``queries`` queries in total have been asked (data-independent)."""
        q = check_int("queries", queries, minimum=0)
        if q not in self._eps_cache:
            self._eps_cache[q] = compute_epsilon(aggregation_event(self._per_query, q), self.delta)
        return self._eps_cache[q]

    @property
    def epsilon(self) -> float:
        """ε spent so far at :attr:`delta` (every asked query charged; PLD, closed form for Gaussians)."""
        return self.epsilon_after(self.queries_asked)

    @property
    def max_queries(self) -> int | None:
        """The most queries ``max_epsilon`` allows in total (None: no limit of the aggregator's own)."""
        if self.max_epsilon is None:
            return None
        if self._max_queries is None:
            limit = self.max_epsilon
            if self.epsilon_after(1) > limit:
                self._max_queries = 0
            else:
                lo, hi = 1, 2
                while hi < _MAX_QUERIES and self.epsilon_after(hi) <= limit:
                    lo, hi = hi, hi * 2
                if hi >= _MAX_QUERIES and self.epsilon_after(hi) <= limit:
                    lo = hi
                while hi - lo > 1:  # ε(lo) <= limit < ε(hi)
                    mid = (lo + hi) // 2
                    if self.epsilon_after(mid) <= limit:
                        lo = mid
                    else:
                        hi = mid
                self._max_queries = lo
        return self._max_queries

    @property
    def remaining_queries(self) -> int | None:
        """How many more queries ``max_epsilon`` allows (None: no limit of the aggregator's own)."""
        cap = self.max_queries
        return None if cap is None else max(0, cap - self.queries_asked)

    def describe(self) -> dict[str, Any]:
        """JSON-ready settings and spend (whether seeded, never the seed)."""
        return {
            "mechanism": "confident-gnmax" if self.threshold is not None else self.mechanism,
            "n_classes": self.n_classes,
            "sigma": self.sigma,
            "scale": self.scale,
            "threshold": self.threshold,
            "sigma_threshold": self.sigma_threshold,
            "delta": self.delta,
            "epsilon": self.epsilon,
            "max_epsilon": self.max_epsilon,
            "queries_asked": self.queries_asked,
            "queries_answered": self.queries_answered,
            "accounting": "data-independent: every asked query charged (answered or not), add-remove, PLD",
            "secure_rng": self.secure_rng,
            "seeded": self.seeded,
        }

    def __repr__(self) -> str:  # never the generator's state or a seed
        noise = f"sigma={self.sigma:.4g}" if self.sigma is not None else f"scale={self.scale:.4g}"
        thr = ("" if self.threshold is None
               else f", threshold={self.threshold:g}, sigma_threshold={self.sigma_threshold:.4g}")  # fmt: skip
        return (f"VoteAggregator(n_classes={self.n_classes}, mechanism={self.mechanism!r}, {noise}{thr}, "
                f"delta={self.delta:g}, queries_asked={self.queries_asked}, epsilon={self.epsilon:.4g})")  # fmt: skip

    # ------------------------------------------------------------------ answering
    def check_process(self) -> None:
        """Refuse (``BudgetExceededError``) to answer in a forked copy of this aggregator that has no ledger.

        A fork copies the key and the count of queries asked: every child would spend the whole
        budget again with the parent's noise. In a forked process the noise is re-keyed from OS
        entropy first; with a ledger the shared file then bounds the total and answering goes on.
        :meth:`answer` and :meth:`answer_all` call this before anything else is done for a query.
        """
        self._rekey_after_fork()
        pid = os.getpid()
        if pid != self._pid and self.ledger is None:
            raise BudgetExceededError(
                f"this VoteAggregator was created in process {self._pid} and is used in forked process {pid} "
                "without a ledger: each copy would spend the whole budget again; nothing was released. Give "
                "every process the same ledger=BudgetLedger(path, ...) to share one budget"
            )

    def _rekey_after_fork(self) -> None:
        # Fresh OS entropy in a forked child, even for a seeded aggregator: the parent's stream must never repeat.
        pid = os.getpid()
        if pid != self._rng_pid:
            self._rng = _make_rng(self.secure_rng, None)
            self._rng_pid = pid

    def _refuse(self, wanted: int) -> BudgetExceededError:
        after = self.epsilon_after(self.queries_asked + wanted)
        return BudgetExceededError(
            f"{wanted} more quer{'y' if wanted == 1 else 'ies'} would take epsilon from {self.epsilon:.4g} to "
            f"{after:.4g} (delta={self.delta:g}), above max_epsilon={self.max_epsilon:g} after "
            f"{self.queries_asked} queries; nothing was released for {'it' if wanted == 1 else 'them'}"
        )

    def _ledger_room(self, wanted: int) -> int:
        """The most of ``wanted`` queries the ledger's remaining budget takes (a search on projections)."""
        assert self.ledger is not None
        ledger = self.ledger

        def fits(k: int) -> bool:
            return ledger.projected(event=aggregation_event(self._per_query, k)) <= ledger.total_epsilon

        if fits(wanted):
            return wanted
        lo, hi = 0, wanted  # fits(lo), not fits(hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if fits(mid):
                lo = mid
            else:
                hi = mid
        return lo

    def _what(self, first: int, count: int) -> str:
        span = f"query {first + 1}" if count == 1 else f"queries {first + 1}-{first + count}"
        name = "confident-gnmax" if self.threshold is not None else self.mechanism
        return f"featuredp VoteAggregator[{name}] {span}"

    def _answer_rows(self, hist: np.ndarray) -> np.ndarray:
        """Noisy argmax of each row (−1 where the threshold test failed); the only place noise is drawn."""
        self._rekey_after_fork()
        n = hist.shape[0]
        answered = np.ones(n, dtype=bool)
        if self.threshold is not None:
            assert self.sigma_threshold is not None
            answered = hist.max(axis=1) + self.sigma_threshold * _normal(self._rng, (n,)) >= self.threshold
        noisy = self._noisy_counts(hist)
        return np.where(answered, np.argmax(noisy, axis=1), -1).astype(np.int64)

    def _noisy_counts(self, hist: np.ndarray) -> np.ndarray:
        """The noisy histogram the argmax reads (internal: never released, tests estimate its std)."""
        self._rekey_after_fork()
        if self.mechanism == "gnmax":
            assert self.sigma is not None
            return hist + self.sigma * _normal(self._rng, hist.shape)
        assert self.scale is not None
        return hist + self.scale * _laplace(self._rng, hist.shape)

    def answer(self, votes: Any) -> int | None:
        """Answer one query from the members' votes (shape ``(n_members,)``, class indices or −1 = abstain).

        Returns the noisy-argmax label, or None when Confident-GNMax's threshold test failed (the
        query is charged either way). Raises ``BudgetExceededError`` — before any noise is drawn or
        anything is released — when the query would take ε above ``max_epsilon`` or does not fit
        the ledger, or in a forked copy without a ledger (:meth:`check_process`).
        """
        self.check_process()
        hist = vote_histogram(votes, self.n_classes)
        if hist.ndim != 1:
            raise DataValidationError(f"answer takes one query's votes of shape (n_members,), got {np.shape(votes)}; "
                                      "use answer_all for several queries")  # fmt: skip
        if self.remaining_queries == 0:
            raise self._refuse(1)
        reservation = None
        if self.ledger is not None:
            reservation = self.ledger.reserve(self._what(self.queries_asked, 1), event=self._per_query)
        label = self._release(hist[None, :], reservation)[0]
        return None if label < 0 else int(label)

    def answer_all(self, votes_matrix: Any, *, stop_at_budget: bool = True) -> np.ndarray:
        """Answer many queries (votes of shape ``(n_queries, n_members)``) in order; labels or −1.

        −1 marks a query that was not answered (threshold test failed) or not asked (the budget
        ran out). With ``stop_at_budget`` (default) the queries that fit ``max_epsilon`` and the
        ledger are answered and the rest are not asked (check :attr:`queries_asked`); without it,
        ``BudgetExceededError`` is raised before any query of the batch when they do not all fit.
        The ledger gets one reservation for the whole batch, settled once it is answered.
        """
        self.check_process()
        hist = vote_histogram(votes_matrix, self.n_classes)
        if hist.ndim != 2:
            raise DataValidationError(f"answer_all takes votes of shape (n_queries, n_members), got "
                                      f"{np.shape(votes_matrix)}; use answer for one query")  # fmt: skip
        n = hist.shape[0]
        out = np.full(n, -1, dtype=np.int64)
        k = n
        room = self.remaining_queries
        if room is not None and room < k:
            if not stop_at_budget:
                raise self._refuse(k)
            k = room
        reservation = None
        if self.ledger is not None and k > 0:
            if stop_at_budget:
                k = self._ledger_room(k)
            if k > 0:
                # the ledger may still refuse (another process spent meanwhile): nothing is released then
                reservation = self.ledger.reserve(self._what(self.queries_asked, k),
                                                  event=aggregation_event(self._per_query, k))  # fmt: skip
        if k > 0:
            out[:k] = self._release(hist[:k], reservation)
        return out

    def _release(self, hist: np.ndarray, reservation: Any) -> np.ndarray:
        """Draw the noise for these rows and count them; the reservation (if any) settles at its amount."""
        if reservation is None:
            labels = self._answer_rows(hist)
        else:
            # settled at the reserved amount on exit, also on an exception (the votes may have met the noise)
            with reservation:
                labels = self._answer_rows(hist)
        self.queries_asked += len(hist)
        self.queries_answered += int(np.count_nonzero(labels >= 0))
        return labels
