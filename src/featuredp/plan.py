"""The privacy plan of a run, what Ψ discloses, and the guarantee sentence (no torch import).

* :class:`PrivacyPlan`: everything that determines a run's guarantee — public and
  loggable. Private runtime inputs (data, indices, RNG state, realised batch sizes)
  are passed at call time and never stored here (docs/engine.md).
* :class:`Disclosure`: what a public feature map Ψ reveals and hides; every feature
  map's ``describe()`` returns one, and the guarantee names what it ``hides``.
* :class:`TrainResult`: what ``Trainer.fit`` returns.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from featuredp.accounting import DpEvent, compute_epsilon, dpsgd_event, epsilon_for
from featuredp.accounting.bandmf import bandmf_terms
from featuredp.accounting.blt import blt_min_separation, blt_terms
from featuredp.methods import get_method

__all__ = ["Disclosure", "PrivacyPlan", "TrainResult", "inf_to_str", "str_to_inf"]


@dataclass(frozen=True)
class Disclosure:
    """What a public feature map Ψ reveals and what it hides, for the privacy report.

    ``reveals`` and ``hides`` are phrases ("the public columns ['age']", "the image detail
    the blur removes"); the run's guarantee reads "... protecting <hides>". ``details`` holds
    map-specific JSON-able facts (columns, blur σ, ...). An empty ``hides`` is an error: a
    map that hides nothing protects nothing.

    >>> d = Disclosure("Columns", reveals="the public columns ['age']", hides="the private columns ['sex']")
    >>> d.to_dict()["hides"]
    "the private columns ['sex']"
    """

    map: str
    reveals: str
    hides: str
    details: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("map", "reveals", "hides"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"Disclosure.{name} must be a non-empty phrase, got {value!r}")

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form for run.json: ``map``, ``reveals``, ``hides`` and the details."""
        return {**dict(self.details), "map": self.map, "reveals": self.reveals, "hides": self.hides}

    # Dict-style reads of the ``to_dict()`` form, kept because ``describe()`` returned a plain dict before
    # this type existed and callers still read it so (``describe()["private_statistics_from_data"]``,
    # ``result.privacy_report["feature_map"]["hides"]``). New code reads the attributes.
    def __getitem__(self, key: str) -> Any:
        """``to_dict()[key]`` (the dict-style read of ``describe()`` callers written before this type).

        >>> Disclosure("LabelPrivate", reveals="all features", hides="the label")["hides"]
        'the label'
        """
        return self.to_dict()[key]

    def get(self, key: str, default: Any = None) -> Any:
        """``to_dict().get(key, default)``."""
        return self.to_dict().get(key, default)

    def __contains__(self, key: object) -> bool:
        """Whether ``key`` is in ``to_dict()``."""
        return key in self.to_dict()


def inf_to_str(v: float | None) -> float | str | None:
    """∞ as the string "inf" (JSON has no infinity); other values unchanged.

    >>> inf_to_str(math.inf), inf_to_str(1.5), str_to_inf("inf")
    ('inf', 1.5, inf)
    """
    return "inf" if isinstance(v, float) and math.isinf(v) else v


def str_to_inf(v: Any) -> Any:
    """Inverse of :func:`inf_to_str`."""
    return math.inf if v == "inf" else v


@dataclass(frozen=True)
class PrivacyPlan:
    """Everything that determines the privacy guarantee of a run — public and loggable.

    Holds no private runtime input: no data, indices, RNG state or realised batch
    size. ``steps`` is the planned number of main-phase steps (private steps for
    private methods); ``budget_steps`` the most private steps the budget allows
    (training stops there). ``noise_multiplier`` and ``max_grad_norm`` are None
    for methods that add no noise. Everything method-specific is read from the
    method's record (:func:`featuredp.methods.get_method`). ``alpha`` and
    ``public_weight`` (w) are Algorithm 1's (1.0 for the other methods);
    ``pretrain_batch_size`` is the batch of public pre-training (None: no
    pre-training, or a plan written before the field existed, which pre-trained
    on ``public_batch_size``). ``noise`` is ``"independent"`` (DP-SGD's noise) or
    ``"bandmf"``: correlated noise with ``bands`` bands, the strategy's Toeplitz
    coefficients ``noise_coeffs`` (public: a function of T, b and the workload)
    and cyclic Poisson sampling, accounted by :func:`featuredp.bandmf.bandmf_event`
    (:meth:`event`), or ``"blt"``: buffered-linear-Toeplitz correlated noise whose
    ``noise_coeffs`` are (θ_1..θ_d, ω_1..ω_d), the buffer decays and output scales
    of C, sampled cyclically over ⌊n/m⌋ partitions and accounted as one Gaussian
    (:func:`featuredp.blt.blt_event`); ``noise_multiplier`` is then σ, the std of z
    in units of C.
    Fields added later default to their old meaning, so older plan dicts still load.

    >>> plan = PrivacyPlan("fdp", dataset_size=1000, expected_batch_size=100, sampling_rate=0.1, steps=10,
    ...                    noise_multiplier=2.0, max_grad_norm=1.0, delta=1e-5)
    >>> plan.is_private, 0 < plan.epsilon() < plan.epsilon(20)
    (True, True)
    >>> PrivacyPlan.from_dict(plan.to_dict()) == plan
    True
    """

    method: str
    dataset_size: int
    expected_batch_size: float
    sampling_rate: float
    steps: int
    pretrain_steps: int = 0
    public_batch_size: int | None = None
    pretrain_batch_size: int | None = None
    noise_multiplier: float | None = None
    max_grad_norm: float | None = None
    alpha: float = 1.0
    public_weight: float = 1.0
    delta: float | None = None
    target_epsilon: float | None = None
    budget_steps: int | None = None
    relation: str = "add-remove"
    accountant: str = "pld"
    noise: str = "independent"
    bands: int | None = None
    noise_coeffs: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if self.noise_coeffs is not None:  # a JSON list from run.json or a checkpoint: compare as a tuple
            object.__setattr__(self, "noise_coeffs", tuple(float(c) for c in self.noise_coeffs))

    @property
    def pretrain_batch(self) -> int:
        """The batch size of public pre-training: ``pretrain_batch_size``, else m' (``public_batch_size``), else m.

        >>> PrivacyPlan("fdp", dataset_size=10, expected_batch_size=4, sampling_rate=0.4, steps=5,
        ...             pretrain_steps=2, public_batch_size=3).pretrain_batch
        3
        """
        return self.pretrain_batch_size or self.public_batch_size or max(1, round(self.expected_batch_size))

    @property
    def is_private(self) -> bool:
        """Whether the method's steps are a (σ, p, T) privacy event (its record's ``private``)."""
        return get_method(self.method).private

    def epsilon(self, steps: int | None = None) -> float:
        """ε(δ) after ``steps`` private steps (default: the planned ``steps``).

        0 for a method whose steps read only Ψ(S) (``public``: (0, 0)-FDP) and for 0 steps;
        ∞ for a non-private method (``nonprivate``) or σ = 0.
        """
        method = get_method(self.method)
        if method.public_steps:
            return 0.0
        if not method.private:
            return math.inf
        t = self.steps if steps is None else int(steps)
        if t <= 0:
            return 0.0
        if not self.noise_multiplier:
            return math.inf
        if self.delta is None:
            raise ValueError(f"the plan of private method {self.method!r} needs delta to state ε(δ)")
        if self.noise != "independent":
            return compute_epsilon(self.event(t), self.delta, relation=self.relation, accountant=self.accountant)
        return epsilon_for(
            self.noise_multiplier, self.sampling_rate, t, self.delta,
            relation=self.relation, accountant=self.accountant,
        )  # fmt: skip

    def replacement_epsilon(self, steps: int | None = None) -> float:
        """ε(δ) for the replace-one question after ``steps`` private steps: telling two values of one record's
        private part apart (Ψ(x) fixed; for a whole-record method, two whole records).

        The default accounting (``relation="add-remove"``, the paper's Definition 6) bounds something else: the
        model is indistinguishable from one trained on only the public view Ψ(x) of the record. Swapping the
        private part moves the clipped sum by up to 2C, so the replace-one ε is larger (up to f∘f, Prop. 1): the
        same event as :meth:`epsilon` (:meth:`event`, one source of σ, q and T) accounted at REPLACE_ONE
        (Poisson-subsampled Gaussians: dp-accounting's PLD; BandMF: its amplified DP-SGD event; BLT: one
        Gaussian at sensitivity 2Δ). The RDP backend has no replace-one bound under Poisson sampling: a plan on
        ``accountant="rdp"`` then gets the PLD number. A plan whose ``relation`` is already ``"replace-one"``
        returns :meth:`epsilon`.

        >>> plan = PrivacyPlan("fdp", 100000, 1000, 0.01, 1000, noise_multiplier=1.0, max_grad_norm=1.0, delta=1e-5)
        >>> round(plan.epsilon(), 2), round(plan.replacement_epsilon(), 2)
        (1.83, 2.84)
        """
        if self.relation == "replace-one":
            return self.epsilon(steps)
        method = get_method(self.method)
        t = self.steps if steps is None else int(steps)
        if method.public_steps or (method.private and t <= 0):
            return 0.0
        if not method.private or not self.noise_multiplier:
            return math.inf
        if self.delta is None:
            raise ValueError(f"the plan of private method {self.method!r} needs delta to state ε(δ)")
        event = self.event(t)
        try:
            return compute_epsilon(event, self.delta, relation="replace-one", accountant=self.accountant)
        except ValueError:  # RDP refuses replace-one under Poisson sampling: PLD has it
            return compute_epsilon(event, self.delta, relation="replace-one", accountant="pld")

    def event(self, steps: int, *, segment: bool = False) -> DpEvent:
        """The dp_accounting event of ``steps`` private steps of this plan (σ > 0; a private method).

        Independent noise: DP-SGD's ``dpsgd_event(σ, p, steps)``. BandMF: :func:`featuredp.bandmf.bandmf_event`
        (DP-SGD at rate m·b/n, multiplier σ / max column norm of C, ⌈steps/b⌉ rounds). ``segment=True``: the
        event of ``steps`` steps that need not start at the run's first step (a resumed run's part, for the
        ledger); BandMF then takes the column norm of all of C, since a later segment's steps see every band.
        Composing the segments' events never gives less than the whole run's (⌈t₁/b⌉ + ⌈t₂/b⌉ >= ⌈T/b⌉ rounds
        at the largest column norm); for independent noise they compose to it exactly. BLT: one Gaussian with the
        min-sep sensitivity Δ of ``steps`` steps (:func:`featuredp.blt.blt_event`); a segment takes Δ of the
        planned run (its rows see every earlier column, and ‖C v‖² splits over the segments' rows, so the
        segments' Gaussians compose to at least the whole run's).
        """
        counted = int(steps)
        if segment and self.noise == "bandmf":
            counted = max(counted, len(self.noise_coeffs or ()))
        elif segment and self.noise == "blt":
            counted = max(counted, self.steps)
        return dpsgd_event(*self.dpsgd_terms(counted))

    def dpsgd_terms(self, steps: int) -> tuple[float, float, int]:
        """(σ, q, T) of the Poisson-subsampled Gaussian mechanism that ``steps`` private steps are accounted as:
        the plan's own for independent noise; for BandMF σ / max column norm of C, rate m·b/n and ⌈steps/b⌉
        rounds; for BLT σ / Δ, rate 1 and one release (:meth:`event`). What an audit's bound or a simulated attack
        must use, not the raw σ and p.

        >>> PrivacyPlan("dpsgd", 1000, 10, 0.01, 50, noise_multiplier=1.0, max_grad_norm=1.0).dpsgd_terms(50)
        (1.0, 0.01, 50)
        """
        if not self.noise_multiplier:
            raise ValueError(f"a plan with noise_multiplier={self.noise_multiplier!r} has no privacy event")
        m, n, t = self.expected_batch_size, self.dataset_size, max(1, int(steps))
        if self.noise == "blt":
            if self.noise_coeffs is None:
                raise ValueError("a plan with noise='blt' needs noise_coeffs")
            return blt_terms(self.noise_multiplier, self.noise_coeffs, m, n, t)
        if self.noise == "bandmf":
            if self.bands is None or self.noise_coeffs is None:
                raise ValueError("a plan with noise='bandmf' needs bands and noise_coeffs")
            return bandmf_terms(self.noise_multiplier, m, n, t, self.bands, self.noise_coeffs)
        return float(self.noise_multiplier), float(self.sampling_rate), int(steps)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict (∞ written as the string "inf")."""
        return {k: inf_to_str(v) for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PrivacyPlan:
        """Inverse of :meth:`to_dict`."""
        return cls(**{k: str_to_inf(v) for k, v in data.items()})

    def guarantee(
        self,
        epsilon: float,
        feature_map: Disclosure | dict[str, Any] | None = None,
        *,
        delta: float | None = None,
        replacement_epsilon: float | None = None,
    ) -> str:
        """One sentence stating the guarantee of a run that spent ``epsilon`` (``{T}`` = its private steps).

        ``feature_map`` is what Ψ discloses (:class:`Disclosure`, or its dict form from a run.json);
        its ``hides`` names what the guarantee protects. ``delta``: the δ to state (default: the plan's); the
        engine states the plan's δ plus what its noise sampler's cut tail adds
        (:func:`featuredp.accounting.sampler_tail_delta`). The sentence says in words which question each ε
        answers: add/remove (the model is indistinguishable from one trained on only the public view of any one
        record) and replace-one (telling two values of one record's private part apart), with
        ``replacement_epsilon`` (:meth:`replacement_epsilon` of the same steps) as the second number.

        >>> fdp = PrivacyPlan("fdp", dataset_size=10, expected_batch_size=2, sampling_rate=0.2, steps=5,
        ...                   noise_multiplier=1.0, max_grad_norm=1.0, delta=1e-5)
        >>> fdp.guarantee(1.5, {"hides": "the label"}, replacement_epsilon=2.5).split("; ", 1)[1]
        "ε = 1.5 (add/remove: the model is indistinguishable from one trained on only the public view of any \
one record); telling two values of one record's private part apart: ε = 2.5 (replace-one)"

        >>> blur = Disclosure("GaussianBlur", reveals="the blurred image", hides="the fine detail")
        >>> plan = PrivacyPlan("public", dataset_size=10, expected_batch_size=2, sampling_rate=0.2, steps=5)
        >>> plan.guarantee(0.0, blur)
        '(0, 0)-FDP protecting the fine detail: training read only the public view Ψ(S)'
        >>> plan = PrivacyPlan("fdp", dataset_size=10, expected_batch_size=2, sampling_rate=0.2, steps=5,
        ...                    noise_multiplier=1.0, max_grad_norm=1.0, delta=1e-5)
        >>> plan.guarantee(1.5, blur.to_dict()).split(" (")[0]
        '(1.5, 1e-05)-FDP protecting the fine detail: Algorithm 1'
        """
        hides = feature_map.hides if isinstance(feature_map, Disclosure) else (feature_map or {}).get("hides")
        delta = self.delta if delta is None else delta
        what = f" protecting {hides}" if hides else ""
        rel = "add/remove" if self.relation == "add-remove" else "replace-one"
        method = get_method(self.method)
        if method.public_steps:
            return f"(0, 0)-FDP{what}: training read only the public view Ψ(S)"
        if not method.private:
            return "no privacy guarantee (non-private training)"
        if self.noise == "bandmf":
            acc = (
                f"noise bandmf: banded matrix-factorization correlated noise with {self.bands} bands, noise std "
                f"{self.noise_multiplier:.4g}·C, cyclic Poisson sampling over {self.bands} partitions, {{T}} private "
                f"steps, amplified BandMF accounting (Choquette-Choo et al. 2023, Thm 4), {self.accountant.upper()} "
                f"accountant, {rel} neighbours"
            )
        elif self.noise == "blt":
            d = len(self.noise_coeffs or ()) // 2
            acc = (
                f"noise blt: buffered linear Toeplitz correlated noise with {d} buffers, noise std "
                f"{self.noise_multiplier:.4g}·C, cyclic sampling over epochs of "
                f"{blt_min_separation(self.dataset_size, self.expected_batch_size)} steps, {{T}} private steps, one "
                f"Gaussian release at the min-sep sensitivity (no amplification), {self.accountant.upper()} "
                f"accountant, {rel} neighbours"
            )
        else:
            acc = (
                f"Poisson-subsampled Gaussian, noise multiplier {self.noise_multiplier:.4g}, sampling rate "
                f"{self.sampling_rate:.4g}, {{T}} private steps, {self.accountant.upper()} accountant, {rel} "
                "neighbours"
            )
        questions = self._questions(epsilon, replacement_epsilon, whole=not method.needs_feature_map)
        if not method.needs_feature_map:
            return f"({epsilon:.4g}, {delta:g})-DP for whole records, hence the same FDP for any Ψ ({acc}); {questions}"
        pre = " after public pre-training on Ψ(S) (no cost)" if self.pretrain_steps else ""
        kind = "Algorithm 1 (Thm 5)" if method.public_batch else "DP-SGD fine-tuning"
        return f"({epsilon:.4g}, {delta:g})-FDP{what}: {kind}{pre} ({acc}); {questions}"

    def _questions(self, epsilon: float, replacement: float | None, *, whole: bool) -> str:
        """The guarantee's clause naming the question each ε answers (add/remove and replace-one)."""
        part = "one record" if whole else "one record's private part"
        simulated = "without any one record" if whole else "on only the public view of any one record"
        swap = f"telling two values of {part} apart"
        if self.relation == "replace-one":
            return (f"ε = {epsilon:.4g} (replace-one: {swap}; it also bounds add/remove, the model being "
                    f"indistinguishable from one trained {simulated})")
        number = "see replacement_epsilon" if replacement is None else f"ε = {replacement:.4g}"
        return (f"ε = {epsilon:.4g} (add/remove: the model is indistinguishable from one trained {simulated}); "
                f"{swap}: {number} (replace-one)")


@dataclass
class TrainResult:
    """What :meth:`Trainer.fit` returns. ``epsilon`` is ε(δ) for the private steps actually run.

    ``delta`` is the δ of the guarantee: the plan's δ plus what the noise sampler's cut tail adds (reported
    in ``privacy_report["noise_sampler"]``; :func:`featuredp.accounting.sampler_tail_delta`).
    ``replacement_epsilon`` answers the replace-one question (telling two values of one record's private part
    apart) for the same steps: :meth:`PrivacyPlan.replacement_epsilon` (None: a result built without it).
    """

    method: str
    plan: PrivacyPlan
    epsilon: float
    delta: float | None
    steps: int
    pretrain_steps: int
    stopped_early: bool
    stop_reason: str | None
    guarantee: str
    privacy_report: dict[str, Any]
    history: list[dict[str, float]] = field(default_factory=list)
    replacement_epsilon: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-able summary (∞ as "inf")."""
        return {
            "method": self.method,
            "epsilon": inf_to_str(float(self.epsilon)),
            "replacement_epsilon": None if self.replacement_epsilon is None else inf_to_str(
                float(self.replacement_epsilon)
            ),
            "delta": self.delta,
            "steps": self.steps,
            "pretrain_steps": self.pretrain_steps,
            "stopped_early": self.stopped_early,
            "stop_reason": self.stop_reason,
            "guarantee": self.guarantee,
            "plan": self.plan.to_dict(),
            "privacy_report": _jsonable(self.privacy_report),
            "history": self.history,
        }


def _jsonable(obj: Any) -> Any:
    """``obj`` with every :class:`Disclosure` in it replaced by its dict form."""
    if isinstance(obj, Disclosure):
        return obj.to_dict()
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    return obj
