"""The chunk check: on a secret share of the steps ghost's clipped sum over a random chunk is compared with
torch.func's, which catches a model that mixes only a marker row at the stated rate (docs/engine.md)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from featuredp.clipping import GhostGradients, ghost_checks
from featuredp.errors import BatchMixingError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "testing"))
from _zoo import MARKER, MarkerMixer, mlp


def xent(model: torch.nn.Module, batch: dict, draws: dict) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(model(batch["x"]), batch["y"], reduction="none")


def marker_batch(B: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, 7, generator=g)
    x[B // 3, 0] = MARKER
    return {"x": x, "y": torch.randint(0, 2, (B,), generator=g)}


def stated_detection(rate: float, B: int) -> float:
    """Per step: the chunk check runs (rate) and its chunk holds the marker row (chunk/B), or the every-step
    check's rows include it (k/B); the two draws are independent."""
    chunk = min(ghost_checks._CHUNK_CHECK_EXAMPLES, B)
    return 1 - (1 - rate * chunk / B) * (1 - ghost_checks._SEPARABILITY_EXAMPLES / B)


def count_refusals(strategy: GhostGradients, B: int, steps: int) -> int:
    torch.manual_seed(0)
    model, batch, caught = MarkerMixer(), marker_batch(B, 1), 0
    for _ in range(steps):
        try:
            strategy.clipped_sum(model, xent, batch, {}, 1.0)
        except BatchMixingError:
            caught += 1
    return caught


def test_the_stated_rate_is_at_least_one_step_in_ten():
    assert GhostGradients._chunk_check_rate >= 0.1
    assert ghost_checks._CHUNK_CHECK_EXAMPLES >= 8


def test_the_chunk_check_catches_the_marker_row_whenever_it_is_in_the_chunk():
    strategy = GhostGradients()
    strategy._chunk_check_rate = 1.0
    assert count_refusals(strategy, 32, 5) == 5  # the chunk is the whole batch of 32
    try:
        strategy.clipped_sum(MarkerMixer(), xent, marker_batch(32, 1), {}, 1.0)
    except BatchMixingError as exc:
        assert "MarkerMixer" in str(exc) and "\n" not in str(exc)  # one line naming the model
    else:
        pytest.fail("not refused")


@pytest.mark.statistical
def test_a_marker_row_is_caught_at_the_stated_rate():
    """Power: without the chunk check (rate 0) only the two-row check remains, 2/B = 6.25 % a step against
    the stated 18 %: 25 refusals expected in 400 steps, far outside the accepted range [41, 103]."""
    B, steps = 32, 400
    strategy = GhostGradients()
    strategy._secret = np.random.default_rng(20261127)  # fixed for the test only; runs use OS entropy
    p = stated_detection(GhostGradients._chunk_check_rate, B)
    caught = count_refusals(strategy, B, steps)
    sd = math.sqrt(steps * p * (1 - p))
    assert abs(caught - steps * p) <= 4 * sd, (caught, steps * p)


def test_an_ordinary_model_passes_the_chunk_check():
    strategy = GhostGradients(physical_batch_size=24)
    strategy._chunk_check_rate = 1.0
    torch.manual_seed(1)
    model = mlp()
    for seed in range(10):
        batch = marker_batch(48, seed)  # the marker value means nothing to this model
        sums, _ = strategy.clipped_sum(model, xent, batch, {}, 0.5)
        assert all(bool(torch.isfinite(s).all()) for s in sums.values())


class UnvmappableMarkerMixer(MarkerMixer):
    """The marker mixer behind a data-dependent branch, which torch.func cannot vmap: the chunk check's
    batch-of-one forwards then run as a loop, and must catch it all the same."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if bool((x[:, 0] == MARKER).any()):
            return super().forward(x)
        return self.head(torch.tanh(self.lin(x)))


def test_the_chunk_check_catches_the_marker_row_without_vmap():
    strategy = GhostGradients()
    strategy._chunk_check_rate = 1.0
    torch.manual_seed(0)
    model = UnvmappableMarkerMixer()
    for seed in range(3):
        with pytest.raises(BatchMixingError):
            strategy.clipped_sum(model, xent, marker_batch(32, seed), {}, 1.0)
    assert strategy.plan(model).alone_vmap is False  # it did fall back to the loop


def test_the_chunk_check_weights_are_secret_and_never_all_equal(monkeypatch):
    """Equal weights would let differences that sum to zero over the chunk (centring) cancel; the weights are
    ±(1 + U) times the clip factors, drawn from the strategy's secret generator."""
    seen = []
    original = GhostGradients._weighted_alone

    def spy(self, plan, model, loss_fn, batch, draws, params, weights):
        seen.append(weights.clone())
        return original(self, plan, model, loss_fn, batch, draws, params, weights)

    monkeypatch.setattr(GhostGradients, "_weighted_alone", spy)
    strategy = GhostGradients()
    strategy._chunk_check_rate = 1.0
    torch.manual_seed(1)
    model = mlp()
    for seed in range(3):
        strategy.clipped_sum(model, xent, marker_batch(48, seed), {}, 1e6)  # C large: every factor is 1
    for w in seen:
        assert bool((w.abs() >= 1).all() and (w.abs() < 2).all())
        assert bool((w > 0).any() and (w < 0).any())
    assert not torch.equal(seen[0], seen[1])


def test_the_vmap_reference_is_each_row_alone_like_the_loop():
    """The chunk check's vmap reference must be the rows' gradients alone (batches of one), exactly what the loop
    fallback computes, and not the batch's: on a model that centres over the batch the two differ."""

    class Centre(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x - x.mean(0, keepdim=True)

    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(7, 6), Centre(), torch.nn.Tanh(), torch.nn.Linear(6, 2))
    batch = marker_batch(12, 4)
    params = dict(model.named_parameters())
    weights = torch.linspace(-1.5, 1.8, 12, dtype=torch.float64)
    strategy = GhostGradients()
    plan = strategy.plan(model)
    assert plan.alone_vmap
    by_vmap = strategy._weighted_alone(plan, model, xent, batch, {}, params, weights)
    assert plan.alone_vmap  # vmap ran
    plan.alone_vmap = False
    by_loop = strategy._weighted_alone(plan, model, xent, batch, {}, params, weights)
    losses = xent(model, batch, {})
    batched = torch.autograd.grad((losses * weights.float()).sum(), list(params.values()))
    for name, v in by_vmap.items():
        torch.testing.assert_close(v, by_loop[name], rtol=1e-5, atol=1e-6)
    assert any(not torch.allclose(v, b, atol=1e-3) for v, b in zip(by_vmap.values(), batched))
