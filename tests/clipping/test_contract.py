"""The contract every registered clipping strategy must meet.

Parametrised over :data:`featuredp.clipping.STRATEGIES`, so a strategy added with
``register_strategy`` is tested here without touching this file. On a small model zoo (every
kind of ghost rule, the torch.func fallback, FDP's two-pass private loss ℓ(x) − ℓ(x_padded) and its
zero-masked column-subset form) a strategy must:

* return the clipped sum and the norms of a one-example-at-a-time autograd reference, at C = inf,
  a median C (some examples clipped) and a tiny C (all clipped);
* move the clipped sum by at most C when one example is added (the sensitivity the accounting
  assumes), and bound every example's own clipped contribution by C;
* give zero sums and empty norms on the model's device for an empty batch;
* refuse BatchNorm, which mixes the examples of a batch.

Devices: CPU, plus CUDA where one is available; on CPU-only machines the default device is set to 'meta'
once, so that a tensor created without following the model or the batch is caught there too.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
from torch import nn
from torch.nn import functional as nnf

from featuredp.clipping import (
    STRATEGIES,
    BatchMixingError,
    GradientStrategy,
    VmapGradients,
    get_strategy,
    register_strategy,
)
from featuredp.models import MLP

# Expected here: the ghost strategy warns (once per model) when some parameters fall back to torch.func, and
# torch.func has no batching rule for embedding_bag (vmap).
pytestmark = [
    pytest.mark.filterwarnings("ignore:GhostGradients:UserWarning"),
    pytest.mark.filterwarnings("ignore:There is a performance drop:UserWarning"),
]

RTOL = 1e-5
B = 6
NAMES = sorted(STRATEGIES)
DEVICES = ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]

Batch = dict[str, torch.Tensor]
Loss = Callable[[nn.Module, Batch, Batch], torch.Tensor]
Case = tuple[nn.Module, Loss, Batch, Batch]


def ce(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nnf.cross_entropy(logits, y, reduction="none")


def labelled(m: nn.Module, b: Batch, d: Batch) -> torch.Tensor:
    return ce(m(b["x"]), b["y"])


# -- the model zoo --------------------------------------------------------------------------------------------


def _mlp(g: torch.Generator) -> Case:
    model = nn.Sequential(nn.Linear(5, 6), nn.Tanh(), nn.Linear(6, 3))
    batch = {"x": torch.randn(B, 5, generator=g), "y": torch.randint(0, 3, (B,), generator=g)}
    return model, labelled, batch, {}


class Embeds(nn.Module):
    """Embedding (with a padding row) and a mean EmbeddingBag over 2-d codes, then a Linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(11, 4, padding_idx=0)
        self.bag = nn.EmbeddingBag(13, 4, mode="mean")
        self.out = nn.Linear(4, 3)

    def forward(self, codes: torch.Tensor, bag: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.emb(codes).sum(1) + self.bag(bag)))


def _embeddings(g: torch.Generator) -> Case:
    codes = torch.randint(0, 11, (B, 3), generator=g)
    codes[:, 1] = codes[:, 0]  # a repeated row within an example
    codes[::2, 2] = 0  # and the padding row
    batch = {
        "codes": codes,
        "bag": torch.randint(0, 13, (B, 4), generator=g),
        "y": torch.randint(0, 3, (B,), generator=g),
    }
    return Embeds(), lambda m, b, d: ce(m(b["codes"], b["bag"]), b["y"]), batch, {}


def _conv_groupnorm(g: torch.Generator) -> Case:
    model = nn.Sequential(
        nn.Conv2d(2, 4, 3, padding=1), nn.GroupNorm(2, 4), nn.SiLU(), nn.Flatten(), nn.Linear(4 * 5 * 5, 3)
    )
    batch = {"x": torch.randn(B, 2, 5, 5, generator=g), "y": torch.randint(0, 3, (B,), generator=g)}
    return model, labelled, batch, {}


def _layernorm(g: torch.Generator) -> Case:
    model = nn.Sequential(nn.Linear(5, 6), nn.LayerNorm(6), nn.Linear(6, 3))
    with torch.no_grad():  # move the affine parameters away from their (1, 0) init
        model[1].weight.copy_(torch.randn(6, generator=g))
        model[1].bias.copy_(torch.randn(6, generator=g))
    batch = {"x": torch.randn(B, 5, generator=g), "y": torch.randint(0, 3, (B,), generator=g)}
    return model, labelled, batch, {}


def _fallback(g: torch.Generator) -> Case:
    """PReLU has no ghost rule: its parameter goes through the torch.func fallback."""
    model = nn.Sequential(nn.Linear(5, 6), nn.PReLU(6), nn.Linear(6, 3))
    with torch.no_grad():
        model[1].weight.copy_(torch.rand(6, generator=g))
    batch = {"x": torch.randn(B, 5, generator=g), "y": torch.randint(0, 3, (B,), generator=g)}
    return model, labelled, batch, {}


PRIVATE = [1, 3]  # of 5 input columns


def _fdp_two_pass(g: torch.Generator) -> Case:
    """FDP's private loss ℓ(x) − ℓ(x_padded): the private columns replaced by Gaussian noise (the draws)."""
    model = nn.Sequential(nn.Linear(5, 6), nn.Tanh(), nn.Linear(6, 3))
    x = torch.randn(B, 5, generator=g)
    padded = x.clone()
    padded[:, PRIVATE] = torch.randn(B, len(PRIVATE), generator=g)
    batch = {"x": x, "y": torch.randint(0, 3, (B,), generator=g)}

    def loss(m: nn.Module, b: Batch, d: Batch) -> torch.Tensor:
        return ce(m(b["x"]), b["y"]) - ce(m(d["pad"]), b["y"])

    return model, loss, batch, {"pad": padded}


def _fdp_columns(g: torch.Generator) -> Case:
    """The zero-masked form: the second pass sees only the public columns (ColumnLinear first layer)."""
    model = MLP(5, (6,), 3, activation="tanh")
    public = [c for c in range(5) if c not in PRIVATE]
    batch = {"x": torch.randn(B, 5, generator=g), "y": torch.randint(0, 3, (B,), generator=g)}

    def loss(m: nn.Module, b: Batch, d: Batch) -> torch.Tensor:
        cols = torch.tensor(public, device=b["x"].device)
        return ce(m(b["x"]), b["y"]) - ce(m(b["x"][:, cols], columns=cols), b["y"])

    return model, loss, batch, {}


ZOO: dict[str, Callable[[torch.Generator], Case]] = {
    "mlp": _mlp,
    "embeddings": _embeddings,
    "conv_groupnorm": _conv_groupnorm,
    "layernorm": _layernorm,
    "fallback": _fallback,
    "fdp_two_pass": _fdp_two_pass,
    "fdp_columns": _fdp_columns,
}


def make(case: str, device: str = "cpu", seed: int = 0) -> Case:
    torch.manual_seed(seed)  # parameter initialisation
    model, loss, batch, draws = ZOO[case](torch.Generator().manual_seed(seed))
    to = torch.device(device)
    return model.to(to), loss, {k: v.to(to) for k, v in batch.items()}, {k: v.to(to) for k, v in draws.items()}


def rows(batch: Batch, sl: slice) -> Batch:
    return {k: v[sl] for k, v in batch.items()}


# -- the reference: each example differentiated on its own ----------------------------------------------------


def reference(model: nn.Module, loss: Loss, batch: Batch, draws: Batch, C: float) -> tuple[dict, torch.Tensor]:
    """Per-example gradients one at a time (batch of one, plain autograd) → (clipped sum, norms), in float64."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    params = [p for _, p in named]
    n_ex = next(iter(batch.values())).shape[0]
    sums = {n: torch.zeros_like(p, dtype=torch.float64) for n, p in named}
    norms = []
    for i in range(n_ex):
        gs = torch.autograd.grad(
            loss(model, rows(batch, slice(i, i + 1)), rows(draws, slice(i, i + 1))).sum(), params, allow_unused=True
        )
        gs = tuple(torch.zeros_like(p) if g is None else g for g, p in zip(gs, params))
        norm = math.sqrt(sum(float(g.double().pow(2).sum()) for g in gs))
        norms.append(norm)
        factor = 1.0 if math.isinf(C) else min(1.0, C / (norm + 1e-6))
        for (n, _), g in zip(named, gs):
            sums[n] += factor * g.double()
    return sums, torch.tensor(norms, dtype=torch.float64)


def model_device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def flat_norm(sums: dict[str, torch.Tensor]) -> float:
    return math.sqrt(sum(float(s.detach().double().pow(2).sum()) for s in sums.values()))


def clip_norms(norms: torch.Tensor) -> list[float]:
    """C = inf (no clipping), the median norm (some clipped), a quarter of the smallest (all clipped)."""
    positive = norms[norms > 0]
    return [math.inf, float(positive.median()), float(positive.min()) / 4]


# -- the contract ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", sorted(ZOO))
@pytest.mark.parametrize("name", NAMES)
def test_clipped_sum_and_norms_equal_one_example_at_a_time(name, case, device):
    model, loss, batch, draws = make(case, device)
    strategy = get_strategy(name)
    _, ref_norms = reference(model, loss, batch, draws, math.inf)
    for C in clip_norms(ref_norms):
        ref_sums, _ = reference(model, loss, batch, draws, C)
        sums, norms = strategy.clipped_sum(model, loss, batch, draws, C)
        assert norms.shape == (B,) and norms.device == model_device(model)
        torch.testing.assert_close(norms.detach().cpu().double(), ref_norms.cpu(), rtol=RTOL, atol=1e-9)
        assert set(sums) == set(ref_sums)
        for n, s in sums.items():
            assert s.shape == ref_sums[n].shape and s.device == model_device(model), n
            scale = float(ref_sums[n].abs().max()) + 1e-12
            err = float((s.detach().double() - ref_sums[n]).abs().max())
            assert err <= RTOL * scale * 10 + 1e-9, f"{name}/{case}: {n} max error {err:.3g} vs {scale:.3g} (C={C})"


@pytest.mark.parametrize("case", sorted(ZOO))
@pytest.mark.parametrize("name", NAMES)
def test_one_example_moves_the_clipped_sum_by_at_most_C(name, case):
    """Add-one sensitivity: ‖clipped_sum(D ∪ {x}) − clipped_sum(D)‖ ≤ C, and each example alone is ≤ C."""
    model, loss, batch, draws = make(case)
    _, ref_norms = reference(model, loss, batch, draws, math.inf)
    for C in clip_norms(ref_norms)[1:]:
        strategy = get_strategy(name)
        with_x, _ = strategy.clipped_sum(model, loss, batch, draws, C)
        without, _ = strategy.clipped_sum(model, loss, rows(batch, slice(B - 1)), rows(draws, slice(B - 1)), C)
        moved = flat_norm({k: with_x[k].double() - without[k].double() for k in with_x})
        assert moved <= C * (1 + 1e-5), f"{name}/{case}: adding one example moved the sum by {moved / C:.6f} C"
        for i in range(B):
            one, one_d = rows(batch, slice(i, i + 1)), rows(draws, slice(i, i + 1))
            alone, norm = strategy.clipped_sum(model, loss, one, one_d, C)
            assert flat_norm(alone) <= C * (1 + 1e-5), f"{name}/{case}: example {i} (norm {float(norm[0]):.3g})"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", sorted(ZOO))
@pytest.mark.parametrize("name", NAMES)
def test_an_empty_batch_gives_zeros_on_the_model_device_and_no_norms(name, case, device):
    model, loss, batch, draws = make(case, device)
    sums, norms = get_strategy(name).clipped_sum(model, loss, rows(batch, slice(0)), rows(draws, slice(0)), 1.0)
    assert norms.shape == (0,) and norms.device == model_device(model) and norms.is_floating_point()
    params = dict(model.named_parameters())
    assert set(sums) == set(params)
    for n, s in sums.items():
        assert s.shape == params[n].shape and s.device == params[n].device and s.dtype == params[n].dtype
        assert not s.any()


@pytest.mark.parametrize("case", sorted(ZOO))
@pytest.mark.parametrize("name", NAMES)
def test_no_tensor_is_created_on_the_default_device(name, case):
    """The device seam without a GPU: with the default device set to 'meta', any tensor the strategy creates
    without following the model or the batch lands on meta and breaks the step (or the result's device)."""
    model, loss, batch, draws = make(case)
    ref_sums, _ = reference(model, loss, batch, draws, 0.05)
    strategy = get_strategy(name, physical_batch_size=4)  # two physical chunks
    with torch.device("meta"):
        sums, norms = strategy.clipped_sum(model, loss, batch, draws, 0.05)
        empty_sums, empty_norms = strategy.clipped_sum(model, loss, rows(batch, slice(0)), rows(draws, slice(0)), 0.05)
    for t in (norms, empty_norms, *sums.values(), *empty_sums.values()):
        assert t.device.type == "cpu"
    for n, s in sums.items():
        torch.testing.assert_close(s.double(), ref_sums[n], rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("name", NAMES)
def test_batchnorm_is_refused(name):
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    batch = {"x": torch.randn(B, 3), "y": torch.randint(0, 2, (B,))}
    with pytest.raises(BatchMixingError, match="BatchNorm1d"):
        get_strategy(name).clipped_sum(model, labelled, batch, {}, 1.0)


# -- the registry ---------------------------------------------------------------------------------------------


class Toy:
    """A registered strategy needs only a name and clipped_sum (here: vmap's, to keep the toy honest)."""

    name = "toy"

    def __init__(self, physical_batch_size: int | None) -> None:
        self.physical_batch_size = physical_batch_size

    def clipped_sum(self, model, loss_fn, batch, draws, max_grad_norm):
        return VmapGradients(self.physical_batch_size).clipped_sum(model, loss_fn, batch, draws, max_grad_norm)


@pytest.fixture
def toy():
    register_strategy("toy-contract", Toy, auto_physical_batch_size=7)
    try:
        yield "toy-contract"
    finally:
        STRATEGIES.pop("toy-contract", None)


def test_a_registered_strategy_is_returned_by_get_strategy(toy):
    auto = get_strategy(toy)
    assert isinstance(auto, Toy) and isinstance(auto, GradientStrategy) and auto.physical_batch_size == 7
    assert get_strategy(toy, physical_batch_size=3).physical_batch_size == 3
    assert get_strategy(toy, physical_batch_size=None).physical_batch_size is None
    model, loss, batch, draws = make("mlp")
    sums, norms = get_strategy(toy).clipped_sum(model, loss, batch, draws, 0.1)
    assert norms.shape == (B,) and set(sums) == {n for n, _ in model.named_parameters()}


def test_a_duplicate_or_empty_strategy_name_is_refused(toy):
    with pytest.raises(ValueError, match="already registered"):
        register_strategy(toy, Toy)
    for name in NAMES:
        with pytest.raises(ValueError, match="already registered"):
            register_strategy(name, Toy)
    with pytest.raises(ValueError, match="non-empty"):
        register_strategy("", Toy)
    with pytest.raises(TypeError, match="callable"):
        register_strategy("not-a-factory", Toy(None))
    assert "not-a-factory" not in STRATEGIES
    assert get_strategy(toy).__class__ is Toy  # the first registration stands


def test_get_strategy_errors_name_the_choices():
    with pytest.raises(ValueError) as info:
        get_strategy("fast")
    for name in NAMES:
        assert name in str(info.value)
    assert "'fast'" in str(info.value)
    with pytest.raises(TypeError, match="registered strategy class"):
        get_strategy(object())


def test_only_instances_of_registered_strategy_classes_are_accepted():
    """An object that merely has a clipped_sum (which could skip clipping) is refused; a registered class's
    instance, or a name, is accepted."""

    class NoClip:
        name = "noclip"

        def clipped_sum(self, model, loss_fn, batch, draws, max_grad_norm):  # would return unclipped sums
            raise AssertionError("never called")

    with pytest.raises(TypeError, match="register_strategy"):
        get_strategy(NoClip())
    vmap = get_strategy("vmap")
    assert get_strategy(vmap) is vmap
    with pytest.raises(ValueError, match="physical_batch_size"):
        get_strategy(NAMES[0], physical_batch_size="many")
