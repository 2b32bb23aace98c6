"""The BLT noise plan: buffered-linear-Toeplitz correlated noise over cyclic sampling by epochs
(:mod:`featuredp.noise.blt` holds its building blocks, :mod:`featuredp.accounting.blt` its accounting)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from featuredp.accounting.bandmf import bandmf_sampling_rate
from featuredp.accounting.blt import (
    blt_epsilon,
    blt_min_separation,
    blt_sensitivity,
    blt_terms,
    calibrate_blt_noise,
    split_blt_params,
)
from featuredp.errors import UnreachableTargetError
from featuredp.noise.plans import NoisePlan, NoisePlanBase, PlanView, float_tuple, register_noise_plan

if TYPE_CHECKING:
    from featuredp.noise.sources import NoiseSource

__all__ = ["BLT"]


@register_noise_plan
@dataclass(frozen=True)
class BLT(NoisePlanBase):
    """BLT (Dvijotham et al. 2024): noise C⁻¹z with C buffered linear Toeplitz, ``coeffs`` = (θ_1..θ_d, ω_1..ω_d),
    its buffer decays and output scales; cyclic sampling over ⌊n/m⌋ secret partitions (one epoch), accounted as one
    Gaussian release at the min-sep sensitivity Δ of C (no amplification). ``coeffs=None``: :meth:`planned`
    optimises θ and ω for the run's workload.

    >>> BLT(coeffs=(0.5, 0.25)).buffers
    1
    """

    coeffs: tuple[float, ...] | None = None

    kind: ClassVar[str] = "blt"
    label: ClassVar[str] = "BLT"
    order: ClassVar[int] = 2
    correlated: ClassVar[bool] = True
    sigma_note: ClassVar[str] = (
        "BLT's σ is likewise the std of z in C x + z, not comparable with DP-SGD's: its ε is that of one Gaussian "
        "release with multiplier σ / Δ, Δ the min-sep sensitivity of C over epochs of ⌊n/m⌋ steps, without "
        "amplification by sampling (featuredp.noise.blt)."
    )

    @classmethod
    def grid_note(cls, bands: int | None) -> str:
        """The BLT arm."""
        return ("Noise, the BLT arm: buffered linear Toeplitz correlated noise with cyclic sampling over epochs "
                "of ⌊n/m⌋ steps (BLT: d <= 4 buffers optimised for the run's workload, one Gaussian at the "
                "min-sep sensitivity, no amplification: featuredp.noise.blt), at the same ε and δ with the same "
                "hyperparameters as the other arms (with tuning: each arm tuned alike); σ is calibrated for each.")

    def __post_init__(self) -> None:
        object.__setattr__(self, "coeffs", float_tuple(self.coeffs))

    @property
    def is_planned(self) -> bool:
        """Whether θ and ω are set."""
        return self.coeffs is not None

    @property
    def buffers(self) -> int | None:
        """d, the number of buffers (None before planning)."""
        return None if self.coeffs is None else len(self.coeffs) // 2

    def _coeffs(self) -> tuple[float, ...]:
        if self.coeffs is None:
            raise ValueError("a plan with noise='blt' needs noise_coeffs")
        return self.coeffs

    def planned(self, n: int, m: float, steps: int, *, target_epsilon: float | None, delta: float,
                momentum: float, relation: str, accountant: str) -> NoisePlan:  # fmt: skip
        """θ and ω optimised for ``steps`` steps at min-separation ⌊n/m⌋ (:func:`featuredp.noise.blt.optimize_blt`)."""
        if self.is_planned:
            return self
        if m > n:
            raise ValueError(f"batch_size {m:g} is larger than the {n} records: BLT's epochs need m <= n")
        import numpy as np

        from featuredp.noise.blt import optimize_blt  # torch, lazily

        theta, omega = optimize_blt(steps, blt_min_separation(n, m), momentum=momentum)
        return BLT(coeffs=tuple(float(v) for v in np.concatenate((theta, omega))))

    def terms(self, plan: PlanView, steps: int) -> tuple[float, float, int]:
        """σ / Δ, rate 1, one release."""
        coeffs = self._coeffs()
        if not plan.noise_multiplier:
            raise ValueError(f"a plan with noise_multiplier={plan.noise_multiplier!r} has no privacy event")
        return blt_terms(plan.noise_multiplier, coeffs, plan.expected_batch_size, plan.dataset_size,
                         max(1, int(steps)))  # fmt: skip

    def segment_steps(self, plan: PlanView, steps: int) -> int:
        """A segment takes Δ of the planned run: its rows see every earlier column, and ‖C v‖² splits over the
        segments' rows, so the segments' Gaussians compose to at least the whole run's."""
        return max(int(steps), plan.steps)

    def calibrate(self, plan: PlanView, target_epsilon: float) -> float:
        """The Gaussian's calibrated multiplier times Δ, rounded up (never overshoots)."""
        assert plan.delta is not None
        return calibrate_blt_noise(target_epsilon, plan.delta, self._coeffs(), plan.expected_batch_size,
                                   plan.dataset_size, plan.steps, relation=plan.relation,
                                   accountant=plan.accountant)  # fmt: skip

    def budget_steps(self, plan: PlanView, target_epsilon: float) -> int:
        """The largest t whose single Gaussian (sensitivity Δ(t), non-decreasing in t) stays within the target, by
        bisection."""
        coeffs = self._coeffs()
        assert plan.delta is not None and plan.noise_multiplier is not None
        sigma, m, n, delta = plan.noise_multiplier, plan.expected_batch_size, plan.dataset_size, plan.delta
        acct = {"relation": plan.relation, "accountant": plan.accountant}
        if blt_epsilon(sigma, coeffs, m, n, 1, delta, **acct) > target_epsilon:
            raise UnreachableTargetError(
                f"target_epsilon={target_epsilon!r} is not reachable with noise='blt': one step at noise_multiplier="
                f"{sigma!r} already exceeds it; raise noise_multiplier"
            )
        lo, hi = 1, plan.steps  # ε(lo) <= target
        if blt_epsilon(sigma, coeffs, m, n, hi, delta, **acct) <= target_epsilon:
            return hi
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if blt_epsilon(sigma, coeffs, m, n, mid, delta, **acct) <= target_epsilon:
                lo = mid
            else:
                hi = mid
        return lo

    def sampler_and_noise(self, plan: PlanView, start: int, stop: int, generator: Any, source: NoiseSource,
                          dim: int) -> tuple[Any, NoiseSource]:  # fmt: skip
        """The cyclic sampler over ⌊n/m⌋ secret partitions and the BLT noise over ``source``."""
        from featuredp.noise.blt import BLTNoise  # torch, lazily
        from featuredp.sampling import BMinSepSampler

        m, n = plan.expected_batch_size, plan.dataset_size
        b = blt_min_separation(n, m)
        theta, omega = split_blt_params(self._coeffs())
        sampler = BMinSepSampler(stop - start, m, b, generator, offset=start,
                                 sampling_rate=bandmf_sampling_rate(m, n, b))  # fmt: skip
        return sampler, BLTNoise(theta, omega, dim, source)

    def report(self, plan: PlanView, private_steps: int) -> dict[str, Any] | None:
        """θ, ω, the min-separation, the participations, Δ, the effective multiplier and the accounting."""
        coeffs = self._coeffs()
        t = max(1, private_steps)
        m, n = plan.expected_batch_size, plan.dataset_size
        theta, omega = split_blt_params(coeffs)
        b = blt_min_separation(n, m)
        sens = blt_sensitivity(coeffs, m, n, t)
        return {
            "noise": self.kind,
            "buffers": int(theta.size),
            "buf_decay": theta.tolist(),
            "output_scale": omega.tolist(),
            "min_separation": b,
            "participations": -(-t // b),
            "sensitivity": sens,
            "effective_noise_multiplier": (plan.noise_multiplier or 0.0) / sens if sens else math.inf,
            "sampling": f"cyclic over {b} secret partitions (one epoch of {b} steps), rate "
                        f"{bandmf_sampling_rate(m, n, b):.4g} per partition",
            "accounting": "one Gaussian release with the min-sep sensitivity of C (no amplification; McKenna 2024, "
                          "Thm 2), as jax_privacy's SingleReleaseTrainingAccountant",
        }  # fmt: skip

    def progress_label(self, method: str) -> str:
        """``"<method> blt"``."""
        return f"{method} blt"

    def describe(self, plan: PlanView, neighbours: str) -> str:
        """BLT's clause."""
        return (f"noise blt: buffered linear Toeplitz correlated noise with {self.buffers or 0} buffers, noise std "
                f"{plan.noise_multiplier:.4g}·C, cyclic sampling over epochs of "
                f"{blt_min_separation(plan.dataset_size, plan.expected_batch_size)} steps, {{T}} private steps, one "
                f"Gaussian release at the min-sep sensitivity (no amplification), {plan.accountant.upper()} "
                f"accountant, {neighbours} neighbours")  # fmt: skip
