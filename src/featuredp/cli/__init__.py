"""The ``featuredp`` command line.

Each subcommand lives in its own module in this package and exposes
``register(subparsers) -> None``, which adds its parser and sets
``func=<callable(args) -> int>``. Modules are discovered, so adding a command
never edits this file. Keep heavy imports (torch, pandas) inside the command
functions so ``featuredp account`` starts fast.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys
import warnings
from collections.abc import Sequence

from featuredp import __version__
from featuredp.errors import FeatureDPError

# The order commands appear in ``featuredp --help``; unknown modules go last.
_ORDER = ("account", "calibrate", "train", "demo", "compare", "convex", "pate", "icl", "cloak", "audit", "data",
          "benchmark")  # fmt: skip


def _command_modules() -> list[str]:
    names = [m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_")]
    return sorted(names, key=lambda n: (_ORDER.index(n) if n in _ORDER else len(_ORDER), n))


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every discovered subcommand."""
    parser = argparse.ArgumentParser(
        prog="featuredp",
        description="Machine learning with feature differential privacy.",
    )
    parser.add_argument("--version", action="version", version=f"featuredp {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in _command_modules():
        module = importlib.import_module(f"{__name__}.{name}")
        module.register(sub)
    return parser


def _format_warning(message, category, filename, lineno, line=None):
    return f"featuredp: warning: {message}\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: parse, run, and turn expected errors into exit code 2 without a traceback."""
    parser = build_parser()
    args = parser.parse_args(argv)
    warnings.formatwarning = _format_warning
    if os.environ.get("RANK", "0") != "0":
        # Under torchrun every rank runs the command; rank 0 alone prints (the engine lets only it write
        # files and show progress), so the output is that of one process.
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (for the life of the process)
        warnings.simplefilter("ignore")
    try:
        return int(args.func(args) or 0)
    except (FeatureDPError, ValueError, TypeError, FileNotFoundError) as exc:
        if os.environ.get("FEATUREDP_DEBUG"):
            raise
        print(f"featuredp {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"featuredp {args.command}: interrupted{_resume_hint(args)}", file=sys.stderr)
        return 130


def _resume_hint(args: argparse.Namespace) -> str:
    """How to go on after Ctrl-C: the command's own ``resume_hint(args)`` (set with ``set_defaults``), if any."""
    hint = getattr(args, "resume_hint", None)
    return hint(args) if hint is not None else ""
