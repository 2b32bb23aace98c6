"""The replace-one ε beside the add/remove ε: the same event at REPLACE_ONE, checked against dp_accounting itself.

Add/remove (the paper's Definition 6, the simulator) bounds "trained with x or with only Ψ(x)"; telling two values of
one record's private part apart is replace-one, and swapping them moves the clipped sum by up to 2C. A plan that
printed only the add/remove ε would understate what a two-value attacker can learn.
"""

from __future__ import annotations

import dp_accounting
import pytest

from featuredp.accounting import BudgetLedger, compute_epsilon, dpsgd_event, gaussian_event
from featuredp.accounting.bandmf import bandmf_terms
from featuredp.accounting.blt import blt_terms
from featuredp.noise import BLT, BandMF
from featuredp.plan import PrivacyPlan

_REL = dp_accounting.NeighboringRelation


def _reference(sigma: float, q: float, steps: int, delta: float, relation: object) -> float:
    """dp_accounting's own PLD accountant, independent of featuredp's adaptive discretisation."""
    acc = dp_accounting.pld.PLDAccountant(relation, value_discretization_interval=1e-3)
    event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma))
    acc.compose(dp_accounting.SelfComposedDpEvent(event, steps))
    return float(acc.get_epsilon(delta))


def _plan(**kw: object) -> PrivacyPlan:
    base: dict[str, object] = dict(method="fdp", dataset_size=100_000, expected_batch_size=1000, sampling_rate=0.01,
                                   steps=1000, noise_multiplier=1.0, max_grad_norm=1.0, delta=1e-5)
    base.update(kw)
    return PrivacyPlan(**base)  # type: ignore[arg-type]


def test_replacement_epsilon_is_dp_accountings_replace_one() -> None:
    plan = _plan()
    add, rep = plan.epsilon(), plan.replacement_epsilon()
    assert add == pytest.approx(1.83, abs=0.02)
    assert rep == pytest.approx(2.84, abs=0.02)
    assert add == pytest.approx(_reference(1.0, 0.01, 1000, 1e-5, _REL.ADD_OR_REMOVE_ONE), abs=0.02)
    assert rep == pytest.approx(_reference(1.0, 0.01, 1000, 1e-5, _REL.REPLACE_ONE), abs=0.02)


def test_replace_one_plan_states_one_epsilon_and_rdp_falls_back_to_pld() -> None:
    rep = _plan(relation="replace-one")
    assert rep.replacement_epsilon() == rep.epsilon()
    assert rep.replacement_epsilon() == pytest.approx(2.84, abs=0.02)
    # RDP has no replace-one bound under Poisson sampling: the number is PLD's, not a refusal
    assert _plan(accountant="rdp").replacement_epsilon() == pytest.approx(2.84, abs=0.02)


def test_no_guarantee_and_free_methods() -> None:
    assert _plan(method="public").replacement_epsilon() == 0.0
    assert _plan().replacement_epsilon(0) == 0.0
    assert _plan(method="nonprivate").replacement_epsilon() == float("inf")
    assert _plan(noise_multiplier=0.0).replacement_epsilon() == float("inf")


def test_bandmf_replacement_is_its_amplified_event_at_replace_one() -> None:
    coeffs = (1.0, 0.4, 0.2)
    plan = _plan(noise=BandMF(bands=3, coeffs=coeffs), steps=300)
    sigma, q, rounds = bandmf_terms(1.0, 1000, 100_000, 300, 3, coeffs)
    assert plan.replacement_epsilon() == pytest.approx(_reference(sigma, q, rounds, 1e-5, _REL.REPLACE_ONE), rel=0.01)
    assert plan.replacement_epsilon() > plan.epsilon() * 1.2


def test_blt_replacement_is_one_gaussian_at_twice_the_sensitivity() -> None:
    params = (0.9, 0.5, 0.3, 0.1)  # θ (buffer decays), ω (output scales)
    plan = _plan(noise=BLT(coeffs=params), steps=50, dataset_size=1000, expected_batch_size=100,
                 sampling_rate=0.1, noise_multiplier=3.0)
    sigma, q, count = blt_terms(3.0, params, 100, 1000, 50)
    assert (q, count) == (1.0, 1)
    # replace-one: the swapped record's rows move C·(g − g′), ‖g − g′‖ <= 2C, so σ/Δ halves to σ/(2Δ)
    assert plan.replacement_epsilon() == pytest.approx(compute_epsilon(gaussian_event(sigma / 2), 1e-5), rel=1e-6)
    assert plan.epsilon() == pytest.approx(compute_epsilon(gaussian_event(sigma), 1e-5), rel=1e-6)


def test_ledger_entries_record_the_replacement_epsilon(tmp_path) -> None:
    ledger = BudgetLedger(tmp_path / "l.json", 10.0, 1e-5)
    ledger.spend("run", event=dpsgd_event(1.0, 0.01, 1000))
    ledger.spend("generic", epsilon=0.5, delta=1e-7)
    with ledger.reserve("reserved", event=dpsgd_event(2.0, 0.01, 100)) as r:
        r.settle(event=dpsgd_event(2.0, 0.01, 50))
    run, generic, settled = ledger.records
    assert run["epsilon"] == pytest.approx(1.83, abs=0.02)
    assert run["replacement_epsilon"] == pytest.approx(2.84, abs=0.02)
    assert generic["replacement_epsilon"] is None
    assert settled["replacement_epsilon"] == pytest.approx(
        compute_epsilon(dpsgd_event(2.0, 0.01, 50), 1e-5, relation="replace-one"))
    assert settled["reserved"]["replacement_epsilon"] > settled["replacement_epsilon"]
    # charging stays in the ledger's relation (add/remove): the total is the add/remove composition
    assert ledger.relation == "add-remove"
