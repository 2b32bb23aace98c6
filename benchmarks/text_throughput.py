"""Throughput of one private step of a causal language model with a tied embedding: ghost vs vmap vs non-private.

Usage (Opacus is optional and benchmark-only; ``--no-deps`` keeps it from replacing torch)::

    pip install --no-deps opacus==1.6.0 opt-einsum      # optional: adds the Opacus rows
    nice python benchmarks/text_throughput.py --rounds 3 --out benchmarks/results/text_throughput.json

Model: :class:`featuredp.models.CausalTransformer` (vocab 270 = bytes + specials, d = 128, 2 layers, 4 heads,
output head tied to the token embedding), sequences of length 128 right-padded (lengths 64–128), batch 32.
Loss per example: the mean next-token NLL over its real targets. The FDP loss is ℓ(x) − ℓ(x_pub), with x_pub
the same text with a span of 12 tokens replaced by one placeholder token (a different token input, so two
forward passes through every layer, the tied one included).

What one step is (for every configuration: SGD lr 0.1 on the result):

* ``nonprivate`` — ``ℓ.mean().backward()`` (the reference of every ratio);
* ``nonprivate-2pass`` — ``(ℓ − ℓ_pub).mean().backward()``: FDP's two passes without privacy;
* ``dpsgd-auto``, ``fdp-auto`` — the Trainer's default strategy (``"auto"``: ghost or vmap, chosen at the warm-up
  step, which is not timed);
* ``dpsgd-ghost``, ``dpsgd-vmap``, ``fdp-ghost``, ``fdp-vmap`` — featuredp's strategy's clipped sum
  (``clipped_sum``, the per-step separability check and forward guard included) plus the engine's noise source
  (:class:`featuredp.noise.TorchNoise`, drawing the next step's noise ahead as the Trainer's default does), C = 1,
  σ = 1; FDP's public batch (a plain backward) is not included;
* ``opacus-hooks-dpsgd``, ``opacus-hooks-fdp`` — Opacus 1.6 (GradSampleModule + DPOptimizer: per-sample
  gradients by hooks, accumulated over the two layers of the tied weight and FDP's two passes), when it can be
  imported; "not installed" otherwise. ``opacus-ghost-dpsgd`` (GradSampleModuleFastGradientClipping +
  DPOptimizerFastGradientClipping + DPLossFastGradientClipping) is attempted and reported with what Opacus
  says: it refuses tied parameters.

All configurations are timed *interleaved* in rounds (:func:`featuredp.experiments.throughput.interleaved`:
the order rotates, ratios to ``nonprivate`` are taken within each round, medians over rounds). Before timing,
each private configuration's per-example gradient norms on 4 examples are compared with a one-example-at-a-time
autograd reference ("norm error": the largest relative difference).
"""

from __future__ import annotations

import argparse
import math
import sys
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn import functional as nnf

from featuredp._io import atomic_write_json
from featuredp.clipping import AutoStrategy, GhostGradients, VmapGradients
from featuredp.experiments import throughput
from featuredp.models import CausalTransformer
from featuredp.noise import TorchNoise

VOCAB, MAX_LEN, D_MODEL, LAYERS, HEADS = 270, 128, 128, 2, 4
PLACEHOLDER = 260  # one special id (the design's placeholder tokens sit after the 256 bytes and BOS/EOS/PAD)
C, SIGMA, LR = 1.0, 1.0, 0.1
FEATUREDP = ("nonprivate", "nonprivate-2pass", "dpsgd-ghost", "dpsgd-vmap", "dpsgd-auto", "fdp-ghost", "fdp-vmap",
             "fdp-auto")
OPACUS = ("opacus-hooks-dpsgd", "opacus-hooks-fdp")

Batch = dict[str, torch.Tensor]
Loss = Callable[[nn.Module, Batch, Batch], torch.Tensor]


def text_batch(batch: int, seq_len: int, generator: torch.Generator) -> Batch:
    """Right-padded token ids and next-token targets (-100 after the end), and the same with a placeholder span."""
    x = torch.zeros(batch, seq_len, dtype=torch.long)
    y = torch.full((batch, seq_len), -100, dtype=torch.long)
    x_pub, y_pub = x.clone(), y.clone()
    for i in range(batch):
        n = int(torch.randint(seq_len // 2, seq_len + 1, (1,), generator=generator))
        toks = torch.randint(0, 256, (n + 1,), generator=generator)
        x[i, :n], y[i, :n] = toks[:-1], toks[1:]
        s = int(torch.randint(1, n - 12, (1,), generator=generator))  # a 12-token private span → 1 placeholder
        pub = torch.cat([toks[:s], torch.tensor([PLACEHOLDER]), toks[s + 12 :]])
        m = len(pub) - 1
        x_pub[i, :m], y_pub[i, :m] = pub[:-1], pub[1:]
    return {"x": x, "y": y, "x_pub": x_pub, "y_pub": y_pub}


def token_nll(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The mean next-token NLL over each example's real targets, shape (B,)."""
    nll = nnf.cross_entropy(logits.transpose(1, 2), y, reduction="none", ignore_index=-100)
    return nll.sum(1) / (y != -100).sum(1).clamp(min=1)


def lm_loss(model: nn.Module, batch: Batch, draws: Batch) -> torch.Tensor:
    """ℓ per example."""
    return token_nll(model(batch["x"]), batch["y"])


def fdp_loss(model: nn.Module, batch: Batch, draws: Batch) -> torch.Tensor:
    """ℓ(x) − ℓ(x_pub) per example: two different token inputs through the same (tied) layers."""
    return lm_loss(model, batch, draws) - token_nll(model(batch["x_pub"]), batch["y_pub"])


def make_model(seed: int) -> nn.Module:
    """The benchmark's transformer (weights from ``seed``, the caller's RNG left alone)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return CausalTransformer(VOCAB, MAX_LEN, D_MODEL, LAYERS, HEADS)


def featuredp_runner(name: str, data: Batch, seed: int) -> throughput.StepRunner:
    """A featuredp configuration (see the module docstring) as a StepRunner."""
    model = make_model(seed)
    params = dict(model.named_parameters())
    sgd = torch.optim.SGD(model.parameters(), lr=LR)
    B = int(data["x"].shape[0])
    if name.startswith("nonprivate"):
        loss = fdp_loss if name.endswith("2pass") else lm_loss

        def step() -> None:
            sgd.zero_grad(set_to_none=True)
            loss(model, data, {}).mean().backward()
            sgd.step()

        return throughput.StepRunner(name, step, float(B))
    method, kind = name.split("-")
    strategy = _strategy(kind)
    loss = fdp_loss if method == "fdp" else lm_loss
    noise = TorchNoise(torch.Generator().manual_seed(seed), prefetch=True)

    def private_step() -> None:
        sums, _ = strategy.clipped_sum(model, loss, data, {}, C)
        noisy = noise.add(sums, SIGMA * C)
        for k, p in params.items():
            p.grad = noisy[k] / B
        sgd.step()

    return throughput.StepRunner(name, private_step, float(B))


def _strategy(kind: str) -> Any:
    """featuredp's strategy ``kind`` (``ghost``, ``vmap`` or ``auto``), unchunked."""
    if kind == "auto":
        return AutoStrategy(verbose=True)
    return GhostGradients() if kind == "ghost" else VmapGradients(None)


def opacus_runner(name: str, data: Batch, seed: int) -> throughput.StepRunner:
    """An Opacus configuration as a StepRunner (Opacus must be importable)."""
    from opacus import GradSampleModule
    from opacus.grad_sample import GradSampleModuleFastGradientClipping
    from opacus.optimizers import DPOptimizer, DPOptimizerFastGradientClipping
    from opacus.utils.fast_gradient_clipping_utils import DPLossFastGradientClipping

    model = make_model(seed)
    sgd = torch.optim.SGD(model.parameters(), lr=LR)
    B = int(data["x"].shape[0])

    if name == "opacus-ghost-dpsgd":
        gsm = GradSampleModuleFastGradientClipping(model, max_grad_norm=C, use_ghost_clipping=True)
        opt = DPOptimizerFastGradientClipping(sgd, noise_multiplier=SIGMA, max_grad_norm=C, expected_batch_size=B)

        class PerExample(nn.Module):  # Opacus's wrapper takes a criterion(logits, targets) with a reduction
            reduction = "mean"

            def forward(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
                return token_nll(logits, y)

        crit = DPLossFastGradientClipping(gsm, opt, PerExample())

        def step() -> None:
            opt.zero_grad(set_to_none=True)
            crit(gsm(data["x"]), data["y"]).backward()
            opt.step()

    else:
        gsm = GradSampleModule(model)
        opt = DPOptimizer(sgd, noise_multiplier=SIGMA, max_grad_norm=C, expected_batch_size=B)
        loss = fdp_loss if name == "opacus-hooks-fdp" else lm_loss

        def step() -> None:
            opt.zero_grad(set_to_none=True)
            loss(gsm, data, {}).mean().backward()
            opt.step()

    return throughput.StepRunner(name, step, float(B))


def make_runner(name: str, data: Batch, seed: int) -> throughput.StepRunner:
    """The runner called ``name``."""
    return featuredp_runner(name, data, seed) if name in FEATUREDP else opacus_runner(name, data, seed)


def reference_norms(model: nn.Module, loss: Loss, batch: Batch) -> torch.Tensor:
    """Per-example gradient norms, one example at a time (plain autograd)."""
    params = [p for p in model.parameters() if p.requires_grad]
    out = []
    for i in range(batch["x"].shape[0]):
        one = {k: v[i : i + 1] for k, v in batch.items()}
        gs = torch.autograd.grad(loss(model, one, {}).sum(), params)
        out.append(math.sqrt(sum(float(g.double().pow(2).sum()) for g in gs)))
    return torch.tensor(out, dtype=torch.float64)


def norm_error(name: str, batch: Batch, seed: int) -> float:
    """Largest relative difference of ``name``'s per-example norms from the reference on ``batch``."""
    model = make_model(seed)
    method = "fdp" if "fdp" in name else "dpsgd"
    loss = fdp_loss if method == "fdp" else lm_loss
    ref = reference_norms(model, loss, batch)
    if name in FEATUREDP:
        _, norms = _strategy(name.split("-")[1]).clipped_sum(model, loss, batch, {}, C)
    else:
        from opacus import GradSampleModule

        gsm = GradSampleModule(model, loss_reduction="sum")
        loss(gsm, batch, {}).sum().backward()
        samples = [p.grad_sample for p in model.parameters()]  # type: ignore[attr-defined]  # Opacus sets it
        norms = torch.stack([g.reshape(len(ref), -1).double().pow(2).sum(1) for g in samples]).sum(0).sqrt()
    return float(((norms.double() - ref).abs() / ref).max())


def opacus_ghost_refusal(data: Batch, seed: int) -> str:
    """What Opacus ghost clipping says about the tied model (one DP-SGD step)."""
    try:
        opacus_runner("opacus-ghost-dpsgd", data, seed).step()
    except Exception as exc:  # the point is to record what Opacus says
        return f"{type(exc).__name__}: {exc}"
    return "accepted"


def opacus_available() -> bool:
    """Whether Opacus can be imported."""
    try:
        import opacus  # noqa: F401
    except ImportError:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    """Time the configurations interleaved, check their norms, print a table and write the JSON."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--seq-len", type=int, default=MAX_LEN)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--min-time", type=float, default=1.0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="benchmarks/results/text_throughput.json")
    args = ap.parse_args(argv)
    throughput.set_threads(args.threads)
    gen = torch.Generator().manual_seed(args.seed)
    data = text_batch(args.batch_size, args.seq_len, gen)
    configs = list(FEATUREDP)
    have_opacus = opacus_available()
    if have_opacus:
        configs += OPACUS
    small = text_batch(4, args.seq_len, gen)
    errors = {c: norm_error(c, small, args.seed) for c in configs if not c.startswith("nonprivate")}
    runners = [make_runner(c, data, args.seed) for c in configs]
    print(f"timing {len(runners)} configurations, {args.rounds} interleaved rounds ...", file=sys.stderr)
    res = throughput.interleaved(runners, rounds=args.rounds, min_time=args.min_time, warmup=1, progress=False)
    timing = res.to_dict()
    results: dict[str, Any] = {
        "settings": {**vars(args), "torch": torch.__version__, "C": C, "sigma": SIGMA, "vocab": VOCAB,
                     "d_model": D_MODEL, "layers": LAYERS, "heads": HEADS, "tied": True,
                     "parameters": sum(p.numel() for p in make_model(args.seed).parameters())},
        "timing": timing,
        "norm_error": errors,
        "opacus": "installed" if have_opacus else "not installed",
        "opacus_ghost_dpsgd": opacus_ghost_refusal(small, args.seed) if have_opacus else "not installed",
    }
    if not have_opacus:
        results["timing"]["median_samples_per_s"].update({c: None for c in OPACUS})
    atomic_write_json(args.out, results)
    print_table(results, configs)
    return 0


def print_table(results: dict[str, Any], configs: list[str]) -> None:
    """The table: examples/s, ratio to nonprivate, spread over rounds, norm error."""
    t, s = results["timing"], results["settings"]
    print(f"\nCausalTransformer (V={s['vocab']}, d={s['d_model']}, {s['layers']} layers, tied head), L={s['seq_len']}, "
          f"batch {s['batch_size']}, {s['threads']} thread(s), torch {s['torch']}; medians over {s['rounds']} rounds")
    print(f"{'configuration':<22}{'examples/s':>11}{'ratio':>8}{'spread':>8}{'norm error':>12}")
    for c in configs:
        err = results["norm_error"].get(c)
        print(f"{c:<22}{t['median_samples_per_s'][c]:>11,.1f}{t['median_ratio'][c]:>8.3f}{t['spread'][c]:>8.0%}"
              f"{'-' if err is None else f'{err:.1e}':>12}")
    if results["opacus"] != "installed":
        print(f"{'opacus-*':<22}{'not installed':>11}")
    print(f"opacus-ghost-dpsgd: {results['opacus_ghost_dpsgd']}")
    sys.stdout.flush()


if __name__ == "__main__":
    # Opacus's hooks warn on every first layer whose input needs no gradient; not informative here.
    warnings.filterwarnings("ignore", message="Full backward hook is firing")
    sys.exit(main())
