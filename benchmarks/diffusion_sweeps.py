"""Why Algorithm 1 ties FDP (DP-SGD) on images, and what moves the gap (issue 15's sweeps).

Each trial fine-tunes a public model (trained on blurred images only, Ψ = Gaussian blur) with one
private method at ε = 8 and scores it on a held-out VALIDATION split of the training set (the test
set is never read):

* validation loss: the denoising loss ℓ of the sharp validation images at 20 fixed timesteps
  (t = 25, 75, …, 975) with one fixed noise draw per image and t (common random numbers, so trials
  differ only by their models), overall and for t < 300 (where the fine detail forms) and t ≥ 300;
* domain FID of class-conditional samples against the validation images (a domain classifier
  trained on the fitting split only), n per trial as given.

Trials (``--trials``, comma-separated; default all): ``fdp_dpsgd`` and ``fdp`` (Alg. 1) at the main
settings (α = 1, C = 0.1, w = 1, blur σ = 1, the main public model), then α ∈ {0.5, 2, 3, 10, 30},
C ∈ {0.03, 0.3, 1} for Alg. 1 and {0.03, 0.3} for FDP (DP-SGD), w(t) ∈ {linear, step:0.5} (and
step:0.5 with α = 10), blur σ ∈ {0.5, 2} (each with its own public model of ``--short-pretrain``
steps, against σ = 1 with the same pre-training), and that shorter pre-training against the main one.
Each trial writes ``DIR/<trial>.json`` (atomically) and is skipped when it exists, so two processes
can split the trials; ``--report`` writes ``DIR/sweeps.md`` and ``DIR/sweeps.png``.

    python benchmarks/diffusion_sweeps.py --public-model runs/fm16/public/model.pt \\
        --classifier runs/sweeps/domain_classifier.pt --out runs/sweeps

Hyper-parameters chosen on a validation split of private data leak a little about it; this is a
study of the method (as the paper's tuning is), and its choices are not charged to any ε.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
import torch

from featuredp._io import atomic_save_png, atomic_save_torch, atomic_write_json, atomic_write_text
from featuredp.data.images import load_image_dataset
from featuredp.diffusion.losses import DiffusionLoss, TimestepWeight, denoising_loss
from featuredp.diffusion.sampler import generate
from featuredp.diffusion.schedule import NoiseSchedule
from featuredp.diffusion.unet import build_unet
from featuredp.engine import Trainer
from featuredp.experiments.diffusion import load_model
from featuredp.features.image import GaussianBlur
from featuredp.metrics.domain import DomainClassifier, DomainMetrics, train_domain_classifier

matplotlib.use("Agg")
import matplotlib.pyplot as plt

VAL_T = tuple(range(25, 1000, 50))
SMALL_T = 300

# trial -> (method, overrides); "pretrain" is the public model: "main" or a number of public steps
BASE = {"alpha": 1.0, "C": 0.1, "weight": "constant", "blur": 1.0, "pretrain": "main"}
TRIALS: dict[str, tuple[str, dict[str, Any]]] = {
    "fdp_dpsgd": ("fdp_dpsgd", {}),
    "fdp": ("fdp", {}),
    "fdp_alpha0.5": ("fdp", {"alpha": 0.5}),
    "fdp_alpha2": ("fdp", {"alpha": 2.0}),
    "fdp_alpha3": ("fdp", {"alpha": 3.0}),
    "fdp_alpha10": ("fdp", {"alpha": 10.0}),
    "fdp_alpha30": ("fdp", {"alpha": 30.0}),
    "fdp_C0.03": ("fdp", {"C": 0.03}),
    "fdp_C0.3": ("fdp", {"C": 0.3}),
    "fdp_C1": ("fdp", {"C": 1.0}),
    "fdp_alpha10_w_step0.5": ("fdp", {"alpha": 10.0, "weight": "step:0.5"}),
    "fdp_dpsgd_C0.03": ("fdp_dpsgd", {"C": 0.03}),
    "fdp_dpsgd_C0.3": ("fdp_dpsgd", {"C": 0.3}),
    "fdp_w_linear": ("fdp", {"weight": "linear"}),
    "fdp_w_step0.5": ("fdp", {"weight": "step:0.5"}),
    "fdp_short_blur1": ("fdp", {"pretrain": "short"}),
    "fdp_dpsgd_short_blur1": ("fdp_dpsgd", {"pretrain": "short"}),
    "fdp_short_blur0.5": ("fdp", {"pretrain": "short", "blur": 0.5}),
    "fdp_dpsgd_short_blur0.5": ("fdp_dpsgd", {"pretrain": "short", "blur": 0.5}),
    "fdp_short_blur2": ("fdp", {"pretrain": "short", "blur": 2.0}),
    "fdp_dpsgd_short_blur2": ("fdp_dpsgd", {"pretrain": "short", "blur": 2.0}),
}


def validation_loss(model: torch.nn.Module, schedule: NoiseSchedule, val: dict[str, torch.Tensor],
                    seed: int) -> dict[str, Any]:  # fmt: skip
    """Mean sharp denoising loss over VAL_T with fixed noise; overall, t < SMALL_T and t ≥ SMALL_T."""
    model.eval()
    gen = torch.Generator().manual_seed(seed)
    per_t = {}
    with torch.no_grad():
        for t in VAL_T:
            noise = torch.randn(val["x"].shape, generator=gen)
            tt = torch.full((len(val["x"]),), t, dtype=torch.long)
            per_t[t] = float(torch.cat([denoising_loss(model, schedule, val["x"][i:i + 500], val["y"][i:i + 500],
                                                       tt[i:i + 500], noise[i:i + 500])
                                        for i in range(0, len(tt), 500)]).mean())  # fmt: skip
    small = [v for t, v in per_t.items() if t < SMALL_T]
    large = [v for t, v in per_t.items() if t >= SMALL_T]
    return {"val_loss": float(np.mean(list(per_t.values()))), "val_loss_small_t": float(np.mean(small)),
            "val_loss_large_t": float(np.mean(large)), "val_loss_by_t": {str(t): v for t, v in per_t.items()}}


def _trainer(model: torch.nn.Module, method: str, split: DiffusionLoss, steps: int, n: int, cfg: dict[str, Any],
             args: argparse.Namespace) -> Trainer:  # fmt: skip
    private = method != "public"
    return Trainer(
        model, method, loss_split=split, steps=steps, batch_size=args.batch_size,
        target_epsilon=args.epsilon if private else None, delta=1.0 / (2 * n), max_grad_norm=cfg["C"],
        alpha=cfg["alpha"], optimizer="adam", lr=args.lr, averaging="ema",
        ema_decay=min(max(1.0 - 10.0 / steps, 0.9), 0.9999), physical_batch_size=64, public_seed=args.seed,
        progress=False,
    )  # fmt: skip


def public_model(cfg: dict[str, Any], train: dict[str, torch.Tensor], n: int, schedule: NoiseSchedule,
                 args: argparse.Namespace, dataset: Any) -> torch.nn.Module:  # fmt: skip
    """The main public model, or a short public pre-training with this blur (cached in DIR/public_*.pt)."""
    if cfg["pretrain"] == "main":
        return load_model(args.public_model)
    path = args.out / f"public_{args.short_pretrain}_blur{cfg['blur']}.pt"
    torch.manual_seed(args.seed)
    model = build_unet(args.preset, num_classes=10)
    if path.exists():
        model.load_state_dict(torch.load(path, weights_only=True))
        return model
    split = DiffusionLoss(GaussianBlur(cfg["blur"]).bind(dataset), schedule)
    _trainer(model, "public", split, args.short_pretrain, n, cfg, args).fit(train)
    atomic_save_torch(path, model.state_dict())
    return model


def run_trial(name: str, args: argparse.Namespace, ctx: dict[str, Any]) -> None:
    path = args.out / f"{name}.json"
    if path.exists():
        return
    method, over = TRIALS[name]
    cfg = {**BASE, **over}
    print(f"[sweeps] {name}: {method} {cfg}", file=sys.stderr, flush=True)
    model = public_model(cfg, ctx["train"], ctx["n"], ctx["schedule"], args, ctx["dataset"])
    start = validation_loss(model, ctx["schedule"], ctx["val"], args.seed)
    split = DiffusionLoss(GaussianBlur(cfg["blur"]).bind(ctx["dataset"]), ctx["schedule"],
                          TimestepWeight.parse(cfg["weight"]) if method == "fdp" else None)
    t0 = time.perf_counter()
    res = _trainer(model, method, split, args.steps, ctx["n"], cfg, args).fit(ctx["train"])
    wall = time.perf_counter() - t0
    scores = validation_loss(model, ctx["schedule"], ctx["val"], args.seed)
    labels = torch.arange(args.samples) % 10
    samples = generate(model, ctx["schedule"], (1, args.resolution, args.resolution), labels,
                       steps=args.ddim_steps, seed=args.seed + 1, progress=False)
    rep = ctx["metrics"].report(samples, labels, resamples=100, seed=args.seed)
    atomic_write_json(path, {
        "trial": name, "method": method, **cfg, "steps": args.steps, "epsilon": res.epsilon,
        "noise_multiplier": res.plan.noise_multiplier, "wall_s": wall, "start": start, **scores,
        "domain_fid": rep["domain_fid"], "domain_fid_ci": rep["domain_fid_ci"], "accuracy": rep["accuracy"],
        "n_samples": rep["n"],
    })  # fmt: skip


def report(out: Path) -> None:
    rows = [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]
    by = {r["trial"]: r for r in rows}
    order = [t for t in TRIALS if t in by]
    lines = ["# Diffusion sweeps: fine-tunes of a public model at ε = 8, scored on a validation split", "",
             "| trial | method | α | C | w(t) | blur σ | pre-training | val ℓ ↓ | val ℓ, t < 300 | val ℓ, t ≥ 300 | "
             "domain FID ↓ [95% CI] (n) | class acc. | σ | wall (s) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for t in order:
        r = by[t]
        lines.append(
            f"| {t} | {r['method']} | {r['alpha']} | {r['C']} | {r['weight']} | {r['blur']} | {r['pretrain']} | "
            f"{r['val_loss']:.5f} | {r['val_loss_small_t']:.5f} | {r['val_loss_large_t']:.5f} | "
            f"{r['domain_fid']:.1f} [{r['domain_fid_ci'][0]:.1f}, {r['domain_fid_ci'][1]:.1f}] ({r['n_samples']}) | "
            f"{r['accuracy']:.3f} | {r['noise_multiplier']:.3f} | {r['wall_s']:.0f} |")
    if order:
        r0 = by[order[0]]
        lines += ["", f"Start (the public model, before any private step): val ℓ {r0['start']['val_loss']:.5f}, "
                  f"t < 300 {r0['start']['val_loss_small_t']:.5f}, t ≥ 300 {r0['start']['val_loss_large_t']:.5f} "
                  f"(main public model; short pre-trainings start elsewhere, see each JSON).", ""]
    atomic_write_text(out / "sweeps.md", "\n".join(lines) + "\n")
    if not order:
        return
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for t in order:
        r = by[t]
        ts = [int(k) for k in r["val_loss_by_t"]]
        base = by[order[0]]["val_loss_by_t"]
        ax.plot(ts, [r["val_loss_by_t"][str(k)] / base[str(k)] for k in ts], marker=".",
                label=t, ls="-" if r["method"] == "fdp" else "--")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_yscale("log")  # α = 30 is 20× worse at large t; the useful differences are a few per cent
    ax.set_xlabel("timestep t")
    ax.set_ylabel(f"validation ℓ / that of {order[0]}")
    ax.set_title("Where each trial gains (below 1) or loses, by timestep")
    ax.legend(fontsize=7, ncol=2)
    atomic_save_png(fig, out / "sweeps.png", dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--public-model", required=True, help="DIR/public/model.pt of the main run")
    p.add_argument("--classifier", type=Path, required=True,
                   help="domain classifier file; trained on the fitting split (not the validation split) if missing")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--trials", default=",".join(TRIALS))
    p.add_argument("--dataset", default="fashion-mnist")
    p.add_argument("--resolution", type=int, default=16)
    p.add_argument("--preset", default="tiny")
    p.add_argument("--validation", type=int, default=10000, help="the last V training images are the validation split")
    p.add_argument("--val-images", type=int, default=2000, help="validation images scored by the loss")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--short-pretrain", type=int, default=1000)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--epsilon", type=float, default=8.0)
    p.add_argument("--samples", type=int, default=1000)
    p.add_argument("--ddim-steps", type=int, default=25)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--report", action="store_true", help="only write sweeps.md and sweeps.png from DIR/*.json")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.report:
        report(args.out)
        return 0
    trials = [t.strip() for t in args.trials.split(",") if t.strip()]
    for t in trials:
        if t not in TRIALS:
            p.error(f"--trials: unknown trial {t!r} (choose from {', '.join(TRIALS)})")
    torch.set_num_threads(args.threads)
    train_set, _ = load_image_dataset(args.dataset)
    train_set = train_set.resized(args.resolution)
    cut = len(train_set) - args.validation
    fit_set, val_set = train_set.subset(np.arange(cut)), train_set.subset(np.arange(cut, len(train_set)))
    if not args.classifier.exists():
        train_domain_classifier(fit_set.images, fit_set.labels, num_classes=10, epochs=2,
                                seed=args.seed).save(args.classifier)
    clf = DomainClassifier.load(args.classifier)
    ctx = {"dataset": fit_set, "train": fit_set.batch(), "n": len(fit_set), "schedule": NoiseSchedule("cosine", 1000),
           "val": val_set.batch(np.arange(min(args.val_images, len(val_set)))),
           "metrics": DomainMetrics.from_reference(clf, val_set.images)}
    for t in trials:
        run_trial(t, args, ctx)
    report(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
