"""Loss splits: ℓ_priv + ℓ_pub = ℓ, ℓ_pub reads only Ψ, label-DP gradient −x·yᵀ, leak warnings."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from _fdp_synth import make_tabular
from featuredp.clipping import VmapGradients
from featuredp.engine import as_batch
from featuredp.errors import PrivacyLeakWarning
from featuredp.features import Columns, LabelPrivate
from featuredp.losses import GaussianPadding, LabelDPSplit, Masking, default_split
from featuredp.models import MLP, LogisticRegression, SparseLogisticRegression


def _splits(data):
    return [
        GaussianPadding(Columns(["sex", "race"])),
        Masking(Columns(["sex", "race"])),
        Masking(Columns(["sex"]), fill="mean", mean={"sex=F": 0.5, "sex=M": 0.5}),
        LabelDPSplit(),
        LabelDPSplit(Columns(["race"], label_private=True)),
    ]


def test_private_plus_public_is_the_loss():
    data = make_tabular(50, seed=0)
    batch = as_batch(data)
    torch.manual_seed(0)
    model = MLP(7, (5,), 2)
    for split in _splits(data):
        split.bind(data)
        d = split.draws(batch, torch.Generator().manual_seed(0))
        total = split.private_loss(model, batch, d) + split.public_loss(model, batch, d)
        torch.testing.assert_close(total, split.loss(model, batch, d))
        assert split.loss(model, batch, d).shape == (50,)


def _scramble(batch, cols):
    out = dict(batch)
    x = batch["x"].clone()
    x[:, cols] = torch.randn(x.shape[0], len(cols)) * 5
    out["x"] = x
    return out


def test_public_loss_ignores_private_entries_and_the_full_loss_does_not():
    data = make_tabular(50, seed=1)
    batch = as_batch(data)
    model = MLP(7, (5,), 2)
    for split in _splits(data):
        split.bind(data)
        d = split.draws(batch, torch.Generator().manual_seed(0))
        private_cols = torch.nonzero(split.feature_map.private_entries().get("x", torch.zeros(7, dtype=bool)))
        cols = private_cols.flatten().tolist()
        other = _scramble(batch, cols) if cols else batch
        if getattr(split.feature_map, "label_private", False) or isinstance(split.feature_map, LabelPrivate):
            other = {**other, "y": 1 - batch["y"]}
        assert torch.equal(split.public_loss(model, batch, d), split.public_loss(model, other, d))
        assert not torch.equal(split.loss(model, batch, d), split.loss(model, other, d))


def test_gaussian_padding_fills_private_positions_with_standard_normal_draws():
    data = make_tabular(2000, seed=2)
    split = GaussianPadding(Columns(["race"])).bind(data)
    d = split.draws(as_batch(data), torch.Generator().manual_seed(0))
    filled = split._fill(split.feature_map(as_batch(data)), d)["x"]
    pad = filled[:, 4:7].flatten()
    assert abs(float(pad.mean())) < 0.05 and abs(float(pad.std()) - 1) < 0.05
    torch.testing.assert_close(filled[:, :4], as_batch(data)["x"][:, :4])


def test_label_dp_private_gradient_is_minus_x_centred_y_with_norm_at_most_x():
    data = make_tabular(30, seed=3, n_classes=3)
    batch = as_batch(data)
    torch.manual_seed(0)
    model = LogisticRegression(7, 3, bias=False)
    split = LabelDPSplit()
    g = VmapGradients().per_example_grads(model, split.private_loss, batch, {})["linear.weight"]  # (B, K, d)
    y1h = torch.nn.functional.one_hot(batch["y"], 3).float()
    expected = -torch.einsum("bk,bd->bkd", y1h - 1 / 3, batch["x"])  # ℓ_priv = −(z_y − z̄)
    torch.testing.assert_close(g, expected)
    torch.testing.assert_close(g.flatten(1).norm(dim=1), batch["x"].norm(dim=1) * (2 / 3) ** 0.5)
    # The whole loss's gradient is larger (√2-Lipschitz case): −x(y − p)ᵀ.
    full = VmapGradients().per_example_grads(model, split.loss, batch, {})["linear.weight"]
    assert not torch.allclose(full, expected)
    # ℓ = ℓ_pub + ℓ_priv exactly
    torch.testing.assert_close(split.public_loss(model, batch, {}) + split.private_loss(model, batch, {}),
                               split.loss(model, batch, {}))


def test_label_dp_public_loss_is_bounded_below_along_the_shift_cross_entropy_ignores():
    """Shifting every logit down changes no prediction and no cross-entropy; an uncentred ℓ_pub = logsumexp(z)
    fell without bound along it, and an MLP whose clipped private part did not cancel that pull diverged
    (weights of 1e18, refused by the ghost check as "mixing")."""
    data = make_tabular(30, seed=3, n_classes=3)
    batch = as_batch(data)
    model = LogisticRegression(7, 3)
    split = LabelDPSplit()
    with torch.no_grad():
        base = split.public_loss(model, batch, {})
        model.linear.bias -= 1000.0
        shifted = split.public_loss(model, batch, {})
        ce = split.loss(model, batch, {})
    torch.testing.assert_close(shifted, base, atol=1e-3, rtol=0)  # float32 rounding of logits near −1000
    assert bool((shifted >= np.log(3) - 1e-5).all())
    assert bool(torch.isfinite(ce).all())


def test_label_dp_public_part_with_a_shrunk_private_part_does_not_diverge():
    """What clipping does to Algorithm 1 with a private label: g_pub + c·g_priv with c < 1. With ℓ_pub bounded
    below this is a bounded objective (cross-entropy plus (1 − c) times a pull to the uniform prediction); with
    logsumexp(z) it fell without bound and the MLP's weights grew exponentially."""
    data = make_tabular(64, seed=5, n_classes=3)
    batch = as_batch(data)
    torch.manual_seed(0)
    model = MLP(7, hidden=(16,), n_classes=3)
    split = LabelDPSplit()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for _ in range(400):
        opt.zero_grad()
        (split.public_loss(model, batch, {}) + 0.2 * split.private_loss(model, batch, {})).mean().backward()
        opt.step()
    biggest = max(float(p.abs().max()) for p in model.parameters())
    assert biggest < 100, biggest
    logits = model(batch["x"]).detach()
    assert float(logits.abs().max()) < 100


def test_mean_fill_from_private_data_warns_and_user_mean_does_not(recwarn):
    data = make_tabular(40, seed=4)
    with pytest.warns(PrivacyLeakWarning, match="not covered by the privacy guarantee"):
        Masking(Columns(["sex"]), fill="mean").bind(data)
    Masking(Columns(["sex"]), fill="mean", mean=np.zeros(7)).bind(data)
    assert not [w for w in recwarn if issubclass(w.category, PrivacyLeakWarning)]
    with pytest.raises(ValueError, match="mean must have 7 entries"):
        Masking(Columns(["sex"]), fill="mean", mean=[0.0, 1.0]).bind(data)
    with pytest.raises(ValueError, match="unknown encoded column"):
        Masking(Columns(["sex"]), fill="mean", mean={"sex": 0.5}).bind(data)
    with pytest.raises(ValueError, match="fill must be one of"):
        Masking(Columns(["sex"]), fill="median")


def test_filled_splits_refuse_a_private_label():
    data = make_tabular(40, seed=4)
    with pytest.raises(ValueError, match="use LabelDPSplit"):
        GaussianPadding(Columns(["sex", "label"])).bind(data)
    assert isinstance(default_split(Columns(["sex", "label"]).bind(data)), LabelDPSplit)
    assert isinstance(default_split(LabelPrivate()), LabelDPSplit)
    assert isinstance(default_split(Columns(["sex"])), GaussianPadding)


def test_sparse_model_public_loss_masks_private_codes():
    data = make_tabular(60, seed=5, codes=True)
    batch = as_batch(data)
    model = SparseLogisticRegression([0, 1], [2, 3], 2)
    with torch.no_grad():
        model.embedding.weight.normal_()
    split = GaussianPadding(Columns(["race"])).bind(data)
    other = {**batch, "x_cat": batch["x_cat"].clone()}
    other["x_cat"][:, 1] = (other["x_cat"][:, 1] + 1) % 3
    d = split.draws(batch, torch.Generator().manual_seed(0))
    assert torch.equal(split.public_loss(model, batch, d), split.public_loss(model, other, d))
    assert not torch.equal(split.loss(model, batch, d), split.loss(model, other, d))


def test_zero_masking_multiplies_only_public_columns_and_equals_the_full_view(monkeypatch):
    """Masking(fill='zero') and LabelDPSplit give a columns-aware model just the public columns; the public
    loss and its gradient equal those of the full zero-filled view (a model without ``accepts_columns``)."""
    from featuredp.models.layers import ColumnLinear

    data = make_tabular(40, seed=2)
    batch = as_batch(data)
    torch.manual_seed(0)
    model = MLP(7, (5,), 2)
    plain = torch.nn.Sequential(*model.net)  # the same layers, called the ordinary way
    seen = []
    original = ColumnLinear.forward

    def spy(self, input, columns=None):
        seen.append(None if columns is None else columns.tolist())
        return original(self, input, columns)

    monkeypatch.setattr(ColumnLinear, "forward", spy)
    for split in (Masking(Columns(["sex", "race"])), LabelDPSplit(Columns(["race"], label_private=True))):
        split.bind(data)
        public = (~split.feature_map.private_entries()["x"]).nonzero().flatten().tolist()
        seen.clear()
        fast = split.public_loss(model, batch, {})
        assert seen == [public]
        slow = split.public_loss(plain, batch, {})
        torch.testing.assert_close(fast, slow)
        g_fast = torch.autograd.grad(fast.sum(), list(model.parameters()))
        g_slow = torch.autograd.grad(slow.sum(), list(plain.parameters()))
        for a, b in zip(g_fast, g_slow):
            torch.testing.assert_close(a, b)
    seen.clear()
    GaussianPadding(Columns(["sex"])).bind(data).public_loss(model, batch, {"pad": torch.randn(40, 7)})
    assert seen == [None]  # padding fills the private columns: the full input is multiplied


def test_describe_embeds_the_disclosure_of_the_feature_map():
    data = make_tabular(20, seed=6)
    for split in _splits(data):
        split.bind(data)
        desc = split.describe()
        assert desc["split"] == split.name
        assert desc["feature_map"] == split.feature_map.describe().to_dict()
        assert desc["feature_map"]["hides"]


_DEVICES = ["meta"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", _DEVICES)
def test_draws_and_losses_follow_the_batch_device(device):
    # "meta" tensors refuse to mix with CPU ones: a draw or a fill made on the CPU would fail here.
    data = make_tabular(20, seed=7)
    batch = {k: v.to(device) for k, v in as_batch(data).items()}
    model = MLP(7, (5,), 2).to(device)
    generator = torch.Generator(device=device) if device == "cuda" else torch.Generator()
    for split in _splits(data):
        split.bind(data)
        d = split.draws(batch, generator)
        assert all(v.device.type == device for v in d.values())
        for loss in (split.loss, split.public_loss, split.private_loss):
            assert loss(model, batch, d).device.type == device


@pytest.mark.parametrize("scale", [1.0, 0.3])
def test_padding_is_drawn_for_the_private_entries_only_at_its_scale(scale):
    # The padding draws only what the fill reads: zero at public entries, N(0, scale²) at the private ones, each
    # record's own (a power test over 40,000 entries), on the private draws' generator alone.
    data = make_tabular(5000, seed=1)
    batch = as_batch(data)
    split = GaussianPadding(Columns(["sex", "race"]), scale=scale).bind(data)
    mask = split.feature_map.private_entries()["x"]
    pad = split.draws(batch, torch.Generator().manual_seed(0))["pad"]
    assert pad.shape == batch["x"].shape and torch.all(pad[:, ~mask] == 0)
    drawn = pad[:, mask].double()
    assert drawn.numel() >= 10_000 and abs(float(drawn.mean())) < 4 * scale / drawn.numel() ** 0.5
    assert abs(float(drawn.std()) / scale - 1) < 4 * (0.5 / drawn.numel()) ** 0.5
    rows = torch.corrcoef(drawn[:, :2].T)[0, 1] if drawn.shape[1] > 1 else torch.tensor(0.0)
    assert abs(float(rows)) < 4 / len(drawn) ** 0.5  # entries of one record independent
    again = split.draws(batch, torch.Generator().manual_seed(0))["pad"]
    assert torch.equal(pad, again)  # a function of the generator only: the replay holds the draws fixed
    view = split.feature_map(batch)
    filled = split._fill(view, {"pad": pad})["x"]
    assert torch.equal(filled[:, ~mask], view["x"][:, ~mask]) and torch.equal(filled[:, mask], pad[:, mask])
