"""Correlated noise for a run: the one place that composes BandMF's (:mod:`featuredp.bandmf`) and BLT's
(:mod:`featuredp.blt`) building blocks into what the Trainer needs.

- :func:`plan_strategy`: the strategy's public parameters for the run (BandMF: the bands b and C's coefficients;
  BLT: its buffer decays and output scales, flat), from n, m, T and the workload;
- :func:`calibrate` and :func:`budget_steps`: σ for a target ε, or the most private steps a given σ allows;
- :func:`sampler_and_noise`: the run's cyclic sampler over secret partitions and its noise source;
- :func:`report`: the ``correlated_noise`` block of the privacy report.

The plan holds the noise kind, BandMF's bands and the parameters (``noise_coeffs``); its :meth:`event
<featuredp.plan.PrivacyPlan.event>` accounts them.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from featuredp._validate import check_choice
from featuredp.accounting.bandmf import bandmf_terms
from featuredp.accounting.calibrate import calibrate_steps
from featuredp.bandmf import BandedNoise, bandmf_sampling_rate, calibrate_bandmf_noise, run_strategy
from featuredp.bandmf import sensitivity as bandmf_sensitivity
from featuredp.blt import (
    BLTNoise,
    blt_epsilon,
    blt_min_separation,
    blt_sensitivity,
    calibrate_blt_noise,
    optimize_blt,
    split_blt_params,
)
from featuredp.config import CORRELATED_NOISES
from featuredp.errors import UnreachableTargetError
from featuredp.noise import NoiseSource
from featuredp.sampling import BMinSepSampler

__all__ = ["budget_steps", "calibrate", "partitions", "plan_strategy", "report", "sampler_and_noise"]


def plan_strategy(noise: str, n: int, m: float, steps: int, *, bands: int | None, target_epsilon: float | None,
                  delta: float, momentum: float, relation: str, accountant: str
                  ) -> tuple[int | None, tuple[float, ...]]:  # fmt: skip
    """(BandMF's bands or None, the strategy's parameters) for a run of ``steps`` private steps on n records at
    expected batch m, for the workload of SGD momentum ``momentum`` (0: the prefix sums)."""
    noise = check_choice("noise", noise, CORRELATED_NOISES)
    if noise == "bandmf":
        b, coeffs = run_strategy(n, m, steps, bands=bands, target_epsilon=target_epsilon, delta=delta,
                                 momentum=momentum, relation=relation, accountant=accountant)  # fmt: skip
        return b, tuple(float(c) for c in coeffs)
    if m > n:
        raise ValueError(f"batch_size {m:g} is larger than the {n} records: BLT's epochs need m <= n")
    theta, omega = optimize_blt(steps, blt_min_separation(n, m), momentum=momentum)
    return None, tuple(float(v) for v in np.concatenate((theta, omega)))


def partitions(noise: str, n: int, m: float, bands: int | None) -> int:
    """How many secret partitions the cyclic sampler cycles through: BandMF's b, BLT's ⌊n/m⌋ (one epoch)."""
    if noise == "bandmf":
        assert bands is not None
        return bands
    return blt_min_separation(n, m)


def calibrate(noise: str, target_epsilon: float, delta: float, m: float, n: int, steps: int, bands: int | None,
              coeffs: tuple[float, ...], **acct: Any) -> float:  # fmt: skip
    """σ (std of z in units of C) for ``target_epsilon`` over ``steps`` private steps; never overshoots."""
    if noise == "bandmf":
        assert bands is not None
        return calibrate_bandmf_noise(target_epsilon, delta, m, n, steps, bands, coeffs, **acct)
    return calibrate_blt_noise(target_epsilon, delta, coeffs, m, n, steps, **acct)


def budget_steps(noise: str, target_epsilon: float, delta: float, sigma: float, m: float, n: int, steps: int,
                 bands: int | None, coeffs: tuple[float, ...], **acct: Any) -> int:  # fmt: skip
    """The most private steps (at most ``steps``) whose ε stays within ``target_epsilon`` at a given σ.

    BandMF spends by rounds of b steps (:func:`featuredp.bandmf.bandmf_event`): the largest whole number of rounds,
    at every band's column norm (the first b − 1 steps only cost less). BLT: the largest t whose single Gaussian
    (sensitivity Δ(t), non-decreasing in t) stays within the target, by bisection.
    """
    if noise == "bandmf":
        assert bands is not None
        multiplier, q, _ = bandmf_terms(sigma, m, n, steps, bands, coeffs)
        try:
            rounds = calibrate_steps(target_epsilon, delta, q, multiplier, **acct)
        except UnreachableTargetError:
            raise UnreachableTargetError(
                f"target_epsilon={target_epsilon!r} is not reachable with noise='bandmf': one round of bands={bands} "
                f"steps at noise_multiplier={sigma!r} already exceeds it; raise noise_multiplier or lower bands"
            ) from None
        return rounds * bands
    if blt_epsilon(sigma, coeffs, m, n, 1, delta, **acct) > target_epsilon:
        raise UnreachableTargetError(
            f"target_epsilon={target_epsilon!r} is not reachable with noise='blt': one step at noise_multiplier="
            f"{sigma!r} already exceeds it; raise noise_multiplier"
        )
    lo, hi = 1, steps  # ε(lo) <= target
    if blt_epsilon(sigma, coeffs, m, n, hi, delta, **acct) <= target_epsilon:
        return hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if blt_epsilon(sigma, coeffs, m, n, mid, delta, **acct) <= target_epsilon:
            lo = mid
        else:
            hi = mid
    return lo


def sampler_and_noise(plan: Any, start: int, stop: int, generator: Any, source: NoiseSource, dim: int
                      ) -> tuple[BMinSepSampler, NoiseSource]:  # fmt: skip
    """The cyclic sampler of records ``start``..``stop`` − 1 (a rank's shard, or all) and the correlated noise.

    The secret partition is drawn here, from the private sampling stream (or its key): each rank assigns the
    records of its own shard by coins of its own, which together are one independent assignment of the whole
    dataset, sampled at the whole dataset's rate m·b/N.
    """
    if plan.noise == "bandmf" and (plan.bands is None or plan.noise_coeffs is None):
        raise ValueError("a plan with noise='bandmf' needs bands and noise_coeffs")
    if plan.noise_coeffs is None:
        raise ValueError(f"a plan with noise={plan.noise!r} needs noise_coeffs")
    m, n = plan.expected_batch_size, plan.dataset_size
    b = partitions(plan.noise, n, m, plan.bands)
    sampler = BMinSepSampler(stop - start, m, b, generator, offset=start,
                             sampling_rate=bandmf_sampling_rate(m, n, b))  # fmt: skip
    if plan.noise == "bandmf":
        return sampler, BandedNoise(plan.noise_coeffs, dim, source)
    theta, omega = split_blt_params(plan.noise_coeffs)
    return sampler, BLTNoise(theta, omega, dim, source)


def report(plan: Any, private_steps: int) -> dict[str, Any]:
    """The privacy report's ``correlated_noise`` block (public: the strategy is a function of n, m, T, workload)."""
    t = max(1, private_steps)
    m, n = plan.expected_batch_size, plan.dataset_size
    sigma = plan.noise_multiplier or 0.0
    if plan.noise == "bandmf":
        sens = bandmf_sensitivity(plan.noise_coeffs, t)
        return {
            "noise": "bandmf",
            "bands": plan.bands,
            "coefficients": list(plan.noise_coeffs),
            "max_column_norm": sens,
            "effective_noise_multiplier": sigma / sens,
            "sampling": f"cyclic Poisson over {plan.bands} secret partitions, rate "
                        f"{bandmf_sampling_rate(m, n, plan.bands):.4g} per partition",
            "rounds": -(-private_steps // plan.bands),
            "accounting": "amplified BandMF (Choquette-Choo et al. 2023, Thm 4): DP-SGD at rate m·b/n, "
                          "multiplier σ / max column norm of C, ceil(T/b) rounds",
        }  # fmt: skip
    theta, omega = split_blt_params(plan.noise_coeffs)
    b = blt_min_separation(n, m)
    sens = blt_sensitivity(plan.noise_coeffs, m, n, t)
    return {
        "noise": "blt",
        "buffers": int(theta.size),
        "buf_decay": theta.tolist(),
        "output_scale": omega.tolist(),
        "min_separation": b,
        "participations": -(-t // b),
        "sensitivity": sens,
        "effective_noise_multiplier": sigma / sens if sens else math.inf,
        "sampling": f"cyclic over {b} secret partitions (one epoch of {b} steps), rate "
                    f"{bandmf_sampling_rate(m, n, b):.4g} per partition",
        "accounting": "one Gaussian release with the min-sep sensitivity of C (no amplification; McKenna 2024, "
                      "Thm 2), as jax_privacy's SingleReleaseTrainingAccountant",
    }  # fmt: skip
