"""Image Ψ maps (GaussianBlur, Pixelate, BoxMask): what they compute, reveal and hide.

The properties every map keeps (Disclosure, per example, no private read) are in test_feature_map_contract.py.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import ndimage

from featuredp.errors import DataValidationError
from featuredp.features import PublicFeatureMap
from featuredp.features.image import BoxMask, GaussianBlur, Pixelate, gaussian_kernel1d


def _batch(b: int = 6, c: int = 1, h: int = 28, w: int = 28, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"x": torch.rand((b, c, h, w), generator=g) * 2 - 1, "y": torch.randint(0, 10, (b,), generator=g)}


@pytest.mark.parametrize("fmap", [GaussianBlur(1.0), Pixelate(4), BoxMask()])
def test_maps_are_deterministic_label_free_and_per_example(fmap: PublicFeatureMap) -> None:
    b = _batch()
    b["box"] = torch.tensor([[2, 3, 10, 8]] * 6)
    v1, v2 = fmap(b), fmap(b)
    assert torch.equal(v1["x"], v2["x"])  # deterministic
    other_labels = dict(b, y=(b["y"] + 3) % 10)
    assert torch.equal(fmap(other_labels)["x"], v1["x"])  # the image view never reads the label
    one = fmap({k: v[2:3] for k, v in b.items()})["x"]
    assert torch.allclose(one[0], v1["x"][2], atol=1e-6)  # per example: no mixing across the batch
    assert isinstance(fmap, PublicFeatureMap)
    assert torch.equal(b["x"], _batch()["x"])  # the input batch is not modified


def test_label_policy() -> None:
    b = _batch()
    assert torch.equal(GaussianBlur(1.0)(b)["y"], b["y"])
    assert "y" not in GaussianBlur(1.0, label_public=False)(b)
    d = GaussianBlur(1.0, label_public=False).describe()
    assert d.details["label_public"] is False and "label" in d.hides and "label" not in d.reveals


def test_disclosures_name_what_each_map_hides() -> None:
    assert GaussianBlur(1.0).describe().hides == "the image detail the Gaussian blur (σ=1 px) removes"
    assert GaussianBlur(1.0, label_public=False).describe().hides.endswith("removes and the class label")
    assert Pixelate(4).describe().hides.startswith("the image detail within each 4×4 pixel block")
    assert BoxMask().describe().hides == "the image inside each box batch['box']"
    assert "nothing" in GaussianBlur(0.0).describe().hides and "nothing" in Pixelate(1).describe().hides
    d = GaussianBlur(2.0).describe()
    assert d.map == "gaussian_blur" and d.details == {"sigma": 2.0, "truncate": 3.0, "label_public": True}


def test_only_the_box_map_passes_the_boxes_on() -> None:
    # The boxes are declared public by BoxMask only: another map's view must not carry them to ℓ_pub.
    b = _batch(2)
    b["box"] = torch.tensor([[1, 1, 3, 3]] * 2)
    assert set(GaussianBlur(1.0)(b)) == {"x", "y"} and set(Pixelate(2)(b)) == {"x", "y"}
    assert set(BoxMask()(b)) == {"x", "y", "box"}
    other = BoxMask(key="face")(dict(b, face=b.pop("box")))
    assert set(other) == {"x", "y", "face"}


def test_blur_attenuates_the_finest_detail_as_documented() -> None:
    # A checkerboard survives reflect padding as a checkerboard; two separable passes scale it by ĝ(π)².
    sigma = 1.0
    k = gaussian_kernel1d(sigma).double()
    r = (len(k) - 1) // 2
    g_pi = float(sum(k[i] * (-1) ** (i - r) for i in range(len(k))))
    board = (-1.0) ** (torch.arange(12).view(-1, 1) + torch.arange(12).view(1, -1)).view(1, 1, 12, 12)
    out = GaussianBlur(sigma)({"x": board.double()})["x"]
    torch.testing.assert_close(out, g_pi**2 * board.double(), atol=1e-9, rtol=0)
    assert g_pi**2 < 4 * math.exp(-math.pi**2 * sigma**2) * 1.05  # the docstring's "about 4·exp(-π²σ²)"


@pytest.mark.parametrize("sigma", [0.5, 1.0, 2.0])  # radii agree with scipy for these
def test_blur_equals_a_2d_gaussian_filter(sigma: float) -> None:
    x = _batch(2)["x"]
    ours = GaussianBlur(sigma)({"x": x})["x"].numpy()
    # torch "reflect" padding is scipy's "mirror"; both truncate at 3σ here
    ref = np.stack([ndimage.gaussian_filter(x[i, 0].numpy().astype(np.float64), sigma, mode="mirror", truncate=3.0)
                    for i in range(2)])
    np.testing.assert_allclose(ours[:, 0], ref, atol=1e-5)


def test_blur_keeps_constants_and_removes_detail() -> None:
    const = torch.full((1, 1, 28, 28), 0.3)
    assert torch.allclose(GaussianBlur(1.5)({"x": const})["x"], const, atol=1e-6)
    x = _batch()["x"]
    assert torch.equal(GaussianBlur(0.0)({"x": x})["x"], x)
    lap = lambda z: (z[..., 1:-1, :-2] + z[..., 1:-1, 2:] + z[..., :-2, 1:-1] + z[..., 2:, 1:-1]  # noqa: E731
                     - 4 * z[..., 1:-1, 1:-1]).var()
    v = [float(lap(GaussianBlur(s)({"x": x})["x"])) for s in (0.0, 0.5, 1.0, 2.0)]
    assert v == sorted(v, reverse=True) and v[-1] < 0.05 * v[0]


def test_pixelate_block_means() -> None:
    x = torch.arange(36, dtype=torch.float32).view(1, 1, 6, 6)
    out = Pixelate(3)({"x": x})["x"][0, 0]
    assert torch.allclose(out[:3, :3], torch.full((3, 3), float(x[0, 0, :3, :3].mean())))
    assert torch.allclose(out[3:, 3:], torch.full((3, 3), float(x[0, 0, 3:, 3:].mean())))
    odd = Pixelate(4)({"x": x})["x"]  # partial edge blocks average what they contain
    assert odd.shape == x.shape and torch.isclose(odd[0, 0, 5, 5], x[0, 0, 4:, 4:].mean())
    assert torch.equal(Pixelate(1)({"x": x})["x"], x)


def test_box_mask_hides_only_the_box_and_the_box_is_public() -> None:
    b = _batch(2)
    b["box"] = torch.tensor([[5, 6, 4, 3], [0, 0, 0, 0]])
    v = BoxMask(fill=-1.0)(b)
    inside = torch.zeros(28, 28, dtype=torch.bool)
    inside[5:9, 6:9] = True
    assert torch.all(v["x"][0, 0][inside] == -1.0)
    assert torch.equal(v["x"][0, 0][~inside], b["x"][0, 0][~inside])
    assert torch.equal(v["x"][1], b["x"][1])  # empty box masks nothing
    assert torch.equal(v["box"], b["box"])
    # two images that differ only inside the box have the same public view
    changed = dict(b, x=b["x"].clone())
    changed["x"][0, 0, 6, 7] = 0.123
    assert torch.equal(BoxMask()(changed)["x"], BoxMask()(b)["x"])
    with pytest.raises(DataValidationError, match="box"):
        BoxMask()(_batch(2))


def test_bad_parameters_name_themselves() -> None:
    with pytest.raises(ValueError, match="sigma"):
        GaussianBlur(-1.0)
    with pytest.raises(ValueError, match="factor"):
        Pixelate(0)
    with pytest.raises(TypeError, match="label_public"):
        GaussianBlur(1.0, label_public="yes")  # type: ignore[arg-type]
    with pytest.raises(DataValidationError, match="kernel radius"):
        GaussianBlur(5.0).bind(torch.zeros(2, 1, 8, 8))
    with pytest.raises(DataValidationError, match="image data"):
        GaussianBlur(1.0).bind([1, 2, 3])
    with pytest.raises(DataValidationError, match=r"\(B, C, H, W\)"):
        GaussianBlur(1.0)({"x": torch.zeros(3, 28, 28)})
