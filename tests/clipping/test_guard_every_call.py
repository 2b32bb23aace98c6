"""The forward guard checks every call in full: parameters, buffers and plain attributes that hold data.

Attacks reproduced on the release before (issue 23, finding 1), written as the attacker would:

* a hand-written running mean kept in a plain attribute (not a buffer) moved the clipped sum by 3 C and carried
  2 C into the next step, unseen (plain attributes were not tracked);
* a frozen parameter written through ``.data`` after the first call put a record's value verbatim into the
  released model (parameters were copied on the first call only).

And the guard must not refuse ordinary models on any call.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from torch import nn

from featuredp.clipping import ForwardStateGuard, GhostGradients, VmapGradients
from featuredp.errors import ForwardSideEffectError


def ce(model, batch, draws):
    return nn.functional.cross_entropy(model(batch["x"]), batch["y"], reduction="none")


def tab(n: int = 8, d: int = 6, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"x": torch.randn(n, d, generator=g), "y": torch.randint(0, 3, (n,), generator=g)}


class PlainRunningMean(nn.Module):
    """Centres its input with a running mean kept in a plain attribute: a statistic of private batches."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(6, 3)
        self.mean = torch.zeros(6)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.mean = 0.9 * self.mean + 0.1 * x.detach().mean(0)
        return self.lin(x - self.mean)


class InPlaceStatistic(PlainRunningMean):
    """The same statistic updated in place, in a list attribute."""

    def __init__(self) -> None:
        super().__init__()
        self.history: list[torch.Tensor] = [torch.zeros(6)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.history[0].mul_(0.9).add_(0.1 * x.detach().mean(0))
        return self.lin(x - self.history[0])


class LateDataWrite(nn.Module):
    """A frozen parameter that, from the fourth call on, receives the first record's first feature via .data."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(6, 3)
        self.stash = nn.Parameter(torch.zeros(1), requires_grad=False)
        self.calls = [0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.calls[0] >= 3:
            self.stash.data[0] = x[0, 0].detach()
        return self.lin(x) + 0 * self.stash


@pytest.mark.parametrize("strategy", [GhostGradients, lambda: VmapGradients(None)], ids=["ghost", "vmap"])
def test_a_running_mean_in_a_plain_attribute_is_refused_and_undone_on_every_call(strategy):
    s = strategy()
    model = PlainRunningMean()
    before = model.mean
    with pytest.raises(ForwardSideEffectError, match=r"attribute 'mean' of module '<root>' \(PlainRunningMean\)"):
        s.clipped_sum(model, ce, tab(), {}, 1.0)
    assert model.mean is before and torch.equal(before, torch.zeros(6))
    with pytest.raises(ForwardSideEffectError, match=r"attribute 'mean'"):  # and again: not only the first call
        s.clipped_sum(model, ce, tab(seed=1), {}, 1.0)
    assert torch.equal(model.mean, torch.zeros(6))


def test_a_statistic_updated_in_place_inside_a_list_is_refused_and_undone():
    model = InPlaceStatistic()
    with pytest.raises(ForwardSideEffectError, match=r"attribute 'history'.*modified in place"):
        GhostGradients().clipped_sum(model, ce, tab(), {}, 1.0)
    assert torch.equal(model.history[0], torch.zeros(6))


def test_a_late_write_through_data_never_reaches_the_released_model():
    model, s = LateDataWrite(), GhostGradients()
    for step in range(6):
        batch = tab(seed=step)
        secret = 123.0 + step + 2.0**-10  # the private value the attacker looks for
        batch["x"][0, 0] = secret
        if step < 3:
            s.clipped_sum(model, ce, batch, {}, 1.0)
        else:
            with pytest.raises(ForwardSideEffectError, match=r"parameter 'stash'.*modified in place.*restored"):
                s.clipped_sum(model, ce, batch, {}, 1.0)
        model.calls[0] += 1
        released = pickle.dumps(model.state_dict())
        # Exact, not a text search: the pickle also holds decimal storage addresses, which may contain "123".
        # The value's float32 bytes hold 0x42 and a non-digit byte, so no address can spell them.
        pattern = np.float32(secret).tobytes()
        assert float(model.stash) == 0.0 and pattern not in released
        assert all(not (t == secret).any() for t in pickle.loads(released).values())


def test_a_counter_and_an_added_cache_are_named():
    class Counting(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(6, 3)
            self.calls = 0

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.calls += 1
            self.last = x.detach()
            return self.lin(x)

    model = Counting()
    named = r"attribute 'calls'.*changed.*attribute 'last'.*was added"
    with pytest.raises(ForwardSideEffectError, match=named), ForwardStateGuard(model):
        model(torch.randn(4, 6))
    assert model.calls == 0 and not hasattr(model, "last")


def test_a_numpy_array_attribute_written_in_place_is_refused_and_undone():
    class Stash(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(6, 3)
            self.seen = np.zeros(6)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.seen += x.detach().numpy().sum(0)
            return self.lin(x)

    model = Stash()
    with pytest.raises(ForwardSideEffectError, match="numpy array"), ForwardStateGuard(model):
        model(torch.randn(4, 6))
    assert not model.seen.any()


# -- no false positives: ordinary models pass every call ---------------------------------------------------------


class GroupNormCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.norm = nn.GroupNorm(2, 4)
        self.head = nn.Linear(4 * 6 * 6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.norm(self.conv(x.view(-1, 1, 6, 6)))).flatten(1))


class Bag(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(20, 5)
        self.head = nn.Linear(5, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.emb(x.abs().mul(5).long().clamp(max=19)).mean(1))


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(2, 8)
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x.view(x.shape[0], 3, 2))
        return self.head(self.attn(h, h, h, need_weights=False)[0].mean(1))


class Recurrent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.LSTM(2, 8, batch_first=True)
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(x.view(x.shape[0], 3, 2))[0][:, -1])


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(2, 8)
        self.enc = nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0, batch_first=True)
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.enc(self.proj(x.view(x.shape[0], 3, 2))).mean(1))


ZOO = {
    "mlp": lambda: nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3)),
    "groupnorm_cnn": GroupNormCNN,
    "embedding": Bag,
    "attention": Attention,
    "lstm": Recurrent,
    "transformer": Encoder,
}


@pytest.mark.parametrize("name", list(ZOO))
def test_ordinary_models_pass_the_guard_on_every_call(name):
    torch.manual_seed(0)
    model = ZOO[name]()
    x = {"mlp": tab(), "groupnorm_cnn": tab(d=36)}.get(name) or tab()
    for strategy in (GhostGradients(), VmapGradients(None)):
        for step in range(3):
            batch = dict(x, x=x["x"] + step)
            strategy.clipped_sum(model, ce, batch, {}, 1.0)
            with torch.no_grad():  # an optimizer step between calls: legitimate, outside the guard
                for p in model.parameters():
                    p.add_(0.01)
