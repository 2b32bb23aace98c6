"""Backward hooks and saved-tensor hooks in a private forward are refused by ghost clipping, on every step.

An attacker's view: ghost clipping reads per-example gradients from one backward pass of the forward's graph.
A hook attached to that graph during the forward runs arbitrary code on those gradients (here: it scales the
gradient of one example by 1e6 after the clip factors would have been computed), so every such attachment must
be refused, on the first step and on every later one.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from featuredp.clipping import GhostGradients
from featuredp.errors import BatchMixingError


def sq_loss(model: nn.Module, batch: dict, draws: dict) -> torch.Tensor:
    return model(batch["x"]).pow(2).sum(1)


class Counter:
    """Forward calls, kept outside the module's state (the forward guard refuses a forward that changes it)."""

    n = 0


class Hooked(nn.Module):
    """Registers, from its ``start``-th call on, a hook that scales example 0's gradient at the hidden layer."""

    def __init__(self, how: str = "tensor", start: int = 0) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 8), nn.Linear(8, 2)
        self.how, self.start, self.calls = how, start, Counter()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.a(x))
        self.calls.n += 1
        if self.calls.n > self.start:

            def scale(g: torch.Tensor) -> torch.Tensor:
                g = g.clone()
                g[0] *= 1e6
                return g

            if self.how == "tensor":
                h.register_hook(scale)
            elif self.how == "multi":
                torch.autograd.graph.register_multi_grad_hook([h], lambda gs: None)
            elif self.how == "node":
                h.grad_fn.register_prehook(lambda go: (scale(go[0]),))
            elif self.how == "saved":
                with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t * 2):
                    h = torch.tanh(h)
        return self.b(h)


@pytest.mark.parametrize("how", ["tensor", "multi", "node"])
def test_a_backward_hook_added_in_the_forward_is_refused_naming_it(how):
    x = torch.randn(6, 4)
    with pytest.raises(BatchMixingError, match="private forward called Tensor") as info:
        GhostGradients().clipped_sum(Hooked(how), sq_loss, {"x": x}, {}, 1.0)
    assert "\n" not in str(info.value) and "Hooked" in str(info.value)


def test_a_saved_tensor_hook_in_the_forward_is_refused():
    with pytest.raises(RuntimeError, match="saved-tensor hooks"):
        GhostGradients().clipped_sum(Hooked("saved"), sq_loss, {"x": torch.randn(6, 4)}, {}, 1.0)
    outer = torch.autograd.graph.save_on_cpu()  # an outer one edits the private forward's saved tensors too
    with outer, pytest.raises(RuntimeError, match="saved-tensor hooks"):
        GhostGradients().clipped_sum(Hooked("none"), sq_loss, {"x": torch.randn(6, 4)}, {}, 1.0)


@pytest.mark.parametrize("physical", [None, 2])
def test_a_hook_added_on_a_later_step_is_refused_on_that_step(physical):
    """The guard is not a first-step check: a model that starts hooking on its 5th forward is refused then,
    even with the separability cross-check (which might not look at example 0) switched off."""
    model = Hooked("tensor", start=4)
    strategy = GhostGradients(physical_batch_size=physical)
    strategy._check_separability = False
    x = torch.randn(6, 4)
    for _ in range(50):
        try:
            strategy.clipped_sum(model, sq_loss, {"x": x}, {}, 1.0)
        except BatchMixingError:
            break
    else:
        pytest.fail("the hook was never refused")
    assert model.calls.n == 5  # refused on the first forward that registered it


def test_a_module_backward_hook_is_refused_and_a_plain_model_is_not():
    model = Hooked("none")
    x = torch.randn(6, 4)
    sums, _ = GhostGradients().clipped_sum(model, sq_loss, {"x": x}, {}, 1.0)  # no hook: accepted
    assert set(sums) == {"a.weight", "a.bias", "b.weight", "b.bias"}
    model.a.register_full_backward_hook(lambda m, gi, go: None)
    with pytest.raises(BatchMixingError, match="grad_fn"):
        GhostGradients().clipped_sum(model, sq_loss, {"x": x}, {}, 1.0)


def test_the_unchecked_second_backward_is_gone():
    """reweight="backward" summed Σ c_i ℓ_i in a second backward that a hook could edit (measured: one record
    moved the sum by 2.85e7·C); the option is refused, so the sum always comes from the checked pass."""
    with pytest.raises(ValueError, match="reweight"):
        GhostGradients(reweight="backward")  # type: ignore[arg-type]
