"""Feature-DP image classification: the blurred (or pixelated) image is public, its fine detail private.

The task (``featuredp compare --task image-classification``; docs/image-classification.md): a
small GroupNorm CNN (:class:`~featuredp.models.cnn.SmallCNN`) classifies Fashion-MNIST, and every
registered method (:mod:`featuredp.methods`) is trained at several ε and seeds, through the same
grid machinery as the tabular comparisons (:class:`~featuredp.experiments.grid.GridRunner`: cells
keyed by the hash of their settings, resumable, results.csv / summary.md / privacy_utility.png).

**Ψ and the split.** Ψ(x, y) = (blur(x), y) (:class:`~featuredp.features.image.GaussianBlur`) or
(pixelate(x), y) (:class:`~featuredp.features.image.Pixelate`); the label is public. With the
cross-entropy ℓ(θ; x, y) = CE(f_θ(x), y),

* ℓ_pub(θ; Ψ(x), y) = CE(f_θ(Ψ(x)), y): the same network on the public image, a function of the
  public view only (:class:`ImageClassificationSplit` receives the view, never the batch);
* ℓ_priv = ℓ − ℓ_pub = CE(f_θ(x), y) − CE(f_θ(Ψ(x)), y): what the fine detail x − Ψ(x) changes.
  Algorithm 1 clips and noises ∇ℓ_priv; the public batch and public pre-training read Ψ(S) only.

Neighbouring datasets differ in one image x → x' with Ψ(x') = Ψ(x) (same label): the guarantee
hides what Ψ does not determine. Pixelation discards the within-block detail exactly; the Gaussian
blur only attenuates it (it is invertible in exact arithmetic, see
:class:`~featuredp.features.image.GaussianBlur`), so with the blur the guarantee covers the detail
only as far as the published blurred image does not already determine it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from featuredp._validate import check_choice, check_int, check_nonnegative
from featuredp.batches import evaluate
from featuredp.data.images import IMAGE_DATASETS, ImageDataset, load_image_dataset
from featuredp.engine import Trainer, init_seed
from featuredp.experiments.grid import GridConfig, GridRunner
from featuredp.experiments.presets import IMAGE_FEATURE_MAPS, image_preset_for, trainer_arguments
from featuredp.features.image import GaussianBlur, ImageFeatureMap, Pixelate
from featuredp.losses import ImageClassificationSplit
from featuredp.methods import get_method
from featuredp.models import build_model

__all__ = [
    "FEATURE_MAPS",
    "TASK",
    "ImageClassificationSplit",
    "ImageGridRunner",
    "feature_map_from_spec",
    "feature_map_spec",
    "image_model_spec",
    "run_image_grid",
    "train_image_cell",
]

TASK = "image-classification"
#: the public feature maps this task offers (``--feature-map``)
FEATURE_MAPS = IMAGE_FEATURE_MAPS


# -- Ψ and the model as JSON-able specs (they enter the cells' configuration hashes) ---------------------
def feature_map_spec(feature_map: str = "blur", *, blur_sigma: float = 1.0, pixelate_factor: int = 4
                     ) -> dict[str, Any]:  # fmt: skip
    """``{"map": "blur", "sigma": σ}`` or ``{"map": "pixelate", "factor": f}``, validated.

    >>> feature_map_spec("pixelate", pixelate_factor=2)
    {'map': 'pixelate', 'factor': 2}
    """
    kind = check_choice("feature_map", feature_map, FEATURE_MAPS)
    if kind == "blur":
        return {"map": "blur", "sigma": check_nonnegative("blur_sigma", blur_sigma)}
    return {"map": "pixelate", "factor": check_int("pixelate_factor", pixelate_factor, minimum=1)}


def feature_map_from_spec(spec: Mapping[str, Any]) -> ImageFeatureMap:
    """The Ψ a :func:`feature_map_spec` dict describes."""
    kind = check_choice("feature_map", spec.get("map"), FEATURE_MAPS)
    return GaussianBlur(float(spec["sigma"])) if kind == "blur" else Pixelate(int(spec["factor"]))


def image_model_spec(train: ImageDataset, base: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` (a ``{"kind": "small_cnn", ...}`` spec) completed with the data's channels, size and classes."""
    c, h, w = train.image_shape
    if h != w:
        raise ValueError(f"the image CNN needs square images, got {h}×{w}")
    return {**dict(base), "in_channels": c, "image_size": h, "num_classes": max(2, len(train.classes))}


# -- one cell ------------------------------------------------------------------------------------------------
def train_image_cell(
    *,
    data: tuple[ImageDataset, ImageDataset | None],
    method: str,
    epsilon: float | None,
    delta: float,
    seed: int,
    model: Mapping[str, Any],
    loss_split: Mapping[str, Any],
    device: str | None = None,
    private: Any = None,
    hidden: Any = None,
    padding_scale: Any = None,
    **params: Any,
) -> dict[str, Any]:
    """Train ``method`` on images with Ψ = ``loss_split`` (a :func:`feature_map_spec`), evaluate on the test set.

    The grid's trainer function (:class:`ImageGridRunner`): ``seed`` is the public seed
    (initialisation, public batches); the private randomness is OS entropy. ``params`` are the
    cell's complete Trainer arguments. ``private``, ``hidden`` and ``padding_scale`` are the tabular
    grid's and are ignored. Returns the summary keys the grid reads (accuracy on the sharp test
    images, ε spent, σ, steps, the guarantee, ...).
    """
    del private, hidden, padding_scale  # the tabular grid's arguments: Ψ and the model say it all here
    record = get_method(method)
    train, test = data
    fmap = feature_map_from_spec(loss_split).bind(train)
    split = ImageClassificationSplit(fmap)
    spec = image_model_spec(train, model)
    net = build_model(spec, seed=init_seed(seed))
    kwargs = trainer_arguments(record, dict(params), epsilon=epsilon, delta=delta, device=device)
    trainer = Trainer(net, record.name, loss_split=split, public_seed=seed, progress=False, **kwargs)
    result = trainer.fit(train.batch())
    metrics = None if test is None else evaluate(trainer.model, test.batch())
    plan = result.plan
    return {
        "method": record.name, "dataset": train.name, "accuracy": None if metrics is None else metrics["accuracy"],
        "loss": None if metrics is None else metrics["loss"],
        "epsilon": None if math.isinf(result.epsilon) else result.epsilon, "delta": result.delta,
        "noise_multiplier": plan.noise_multiplier, "noise": plan.noise.kind, "bands": plan.bands,
        "max_grad_norm": plan.max_grad_norm, "sampling_rate": plan.sampling_rate,
        "batch_size": plan.expected_batch_size,
        "public_batch_size": plan.public_batch_size, "alpha": plan.alpha if record.public_batch else None,
        "steps": result.steps, "pretrain_steps": result.pretrain_steps, "stopped_early": result.stopped_early,
        "model": spec, "guarantee": result.guarantee,
    }  # fmt: skip


# -- the grid ------------------------------------------------------------------------------------------------
class ImageGridRunner(GridRunner):
    """The tabular grid's runner with images: its data, its preset, its Ψ, its report lines.

    ``loader(dataset, **options) -> (train, test)`` loads the images (default
    :func:`~featuredp.data.images.load_image_dataset`); the preset's ``load`` options ``n_train`` /
    ``n_test`` keep the first images of each split, the others go to the loader.
    """

    def __init__(self, cfg: GridConfig, *, feature_map: Mapping[str, Any] | None = None,
                 trainer_fn: Callable[..., dict[str, Any]] | None = None,
                 loader: Callable[..., tuple[ImageDataset, ImageDataset]] | None = None) -> None:  # fmt: skip
        check_choice("dataset", cfg.dataset, IMAGE_DATASETS)
        preset = image_preset_for(cfg.dataset)
        if feature_map is not None:
            preset["loss_split"] = dict(feature_map)
        feature_map_from_spec(preset["loss_split"])  # a bad spec: an error before any work
        super().__init__(cfg, trainer_fn=trainer_fn if trainer_fn is not None else train_image_cell, preset=preset)
        self._loader = loader if loader is not None else load_image_dataset

    @property
    def data(self) -> tuple[ImageDataset, ImageDataset]:
        """(train, test) images, loaded once (the first ``n_train`` / ``n_test`` of each split)."""
        if self._data is None:
            opts = dict(self.load_options)
            n_train, n_test = opts.pop("n_train", None), opts.pop("n_test", None)
            train, test = self._loader(self.cfg.dataset, **opts)
            if n_train is not None and n_train < len(train):
                train = train.subset(np.arange(n_train))
            if n_test is not None and n_test < len(test):
                test = test.subset(np.arange(n_test))
            self._data = (train, test)
        return self._data

    @property
    def validation(self) -> tuple[ImageDataset, ImageDataset]:
        """(train_sub, val) carved from the training images with a fixed seed; the test set is never touched."""
        if self._val is None:
            train = self.data[0]
            perm = np.random.default_rng(12345).permutation(len(train))
            n_val = max(1, round(len(train) * self.cfg.val_fraction))
            self._val = (train.subset(np.sort(perm[n_val:])), train.subset(np.sort(perm[:n_val]), name="validation"))
        return self._val

    def cell_config(self, cell: Any) -> dict[str, Any]:
        """The tabular cell configuration plus the task (so no tabular cell ever matches an image cell)."""
        return {**super().cell_config(cell), "task": TASK}

    def grid_config(self) -> dict[str, Any]:
        """The tabular grid configuration plus the task."""
        return {**super().grid_config(), "task": TASK}

    def report_facts(self) -> dict[str, Any]:
        """summary.md's lines on the images, what Ψ hides (the private part), the CNN and the split."""
        train, test = self.data
        fmap = feature_map_from_spec(self.preset["loss_split"])
        spec = image_model_spec(train, self.preset["model"])
        n_params = sum(p.numel() for p in build_model(spec, seed=0).parameters())
        c, h, w = train.image_shape
        where = train.description.replace(str(Path.home()), "~")  # results get committed: no home folder in them
        return {
            "description": f"{where}; {c}×{h}×{w} images, {len(train.classes)} classes. "
                           f"Task: {TASK}; Ψ: {fmap.describe().reveals}",
            "train_rows": len(train), "test_rows": len(test), "private": [fmap.describe().hides],
            "model": f"CNN {'-'.join(map(str, spec.get('widths', (16, 32))))} (GroupNorm, {n_params:,} parameters)",
            "hidden": None, "loss_split": "ℓ_pub = cross-entropy on Ψ(x) (image_cross_entropy)",
        }  # fmt: skip


def run_image_grid(cfg: GridConfig, *, feature_map: Mapping[str, Any] | None = None, **kwargs: Any
                   ) -> dict[str, Any]:  # fmt: skip
    """Run an image-classification grid (see the module doc); ``feature_map``: a :func:`feature_map_spec`."""
    return ImageGridRunner(cfg, feature_map=feature_map, **kwargs).run()
