"""Privacy accounting for featuredp: events, ε/δ, calibration, trade-off curves, composition, ledger.

numpy / scipy / dp-accounting only — never imports torch (a test pins this).
"""

from __future__ import annotations

from featuredp.accounting.accountant import (
    DEFAULT_RTOL,
    compute_delta,
    compute_epsilon,
    delta_for,
    epsilon_for,
)
from featuredp.accounting.calibrate import calibrate_noise_multiplier, calibrate_steps
from featuredp.accounting.events import (
    ACCOUNTANTS,
    RELATIONS,
    AccountantName,
    Relation,
    compose_events,
    dpsgd_event,
    event_from_dict,
    event_to_dict,
    gaussian_event,
)

__all__ = [
    "ACCOUNTANTS",
    "DEFAULT_RTOL",
    "RELATIONS",
    "AccountantName",
    "Relation",
    "calibrate_noise_multiplier",
    "calibrate_steps",
    "compose_events",
    "compute_delta",
    "compute_epsilon",
    "delta_for",
    "dpsgd_event",
    "epsilon_for",
    "event_from_dict",
    "event_to_dict",
    "gaussian_event",
]
