"""Public feature maps Ψ for images: what of a picture is public.

The paper's image use case (paper §6.3): the blurred photo is public, the fine
detail (a face, a licence plate) is private. Three maps are provided:

* :class:`GaussianBlur` — a fixed separable Gaussian convolution (σ in pixels);
* :class:`Pixelate` — downsample by averaging ``factor × factor`` blocks, then
  upsample by repetition;
* :class:`BoxMask` — blank out a region given per image (``batch["box"]``).

Every map is deterministic and label-free: the public image depends on the
image only (and, for :class:`BoxMask`, on the box, which is itself declared
public). The class label is kept in the public view by default, as in the
paper's class-conditional baseline trained on blurred images; pass
``label_public=False`` to drop it (the public loss then uses the unconditional
"null" class).

Images are batch-first float tensors ``(B, C, H, W)`` under ``batch["x"]``.
"""

from __future__ import annotations

import math
from abc import abstractmethod
from typing import Any

import torch
from torch.nn import functional as F  # noqa: N812

from featuredp._validate import check_int, check_nonnegative, check_positive, check_real
from featuredp.errors import DataValidationError
from featuredp.features.base import Batch, PublicFeatureMap
from featuredp.plan import Disclosure

__all__ = ["BoxMask", "GaussianBlur", "ImageFeatureMap", "Pixelate", "gaussian_kernel1d"]


def _image_shape_of(dataset: Any) -> tuple[int, ...] | None:
    """(C, H, W) of a dataset-like object (ImageDataset, tensor, array), or None if unknown."""
    if hasattr(dataset, "image_shape"):
        return tuple(dataset.image_shape)
    shape = getattr(dataset, "shape", None)
    if shape is not None and len(shape) == 4:
        return tuple(shape[1:])
    return None


class ImageFeatureMap(PublicFeatureMap):
    """Common part of the image maps: validation, the label policy, the batch plumbing.

    A subclass implements :meth:`transform` (the public image), :meth:`params`,
    :meth:`reveals` and :meth:`hides` (the phrases of its :class:`~featuredp.plan.Disclosure`).
    """

    name = "image"

    def __init__(self, *, label_public: bool = True) -> None:
        if not isinstance(label_public, bool):
            raise TypeError(f"label_public must be a bool, got {label_public!r}")
        self.label_public = label_public

    # -- to be provided by subclasses ------------------------------------------------
    @abstractmethod
    def transform(self, x: torch.Tensor, batch: Batch) -> torch.Tensor:
        """The public image of ``x`` (B, C, H, W), on ``x``'s device; must not read labels."""

    @abstractmethod
    def params(self) -> dict[str, Any]:
        """The map's parameters (JSON-able), for :meth:`describe`."""

    @abstractmethod
    def reveals(self) -> str:
        """What the public image shows (a phrase), label aside."""

    @abstractmethod
    def hides(self) -> str:
        """What of the image it hides (a phrase the guarantee reads as "protecting ..."), label aside."""

    # -- PublicFeatureMap ---------------------------------------------------------------
    def bind(self, dataset: Any) -> ImageFeatureMap:
        """Check that the data are images this map can handle; returns ``self``."""
        shape = _image_shape_of(dataset)
        if shape is None:
            raise DataValidationError(
                f"{type(self).__name__} needs image data of shape (N, C, H, W); got {type(dataset).__name__}"
            )
        if len(shape) != 3:
            raise DataValidationError(f"images must have shape (C, H, W) per example, got {shape}")
        self._check_shape(shape)
        return self

    def _check_shape(self, shape: tuple[int, ...]) -> None:
        """Subclasses refuse image sizes they cannot handle."""

    def __call__(self, batch: Batch) -> Batch:
        """The public view: ``x`` replaced by its public image; ``y`` kept only if ``label_public``.

        Every other key is dropped: the view holds only what :meth:`describe` says it reveals.
        """
        if "x" not in batch:
            raise DataValidationError(f"batch must contain 'x', got keys {sorted(batch)}")
        x = batch["x"]
        if x.dim() != 4:
            raise DataValidationError(f"batch['x'] must have shape (B, C, H, W), got {tuple(x.shape)}")
        out: Batch = {"x": self.transform(x, batch)}
        if self.label_public and "y" in batch:
            out["y"] = batch["y"]
        return out

    def describe(self) -> Disclosure:
        """What the public view reveals and hides (the guarantee protects what it hides)."""
        return Disclosure(
            self.name,
            reveals=self.reveals() + (" and the class label" if self.label_public else ""),
            hides=self.hides() + ("" if self.label_public else " and the class label"),
            details={**self.params(), "label_public": self.label_public},
        )


def gaussian_kernel1d(sigma: float, truncate: float = 3.0) -> torch.Tensor:
    """A normalised 1-D Gaussian kernel of radius ``ceil(truncate·σ)`` (float32)."""
    sigma = check_positive("sigma", sigma)
    truncate = check_positive("truncate", truncate)
    radius = max(1, math.ceil(truncate * sigma))
    grid = torch.arange(-radius, radius + 1, dtype=torch.float64)
    k = torch.exp(-0.5 * (grid / sigma) ** 2)
    return (k / k.sum()).to(torch.float32)


class GaussianBlur(ImageFeatureMap):
    """Ψ(x) = x convolved with a fixed Gaussian of std ``sigma`` pixels (separable, reflect padding).

    ``sigma = 0`` is the identity (everything public). Reflect padding keeps
    the image mean at the borders (zero padding would darken them).

    What it hides is *attenuated*, not erased: detail at the finest scale (a
    checkerboard) reaches the view scaled by about ``4·exp(-π²σ²)`` (2·10⁻⁴ at
    σ = 1), and the blur is a linear map that is invertible in exact arithmetic.
    The guarantee protects the detail as far as the published view does not
    already determine it; :class:`Pixelate` and :class:`BoxMask` discard
    information exactly.

    >>> x = torch.zeros(1, 1, 9, 9)
    >>> x[0, 0, 4, 4] = 1.0
    >>> view = GaussianBlur(1.0)({"x": x})["x"]
    >>> round(float(view.sum()), 4), bool(view[0, 0, 4, 4] < 0.2)
    (1.0, True)
    >>> GaussianBlur(1.0).describe().hides
    'the image detail the Gaussian blur (σ=1 px) removes'
    """

    name = "gaussian_blur"

    def __init__(self, sigma: float, *, truncate: float = 3.0, label_public: bool = True) -> None:
        super().__init__(label_public=label_public)
        self.sigma = check_nonnegative("sigma", sigma)
        self.truncate = check_positive("truncate", truncate)
        self._kernel = gaussian_kernel1d(self.sigma, self.truncate) if self.sigma > 0 else None

    def params(self) -> dict[str, Any]:
        """σ and the truncation (in σ) of the kernel."""
        return {"sigma": self.sigma, "truncate": self.truncate}

    def reveals(self) -> str:
        """The blurred image."""
        return f"the image blurred by a Gaussian of σ={self.sigma:g} px" if self.sigma > 0 else "the whole image"

    def hides(self) -> str:
        """The detail the blur removes (nothing of the image for σ = 0)."""
        if self.sigma == 0:
            return "nothing of the image (σ=0: the whole image is public)"
        return f"the image detail the Gaussian blur (σ={self.sigma:g} px) removes"

    def _check_shape(self, shape: tuple[int, ...]) -> None:
        if self._kernel is not None:
            radius = (len(self._kernel) - 1) // 2
            if radius >= min(shape[1:]):
                raise DataValidationError(
                    f"sigma={self.sigma} gives a kernel radius {radius} >= the image size {shape[1:]}; "
                    "use a smaller sigma"
                )

    def transform(self, x: torch.Tensor, batch: Batch) -> torch.Tensor:
        """The blurred image (two depthwise 1-D passes, reflect padding)."""
        if self._kernel is None:
            return x
        k = self._kernel.to(dtype=x.dtype, device=x.device)
        c = x.shape[1]
        r = (len(k) - 1) // 2
        # depthwise (groups=c) so channels do not mix; two 1-D passes = one 2-D Gaussian
        kh = k.view(1, 1, 1, -1).expand(c, 1, 1, -1)
        kv = k.view(1, 1, -1, 1).expand(c, 1, -1, 1)
        x = F.conv2d(F.pad(x, (r, r, 0, 0), mode="reflect"), kh, groups=c)
        return F.conv2d(F.pad(x, (0, 0, r, r), mode="reflect"), kv, groups=c)


class Pixelate(ImageFeatureMap):
    """Ψ(x) = the mean of each ``factor × factor`` block, repeated over the block (downsample-upsample).

    Partial blocks at the right/bottom edge average the pixels they contain.
    Any change that keeps every block's mean leaves the view unchanged.

    >>> x = torch.arange(16.0).view(1, 1, 4, 4)
    >>> Pixelate(2)({"x": x})["x"][0, 0, :2, :2]
    tensor([[2.5000, 2.5000],
            [2.5000, 2.5000]])
    """

    name = "pixelate"

    def __init__(self, factor: int, *, label_public: bool = True) -> None:
        super().__init__(label_public=label_public)
        self.factor = check_int("factor", factor, minimum=1)

    def params(self) -> dict[str, Any]:
        """The block size."""
        return {"factor": self.factor}

    def reveals(self) -> str:
        """The block means."""
        f = self.factor
        return f"the mean of every {f}×{f} pixel block of the image" if f > 1 else "the whole image"

    def hides(self) -> str:
        """The detail within each block (nothing of the image for factor 1)."""
        f = self.factor
        if f == 1:
            return "nothing of the image (factor=1: the whole image is public)"
        return f"the image detail within each {f}×{f} pixel block (all but the block means)"

    def _check_shape(self, shape: tuple[int, ...]) -> None:
        if self.factor > min(shape[1:]):
            raise DataValidationError(f"factor={self.factor} is larger than the image size {shape[1:]}")

    def transform(self, x: torch.Tensor, batch: Batch) -> torch.Tensor:
        """Block means, repeated over each block."""
        f = self.factor
        if f == 1:
            return x
        h, w = x.shape[-2:]
        small = F.avg_pool2d(x, f, stride=f, ceil_mode=True, count_include_pad=False)
        big = small.repeat_interleave(f, dim=-2).repeat_interleave(f, dim=-1)
        return big[..., :h, :w]


class BoxMask(ImageFeatureMap):
    """Ψ(x) = x with a per-image box replaced by ``fill`` (the box itself is public).

    The boxes come with the data as ``batch["box"]``: int64 ``(B, 4)`` rows of
    ``(top, left, height, width)`` in pixels (e.g. the detected face or plate).
    A box of height or width 0 masks nothing.

    >>> b = {"x": torch.ones(1, 1, 4, 4), "box": torch.tensor([[1, 1, 2, 2]])}
    >>> int(BoxMask()(b)["x"].sum())  # the 2×2 box is blanked
    12
    """

    name = "box_mask"

    def __init__(self, *, fill: float = 0.0, key: str = "box", label_public: bool = True) -> None:
        super().__init__(label_public=label_public)
        self.fill = check_real("fill", fill)
        if not isinstance(key, str) or not key:
            raise ValueError(f"key must be a non-empty string, got {key!r}")
        self.key = key

    def params(self) -> dict[str, Any]:
        """The fill value and the batch key of the boxes."""
        return {"fill": self.fill, "box_key": self.key}

    def reveals(self) -> str:
        """The image outside the boxes, and the boxes."""
        return f"the image outside each box batch[{self.key!r}] (the box itself is public)"

    def hides(self) -> str:
        """The image inside the boxes."""
        return f"the image inside each box batch[{self.key!r}]"

    def transform(self, x: torch.Tensor, batch: Batch) -> torch.Tensor:
        """``x`` with every pixel inside its image's box set to ``fill``."""
        if self.key not in batch:
            raise DataValidationError(f"BoxMask needs batch[{self.key!r}] with (top, left, height, width) per image")
        box = batch[self.key]
        if box.shape[-1] != 4 or box.shape[0] != x.shape[0]:
            raise DataValidationError(f"batch[{self.key!r}] must have shape ({x.shape[0]}, 4), got {tuple(box.shape)}")
        h, w = x.shape[-2:]
        rows = torch.arange(h, device=x.device).view(1, h, 1)
        cols = torch.arange(w, device=x.device).view(1, 1, w)
        top, left, bh, bw = (box[:, i].view(-1, 1, 1) for i in range(4))
        inside = (rows >= top) & (rows < top + bh) & (cols >= left) & (cols < left + bw)  # (B, H, W)
        return torch.where(inside.unsqueeze(1), torch.as_tensor(self.fill, dtype=x.dtype, device=x.device), x)

    def __call__(self, batch: Batch) -> Batch:
        """The masked image, the label if public, and the boxes (declared public)."""
        out = super().__call__(batch)
        out[self.key] = batch[self.key]
        return out
