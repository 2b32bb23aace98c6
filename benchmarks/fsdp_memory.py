"""Peak memory per rank and samples/s of private training, data-parallel (DDP) against sharded (FSDP2), at 1, 2 and 4
ranks (issue 46). CPU, gloo, one host: each configuration is its own ``torchrun`` launch.

The model: featuredp's causal transformer (token embedding tied to the output head) read as a sequence classifier
(the logits of its last position's first two vocabulary entries), 23.1 M parameters by default. DP-SGD with ghost
clipping (its every-step checks on), σ = 1, C = 1, Adam, an expected batch of ``--batch`` sequences in all (split
over the ranks: the same training at every number of ranks),
``Trainer(..., sharding="fsdp")`` against the same Trainer unsharded. The sharded model is built on the meta device and
materialised shard by shard, as FSDP users build models larger than one device; the data-parallel one is built whole.

Peak memory: the largest resident set (``VmRSS``, sampled every 2 ms on a thread) during training, minus the process's
resident set before the model is built (the interpreter, torch and gloo): the model, the optimiser state, the
gradients, the activations, the clipping's buffers and the noise. Samples/s: the steps after the first (which plans and
validates), the expected batch over the wall time.

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/fsdp_memory.py --ranks 1,2,4 --out benchmarks/results/fsdp_memory
    # a GPU node (NCCL; peak memory: torch.cuda.max_memory_allocated of each rank's device):
    PYTHONPATH=src python benchmarks/fsdp_memory.py --device cuda --ranks 1,2,4,8 --layers 24 --d-model 1024 \
        --vocab 32768 --seq 128 --out benchmarks/results/fsdp_memory_cuda

writes ``fsdp_memory.json`` (every run), ``fsdp_memory.md`` (the table: medians over ``--repeats`` sweeps, the peak's
range) and ``fsdp_memory.png`` (peak memory against ranks).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

HERE = Path(__file__).resolve()


class Classifier(nn.Module):
    """The causal transformer's last-position logits of its first ``classes`` tokens: a sequence classifier."""

    def __init__(self, vocab: int, seq: int, d_model: int, layers: int, heads: int, classes: int = 2) -> None:
        super().__init__()
        from featuredp.models.transformer import CausalTransformer

        self.lm = CausalTransformer(vocab, max_len=seq, d_model=d_model, n_layers=layers, n_heads=heads)
        self.classes = classes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm(x)[:, -1, : self.classes]


def _rss() -> int:
    """This process's resident set now (bytes)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


class _Peak:
    """The largest resident set seen while running (sampled on a thread)."""

    def __init__(self) -> None:
        self.peak, self._stop = 0, threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _rss())
            time.sleep(0.002)

    def __enter__(self) -> _Peak:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss())


def worker(args: argparse.Namespace) -> None:
    """One rank: build, shard (or not), train, report to ``args.out``/rank{r}.json."""
    import torch.distributed as dist

    from featuredp.engine import Trainer
    from featuredp.sharding import shard_model

    torch.set_num_threads(1)
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    baseline = torch.cuda.memory_allocated() if cuda else _rss()
    torch.manual_seed(0)
    sizes = (args.vocab, args.seq, args.d_model, args.layers, args.heads)
    if args.mode == "fsdp":
        with torch.device("meta"):
            model = Classifier(*sizes)
        shard_model(model)
        model.to_empty(device=device)
        with torch.no_grad():
            for m in model.modules():
                if isinstance(m, nn.LayerNorm):
                    m.reset_parameters()
            model.lm._init_weights()
    else:
        model = Classifier(*sizes).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    g = torch.Generator().manual_seed(1)
    n = 64 * args.batch
    data = {"x": torch.randint(0, args.vocab, (n, args.seq), generator=g), "y": torch.randint(0, 2, (n,), generator=g)}
    trainer = Trainer(model, "dpsgd", steps=args.steps, batch_size=args.batch, noise_multiplier=1.0,
                      max_grad_norm=1.0, delta=1e-5, strategy="ghost", optimizer="adam", lr=1e-4,
                      sharding=args.mode if args.mode == "fsdp" else "none", device=str(device),
                      progress=False)  # fmt: skip
    with _Peak() as peak:
        trainer.fit(data, max_steps=1)  # plans, validates, first checks
        dist.barrier()
        start = time.perf_counter()
        trainer.fit(data, max_steps=args.steps - 1)
        dist.barrier()
        elapsed = time.perf_counter() - start
    peak_bytes = torch.cuda.max_memory_allocated() - baseline if cuda else peak.peak - baseline
    report = {"rank": rank, "device": str(device), "world": world, "mode": args.mode, "params": int(n_params),
              "local_params": int(sum(getattr(p, "to_local", lambda p=p: p)().numel() for p in model.parameters())),
              "peak_bytes": peak_bytes, "baseline_bytes": baseline,
              "samples_per_s": (args.steps - 1) * args.batch / elapsed}  # fmt: skip
    (Path(args.out) / f"{args.mode}{world}_rank{rank}.json").write_text(json.dumps(report))
    dist.destroy_process_group()


def launch(args: argparse.Namespace, mode: str, ranks: int) -> list[dict[str, Any]]:
    """Run one configuration under torchrun; its ranks' reports."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}", str(HERE),
           "--worker", "--mode", mode, "--out", args.out, "--steps", str(args.steps), "--batch", str(args.batch),
           "--seq", str(args.seq), "--d-model", str(args.d_model), "--layers", str(args.layers), "--heads",
           str(args.heads), "--vocab", str(args.vocab), "--device", args.device]  # fmt: skip
    # A fixed mmap threshold: glibc otherwise raises it after each large free, keeps later large blocks in its heap,
    # and the resident set stops following what is alive.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path),
           "MALLOC_MMAP_THRESHOLD_": "131072"}  # fmt: skip
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"{mode} on {ranks} ranks failed:\n{done.stderr[-4000:]}")
    return [json.loads((Path(args.out) / f"{mode}{ranks}_rank{r}.json").read_text()) for r in range(ranks)]


def summarize(runs: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per configuration from several sweeps: the median peak and samples/s, and the peak's range (the
    resident set of one run moves by a few hundred MiB with the allocator's timing)."""
    rows = []
    for first in runs[0]:
        same = [r for run in runs for r in run if r["mode"] == first["mode"] and r["world"] == first["world"]]
        peaks = sorted(r["peak_mib"] for r in same)
        rows.append({**first, "peak_mib": statistics.median(peaks), "peak_min": peaks[0], "peak_max": peaks[-1],
                     "samples_per_s": statistics.median(r["samples_per_s"] for r in same), "runs": len(same)})
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """The markdown table of the configurations (medians; the peak's range over the runs)."""
    out = ["| ranks | mode | parameters on a rank | peak memory per rank, MiB (max over ranks; median, range) | "
           "samples/s (median) |", "|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        spread = f" ({r['peak_min']:.0f}–{r['peak_max']:.0f})" if r.get("runs", 1) > 1 else ""
        out.append(f"| {r['world']} | {r['mode']} | {r['local_params'] / 1e6:.1f} M of {r['params'] / 1e6:.1f} M | "
                   f"{r['peak_mib']:.0f}{spread} | {r['samples_per_s']:.1f} |")  # fmt: skip
    return "\n".join(out)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Peak memory per rank against ranks, one line per mode (the median, bars over the runs' range)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.0, 3.8))
    for mode in ("ddp", "fsdp"):
        mine = [r for r in rows if r["mode"] == mode]
        if mine:
            x = [r["world"] for r in mine]
            y = [r["peak_mib"] for r in mine]
            err = [[r["peak_mib"] - r.get("peak_min", r["peak_mib"]) for r in mine],
                   [r.get("peak_max", r["peak_mib"]) - r["peak_mib"] for r in mine]]  # fmt: skip
            ax.errorbar(x, y, yerr=err, marker="o", capsize=3,
                        label="FSDP2 (sharded)" if mode == "fsdp" else "DDP (whole model)")  # fmt: skip
    ax.set_xlabel("ranks")
    ax.set_ylabel("peak memory per rank (MiB)")
    device = str(rows[0].get("device", "cpu")).split(":")[0].upper()
    ax.set_title(f"DP-SGD, ghost clipping, {rows[0]['params'] / 1e6:.1f} M-parameter transformer ({device}),\n"
                 f"expected batch {rows[0].get('batch', '?')} split over the ranks", fontsize=10)  # fmt: skip
    ax.set_xticks(sorted({r["world"] for r in rows}))
    ax.set_ylim(bottom=0)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--mode", choices=("ddp", "fsdp"), default="fsdp")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cuda: NCCL, one GPU per rank")
    p.add_argument("--ranks", default="1,2,4", help="comma-separated numbers of ranks")
    p.add_argument("--repeats", type=int, default=2, help="sweeps (medians and ranges over them)")
    p.add_argument("--out", default="benchmarks/results/fsdp_memory")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--batch", type=int, default=32, help="expected batch, in all")
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--d-model", type=int, default=512)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--vocab", type=int, default=8192)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    Path(args.out).mkdir(parents=True, exist_ok=True)
    runs = []
    for sweep in range(args.repeats):
        rows = []
        for ranks in [int(k) for k in args.ranks.split(",")]:
            for mode in ("ddp", "fsdp"):
                reports = launch(args, mode, ranks)
                worst = max(reports, key=lambda r: r["peak_bytes"])
                rows.append({**worst, "peak_mib": worst["peak_bytes"] / 2**20, "batch": args.batch,
                             "samples_per_s": reports[0]["samples_per_s"]})  # fmt: skip
                print(f"sweep {sweep + 1}: {mode} × {ranks}: peak {rows[-1]['peak_mib']:.0f} MiB/rank, "
                      f"{rows[-1]['samples_per_s']:.1f} samples/s", flush=True)  # fmt: skip
        runs.append(rows)
    summary = summarize(runs)
    out = Path(args.out)
    (out / "fsdp_memory.json").write_text(json.dumps({"summary": summary, "runs": runs}, indent=1))
    (out / "fsdp_memory.md").write_text(table(summary) + "\n")
    plot(summary, out / "fsdp_memory.png")
    print(table(summary))


if __name__ == "__main__":
    main()
