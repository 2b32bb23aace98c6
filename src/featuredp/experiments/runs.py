"""Run directories: save, load and resume training runs.

A run directory holds

* ``run.json`` — what was run: method, trainer config, privacy plan, ε spent,
  guarantee, model spec, dataset name + loader options + private columns,
  seed, metrics. Public information only (no data, no RNG state).
* ``model.pt`` — the released model's ``state_dict`` (tensors only).
* ``checkpoint.pt`` — everything needed to resume: model, optimizer state, all
  RNG states, step counter, accountant phases. **Keep it private**: RNG states
  reveal which records were sampled.
* ``audit/`` — the reports of ``featuredp audit`` on this run (optional).

Files are written atomically and read with ``torch.load(weights_only=True)``
(no arbitrary pickle).
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from featuredp._io import atomic_path, atomic_save_torch, atomic_write_json, load_torch_safely
from featuredp.data import load_dataset
from featuredp.models import build_model
from featuredp.plan import PrivacyPlan

__all__ = ["RUN_FILES", "Run", "load_checkpoint", "load_run", "replacing_run", "run_files", "save_checkpoint",
           "save_run"]

RUN_JSON = "run.json"
MODEL_FILE = "model.pt"
CHECKPOINT_FILE = "checkpoint.pt"
AUDIT_DIR = "audit"
#: what a run directory holds: written by training (run.json, model.pt, checkpoint.pt) and by ``featuredp audit``
RUN_FILES = (RUN_JSON, MODEL_FILE, CHECKPOINT_FILE, AUDIT_DIR)
FORMAT = 1


def save_checkpoint(path: str | Path, state: dict[str, Any]) -> None:
    """Write a checkpoint dict (tensors and plain containers) atomically."""
    atomic_save_torch(path, state)


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Read a checkpoint with the safe loader (``weights_only=True``); a broken file names itself."""
    return load_torch_safely(path, what="checkpoint")


@dataclass
class Run:
    """A loaded run: the rebuilt model and what run.json says."""

    path: Path
    model: nn.Module
    info: dict[str, Any]
    plan: PrivacyPlan | None = None
    metrics: dict[str, Any] = field(default_factory=dict)

    @property
    def dataset(self) -> dict[str, Any]:
        """Dataset name, loader options and private columns (how to reload the data)."""
        return dict(self.info.get("dataset") or {})

    @property
    def private_columns(self) -> list[str]:
        """The raw columns that were private in this run."""
        return list(self.dataset.get("private_columns") or [])

    @property
    def epsilon(self) -> float:
        """ε spent (∞ for non-private runs)."""
        e = self.info.get("result", {}).get("epsilon")
        return float("inf") if e in (None, "inf") else float(e)

    def load_data(self) -> tuple[Any, Any]:
        """Reload (train, test) with the loader and options recorded in run.json."""
        ds = self.dataset
        if not ds.get("name"):
            raise ValueError(f"run {self.path} records no dataset name; load the data yourself")
        return load_dataset(ds["name"], **(ds.get("options") or {}))


def save_run(
    out_dir: str | Path,
    trainer: Any,
    result: Any,
    *,
    model_spec: dict[str, Any],
    dataset: dict[str, Any] | None = None,
    metrics: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write ``run.json`` and ``model.pt`` for a finished ``Trainer.fit`` into ``out_dir``.

    ``dataset``: ``{"name": ..., "options": {...}, "private_columns": [...], "split_seed": ...}``.
    The checkpoint is written by ``Trainer.fit(checkpoint=out_dir / "checkpoint.pt")``.
    In a data-parallel run only rank 0 writes (every rank holds the same model).
    """
    out = Path(out_dir)
    if getattr(trainer, "dist", None) is not None and not trainer.dist.is_main:
        return out
    out.mkdir(parents=True, exist_ok=True)
    info = {
        "format": FORMAT,
        "method": result.method,
        "config": trainer.config(),
        "plan": result.plan.to_dict(),
        "result": {k: v for k, v in result.to_dict().items() if k != "plan"},
        "model_spec": model_spec,
        "dataset": dataset or {},
        "metrics": metrics or {},
        **(extra or {}),
    }
    with atomic_path(out / MODEL_FILE) as tmp:
        torch.save({k: v.detach().cpu() for k, v in trainer.model.state_dict().items()}, tmp)
    atomic_write_json(out / RUN_JSON, info)
    return out


def load_run(path: str | Path) -> Run:
    """Load a run directory: rebuild the model from its spec and load ``model.pt`` safely.

    A missing file is ``FileNotFoundError``; a broken ``run.json`` (not JSON, no model spec) or a
    truncated, foreign or unsafe ``model.pt`` is a ``ValueError`` whose message names the file.
    """
    p = Path(path)
    if p.is_file():
        p = p.parent
    rj = p / RUN_JSON
    if not rj.exists():
        raise FileNotFoundError(f"not a run directory (no {RUN_JSON}): {p}")
    try:
        info = json.loads(rj.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{rj} is not valid JSON ({exc}); it was not written by featuredp or was edited") from None
    if not isinstance(info, dict) or not isinstance(info.get("model_spec"), dict):
        raise ValueError(f"{rj} holds no model spec ('model_spec'); it is not a featuredp run.json")
    try:
        model = build_model(info["model_spec"])
        plan = PrivacyPlan.from_dict(info["plan"]) if info.get("plan") else None
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{rj} describes no model or plan featuredp can rebuild ({type(exc).__name__}: {exc})"
                         ) from None
    state = _load_torch_file(p / MODEL_FILE, "model")
    try:
        model.load_state_dict(state)
    except (RuntimeError, TypeError, AttributeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"model {p / MODEL_FILE} does not fit the model spec in {rj} ({first})") from None
    model.eval()
    return Run(path=p, model=model, info=info, plan=plan, metrics=dict(info.get("metrics") or {}))


def _load_torch_file(path: Path, what: str) -> Any:
    """:func:`~featuredp._io.load_torch_safely` with every unreadable case as one ValueError naming the file."""
    try:
        return load_torch_safely(path, what=what)
    except pickle.UnpicklingError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"{what} {path} is refused by the safe loader ({first})") from None
    except (KeyError, AttributeError, ImportError, IndexError) as exc:  # a foreign pickle
        raise ValueError(f"{what} {path} is not a featuredp file ({type(exc).__name__}: {exc})") from None


def run_files(path: str | Path) -> list[str]:
    """The names of :data:`RUN_FILES` that exist in ``path`` (empty for a missing or fresh folder)."""
    p = Path(path)
    return [name for name in RUN_FILES if (p / name).exists()] if p.is_dir() else []


@contextlib.contextmanager
def replacing_run(path: str | Path) -> Iterator[list[str]]:
    """Replace the run in ``path``: its files are set aside while the block writes a new run there.

    When the block succeeds the old run's files (:data:`RUN_FILES`: run.json, model.pt,
    checkpoint.pt and the audit reports) are deleted, so nothing of the old run stays next to the
    new one; when it fails (an error, Ctrl-C) they are put back, replacing whatever the block
    wrote, so nothing is lost. Yields the names set aside.
    """
    p = Path(path)
    names = run_files(p)
    if not names:
        yield []
        return
    aside = Path(tempfile.mkdtemp(prefix=".replaced-run.", dir=p))
    moved: list[str] = []
    try:
        for name in names:
            os.replace(p / name, aside / name)
            moved.append(name)
        yield names
    except BaseException:
        for name in moved:
            target = p / name
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            elif target.exists() or target.is_symlink():
                target.unlink()
            os.replace(aside / name, target)
        shutil.rmtree(aside, ignore_errors=True)
        raise
    shutil.rmtree(aside, ignore_errors=True)
