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
from dataclasses import dataclass, field, fields, replace
from typing import Any

from featuredp.accounting import DpEvent, compute_epsilon
from featuredp.accounting import record_epsilon as _record_epsilon
from featuredp.accounting import record_event as _record_event
from featuredp.methods import get_method
from featuredp.noise.independent import Independent
from featuredp.noise.plans import NoisePlan, noise_plan, noise_plan_from_dict

#: The privacy units: a record, or a user (every record of one person, ``user_key=``).
UNITS = ("record", "user")

__all__ = ["UNITS", "Disclosure", "PrivacyPlan", "TrainResult", "inf_to_str", "str_to_inf"]


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
    on ``public_batch_size``). ``noise`` is the planned noise plan
    (:class:`featuredp.noise.NoisePlan`): :class:`~featuredp.noise.Independent` (DP-SGD's
    noise, the default), :class:`~featuredp.noise.BandMF` or :class:`~featuredp.noise.BLT`
    (correlated noise; ``noise_multiplier`` is then σ, the std of z in units of C). It owns
    the accounted terms (:meth:`dpsgd_terms`), hence :meth:`event`, the calibration and the
    budget stop; a name (``"bandmf"``) is turned into its unplanned plan.
    ``unit``: the privacy unit, ``"record"`` or ``"user"`` (``user_key=``: users are Poisson-sampled and each
    sampled user's summed gradient is clipped at C, so ``dataset_size`` and ``expected_batch_size`` count users;
    ``records`` is then the number of records and ``records_per_user`` the most a sampled user contributes).
    ``record_target_epsilon`` (E) and ``record_noise_multiplier`` (σ_pub) are the record-level backstop
    (``record_epsilon=E``): every step that reads the public view (pre-training, the ``public`` method's steps,
    Algorithm 1's public batches) Poisson-samples its batch at its rate from a secret stream, clips at C and adds
    N(0, (σ_pub·C)²), σ_pub calibrated so that :meth:`record_epsilon` of the whole run is at most E (None: no
    backstop, the public steps read Ψ(S) without noise).
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
    noise: NoisePlan = Independent()  # noqa: RUF009 - frozen, hashable
    record_target_epsilon: float | None = None
    record_noise_multiplier: float | None = None
    unit: str = "record"
    records: int | None = None
    records_per_user: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "noise", noise_plan(self.noise))  # a name: its (unplanned) plan
        if self.unit not in UNITS:
            raise ValueError(f"unit must be one of {', '.join(UNITS)}, got {self.unit!r}")

    @property
    def record_count(self) -> int:
        """The number of records (``dataset_size`` counts the privacy units: users when ``unit="user"``)."""
        return self.dataset_size if self.records is None else self.records

    @property
    def one_unit(self) -> str:
        """The privacy unit in words, for the guarantee: "one record", or "one user (all of a user's records)"."""
        return "one record" if self.unit == "record" else "one user (all of that user's records)"

    # Read-only views of the noise plan's parameters, for the many reports and tests that print them.
    @property
    def bands(self) -> int | None:
        """BandMF's bands b (None for a noise plan without bands)."""
        bands = self.noise.settings().get("bands")
        return None if bands is None else int(bands)

    @property
    def noise_coeffs(self) -> tuple[float, ...] | None:
        """The correlated strategy's public parameters (BandMF: C's coefficients; BLT: θ then ω); None for
        independent noise."""
        coeffs = getattr(self.noise, "coeffs", None)
        return None if coeffs is None else tuple(coeffs)

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
        # One source: the printed ε, the ledger's charge (reserve/settle), the audits' terms and calibration all
        # read dpsgd_terms, through event() (tests/test_architecture.py forbids other paths).
        return compute_epsilon(self.event(t), self.delta, relation=self.relation, accountant=self.accountant)

    def calibrated_noise_multiplier(self, target_epsilon: float) -> float:
        """The smallest σ whose :meth:`epsilon` after the planned ``steps`` is at most ``target_epsilon``,
        calibrated on the same terms that :meth:`dpsgd_terms` accounts (the noise plan's; never overshoots).

        >>> plan = PrivacyPlan("dpsgd", 1000, 10, 0.01, 100, noise_multiplier=1.0, max_grad_norm=1.0, delta=1e-5)
        >>> sigma = plan.calibrated_noise_multiplier(2.0)
        >>> round(replace(plan, noise_multiplier=sigma).epsilon(), 2) <= 2.0
        True
        """
        if self.delta is None:
            raise ValueError(f"the plan of private method {self.method!r} needs delta to calibrate σ")
        return self.noise.calibrate(replace(self, noise_multiplier=1.0), target_epsilon)

    def affordable_steps(self, target_epsilon: float) -> int:
        """The most private steps whose :meth:`epsilon` is at most ``target_epsilon``, on the same terms that
        :meth:`dpsgd_terms` accounts (the noise plan's budget stop)."""
        if self.delta is None:
            raise ValueError(f"the plan of private method {self.method!r} needs delta to budget steps")
        return self.noise.budget_steps(self, target_epsilon)

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

        The noise plan's (:meth:`featuredp.noise.NoisePlan.event`): ``dpsgd_event`` of its terms
        (:meth:`dpsgd_terms`). ``segment=True``: the event of ``steps`` steps that need not start at the run's first
        step (a resumed run's part, for the ledger), by the plan's segment rule
        (:meth:`featuredp.noise.NoisePlan.segment_steps`): composing the segments' events never gives less than the
        whole run's; for independent noise they compose to it exactly.
        """
        if not self.noise_multiplier:
            raise ValueError(f"a plan with noise_multiplier={self.noise_multiplier!r} has no privacy event")
        return self.noise.event(self, steps, segment=segment)

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
        return self.noise.terms(self, steps)

    # -- record level (the backstop) ---------------------------------------------------------------------------
    @property
    def public_sampling_rate(self) -> float:
        """q_pub = m'/n: the Poisson rate of the backstop's public batches (the ``public`` method's steps and
        Algorithm 1's public batch; m' = ``public_batch_size``, else m)."""
        return min(1.0, (self.public_batch_size or max(1, round(self.expected_batch_size))) / self.dataset_size)

    @property
    def pretrain_sampling_rate(self) -> float:
        """q_pre = m_pre/n: the Poisson rate of the backstop's pre-training batches."""
        return min(1.0, self.pretrain_batch / self.dataset_size)

    def public_steps_of(self, main_steps: int) -> int:
        """How many public batches ``main_steps`` main-phase steps read: all of them for the ``public`` method,
        one per private step for Algorithm 1 with w > 0, none otherwise."""
        method = get_method(self.method)
        if method.public_steps or (method.public_batch and self.public_weight > 0):
            return int(main_steps)
        return 0

    def record_terms(
        self, private_steps: int | None = None, pretrain_steps: int | None = None, public_steps: int | None = None
    ) -> dict[str, Any]:
        """The record-level terms of a run: ``private`` (σ, q, T) or None, ``pretrain`` (q_pre, T_pre), ``public``
        (q_pub, T_pub). Defaults: the planned run (private steps up to the budget stop)."""
        planned = self.steps if self.budget_steps is None else min(self.steps, self.budget_steps)
        t_priv = planned if private_steps is None else int(private_steps)
        t_pre = self.pretrain_steps if pretrain_steps is None else int(pretrain_steps)
        t_pub = self.public_steps_of(planned if get_method(self.method).private else self.steps) if (
            public_steps is None) else int(public_steps)  # fmt: skip
        private = None
        if self.is_private and t_priv > 0:
            private = (float(self.noise_multiplier or 0.0), float(self.sampling_rate), t_priv)
        return {"private": private, "pretrain": (self.pretrain_sampling_rate, t_pre),
                "public": (self.public_sampling_rate, t_pub)}  # fmt: skip

    def record_event(
        self, private_steps: int | None = None, pretrain_steps: int | None = None, public_steps: int | None = None
    ) -> DpEvent | None:
        """The record-level event (:func:`featuredp.accounting.record_event`) of a run with a backstop; None
        without one (or where the public view was read without noise)."""
        return _record_event(**self.record_terms(private_steps, pretrain_steps, public_steps),
                             noise_multiplier=self.record_noise_multiplier)  # fmt: skip

    def record_epsilon(
        self, private_steps: int | None = None, pretrain_steps: int | None = None, public_steps: int | None = None
    ) -> float | None:
        """ε(δ) for whole records of the run (defaults: the planned steps) — one source for the number.

        ``dpsgd``: its ε (already record-level). ``nonprivate``: None. A method that read the public view without
        noise (no backstop, and pre-training, public steps or Algorithm 1's public batch): None, since what Ψ
        misses is then not covered. A private method that never read the public view: its ε (the clipped ∇ℓ
        moves by at most C when a whole record is removed). With a backstop: the composition of every private
        and public step (:func:`featuredp.accounting.record_epsilon`).

        >>> plan = PrivacyPlan("fdp", 1000, 50, 0.05, 100, noise_multiplier=1.0, max_grad_norm=1.0, delta=1e-5,
        ...                    public_batch_size=200)
        >>> plan.record_epsilon() is None
        True
        >>> from dataclasses import replace
        >>> backstop = replace(plan, record_target_epsilon=8.0, record_noise_multiplier=2.0)
        >>> plan.epsilon() < backstop.record_epsilon()
        True
        """
        method = get_method(self.method)
        if not method.private and not method.public_steps:
            return None  # nonprivate
        if method.private and not method.needs_feature_map:
            return self.epsilon(private_steps)  # dpsgd
        terms = self.record_terms(private_steps, pretrain_steps, public_steps)
        if terms["pretrain"][1] <= 0 and terms["public"][1] <= 0:
            return self.epsilon(private_steps) if method.private else 0.0
        if self.record_noise_multiplier is None or self.delta is None:
            return None
        if terms["private"] is not None and not terms["private"][0]:
            return math.inf  # σ = 0 on the private steps
        return _record_epsilon(self.delta, **terms, noise_multiplier=self.record_noise_multiplier,
                               relation=self.relation, accountant=self.accountant)  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict (∞ written as the string "inf"; the noise plan as its nested dict)."""
        out: dict[str, Any] = {f.name: inf_to_str(getattr(self, f.name)) for f in fields(self)}
        out["noise"] = self.noise.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PrivacyPlan:
        """Inverse of :meth:`to_dict`; also reads the dicts of earlier versions, whose ``noise`` was a name beside
        ``bands`` and ``noise_coeffs`` (or absent: independent noise)."""
        values = {k: str_to_inf(v) for k, v in data.items()}
        noise = values.pop("noise", None)
        legacy = {"bands": values.pop("bands", None), "coeffs": values.pop("noise_coeffs", None)}
        if isinstance(noise, Mapping):
            values["noise"] = noise_plan_from_dict(noise)
        else:
            given = {k: v for k, v in legacy.items() if v is not None}
            values["noise"] = noise_plan(noise or Independent.kind, **given)
        return cls(**values)

    def guarantee(
        self,
        epsilon: float,
        feature_map: Disclosure | dict[str, Any] | None = None,
        *,
        delta: float | None = None,
        record_epsilon: float | None = None,
        replacement_epsilon: float | None = None,
    ) -> str:
        """One sentence stating the guarantee of a run that spent ``epsilon`` (``{T}`` = its private steps).

        ``feature_map`` is what Ψ discloses (:class:`Disclosure`, or its dict form from a run.json);
        its ``hides`` names what the guarantee protects. ``delta``: the δ to state (default: the plan's); the
        engine states the plan's δ plus what its noise sampler's cut tail adds
        (:func:`featuredp.accounting.sampler_tail_delta`). ``record_epsilon``: the run's ε for whole records
        (:meth:`record_epsilon`; None where the public view was read without noise). The sentence says what the
        FDP ε covers (what Ψ hides), that anything Ψ misses is public and not covered, unless the run is also DP
        for whole records (a backstop, ``record_epsilon=E``), and then that record-level guarantee. It also says in
        words which question each ε answers: add/remove (the model is indistinguishable from one trained on only the
        public view of any one record) and replace-one (telling two values of one record's private part apart),
        with ``replacement_epsilon`` (:meth:`replacement_epsilon` of the same steps) as the second number.

        >>> fdp = PrivacyPlan("fdp", dataset_size=10, expected_batch_size=2, sampling_rate=0.2, steps=5,
        ...                   noise_multiplier=1.0, max_grad_norm=1.0, delta=1e-5)
        >>> fdp.guarantee(1.5, {"hides": "the label"}, replacement_epsilon=2.5).split("; ")[1:3]
        ['ε = 1.5 (add/remove: the model is indistinguishable from one trained on only the public view of any one \
record)', "telling two values of one record's private part apart: ε = 2.5 (replace-one)"]

        >>> blur = Disclosure("GaussianBlur", reveals="the blurred image", hides="the fine detail")
        >>> plan = PrivacyPlan("public", dataset_size=10, expected_batch_size=2, sampling_rate=0.2, steps=5)
        >>> plan.guarantee(0.0, blur).split("; ")[0]
        '(0, 0)-FDP protecting the fine detail: training read only the public view Ψ(S)'
        >>> plan.guarantee(0.0, blur).split("; ")[1][:77]
        'anything Ψ does not hide (e.g. PII that no annotation marks and no detector f'
        >>> plan = PrivacyPlan("fdp", dataset_size=10, expected_batch_size=2, sampling_rate=0.2, steps=5,
        ...                    noise_multiplier=1.0, max_grad_norm=1.0, delta=1e-5)
        >>> plan.guarantee(1.5, blur.to_dict()).split(" (")[0]
        '(1.5, 1e-05)-FDP protecting the fine detail: Algorithm 1'
        >>> from dataclasses import replace
        >>> backstop = replace(plan, record_target_epsilon=8.0, record_noise_multiplier=1.3)
        >>> print(backstop.guarantee(1.5, blur, record_epsilon=7.9).split("; ")[-1])  # doctest: +NORMALIZE_WHITESPACE
        with the record-level backstop the run is also (7.9, 1e-05)-DP for whole records (every pre-training, public
        and private step clipped and noised), which bounds what the model reveals about anything in a record,
        including missed PII
        """
        hides = feature_map.hides if isinstance(feature_map, Disclosure) else (feature_map or {}).get("hides")
        delta = self.delta if delta is None else delta
        what = f" protecting {hides}" if hides else ""
        rel = "add/remove" if self.relation == "add-remove" else "replace-one"
        method = get_method(self.method)
        if method.public_steps:
            clause = self._record_clause(record_epsilon, delta)
            return f"(0, 0)-FDP{what}: training read only the public view Ψ(S){clause}"
        if not method.private:
            return "no privacy guarantee (non-private training)"
        acc = self.noise.describe(self, rel)
        questions = self._questions(epsilon, replacement_epsilon, whole=not method.needs_feature_map)
        if not method.needs_feature_map:
            whole = "whole records" if self.unit == "record" else "whole users (every record of one user)"
            return f"({epsilon:.4g}, {delta:g})-DP for {whole}, hence the same FDP for any Ψ ({acc}); {questions}"
        pre = " after public pre-training on Ψ(S) (no cost)" if self.pretrain_steps else ""
        if self.record_noise_multiplier is not None:
            pre = " after pre-training on Ψ(S)" if self.pretrain_steps else ""
        kind = "Algorithm 1 (Thm 5)" if method.public_batch else "DP-SGD fine-tuning"
        if self.unit == "user":
            pre += " at user level (the private parts of all of one user's records are one unit)"
        return (f"({epsilon:.4g}, {delta:g})-FDP{what}: {kind}{pre} ({acc}); {questions}"
                f"{self._record_clause(record_epsilon, delta)}")

    def _record_clause(self, record_epsilon: float | None, delta: float | None) -> str:
        """What the guarantee says about what Ψ misses: public and not covered, or the record-level guarantee."""
        if record_epsilon is None or delta is None:
            return ("; anything Ψ does not hide (e.g. PII that no annotation marks and no detector finds) is public "
                    "and NOT covered (no record-level backstop: record_epsilon / --record-epsilon)")
        whole, anything = ("whole records", "anything in a record") if self.unit == "record" else (
            "whole users (every record of one user)", "anything in a user's records")
        if self.record_noise_multiplier is not None:
            return (f"; with the record-level backstop the run is also ({record_epsilon:.4g}, {delta:g})-DP for "
                    f"{whole} (every pre-training, public and private step clipped and noised), which bounds what "
                    f"the model reveals about {anything}, including missed PII")
        return (f"; no step read the public view without noise, so the run is also ({record_epsilon:.4g}, "
                f"{delta:g})-DP for {whole}, which bounds what the model reveals about {anything}, including "
                "missed PII")

    def _questions(self, epsilon: float, replacement: float | None, *, whole: bool) -> str:
        """The guarantee's clause naming the question each ε answers (add/remove and replace-one)."""
        unit = self.one_unit
        if self.unit == "record":
            part = "one record" if whole else "one record's private part"
        else:
            part = "one user's records" if whole else "the private parts of one user's records"
        any_one = unit if self.unit == "record" else unit[4:]  # "any one record", "any user (all of ...)"
        simulated = f"without any {any_one}" if whole else f"on only the public view of any {any_one}"
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
    #: ε(δ) for whole records of the steps run (:meth:`PrivacyPlan.record_epsilon`): the backstop's, dpsgd's ε,
    #: or None where the public view was read without noise (and for nonprivate)
    record_epsilon: float | None = None
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
            "record_epsilon": inf_to_str(None if self.record_epsilon is None else float(self.record_epsilon)),
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
