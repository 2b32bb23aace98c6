"""Feature-DP image classification: the split reads only Ψ(x) in ℓ_pub, the CNN clips exactly, the grid runs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from featuredp.clipping import get_strategy
from featuredp.data.images import ImageDataset
from featuredp.experiments import GridConfig
from featuredp.experiments.image_classification import (
    ImageClassificationSplit,
    ImageGridRunner,
    feature_map_from_spec,
    feature_map_spec,
    train_image_cell,
)
from featuredp.features.image import GaussianBlur, ImageFeatureMap, Pixelate
from featuredp.methods import METHOD_NAMES
from featuredp.models import build_model
from featuredp.models.cnn import SmallCNN


def _cnn(size: int = 8, seed: int = 0) -> SmallCNN:
    torch.manual_seed(seed)
    return SmallCNN(in_channels=1, image_size=size, num_classes=3, widths=(4, 8), groups=2)


def _public_grads(split, model, batch) -> list[torch.Tensor]:
    model.zero_grad()
    split.public_loss(model, batch, {}).sum().backward()
    return [p.grad.clone() for p in model.parameters()]


def _full_grads(split, model, batch) -> list[torch.Tensor]:
    model.zero_grad()
    split.loss(model, batch, {}).sum().backward()
    return [p.grad.clone() for p in model.parameters()]


class _GivenView(ImageFeatureMap):
    """A Ψ whose public image is given (what the blur of x is), whatever the sharp image passed in."""

    name = "given_view"

    def __init__(self, view: torch.Tensor) -> None:
        super().__init__()
        self.view = view

    def transform(self, x, batch):
        return self.view

    def params(self):
        return {}

    def reveals(self):
        return "a given image"

    def hides(self):
        return "everything else"


def test_public_loss_reads_only_the_public_view_given_blur() -> None:
    # Replace x by x' with the same Ψ(x') = Ψ(x) (the map's output is given): ℓ_pub's gradient is bitwise
    # unchanged, while ℓ's changes (the split does read x, in ℓ and ℓ_priv).
    g = torch.Generator().manual_seed(0)
    x = torch.rand(6, 1, 8, 8, generator=g) * 2 - 1
    y = torch.tensor([0, 1, 2, 0, 1, 2])
    blurred = GaussianBlur(1.0)({"x": x})["x"]
    split = ImageClassificationSplit(_GivenView(blurred))
    x_other = x + torch.randn(x.shape, generator=g)  # a different residual x' − Ψ(x')
    model = _cnn()
    pub, pub_other = _public_grads(split, model, {"x": x, "y": y}), _public_grads(split, model, {"x": x_other, "y": y})
    assert all(torch.equal(a, b) for a, b in zip(pub, pub_other))
    full, full_other = _full_grads(split, model, {"x": x, "y": y}), _full_grads(split, model, {"x": x_other, "y": y})
    assert not all(torch.equal(a, b) for a, b in zip(full, full_other))


def test_public_loss_is_unchanged_by_detail_pixelation_removes() -> None:
    # Values k/8 make every block sum exact in float32, so swapping pixels inside each 2×2 block gives an
    # image x' with Ψ(x') = Ψ(x) bit for bit: the private detail changed, the public view did not.
    g = torch.Generator().manual_seed(1)
    x = torch.randint(-8, 9, (4, 1, 8, 8), generator=g).float() / 8
    x_other = x.clone()
    x_other[..., 0::2, :], x_other[..., 1::2, :] = x[..., 1::2, :], x[..., 0::2, :]  # swap the rows of each block
    assert not torch.equal(x, x_other)
    psi = Pixelate(2)
    assert torch.equal(psi({"x": x})["x"], psi({"x": x_other})["x"])
    split = ImageClassificationSplit(psi)
    y = torch.tensor([0, 1, 2, 1])
    model = _cnn()
    pub, pub_other = _public_grads(split, model, {"x": x, "y": y}), _public_grads(split, model, {"x": x_other, "y": y})
    assert all(torch.equal(a, b) for a, b in zip(pub, pub_other))
    assert not torch.equal(split.private_loss(model, {"x": x, "y": y}, {}),
                           split.private_loss(model, {"x": x_other, "y": y}, {}))  # fmt: skip


def test_the_split_is_the_cross_entropy_of_the_public_image() -> None:
    x = torch.rand(3, 1, 8, 8) * 2 - 1
    y = torch.tensor([2, 0, 1])
    model = _cnn()
    split = ImageClassificationSplit(GaussianBlur(1.0))
    expected = torch.nn.functional.cross_entropy(model(GaussianBlur(1.0)({"x": x})["x"]), y, reduction="none")
    assert torch.equal(split.public_loss(model, {"x": x, "y": y}, {}), expected)
    both = split.loss(model, {"x": x, "y": y}, {})
    assert torch.allclose(split.private_loss(model, {"x": x, "y": y}, {}), both - expected)
    # Ψ = identity (σ = 0): everything is public, nothing is left to privatise
    assert torch.equal(ImageClassificationSplit(GaussianBlur(0.0)).private_loss(model, {"x": x, "y": y}, {}),
                       torch.zeros(3))  # fmt: skip
    assert split.describe()["feature_map"]["hides"] == "the image detail the Gaussian blur (σ=1 px) removes"
    with pytest.raises(ValueError, match="label in the public view"):
        ImageClassificationSplit(GaussianBlur(1.0, label_public=False))


@pytest.mark.parametrize("loss", ["loss", "private_loss"])
def test_ghost_clipping_of_the_cnn_matches_per_example_gradients(loss: str) -> None:
    # Conv2d, GroupNorm, max-pool and Linear: ghost norms and clipped sums equal torch.func's per-example ones,
    # also for ℓ_priv's two passes (sharp and blurred image) through every layer.
    x = torch.rand(5, 1, 8, 8, generator=torch.Generator().manual_seed(2)) * 2 - 1
    batch = {"x": x, "y": torch.tensor([0, 1, 2, 0, 1])}
    split = ImageClassificationSplit(GaussianBlur(1.0))
    fn = getattr(split, loss)
    model = _cnn()
    sums_v, norms_v = get_strategy("vmap").clipped_sum(model, fn, batch, {}, 0.05)
    sums_g, norms_g = get_strategy("ghost").clipped_sum(model, fn, batch, {}, 0.05)
    assert torch.allclose(norms_v, norms_g, rtol=1e-4, atol=1e-6)
    for k in sums_v:
        assert torch.allclose(sums_v[k], sums_g[k], rtol=1e-4, atol=1e-6), k


def test_feature_map_specs() -> None:
    assert feature_map_spec() == {"map": "blur", "sigma": 1.0}
    assert isinstance(feature_map_from_spec(feature_map_spec("pixelate", pixelate_factor=4)), Pixelate)
    with pytest.raises(ValueError, match="feature_map must be one of"):
        feature_map_spec("mosaic")
    with pytest.raises(ValueError, match="pixelate_factor"):
        feature_map_spec("pixelate", pixelate_factor=0)
    spec = {"kind": "small_cnn", "in_channels": 1, "image_size": 28, "num_classes": 10}
    assert sum(p.numel() for p in build_model(spec, seed=0).parameters()) == 20586


# -- the grid --------------------------------------------------------------------------------------------------
def synthetic_images(n: int, size: int = 12, seed: int = 0) -> ImageDataset:
    """Three classes told apart by a coarse shape (which survives the blur) plus pixel noise."""
    rng = np.random.default_rng(seed)
    y = np.arange(n) % 3
    base = np.zeros((3, size, size))
    q = size // 4
    base[0, : size // 2], base[1, :, : size // 2], base[2, q : 3 * q, q : 3 * q] = 1, 1, 1
    x = np.clip(base[y] * 180 + rng.normal(40, 30, (n, size, size)), 0, 255).astype(np.uint8)
    return ImageDataset("synthetic", x[:, None], y, ["top", "left", "centre"], "synthetic test images")


def _loader(calls: list[str]):
    def load(dataset: str, **options):
        calls.append(dataset)
        return synthetic_images(96), synthetic_images(48, seed=1)

    return load


def test_quick_grid_writes_results_and_resumes(tmp_path: Path) -> None:
    loads: list[str] = []
    cfg = GridConfig(dataset="fashion-mnist", out=tmp_path / "g", epsilons=[2.0, 8.0], seeds=[0], quick=True,
                     progress=False)  # fmt: skip
    out = ImageGridRunner(cfg, loader=_loader(loads)).run()
    df = pd.read_csv(tmp_path / "g" / "results.csv")
    assert len(df) == 2 + 3 * 2 and set(df["method"]) == set(METHOD_NAMES)
    assert df["accuracy"].between(0, 1).all()
    private = df[df["target_epsilon"].notna()]
    assert (private["epsilon"] <= private["target_epsilon"] + 1e-9).all()
    assert (df.loc[df["method"] == "public", "epsilon"] == 0).all()
    assert math.isinf(df.loc[df["method"] == "nonprivate", "epsilon"].iloc[0])
    md = (tmp_path / "g" / "summary.md").read_text()
    assert "Private: the image detail the Gaussian blur (σ=1 px) removes" in md and "CNN 16-32" in md
    assert (tmp_path / "g" / "privacy_utility.png").stat().st_size > 1000
    grid = json.loads((tmp_path / "g" / "grid.json").read_text())
    assert grid["config"]["task"] == "image-classification" and grid["config"]["loss_split"]["map"] == "blur"
    assert out["meta"]["train_rows"] == 96 and out["meta"]["cells_run"] == 8
    # A rerun trains nothing; the pixelated Ψ is another grid (refused in the same folder) with its own cells.
    trained: list[str] = []
    again = ImageGridRunner(cfg, loader=_loader(loads),
                            trainer_fn=lambda **kw: trained.append(kw["method"]) or {}).run()  # fmt: skip
    assert trained == [] and again["meta"]["cells_reused"] == 8
    with pytest.raises(ValueError, match="different grid"):
        ImageGridRunner(cfg, loader=_loader(loads), feature_map=feature_map_spec("pixelate", pixelate_factor=2)).run()


def test_train_image_cell_reports_what_the_grid_reads() -> None:
    train, test = synthetic_images(64), synthetic_images(32, seed=1)
    s = train_image_cell(data=(train, test), method="fdp", epsilon=4.0, delta=1e-5, seed=0, model={"kind": "small_cnn"},
                         loss_split={"map": "pixelate", "factor": 2}, epochs=1, batch_size=16, public_batch_size=16,
                         lr=0.05, max_grad_norm=1.0, alpha=1.0, pretrain_epochs=1)  # fmt: skip
    assert 0 <= s["accuracy"] <= 1 and s["epsilon"] <= 4.0 and s["pretrain_steps"] == 4
    assert "FDP protecting the image detail within each 2×2 pixel block" in s["guarantee"]
    assert s["model"]["image_size"] == 12 and s["model"]["num_classes"] == 3
