"""One source per privacy quantity (issue 35, item 6), tested against mutations of the accounted terms.

Each test is fast and fails under a mutation that passed the rest of the suite before:
(a) the sampling rate halved inside ``PrivacyPlan.dpsgd_terms``: the printed ε, ``plan.epsilon``, the ledger's
charge and the terms are compared with dp_accounting run directly on the raw (σ, q = m/n, T);
(b) 3 % less noise in the engine (σ·0.97 at ``state.noise.add``): the std of a pure-noise update over 200k
coordinates is measured (relative standard error 1/√(2N) ≈ 0.16 %, so a 3 % deficit is ~19 standard errors).
The architecture rule that keeps every caller on the plan's path is in tests/test_architecture.py.
"""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import torch

from _fdp_synth import ZeroSplit, make_tabular
from featuredp.accounting import BudgetLedger
from featuredp.engine import Trainer
from featuredp.features import LabelPrivate
from featuredp.models import LogisticRegression


def _independent_epsilon(sigma: float, q: float, steps: int, delta: float) -> float:
    """dp_accounting on the raw mechanism, not through featuredp (the PLD at featuredp's discretisation)."""
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps
    )
    accountant = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
    accountant.compose(event)
    return float(accountant.get_epsilon(delta))


def test_printed_epsilon_ledger_charge_and_terms_are_the_raw_mechanisms(tmp_path):
    n, m, steps, sigma, delta = 300, 30, 12, 1.3, 1e-4
    truth = _independent_epsilon(sigma, m / n, steps, delta)
    ledger = BudgetLedger(tmp_path / "ledger.json", total_epsilon=50.0, delta=delta)
    res = Trainer(LogisticRegression(7, 2), "dpsgd", steps=steps, batch_size=m, noise_multiplier=sigma, delta=delta,
                  seed=0, progress=False, ledger=ledger).fit(make_tabular(n, seed=5))  # fmt: skip
    assert res.steps == steps
    assert res.plan.dpsgd_terms(steps) == (sigma, m / n, steps)
    assert math.isclose(res.plan.epsilon(steps), truth, rel_tol=2e-3)
    assert math.isclose(res.epsilon, truth, rel_tol=2e-3)
    assert math.isclose(ledger.spent(), truth, rel_tol=2e-3)


def test_calibrated_sigma_meets_the_target_on_the_raw_mechanism():
    n, m, delta, target = 300, 30, 1e-4, 2.0
    res = Trainer(LogisticRegression(7, 2), "dpsgd", steps=20, batch_size=m, target_epsilon=target, delta=delta,
                  seed=0, progress=False).fit(make_tabular(n, seed=5))  # fmt: skip
    truth = _independent_epsilon(float(res.plan.noise_multiplier), m / n, 20, delta)
    assert 0.98 * target <= truth <= target * 1.002  # calibrated on the terms that are really spent


def test_engine_noise_has_the_planned_scale_to_a_fraction_of_a_percent():
    gen = torch.Generator().manual_seed(0)
    d, k = 1000, 200  # 200,200 parameters
    data = {"x": torch.randn(40, d, generator=gen), "y": torch.randint(0, k, (40,), generator=gen)}
    torch.manual_seed(0)
    model = LogisticRegression(d, k)
    before = torch.cat([p.detach().flatten().clone() for p in model.parameters()])
    sigma, C, m = 2.0, 0.5, 10
    Trainer(model, "dpsgd", loss_split=ZeroSplit(LabelPrivate()), steps=1, batch_size=m, noise_multiplier=sigma,
            max_grad_norm=C, lr=1.0, momentum=0.0, seed=3, progress=False).fit(data)  # fmt: skip
    after = torch.cat([p.detach().flatten() for p in model.parameters()])
    noise = (before - after).double().numpy()  # = N(0, σ²C²)/m per coordinate: the gradients are exactly zero
    assert noise.size == d * k + k
    ratio = float(np.sqrt(np.mean(noise**2))) / (sigma * C / m)
    se = 1 / math.sqrt(2 * noise.size)  # ≈ 0.158 %
    assert abs(ratio - 1) < 5 * se, ratio  # σ·0.97 is 19 standard errors off
