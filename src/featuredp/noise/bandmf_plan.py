"""The BandMF noise plan: banded matrix-factorization correlated noise over cyclic Poisson sampling
(:mod:`featuredp.noise.bandmf` holds its building blocks, :mod:`featuredp.accounting.bandmf` its accounting)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from featuredp._validate import check_int
from featuredp.accounting.bandmf import bandmf_sampling_rate, bandmf_terms, calibrate_bandmf_noise, sensitivity
from featuredp.accounting.calibrate import calibrate_steps
from featuredp.errors import UnreachableTargetError
from featuredp.noise.plans import NoisePlan, NoisePlanBase, PlanView, float_tuple, register_noise_plan

if TYPE_CHECKING:
    from featuredp.noise.sources import NoiseSource

__all__ = ["BandMF"]


@register_noise_plan
@dataclass(frozen=True)
class BandMF(NoisePlanBase):
    """BandMF (Choquette-Choo et al. 2023): noise C⁻¹z with C banded Toeplitz of ``bands`` bands b and first
    column ``coeffs`` (public: a function of T, b and the workload), cyclic Poisson sampling over b secret partitions,
    accounted as DP-SGD at rate m·b/n, multiplier σ / max column norm of C, ⌈T/b⌉ rounds (amplified BandMF, Thm 4).

    ``bands=None``: :meth:`planned` chooses b (the least noise RMSE at the target ε, else the default, lowered to
    what fits); ``coeffs=None``: it optimises C for the run's workload.

    >>> BandMF(bands=2, coeffs=(1.0, 0.5)).to_dict()
    {'kind': 'bandmf', 'bands': 2, 'coeffs': [1.0, 0.5]}
    """

    bands: int | None = None
    coeffs: tuple[float, ...] | None = None

    kind: ClassVar[str] = "bandmf"
    label: ClassVar[str] = "BandMF"
    order: ClassVar[int] = 1
    correlated: ClassVar[bool] = True
    sigma_note: ClassVar[str] = (
        "BandMF's σ is the std of z in the released C x + z (C's first coefficient 1), not comparable with DP-SGD's: "
        "its ε is that of DP-SGD with multiplier σ / (max column norm of C), sampling rate m·b/n and ⌈T/b⌉ steps "
        "(docs/accounting.md, \"Correlated noise (BandMF)\")."
    )

    @classmethod
    def grid_note(cls, bands: int | None) -> str:
        """The BandMF arm, with the grid's b or how each cell chooses it."""
        chosen = (f"b = {bands} in every BandMF cell" if bands else
                  "b chosen per cell by the engine at its ε: the b of 1, 2, 4, ... (at most the steps and n/m) with "
                  "the least noise RMSE for the run's momentum workload (featuredp.noise.bandmf.best_bands)")
        return ("Noise: each private method runs with independent Gaussian noise and with BandMF (banded "
                f"matrix-factorization correlated noise, cyclic Poisson sampling over b partitions; {chosen}), "
                "at the same ε and δ with the same hyperparameters (with tuning: each arm tuned alike); σ is "
                "calibrated for each (docs/accounting.md, \"Correlated noise (BandMF)\").")  # fmt: skip

    def __post_init__(self) -> None:
        if self.bands is not None:
            object.__setattr__(self, "bands", check_int("bands", self.bands, minimum=1))
        object.__setattr__(self, "coeffs", float_tuple(self.coeffs))

    @property
    def is_planned(self) -> bool:
        """Whether b and C are set."""
        return self.bands is not None and self.coeffs is not None

    def _parts(self) -> tuple[int, tuple[float, ...]]:
        if self.bands is None or self.coeffs is None:
            raise ValueError("a plan with noise='bandmf' needs bands and noise_coeffs")
        return self.bands, self.coeffs

    def planned(self, n: int, m: float, steps: int, *, target_epsilon: float | None, delta: float,
                momentum: float, relation: str, accountant: str) -> NoisePlan:  # fmt: skip
        """b (given, or chosen: :func:`featuredp.noise.bandmf.run_strategy`) and C optimised for the workload."""
        if self.is_planned:
            return self
        from featuredp.noise.bandmf import run_strategy  # torch, lazily

        b, coeffs = run_strategy(n, m, steps, bands=self.bands, target_epsilon=target_epsilon, delta=delta,
                                 momentum=momentum, relation=relation, accountant=accountant)  # fmt: skip
        return BandMF(bands=b, coeffs=tuple(float(c) for c in coeffs))

    def settings(self) -> dict[str, Any]:
        """``{"bands": b}``."""
        return {"bands": self.bands}

    def terms(self, plan: PlanView, steps: int) -> tuple[float, float, int]:
        """σ / max column norm of C, rate m·b/n, ⌈steps/b⌉ rounds."""
        bands, coeffs = self._parts()
        if not plan.noise_multiplier:
            raise ValueError(f"a plan with noise_multiplier={plan.noise_multiplier!r} has no privacy event")
        return bandmf_terms(plan.noise_multiplier, plan.expected_batch_size, plan.dataset_size, max(1, int(steps)),
                            bands, coeffs)  # fmt: skip

    def segment_steps(self, plan: PlanView, steps: int) -> int:
        """A later segment's steps see every band: at least b steps (the column norm of all of C). Composing the
        segments' events never gives less than the whole run's (⌈t₁/b⌉ + ⌈t₂/b⌉ >= ⌈T/b⌉ rounds)."""
        return max(int(steps), len(self._parts()[1]))

    def calibrate(self, plan: PlanView, target_epsilon: float) -> float:
        """σ / sens(C) is at least the calibrated multiplier of the amplified event (never overshoots)."""
        bands, coeffs = self._parts()
        assert plan.delta is not None
        return calibrate_bandmf_noise(target_epsilon, plan.delta, plan.expected_batch_size, plan.dataset_size,
                                      plan.steps, bands, coeffs, relation=plan.relation,
                                      accountant=plan.accountant)  # fmt: skip

    def budget_steps(self, plan: PlanView, target_epsilon: float) -> int:
        """The largest whole number of rounds of b steps, at every band's column norm (the first b − 1 steps
        only cost less)."""
        bands, _ = self._parts()
        assert plan.delta is not None
        multiplier, q, _ = self.terms(plan, plan.steps)
        try:
            rounds = calibrate_steps(target_epsilon, plan.delta, q, multiplier, relation=plan.relation,
                                     accountant=plan.accountant)  # fmt: skip
        except UnreachableTargetError:
            raise UnreachableTargetError(
                f"target_epsilon={target_epsilon!r} is not reachable with noise='bandmf': one round of bands={bands} "
                f"steps at noise_multiplier={plan.noise_multiplier!r} already exceeds it; raise noise_multiplier or "
                "lower bands"
            ) from None
        return rounds * bands

    def sampler_and_noise(self, plan: PlanView, start: int, stop: int, generator: Any, source: NoiseSource,
                          dim: int) -> tuple[Any, NoiseSource]:  # fmt: skip
        """The cyclic Poisson sampler over b secret partitions (drawn here, from the private sampling stream) and
        the banded noise C⁻¹z over ``source``."""
        from featuredp.noise.bandmf import BandedNoise  # torch, lazily
        from featuredp.sampling import BMinSepSampler

        bands, coeffs = self._parts()
        m, n = plan.expected_batch_size, plan.dataset_size
        sampler = BMinSepSampler(stop - start, m, bands, generator, offset=start,
                                 sampling_rate=bandmf_sampling_rate(m, n, bands))  # fmt: skip
        return sampler, BandedNoise(coeffs, dim, source)

    def report(self, plan: PlanView, private_steps: int) -> dict[str, Any] | None:
        """b, C, its largest column norm, the effective multiplier, the sampling and the accounting."""
        bands, coeffs = self._parts()
        m, n = plan.expected_batch_size, plan.dataset_size
        sens = sensitivity(coeffs, max(1, private_steps))
        return {
            "noise": self.kind,
            "bands": bands,
            "coefficients": list(coeffs),
            "max_column_norm": sens,
            "effective_noise_multiplier": (plan.noise_multiplier or 0.0) / sens,
            "sampling": f"cyclic Poisson over {bands} secret partitions, rate "
                        f"{bandmf_sampling_rate(m, n, bands):.4g} per partition",
            "rounds": -(-private_steps // bands),
            "accounting": "amplified BandMF (Choquette-Choo et al. 2023, Thm 4): DP-SGD at rate m·b/n, "
                          "multiplier σ / max column norm of C, ceil(T/b) rounds",
        }  # fmt: skip

    def progress_label(self, method: str) -> str:
        """``"<method> bandmf b=<bands>"``."""
        return f"{method} bandmf b={self.bands}"

    def describe(self, plan: PlanView, neighbours: str) -> str:
        """BandMF's clause."""
        return (f"noise bandmf: banded matrix-factorization correlated noise with {self.bands} bands, noise std "
                f"{plan.noise_multiplier:.4g}·C, cyclic Poisson sampling over {self.bands} partitions, {{T}} private "
                f"steps, amplified BandMF accounting (Choquette-Choo et al. 2023, Thm 4), {plan.accountant.upper()} "
                f"accountant, {neighbours} neighbours")  # fmt: skip
