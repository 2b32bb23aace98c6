"""Attacks on the private aggregate: batch mixing under ghost clipping, and forward side effects.

Ghost clipping derives example i's gradient from row i of every recorded activation and output gradient.
A model that mixes rows (centring over the batch, attention over the batch axis) breaks that silently, and
one added record then moves the clipped sum by several C: the reported ε is false. The private forward also
runs on the real model, so anything it writes into parameters or buffers (renormalised embedding rows,
running statistics) is released with the model. Each test states the attack it pins; the add-one tests
measure the sensitivity ‖Σ clip(D ∪ {x}) − Σ clip(D)‖ that DP-SGD's accounting assumes is at most C.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import numpy as np
import pytest
import torch
from torch import nn

import featuredp.clipping.ghost as ghost_module
from featuredp.clipping import VmapGradients, check_no_batch_mixing
from featuredp.clipping.ghost import GhostGradients
from featuredp.clipping.safety import ForwardStateGuard

Loss = Callable[[nn.Module, dict, dict], torch.Tensor]


# torch.func's attention has no batching rule yet (slow, not wrong); nn.Transformer warns about nested tensors.
pytestmark = [
    pytest.mark.filterwarnings("ignore:There is a performance drop"),
    pytest.mark.filterwarnings("ignore:enable_nested_tensor is True"),
]


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def sq_loss(out: torch.Tensor) -> torch.Tensor:
    flat = out.reshape(out.shape[0], -1)
    return flat.pow(2).sum(1) / 2 + flat.sum(1)


def single(model: nn.Module, batch: dict, draws: dict) -> torch.Tensor:
    return sq_loss(model(batch["x"]))


def two_pass(model: nn.Module, batch: dict, draws: dict) -> torch.Tensor:
    """FDP's ℓ(x) − ℓ(x_padded): the model runs twice per example, the second time on the example's draws row."""
    return sq_loss(model(batch["x"])) - sq_loss(model(draws["pad"]))


def per_example_reference(
    model: nn.Module, loss_fn: Loss, batch: dict, draws: dict, C: float
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Clipped sum and norms from each example's own forward and backward (batch of one), in float64."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    sums = {n: torch.zeros_like(p, dtype=torch.float64) for n, p in named}
    norms = []
    B = next(iter(batch.values())).shape[0]
    for i in range(B):
        one = {k: v[i : i + 1] for k, v in batch.items()}
        dr = {k: v[i : i + 1] for k, v in draws.items()}
        gs = torch.autograd.grad(loss_fn(model, one, dr).sum(), [p for _, p in named], allow_unused=True)
        gs = [torch.zeros_like(p) if g is None else g for g, (_, p) in zip(gs, named)]
        norm = math.sqrt(sum(float(g.double().pow(2).sum()) for g in gs))
        norms.append(norm)
        f = 1.0 if math.isinf(C) else min(1.0, C / (norm + 1e-6))
        for (n, _), g in zip(named, gs):
            sums[n] += f * g.double()
    return sums, torch.tensor(norms, dtype=torch.float64)


def flat(sums: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([v.detach().double().reshape(-1) for _, v in sorted(sums.items())])


def state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_same_state(model: nn.Module, before: dict[str, torch.Tensor]) -> None:
    after = model.state_dict()
    assert set(after) == set(before), f"state_dict keys changed: {set(after) ^ set(before)}"
    for k, v in before.items():
        assert torch.equal(after[k], v), f"{k} changed: private data stayed in the model"


# -- models ---------------------------------------------------------------------------------------------------


class Centre(nn.Module):
    """Parameter-free batch centring: example i's activation depends on every other example of the batch."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x - x.mean(0, keepdim=True)


def centring_mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 8), Centre(), nn.Tanh(), nn.Linear(8, 3))


class Attend(nn.Module):
    """Self-attention over a (B, T, E) batch, mean over tokens, a Linear head."""

    def __init__(self, batch_first: bool, layer: str = "mha") -> None:
        super().__init__()
        self.layer = layer
        if layer == "mha":
            self.att = nn.MultiheadAttention(8, 2, batch_first=batch_first)
        else:
            self.att = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=batch_first)
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.att(x, x, x, need_weights=False)[0] if self.layer == "mha" else self.att(x)
        return self.head(torch.tanh(h).mean(1))


class Embeds(nn.Module):
    """An Embedding over (B, 5) codes with padding, and a mean EmbeddingBag over (B, 3) bags."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(11, 4, padding_idx=0)
        self.bag = nn.EmbeddingBag(13, 4, mode="mean")
        self.out = nn.Linear(8, 3)

    def forward(self, idx: torch.Tensor, bags: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(torch.cat([self.emb(idx).mean(1), self.bag(bags)], 1)))


class WithFallback(nn.Module):
    """A PReLU (no ghost rule) and a bare root parameter: torch.func fallback next to ghost layers."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(5, 6)
        self.act = nn.PReLU(6)
        self.fc2 = nn.Linear(6, 3)
        self.scale = nn.Parameter(torch.tensor(1.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * self.fc2(self.act(self.fc1(x)))


def _columns_loss(public: torch.Tensor) -> Loss:
    def loss(model: nn.Module, batch: dict, draws: dict) -> torch.Tensor:
        # FDP zero masking through ColumnLinear: the public pass sees only the public columns.
        return sq_loss(model(batch["x"])) - sq_loss(model(batch["x"][:, public], columns=public))

    return loss


def _embeds_loss(model: nn.Module, batch: dict, draws: dict) -> torch.Tensor:
    return sq_loss(model(batch["idx"], batch["bags"]))


Sampler = Callable[[int, torch.Generator], tuple[dict, dict]]


def _x(*shape: int) -> Sampler:
    return lambda n, g: ({"x": torch.randn(n, *shape, generator=g)}, {})


def _x_pad(*shape: int) -> Sampler:
    return lambda n, g: ({"x": torch.randn(n, *shape, generator=g)}, {"pad": torch.randn(n, *shape, generator=g)})


def _codes(n: int, g: torch.Generator) -> tuple[dict, dict]:
    return {"idx": torch.randint(0, 11, (n, 5), generator=g), "bags": torch.randint(0, 13, (n, 3), generator=g)}, {}


def _zoo() -> dict[str, tuple[Callable[[], nn.Module], Loss, Sampler]]:
    from featuredp.models import MLP

    public = torch.tensor([1, 4, 5])
    return {
        "mlp_tanh": (lambda: nn.Sequential(nn.Linear(7, 6), nn.Tanh(), nn.Linear(6, 3)), single, _x(7)),
        "embedding_and_bag": (Embeds, _embeds_loss, _codes),
        "conv_groupnorm": (
            lambda: nn.Sequential(
                nn.Conv2d(2, 4, 3, padding=1), nn.GroupNorm(2, 4), nn.SiLU(), nn.Flatten(), nn.Linear(100, 3)
            ),
            single,
            _x(2, 5, 5),
        ),
        "layernorm_tokens": (
            lambda: nn.Sequential(nn.Linear(6, 8), nn.LayerNorm(8), nn.GELU(), nn.Flatten(), nn.Linear(24, 2)),
            single,
            _x(3, 6),
        ),
        "fallback_layer": (WithFallback, two_pass, _x_pad(5)),
        "mha_batch_first": (lambda: Attend(True), single, _x(4, 8)),
        "encoder_layer_batch_first": (lambda: Attend(True, "encoder"), single, _x(4, 8)),
        "fdp_two_pass": (lambda: nn.Sequential(nn.Linear(7, 6), nn.Tanh(), nn.Linear(6, 3)), two_pass, _x_pad(7)),
        "fdp_zero_columns": (lambda: MLP(10, (6,), 3), _columns_loss(public), _x(10)),
    }


ZOO = _zoo()

# Models that mix the batch: ghost must refuse them (or, failing that, still bound the sensitivity).
ATTACKS: dict[str, tuple[Callable[[], nn.Module], Loss, Sampler]] = {
    "batch_centring": (centring_mlp, single, _x(6)),
    "batch_centring_fdp": (centring_mlp, two_pass, _x_pad(6)),
    "mha_seq_first": (lambda: Attend(False), single, _x(4, 8)),
    "encoder_layer_seq_first": (lambda: Attend(False, "encoder"), single, _x(4, 8)),
}


def add_one_sensitivity(
    make_strategy: Callable[[], GhostGradients], model: nn.Module, loss_fn: Loss, sample: Sampler, n: int = 6
) -> tuple[float, float]:
    """(max over added records x of ‖Σ clip(D ∪ {x}) − Σ clip(D)‖, C), σ = 0: the clipped sums themselves.

    C is half the smallest non-zero norm the strategy reports on D, so every example of D is clipped. The
    records x are typical ones and outliers (×10, what an attacker would add), each inserted at a random
    position (row order must not matter).
    """
    g = torch.Generator().manual_seed(1)
    batch, draws = sample(n, g)
    _, norms = make_strategy().clipped_sum(model, loss_fn, batch, draws, math.inf)
    C = 0.5 * float(norms[norms > 0].min())
    base = flat(make_strategy().clipped_sum(model, loss_fn, batch, draws, C)[0])
    worst = 0.0
    for scale in (1.0, 10.0, 1.0, 10.0):
        extra, extra_d = sample(1, g)
        extra = {k: v * scale if v.is_floating_point() else v for k, v in extra.items()}
        j = int(torch.randint(0, n + 1, (1,), generator=g))

        def ins(d: dict, e: dict, j: int = j) -> dict:
            return {k: torch.cat([v[:j], e[k], v[j:]]) for k, v in d.items()}

        sums, _ = make_strategy().clipped_sum(model, loss_fn, ins(batch, extra), ins(draws, extra_d), C)
        worst = max(worst, float(torch.linalg.vector_norm(flat(sums) - base)))
    return worst, C


def _ghost() -> GhostGradients:
    return GhostGradients()


# -- add-one sensitivity -------------------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:GhostGradients")  # fallback layers warn that they are slower
@pytest.mark.parametrize("name", list(ZOO))
def test_add_one_sensitivity_is_at_most_C_for_every_accepted_model(name):
    """Every model ghost accepts: adding one record moves the clipped sum by at most C (σ = 0)."""
    make, loss_fn, sample = ZOO[name]
    model = make()
    check_no_batch_mixing(model)  # accepted statically
    worst, C = add_one_sensitivity(_ghost, model, loss_fn, sample)
    assert worst <= C * (1 + 1e-5), f"{name}: ‖Δ‖ = {worst / C:.4f} C"
    assert worst >= 0.5 * C  # the added record does count (the test is not vacuous)


@pytest.mark.filterwarnings("ignore:GhostGradients")
@pytest.mark.parametrize("name", list(ATTACKS))
def test_batch_mixing_models_are_refused_and_would_break_the_bound(name, monkeypatch):
    """The attack: a model that mixes the batch. With the defences bypassed, one record moves the ghost clipped
    sum by more than C (this is what the test has power against); with them, ghost refuses the model."""
    make, loss_fn, sample = ATTACKS[name]
    model = make()
    batch, draws = sample(6, torch.Generator().manual_seed(1))
    with pytest.raises(ValueError, match=r"mixes examples across the batch|batch_first=True") as err:
        GhostGradients().clipped_sum(model, loss_fn, batch, draws, 1.0)
    assert "strategy='vmap'" in str(err.value) or "batch_first=True" in str(err.value)

    # Power: the same model through ghost clipping without the static refusal and the cross-check.
    def unchecked() -> GhostGradients:
        s = GhostGradients()
        s._check_separability = False
        return s

    monkeypatch.setattr(ghost_module, "check_no_batch_mixing", lambda model: None)
    worst, C = add_one_sensitivity(unchecked, model, loss_fn, sample)
    assert worst > 1.5 * C, f"{name}: the attack should break the bound, ‖Δ‖ = {worst / C:.3f} C"


# -- the separability cross-check ----------------------------------------------------------------------------


@pytest.mark.parametrize("loss_fn", [single, two_pass], ids=["single", "fdp_two_pass"])
def test_batch_centring_is_refused_by_the_cross_check_with_a_named_culprit(loss_fn):
    model = centring_mlp()
    check_no_batch_mixing(model)  # invisible statically: no parameters, no known layer type
    batch, draws = {"x": torch.randn(8, 6)}, {"pad": torch.randn(8, 6)}
    with pytest.raises(ValueError, match=r"mixes examples across the batch.*'1' \(Centre\).*strategy='vmap'") as err:
        GhostGradients().clipped_sum(model, loss_fn, batch, draws, 1.0)
    assert type(err.value).__name__ == "BatchMixingError"


def test_the_cross_check_waits_for_a_batch_of_two_and_covers_chunks_and_dropout():
    """Poisson batches can be empty or hold one example, which cannot reveal mixing: the check must still run
    on the first batch of two or more, also when the batch is split into physical chunks or dropout is on."""
    model = centring_mlp()
    s = GhostGradients()
    s.clipped_sum(model, single, {"x": torch.randn(0, 6)}, {}, 1.0)
    s.clipped_sum(model, single, {"x": torch.randn(1, 6)}, {}, 1.0)
    with pytest.raises(ValueError, match="mixes examples"):
        s.clipped_sum(model, single, {"x": torch.randn(2, 6)}, {}, 1.0)
    with pytest.raises(ValueError, match="mixes examples"):
        GhostGradients(physical_batch_size=3).clipped_sum(model, single, {"x": torch.randn(8, 6)}, {}, 1.0)
    dropout = nn.Sequential(nn.Linear(6, 8), Centre(), nn.Dropout(0.3), nn.Linear(8, 3))
    with pytest.raises(ValueError, match="mixes examples"):
        GhostGradients().clipped_sum(dropout, single, {"x": torch.randn(8, 6)}, {}, 1.0)
    assert dropout[2].training  # dropout is switched back on after the check


def test_the_cross_check_runs_on_every_call_that_can_mix(monkeypatch):
    calls = []
    original = GhostGradients._compare_with_alone

    def spy(self, *args, **kwargs):
        calls.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(GhostGradients, "_compare_with_alone", spy)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
    s = GhostGradients()
    for n in (0, 1):
        s.clipped_sum(model, single, {"x": torch.randn(n, 6)}, {}, 1.0)
    assert calls == []  # nothing to compare yet
    for n in (5, 5, 9, 1):
        s.clipped_sum(model, single, {"x": torch.randn(n, 6)}, {}, 1.0)
    assert calls == [1, 1, 1]  # every batch of two or more examples, not only the first (a batch of one cannot mix)
    s.clipped_sum(nn.Sequential(nn.Linear(6, 3)), single, {"x": torch.randn(4, 6)}, {}, 1.0)
    assert calls == [1, 1, 1, 1]


def test_a_random_forward_outside_dropout_modules_is_refused_with_its_own_reason():
    """The cross-check recomputes examples alone; functional randomness would make it compare noise."""

    class Noisy(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(nn.functional.dropout(x, 0.5, training=True))

    with pytest.raises(ValueError, match="deterministic given"):
        GhostGradients().clipped_sum(Noisy(), single, {"x": torch.randn(6, 4)}, {}, 1.0)


# -- static refusals -----------------------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:GhostGradients")
@pytest.mark.parametrize("layer", ["mha", "encoder"])
def test_attention_is_refused_with_batch_first_false_and_exact_with_batch_first_true(layer):
    """batch_first=False reads a batch-first (B, T, E) batch as (sequence, batch, E): attention across examples."""
    x = torch.randn(5, 4, 8)
    bad = Attend(False, layer)
    with pytest.raises(ValueError, match=r"'att' \(\w+, batch_first=False.*batch_first=True"):
        check_no_batch_mixing(bad)
    with pytest.raises(ValueError, match="batch_first=True"):
        GhostGradients().clipped_sum(bad, single, {"x": x}, {}, 1.0)
    good = Attend(True, layer)
    check_no_batch_mixing(good)
    _, ref_norms = per_example_reference(good, single, {"x": x}, {}, math.inf)
    for C in (math.inf, float(ref_norms.median())):
        ref, ref_norms = per_example_reference(good, single, {"x": x}, {}, C)
        sums, norms = GhostGradients().clipped_sum(good, single, {"x": x}, {}, C)
        torch.testing.assert_close(norms.double(), ref_norms, rtol=1e-5, atol=1e-8)
        torch.testing.assert_close(flat(sums), flat(ref), rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize(
    "make",
    [
        lambda: nn.Transformer(8, 2, 1, 1, 16, dropout=0.0),
        lambda: nn.TransformerEncoder(nn.TransformerEncoderLayer(8, 2, 16), 2, enable_nested_tensor=False),
        lambda: nn.TransformerDecoderLayer(8, 2, 16),
    ],
    ids=["Transformer", "TransformerEncoder", "TransformerDecoderLayer"],
)
def test_sequence_first_transformers_are_refused_by_their_outer_name(make):
    with pytest.raises(ValueError, match=r"layer '0' \(Transformer\w*, batch_first=False.*batch_first=True"):
        check_no_batch_mixing(nn.Sequential(make()))


@pytest.mark.parametrize(
    "layer", [nn.Embedding(10, 4, max_norm=1.0), nn.EmbeddingBag(10, 4, max_norm=1.0)], ids=["Embedding", "Bag"]
)
def test_embedding_max_norm_is_refused_before_it_renormalises_private_rows(layer):
    """The attack: max_norm renormalises the looked-up rows in place, so the released table shows which codes
    were in the private batch. Refused before any forward: the table is untouched."""
    model = nn.Sequential(layer, nn.Linear(4, 2))
    with torch.no_grad():
        layer.weight.mul_(5)  # rows of norm > 1: max_norm would shrink the ones the batch uses
    before = state(model)
    idx = torch.randint(0, 10, (6, 3))
    with pytest.raises(ValueError, match=r"'0' \(\w+, max_norm=1.0\).*max_norm=None") as err:
        GhostGradients().clipped_sum(model, lambda m, b, d: sq_loss(m(b["x"]).reshape(6, -1)), {"x": idx}, {}, 1.0)
    assert type(err.value).__name__ == "ForwardSideEffectError"
    assert_same_state(model, before)


# -- forward side effects ------------------------------------------------------------------------------------


class InPlaceCount(nn.Module):
    """Accumulates a private statistic into a buffer, in place (like BatchNorm's running mean)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("total", torch.zeros(5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.total += x.detach().sum(0)
        return x


class Reassign(nn.Module):
    """Rebinds a buffer to a private statistic."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("stat", torch.zeros(5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.stat = x.detach().mean(0)
        return x


class NewBuffer(nn.Module):
    """Registers a buffer holding the private inputs."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.register_buffer("seen", x.detach().clone())
        return x


class DataWrite(nn.Module):
    """Writes through ``.data``, which bumps no version counter."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("stat", torch.zeros(5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.stat.data.copy_(x.detach().mean(0))
        return x


@pytest.mark.parametrize(
    ("module", "what"),
    [
        (InPlaceCount, r"buffer '1\.total' of module '1' \(InPlaceCount\) was modified in place"),
        (Reassign, r"buffer '1\.stat' of module '1' \(Reassign\) was reassigned"),
        (NewBuffer, r"buffer '1\.seen' of module '1' \(NewBuffer\) was added"),
        (DataWrite, r"buffer '1\.stat' of module '1' \(DataWrite\) was modified in place"),
    ],
)
def test_buffers_written_by_the_private_forward_are_refused_and_restored_under_ghost(module, what):
    model = nn.Sequential(nn.Linear(4, 5), module(), nn.Linear(5, 2))
    before = state(model)
    with pytest.raises(ValueError, match=what + r".*released model.*restored") as err:
        GhostGradients().clipped_sum(model, single, {"x": torch.randn(6, 4)}, {}, 1.0)
    assert type(err.value).__name__ == "ForwardSideEffectError"
    assert_same_state(model, before)


def test_a_buffer_added_under_vmap_is_refused_and_removed():
    """torch.func refuses in-place writes to captured buffers and undoes rebinding, but a buffer registered in
    the forward escapes vmap and stays in the model (unguarded, its state_dict even fails to save)."""
    model = nn.Sequential(nn.Linear(4, 5), NewBuffer(), nn.Linear(5, 2))
    before = state(model)
    with pytest.raises(ValueError, match=r"buffer '1\.seen'.*was added"):
        VmapGradients(None).clipped_sum(model, single, {"x": torch.randn(6, 4)}, {}, 1.0)
    assert_same_state(model, before)


class SelfRenorm(nn.Module):
    """A hand-written max_norm that no static check knows: shrinks the rows it looked up, in place."""

    def __init__(self, via_data: bool = False) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.via_data = via_data
        self.armed = True

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        if self.armed:
            rows = idx.unique()
            w = self.emb.weight.data if self.via_data else self.emb.weight
            with torch.no_grad():
                w[rows] = w[rows] / w[rows].norm(dim=1, keepdim=True).clamp(min=1.0)
        return self.emb(idx).sum(1)


@pytest.mark.parametrize("via_data", [False, True], ids=["in_place", "through_data"])
def test_a_parameter_written_by_the_forward_is_refused_and_restored_on_the_first_call(via_data):
    model = SelfRenorm(via_data)
    with torch.no_grad():
        model.emb.weight.mul_(5)
    before = state(model)
    with pytest.raises(ValueError, match=r"parameter 'emb\.weight' of module 'emb' \(Embedding\)"):
        GhostGradients().clipped_sum(model, single, {"x": torch.randint(0, 10, (6, 3))}, {}, 1.0)
    assert_same_state(model, before)


@pytest.mark.parametrize("via_data", [False, True], ids=["in_place", "through_data"])
@pytest.mark.parametrize("strategy", [GhostGradients, lambda: VmapGradients(None)], ids=["ghost", "vmap"])
def test_a_parameter_written_on_a_later_call_is_refused_and_restored(via_data, strategy):
    """Every call is checked in full: a write through ``.data`` (no version bump) on the fifth call is seen and
    undone, so a record's value never reaches the released model."""
    model = SelfRenorm(via_data)
    with torch.no_grad():
        model.emb.weight.mul_(5)
    model.armed = False
    s = strategy()
    for _ in range(4):
        s.clipped_sum(model, single, {"x": torch.randint(0, 10, (6, 3))}, {}, 1.0)
    before = state(model)
    model.armed = True
    # vmap cannot even trace the write (a data-dependent unique); ghost runs it and must catch it
    refused = ValueError if isinstance(s, GhostGradients) else (ValueError, RuntimeError)
    with pytest.raises(refused, match=r"parameter 'emb\.weight'.*was restored|vmap"):
        s.clipped_sum(model, single, {"x": torch.randint(0, 10, (6, 3))}, {}, 1.0)
    assert_same_state(model, before)


def test_above_the_copy_limit_a_write_is_still_seen_and_the_model_is_to_be_discarded(monkeypatch):
    monkeypatch.setattr("featuredp.clipping.safety._COPY_LIMIT", 0)  # fingerprints instead of copies
    monkeypatch.setattr("featuredp.clipping.safety._EXACT_LIMIT", 0)  # even for a table this small
    model = SelfRenorm(via_data=True)
    with torch.no_grad():
        model.emb.weight.mul_(5)
    with pytest.raises(ValueError, match=r"'emb\.weight'.*could NOT be fully restored.*discard"):
        GhostGradients().clipped_sum(model, single, {"x": torch.randint(0, 10, (6, 3))}, {}, 1.0)


def test_a_clean_model_passes_the_guard_and_keeps_its_state():
    model = nn.Sequential(nn.Linear(4, 5), nn.LayerNorm(5), nn.Linear(5, 2))
    before = state(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for s in (GhostGradients(), VmapGradients(None)):
            for _ in range(2):
                s.clipped_sum(model, single, {"x": torch.randn(6, 4)}, {}, 1.0)
    assert_same_state(model, before)


def test_the_errors_are_value_errors_of_their_own_class():
    from featuredp.clipping import BatchMixingError, ForwardSideEffectError
    from featuredp.errors import FeatureDPError

    for cls in (BatchMixingError, ForwardSideEffectError):
        assert issubclass(cls, ValueError) and issubclass(cls, FeatureDPError)
    with pytest.raises(BatchMixingError):
        check_no_batch_mixing(nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4)))


@pytest.mark.parametrize("write", ["one_row", "one_coordinate", "whole", "tiny_row"])
def test_the_keyed_fingerprint_sees_a_write_through_data_anywhere_in_a_large_tensor(write):
    """Above the copy limit a large weight is fingerprinted, not copied: a write through ``.data`` (no version
    bump) to one row or one coordinate out of 200,000 is still seen, whichever row it is."""
    from featuredp.clipping.safety import _EXACT_LIMIT, _Fingerprint

    torch.manual_seed(0)
    model = nn.Embedding(2000, 100)
    assert model.weight.numel() > _EXACT_LIMIT
    for row in (0, 777, 1999):
        rng = np.random.default_rng()
        fp = _Fingerprint(model.weight, rng)
        assert fp.same(model.weight)
        saved = model.weight.detach().clone()
        w = model.weight.data
        if write == "one_row":
            w[row] = w[row] / w[row].norm().clamp(min=1.0) * 0.5
        elif write == "one_coordinate":
            w[row, 3] += 1e-3
        elif write == "tiny_row":
            w[row] *= 1 + 1e-4
        else:
            w.mul_(0.99)
        assert not fp.same(model.weight), (write, row)
        model.weight.data.copy_(saved)


def test_fingerprints_are_keyed_from_os_entropy_not_the_published_seed(monkeypatch):
    monkeypatch.setattr("featuredp.clipping.safety._COPY_LIMIT", 0)
    model = nn.Linear(100, 80)
    positions = []
    for _ in range(2):
        torch.manual_seed(0)
        np.random.seed(0)
        guard = ForwardStateGuard(model).__enter__()
        positions.append([fp.idx.tolist() for fp in guard._prints.values()])
        guard.__exit__(None, None, None)
    assert positions[0] and positions[0] != positions[1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64,
                                   torch.uint8, torch.bool])  # fmt: skip
def test_a_write_through_data_of_one_element_is_seen_in_every_dtype(dtype):
    """The guard's value comparison (numpy's on the CPU where it can, torch's otherwise) sees one changed element,
    in a strided view too, and takes NaN for NaN and -0.0 for 0.0, as torch.equal does."""
    from featuredp.clipping.safety import _same_values

    for rows in (4, 4096):  # torch's comparison, and numpy's above 8,192 elements
        t = torch.arange(rows * 6).reshape(rows, 6)
        t = (t % 2 == 0) if dtype is torch.bool else (t % 200).to(dtype)
        copy = t.clone()
        assert _same_values(t, copy) and _same_values(t.t(), copy.t())
        changed = t.clone()
        changed.data[rows - 1, 5] = (~changed[rows - 1, 5]) if dtype is torch.bool else changed[rows - 1, 5] + 1
        assert not _same_values(changed, copy) and not _same_values(changed.t(), copy.t())
    if dtype.is_floating_point:
        for size in (2, 10_000):
            nan = torch.zeros(size, dtype=dtype)
            nan[-1] = float("nan")
            zero = nan.clone()
            zero[0] = -0.0
            one = nan.clone()
            one[0] = 1.0
            assert _same_values(nan, zero) and not _same_values(nan, one)
