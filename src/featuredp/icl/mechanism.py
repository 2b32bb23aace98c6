"""DP in-context classification (DP-ICL; Wu, Panda, Wang, Mittal, ICLR 2024): disjoint prompts vote, noisy argmax.

The private data is a set of n *demonstrations* ``(x, label)``. :class:`DPICLClassifier`

1. draws, with secret randomness, M disjoint prompts of N demonstrations each (M·N <= n; a
   uniformly random subset of M·N demonstrations split into M groups) — once, at :meth:`~DPICLClassifier.fit`;
2. for each query, lets every prompt's predictor (an LLM or an offline stand-in,
   :mod:`featuredp.icl.predictors`) vote for a label;
3. releases only the noisy argmax of the vote histogram, through
   :class:`featuredp.aggregation.VoteAggregator` (GNMax by default), which charges every query and
   refuses — before anything is released — a query that would take ε above the budget.

Guarantee: demonstration-level (ε, δ)-DP for everything released (the labels). One demonstration
sits in at most one prompt, so adding, removing or replacing it changes at most one vote
(add/remove: couple the random subsets so that the neighbour's subset differs in one slot). The
queries, the predictor (model weights, template, label words) and the class list are public. The
accounting is the aggregator's: data-independent, every query charged, GNMax at sensitivity √2,
composed over the queries (no amplification by subsampling is claimed, even when M·N < n).

``epsilon=math.inf`` is the non-private ensemble: a plain majority vote (ties broken at random)
that reports ε = ∞. ``prompts=1`` with ``epsilon=inf`` is ordinary (non-private) N-shot ICL.

>>> import numpy as np
>>> from featuredp.icl.predictors import KNNPredictor
>>> X = np.r_[np.zeros((40, 2)), np.ones((40, 2))]; y = np.r_[np.zeros(40, int), np.ones(40, int)]
>>> clf = DPICLClassifier(KNNPredictor(2), shots=2, epsilon=8.0, queries=2).fit(list(zip(X, y)))
>>> clf.prompts, clf.predict([[0.1, 0.0], [0.9, 1.0]]).tolist(), clf.queries_answered
(40, [0, 1], 2)
>>> clf.predict([[0.0, 0.0]]).tolist(), clf.epsilon <= 8.0   # the budget covers 2 queries: the third is refused
([-1], True)
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from featuredp._keys import Uncopyable
from featuredp._validate import check_choice, check_int, check_open_unit, check_positive
from featuredp.accounting import DpEvent
from featuredp.aggregation import MECHANISMS, VoteAggregator, vote_histogram
from featuredp.errors import BudgetExceededError, PrivacyLeakWarning, PrivacyRiskWarning
from featuredp.icl.predictors import Demonstration, Predictor, check_labels, predict_many
from featuredp.sampling import warn_private_seed

__all__ = ["DPICLClassifier", "partition_demonstrations"]

_NOT_COPIED = (
    "DPICLClassifier holds the secret partition, a noise key and a query budget; a copy would answer with the same "
    "noise under the same budget: share one featuredp.accounting.BudgetLedger(path, ...) between processes instead"
)


def partition_demonstrations(n: int, prompts: int, shots: int, rng: np.random.Generator) -> np.ndarray:
    """``prompts`` disjoint groups of ``shots`` indices out of ``range(n)``: a uniformly random subset, split.

    Returns an int64 array of shape ``(prompts, shots)``; no index appears twice. ``rng`` must be
    secret (it decides which demonstrations are used where).

    >>> p = partition_demonstrations(10, 3, 3, np.random.default_rng(0))
    >>> p.shape, len(set(p.ravel().tolist()))
    ((3, 3), 9)
    """
    n = check_int("n", n, minimum=1)
    m = check_int("prompts", prompts, minimum=1)
    k = check_int("shots", shots, minimum=1)
    if m * k > n:
        raise ValueError(f"prompts × shots = {m} × {k} = {m * k} must be <= the number of demonstrations, {n}")
    return rng.permutation(n)[: m * k].reshape(m, k).astype(np.int64)


class DPICLClassifier(Uncopyable):
    """Differentially private in-context classification by disjoint prompts and a noisy vote.

    Args:
        predictor: the public in-context learner each prompt runs (:class:`~featuredp.icl.predictors.Predictor`);
            its ``n_classes`` is the declared class count.
        shots: N, demonstrations per prompt.
        prompts: M, the number of disjoint prompts (voters). Default: as many as fit, ⌊n/N⌋ — which
            reads n, treated as public as in standard DP accounting; give it to depend on nothing.
        epsilon: the budget for all queries together (> 0); ``math.inf``: no noise, plain majority vote.
        delta: δ of the budget (0 < δ < 1; use δ << 1/n).
        queries: how many queries the budget pays for: the noise is calibrated so that this many
            queries cost at most ``epsilon``, and the next one is refused. Required for finite ε;
            with ε = ∞ an optional cap.
        mechanism: ``"gnmax"`` (Gaussian noisy argmax, default) or ``"lnmax"`` (Laplace).
        threshold: Confident-GNMax: answer only queries whose noisy top vote count reaches it (the
            rest return −1 and are still charged).
        ledger: a :class:`featuredp.accounting.BudgetLedger` (or its path): every batch of queries is
            reserved in it before it is answered.
        secure_rng: draw the vote noise from ChaCha20 (:class:`featuredp.noise.ChaCha20Generator`).
        seed: research only: makes the partition and the noise reproducible; warns
            (``PrivacyRiskWarning``) and is never stored (only ``seeded`` is). Default: OS entropy.

    After :meth:`fit`, ``partition_`` (shape (M, N), indices into the demonstrations) is the secret
    assignment of demonstrations to prompts: for tests and audits, never to be released.

    One classifier, one process: it holds the secret partition, the noise key and the budget, so
    pickling and ``copy``/``deepcopy`` raise ``TypeError``. In a process forked from the one that
    created it, its random streams are re-keyed from OS entropy and a private classifier refuses
    to answer (``BudgetExceededError``, before any vote is computed) unless it has a ``ledger``,
    which then bounds the spend of all the processes together.
    """

    _not_copied = _NOT_COPIED

    def __init__(
        self,
        predictor: Predictor,
        *,
        shots: int,
        prompts: int | None = None,
        epsilon: float,
        delta: float = 1e-5,
        queries: int | None = None,
        mechanism: str = "gnmax",
        threshold: float | None = None,
        ledger: Any = None,
        secure_rng: bool = False,
        seed: int | None = None,
    ) -> None:
        if not isinstance(predictor, Predictor):
            raise TypeError(f"predictor must implement featuredp.icl.Predictor (n_classes, predict, scores), got "
                            f"{predictor!r}")  # fmt: skip
        self.predictor = predictor
        self.n_classes = check_int("predictor.n_classes", predictor.n_classes, minimum=2)
        self.shots = check_int("shots", shots, minimum=1)
        self._prompts = None if prompts is None else check_int("prompts", prompts, minimum=1)
        self.epsilon_budget = check_positive("epsilon", epsilon, allow_inf=True)
        self.delta = check_open_unit("delta", delta)
        self.mechanism = check_choice("mechanism", mechanism, MECHANISMS)
        self.private = math.isfinite(self.epsilon_budget)
        if queries is None and self.private:
            raise ValueError(f"queries is required with a finite epsilon={epsilon!r}: the noise is calibrated so "
                             "that this many queries cost at most epsilon")  # fmt: skip
        self.max_queries = None if queries is None else check_int("queries", queries, minimum=1)
        if seed is not None:
            seed = check_int("seed", seed, minimum=0)
            warn_private_seed("seed", seed)
        self.seeded = seed is not None  # whether, never the seed
        # Independent secret streams: the partition, the tie-breaks of the noiseless vote, the aggregator's noise.
        part, ties, noise = np.random.SeedSequence(seed).spawn(3)  # seed None: 128 bits of OS entropy
        self._partition_rng = np.random.default_rng(part)
        self._tie_rng = np.random.default_rng(ties)
        self._rng_pid = os.getpid()  # the process the streams above were drawn for
        self.aggregator: VoteAggregator | None = None
        self._asked = 0
        self._answered = 0
        if self.private:
            assert self.max_queries is not None
            agg_seed = None if seed is None else int(noise.generate_state(1, np.uint64)[0] >> np.uint64(1))
            with warnings.catch_warnings():
                # the user's seed was warned about above; the derived one would only repeat it
                warnings.filterwarnings("ignore", message=r"seed=\d+ makes the private randomness",
                                        category=PrivacyRiskWarning)  # fmt: skip
                self.aggregator = VoteAggregator.calibrate(
                    self.n_classes, epsilon=self.epsilon_budget, delta=self.delta, queries=self.max_queries,
                    mechanism=self.mechanism, threshold=threshold, ledger=ledger, secure_rng=secure_rng,
                    seed=agg_seed,
                )
        elif threshold is not None or ledger is not None:
            raise ValueError("threshold and ledger need a finite epsilon (with epsilon=inf nothing is private to "
                             "threshold or record)")  # fmt: skip
        self.partition_: np.ndarray | None = None
        self._demos: list[Demonstration] = []

    def _check_process(self) -> None:
        """Re-key the streams in a forked process; refuse there (no vote computed) without a shared ledger."""
        pid = os.getpid()
        if pid != self._rng_pid:
            # a forked child must neither repeat the parent's partition draw nor its tie-breaks
            self._partition_rng = np.random.default_rng()
            self._tie_rng = np.random.default_rng()
            self._rng_pid = pid
        if self.aggregator is not None:
            self.aggregator.check_process()

    # ------------------------------------------------------------------ the private data
    def fit(self, demonstrations: Sequence[Demonstration]) -> DPICLClassifier:
        """Take the private demonstrations and draw the prompts (secretly). Once per classifier.

        Each fit would be a new mechanism on the same data with its own budget, so a second call is
        refused: make a new classifier and compose the two spends (a ledger does it).
        """
        if self.partition_ is not None:
            raise ValueError("fit was already called: a DPICLClassifier answers from one partition and one budget; "
                             "create a new one for new demonstrations (and record both spends in a ledger)")
        self._check_process()
        demos = list(demonstrations)
        n = len(demos)
        if n == 0:
            raise ValueError("demonstrations must not be empty")
        if any(not (isinstance(d, tuple) and len(d) == 2) for d in demos):
            raise TypeError("demonstrations must be (input, label) pairs")
        labels = check_labels("demonstration labels", [label for _, label in demos], self.n_classes)
        prompts = self._prompts if self._prompts is not None else n // self.shots
        if self._prompts is None:
            # M = n // N is released (with every answer's noise scale) and tells the size of the private set.
            warnings.warn(
                f"prompts was not given: M = {prompts} was derived from the number of private demonstrations "
                f"(n // shots); it is published with the results and reveals n to within {self.shots}. Pass "
                "prompts= (a public choice) to keep n private",
                PrivacyLeakWarning,
                stacklevel=2,
            )
        if prompts < 1:
            raise ValueError(f"shots={self.shots} is more than the {n} demonstrations")
        self.partition_ = partition_demonstrations(n, prompts, self.shots, self._partition_rng)
        self._demos = [(x, int(y)) for (x, _), y in zip(demos, labels)]
        self.n_demonstrations = n
        return self

    @property
    def prompts(self) -> int:
        """M, the number of prompts (known after :meth:`fit` when it was not given)."""
        if self.partition_ is None:
            if self._prompts is None:
                raise ValueError("prompts is known after fit (it defaults to n // shots)")
            return self._prompts
        return int(self.partition_.shape[0])

    def prompt(self, i: int) -> list[Demonstration]:
        """The demonstrations of prompt ``i`` (private: for tests and audits only)."""
        self._check_fitted()
        assert self.partition_ is not None
        return [self._demos[j] for j in self.partition_[check_int("i", i, minimum=0)]]

    def _check_fitted(self) -> None:
        if self.partition_ is None:
            raise ValueError("call fit(demonstrations) first")

    def _votes(self, queries: Sequence[Any]) -> np.ndarray:
        """Every prompt's label for every query, shape (n_queries, M): private, never released."""
        assert self.partition_ is not None
        votes = np.empty((len(queries), self.partition_.shape[0]), dtype=np.int64)
        for m in range(self.partition_.shape[0]):
            votes[:, m] = predict_many(self.predictor, [self._demos[j] for j in self.partition_[m]], queries)
        return votes

    # ------------------------------------------------------------------ answering
    @property
    def remaining_queries(self) -> int | None:
        """Queries the budget still pays for (None: no cap)."""
        if self.aggregator is not None:
            return self.aggregator.remaining_queries
        return None if self.max_queries is None else max(0, self.max_queries - self._asked)

    def predict(self, queries: Sequence[Any], *, stop_at_budget: bool = True) -> np.ndarray:
        """Labels for ``queries`` in order, int64; −1 for a query not answered.

        With ``stop_at_budget`` (default) the queries the budget pays for are answered and the rest
        get −1 without being asked (nothing is computed for them). Without it, a batch that does not
        fit raises ``BudgetExceededError`` before any vote is computed or released.
        """
        self._check_fitted()
        self._check_process()
        q = len(queries)
        out = np.full(q, -1, dtype=np.int64)
        room = self.remaining_queries
        k = q if room is None else min(q, room)
        if k < q and not stop_at_budget:
            raise BudgetExceededError(
                f"{q} queries do not fit the budget (epsilon={self.epsilon_budget:g}, delta={self.delta:g}): "
                f"{room} of the {self.max_queries} it pays for remain; nothing was computed or released"
            )
        if k == 0:
            return out
        votes = self._votes(queries[:k])
        if self.aggregator is not None:
            out[:k] = self.aggregator.answer_all(votes, stop_at_budget=stop_at_budget)
        else:
            hist = vote_histogram(votes, self.n_classes)
            # counts are integers: a uniform jitter in [0, 0.5) breaks ties at random and nothing else
            out[:k] = np.argmax(hist + 0.5 * self._tie_rng.random(hist.shape), axis=1)
            self._asked += k
            self._answered += k
        return out

    def predict_one(self, query: Any) -> int | None:
        """The label for one query; None if Confident-GNMax declined it. ``BudgetExceededError`` once spent."""
        self._check_fitted()
        if self.remaining_queries == 0:
            raise BudgetExceededError(
                f"the budget (epsilon={self.epsilon_budget:g}, delta={self.delta:g}) paid for {self.max_queries} "
                "queries and all were asked; nothing was computed or released for this one"
            )
        label = int(self.predict([query], stop_at_budget=False)[0])
        return None if label < 0 else label

    # ------------------------------------------------------------------ accounting
    @property
    def queries_asked(self) -> int:
        """Queries charged so far."""
        return self.aggregator.queries_asked if self.aggregator is not None else self._asked

    @property
    def queries_answered(self) -> int:
        """Queries that returned a label."""
        return self.aggregator.queries_answered if self.aggregator is not None else self._answered

    @property
    def epsilon(self) -> float:
        """ε spent so far: the aggregator's composition of the queries asked (∞ once the noiseless vote answered)."""
        if self.aggregator is not None:
            return float(self.aggregator.epsilon)
        return math.inf if self._asked else 0.0

    @property
    def sigma(self) -> float | None:
        """The GNMax noise std in votes (None for LNMax and for ε = ∞)."""
        return None if self.aggregator is None else self.aggregator.sigma

    def event(self) -> DpEvent | None:
        """The composed privacy event of the queries asked (None for ε = ∞: nothing bounds it)."""
        return None if self.aggregator is None else self.aggregator.event()

    def describe(self) -> dict[str, Any]:
        """JSON-ready settings and spend; ε = ∞ is the string "inf". No seed, partition or vote is included."""
        info: dict[str, Any] = {
            "epsilon": "inf" if math.isinf(self.epsilon) else self.epsilon,
            "epsilon_budget": "inf" if math.isinf(self.epsilon_budget) else self.epsilon_budget,
            "delta": self.delta,
            "prompts": None if self.partition_ is None and self._prompts is None else self.prompts,
            "shots": self.shots,
            "n_classes": self.n_classes,
            "queries_budgeted": self.max_queries,
            "queries_asked": self.queries_asked,
            "queries_answered": self.queries_answered,
            "mechanism": "majority" if self.aggregator is None else self.aggregator.describe()["mechanism"],
            "sigma": self.sigma,
            "scale": None if self.aggregator is None else self.aggregator.scale,
            "seeded": self.seeded,
        }
        return info

    def __repr__(self) -> str:  # no partition, no seed
        m = "?" if self.partition_ is None and self._prompts is None else self.prompts
        return (f"DPICLClassifier({self.predictor!r}, prompts={m}, shots={self.shots}, "
                f"epsilon={self.epsilon_budget:g}, delta={self.delta:g}, queries={self.max_queries})")  # fmt: skip
