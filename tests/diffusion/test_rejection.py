"""Rejection sampling: sharpness score, a threshold from public views only, redraws."""

from __future__ import annotations

import inspect
import itertools

import pytest
import torch

from featuredp.diffusion import rejection
from featuredp.diffusion.rejection import laplacian_variance, public_threshold, rejection_sample
from featuredp.features.image import BoxMask, GaussianBlur


def _images(n: int = 32, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.rand((n, 1, 28, 28), generator=g) > 0.5).float() * 2 - 1


def test_blur_lowers_the_score() -> None:
    x = _images()
    scores = [laplacian_variance(GaussianBlur(s)({"x": x})["x"]).mean() for s in (0.0, 0.5, 1.0, 2.0)]
    assert all(a > b for a, b in itertools.pairwise(scores))
    u8 = ((x + 1) * 127.5).round().to(torch.uint8)  # uint8 and [-1, 1] inputs give the same score
    assert torch.allclose(laplacian_variance(u8), laplacian_variance(x), rtol=1e-4)


def test_threshold_depends_only_on_the_public_view() -> None:
    x = _images(16)
    box = torch.tensor([[4, 4, 12, 12]] * 16)
    other = x.clone()
    other[:, :, 6:14, 6:14] = -other[:, :, 6:14, 6:14]  # different private content, same public view
    fmap = BoxMask()
    t1 = public_threshold(fmap({"x": x, "box": box})["x"])
    t2 = public_threshold(fmap({"x": other, "box": box})["x"])
    assert t1 == t2
    assert public_threshold(x) != public_threshold(other)  # the raw images would differ: the view matters


def test_rejection_never_takes_training_data() -> None:
    # The API has no data argument: threshold is a number, samples come from the generator.
    assert list(inspect.signature(rejection_sample).parameters)[:3] == ["sample_fn", "labels", "threshold"]
    source = inspect.getsource(rejection)
    assert "featuredp.data" not in source and "load_" not in source
    # It runs with no dataset at all: the generator alone
    sharp = _images(4)
    res = rejection_sample(lambda lab: sharp[: len(lab)], torch.arange(4), threshold=0.0)
    assert len(res.images) == 4 and res.acceptance_rate == 1.0


def test_redraws_only_rejected_labels() -> None:
    sharp, blurry = _images(8), GaussianBlur(2.0)({"x": _images(8)})["x"]
    thr = float((laplacian_variance(sharp).min() + laplacian_variance(blurry).max()) / 2)
    calls: list[list[int]] = []

    def sample_fn(labels: torch.Tensor) -> torch.Tensor:
        calls.append(labels.tolist())
        # labels 0 and 1 come out blurry in the first round only; label 2 always
        first = len(calls) == 1
        return torch.stack([blurry[i] if (k == 2 or (first and k < 2)) else sharp[i] for i, k in enumerate(labels)])

    res = rejection_sample(sample_fn, torch.tensor([0, 1, 2, 3]), thr, max_rounds=3)
    assert calls == [[0, 1, 2, 3], [0, 1, 2], [2]]
    assert sorted(res.labels.tolist()) == [0, 1, 2, 3] and res.forced == 1 and res.drawn == 8
    assert res.acceptance_rate == pytest.approx(3 / 8)
    res = rejection_sample(sample_fn, torch.tensor([2]), thr, max_rounds=1, fill=False)
    assert len(res.images) == 0
    with pytest.raises(ValueError, match="threshold"):
        rejection_sample(sample_fn, torch.tensor([0]), -1.0)
    with pytest.raises(ValueError, match="quantile"):
        public_threshold(sharp, 1.5)


def test_score_follows_the_image_device() -> None:
    # "meta" tensors refuse to mix with CPU ones: the Laplacian kernel must move to the images.
    assert laplacian_variance(_images(3).to("meta")).device.type == "meta"
