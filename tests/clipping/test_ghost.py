"""Ghost clipping equals per-example gradients computed one example at a time.

Every supported layer type, single and double passes (FDP's cross term), with
and without bias, sequence inputs, padded and ragged embeddings, the torch.func
fallback on mixed models, tied weights, in-place ops, the clipping bound, and the
rule registry (a rule registered for a new layer type replaces its fallback).
The reference differentiates each example's loss on its own (batch of one), so
it shares no code with the strategy under test.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch import nn

from featuredp.clipping import GhostGradients, VmapGradients, register_rule
from featuredp.clipping.contributions import Dense, Outer, Rows
from featuredp.clipping.mixed import combine
from featuredp.clipping.rules import RULES, rule_for

RTOL = 1e-5


def reference(model, loss_fn, batch, draws, C):
    """Per-example gradients one at a time → (clipped sum, norms), clip factor min(1, C/(‖g‖+1e-6))."""
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    params = [p for n, p in model.named_parameters() if p.requires_grad]
    B = next(iter(batch.values())).shape[0]
    sums = {n: torch.zeros_like(p, dtype=torch.float64) for n, p in zip(names, params)}
    norms = []
    for i in range(B):
        one = {k: v[i : i + 1] for k, v in batch.items()}
        dr = {k: v[i : i + 1] for k, v in draws.items()}
        gs = torch.autograd.grad(loss_fn(model, one, dr).sum(), params, allow_unused=True)
        gs = [torch.zeros_like(p) if g is None else g for g, p in zip(gs, params)]
        norm = math.sqrt(sum(float(g.double().pow(2).sum()) for g in gs))
        norms.append(norm)
        f = 1.0 if math.isinf(C) else min(1.0, C / (norm + 1e-6))
        for n, g in zip(names, gs):
            sums[n] += f * g.double()
    return sums, torch.tensor(norms, dtype=torch.float64)


def assert_matches(model, loss_fn, batch, draws=None, strategy=None, rtol=RTOL):
    """Ghost = reference at C = inf, at C = median norm (some clipped, some not) and at a tiny C."""
    draws = draws or {}
    strategy = strategy or GhostGradients()
    _, ref_norms = reference(model, loss_fn, batch, draws, math.inf)
    positive = ref_norms[ref_norms > 0]
    for C in (math.inf, float(positive.median()), float(positive.min()) / 4):
        ref_sums, _ = reference(model, loss_fn, batch, draws, C)
        sums, norms = strategy.clipped_sum(model, loss_fn, batch, draws, C)
        torch.testing.assert_close(norms.double(), ref_norms, rtol=rtol, atol=1e-9)
        assert set(sums) == set(ref_sums)
        for n, s in sums.items():
            scale = float(ref_sums[n].abs().max()) + 1e-12
            err = float((s.detach().double() - ref_sums[n]).abs().max())
            assert err <= rtol * scale * 10 + 1e-9, f"{n}: max error {err:.3g} vs scale {scale:.3g} (C={C})"
    return strategy


def sq_loss(out):
    return out.reshape(out.shape[0], -1).pow(2).sum(1) / 2 + out.reshape(out.shape[0], -1).sum(1)


def single(model_key="x"):
    return lambda model, batch, draws: sq_loss(model(batch[model_key]))


def double(model_key="x", pad_key="pad"):
    """ℓ(x) − ℓ(x') through the same layers (x' from the draws), like FDP's private loss."""
    return lambda model, batch, draws: sq_loss(model(batch[model_key])) - sq_loss(model(draws[pad_key]))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# -- Linear ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("passes", ["single", "double"])
def test_mlp_linear(bias, passes):
    model = nn.Sequential(nn.Linear(7, 5, bias=bias), nn.Tanh(), nn.Linear(5, 3, bias=bias))
    x = torch.randn(9, 7)
    draws = {"pad": torch.randn(9, 7)}
    assert_matches(model, single() if passes == "single" else double(), {"x": x}, draws)


@pytest.mark.parametrize("shape", [(3, 20, 10), (30, 3, 2)])  # Gram form / materialised form
@pytest.mark.parametrize("passes", ["single", "double"])
def test_linear_over_tokens(shape, passes):
    T, din, dout = shape
    model = nn.Sequential(nn.Linear(din, dout), nn.GELU(), nn.Linear(dout, 2))
    x = torch.randn(6, T, din)
    draws = {"pad": torch.randn(6, T, din)}
    assert_matches(model, single() if passes == "single" else double(), {"x": x}, draws)


def test_linear_four_dim_input():
    model = nn.Linear(4, 3)
    assert_matches(model, single(), {"x": torch.randn(5, 2, 3, 4)})


def test_fdp_cross_term_needs_the_cross_term():
    """Without the 2(a1·a2)(g1·g2) term the norm of ℓ(x) − ℓ(x') is wrong: check we are far from that."""
    model = nn.Linear(6, 4, bias=False)
    x = torch.randn(8, 6)
    draws = {"pad": x + 0.1 * torch.randn(8, 6)}
    _, norms = GhostGradients().clipped_sum(model, double(), {"x": x}, draws, math.inf)
    _, ref = reference(model, double(), {"x": x}, draws, math.inf)
    torch.testing.assert_close(norms.double(), ref, rtol=RTOL, atol=0)
    _, n1 = reference(model, single(), {"x": x}, {}, math.inf)
    _, n2 = reference(model, lambda m, b, d: sq_loss(m(d["pad"])), {"x": x}, draws, math.inf)
    no_cross = (n1**2 + n2**2).sqrt()
    assert bool((no_cross > 3 * ref).all())  # the passes nearly cancel; ignoring the cross term would not


def test_near_cancellation_is_exact():
    """ℓ(x) − ℓ(x + 1e-4·noise) with large gradients: the squared-norm terms cancel to ~1e-8 relative.

    A float32 Gram form gives garbage here (and could let a large gradient through unclipped);
    the float64 Gram form matches a float64 reference.
    """
    model = nn.Sequential(nn.Linear(30, 20), nn.Tanh(), nn.Linear(20, 10))
    x = 10 * torch.randn(8, 30)
    draws = {"pad": x + 1e-4 * torch.randn(8, 30)}
    _, norms = GhostGradients().clipped_sum(model, double(), {"x": x}, draws, math.inf)
    m64 = nn.Sequential(nn.Linear(30, 20), nn.Tanh(), nn.Linear(20, 10)).double()
    m64.load_state_dict({k: v.double() for k, v in model.state_dict().items()})
    _, ref64 = reference(m64, double(), {"x": x.double()}, {"pad": draws["pad"].double()}, math.inf)
    # float32 forward differences limit the agreement, not the norm formula: 2% here versus O(1) without float64.
    torch.testing.assert_close(norms.double(), ref64, rtol=0.05, atol=0)


# -- Embeddings -----------------------------------------------------------------------------------------------


class EmbedModel(nn.Module):
    def __init__(self, padding_idx=None):
        super().__init__()
        self.emb = nn.Embedding(11, 4, padding_idx=padding_idx)
        self.out = nn.Linear(4, 3)

    def forward(self, idx):
        return self.out(torch.tanh(self.emb(idx)).mean(1))


@pytest.mark.parametrize("padding_idx", [None, 0])
@pytest.mark.parametrize("passes", ["single", "double"])
def test_embedding(padding_idx, passes):
    model = EmbedModel(padding_idx)
    idx = torch.randint(0, 11, (7, 6))
    idx[:, :2] = 0  # repeated rows within an example, and the padding row
    draws = {"pad": torch.randint(0, 11, (7, 6))}
    assert_matches(model, single() if passes == "single" else double(), {"x": idx}, draws)


def test_masked_category_codes_model():
    """The package's sparse categorical model: -1 codes are masked (zero contribution)."""
    from featuredp.models.linear import SparseLogisticRegression

    model = SparseLogisticRegression([0, 2], [3, 5, 2], n_classes=3)
    nn.init.normal_(model.embedding.weight)
    x = torch.randn(8, 4)
    codes = torch.stack([torch.randint(0, c, (8,)) for c in (3, 5, 2)], 1)
    codes[::3, 1] = -1
    batch = {"x": x, "x_cat": codes, "y": torch.randint(0, 3, (8,))}

    def loss(model, batch, draws):
        logits = model(batch)
        masked = dict(batch, x_cat=torch.full_like(batch["x_cat"], -1))
        return nn.functional.cross_entropy(logits, batch["y"], reduction="none") - torch.logsumexp(
            model(masked), -1
        )

    assert_matches(model, loss, batch)


class BagModel(nn.Module):
    """Ragged bags built from a padded (B, L) tensor and lengths: the EmbeddingBag sees 1-d input + offsets."""

    def __init__(self, mode, padding_idx=None, include_last_offset=False, weighted=False):
        super().__init__()
        self.bag = nn.EmbeddingBag(13, 5, mode=mode, padding_idx=padding_idx, include_last_offset=include_last_offset)
        self.out = nn.Linear(5, 2)
        self.weighted = weighted

    def forward(self, idx, lengths, weights):
        L = idx.shape[1]
        keep = torch.arange(L).unsqueeze(0) < lengths.unsqueeze(1)
        flat = idx[keep]
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)[:-1]])
        if self.bag.include_last_offset:
            offsets = torch.cat([offsets, lengths.sum().reshape(1)])
        psw = weights[keep] if self.weighted else None
        return self.out(torch.tanh(self.bag(flat, offsets, per_sample_weights=psw)))


@pytest.mark.parametrize(
    "kw",
    [
        {"mode": "sum"},
        {"mode": "sum", "weighted": True},
        {"mode": "mean"},
        {"mode": "mean", "padding_idx": 1},
        {"mode": "sum", "padding_idx": 1, "include_last_offset": True},
    ],
)
@pytest.mark.parametrize("passes", ["single", "double"])
def test_embedding_bag_ragged(kw, passes):
    model = BagModel(**kw)
    B, L = 7, 6
    idx = torch.randint(0, 13, (B, L))
    idx[:, 1] = idx[:, 0]  # repeated index inside a bag
    idx[::2, 2] = 1
    lengths = torch.randint(0, L + 1, (B,))
    lengths[0] = 0  # an empty bag
    batch = {"idx": idx, "len": lengths, "w": torch.rand(B, L)}
    draws = {"idx2": torch.randint(0, 13, (B, L))}

    def loss1(model, b, d):
        return sq_loss(model(b["idx"], b["len"], b["w"]))

    def loss2(model, b, d):
        return loss1(model, b, d) - sq_loss(model(d["idx2"], b["len"], b["w"]))

    assert_matches(model, loss1 if passes == "single" else loss2, batch, draws)


def test_embedding_bag_2d_input():
    model = nn.Sequential(nn.EmbeddingBag(9, 3, mode="mean", padding_idx=0), nn.Linear(3, 2))
    idx = torch.randint(0, 9, (6, 4))
    assert_matches(model, single(), {"x": idx})


# -- Convolutions ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"stride": 2, "bias": False},
        {"dilation": 2, "padding": 2},
        {"groups": 2, "padding": "same"},
        {"padding": 1, "padding_mode": "reflect"},
        {"padding": 1, "padding_mode": "circular", "stride": 2},
    ],
)
@pytest.mark.parametrize("passes", ["single", "double"])
def test_conv1d(kw, passes):
    model = nn.Sequential(nn.Conv1d(4, 6, 3, **kw), nn.Tanh(), nn.Flatten(), nn.LazyLinear(2))
    x = torch.randn(5, 4, 11)
    model(x)  # materialise the lazy layer
    assert_matches(model, single() if passes == "single" else double(), {"x": x}, {"pad": torch.randn(5, 4, 11)})


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"stride": 2, "padding": 1, "bias": False},
        {"groups": 2, "dilation": (1, 2), "padding": "same"},
        {"padding": 1, "padding_mode": "replicate"},
        {"kernel_size": (2, 3), "stride": (1, 2)},
    ],
)
@pytest.mark.parametrize("passes", ["single", "double"])
def test_conv2d(kw, passes):
    kw = dict(kw)
    k = kw.pop("kernel_size", 3)
    model = nn.Sequential(nn.Conv2d(4, 6, k, **kw), nn.GroupNorm(2, 6), nn.SiLU(), nn.Flatten(), nn.LazyLinear(3))
    x = torch.randn(4, 4, 7, 8)
    model(x)
    assert_matches(model, single() if passes == "single" else double(), {"x": x}, {"pad": torch.randn(4, 4, 7, 8)})


def test_conv_materialised_and_gram_paths_agree():
    """Large spatial maps take the materialised path, 1x1 maps the Gram path; both exact."""
    big = nn.Sequential(nn.Conv2d(2, 3, 3, padding=1), nn.Flatten(), nn.LazyLinear(2))
    x = torch.randn(3, 2, 12, 12)
    big(x)
    assert_matches(big, single(), {"x": x})
    small = nn.Sequential(nn.Conv1d(16, 32, 2), nn.Flatten(), nn.LazyLinear(2))
    x = torch.randn(3, 16, 3)
    small(x)
    assert_matches(small, double(), {"x": x}, {"pad": torch.randn(3, 16, 3)})


# -- Normalisation layers -------------------------------------------------------------------------------------


@pytest.mark.parametrize("layer", ["layernorm", "layernorm2d", "groupnorm", "rmsnorm", "layernorm_nobias"])
@pytest.mark.parametrize("passes", ["single", "double"])
def test_norm_affine(layer, passes):
    if layer == "layernorm":
        model, shape = nn.Sequential(nn.Linear(6, 8), nn.LayerNorm(8), nn.Linear(8, 2)), (5, 3, 6)
    elif layer == "layernorm2d":
        model, shape = nn.Sequential(nn.LayerNorm([3, 6]), nn.Linear(6, 2)), (5, 3, 6)
    elif layer == "layernorm_nobias":
        model, shape = nn.Sequential(nn.LayerNorm(6, bias=False), nn.Linear(6, 2)), (5, 6)
    elif layer == "groupnorm":
        model, shape = nn.Sequential(nn.GroupNorm(3, 6), nn.Flatten(), nn.Linear(24, 2)), (5, 6, 4)
    else:
        model, shape = nn.Sequential(nn.Linear(6, 8), nn.RMSNorm(8), nn.Linear(8, 2)), (5, 6)
    for p in model.parameters():  # move the affine parameters away from their (1, 0) init
        nn.init.normal_(p)
    x = torch.randn(*shape)
    assert_matches(model, single() if passes == "single" else double(), {"x": x}, {"pad": torch.randn(*shape)})


# -- Fallback, tied weights, in-place ops, whole-model fallback ------------------------------------------------


class Mixed(nn.Module):
    """Supported layers plus a PReLU (no ghost rule) and a bare parameter on the root module."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(5, 6)
        self.act = nn.PReLU(6)
        self.fc2 = nn.Linear(6, 3)
        self.scale = nn.Parameter(torch.tensor(1.5))

    def forward(self, x):
        return self.scale * self.fc2(self.act(self.fc1(x)))


def test_fallback_mixed_model_same_update_as_ghost_and_vmap():
    model = Mixed()
    x = torch.randn(8, 5)
    draws = {"pad": torch.randn(8, 5)}
    with pytest.warns(UserWarning, match="act.weight"):
        strategy = assert_matches(model, double(), {"x": x}, draws)
    assert any(s.startswith("act (PReLU)") for s in strategy.fallback_layers)
    assert strategy.plan(model).fallback == ["scale", "act.weight"]
    # The same update as the all-torch.func strategy of the engine.
    C = 0.5
    g_sums, g_norms = strategy.clipped_sum(model, double(), {"x": x}, draws, C)
    v_sums, v_norms = VmapGradients(None).clipped_sum(model, double(), {"x": x}, draws, C)
    torch.testing.assert_close(g_norms, v_norms, rtol=RTOL, atol=1e-7)
    for k in v_sums:
        torch.testing.assert_close(g_sums[k], v_sums[k], rtol=RTOL, atol=1e-7)


def test_fallback_refuses_dropout():
    model = nn.Sequential(Mixed(), nn.Dropout(0.5))
    with pytest.warns(UserWarning), pytest.raises(ValueError, match="dropout"):
        GhostGradients().clipped_sum(model, single(), {"x": torch.randn(4, 5)}, {}, 1.0)


def test_dropout_without_fallback_is_allowed_and_clipped():
    model = nn.Sequential(nn.Linear(5, 6), nn.Dropout(0.5), nn.Linear(6, 3))
    sums, norms = GhostGradients().clipped_sum(model, single(), {"x": torch.randn(16, 5)}, {}, 0.1)
    assert norms.shape == (16,)
    assert all(torch.isfinite(s).all() for s in sums.values())


class Tied(nn.Module):
    """The embedding table is reused functionally as the output layer (weight tying)."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.mid = nn.Linear(4, 4)

    def forward(self, idx):
        h = torch.tanh(self.mid(self.emb(idx).mean(1)))
        return nn.functional.linear(h, self.emb.weight)


def test_tied_weights_are_detected_and_exact():
    model = Tied()
    idx = torch.randint(0, 10, (6, 3))
    with pytest.warns(UserWarning, match="outside the layer"):
        strategy = assert_matches(model, single(), {"x": idx})
    assert "emb.weight" in strategy.plan(model).fallback


class InPlace(nn.Module):
    """Layer outputs modified in place downstream (ReLU(inplace=True), mul_)."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(5, 6)
        self.act = nn.ReLU(inplace=True)
        self.fc2 = nn.Linear(6, 3)

    def forward(self, x):
        h = self.act(self.fc1(x))
        out = self.fc2(h)
        out.mul_(3.0)
        return out


def test_in_place_modifications_of_outputs_are_handled():
    model = InPlace()
    x = torch.randn(7, 5)
    strategy = assert_matches(model, double(), {"x": x}, {"pad": torch.randn(7, 5)})
    plan = strategy.plan(model)
    assert {id(model.fc1), id(model.fc2)} <= plan.clone_outputs


def test_in_place_modification_of_an_input_is_refused():
    class Bad(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 2)

        def forward(self, x):
            h = x * 2
            out = self.fc(h)
            h.add_(1.0)
            return out

    with pytest.raises(ValueError, match="modified in place"):
        GhostGradients().clipped_sum(Bad(), single(), {"x": torch.randn(4, 3)}, {}, 1.0)


def test_concatenated_passes_fall_back_to_torch_func():
    """A loss that runs x and x' as one batch of 2B breaks the row ↔ example map: whole-model fallback."""
    model = nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 2))

    def cat_loss(model, batch, draws):
        out = sq_loss(model(torch.cat([batch["x"], draws["pad"]])))
        B = batch["x"].shape[0]
        return out[:B] - out[B:]

    with pytest.warns(UserWarning, match="whole model"):
        assert_matches(model, cat_loss, {"x": torch.randn(6, 4)}, {"pad": torch.randn(6, 4)})


# -- Options, reductions and input checks ---------------------------------------------------------------------


def test_physical_batches_agree():
    model = nn.Sequential(nn.Linear(7, 5), nn.ReLU(), nn.Linear(5, 3))
    x = torch.randn(10, 7)
    draws = {"pad": torch.randn(10, 7)}
    assert_matches(model, double(), {"x": x}, draws, strategy=GhostGradients(physical_batch_size=3))


def test_clipped_contributions_respect_the_bound():
    """Σ_i c_i g_i with each c_i g_i of norm ≤ C: the sum of B clipped gradients has norm ≤ B·C, and a single
    example's clipped gradient has norm ≤ C (to float rounding)."""
    model = nn.Sequential(nn.Linear(7, 5), nn.Tanh(), nn.Linear(5, 3))
    x = 20 * torch.randn(6, 7)
    draws = {"pad": torch.randn(6, 7)}
    C = 0.01
    for i in range(6):
        one, pad = {"x": x[i : i + 1]}, {"pad": draws["pad"][i : i + 1]}
        sums, norms = GhostGradients().clipped_sum(model, double(), one, pad, C)
        total = math.sqrt(sum(float(s.double().pow(2).sum()) for s in sums.values()))
        assert norms[0] > C
        assert total <= C * (1 + 1e-5)


def test_infinite_clip_norm_is_the_plain_gradient():
    model = nn.Sequential(nn.Linear(7, 5), nn.Tanh(), nn.Linear(5, 3))
    x = torch.randn(10, 7)
    sums, _ = GhostGradients().clipped_sum(model, single(), {"x": x}, {}, math.inf)
    model.zero_grad()
    single()(model, {"x": x}, {}).sum().backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(sums[n], p.grad, rtol=1e-5, atol=1e-6)


def test_empty_batch_and_frozen_parameters():
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    model[0].weight.requires_grad_(False)
    sums, norms = GhostGradients().clipped_sum(model, single(), {"x": torch.zeros(0, 3)}, {}, 1.0)
    assert norms.shape == (0,) and set(sums) == {"0.bias", "1.weight", "1.bias"}
    assert all(float(s.abs().sum()) == 0 for s in sums.values())
    assert_matches(model, single(), {"x": torch.randn(5, 3)})


def test_bad_inputs_are_named():
    model = nn.Linear(3, 2)
    with pytest.raises(ValueError, match="max_grad_norm"):
        GhostGradients().clipped_sum(model, single(), {"x": torch.randn(4, 3)}, {}, -1.0)
    with pytest.raises(ValueError, match="per-example losses"):
        GhostGradients().clipped_sum(model, lambda m, b, d: m(b["x"]), {"x": torch.randn(4, 3)}, {}, 1.0)
    with pytest.raises(ValueError, match="first"):
        GhostGradients().clipped_sum(model, single(), {"x": torch.randn(4, 3)}, {"pad": torch.randn(5, 3)}, 1.0)
    with pytest.raises(ValueError, match="BatchNorm"):
        GhostGradients().clipped_sum(nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2)), single(),
                                     {"x": torch.randn(4, 3)}, {}, 1.0)
    for bad in ("twice", "backward"):  # the unchecked second backward pass is gone
        with pytest.raises(ValueError, match="reweight"):
            GhostGradients(reweight=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="physical_batch_size"):
        GhostGradients(physical_batch_size=0)


def test_no_warning_for_fully_supported_models():
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        strategy = GhostGradients()
        strategy.clipped_sum(model, single(), {"x": torch.randn(4, 3)}, {}, 1.0)
    assert strategy.fallback_layers == []


# -- Column subsets (ColumnLinear) and separate passes --------------------------------------------------------


def test_zero_masked_second_pass_on_a_column_subset():
    """ℓ(x) − ℓ(x with private columns zero), the second pass given only the public columns (FDP's zero
    masking with ColumnLinear): norms and clipped sums equal per-example autograd, and equal the same loss
    computed on the full zero-filled input."""
    from featuredp.models import MLP

    model = MLP(10, (6,), 3)
    public = torch.tensor([1, 4, 5])
    x = torch.randn(9, 10)
    masked = torch.zeros_like(x)
    masked[:, public] = x[:, public]

    def subset(m, batch, draws):
        return sq_loss(m(batch["x"])) - sq_loss(m(batch["x"][:, public], columns=public))

    def full(m, batch, draws):
        return sq_loss(m(batch["x"])) - sq_loss(m(draws["pad"]))

    assert_matches(model, subset, {"x": x})
    a, na = GhostGradients().clipped_sum(model, subset, {"x": x}, {}, 0.5)
    b, nb = GhostGradients().clipped_sum(model, full, {"x": x}, {"pad": masked}, 0.5)
    torch.testing.assert_close(na, nb)
    for k in a:
        torch.testing.assert_close(a[k], b[k])


def test_passes_on_different_column_subsets_and_a_single_subset_pass():
    from featuredp.models.layers import ColumnLinear

    layer = ColumnLinear(8, 3)
    c1, c2 = torch.tensor([0, 2, 3]), torch.tensor([2, 5])
    x = torch.randn(7, 8)

    def two_subsets(m, batch, draws):
        return sq_loss(m(batch["x"][:, c1], columns=c1)) - sq_loss(m(batch["x"][:, c2], columns=c2))

    assert_matches(layer, two_subsets, {"x": x})
    assert_matches(layer, lambda m, b, d: sq_loss(m(b["x"][:, c1], columns=c1)), {"x": x})


def test_three_passes_are_exact():
    model = nn.Sequential(nn.Linear(6, 4), nn.Tanh(), nn.Linear(4, 2))
    x = torch.randn(8, 6)
    draws = {"p": torch.randn(8, 6), "q": x + 0.01 * torch.randn(8, 6)}

    def three(m, batch, d):
        return sq_loss(m(batch["x"])) - 0.5 * sq_loss(m(d["p"])) - 0.5 * sq_loss(m(d["q"]))

    assert_matches(model, three, {"x": x}, draws)


# -- The rule registry ----------------------------------------------------------------------------------------


class Scale(nn.Module):
    """A layer without a built-in ghost rule: y = x ∘ weight over the last dimension."""

    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(d))

    def forward(self, x):
        return x * self.weight


def _scale_rule(m, args, kwargs, grad, B, name):
    x = args[0]
    return {"weight": Dense((grad * x).reshape(B, -1, x.shape[-1]).sum(1))}


def test_a_registered_rule_replaces_the_fallback():
    """The two-file recipe of rules.py: register a rule for the layer type, test it against autograd."""
    model = nn.Sequential(nn.Linear(4, 5), Scale(5), nn.Tanh(), nn.Linear(5, 2))
    x, draws = torch.randn(7, 3, 4), {"pad": torch.randn(7, 3, 4)}
    with pytest.warns(UserWarning, match="1.weight"):
        assert GhostGradients().plan(model).fallback == ["1.weight"]
    register_rule(Scale)(_scale_rule)
    try:
        assert rule_for(Scale(2)) == (_scale_rule, "")
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            strategy = assert_matches(model, double(), {"x": x}, draws)
        assert strategy.plan(model).fallback == [] and strategy.fallback_layers == []
    finally:
        del RULES[Scale]


def test_register_rule_refuses_duplicates_and_non_modules():
    with pytest.raises(ValueError, match="Linear already has a ghost rule"):
        register_rule(Scale, nn.Linear)(_scale_rule)
    assert Scale not in RULES  # all or nothing
    with pytest.raises(TypeError, match="Module subclasses"):
        register_rule(int)
    with pytest.raises(ValueError, match="at least one"):
        register_rule()


def test_rule_for_names_why_a_layer_falls_back():
    assert rule_for(nn.PReLU()) == (None, "no ghost rule for this layer type")
    assert rule_for(nn.Embedding(3, 2, scale_grad_by_freq=True)) == (None, "scale_grad_by_freq")
    assert rule_for(nn.EmbeddingBag(3, 2, mode="max")) == (None, "mode='max'")
    assert rule_for(nn.EmbeddingBag(3, 2, scale_grad_by_freq=True)) == (None, "scale_grad_by_freq")

    class MyLinear(nn.Linear):  # may override forward: exact types only
        pass

    assert rule_for(MyLinear(2, 2))[0] is None
    for layer in (nn.Linear(2, 2), nn.Conv1d(1, 1, 1), nn.Conv2d(1, 1, 1), nn.Embedding(3, 2), nn.LayerNorm(2),
                  nn.GroupNorm(1, 2), nn.EmbeddingBag(3, 2)):
        rule, why = rule_for(layer)
        assert rule is not None and why == "", type(layer).__name__


def test_contributions_of_different_kinds_are_not_combined():
    a = Outer(torch.randn(3, 1, 1, 2), torch.randn(3, 1, 1, 4), torch.Size([4, 2]))
    rows = Rows(torch.tensor([0, 2]), torch.tensor([1, 1]), torch.randn(2, 2), 3, torch.Size([5, 2]))
    with pytest.raises(TypeError, match="different kinds"):
        combine([a, rows])
    both = combine([a, a])  # two single-token passes: kept apart, the norm has the cross term
    torch.testing.assert_close(both.squared_norms(), 4 * a.squared_norms())
    torch.testing.assert_close(both.weighted_sum(torch.ones(3)), 2 * a.weighted_sum(torch.ones(3)))
