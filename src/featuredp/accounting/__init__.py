"""Privacy accounting for featuredp: events, ε/δ, calibration, trade-off curves, composition, ledger.

numpy / scipy / dp-accounting only — never imports torch (a test pins this).

Contract used by the engine and the ERM baselines (see DEVELOPING.md)::

    dpsgd_event(noise_multiplier, sampling_rate, steps) -> DpEvent
    compose_events(*events) -> DpEvent
    compute_epsilon(event, delta, *, relation="add-remove", accountant="pld") -> float
    compute_delta(event, epsilon, *, relation="add-remove", accountant="pld") -> float
    epsilon_for(noise_multiplier, sampling_rate, steps, delta, *, relation, accountant) -> float
    calibrate_noise_multiplier(target_epsilon, delta, sampling_rate, steps, *, relation, accountant) -> float
    calibrate_steps(target_epsilon, delta, sampling_rate, noise_multiplier, *, relation, accountant) -> int
    sampler_tail_delta(epsilon, steps, dimension, tail_mass_per_pair) -> float   # δ of the noise sampler's cut tail
    group_epsilon(noise_multiplier, sampling_rate, steps, delta, group_size) -> float  # ε of a group of k records
    calibrate_record_noise(target, delta, *, private, pretrain, public) -> σ_pub  # the backstop (record level)
"""

from __future__ import annotations

from featuredp.accounting.accountant import (
    DEFAULT_RTOL,
    compute_delta,
    compute_epsilon,
    delta_for,
    epsilon_for,
    privacy_profile,
)
from featuredp.accounting.calibrate import calibrate_noise_multiplier, calibrate_steps
from featuredp.accounting.composition import (
    advanced_composition,
    amplify_by_subsampling,
    basic_composition,
    parallel_composition,
)
from featuredp.accounting.events import (
    ACCOUNTANTS,
    RELATIONS,
    AccountantName,
    DpEvent,
    Relation,
    compose_events,
    dpsgd_event,
    event_from_dict,
    event_to_dict,
    gaussian_event,
)
from featuredp.accounting.group import GroupBound, group_bound, group_epsilon
from featuredp.accounting.ledger import BudgetLedger, Reservation
from featuredp.accounting.record import calibrate_record_noise, record_epsilon, record_event
from featuredp.accounting.sampler import (
    bounded_sampler_delta,
    check_sampler_tail,
    sampler_max_radius,
    sampler_tail_delta,
    sampler_tail_mass,
)
from featuredp.accounting.tradeoff import (
    attribute_inference_bound,
    attribute_inference_bound_eps_delta,
    delta_from_tradeoff,
    epsilon_delta_tradeoff,
    epsilon_from_tradeoff,
    gaussian_tradeoff,
    plot_tradeoff,
    tradeoff_curve,
    tradeoff_from_profile,
)

__all__ = [
    "ACCOUNTANTS",
    "DEFAULT_RTOL",
    "RELATIONS",
    "AccountantName",
    "BudgetLedger",
    "DpEvent",
    "GroupBound",
    "Relation",
    "Reservation",
    "advanced_composition",
    "amplify_by_subsampling",
    "attribute_inference_bound",
    "attribute_inference_bound_eps_delta",
    "basic_composition",
    "bounded_sampler_delta",
    "calibrate_noise_multiplier",
    "calibrate_record_noise",
    "calibrate_steps",
    "check_sampler_tail",
    "compose_events",
    "compute_delta",
    "compute_epsilon",
    "delta_for",
    "delta_from_tradeoff",
    "dpsgd_event",
    "epsilon_delta_tradeoff",
    "epsilon_for",
    "epsilon_from_tradeoff",
    "event_from_dict",
    "event_to_dict",
    "gaussian_event",
    "gaussian_tradeoff",
    "group_bound",
    "group_epsilon",
    "parallel_composition",
    "plot_tradeoff",
    "privacy_profile",
    "record_epsilon",
    "record_event",
    "sampler_max_radius",
    "sampler_tail_delta",
    "sampler_tail_mass",
    "tradeoff_curve",
    "tradeoff_from_profile",
]
