"""VmapGradients (torch.func per-example gradients): clipping of ∇ℓ_priv as a whole, noise, and the
batch-mixing refusal."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats
from torch import nn

from _fdp_synth import make_tabular
from featuredp.batches import as_batch
from featuredp.clipping import GradientStrategy, VmapGradients, check_no_batch_mixing, clip_factors, get_strategy
from featuredp.features import Columns
from featuredp.losses import GaussianPadding
from featuredp.models import MLP, SparseLogisticRegression
from featuredp.noise import add_noise


@pytest.fixture
def setup():
    data = make_tabular(40, seed=0)
    split = GaussianPadding(Columns(["sex", "race"])).bind(data)
    torch.manual_seed(0)
    model = MLP(7, (6,), 2, activation="tanh")
    batch = as_batch(data)
    draws = split.draws(batch, torch.Generator().manual_seed(1))
    return model, split, batch, draws


def _one_at_a_time(model, loss_fn, batch, draws):
    out = []
    for i in range(next(iter(batch.values())).shape[0]):
        b = {k: v[i : i + 1] for k, v in batch.items()}
        d = {k: v[i : i + 1] for k, v in draws.items()}
        out.append(torch.autograd.grad(loss_fn(model, b, d).sum(), list(model.parameters())))
    return out


def test_per_example_grads_equal_one_at_a_time_for_the_private_loss(setup):
    model, split, batch, draws = setup
    g = VmapGradients(physical_batch_size=None).per_example_grads(model, split.private_loss, batch, draws)
    ref = _one_at_a_time(model, split.private_loss, batch, draws)
    for j, (name, _) in enumerate(model.named_parameters()):
        torch.testing.assert_close(g[name], torch.stack([r[j] for r in ref]), rtol=1e-5, atol=1e-6)


def test_clipping_bounds_every_private_gradient_and_applies_to_the_whole_private_loss(setup):
    model, split, batch, draws = setup
    C = 0.05
    sums, norms = VmapGradients(physical_batch_size=None).clipped_sum(model, split.private_loss, batch, draws, C)
    ref = _one_at_a_time(model, split.private_loss, batch, draws)
    ref_norms = torch.stack([torch.sqrt(sum(t.pow(2).sum() for t in r)) for r in ref])
    torch.testing.assert_close(norms, ref_norms, rtol=1e-5, atol=1e-7)
    assert (ref_norms > C).sum() >= 10  # clipping is active for most examples
    clipped = [[t * min(1.0, C / float(n)) for t in r] for r, n in zip(ref, ref_norms)]
    for r in clipped:
        assert math.sqrt(sum(float(t.pow(2).sum()) for t in r)) <= C * (1 + 1e-6)
    for j, (name, _) in enumerate(model.named_parameters()):
        torch.testing.assert_close(sums[name], sum(r[j] for r in clipped), rtol=1e-4, atol=1e-6)
    # Clipping ∇ℓ and ∇ℓ_pub separately (the wrong rule) gives a different sum.
    g_full = _one_at_a_time(model, split.loss, batch, draws)
    g_pub = _one_at_a_time(model, split.public_loss, batch, draws)

    def clip(r):
        n = math.sqrt(sum(float(t.pow(2).sum()) for t in r))
        return [t * min(1.0, C / n) for t in r]

    wrong = [sum(clip(a)[j] - clip(b)[j] for a, b in zip(g_full, g_pub)) for j in range(len(ref[0]))]
    assert not torch.allclose(wrong[0], sums["net.0.weight"], atol=1e-5)


def test_physical_chunks_do_not_change_the_result(setup):
    model, split, batch, draws = setup
    s1, n1 = VmapGradients(physical_batch_size=None).clipped_sum(model, split.private_loss, batch, draws, 0.1)
    s2, n2 = VmapGradients(physical_batch_size=7).clipped_sum(model, split.private_loss, batch, draws, 0.1)
    torch.testing.assert_close(n1, n2)
    for k in s1:
        torch.testing.assert_close(s1[k], s2[k], rtol=1e-6, atol=1e-6)


def test_infinite_clip_is_the_plain_sum_and_empty_batch_is_zero(setup):
    model, split, batch, draws = setup
    sums, _ = VmapGradients().clipped_sum(model, split.loss, batch, draws, math.inf)
    total = torch.autograd.grad(split.loss(model, batch, draws).sum(), list(model.parameters()))
    for (name, _), t in zip(model.named_parameters(), total):
        torch.testing.assert_close(sums[name], t, rtol=1e-5, atol=1e-6)
    empty = {k: v[:0] for k, v in batch.items()}
    sums, norms = VmapGradients().clipped_sum(model, split.loss, empty, {k: v[:0] for k, v in draws.items()}, 1.0)
    assert norms.numel() == 0 and all(float(v.abs().sum()) == 0 for v in sums.values())


def test_clip_factors_and_frozen_parameters_are_skipped(setup):
    model, split, batch, draws = setup
    f = clip_factors(torch.tensor([0.0, 0.5, 2.0]), 1.0)
    assert f[0] == 1 and f[1] == 1 and 0.49 < f[2] < 0.5
    model.net[0].bias.requires_grad_(False)
    sums, _ = VmapGradients().clipped_sum(model, split.private_loss, batch, draws, 1.0)
    assert "net.0.bias" not in sums and "net.0.weight" in sums


def test_sparse_embedding_model_per_example_grads():
    data = make_tabular(30, seed=2, codes=True)
    split = GaussianPadding(Columns(["race"])).bind(data)
    model = SparseLogisticRegression([0, 1], [2, 3], 2)
    with torch.no_grad():
        model.embedding.weight.normal_()
    batch = as_batch(data)
    draws = split.draws(batch, torch.Generator().manual_seed(0))
    g = VmapGradients().per_example_grads(model, split.private_loss, batch, draws)
    ref = _one_at_a_time(model, split.private_loss, batch, draws)
    for j, (name, _) in enumerate(model.named_parameters()):
        torch.testing.assert_close(g[name], torch.stack([r[j] for r in ref]), rtol=1e-5, atol=1e-6)
    # Embedding gradients are sparse per example: only the rows of the example's own codes are touched.
    codes = batch["x_cat"] + torch.tensor([0, 2])
    touched = torch.zeros(30, 5, dtype=torch.bool)
    touched[torch.arange(30)[:, None], codes] = True
    assert float(g["embedding.weight"][~touched].abs().sum()) == 0
    assert float(g["embedding.weight"][touched].abs().sum()) > 0


@pytest.mark.statistical
def test_add_noise_std_with_power():
    grads = {"a": torch.zeros(3000), "b": torch.ones(20, 50)}
    noisy = add_noise(grads, 0.7, torch.Generator().manual_seed(3))
    z = np.concatenate([noisy["a"].numpy(), (noisy["b"] - 1).flatten().numpy()]) / 0.7

    def pval(x):
        chi = float((x**2).sum())
        return 2 * min(stats.chi2.cdf(chi, x.size), stats.chi2.sf(chi, x.size))

    assert pval(z) > 1e-3
    assert pval(z * 1.5) < 1e-6  # tested against 2/3 of the std: rejected
    assert torch.equal(add_noise(grads, 0.0, torch.Generator())["b"], grads["b"])
    with pytest.raises(ValueError, match="std must be >= 0"):
        add_noise(grads, -1.0, torch.Generator())


@pytest.mark.parametrize(
    "layer",
    [nn.BatchNorm1d(4), nn.SyncBatchNorm(4), nn.InstanceNorm1d(4, track_running_stats=True), nn.LazyBatchNorm1d()],
)
def test_batch_mixing_layers_refused_with_the_fix(layer):
    model = nn.Sequential(nn.Linear(3, 4), layer, nn.Linear(4, 2))
    with pytest.raises(ValueError, match=r"layer '1' .*(GroupNorm|track_running_stats=False)"):
        check_no_batch_mixing(model)


def test_per_example_normalisation_layers_accepted():
    check_no_batch_mixing(nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4), nn.GroupNorm(2, 4), nn.InstanceNorm1d(4)))


@pytest.mark.parametrize(
    ("layer", "match"),
    [
        (nn.MultiheadAttention(4, 2), r"layer '1' \(MultiheadAttention, batch_first=False\) .*batch_first=True$"),
        (
            nn.TransformerEncoderLayer(4, 2, 8),
            r"layer '1' \(TransformerEncoderLayer, batch_first=False, attention 'self_attn'\) .*batch_first=True$",
        ),
        (
            nn.TransformerDecoderLayer(4, 2, 8),
            r"layer '1' \(TransformerDecoderLayer, batch_first=False, attention 'self_attn', 'multihead_attn'\)",
        ),
        (nn.Embedding(5, 4, max_norm=1.0), r"layer '1' \(Embedding, max_norm=1.0\) .*max_norm=None"),
        (nn.EmbeddingBag(5, 4, max_norm=2.0), r"layer '1' \(EmbeddingBag, max_norm=2.0\) .*max_norm=None"),
    ],
    ids=["mha", "encoder_layer", "decoder_layer", "embedding", "embedding_bag"],
)
def test_attention_across_examples_and_in_place_renormalisation_refused_with_the_fix(layer, match):
    """Sequence-first attention fed featuredp's batch-first batches attends across examples; max_norm rewrites
    the looked-up (private) rows of the table during the forward. One line, naming the layer and the fix."""
    from featuredp.errors import FeatureDPError

    with pytest.raises(ValueError, match=match) as err:
        check_no_batch_mixing(nn.Sequential(nn.Identity(), layer))
    assert isinstance(err.value, FeatureDPError) and "\n" not in str(err.value)


def test_batch_first_attention_and_plain_embeddings_accepted():
    check_no_batch_mixing(
        nn.ModuleList(
            [
                nn.MultiheadAttention(4, 2, batch_first=True),
                nn.TransformerEncoderLayer(4, 2, 8, batch_first=True),
                nn.Transformer(4, 2, 1, 1, 8, batch_first=True),
                nn.Embedding(5, 4),
                nn.EmbeddingBag(5, 4),
            ]
        )
    )


def test_get_strategy():
    s = get_strategy("vmap", physical_batch_size=32)
    assert isinstance(s, VmapGradients) and s.physical_batch_size == 32 and isinstance(s, GradientStrategy)
    with pytest.raises(ValueError, match="strategy must be"):
        get_strategy("fast")
    with pytest.raises(TypeError, match="registered strategy class"):
        get_strategy(object())
