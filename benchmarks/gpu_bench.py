"""GPU benchmark: private training steps of a ResNet-18-shaped CNN and a GPT-2-small-shaped transformer.

Run it through ``benchmarks/gpu.sh`` (see docs/performance.md, "GPU benchmark: how to run it")::

    benchmarks/gpu.sh [OUT_DIR]            # CUDA, full sizes, JSON in OUT_DIR (default $OUT, else benchmarks/results)
    benchmarks/gpu.sh --cpu-smoke [OUT_DIR]  # the same code at toy sizes on the CPU (well under a minute)

Models (built in code, no downloads):

* ``cnn``: ResNet-18-shaped (BasicBlocks 2-2-2-2, widths 64-128-256-512, GroupNorm instead of BatchNorm, a 3×3
  stem for 32×32 inputs), 10 classes, batch 256;
* ``gpt``: :class:`featuredp.models.CausalTransformer` at GPT-2 small's shape (12 layers, d = 768, 12 heads,
  vocab 50257, tied embedding: 124 M parameters), 256 tokens, batch 16;
* ``gpt-lora``: the same with :func:`featuredp.models.lora.add_lora` rank 8 on every block's linear layers
  (only the adapters train).

Arms, per model, timed interleaved in one run (:func:`featuredp.experiments.throughput.interleaved`, ratios to
``nonprivate`` within each round, medians): ``nonprivate`` (mean loss, backward, SGD); ``dpsgd-ghost`` and
``dpsgd-vmap`` (featuredp's clipped sum with ghost clipping or vmap per-example gradients, plus the engine's
noise, :class:`featuredp.noise.TorchNoise`, C = 1, σ = 1); ``fdp-ghost`` (the same on FDP's zero-masking loss
ℓ(x) − ℓ(Ψ(x)): Ψ the Gaussian blur of :mod:`featuredp.features.image` for the CNN, the text with a 12-token
private span replaced by one placeholder token for the transformers); ``opacus-ghost`` (Opacus 1.6 ghost
clipping DP-SGD), skipped with Opacus's own message when it is not installed or refuses the model. Peak memory
per arm: ``torch.cuda.max_memory_allocated`` over its warm-up step on CUDA, the process's peak RSS (a
high-water mark over the whole run so far, so only an upper bound per arm) on the CPU.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as nnf

from featuredp._io import atomic_write_json
from featuredp.clipping import GhostGradients, VmapGradients
from featuredp.experiments import throughput
from featuredp.features.image import GaussianBlur
from featuredp.models import CausalTransformer
from featuredp.models.lora import add_lora
from featuredp.noise import TorchNoise

C, SIGMA, LR = 1.0, 1.0, 0.01
PLACEHOLDER_SPAN = 12
ARMS = ("nonprivate", "opacus-ghost", "dpsgd-ghost", "dpsgd-vmap", "fdp-ghost")
Batch = dict[str, torch.Tensor]

#: Full sizes (one H100: about 5 minutes in all) and the CPU smoke sizes.
SIZES: dict[str, dict[str, Any]] = {
    "full": {"cnn_widths": (64, 128, 256, 512), "cnn_batch": 256, "gpt": (50257, 768, 12, 12), "seq": 256,
             "gpt_batch": 16, "rounds": 3, "min_time": 0.5},
    "smoke": {"cnn_widths": (4, 8, 8, 16), "cnn_batch": 4, "gpt": (300, 32, 2, 2), "seq": 32, "gpt_batch": 4,
              "rounds": 2, "min_time": 0.01},
}  # fmt: skip


class BasicBlock(nn.Module):
    """ResNet's basic block with GroupNorm (per-example normalisation keeps per-example gradients separable)."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        groups = min(32, cout // 2) or 1
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.gn1 = nn.GroupNorm(groups, cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.gn2 = nn.GroupNorm(groups, cout)
        self.down = (
            nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.GroupNorm(groups, cout))
            if stride != 1 or cin != cout
            else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """conv-GN-ReLU-conv-GN plus the shortcut, then ReLU."""
        h = nnf.relu(self.gn1(self.conv1(x)))
        return nnf.relu(self.gn2(self.conv2(h)) + self.down(x))


class ResNet18GN(nn.Module):
    """ResNet-18's layout (2-2-2-2 basic blocks) for 32×32 inputs, GroupNorm throughout."""

    def __init__(self, widths: tuple[int, ...] = (64, 128, 256, 512), classes: int = 10) -> None:
        super().__init__()
        w0 = widths[0]
        self.stem = nn.Sequential(nn.Conv2d(3, w0, 3, 1, 1, bias=False), nn.GroupNorm(min(32, w0 // 2) or 1, w0),
                                  nn.ReLU())  # fmt: skip
        blocks, prev = [], w0
        for i, w in enumerate(widths):
            blocks += [BasicBlock(prev, w, 1 if i == 0 else 2), BasicBlock(w, w, 1)]
            prev = w
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(prev, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits (B, classes)."""
        return self.head(self.blocks(self.stem(x)).mean(dim=(2, 3)))


def _cnn_task(size: dict[str, Any], device: torch.device) -> tuple[Callable[[], nn.Module], Batch, dict[str, Any]]:
    g = torch.Generator().manual_seed(0)
    b = size["cnn_batch"]
    x = torch.rand(b, 3, 32, 32, generator=g)
    data = {"x": x, "y": torch.randint(0, 10, (b,), generator=g)}
    data["x_pub"] = GaussianBlur(1.0)({"x": x})["x"]  # Ψ(x): what FDP's zero-masking loss subtracts
    data = {k: v.to(device) for k, v in data.items()}

    def build() -> nn.Module:
        torch.manual_seed(0)
        return ResNet18GN(size["cnn_widths"]).to(device)

    return build, data, {"kind": "image", "input": [3, 32, 32], "batch": b, "widths": list(size["cnn_widths"])}


def _gpt_task(
    size: dict[str, Any], device: torch.device, lora: bool
) -> tuple[Callable[[], nn.Module], Batch, dict[str, Any]]:
    vocab, d, layers, heads = size["gpt"]
    seq, b = size["seq"], size["gpt_batch"]
    g = torch.Generator().manual_seed(0)
    toks = torch.randint(0, vocab - 1, (b, seq + 1), generator=g)
    x, y = toks[:, :-1], toks[:, 1:]
    # The public view: a private span of 12 tokens replaced by one placeholder (the last id), the rest shifted left.
    x_pub, y_pub = x.clone(), y.clone()
    for i in range(b):
        s = int(torch.randint(1, seq - PLACEHOLDER_SPAN - 1, (1,), generator=g))
        row = torch.cat([toks[i, :s], torch.tensor([vocab - 1]), toks[i, s + PLACEHOLDER_SPAN :]])
        m = len(row) - 1
        x_pub[i], y_pub[i] = 0, -100
        x_pub[i, :m], y_pub[i, :m] = row[:-1], row[1:]
    data = {k: v.to(device) for k, v in {"x": x, "y": y, "x_pub": x_pub, "y_pub": y_pub}.items()}

    def build() -> nn.Module:
        torch.manual_seed(0)
        model = CausalTransformer(vocab, seq, d, layers, heads)
        if lora:
            add_lora(model, rank=8, targets=("qkv", "proj", "fc1", "fc2"), seed=0)
        return model.to(device)

    n = sum(p.numel() for p in build().parameters())
    return build, data, {"kind": "text", "vocab": vocab, "d_model": d, "layers": layers, "heads": heads,
                         "tokens": seq, "batch": b, "parameters": n, "lora_rank": 8 if lora else None}  # fmt: skip


def _loss(kind: str, fdp: bool) -> Callable[[nn.Module, Batch, Batch], torch.Tensor]:
    def one(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = model(x)
        if kind == "image":
            return nnf.cross_entropy(out, y, reduction="none")
        nll = nnf.cross_entropy(out.transpose(1, 2), y, reduction="none", ignore_index=-100)
        return nll.sum(1) / (y != -100).sum(1).clamp(min=1)

    def loss(model: nn.Module, batch: Batch, draws: Batch) -> torch.Tensor:
        ell = one(model, batch["x"], batch["y"])
        if fdp:  # zero masking: ℓ(x) − ℓ(Ψ(x)), the label public
            ell = ell - one(model, batch["x_pub"], batch.get("y_pub", batch["y"]))
        return ell

    return loss


def _runner(arm: str, kind: str, build: Callable[[], nn.Module], data: Batch, device: torch.device
            ) -> throughput.StepRunner:  # fmt: skip
    model = build()
    params = {k: p for k, p in model.named_parameters() if p.requires_grad}
    sgd = torch.optim.SGD(list(params.values()), lr=LR)
    b = int(data["x"].shape[0])
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    if arm == "nonprivate":
        loss = _loss(kind, fdp=False)

        def step() -> None:
            sgd.zero_grad(set_to_none=True)
            loss(model, data, {}).mean().backward()
            sgd.step()
            sync()

    elif arm == "opacus-ghost":
        step = _opacus_step(kind, model, sgd, data, sync)
    else:
        method, how = arm.split("-")
        strategy = GhostGradients() if how == "ghost" else VmapGradients(None)
        loss = _loss(kind, fdp=method == "fdp")
        noise = TorchNoise(torch.Generator(device=device).manual_seed(0))

        def step() -> None:
            sums, _ = strategy.clipped_sum(model, loss, data, {}, C)
            noisy = noise.add(sums, SIGMA * C)
            for k, p in params.items():
                p.grad = noisy[k] / b
            sgd.step()
            sync()

    return throughput.StepRunner(arm, step, float(b))


def _opacus_step(kind: str, model: nn.Module, sgd: torch.optim.Optimizer, data: Batch, sync: Callable[[], None]
                 ) -> Callable[[], None]:  # fmt: skip
    from opacus.grad_sample import GradSampleModuleFastGradientClipping
    from opacus.optimizers import DPOptimizerFastGradientClipping
    from opacus.utils.fast_gradient_clipping_utils import DPLossFastGradientClipping

    b = int(data["x"].shape[0])
    gsm = GradSampleModuleFastGradientClipping(model, max_grad_norm=C, use_ghost_clipping=True)
    opt = DPOptimizerFastGradientClipping(sgd, noise_multiplier=SIGMA, max_grad_norm=C, expected_batch_size=b)

    class PerExample(nn.Module):  # Opacus's wrapper takes criterion(output, target) with a reduction
        reduction = "mean"

        def forward(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            if kind == "image":
                return nnf.cross_entropy(out, y, reduction="none")
            nll = nnf.cross_entropy(out.transpose(1, 2), y, reduction="none", ignore_index=-100)
            return nll.sum(1) / (y != -100).sum(1).clamp(min=1)

    crit = DPLossFastGradientClipping(gsm, opt, PerExample())

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        crit(gsm(data["x"]), data["y"]).backward()
        opt.step()
        sync()

    return step


def _peak_memory(step: Callable[[], None], device: torch.device) -> dict[str, Any]:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        step()
        return {"peak_bytes": int(torch.cuda.max_memory_allocated(device)), "measure": "cuda.max_memory_allocated"}
    step()
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # Linux: KiB
    return {"peak_bytes": int(kib) * 1024, "measure": "process peak RSS so far (upper bound)"}


def run_model(name: str, task: tuple[Callable[[], nn.Module], Batch, dict[str, Any]], size: dict[str, Any],
              device: torch.device, progress: bool) -> dict[str, Any]:  # fmt: skip
    """Time every arm on one model, interleaved; the result's ``arms``, ``skipped`` and ``ratios``."""
    build, data, meta = task
    kind = meta["kind"]
    runners, skipped, memory = [], {}, {}
    for arm in ARMS:
        try:
            r = _runner(arm, kind, build, data, device)
            memory[arm] = _peak_memory(r.step, device)
        except ImportError as e:
            skipped[arm] = f"not installed: {e}"
            continue
        except Exception as e:  # an Opacus refusal (only that arm may fail)
            if arm != "opacus-ghost":
                raise
            skipped[arm] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            continue
        runners.append(r)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    res = throughput.interleaved(runners, rounds=size["rounds"], min_time=size["min_time"], warmup=1,
                                 reference="nonprivate", progress=progress)  # fmt: skip
    med_sps = {n: sorted(v)[len(v) // 2] for n, v in res.samples_per_s.items()}
    med_ratio = {n: sorted(v)[len(v) // 2] for n, v in res.ratios.items()}
    return {"model": name, **meta, "arms": {n: {"samples_per_s": med_sps[n], "ratio_to_nonprivate": med_ratio[n],
                                                **memory[n]} for n in res.names},
            "skipped": skipped, "rounds": size["rounds"]}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; write ``gpu_bench.json`` (full) or ``gpu_bench_smoke.json`` into the output folder."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cpu-smoke", action="store_true", help="toy sizes on the CPU (2 rounds)")
    p.add_argument("--out", default=None, help="output folder (default: $OUT, else benchmarks/results)")
    p.add_argument("--models", default="cnn,gpt,gpt-lora", help="comma-separated subset of cnn, gpt, gpt-lora")
    a = p.parse_args(argv)
    models = [m.strip() for m in a.models.split(",") if m.strip()]
    for m in models:
        if m not in ("cnn", "gpt", "gpt-lora"):
            raise SystemExit(f"--models: unknown model {m!r} (cnn, gpt, gpt-lora)")
    if a.cpu_smoke:
        device, size = torch.device("cpu"), SIZES["smoke"]
    else:
        if not torch.cuda.is_available():
            raise SystemExit("no CUDA device: run with --cpu-smoke for the CPU smoke test")
        device, size = torch.device("cuda"), SIZES["full"]
    out_dir = Path(a.out or os.environ.get("OUT") or "benchmarks/results")
    start = time.perf_counter()
    results = []
    for m in models:
        task = _cnn_task(size, device) if m == "cnn" else _gpt_task(size, device, lora=m == "gpt-lora")
        results.append(run_model(m, task, size, device, progress=not a.cpu_smoke))
        if device.type == "cuda":
            torch.cuda.empty_cache()
    report = {
        "mode": "cpu-smoke" if a.cpu_smoke else "cuda",
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__,
        "seconds": round(time.perf_counter() - start, 1),
        "results": results,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / ("gpu_bench_smoke.json" if a.cpu_smoke else "gpu_bench.json")
    atomic_write_json(path, report)
    for r in results:
        arms = ", ".join(f"{n} {v['ratio_to_nonprivate']:.2f}x" for n, v in r["arms"].items())
        print(f"{r['model']}: {arms}" + (f"  (skipped: {', '.join(r['skipped'])})" if r["skipped"] else ""))
    print(f"wrote {path} ({report['seconds']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
