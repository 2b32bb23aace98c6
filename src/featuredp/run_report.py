"""What a run reports: its :class:`~featuredp.plan.TrainResult` (ε, δ with the noise sampler's tail, the
replace-one and record-level ε, the guarantee sentence) and the privacy report's blocks (the noise sampler, the
correlated noise, the record-level backstop, the randomness). Public quantities only: never a seed, an index, a
realised batch size or a private batch's loss. The Trainer and the PrivacyEngine both report through here.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from featuredp.accounting import sampler_max_radius, sampler_tail_delta, sampler_tail_mass
from featuredp.config import PrivacyConfig
from featuredp.features import PublicFeatureMap
from featuredp.losses import LossSplit
from featuredp.noise.sources import SecureNoise, TorchNoise
from featuredp.plan import TrainResult, inf_to_str
from featuredp.run_state import RunState
from featuredp.step import noised_coordinates

__all__ = ["randomness_report", "record_report", "run_result"]


def run_result(state: RunState, split: LossSplit | None, finished: bool, *, method: str,
           feature_map: PublicFeatureMap | None, privacy: PrivacyConfig, model: nn.Module,
           composed: Any = None) -> TrainResult:  # fmt: skip
    """The run of ``state`` as a :class:`TrainResult`: ε and the replace-one ε of the private steps run, δ with the
    noise sampler's cut tail, the record-level ε, the guarantee sentence and the privacy report (public only).
    ``composed``: the ε of every run on the model, when other runs trained it too."""
    plan = state.plan
    eps = plan.epsilon(state.private_steps) if plan.is_private else plan.epsilon(0)
    # the replace-one question (two values of one record's private part) for the same steps (docs/accounting.md)
    replacement = plan.replacement_epsilon(state.private_steps if plan.is_private else 0)
    disclosure = None if feature_map is None else feature_map.describe()
    report: dict[str, Any] = {
        "feature_map": None if disclosure is None else disclosure.to_dict(),
        "loss_split": None if split is None else split.describe(),
        "accounting": "public batches and public pre-training read Ψ(S) only and add no privacy event",
        "randomness": randomness_report(privacy),
    }
    delta = plan.delta if plan.is_private else None  # a backstop gives the public method a δ: record level only
    if plan.is_private and delta is not None:
        # The guarantee covers what the noise sampler cannot produce: its cut tail's mass η over every
        # noise pair this run drew turns (ε, δ) into (ε, δ + (1 + e^ε)·η) (featuredp.accounting.sampler).
        # Correlated noise too (BandMF, BLT): the mechanism releases C x + z, and z comes from the same source,
        # the same number of fresh normals per step (dim), so the count and the per-pair mass are the same.
        noised = state.private_steps if plan.noise_multiplier else 0  # σ = 0 draws no noise
        dim, mass = noised_coordinates(model), state.noise.tail_mass_per_pair
        extra = sampler_tail_delta(eps, noised, dim, mass)
        report["noise_sampler"] = {
            "transform": state.noise.description,
            "max_radius": sampler_max_radius(mass),  # per pair of coordinates, in noise standard deviations
            "tail_mass_per_pair": mass,
            "noise_pairs": noised * -(-dim // 2),
            "tail_mass": sampler_tail_mass(noised, dim, mass),
            "delta_requested": delta,
            "delta_added": inf_to_str(extra),
            "delta_reported": inf_to_str(delta + extra),
            # the replace-one ε's δ: the same tail, weighted by its own e^ε
            "delta_reported_replacement": inf_to_str(delta + sampler_tail_delta(replacement, noised, dim, mass)),
            "not_covered": "the floating-point granularity of the noise (featuredp.noise)",
        }
        delta += extra
    correlated = plan.noise.report(plan, state.private_steps)
    if correlated is not None:
        report["correlated_noise"] = correlated
    if composed is not None:
        report["model_epsilon_all_runs"] = composed
    record_eps = record_report(state, report, model)
    return TrainResult(
        method=method,
        plan=plan,
        epsilon=eps,
        delta=delta,
        steps=state.private_steps if plan.is_private else max(0, state.step - plan.pretrain_steps),
        pretrain_steps=min(state.step, plan.pretrain_steps),
        stopped_early=not finished,
        stop_reason=state.stop_reason if state.stop_reason else (None if finished else "max_steps"),
        guarantee=plan.guarantee(eps, disclosure, delta=delta, record_epsilon=record_eps,
                                 replacement_epsilon=replacement).replace("{T}", str(state.private_steps)),
        privacy_report=report,
        history=list(state.history),
        record_epsilon=record_eps,
        replacement_epsilon=replacement,
    )

def record_report(state: RunState, report: dict[str, Any], model: nn.Module) -> float | None:
    """ε for whole records of the steps actually run (:meth:`PrivacyPlan.record_epsilon`), and with a backstop
    its block in ``report`` (the record-level δ adds the noise sampler's cut tail over every noised step)."""
    plan = state.plan
    main = state.private_steps if plan.is_private else max(0, state.step - plan.pretrain_steps)
    pre, pub = min(state.step, plan.pretrain_steps), plan.public_steps_of(main)
    record_eps = plan.record_epsilon(state.private_steps, pre, pub)
    report["record_epsilon"] = inf_to_str(record_eps)
    if plan.record_noise_multiplier is None:
        return record_eps
    report["accounting"] = (
        "FDP: public batches and public pre-training read Ψ(S) only and add no FDP event; record level (the "
        "backstop): every pre-training, public and private step is a Poisson-subsampled Gaussian, composed")
    assert plan.delta is not None and record_eps is not None
    noised = (state.private_steps if plan.noise_multiplier else 0) + pre + pub
    dim, mass = noised_coordinates(model), state.noise.tail_mass_per_pair
    report["record_level"] = {
        "record_epsilon": inf_to_str(record_eps),
        "target": plan.record_target_epsilon,
        "delta": inf_to_str(plan.delta + sampler_tail_delta(record_eps, noised, dim, mass)),
        "public_noise_multiplier": plan.record_noise_multiplier,
        "max_grad_norm": plan.max_grad_norm,
        "private_steps": state.private_steps if plan.is_private else 0,
        "pretrain_steps": pre,
        "pretrain_sampling_rate": plan.pretrain_sampling_rate,
        "public_steps": pub,
        "public_sampling_rate": plan.public_sampling_rate,
        "sampling": "Poisson, from a secret stream independent of the private batch's",
    }
    return record_eps

def randomness_report(p: PrivacyConfig) -> dict[str, Any]:
    """Where the private randomness came from (never the seed itself)."""
    return {
        "private": "user seed (reproducible: keep it secret)" if p.seed is not None else "OS entropy (secret)",
        "secure_rng": p.secure_rng,
        "noise": (SecureNoise if p.secure_rng else TorchNoise).description,
        "public_seed": p.public_seed,
    }
