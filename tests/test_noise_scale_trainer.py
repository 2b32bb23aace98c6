"""A fast check of the noise scale in the Trainer's step: the released update carries N(0, (σC/m)²) per coordinate.

Only the slow replay test caught a step that adds 3 % less noise than the plan accounts; an attacker who reads the
released model gets exactly that gap for free (ε is computed for σ, the model is released at 0.97σ). Here the
clipped sum is known to be zero, so the update IS the noise: a model whose input is all zeros has zero gradient for
every weight (∂ℓ/∂W = (∂ℓ/∂logits)·xᵀ = 0), whatever the labels. One plain SGD step (lr 1, no momentum) from W = 0
leaves W = −(Σ clip(0) + N(0, σ²C²))/m = −noise/m, in float32. With 10⁶ weights the sample std has a relative
standard error of 1/√(2·10⁶) ≈ 0.07 %, so the ±1 % band is 14 standard errors wide on each side and a 3 % deficit
is 28 standard errors outside it: the seeded run cannot be near the edge by chance.

Only the public Trainer API is used (Trainer(...), fit, trainer.model).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from featuredp import Trainer
from featuredp.errors import PrivacyRiskWarning
from featuredp.noise import SecureNoise, TorchNoise

WIDTH = 1000  # a WIDTH×WIDTH weight: 10⁶ noised coordinates
N, M, SIGMA, C = 200, 10, 1.3, 0.7


def _released_weight(secure: bool) -> torch.Tensor:
    model = nn.Linear(WIDTH, WIDTH, bias=False)
    nn.init.zeros_(model.weight)
    torch.manual_seed(0)
    data = {"x": torch.zeros(N, WIDTH), "y": torch.randint(0, WIDTH, (N,))}
    # A seeded private run (fixed, so the test is deterministic): the warning says such a seed must stay secret.
    with pytest.warns(PrivacyRiskWarning):
        trainer = Trainer(model, "dpsgd", steps=1, batch_size=M, noise_multiplier=SIGMA, max_grad_norm=C, delta=1e-5,
                          lr=1.0, momentum=0.0, seed=0, secure_rng=secure, progress=False)  # fmt: skip
    trainer.fit(data)
    return trainer.model.weight.detach().to(torch.float64).flatten()


def _noise_std_ratio(secure: bool = False) -> tuple[float, float]:
    """(std of the released weights ÷ σC/m, their mean in units of the expected std's standard error)."""
    w = _released_weight(secure)
    want = SIGMA * C / M
    return float(w.std()) / want, float(w.mean()) / (want / w.numel() ** 0.5)


@pytest.mark.parametrize("secure", [False, True])
def test_the_trainer_adds_sigma_c_over_m_of_noise_per_coordinate(secure):
    ratio, mean_in_se = _noise_std_ratio(secure)
    assert abs(ratio - 1.0) < 0.01, f"the update's noise std is {ratio:.4f}·σC/m (secure_rng={secure})"
    assert abs(mean_in_se) < 6, f"the update is not centred on the zero clipped sum: mean = {mean_in_se:.1f} SE"


def test_the_check_fails_when_the_step_adds_three_percent_less_noise(monkeypatch):
    # The mutation the slow replay test used to be the only one to catch: every source draws at 0.97·std.
    for cls in (TorchNoise, SecureNoise):
        real = cls.add
        monkeypatch.setattr(cls, "add", lambda self, sums, std, _real=real: _real(self, sums, 0.97 * std))
    ratio, _ = _noise_std_ratio()
    assert abs(ratio - 0.97) < 0.005 and not abs(ratio - 1.0) < 0.01
