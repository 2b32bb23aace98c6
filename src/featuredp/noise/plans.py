"""The noise plan of a run's private steps: the :class:`NoisePlan` protocol, its base class and the registry.

A noise plan is one object that owns, in one place, everything that depends on the kind of noise: which strategy it
uses (:meth:`NoisePlan.planned`: BandMF's bands and coefficients, BLT's buffers), the (σ_eff, q, T) that its private
steps are accounted as (:meth:`NoisePlan.terms`, hence the one DP event the printed ε, the ledger, the audits and the
tuner all read through :meth:`featuredp.plan.PrivacyPlan.event`), the calibration of σ for a target ε and the budget
stop, a resumed segment's event, its sampler and its noise source, the ``correlated_noise`` report block, the
progress-bar label and the guarantee's accounting clause. A class is unplanned configuration (``BandMF(bands=4)``)
until :meth:`NoisePlan.planned` returns the planned instance for a run's n, m and T.

The registry (:data:`NOISE_PLANS`, keyed by each class's ``kind``) is what the CLI's ``--noise`` choices, the
configs and the plan dicts of run.json read; a new kind is one new module with a class decorated
:func:`register_noise_plan` (imported by :mod:`featuredp.noise`, which loads every plan module of the package).

This module and the plan classes import no torch: the sampler and the noise source import it when they are built.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar, cast, runtime_checkable

from featuredp._validate import check_choice
from featuredp.accounting import DpEvent, dpsgd_event

if TYPE_CHECKING:
    from featuredp.noise.sources import NoiseSource

__all__ = ["NOISE_PLANS", "NoisePlan", "NoisePlanBase", "PlanView", "noise_plan", "noise_plan_from_dict",
           "plan_settings", "register_noise_plan"]


class PlanView(Protocol):
    """What a noise plan reads of the run's :class:`featuredp.plan.PrivacyPlan` (kept as a protocol so that the
    noise family does not import the plan that holds it)."""

    @property
    def dataset_size(self) -> int: ...  # noqa: D102
    @property
    def expected_batch_size(self) -> float: ...  # noqa: D102
    @property
    def sampling_rate(self) -> float: ...  # noqa: D102
    @property
    def steps(self) -> int: ...  # noqa: D102
    @property
    def noise_multiplier(self) -> float | None: ...  # noqa: D102
    @property
    def delta(self) -> float | None: ...  # noqa: D102
    @property
    def relation(self) -> str: ...  # noqa: D102
    @property
    def accountant(self) -> str: ...  # noqa: D102


@runtime_checkable
class NoisePlan(Protocol):
    """The noise of a run's private steps (module docstring). Frozen, hashable and JSON round-trippable."""

    #: the name in the registry, the CLI's ``--noise`` and run.json
    kind: ClassVar[str]
    #: how a report names the arm ("BandMF"); empty for the default noise
    label: ClassVar[str]
    #: where the kind sorts in tables (the default first)
    order: ClassVar[int]
    #: whether its noise is correlated across steps (a cyclic sampler, a ``correlated_noise`` report block)
    correlated: ClassVar[bool]
    #: what a results table must say about its σ (empty: DP-SGD's noise multiplier)
    sigma_note: ClassVar[str]

    @classmethod
    def grid_note(cls, bands: int | None) -> str:
        """How a comparison grid's summary describes its arm (``bands``: the grid's, None: chosen per cell)."""
        ...

    @property
    def is_planned(self) -> bool:
        """Whether the strategy's parameters are set (:meth:`planned` was called, or they were given)."""
        ...

    def planned(self, n: int, m: float, steps: int, *, target_epsilon: float | None, delta: float,
                momentum: float, relation: str, accountant: str) -> NoisePlan:  # fmt: skip
        """This plan with its strategy chosen for ``steps`` private steps on ``n`` records at expected batch ``m``,
        for the workload of SGD momentum ``momentum`` (0: the prefix sums); public quantities only."""
        ...

    def settings(self) -> dict[str, Any]:
        """The user-facing settings of the kind (BandMF: ``{"bands": b}``), for configs and messages."""
        ...

    def terms(self, plan: PlanView, steps: int) -> tuple[float, float, int]:
        """(σ_eff, q, T) of the Poisson-subsampled Gaussian that ``steps`` private steps of ``plan`` are accounted
        as (needs ``plan.noise_multiplier`` > 0)."""
        ...

    def segment_steps(self, plan: PlanView, steps: int) -> int:
        """The steps to account for ``steps`` steps that need not start at the run's first (a resumed segment)."""
        ...

    def event(self, plan: PlanView, steps: int, *, segment: bool = False) -> DpEvent:
        """The DP event of ``steps`` private steps of ``plan`` (``segment``: a resumed run's part)."""
        ...

    def calibrate(self, plan: PlanView, target_epsilon: float) -> float:
        """The σ at which ``plan``'s planned steps spend at most ``target_epsilon`` (never overshoots)."""
        ...

    def budget_steps(self, plan: PlanView, target_epsilon: float) -> int:
        """The most private steps (at most ``plan.steps``) whose ε at ``plan.noise_multiplier`` is within
        ``target_epsilon``."""
        ...

    def sampler_and_noise(self, plan: PlanView, start: int, stop: int, generator: Any, source: NoiseSource,
                          dim: int) -> tuple[Any, NoiseSource]:  # fmt: skip
        """The private sampler of records ``start``..``stop`` − 1 and the noise added to the clipped sum."""
        ...

    def report(self, plan: PlanView, private_steps: int) -> dict[str, Any] | None:
        """The privacy report's ``correlated_noise`` block (None: independent noise)."""
        ...

    def progress_label(self, method: str) -> str:
        """The progress bar's label of a run of ``method``."""
        ...

    def describe(self, plan: PlanView, neighbours: str) -> str:
        """The guarantee sentence's accounting clause (``{T}`` stands for the private steps)."""
        ...

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict: ``kind`` and the plan's fields (:func:`noise_plan_from_dict` reads it back)."""
        ...


#: every registered noise plan class by its ``kind`` (the CLI's ``--noise`` choices), sorted by ``order``
NOISE_PLANS: dict[str, type[NoisePlan]] = {}

_P = TypeVar("_P", bound=type)


def register_noise_plan(cls: _P) -> _P:
    """Class decorator: add a noise plan class to :data:`NOISE_PLANS` under its ``kind``."""
    kind = getattr(cls, "kind", None)
    if not isinstance(kind, str) or not kind:
        raise TypeError(f"a noise plan class needs a non-empty kind, got {kind!r} on {cls.__name__}")
    known = NOISE_PLANS.get(kind)
    if known is not None and known is not cls:
        raise ValueError(f"noise kind {kind!r} is already registered by {known.__name__}")
    NOISE_PLANS[kind] = cls
    ordered = sorted(NOISE_PLANS.items(), key=lambda item: item[1].order)  # the default first, as the CLI lists them
    NOISE_PLANS.clear()
    NOISE_PLANS.update(ordered)
    return cls


def _check_kind(name: object) -> type[NoisePlan]:
    """The registered class called ``name``; a one-line error naming ``noise`` otherwise."""
    return NOISE_PLANS[check_choice("noise", name, tuple(NOISE_PLANS))]


def plan_settings(cls: type[NoisePlan]) -> tuple[str, ...]:
    """The settings :func:`noise_plan` accepts for the plan class ``cls``: its init fields, in order (not its
    class-level constants). Whoever offers a setting to users (the CLI's ``--bands``, a grid's ``bands``) asks this,
    so a plan carries no flag about the CLI.

    >>> from featuredp.noise import BLT, BandMF
    >>> plan_settings(BandMF), plan_settings(BLT)
    (('bands', 'coeffs'), ('coeffs',))
    """
    return tuple(f.name for f in fields(cast(Any, cls)))


def noise_plan(name: str | NoisePlan, **params: Any) -> NoisePlan:
    """The noise plan ``name`` (a registered kind, as the CLI and configs give it) with ``params``
    (``noise_plan("bandmf", bands=4)``); a plan instance is returned as it is (no ``params``).

    >>> noise_plan("bandmf", bands=4)
    BandMF(bands=4, coeffs=None)
    """
    if isinstance(name, NoisePlan) and not isinstance(name, str):
        if params:
            raise ValueError(f"give settings {sorted(params)} in the noise plan {name!r} itself")
        return name
    cls = _check_kind(name)
    accepted = plan_settings(cls)
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise ValueError(f"{unknown[0]} is not a setting of noise={name!r} (its settings: {sorted(accepted)})")
    return cls(**params)


def noise_plan_from_dict(data: Mapping[str, Any]) -> NoisePlan:
    """Inverse of :meth:`NoisePlan.to_dict`."""
    if not isinstance(data, Mapping):
        raise ValueError(f"a noise plan dict needs a mapping with 'kind', got {data!r}")
    params = {k: v for k, v in data.items() if k != "kind"}
    return noise_plan(data.get("kind"), **params)  # type: ignore[arg-type]


@dataclass(frozen=True)
class NoisePlanBase:
    """What every noise plan shares: the event built from :meth:`terms`, the dict form and the defaults."""

    kind: ClassVar[str] = ""
    label: ClassVar[str] = ""
    order: ClassVar[int] = 9
    correlated: ClassVar[bool] = False
    sigma_note: ClassVar[str] = ""

    @classmethod
    def grid_note(cls, bands: int | None) -> str:
        """No note."""
        return ""

    def terms(self, plan: PlanView, steps: int) -> tuple[float, float, int]:  # pragma: no cover - abstract
        """(σ_eff, q, T) of ``steps`` private steps (:class:`NoisePlan`)."""
        raise NotImplementedError

    def segment_steps(self, plan: PlanView, steps: int) -> int:
        """Segments compose exactly for a memoryless mechanism: ``steps``."""
        return int(steps)

    def event(self, plan: PlanView, steps: int, *, segment: bool = False) -> DpEvent:
        """``dpsgd_event`` of :meth:`terms`: the one source of every ε (``segment``: :meth:`segment_steps`)."""
        counted = self.segment_steps(plan, steps) if segment else int(steps)
        return dpsgd_event(*self.terms(plan, counted))

    def settings(self) -> dict[str, Any]:
        """No settings."""
        return {}

    def report(self, plan: PlanView, private_steps: int) -> dict[str, Any] | None:
        """No ``correlated_noise`` block."""
        return None

    def progress_label(self, method: str) -> str:
        """``"<method> <kind>"`` plus the settings."""
        extra = "".join(f" {k[0]}={v}" for k, v in self.settings().items())
        return f"{method} {self.kind}{extra}"

    def to_dict(self) -> dict[str, Any]:
        """``{"kind": ..., **fields}`` with tuples as lists."""
        out: dict[str, Any] = {"kind": self.kind}
        for key, value in asdict(self).items():
            out[key] = list(value) if isinstance(value, tuple) else value
        return out

    @property
    def is_planned(self) -> bool:
        """Planned unless a subclass says otherwise."""
        return True


def float_tuple(values: object) -> tuple[float, ...] | None:
    """``values`` (a JSON list, a numpy array, a tuple) as a tuple of floats; None stays None."""
    if values is None:
        return None
    return tuple(float(v) for v in values)  # type: ignore[attr-defined]
