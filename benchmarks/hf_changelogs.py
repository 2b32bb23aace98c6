"""``DPTrainer`` on real text: LoRA fine-tuning of a small GPT-2 on Debian changelog entries (issue 43).

The corpus is ``featuredp data fetch debian-changelogs`` (this machine's /usr/share/doc: real maintainers' names and
emails in every entry's ``Author:`` line, annotated ``name`` and ``email``). The packages are split by a public hash:
a third is public pre-training text (its Ψ views only, so no author reaches the base model), the rest holds the
private training texts and the held-out test texts.

1. A GPT-2-shaped base (byte tokens, d = 64, 2 layers, 4 heads) is pre-trained non-privately on the public texts.
2. LoRA r = 8 on every attention and MLP projection is fine-tuned through ``transformers.Trainer`` (non-private) and
   ``featuredp.hf.DPTrainer`` at ε = 3 (δ = 1e-5): DP-SGD, FDP (Algorithm 1) with the author spans private, and FDP
   with the record-level backstop (``record_epsilon``, default 8), each at every learning rate of ``--lrs``.
3. Each method's learning rate is chosen by validation perplexity; its test perplexity (per token, exp of the mean
   NLL over every test token) is reported.
4. Samples/s of the same LoRA model in a hand loop (``outputs = model(**batch); outputs.loss.backward()``):
   non-private, featuredp's ``PrivacyEngine`` and Opacus 1.6's (``grad_sample_mode="hooks"``, where it runs),
   interleaved rounds, medians.

    OMP_NUM_THREADS=2 PYTHONPATH=src python benchmarks/hf_changelogs.py --out results/hf-changelogs --lrs 2e-3,5e-3,1e-2

Writes ``hf_changelogs.md`` and ``hf_changelogs.json`` under --out.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import math
import shutil
import statistics
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import transformers
from torch.utils.data import DataLoader

from featuredp import PrivacyEngine
from featuredp._io import atomic_write_json, atomic_write_text
from featuredp.data.changelogs import fetch_debian_changelogs
from featuredp.data.text import ByteTokenizer, TextDataset, load_text_jsonl, split_records
from featuredp.features.text import TextSpans
from featuredp.hf import DPTrainer, TokenRows
from featuredp.lm import IGNORE_INDEX
from featuredp.models.hf import HFCausalLM

PSI = TextSpans(("name", "email"), detect=("email",))


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The flags."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="results/hf-changelogs")
    p.add_argument("--train-size", type=int, default=1200)
    p.add_argument("--test-size", type=int, default=300)
    p.add_argument("--val-size", type=int, default=300, help="held-out texts that choose each method's lr")
    p.add_argument("--public-size", type=int, default=3000, help="public pre-training texts (Ψ views)")
    p.add_argument("--max-len", type=int, default=128)
    p.add_argument("--epsilon", type=float, default=3.0)
    p.add_argument("--record-epsilon", type=float, default=8.0)
    p.add_argument("--epochs", type=float, default=3.0)
    p.add_argument("--batch-size", type=int, default=64, help="logical batch (expected Poisson batch size)")
    p.add_argument("--physical-batch-size", type=int, default=32)
    p.add_argument("--lrs", default="5e-3", help="learning rates tried for every method alike (comma-separated); "
                   "each method's is chosen by validation perplexity")  # fmt: skip
    p.add_argument("--pretrain-steps", type=int, default=600)
    p.add_argument("--speed-rounds", type=int, default=3)
    p.add_argument("--speed-steps", type=int, default=12)
    return p.parse_args(argv)


def corpus(args: argparse.Namespace) -> tuple[list[Any], list[Any], list[Any], list[Any]]:
    """(public, train, validation, test) records: packages split by a public hash, then split within the rest."""
    path, _ = fetch_debian_changelogs(progress=False)
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    records = load_text_jsonl(path, spans=PSI.types, detect=PSI.detect)
    public_pkg = {r["package"] for r in rows if int(hashlib.sha256(r["package"].encode()).hexdigest(), 16) % 3 == 0}
    public = [rec for rec, r in zip(records, rows, strict=True) if r["package"] in public_pkg]
    rest = [rec for rec, r in zip(records, rows, strict=True) if r["package"] not in public_pkg]
    n = args.train_size + args.val_size + args.test_size
    train, held = split_records(rest[:: max(1, len(rest) // n)][:n], test_fraction=(n - args.train_size) / n,
                                split_seed=0)  # fmt: skip
    val, test = split_records(held, test_fraction=args.test_size / len(held), split_seed=1)
    return public[: args.public_size], train, val, test


def gpt2(max_len: int) -> transformers.GPT2LMHeadModel:
    """The GPT-2-shaped base, built from a config (no download)."""
    config = transformers.GPT2Config(vocab_size=ByteTokenizer().vocab_size, n_positions=max_len, n_embd=64,
                                     n_layer=2, n_head=4, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)  # fmt: skip
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config)


def pretrain(model: torch.nn.Module, public: TextDataset, steps: int) -> float:
    """Non-private pre-training on the public texts' Ψ views; returns the seconds it took."""
    batch = public.batch()
    x, y = batch["x_pub"], batch["y_pub"]
    net = HFCausalLM(model)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    start = time.time()
    for step in range(steps):
        idx = torch.randint(0, x.shape[0], (32,), generator=g)
        logits = net(x[idx])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), y[idx].flatten(), ignore_index=IGNORE_INDEX)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 100 == 0:
            print(f"  pre-train step {step}: public loss {loss.item():.3f}", flush=True)
    return time.time() - start


def lora(base: torch.nn.Module) -> torch.nn.Module:
    import peft

    config = peft.LoraConfig(r=8, lora_alpha=16, target_modules=["c_attn", "c_proj", "c_fc"], lora_dropout=0.0,
                             fan_in_fan_out=True)  # fmt: skip
    return peft.get_peft_model(copy.deepcopy(base), config)


@torch.no_grad()
def perplexity(model: torch.nn.Module, test: TextDataset) -> float:
    """exp(mean NLL over every test target token)."""
    batch = test.batch()
    net = HFCausalLM(model).eval()
    total, count = 0.0, 0
    for i in range(0, batch["x"].shape[0], 64):
        logits = net(batch["x"][i:i + 64])
        y = batch["y"][i:i + 64]
        total += float(torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=IGNORE_INDEX,
                                                         reduction="sum"))  # fmt: skip
        count += int((y != IGNORE_INDEX).sum())
    return math.exp(total / count)


class LMTrainer(transformers.Trainer):
    """The non-private reference: transformers.Trainer on the same token rows and the same loss."""

    def compute_loss(self, model: Any, inputs: dict[str, Any], return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> Any:  # fmt: skip
        logits = HFCausalLM(model)(inputs["x"])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), inputs["y"].flatten(),
                                                 ignore_index=IGNORE_INDEX)  # fmt: skip
        return (loss, {"logits": logits}) if return_outputs else loss


def training_args(out: Path, args: argparse.Namespace, name: str, lr: float) -> transformers.TrainingArguments:
    return transformers.TrainingArguments(
        output_dir=str(out / "runs" / name), per_device_train_batch_size=args.physical_batch_size,
        gradient_accumulation_steps=max(1, args.batch_size // args.physical_batch_size),
        num_train_epochs=args.epochs, learning_rate=lr, lr_scheduler_type="constant", logging_steps=10,
        save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True, remove_unused_columns=False,
        label_names=["y"])  # fmt: skip


def fine_tune(base: torch.nn.Module, train: TextDataset, args: argparse.Namespace, out: Path, method: str,
              lr: float) -> tuple[torch.nn.Module, dict[str, Any]]:  # fmt: skip
    """One LoRA fine-tune; returns the model and what it reports."""
    model = lora(base)
    shutil.rmtree(out / "runs" / method, ignore_errors=True)
    targs = training_args(out, args, method, lr)
    start = time.time()
    if method == "nonprivate":
        trainer: Any = LMTrainer(model=model, args=targs, train_dataset=TokenRows(train))
        trainer.train()
        return model, {"seconds": time.time() - start, "steps": trainer.state.global_step}
    kw: dict[str, Any] = {"feature_map": PSI, "method": "dpsgd" if method == "dpsgd" else "fdp"}
    if method == "fdp_backstop":
        kw["record_epsilon"] = args.record_epsilon
    trainer = DPTrainer(model=model, args=targs, train_dataset=train, target_epsilon=args.epsilon,
                        target_delta=1e-5, max_grad_norm=1.0, **kw)  # fmt: skip
    trainer.train()
    result = trainer.privacy
    assert result is not None
    return model, {"seconds": time.time() - start, "steps": trainer.engine.steps, "epsilon": result.epsilon,
                   "record_epsilon": result.record_epsilon, "noise_multiplier": result.plan.noise_multiplier,
                   "guarantee": result.guarantee}  # fmt: skip


def hf_records(data: TextDataset) -> list[dict[str, torch.Tensor]]:
    """Hugging Face's form of the token rows: input_ids, attention_mask, labels (unshifted; -100 on padding)."""
    b = data.batch()
    labels = torch.cat([torch.full_like(b["y"][:, :1], IGNORE_INDEX), b["y"][:, :-1]], 1)
    mask = (b["y"] != IGNORE_INDEX).long()
    mask[:, 0] = 1
    return [{"input_ids": b["x"][i], "attention_mask": mask[i], "labels": labels[i]} for i in range(len(labels))]


def _hand_loop(kind: str, base: torch.nn.Module, records: list[dict[str, torch.Tensor]], batch: int, steps: int
               ) -> float | str:  # fmt: skip
    """Samples/s of ``steps`` steps of the hand loop (after one warm-up step); or why it could not run."""
    model = lora(base)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-3)
    loader = DataLoader(records, batch_size=batch)
    if kind == "featuredp":
        engine = PrivacyEngine()
        out = engine.make_private(module=model, optimizer=opt, data_loader=loader, noise_multiplier=1.0,
                                  max_grad_norm=1.0, grad_sample_mode="ghost")  # fmt: skip
        model, opt, loader = out[0], out[1], out[-1]
    elif kind == "opacus":
        try:
            import opacus
        except ImportError as exc:
            return f"not run ({exc})"
        out = opacus.PrivacyEngine().make_private(module=model, optimizer=opt, data_loader=loader,
                                                  noise_multiplier=1.0, max_grad_norm=1.0,
                                                  grad_sample_mode="hooks")  # fmt: skip
        model, opt, loader = out[0], out[1], out[-1]
    seen, start, it = 0, 0.0, iter(loader)
    for step in range(steps + 1):
        try:
            b = next(it)
        except StopIteration:
            it = iter(loader)
            b = next(it)
        if step == 1:
            start, seen = time.perf_counter(), 0
        opt.zero_grad()
        model(**b).loss.backward()
        opt.step()
        seen += int(b["input_ids"].shape[0])
    return seen / (time.perf_counter() - start)


def speed(base: torch.nn.Module, train: TextDataset, args: argparse.Namespace) -> dict[str, Any]:
    records = hf_records(train)
    kinds = ("nonprivate", "featuredp", "opacus")
    runs: dict[str, list[Any]] = {k: [] for k in kinds}
    for r in range(args.speed_rounds):
        for kind in kinds:
            try:
                runs[kind].append(_hand_loop(kind, base, records, args.batch_size, args.speed_steps))
            except Exception as exc:
                runs[kind].append(f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
            print(f"  speed round {r + 1} {kind}: {runs[kind][-1]}", flush=True)
    return {k: (statistics.median(v) if all(isinstance(x, float) for x in v) else v[-1]) for k, v in runs.items()}


LABELS = {"nonprivate": "non-private", "dpsgd": "DP-SGD", "fdp": "FDP (Alg. 1), author spans private",
          "fdp_backstop": "FDP (Alg. 1) + backstop"}


def render(report: dict[str, Any]) -> str:
    a = report["args"]
    lines = [f"# DPTrainer on Debian changelogs (LoRA r = 8, ε = {a['epsilon']}, δ = 1e-5)", "",
             f"{report['sizes']['train']} private training texts, {report['sizes']['validation']} validation and "
             f"{report['sizes']['test']} test texts, "
             f"{report['sizes']['public']} public pre-training texts (Ψ views of other packages); "
             f"{a['epochs']} epochs, expected batch {a['batch_size']} (physical {a['physical_batch_size']}), "
             f"learning rates {a['lrs']} tried for every method, each method's chosen by validation perplexity (the "
             "choice reads held-out texts and is not accounted). Base model after pre-training: test perplexity "
             f"{report['base_perplexity']:.3f}.", "",
             "| method | lr (chosen) | validation perplexity | test perplexity | ε | record ε | σ | private steps | "
             "seconds (one run) |", "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for m, r in report["methods"].items():
        eps = "—" if r.get("epsilon") is None else f"{r['epsilon']:.3f}"
        rec = "—" if r.get("record_epsilon") is None else f"{r['record_epsilon']:.3f}"
        sigma = "—" if r.get("noise_multiplier") is None else f"{r['noise_multiplier']:.3f}"
        lines.append(f"| {LABELS[m]} | {r['lr']:g} | {r['val_perplexity']:.3f} | {r['perplexity']:.3f} | {eps} | "
                     f"{rec} | {sigma} | {r['steps']} | {r['seconds']:.0f} |")  # fmt: skip
    s = report["speed"]
    lines += ["", f"Hand loop `model(**batch).loss.backward()` on the same LoRA model, batch {a['batch_size']}, "
              f"samples/s (median of {a['speed_rounds']} interleaved rounds of {a['speed_steps']} steps):", "",
              "| loop | samples/s |", "|---|---|"]  # fmt: skip
    for k, v in s.items():
        lines.append(f"| {k} | {v:.1f} |" if isinstance(v, float) else f"| {k} | {v} |")
    if isinstance(s.get("featuredp"), float) and isinstance(s.get("opacus"), float):
        lines += ["", f"featuredp ÷ Opacus: {s['featuredp'] / s['opacus']:.2f}; featuredp ÷ non-private: "
                  f"{s['featuredp'] / s['nonprivate']:.2f}."]  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    warnings.simplefilter("ignore")
    transformers.logging.set_verbosity_error()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    public_records, train_records, val_records, test_records = corpus(args)
    common = {"max_len": args.max_len}
    public = TextDataset(public_records, PSI, **common)
    train, test = TextDataset(train_records, PSI, **common), TextDataset(test_records, PSI, **common)
    val = TextDataset(val_records, PSI, **common)
    lrs = [float(v) for v in args.lrs.split(",") if v.strip()]
    print(f"{len(public)} public, {len(train)} train, {len(val)} validation, {len(test)} test texts", flush=True)
    base = gpt2(args.max_len)
    seconds = pretrain(base, public, args.pretrain_steps)
    report: dict[str, Any] = {"args": vars(args), "sizes": {"public": len(public), "train": len(train),
                              "validation": len(val), "test": len(test)}, "pretrain_seconds": seconds,
                              "base_perplexity": perplexity(base, test), "methods": {}}  # fmt: skip
    for method in ("nonprivate", "dpsgd", "fdp", "fdp_backstop"):
        best: tuple[float, float, torch.nn.Module, dict[str, Any]] | None = None
        tried = {}
        for lr in lrs:  # every method gets the same grid, chosen on the validation texts
            print(f"{method} lr={lr:g} ...", flush=True)
            model, result = fine_tune(base, train, args, out, method, lr)
            tried[f"{lr:g}"] = v = perplexity(model, val)
            print(f"  {method} lr={lr:g}: validation perplexity {v:.3f} ({result['seconds']:.0f} s)", flush=True)
            if best is None or v < best[0]:
                best = (v, lr, model, result)
        assert best is not None
        v, lr, model, result = best
        result.update(lr=lr, val_perplexity=v, tried=tried, perplexity=perplexity(model, test))
        report["methods"][method] = result
        print(f"  {method}: lr {lr:g}, test perplexity {result['perplexity']:.3f}", flush=True)
    report["speed"] = speed(base, train, args)
    atomic_write_json(out / "hf_changelogs.json", report)
    atomic_write_text(out / "hf_changelogs.md", render(report))
    print(render(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
