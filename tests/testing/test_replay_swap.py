"""The replay's swap check: replacing one record's private part (Ψ(x) kept) moves the clipped sum by up to 2C.

Add/remove (the record vs only its public view) moves it by at most C; telling two values of the private part apart
is replace-one, and a crafted pair moves the sum well past C. So a replacement ε accounted at sensitivity C would
understate the swap: the check's bound is the accountant's replace-one sensitivity, and a mutant that set it to C is
caught on the crafted pair.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from _zoo import mlp
from torch import nn

import featuredp.testing.replay as replay_module
from _fdp_synth import make_tabular
from featuredp.clipping import STRATEGIES
from featuredp.engine import Trainer
from featuredp.features import Columns
from featuredp.losses import Masking
from featuredp.methods import PRIVATE_METHODS
from featuredp.testing import replay_step

RECORD, DONOR = 5, 6
BATCH = list(range(10, 34))


class Centred(nn.Module):
    """A linear model on the columns centred at 0.5 (one-hot columns become ±0.5): zero weights at the start."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(7, 2, bias=False)
        nn.init.zeros_(self.lin.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x - 0.5)


def crafted():
    """x: sex=F, race=a; the donor: sex=M, race=c, the same label; public columns at the centre (0.5)."""
    data = make_tabular(64, seed=1)
    data.X[RECORD] = [0.5, 0.5, 1.0, 0.0, 1.0, 0.0, 0.0]
    data.X[DONOR] = [-3.0, 2.0, 0.0, 1.0, 0.0, 0.0, 1.0]
    data.y[DONOR] = data.y[RECORD]
    return data


def _trainer(model, method="fdp", strategy="vmap", C=0.1, *, centred=False):
    fmap = Columns(["sex", "race"])
    # centred: ℓ_pub fills the private columns with the model's centre 0.5 (a public constant), so the private
    # term is the whole loss's gradient on x's own private columns
    extra = {} if method == "dpsgd" else (
        {"loss_split": Masking(fmap, fill="mean", mean=[0.5] * 7)} if centred else {"feature_map": fmap})
    return Trainer(model, method, steps=5, batch_size=16, noise_multiplier=1.0, max_grad_norm=C, delta=1e-4,
                   strategy=strategy, progress=False, **extra)  # fmt: skip


def _swap(report):
    return {c.name: c for c in report.checks}["swap sensitivity"]


@pytest.mark.parametrize("strategy", list(STRATEGIES))
@pytest.mark.parametrize("method", PRIVATE_METHODS)
def test_ordinary_models_pass_the_swap_check(method, strategy):
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = replay_step(_trainer(mlp(), method, strategy), make_tabular(64, seed=1), record=RECORD, batch=BATCH)
    assert r.outcome == "passed", str(r)
    check = _swap(r)
    assert check.ok and check.bound == pytest.approx(0.2, rel=1e-3) and 0 < check.value <= check.bound


@pytest.mark.parametrize("method", ["fdp", "fdp_dpsgd"])
def test_a_crafted_swap_moves_the_sum_by_more_than_C(method):
    """Swapping sex and race (public columns kept) moves the clipped sum by about 1.8 C: the replace-one
    sensitivity is genuinely above C, so a replacement ε accounted at C would be wrong."""
    r = replay_step(_trainer(Centred(), method, centred=True), crafted(), record=RECORD, batch=BATCH,
                    swap_with=DONOR)  # fmt: skip
    assert r.outcome == "passed", str(r)
    check = _swap(r)
    assert check.value > 1.5 * 0.1  # > C (0.1): beyond the add/remove bound
    assert check.value <= 2 * 0.1 * (1 + 1e-3)
    assert {c.name: c for c in r.checks}["clipped sum sensitivity"].value <= 0.1 * (1 + 1e-3)


def test_a_check_at_sensitivity_C_is_caught(monkeypatch):
    """The mutant: the replace-one sensitivity set to 1 (C). The crafted swap exceeds it and the replay fails."""
    monkeypatch.setattr(replay_module, "_SENSITIVITY", {"add-remove": 1.0, "replace-one": 1.0})
    r = replay_step(_trainer(Centred(), centred=True), crafted(), record=RECORD, batch=BATCH, swap_with=DONOR)
    assert r.outcome == "failed" and [c.name for c in r.failures()] == ["swap sensitivity"]


def test_the_swap_keeps_the_public_view_and_a_bad_donor_is_named():
    data = crafted()
    with pytest.raises(ValueError, match="swap_with=5 must be an index"):
        replay_step(_trainer(Centred()), data, record=RECORD, batch=BATCH, swap_with=RECORD)
    fmap = Columns(["sex", "race"]).bind(data)
    batch = {"x": torch.as_tensor(data.X), "y": torch.as_tensor(data.y)}
    swapped, donor = replay_module._swapped(fmap, batch, RECORD, DONOR)
    assert donor == DONOR
    one = {k: v[RECORD : RECORD + 1] for k, v in batch.items()}
    two = {k: v[RECORD : RECORD + 1] for k, v in swapped.items()}
    assert all(torch.equal(fmap(one)[k], fmap(two)[k]) for k in fmap(one))  # Ψ(x') = Ψ(x)
    assert not torch.equal(one["x"], two["x"])  # and the private part did change
