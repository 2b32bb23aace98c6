"""bfloat16 autocast (``precision="bf16"``): the model runs in bfloat16, the guarantee's quantities do not.

An attacker who knows that a run used bf16 looks for the places where rounding to 8 bits of mantissa
could let one record move the update by more than C: clip factors rounded up, norms taken from
rounded gradients and sums from others, or a separability check that a bf16 forward defeats.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from featuredp.clipping import GhostGradients, VmapGradients
from featuredp.clipping.base import AutocastLoss, check_precision, full_precision
from featuredp.engine import Trainer
from featuredp.errors import BatchMixingError


def _ce(model, batch, draws):
    return nn.functional.cross_entropy(model(batch["x"]), batch["y"], reduction="none")


def _mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(40, 128), nn.ReLU(), nn.Linear(128, 64), nn.GroupNorm(4, 64), nn.Tanh(),
                         nn.Linear(64, 10))  # fmt: skip


def _data(n: int, seed: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"x": 3 * torch.randn(n, 40, generator=g), "y": torch.randint(0, 10, (n,), generator=g)}


def _distance(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return math.sqrt(sum(float((a[k].double() - b[k].double()).pow(2).sum()) for k in a))


@pytest.mark.parametrize("strategy", [GhostGradients, VmapGradients], ids=["ghost", "vmap"])
def test_bf16_one_record_moves_the_clipped_sum_by_at_most_c(strategy):
    model, data, C = _mlp(), _data(129), 0.05  # every gradient is far above C: every example is clipped
    loss = AutocastLoss(_ce, "cpu")
    full, norms = strategy().clipped_sum(model, loss, data, {}, C)
    assert norms.dtype == torch.float32 and all(v.dtype == torch.float32 for v in full.values())
    assert float(norms.min()) > 10 * C
    worst = 0.0
    for i in (0, 7, 64, 128):
        keep = torch.arange(129) != i
        without, _ = strategy().clipped_sum(model, loss, {k: v[keep] for k, v in data.items()}, {}, C)
        worst = max(worst, _distance(full, without) / C)
    # bf16 clip factors (rounded to 2^-8) would overshoot by ~4e-3·C; float32 ones by ~1e-7·C.
    assert worst <= 1 + 1e-5
    assert worst > 1 - 1e-3  # a clipped record moves it by C exactly: the comparison has power


def test_bf16_ghost_norms_are_those_of_the_gradients_it_sums():
    model, data = _mlp(), _data(16)
    loss = AutocastLoss(_ce, "cpu")
    _, ghost_norms = GhostGradients().clipped_sum(model, loss, data, {}, math.inf)
    # Each example alone, under the same autocast, through plain autograd: its gradient in float32.
    alone = []
    for i in range(16):
        grads = torch.autograd.grad(loss(model, {k: v[i : i + 1] for k, v in data.items()}, {}).sum(),
                                    list(model.parameters()))  # fmt: skip
        alone.append(math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads)))
    torch.testing.assert_close(ghost_norms.double(), torch.tensor(alone, dtype=torch.float64), rtol=2e-2, atol=0)


def test_bf16_does_not_defeat_the_separability_check():
    class Centre(nn.Module):
        def forward(self, x):
            return x - x.mean(0, keepdim=True)  # mixes the batch, invisible to the layer hooks

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(40, 32), Centre(), nn.ReLU(), nn.Linear(32, 10))
    with pytest.raises(BatchMixingError):
        GhostGradients().clipped_sum(model, AutocastLoss(_ce, "cpu"), _data(32), {}, 1.0)


def test_bf16_separability_check_accepts_separable_models():
    strategy = GhostGradients()
    strategy.clipped_sum(_mlp(), AutocastLoss(_ce, "cpu"), _data(64), {}, 1.0)  # no false alarm at bf16 rounding


def test_autocast_loss_and_full_precision():
    losses = AutocastLoss(_ce, "cpu")(_mlp(), _data(4), {})
    assert losses.dtype == torch.float32 and losses.shape == (4,)
    nested = full_precision({"a": (torch.ones(2, dtype=torch.bfloat16), torch.ones(1, dtype=torch.int64))})
    assert nested["a"][0].dtype == torch.float32 and nested["a"][1].dtype == torch.int64


def test_precision_is_checked_and_recorded():
    with pytest.raises(ValueError, match="precision"):
        Trainer(_mlp(), "dpsgd", steps=1, noise_multiplier=1.0, delta=1e-5, precision="fp16", progress=False)
    with pytest.raises(ValueError, match=r"precision='bf16'.*mps"):
        check_precision("bf16", torch.device("mps"))
    t = Trainer(_mlp(), "dpsgd", steps=1, noise_multiplier=1.0, delta=1e-5, precision="bf16", progress=False)
    assert t.config()["precision"] == "bf16"


def test_bf16_training_learns_like_fp32():
    data = _data(512, seed=3)
    data["y"] = (data["x"][:, 0] > 0).long()  # a learnable label
    acc = {}
    for precision in ("fp32", "bf16"):
        model = _mlp(seed=4)
        Trainer(model, "dpsgd", steps=60, batch_size=64, noise_multiplier=0.5, max_grad_norm=1.0, delta=1e-5,
                lr=0.5, seed=0, precision=precision, progress=False).fit(data)  # fmt: skip
        with torch.no_grad():
            acc[precision] = float((model(data["x"]).argmax(1) == data["y"]).float().mean())
    assert acc["fp32"] > 0.85 and acc["bf16"] > 0.85
