"""DP-SGD's noise: a fresh Gaussian every step on a Poisson batch (the default noise plan)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from featuredp.accounting import calibrate_noise_multiplier, calibrate_steps
from featuredp.noise.plans import NoisePlan, NoisePlanBase, PlanView, register_noise_plan

if TYPE_CHECKING:
    from featuredp.noise.sources import NoiseSource

__all__ = ["Independent"]


@register_noise_plan
@dataclass(frozen=True)
class Independent(NoisePlanBase):
    """Independent Gaussian noise N(0, σ²C²) each step, Poisson sampling at rate q, accounted as DP-SGD's
    Poisson-subsampled Gaussian (σ, q, T). Nothing to plan.

    >>> Independent().to_dict()
    {'kind': 'independent'}
    """

    kind: ClassVar[str] = "independent"
    label: ClassVar[str] = ""
    order: ClassVar[int] = 0

    def planned(self, n: int, m: float, steps: int, *, target_epsilon: float | None, delta: float,
                momentum: float, relation: str, accountant: str) -> NoisePlan:  # fmt: skip
        """Nothing to choose: this plan."""
        return self

    def terms(self, plan: PlanView, steps: int) -> tuple[float, float, int]:
        """The plan's own (σ, q, T)."""
        if not plan.noise_multiplier:
            raise ValueError(f"a plan with noise_multiplier={plan.noise_multiplier!r} has no privacy event")
        return self._terms(plan.noise_multiplier, plan, steps)

    @staticmethod
    def _terms(sigma: float, plan: PlanView, steps: int) -> tuple[float, float, int]:
        return float(sigma), float(plan.sampling_rate), int(steps)

    def calibrate(self, plan: PlanView, target_epsilon: float) -> float:
        """The smallest σ whose ε after the planned steps is at most ``target_epsilon``, calibrated on the same
        (q, T) that :meth:`terms` accounts."""
        assert plan.delta is not None
        unit, q, t = self._terms(1.0, plan, plan.steps)
        return calibrate_noise_multiplier(target_epsilon, plan.delta, q, t, relation=plan.relation,
                                          accountant=plan.accountant) / unit  # fmt: skip

    def budget_steps(self, plan: PlanView, target_epsilon: float) -> int:
        """The most steps whose ε is within ``target_epsilon`` on the (σ, q) that :meth:`terms` accounts."""
        assert plan.delta is not None
        sigma, q, _ = self.terms(plan, plan.steps)
        return calibrate_steps(target_epsilon, plan.delta, q, sigma, relation=plan.relation,
                               accountant=plan.accountant)  # fmt: skip

    def sampler_and_noise(self, plan: PlanView, start: int, stop: int, generator: Any, source: NoiseSource,
                          dim: int) -> tuple[Any, NoiseSource]:  # fmt: skip
        """A Poisson sampler of the shard at the plan's rate, and the source's fresh noise."""
        from featuredp.sampling import PoissonSampler  # torch, lazily

        return PoissonSampler(stop - start, plan.sampling_rate, generator, offset=start), source

    def progress_label(self, method: str) -> str:
        """The method's name."""
        return method

    def describe(self, plan: PlanView, neighbours: str) -> str:
        """The Poisson-subsampled Gaussian's clause."""
        return (f"Poisson-subsampled Gaussian, noise multiplier {plan.noise_multiplier:.4g}, sampling rate "
                f"{plan.sampling_rate:.4g}, {{T}} private steps, {plan.accountant.upper()} accountant, {neighbours} "
                "neighbours")  # fmt: skip
