"""``featuredp benchmark``: samples/s of full training steps, interleaved in rounds, and ratios to non-private."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import TYPE_CHECKING, Any

from featuredp.cli._device import add_device_argument, add_precision_argument, check_device
from featuredp.cli._flags import NOISES, default_noise, noise_kind, takes_bands, whole_number
from featuredp.methods import METHOD_NAMES, PRIVATE_METHODS

if TYPE_CHECKING:
    from featuredp.experiments.throughput import BenchmarkResult

#: what is timed by default: the non-private reference, DP-SGD and FDP (any registered method can be asked for)
DEFAULT_METHODS = ("nonprivate", "dpsgd", "fdp")
#: BandMF's bands when --bands is left out: :data:`featuredp.experiments.throughput.BENCHMARK_BANDS` (torch-free copy)
BENCHMARK_BANDS = 8


def _methods(text: str) -> list[str]:
    items = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in items if m not in METHOD_NAMES]
    if not items or bad:
        raise argparse.ArgumentTypeError(f"methods must be a subset of {','.join(METHOD_NAMES)}, got {text!r}")
    return list(dict.fromkeys(items))


def _noises(text: str) -> list[str]:
    # Checked in run (one line naming --noise, exit 2), not by argparse's usage message.
    return [n.strip() for n in text.split(",") if n.strip()]


def register(subparsers: Any) -> None:
    """Add the ``benchmark`` subcommand."""
    p = subparsers.add_parser(
        "benchmark",
        help="throughput of training steps (samples/s, ratio to non-private); default nonprivate, DP-SGD, FDP",
        description="Times the engine's full training step of each method, interleaved in rounds, on synthetic "
        "Purchase100-shaped data (600 binary inputs, 100 public; MLP 600-300-100; 100 classes). Ratios to "
        "non-private are computed within each round; medians over rounds are reported.",
    )
    p.add_argument("--model", choices=("mlp",), default="mlp", help="model (the paper's Purchase100 MLP)")
    p.add_argument("--batch-size", type=whole_number, default=1024,
                   help="expected private batch size m (default 1024); refused, with the estimate, when the data and "
                   "the step would not fit in the available memory")
    p.add_argument("--methods", type=_methods, default=list(DEFAULT_METHODS),
                   help=f"comma-separated subset of {','.join(METHOD_NAMES)} (default {','.join(DEFAULT_METHODS)}; "
                   "nonprivate is always timed as reference)")
    p.add_argument("--strategy", choices=("ghost", "vmap", "auto"), default="ghost",
                   help="per-example gradient strategy of the private methods (default ghost; auto: the faster of "
                   "the two on a stand-in batch of zeros, chosen once)")
    p.add_argument("--loss-split", choices=("zero", "padding"), default="zero",
                   help="FDP's loss split: zero masking of the private columns (featuredp's Purchase preset; "
                   "default) or the paper's N(0,1) padding")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    p.add_argument("--rounds", type=int, default=7, help="interleaved rounds (default 7)")
    p.add_argument("--min-time", type=float, default=0.5, help="seconds per method per round (default 0.5)")
    p.add_argument("--dataset-size", type=whole_number, default=None,
                   help="records of synthetic data (default 16 x batch size, sampling rate 1/16 as in the paper)")
    p.add_argument("--noise", type=_noises, default=["independent"], metavar="NOISES",
                   help="noises of the private methods, each timed as its own arm in the same interleaved rounds: "
                   "independent (default), bandmf (BandMF correlated noise, arm <method>_bandmf) and/or blt (BLT "
                   "correlated noise, its buffers optimised for 4 epochs, arm <method>_blt); with independent, each "
                   "correlated noise's cost per step is reported as a ratio to independent noise (medians of "
                   "within-round ratios)")
    p.add_argument("--bands", type=whole_number, default=None, metavar="B",
                   help="--noise with bandmf: BandMF's bands b (default 8; at most --dataset-size / --batch-size; "
                   "BLT has no bands)")
    p.add_argument("--secure-rng", action="store_true",
                   help="also time each private method with the secure noise mode (ChaCha20 CSPRNG, float64 noise) "
                   "and report its cost relative to the normal mode")
    p.add_argument("--ablate", action="store_true",
                   help="also time each private method with ghost's per-step safety checks off and with the old "
                   "float32 noise (bounded support), and report what the checks and the float64 noise cost; the "
                   "ablated steps are for timing only")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the synthetic data, model initialisation and public batches (the private "
                   "randomness is always fresh OS entropy)")
    add_device_argument(p)
    add_precision_argument(p)
    p.add_argument("--nproc", type=whole_number, default=None, metavar="N",
                   help="strong scaling: run the benchmark data-parallel with 1, 2, 4, ... and N processes on this "
                   "host (torch.distributed, gloo on 127.0.0.1; the same global batch split over the processes) and "
                   "report samples/s and the scaling efficiency of each method. Under your own torchrun, leave it out")
    p.add_argument("--timeout", type=float, default=1800.0,
                   help="with --nproc: seconds each launch may take before it is stopped (default 1800)")
    p.add_argument("--json", action="store_true", help="print one JSON object (samples/s and ratios)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the benchmark and print a table or JSON."""
    from featuredp._validate import check_int, check_positive

    check_device(args.device, args.precision)  # an absent device: exit 2 with one line, before any work
    batch = check_int("--batch-size", args.batch_size, minimum=1)
    threads = check_int("--threads", args.threads, minimum=1)
    rounds = check_int("--rounds", args.rounds, minimum=1)
    min_time = check_positive("--min-time", args.min_time)
    n = _dataset_size(args, batch)
    check_memory(batch, n, args.strategy, dataset_size_given=args.dataset_size is not None)
    noises = _check_noise(args, batch, n)
    if args.nproc is not None:
        return _scaling(args, check_int("--nproc", args.nproc, minimum=1), check_positive("--timeout", args.timeout))

    from featuredp.experiments import throughput

    throughput.set_threads(threads)
    data, public = throughput.synthetic_purchase(n, seed=args.seed)
    methods = ["nonprivate"] + [m for m in args.methods if m != "nonprivate"]
    private = [m for m in methods[1:] if m in PRIVATE_METHODS]
    plain = default_noise()
    variants: list[tuple[str, bool, str | None, str]] = [
        (m, False, None, plain) for m in methods if plain in noises or m not in PRIVATE_METHODS]
    correlated = [noise for noise in noises if noise != plain]
    variants += [(m, False, None, noise) for noise in correlated for m in private]
    if args.secure_rng:
        variants += [(m, True, None, plain) for m in methods[1:]]
    if args.ablate:
        variants += [(m, False, what, plain) for m in methods[1:] for what in throughput.ABLATIONS]
    runners = [
        throughput.engine_runner(
            m, data, public, batch_size=batch, strategy=args.strategy, seed=args.seed,
            name=_arm_name(m, secure, what, noise), loss_split=args.loss_split, secure_rng=secure, device=args.device,
            ablate=what, noise=noise, bands=args.bands if takes_bands(noise) else None,
        )
        for m, secure, what, noise in variants
    ]  # fmt: skip
    res = throughput.interleaved(runners, rounds=rounds, min_time=min_time, progress=not args.json)
    names = [r.name for r in runners]
    out = _medians_and_ratios(args, res, names, methods)
    # Each correlated noise's time per step / independent noise's, within each round.
    ratios = [(noise, m) for noise in correlated for m in private] if plain in noises else []
    for noise, m in ratios:
        out[f"{noise}_cost_ratio_{m}"] = res.median_ratio_to(m, _arm_name(m, False, None, noise))
    bands = args.bands if args.bands is not None else BENCHMARK_BANDS
    # BLT's d is the strategy's choice (the same for every method: it depends on n, m, T and the momentum only).
    buffers = next((r.info["buffers"] for r in runners if r.info.get("buffers") is not None), None)
    out.update({
        "batch_size": batch, "threads": threads, "rounds": rounds, "strategy": args.strategy, "model": args.model,
        "loss_split": args.loss_split, "dataset_size": n, "spread_nonprivate": res.spread("nonprivate"),
        "secure_rng": args.secure_rng, "ablate": args.ablate, "device": args.device or "cpu",
        "noise": noises, "bands": bands if any(takes_bands(n) for n in noises) else None, "buffers": buffers,
        "precision": args.precision,
        "world_size": int(os.environ.get("WORLD_SIZE", "1")),
    })
    if args.json:
        json.dump(out, sys.stdout)
        print()
        return 0
    print(f"MLP 600-300-100, batch {batch}, {threads} thread(s), strategy {args.strategy}, "
          f"FDP split {args.loss_split}, {rounds} rounds (medians; ratios within rounds)")
    print(f"{'method':<20}{'samples/s':>12}{'ratio':>8}{'spread':>9}")
    for name in names:
        ratio = 1.0 if name == "nonprivate" else res.median_ratio(name)
        print(f"{name:<20}{res.median(name):>12,.0f}{ratio:>8.3f}{res.spread(name):>8.0%}")
    for m in methods[1:] if args.secure_rng else []:
        print(f"secure mode costs {m}: {out[f'secure_vs_normal_{m}']:.3f} x the normal mode's samples/s")
    for m in methods[1:] if args.ablate else []:
        print(f"{m}: the per-step safety checks cost {out[f'checks_cost_{m}']:.1%} of a step, the float64 noise "
              f"{out[f'float64_noise_cost_{m}']:.1%} (medians of within-round ratios)")
    for noise, m in ratios:
        kind = noise_kind(noise)
        what = f"{kind.label} (b = {bands})" if takes_bands(noise) else f"{kind.label} (d = {buffers})"
        print(f"{what} costs {m} {out[f'{noise}_cost_ratio_{m}']:.3f} x independent noise's time per step (median "
              "of within-round ratios)")
    print("spread = (max - min) / median of samples/s over rounds (machine noise)")
    return 0


def _dataset_size(args: argparse.Namespace, batch: int) -> int:
    from featuredp._validate import check_int

    if args.dataset_size is None:
        return 16 * batch
    n = check_int("--dataset-size", args.dataset_size, minimum=1)
    if n < batch:
        raise ValueError(f"--dataset-size must be >= --batch-size={batch}, got {n}")
    return n


def _medians_and_ratios(
    args: argparse.Namespace, res: BenchmarkResult, names: list[str], methods: list[str]
) -> dict[str, Any]:
    out: dict[str, Any] = {name: res.median(name) for name in names}
    for name in names[1:]:
        out[f"ratio_{name}"] = res.median_ratio(name)
    if args.secure_rng:
        for m in methods[1:]:
            out[f"secure_vs_normal_{m}"] = res.median_ratio_to(f"{m}_secure", m)
    if args.ablate:  # what each safety measure costs: 1 - (samples/s with it) / (samples/s without it)
        for m in methods[1:]:
            out[f"checks_cost_{m}"] = 1.0 - res.median_ratio_to(m, _arm_name(m, False, "checks"))
            out[f"float64_noise_cost_{m}"] = 1.0 - res.median_ratio_to(m, _arm_name(m, False, "noise"))
    return out


def _check_noise(args: argparse.Namespace, batch: int, n: int) -> list[str]:
    """``--noise`` and ``--bands`` checked against the other flags (one line naming the flag); returns the noises."""
    given = list(args.noise)
    if not given or any(n not in NOISES for n in given):
        raise ValueError(f"--noise must be a comma-separated subset of {','.join(NOISES)}, got {','.join(given)!r}")
    noises = [n for n in NOISES if n in given]
    banded = any(takes_bands(n) for n in noises)
    if not banded and args.bands is not None:
        raise ValueError(f"--bands is for --noise with bandmf, got --bands {args.bands} with --noise "
                         f"{','.join(noises)}")  # fmt: skip
    correlated = [n for n in noises if noise_kind(n).correlated]
    if not correlated:
        return noises
    kind = correlated[0]  # the message names one kind the user gave; every correlated kind is refused alike
    if not any(m in PRIVATE_METHODS for m in args.methods):
        raise ValueError(f"--noise {kind} is for the private methods, got --methods {','.join(args.methods)}")
    if args.nproc is not None or int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ValueError(f"--noise {kind} is timed in one process (the scaling study times independent noise): "
                         "leave out --nproc and torchrun")  # fmt: skip
    if default_noise() not in noises and (args.secure_rng or args.ablate):
        flag = "--secure-rng" if args.secure_rng else "--ablate"
        raise ValueError(f"{flag} times independent noise's variants: give --noise independent,{','.join(correlated)}")
    if not banded:
        return noises
    if args.bands is not None and args.bands < 1:
        raise ValueError(f"--bands must be >= 1, got {args.bands}")
    bands = args.bands if args.bands is not None else BENCHMARK_BANDS
    if bands * batch > n:
        which = f"--bands {bands}" if args.bands is not None else f"the default --bands {bands}"
        raise ValueError(f"{which} is too many for --batch-size {batch} and {n} records (each of the b partitions "
                         f"must supply a batch): use --bands <= {n // batch}")  # fmt: skip
    return noises


def _arm_name(method: str, secure: bool, ablate: str | None, noise: str | None = None) -> str:
    """The timed arm's name: ``fdp``, ``fdp_secure``, ``fdp_nochecks``, ``fdp_f32noise``, ``fdp_bandmf``,
    ``fdp_blt`` (``noise`` None: the default noise)."""
    if noise is not None and noise != default_noise():
        return f"{method}_{noise}"
    if ablate is not None:
        return f"{method}_{'nochecks' if ablate == 'checks' else 'f32noise'}"
    return f"{method}_secure" if secure else method


def process_counts(nproc: int) -> list[int]:
    """1, 2, 4, ... below ``nproc``, and ``nproc``.

    >>> process_counts(6), process_counts(1)
    ([1, 2, 4, 6], [1])
    """
    counts = [1 << i for i in range(nproc.bit_length()) if 1 << i < nproc]
    return [*counts, nproc]


def _child_args(args: argparse.Namespace) -> list[str]:
    out = ["--model", args.model, "--batch-size", str(args.batch_size), "--methods", ",".join(args.methods),
           "--strategy", args.strategy, "--loss-split", args.loss_split, "--threads", str(args.threads),
           "--rounds", str(args.rounds), "--min-time", str(args.min_time), "--seed", str(args.seed),
           "--precision", args.precision]  # fmt: skip
    if args.dataset_size is not None:
        out += ["--dataset-size", str(args.dataset_size)]
    if args.device is not None:
        out += ["--device", args.device]
    if args.secure_rng:
        out.append("--secure-rng")
    return out


def _scaling(args: argparse.Namespace, nproc: int, timeout: float) -> int:
    """Launch the benchmark with 1, 2, 4, ..., N processes and print samples/s and efficiency per method."""
    from featuredp.experiments import throughput

    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ValueError("--nproc launches its own processes; under torchrun, run `featuredp benchmark` without it")
    cores = os.cpu_count() or 1
    if nproc * args.threads > cores:
        print(f"featuredp benchmark: note: {nproc} processes x {args.threads} thread(s) exceed the {cores} cores "
              "of this machine: the largest counts will share cores", file=sys.stderr)  # fmt: skip
    results = throughput.scaling(_child_args(args), process_counts(nproc), timeout=timeout, progress=not args.json)
    names = [k for k in results[0] if k in ("nonprivate", *args.methods) or k.endswith("_secure")]
    names = list(dict.fromkeys(names))
    eff = throughput.efficiency(results, names)
    if args.json:
        json.dump({"scaling": results, "efficiency": {n: {str(k): v for k, v in e.items()} for n, e in eff.items()},
                   "nproc": nproc, "device": args.device or "cpu", "threads": args.threads}, sys.stdout)  # fmt: skip
        print()
        return 0
    print(f"strong scaling, global batch {args.batch_size}, {args.threads} thread(s) per process, "
          f"device {args.device or 'cpu'} (medians over {args.rounds} rounds)")
    print(f"{'processes':>9}  {'method':<16}{'samples/s':>12}{'ratio':>8}{'efficiency':>12}")
    for r in results:
        for name in names:
            ratio = 1.0 if name == "nonprivate" else r.get(f"ratio_{name}", float("nan"))
            print(f"{r['nproc']:>9}  {name:<16}{r[name]:>12,.0f}{ratio:>8.3f}{eff[name][r['nproc']]:>12.2f}")
    print("efficiency = samples/s with k processes / (k x samples/s with one process)")
    return 0


# The synthetic Purchase100 shape (experiments/throughput.py): 600 inputs, an MLP 600-300-100.
_D, _HIDDEN, _CLASSES = 600, 300, 100
_PARAMS = _D * _HIDDEN + _HIDDEN + _HIDDEN * _CLASSES + _CLASSES


def memory_estimate(batch: int, n: int, strategy: str) -> int:
    """Bytes the benchmark needs at its peak: making the data, holding it, and one training step.

    Making n × 600 binary features draws float64 uniforms and gathers float64 rates (8 + 8 bytes
    per entry) next to the float32 result (4) and a bool mask (1); a step gathers the batch (at
    most m + 6√m rows) with its public view and padding draws, and keeps activations and their
    gradients; ``vmap`` adds per-example gradients of 256 examples at a time; plus ~0.5 GB for torch.
    Conservative: at batch 8192 the estimate is 2.5 GB and the measured peak 1.7 GB.

    >>> round(memory_estimate(1024, 16 * 1024, "ghost") / 1e9, 2)
    0.78
    """
    rows = batch + 6 * math.isqrt(batch) + 1
    make_data = n * _D * (8 + 8 + 4 + 1)
    step = rows * (_D * 4 * 4 + (_D + _HIDDEN + _CLASSES) * 4 * 8)
    per_example = 256 * _PARAMS * 4 * 2 if strategy == "vmap" else 0
    return make_data + step + per_example + 500 * 2**20


def available_memory() -> int | None:
    """Bytes of memory available to a new allocation (MemAvailable, else physical memory), None if unknown."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def check_memory(batch: int, n: int, strategy: str, *, dataset_size_given: bool) -> None:
    """Refuse, with the estimate, a benchmark that would not fit in memory (before any data is made)."""
    need, have = memory_estimate(batch, n, strategy), available_memory()
    if have is None or need <= 0.8 * have:
        return
    size = "" if dataset_size_given else f" (data: 16 x --batch-size = {n:,} records of 600 features)"
    raise ValueError(f"--batch-size {batch:,} needs about {_bytes(need)} of memory{size}, but about {_bytes(have)} "
                     "is available; use a smaller --batch-size" + ("" if dataset_size_given else " or --dataset-size"))


def _bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.3g} {unit}"
        n /= 1024
    return f"{n:.3g} TB"  # pragma: no cover
