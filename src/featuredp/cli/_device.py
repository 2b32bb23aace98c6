"""``--device``, shared by the commands that train or replay (``train``, ``demo``, ``compare``, ``benchmark``,
``check-model``)."""

from __future__ import annotations

import argparse


def add_device_argument(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """Add ``--device`` (default None: the CPU, where the model is built)."""
    parser.add_argument(
        "--device", default=None, metavar="DEVICE",
        help="where to train: cpu (default), cuda, cuda:N, mps or auto (a GPU if there is one); a device this "
        "machine does not have is an error before any work",
    )  # fmt: skip


def add_precision_argument(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """Add ``--precision fp32|bf16`` (default fp32)."""
    parser.add_argument(
        "--precision", choices=("fp32", "bf16"), default="fp32",
        help="fp32 (default) or bf16: forward and backward under bfloat16 autocast, with per-example norms, clip "
        "factors, clipped sums and noise in float32 or better (cpu and cuda)",
    )  # fmt: skip


def check_device(device: str | None, precision: str = "fp32") -> None:
    """Refuse a device that is not there, or a precision it cannot run (a one-line ValueError: exit 2),
    before any data is loaded."""
    if device is None and precision == "fp32":
        return
    from featuredp.batches import resolve_device  # imports torch: only when a command runs
    from featuredp.clipping.base import check_precision

    check_precision(precision, resolve_device(device))
