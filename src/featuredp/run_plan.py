"""The plan of a run: σ calibrated on the plan's own accounted terms, the batch sizes, the backstop's σ_pub.

:func:`run_plan` turns a run's settings (:class:`featuredp.config.PrivacyConfig`, :class:`featuredp.config.
ScheduleConfig`) and its data's size (records, or users at user level) into the :class:`featuredp.plan.PrivacyPlan`
that every ε, the ledger, the budget stop and the audits read. :class:`featuredp.run.PrivateRun` asks for it when a
run starts; nothing here reads the data beyond its size.
"""

from __future__ import annotations

import math
from dataclasses import replace

from featuredp._validate import check_delta, check_int
from featuredp.accounting import calibrate_record_noise, check_sampler_tail
from featuredp.config import PrivacyConfig, ScheduleConfig
from featuredp.errors import DataValidationError, UnreachableTargetError
from featuredp.methods import Method, get_method
from featuredp.noise import Independent
from featuredp.noise.sources import SecureNoise, TorchNoise
from featuredp.plan import PrivacyPlan
from featuredp.users import UserIndex

__all__ = ["PUBLIC_BATCH_FACTOR", "run_plan"]

#: Algorithm 1's default public batch m' as a multiple of the expected private batch m (at most n)
PUBLIC_BATCH_FACTOR = 4


def run_plan(method: str, privacy: PrivacyConfig, schedule: ScheduleConfig, n: int, *,
             users: UserIndex | None = None, noised: int) -> PrivacyPlan:
    """The privacy plan of a run of ``method`` on ``n`` records (σ calibrated when only a target is given; the
    backstop's σ_pub); with ``users`` the plan counts users (its size, batch and rate are the users'). ``noised``:
    the number of noised coordinates (the sampler's cut tail is checked against it)."""
    n = check_int("dataset_size", n, minimum=1)
    if schedule.dataset_size is not None and schedule.dataset_size != n:
        raise DataValidationError(f"dataset_size={schedule.dataset_size} was declared but the data holds {n} records")
    if users is None:
        return _unit_plan(method, privacy, schedule, n, "records", noised)
    plan = _unit_plan(method, privacy, schedule, users.num_users, "users", noised)
    return replace(plan, unit="user", records=n, records_per_user=privacy.records_per_user)


def _unit_plan(method: str, p_cfg: PrivacyConfig, s_cfg: ScheduleConfig, n: int, units: str,
               noised: int) -> PrivacyPlan:  # fmt: skip
    """The plan for ``n`` privacy units (``units``: what they are, for the messages)."""
    record = get_method(method)
    p, m, m_pub, m_pre = _batch_sizes(s_cfg, n, record, units)
    steps = s_cfg.steps if s_cfg.steps is not None else max(1, round(float(s_cfg.epochs or 0.0) * n / m))
    pretrain = round(s_cfg.pretrain_epochs * n / m_pre) if s_cfg.pretrain_epochs else 0
    delta = p_cfg.delta
    if delta is not None and record.private:
        delta = check_delta(delta, n)  # warns (PrivacyRiskWarning) when delta >= 1/n
    sigma, budget = p_cfg.noise_multiplier, None
    noise = p_cfg.noise_plan if record.private else Independent()
    if record.private:
        assert delta is not None  # checked in __init__
        # the workload: SGD momentum's, else the prefix sums (Adam is not linear)
        noise = noise.planned(n, m, steps, target_epsilon=p_cfg.target_epsilon, delta=delta,
                              momentum=s_cfg.momentum if s_cfg.optimizer == "sgd" else 0.0,
                              relation=p_cfg.relation, accountant=p_cfg.accountant)  # fmt: skip
        # σ and the step budget are calibrated on the plan's own accounted terms (the noise plan's, through
        # PrivacyPlan.dpsgd_terms), the ones its ε, the ledger and the audits read; never overshooting.
        accounted = PrivacyPlan(method, n, m, p, steps, noise_multiplier=1.0 if sigma is None else sigma,
                                delta=delta, relation=p_cfg.relation, accountant=p_cfg.accountant,
                                noise=noise)  # fmt: skip
        if sigma is None:
            assert p_cfg.target_epsilon is not None  # checked in __init__
            sigma = accounted.calibrated_noise_multiplier(p_cfg.target_epsilon)
            budget = steps
        elif p_cfg.target_epsilon is not None:
            if sigma == 0:
                raise ValueError("noise_multiplier=0 cannot meet any target_epsilon; drop target_epsilon")
            budget = accounted.affordable_steps(p_cfg.target_epsilon)
        if sigma and math.isinf(p_cfg.max_grad_norm):
            raise ValueError("max_grad_norm=inf (no clipping) has unbounded sensitivity; it is only allowed "
                             "with noise_multiplier=0 (a non-private reference run)")
    weight = p_cfg.public_weight if record.public_batch else 1.0
    uses_public = record.public_steps or (record.public_batch and weight > 0) or pretrain > 0
    backstop = p_cfg.record_epsilon is not None
    if backstop and not record.private:  # the public method's steps become DP steps: they need C and δ
        if delta is None:
            raise ValueError("record_epsilon (the record-level backstop) needs delta=")
        delta = check_delta(delta, n)
        if math.isinf(p_cfg.max_grad_norm):
            raise ValueError("record_epsilon (the record-level backstop) needs a finite max_grad_norm")
    if backstop and record.private and not sigma:
        raise ValueError("record_epsilon (the record-level backstop) needs noise on the private steps, got "
                         f"noise_multiplier={sigma!r}")  # fmt: skip
    plan = PrivacyPlan(
        method=method,
        dataset_size=n,
        expected_batch_size=m,
        sampling_rate=p,
        steps=steps,
        pretrain_steps=pretrain,
        public_batch_size=m_pub if uses_public else None,
        pretrain_batch_size=m_pre if pretrain else None,
        noise_multiplier=sigma if record.private else None,
        max_grad_norm=p_cfg.max_grad_norm if record.private or backstop else None,
        alpha=p_cfg.alpha if record.public_batch else 1.0,
        public_weight=weight,
        delta=delta if record.private or backstop else None,
        target_epsilon=p_cfg.target_epsilon if record.private else None,
        budget_steps=budget,
        relation=p_cfg.relation,
        accountant=p_cfg.accountant,
        noise=noise,
        record_target_epsilon=p_cfg.record_epsilon,
    )
    if backstop:
        plan = _backstop_plan(plan)
    if record.private and sigma:
        # What the noise sampler cannot produce is added to the reported δ (ARCHITECTURE rule 12); refuse up
        # front a run whose ε is so large that this tail would be more than a sliver of δ.
        assert delta is not None  # checked in __init__
        most = steps if budget is None else min(steps, budget)
        eps = p_cfg.target_epsilon if p_cfg.target_epsilon is not None else plan.epsilon(most)
        check_sampler_tail(eps, delta, most, noised, noise_multiplier=sigma,
                           tail_mass_per_pair=(SecureNoise if p_cfg.secure_rng else TorchNoise).tail_mass_per_pair)
    return plan

def _batch_sizes(s_cfg: ScheduleConfig, n: int, record: Method, units: str) -> tuple[float, float, int, int]:
    """(p, m, m', m_pre): the sampling rate, the expected private batch, the public and pre-training batches,
    each checked against the ``n`` units."""
    if s_cfg.sampling_rate is not None:
        p = s_cfg.sampling_rate
        m = p * n
    else:
        batch = int(s_cfg.batch_size or 256)
        if batch > n:
            raise DataValidationError(f"batch_size must be <= the number of {units} {n}, got {batch}")
        m = float(batch)
        p = m / n
    if s_cfg.public_batch_size is not None:
        m_pub = s_cfg.public_batch_size
    elif record.public_batch:
        # Algorithm 1's public batch costs compute, not privacy: by default 4·m (at most n), so that its own
        # sampling noise stays below the DP noise (docs/engine.md, "The public batch").
        m_pub = min(n, max(1, round(PUBLIC_BATCH_FACTOR * m)))
    else:
        m_pub = max(1, round(m))
    if m_pub > n:
        raise DataValidationError(f"public_batch_size must be <= the number of {units} {n}, got {m_pub}")
    # Pre-training keeps its own batch (default: a given m', else m), so a larger m' costs no pre-training steps.
    m_pre = s_cfg.pretrain_batch_size or s_cfg.public_batch_size or max(1, round(m))
    if m_pre > n:
        raise DataValidationError(f"pretrain_batch_size must be <= the number of {units} {n}, got {m_pre}")
    return p, m, m_pub, m_pre

def _backstop_plan(plan: PrivacyPlan) -> PrivacyPlan:
    """``plan`` with σ_pub calibrated so that the whole run is (E, δ)-DP for whole records (E =
    ``record_epsilon``): the private steps' and the noised public steps' Poisson Gaussians composed, never
    above E (:func:`featuredp.accounting.calibrate_record_noise`). ``dpsgd`` is already record-level DP: E is
    only checked against its ε. The FDP ε is unchanged: public steps read Ψ(S) only."""
    target = plan.record_target_epsilon
    assert target is not None and plan.delta is not None
    terms = plan.record_terms()
    if not get_method(plan.method).needs_feature_map or (terms["pretrain"][1] <= 0 and terms["public"][1] <= 0):
        eps = plan.record_epsilon()
        if eps is not None and eps > target:
            raise UnreachableTargetError(
                f"--record-epsilon {target:g} cannot be met: the private steps alone are ({eps:.4g}, "
                f"{plan.delta:g})-DP at record level; give a larger --record-epsilon"
            )
        return plan
    sigma = calibrate_record_noise(target, plan.delta, **terms, relation=plan.relation,
                                   accountant=plan.accountant)  # fmt: skip
    return replace(plan, record_noise_multiplier=sigma)
