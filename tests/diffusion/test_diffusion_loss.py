"""The diffusion loss split: ℓ and ℓ_pub share the timestep and the noise (common random numbers)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from featuredp.clipping import VmapGradients
from featuredp.diffusion.losses import DiffusionLoss
from featuredp.diffusion.schedule import NoiseSchedule
from featuredp.diffusion.unet import build_unet
from featuredp.features import Batch
from featuredp.features.image import BoxMask, GaussianBlur


def _smooth_batch(b: int = 8, seed: int = 0) -> Batch:
    """Images with structure at several scales (blurring changes them, but not completely)."""
    g = torch.Generator().manual_seed(seed)
    coarse = torch.rand((b, 1, 7, 7), generator=g)
    x = nn.functional.interpolate(coarse, size=(28, 28), mode="bilinear", align_corners=False)
    x = x + 0.3 * torch.rand((b, 1, 28, 28), generator=g)
    return {"x": (x / x.amax() * 2 - 1), "y": torch.randint(0, 10, (b,), generator=g)}


class _Spy(nn.Module):
    """Records (x_t, t) of every call; predicts a fixed function of its input."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.tensor(0.5))
        self.calls: list[tuple[torch.Tensor, torch.Tensor]] = []

    def forward(self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        self.calls.append((x.detach().clone(), t.clone()))
        return self.w * x


class _FreshDraws(DiffusionLoss):
    """A WRONG split (negative control): the public term draws its own t and noise."""

    def _public_loss(self, model, view, draws):  # type: ignore[override]
        g = torch.Generator().manual_seed(12345)
        return super()._public_loss(model, view, self.draws(view, g))


def test_identity_map_gives_zero_private_loss_only_with_shared_draws() -> None:
    b = _smooth_batch()
    model = build_unet("tiny")
    nn.init.normal_(model.conv_out.weight, std=0.1)  # a non-trivial ε_θ
    for cls, expect_zero in ((DiffusionLoss, True), (_FreshDraws, False)):
        split = cls(GaussianBlur(0.0))  # Ψ = identity: ℓ_priv must vanish exactly
        d = split.draws(b, torch.Generator().manual_seed(0))
        priv = split.private_loss(model, b, d)
        assert priv.shape == (8,)
        assert (float(priv.detach().abs().max()) == 0.0) == expect_zero


def test_same_timestep_and_same_noise_reach_the_model() -> None:
    b = _smooth_batch()
    fmap = GaussianBlur(1.0)
    split = DiffusionLoss(fmap, NoiseSchedule("linear", 100))
    d = split.draws(b, torch.Generator().manual_seed(1))
    spy = _Spy()
    split.private_loss(spy, b, d)
    (x_sharp, t_sharp), (x_pub, t_pub) = spy.calls
    assert torch.equal(t_sharp, d["t"]) and torch.equal(t_pub, d["t"])
    # x_t − Ψ(x)_t = √ᾱ_t (x − Ψ(x)) exactly when the noise is the same
    a = split.schedule.abar(d["t"]).view(-1, 1, 1, 1)
    assert torch.allclose(x_sharp - x_pub, a.sqrt() * (b["x"] - fmap(b)["x"]), atol=1e-6)


def test_draws_are_per_example_and_reproducible() -> None:
    b = _smooth_batch(5)
    split = DiffusionLoss(GaussianBlur(1.0), NoiseSchedule("cosine", 50))
    d1 = split.draws(b, torch.Generator().manual_seed(3))
    d2 = split.draws(b, torch.Generator().manual_seed(3))
    assert d1["t"].shape == (5,) and d1["noise"].shape == b["x"].shape
    assert torch.equal(d1["t"], d2["t"]) and torch.equal(d1["noise"], d2["noise"])
    assert int(d1["t"].min()) >= 0 and int(d1["t"].max()) < 50


def test_public_loss_reads_only_the_view() -> None:
    b = _smooth_batch(4)
    b["box"] = torch.tensor([[4, 4, 10, 10]] * 4)
    changed = dict(b, x=b["x"].clone())
    changed["x"][:, :, 6:12, 6:12] += 0.5  # a private change: only inside the boxes
    split = DiffusionLoss(BoxMask())
    model = build_unet("tiny")
    nn.init.normal_(model.conv_out.weight, std=0.1)
    d = split.draws(b, torch.Generator().manual_seed(0))
    assert torch.equal(split.public_loss(model, b, d), split.public_loss(model, changed, d))
    assert not torch.equal(split.loss(model, b, d), split.loss(model, changed, d))


def test_private_part_has_smaller_per_example_gradients() -> None:
    torch.manual_seed(0)
    model = build_unet("tiny")
    nn.init.normal_(model.conv_out.weight, std=0.05)
    b = _smooth_batch(16)
    split = DiffusionLoss(GaussianBlur(1.0))
    d = split.draws(b, torch.Generator().manual_seed(0))
    strat = VmapGradients(16)
    _, full = strat.clipped_sum(model, split.loss, b, d, float("inf"))
    _, priv = strat.clipped_sum(model, split.private_loss, b, d, float("inf"))
    assert float(priv.median()) < 0.5 * float(full.median())
    # per-example gradients through vmap equal one-at-a-time gradients
    i = 3
    model.zero_grad()
    split.private_loss(model, {k: v[i : i + 1] for k, v in b.items()}, {k: v[i : i + 1] for k, v in d.items()}).sum(
    ).backward()
    norm = torch.sqrt(sum(p.grad.pow(2).sum() for p in model.parameters() if p.grad is not None))
    assert torch.isclose(norm, priv[i], rtol=1e-4)


def test_null_class_when_the_label_is_not_public() -> None:
    b = _smooth_batch(3)
    split = DiffusionLoss(GaussianBlur(1.0, label_public=False))
    seen = []

    class _Rec(nn.Module):
        def forward(self, x, t, y=None):
            seen.append(y)
            return torch.zeros_like(x)

    split.private_loss(_Rec(), b, split.draws(b, torch.Generator().manual_seed(0)))
    assert torch.equal(seen[0], b["y"]) and seen[1] is None


_DEVICES = ["meta"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", _DEVICES)
def test_draws_and_losses_follow_the_batch_device(device: str) -> None:
    # "meta" tensors refuse to mix with CPU ones: a timestep or noise drawn on the CPU would fail here.
    b = {k: v.to(device) for k, v in _smooth_batch(3).items()}
    model = build_unet("tiny", base_channels=8, channel_mults=(1, 2)).to(device)
    split = DiffusionLoss(GaussianBlur(1.0, label_public=False), NoiseSchedule("cosine", 50))
    generator = torch.Generator(device=device) if device == "cuda" else torch.Generator()
    d = split.draws(b, generator)
    assert d["t"].device.type == device and d["noise"].device.type == device
    priv = split.private_loss(model, b, d)
    assert priv.device.type == device and priv.shape == (3,)


def test_describe_embeds_the_disclosure_of_the_feature_map() -> None:
    fmap = GaussianBlur(1.5)
    desc = DiffusionLoss(fmap, NoiseSchedule("linear", 100)).describe()
    assert desc["feature_map"] == fmap.describe().to_dict()
    assert desc["split"] == "diffusion" and desc["schedule"] == "linear" and desc["timesteps"] == 100
    assert desc["common_random_numbers"] == ["t", "noise"]


def test_timestep_weight_moves_work_between_the_terms_and_they_still_sum_to_the_loss() -> None:
    torch.manual_seed(0)
    model = build_unet("tiny", num_classes=10)
    batch = _smooth_batch(6)
    plain = DiffusionLoss(GaussianBlur(1.0), NoiseSchedule("cosine", 1000))
    draws = plain.draws(batch, torch.Generator().manual_seed(1))
    draws["t"] = torch.tensor([0, 100, 499, 500, 800, 999])
    for spec in ("linear", "step:0.5"):
        split = DiffusionLoss(GaussianBlur(1.0), NoiseSchedule("cosine", 1000), public_weight=spec)
        with torch.no_grad():
            full, pub, priv = (split.loss(model, batch, draws), split.public_loss(model, batch, draws),
                               split.private_loss(model, batch, draws))
            unweighted = plain.public_loss(model, batch, draws)
        torch.testing.assert_close(pub + priv, full)
        w = split.public_weight(draws["t"], 1000)
        torch.testing.assert_close(pub, w * unweighted)
        if spec == "step:0.5":  # below the step Algorithm 1 privatises the whole loss, as FDP (DP-SGD) does
            torch.testing.assert_close(priv[:3], full[:3])
            assert bool((priv[3:] != full[3:]).all())
    # w = 1 is the paper's split exactly, and records no weight (earlier runs keep their fingerprint)
    same = DiffusionLoss(GaussianBlur(1.0), NoiseSchedule("cosine", 1000), public_weight="constant")
    assert same.public_weight is None and "public_weight" not in same.describe()
    with torch.no_grad():
        assert torch.equal(same.private_loss(model, batch, draws), plain.private_loss(model, batch, draws))
    assert DiffusionLoss(GaussianBlur(1.0), public_weight="step:0.3").describe()["public_weight"] == {
        "kind": "step", "threshold": 0.3}


@pytest.mark.parametrize("spec", ["quadratic", "step:2", "step:x", "linear:0.5"])
def test_bad_timestep_weights_are_refused(spec: str) -> None:
    with pytest.raises(ValueError, match="public_weight"):
        DiffusionLoss(GaussianBlur(1.0), public_weight=spec)
