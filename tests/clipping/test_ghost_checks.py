"""Ghost clipping's every-step separability check (clipping/ghost_checks.py) on rounding at a kink.

Where the batch's kernel and a single row's round differently (PyTorch's CPU convolution runs NNPACK's Winograd
kernel on 16 rows or more where oneDNN is off, a direct one on one row: float32 results ~1e-5 apart), a unit whose
pre-activation lies within that of a ReLU's kink (or a max-pool window within it of a tie) takes the other branch
in the batch than alone, and the example's gradient moves by a whole unit's share (0.2-5% in the Opacus tutorial's
CNN on digits, 1.3 to 40 times the check's tolerance: a false BatchMixingError in 2 of 16 runs of
test_opacus_tutorials.py's loop with NNPACK, none in 16 since).
Float64 alone takes the same branch as float32 alone, so the alone-side rounding retry could not explain it.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from featuredp.clipping import GhostGradients
from featuredp.errors import BatchMixingError


class BatchKernelRounding(nn.Module):
    """The identity, rounded as a batch kernel rounds it: a float32 batch of more than one row comes out 1e-5 off
    (NNPACK's Winograd error at this scale); one row, and float64 (rounding ~1e-16), exactly."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 1e-5 if x.dtype == torch.float32 and x.shape[0] > 1 else x


class Mix(nn.Module):
    """Mixes the batch a little (2.5% of the other row's activations at two rows): what the check must refuse."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 0.05 * x.mean(0, keepdim=True)


def _loss(model, batch, draws):
    return nn.functional.cross_entropy(model(batch["x"]), batch["y"], reduction="none")


def _kinked(*mix: nn.Module) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """An MLP and two rows; row 0's first hidden unit sits 5e-6 below the ReLU's kink: closed alone (float32 and
    float64), open in the batch. Row 1 and every other unit are far from it (checked below)."""
    torch.manual_seed(0)
    first, last = nn.Linear(4, 8), nn.Linear(8, 3)
    batch = {"x": torch.randn(2, 4), "y": torch.tensor([0, 2])}
    with torch.no_grad():
        w, x0 = first.weight[0].double(), batch["x"][0].double()
        first.bias[0] = float(-(w @ x0) - 5e-6)
        z = first(batch["x"])
    assert float(z[0, 0]) < 0 < float(z[0, 0]) + 1e-5
    assert float(z.abs().flatten()[1:].min()) > 1e-3  # no other unit near the kink
    return nn.Sequential(first, BatchKernelRounding(), nn.ReLU(), *mix, last), batch


def _flat_grads(model: nn.Module, loss: torch.Tensor) -> torch.Tensor:
    return torch.cat([g.flatten() for g in torch.autograd.grad(loss, list(model.parameters()))]).double()


def test_an_honest_model_with_a_unit_at_a_kink_is_not_refused_as_mixing(monkeypatch):
    model, batch = _kinked()
    # The premise: row 0's gradient in the batch differs from its gradient alone by far more than rounding.
    in_batch = _flat_grads(model, _loss(model, batch, {})[0])
    alone = _flat_grads(model, _loss(model, {k: v[:1] for k, v in batch.items()}, {}).sum())
    assert float((in_batch - alone).norm()) > 0.05 * float(alone.norm())  # 50 times the check's 1e-3
    for _ in range(4):  # both rows are checked on every call (two rows); the chunk check on a secret 1 in 8
        GhostGradients().clipped_sum(model, _loss, batch, {}, 1.0)
    # What refused it before: the rounding allowance measured alone only (float32 and float64 agree there).
    monkeypatch.setattr(GhostGradients, "_batch_rounding_noise", staticmethod(lambda *args: None))
    with pytest.raises(BatchMixingError):
        GhostGradients().clipped_sum(model, _loss, batch, {}, 1.0)


def test_the_kink_allowance_does_not_excuse_mixing(monkeypatch):
    # The batch-side allowance is what rounding does to each row's gradient in the batch (row 0's flip, and the
    # share of it that the mixing carries into row 1): mixing itself is in float64 as in float32, not in it, and
    # a model that mixes 2.5% is refused as before though one of its checked rows is at a kink.
    measured: list[np.ndarray] = []
    original = GhostGradients._batch_rounding_noise

    def spy(*args):
        noise = original(*args)
        measured.append(noise.cpu().numpy())
        return noise

    monkeypatch.setattr(GhostGradients, "_batch_rounding_noise", staticmethod(spy))
    model, batch = _kinked(Mix())
    with pytest.raises(BatchMixingError, match="mixes examples"):
        GhostGradients().clipped_sum(model, _loss, batch, {}, 1.0)
    assert measured and measured[0][0] > 1e-2  # the kink's allowance was there, and did not excuse it
