"""The own loop makes one forward of the batch a step (ghost): the user's call of the model is the forward the clipped
sum differentiates, and nothing about the step changes.

An attacker's angle: a captured forward that went stale (a parameter, the input or the output written between the
call and ``backward()``) would clip gradients of a batch other than the one the loss names. Every such write must
make the engine run the model again, and every step must release what the uncaptured step releases, bit for bit.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from featuredp import PrivacyEngine
from featuredp.own_loop_forward import OneForward

N, D, BATCH, STEPS, SEED = 400, 6, 40, 5, 99


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, D, generator=g)
    return x, (x[:, 0] - x[:, 3] > 0).long()


def _mlp() -> nn.Module:
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(D, 16), nn.ReLU(), nn.Linear(16, 2))


def _cnn() -> nn.Module:
    torch.manual_seed(3)
    return nn.Sequential(nn.Unflatten(1, (1, 2, 3)), nn.Conv2d(1, 4, 2, padding=1), nn.GroupNorm(4, 4), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 2))  # fmt: skip


class _Counter:
    """Counts the model's calls on a whole drawn batch (the checks' calls on one record or one row are not)."""

    def __init__(self, model: nn.Module) -> None:
        self.whole, self.sizes = 0, []
        model.register_forward_pre_hook(self)

    def __call__(self, module: nn.Module, args: tuple) -> None:
        rows = int(args[0].shape[0])
        if self.sizes and rows == self.sizes[-1] and rows > 1:
            self.whole += 1

    def expect(self, rows: int) -> None:
        self.sizes.append(rows)


def _private(model: nn.Module, steps: int = STEPS) -> tuple[PrivacyEngine, tuple]:
    """Opacus's tutorial ``make_private`` of ``model`` on the test data (ghost); the engine and (m, o, c, loader)."""
    x, y = _data()
    engine = PrivacyEngine(seed=SEED)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = engine.make_private(
            module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.2),
            data_loader=DataLoader(TensorDataset(x, y), batch_size=BATCH), criterion=nn.CrossEntropyLoss(),
            noise_multiplier=1.0, max_grad_norm=1.0, grad_sample_mode="ghost", steps=steps)  # fmt: skip
    return engine, out


def _train(model: nn.Module, *, capture: bool = True, meddle: str | None = None) -> tuple[nn.Module, list[int]]:
    """STEPS steps of the tutorial loop; returns the model and the whole-batch forwards of each step."""
    counter = _Counter(model)
    engine, (m, o, c, loader) = _private(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if not capture:
            engine._one_forward._tensor_output = False  # the engine's fallback: a forward without a graph
        per_step = []
        done = 0
        while done < STEPS:
            for xb, yb in loader:
                counter.expect(len(xb))
                before = counter.whole
                o.zero_grad()
                out = m(xb)
                if meddle == "input":
                    xb.mul_(1.0)  # an in-place write (same values) after the call
                elif meddle == "output":
                    out.mul_(1.0)
                elif meddle == "parameter":
                    with torch.no_grad():
                        model[-1].bias.add_(0.0)
                c(out, yb).backward()
                o.step()
                per_step.append(counter.whole - before)
                done += 1
                if done == STEPS:
                    break
    return model, per_step


@pytest.mark.parametrize("make", [_mlp, _cnn], ids=["mlp", "cnn-groupnorm"])
def test_one_forward_of_the_batch_a_step_and_the_same_parameters_as_two(make):
    one, forwards = _train(make())
    two, forwards_before = _train(make(), capture=False)
    assert forwards == [1] * STEPS
    assert forwards_before == [2] * STEPS  # the user's call, then the strategy's
    for a, b in zip(one.parameters(), two.parameters(), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("meddle", ["input", "output", "parameter"])
def test_a_write_between_the_call_and_backward_runs_the_model_again(meddle):
    model, forwards = _train(_mlp(), meddle=meddle)
    reference, _ = _train(_mlp(), capture=False)
    assert forwards == [2] * STEPS  # the capture went stale: the strategy's own forward
    for a, b in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.equal(a, b)


def test_a_capture_is_handed_only_to_the_loss_of_its_own_call():
    one = OneForward()
    from featuredp.clipping import GhostGradients

    model = _mlp()
    x = torch.randn(8, D)
    first, second = ((x,), {}), ((x,), {})
    one.forward(model, first, GhostGradients())
    assert one.take(second) is None  # another call's loss
    one.forward(model, first, GhostGradients())
    captured = one.take(first)
    assert captured is not None and captured.usable(model)
    assert one.take(first) is None  # once
    with torch.no_grad():
        out = one.forward(model, first, GhostGradients())
    assert one.take(first) is None and not out.requires_grad  # an evaluation under no_grad: nothing captured


def test_the_public_batch_is_read_with_one_index_and_equals_the_loaders_collate():
    """Algorithm 1's public batch from a TensorDataset: one index per tensor, the same tensors the loader's default
    collate makes item by item (a different row would be another record's public part)."""
    from torch.utils.data import default_collate

    x, y = _data()
    engine, _ = _private(_mlp())
    assert engine._per_record_collate
    idx = torch.randperm(N)[:77].numpy()
    fast = engine._public_batch(idx)
    slow = default_collate([TensorDataset(x, y)[int(i)] for i in idx])
    assert torch.equal(fast["x"], slow[0]) and torch.equal(fast["y"], slow[1])


class _Pair(nn.Module):
    """A model whose output is not a tensor (logits and a second head): the engine runs it without a capture."""

    def __init__(self) -> None:
        super().__init__()
        self.body = _mlp()

    def forward(self, x):
        out = self.body(x)
        return out, out.detach()


def test_dropout_saves_a_forward_too_and_an_output_that_is_not_a_tensor_is_not_captured():
    def dropout() -> nn.Module:
        torch.manual_seed(3)
        return nn.Sequential(nn.Linear(D, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 2))

    # With dropout the separability check runs its chunk once more with dropout off (a deterministic forward to
    # compare against); the capture still saves the strategy's own forward.
    assert _train(dropout())[1] == [2] * STEPS
    assert _train(dropout(), capture=False)[1] == [3] * STEPS

    engine, (m, o, c, loader) = _private(_Pair(), steps=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for xb, yb in loader:
            o.zero_grad()
            with pytest.raises(TypeError, match="criterion must get the private model's output"):
                c(m(xb)[0], yb)  # a part of a tuple is not the model's output: refused as before
            assert engine._one_forward._captured is None and not engine._one_forward._tensor_output
            break
