"""Per-example gradient norms of the diffusion loss split across timesteps (issue 15's norm study).

Algorithm 1 pays for privacy only on ℓ_priv = ℓ − ℓ_pub; it beats FDP (DP-SGD), which clips the
whole ℓ, only where ‖∇ℓ_priv‖ is much smaller than ‖∇ℓ‖ (then C can be small and the noise σC with
it). This measures both norms (and ‖∇ℓ_pub‖) for each timestep t on a U-Net after public
pre-training on blurred images, as Algorithm 1 starts from, with the common random numbers of
:class:`featuredp.diffusion.losses.DiffusionLoss`.

    nice python benchmarks/diffusion_norms.py --pretrain-steps 300 --out results/diffusion/norms.json

Reads Fashion-MNIST (fetched into the cache on first use). Everything here is public-seeded: the
images are only measured, nothing is released about them but these summary statistics.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import numpy as np
import torch

from featuredp._io import atomic_write_json, atomic_write_text
from featuredp.clipping import GhostGradients
from featuredp.data.images import load_image_dataset
from featuredp.diffusion.losses import DiffusionLoss
from featuredp.diffusion.schedule import NoiseSchedule
from featuredp.diffusion.unet import build_unet, count_parameters
from featuredp.engine import Trainer
from featuredp.experiments.diffusion import load_model
from featuredp.features.image import GaussianBlur

TIMESTEPS = (10, 50, 100, 200, 400, 600, 800, 950)


def norms_by_timestep(model: torch.nn.Module, split: DiffusionLoss, data: dict[str, torch.Tensor],
                      timesteps: tuple[int, ...], per_t: int, seed: int) -> list[dict[str, float]]:  # fmt: skip
    """Median per-example norms of ∇ℓ, ∇ℓ_pub, ∇ℓ_priv at each t (the same images and ε for all three)."""
    gen = torch.Generator().manual_seed(seed)
    strategy = GhostGradients()
    rows = []
    for t in timesteps:
        idx = torch.randperm(data["x"].shape[0], generator=gen)[:per_t]
        batch = {k: v[idx] for k, v in data.items()}
        draws = split.draws(batch, gen)
        draws["t"] = torch.full_like(draws["t"], t)
        norms = {}
        for name, fn in (("loss", split.loss), ("public", split.public_loss), ("private", split.private_loss)):
            _, n = strategy.clipped_sum(model, fn, batch, draws, math.inf)
            norms[name] = n.double().numpy()
        ratio = norms["private"] / np.maximum(norms["loss"], 1e-12)
        rows.append({
            "t": t, "loss": float(np.median(norms["loss"])), "public": float(np.median(norms["public"])),
            "private": float(np.median(norms["private"])), "ratio_median": float(np.median(ratio)),
            "ratio_q90": float(np.quantile(ratio, 0.9)), "private_smaller": float(np.mean(ratio < 1.0)),
        })  # fmt: skip
    return rows


def main() -> None:
    """Pre-train publicly, then measure; print a table and write JSON (and a markdown table) next to --out."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--train-size", type=int, default=10000)
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--pretrain-steps", type=int, default=300)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--per-t", type=int, default=64, help="images per timestep")
    ap.add_argument("--blur-sigma", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0, help="public seed (initialisation, batches, the measured images)")
    ap.add_argument("--resolution", type=int, default=None, help="resize the images to R×R first (as the main run)")
    ap.add_argument("--public-model", type=Path, default=None,
                    help="measure this public model (DIR/public/model.pt of a run) instead of pre-training one")
    ap.add_argument("--out", type=Path, default=Path("results/diffusion/norms.json"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    train, _ = load_image_dataset("fashion-mnist")
    train = train.subset(np.arange(min(args.train_size, len(train))))
    if args.resolution is not None:
        train = train.resized(args.resolution)
    data = train.batch()
    split = DiffusionLoss(GaussianBlur(args.blur_sigma).bind(train), NoiseSchedule("cosine", 1000))
    torch.manual_seed(args.seed)
    model = build_unet(args.preset, in_channels=train.image_shape[0], num_classes=len(train.classes))
    results: dict[str, object] = {"preset": args.preset, "parameters": count_parameters(model),
                                  "train_size": len(train), "blur_sigma": args.blur_sigma,
                                  "image_shape": list(train.image_shape)}  # fmt: skip
    results["at_init"] = norms_by_timestep(model, split, data, TIMESTEPS, args.per_t, args.seed + 1)
    t0 = time.perf_counter()
    if args.public_model is not None:
        model.load_state_dict(load_model(args.public_model).state_dict())
        results["public_model"] = str(args.public_model)
    else:
        Trainer(model, "public", loss_split=split, steps=args.pretrain_steps, batch_size=args.batch_size,
                optimizer="adam", lr=2e-3, public_seed=args.seed, progress=True).fit(data)  # fmt: skip
        results["pretrain_steps"], results["pretrain_s"] = args.pretrain_steps, round(time.perf_counter() - t0, 1)
    results["after_public_pretraining"] = norms_by_timestep(model, split, data, TIMESTEPS, args.per_t, args.seed + 1)
    size = "×".join(map(str, train.image_shape[1:]))
    lines = [f"U-Net `{args.preset}` ({results['parameters']:,} parameters), Fashion-MNIST {len(train):,} "
             f"{size} images, "
             f"Ψ = blur σ = {args.blur_sigma}; medians over {args.per_t} images per t.", ""]  # fmt: skip
    for phase in ("at_init", "after_public_pretraining"):
        lines += [f"**{phase.replace('_', ' ')}**", "",
                  "| t | ‖∇ℓ‖ | ‖∇ℓ_pub‖ | ‖∇ℓ_priv‖ | median ‖∇ℓ_priv‖/‖∇ℓ‖ | 90% quantile "
                  "| share with ‖∇ℓ_priv‖ < ‖∇ℓ‖ |", "|---|---|---|---|---|---|---|"]  # fmt: skip
        for r in results[phase]:  # type: ignore[attr-defined]
            lines.append(f"| {r['t']} | {r['loss']:.3g} | {r['public']:.3g} | {r['private']:.3g} | "
                         f"{r['ratio_median']:.2f} | {r['ratio_q90']:.2f} | {r['private_smaller']:.0%} |")  # fmt: skip
        lines.append("")
    text = "\n".join(lines)
    print(text)
    atomic_write_json(args.out, results)
    atomic_write_text(args.out.with_suffix(".md"), text + "\n")


if __name__ == "__main__":
    main()
