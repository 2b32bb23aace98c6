"""Run directories: save, load and resume training runs.

A run directory holds

* ``run.json`` — what was run: method, trainer config, privacy plan, ε spent,
  guarantee, model spec, dataset name + loader options + private columns,
  seed, metrics. Public information only (no data, no RNG state).
* ``model.pt`` — the released model's ``state_dict`` (tensors only).
* ``audit/`` — the reports of ``featuredp audit`` on this run (optional).

The resume checkpoint (model, optimizer state, every RNG state and key, step counter,
accountant phases) is **not** in the run directory: whoever holds the noise and sampler
states can replay the noise and subtract it. :func:`private_checkpoint` names its place, a
folder of its own under :func:`private_root` (``$FEATUREDP_PRIVATE_DIR``, default
``$XDG_STATE_HOME/featuredp/private`` or ``~/.local/state/featuredp/private``; folders 0700,
file 0600), keyed by a digest of the run directory's absolute path, so ``--resume`` finds it
from ``--out`` alone (a moved or renamed run directory can no longer be resumed).
``featuredp train`` deletes it when the run finishes unless ``--keep-checkpoint``. The same folder keeps,
after the run, the SHA-256 of the bytes of each data file the run read (:func:`record_data_fingerprint`,
``data_fingerprint.json``): ``featuredp audit`` refuses data that changed since (:func:`check_data_fingerprint`).
Like every fingerprint of private data it stays out of run.json, where anyone could test a guessed
dataset against it. A
``checkpoint.pt`` that an older featuredp left in the run directory is still listed in
:data:`RUN_FILES` (so ``--overwrite`` removes it) and is moved to the private place before a resume.

Files are written atomically and read with ``torch.load(weights_only=True)``
(no arbitrary pickle).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pickle
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from featuredp._io import (
    atomic_path,
    atomic_save_torch,
    atomic_write_json,
    atomic_write_text,
    load_torch_safely,
    private_dir,
)
from featuredp.data import load_dataset
from featuredp.errors import PrivacyRiskWarning
from featuredp.models import build_model
from featuredp.plan import PrivacyPlan
from featuredp.run import SPENT_SUFFIX
from featuredp.sharding import whole_state_dict

__all__ = ["PRIVATE_DIR_ENV", "RUN_FILES", "Run", "check_data_fingerprint", "check_legacy_checkpoint",
           "close_private_checkpoint", "data_files_fingerprint", "load_checkpoint", "load_run",
           "open_private_checkpoint", "private_checkpoint", "private_root", "record_data_fingerprint", "replacing_run",
           "run_files", "save_checkpoint", "save_run"]

RUN_JSON = "run.json"
MODEL_FILE = "model.pt"
CHECKPOINT_FILE = "checkpoint.pt"
#: the spent-steps record a Trainer keeps beside its checkpoint (featuredp.run): it goes where the checkpoint goes
SPENT_FILE = CHECKPOINT_FILE + SPENT_SUFFIX
AUDIT_DIR = "audit"
#: what a run directory holds: written by training (run.json, model.pt) and by ``featuredp audit``; checkpoint.pt
#: (and its spent-steps record) only when an older featuredp, or a Trainer given that path, wrote it there (listed
#: so that ``--overwrite`` and :func:`replacing_run` remove it)
RUN_FILES = (RUN_JSON, MODEL_FILE, CHECKPOINT_FILE, SPENT_FILE, AUDIT_DIR)
FORMAT = 1
#: the environment variable naming the folder that holds the private checkpoints
PRIVATE_DIR_ENV = "FEATUREDP_PRIVATE_DIR"
#: the file in a private checkpoint's folder that names the run directory it belongs to (a path, nothing secret)
_OWNER_FILE = "run_dir.txt"
#: the file in a private checkpoint's folder holding the SHA-256 of the run's data files (kept after the run)
DATA_FINGERPRINT_FILE = "data_fingerprint.json"
#: loader options that name a file the data is read from: their bytes are fingerprinted
_DATA_FILE_OPTIONS = ("path", "schema", "test")


def save_checkpoint(path: str | Path, state: dict[str, Any]) -> None:
    """Write a checkpoint dict (tensors and plain containers) atomically, readable by its owner only (0600)."""
    atomic_save_torch(path, state, private=True)


def private_root() -> Path:
    """The folder of private checkpoints: ``$FEATUREDP_PRIVATE_DIR``, else ``$XDG_STATE_HOME/featuredp/private``
    (``~/.local/state/featuredp/private``). Not created here."""
    given = os.environ.get(PRIVATE_DIR_ENV)
    if given:
        return Path(given).expanduser()
    state = os.environ.get("XDG_STATE_HOME")
    base = Path(state).expanduser() if state else Path.home() / ".local" / "state"
    return base / "featuredp" / "private"


def _private_run_dir(out_dir: str | Path) -> Path:
    # Keyed by the run directory's absolute, resolved path: --resume finds it from --out alone, from any working
    # directory, and two run directories never share one.
    where = str(Path(out_dir).expanduser().resolve())
    return private_root() / hashlib.sha256(where.encode("utf-8")).hexdigest()[:32]


def private_checkpoint(out_dir: str | Path) -> Path:
    """Where the resume checkpoint of the run directory ``out_dir`` lives (outside it; the file may not exist).

    >>> private_checkpoint("runs/a") == private_checkpoint("runs/./a") != private_checkpoint("runs/b")
    True
    """
    return _private_run_dir(out_dir) / CHECKPOINT_FILE


def check_legacy_checkpoint(out_dir: str | Path, *, accept: bool = False) -> None:
    """Refuse to resume from a ``checkpoint.pt`` that an older featuredp left in the run directory ``out_dir``,
    unless ``accept`` (``--accept-legacy-checkpoint``); nothing to do when the private place holds the checkpoint.

    The run directory is meant to be shared, so whoever could read it may hold that checkpoint's keys: its past
    noise (hence the clipped sums of the steps before it) and, had the run gone on from it unchanged, the noise to
    come. A resume re-keys the noise after it (:meth:`featuredp.run_state.RunState.rekey_private`), but cannot take
    back what the file already told.
    """
    legacy = Path(out_dir) / CHECKPOINT_FILE
    if accept or not legacy.is_file() or private_checkpoint(out_dir).is_file():
        return
    raise ValueError(
        f"--resume: {legacy} is a checkpoint an older featuredp left in the run directory, which is meant to be "
        "shared: whoever read it holds its noise keys and the noise of the steps before it; start a new run, or "
        "pass --accept-legacy-checkpoint to resume from it anyway (the noise after the resume is re-keyed)"
    )


def open_private_checkpoint(out_dir: str | Path, *, resume: bool = False, accept_legacy: bool = False) -> Path:
    """Create the private place of ``out_dir``'s checkpoint (folders 0700) and return the checkpoint's path.

    With ``resume``, a ``checkpoint.pt`` that an older featuredp left in the run directory itself (readable
    by others) is refused (:func:`check_legacy_checkpoint`) unless ``accept_legacy``; accepted, it is moved to
    the private place first (a PrivacyRiskWarning says so). When the private place already holds a checkpoint,
    the one in the run directory is left where it is, with a warning to delete it.
    """
    if resume:
        check_legacy_checkpoint(out_dir, accept=accept_legacy)
    private_dir(private_root())
    folder = private_dir(_private_run_dir(out_dir))
    owner = folder / _OWNER_FILE
    if not owner.exists():  # says which run a folder belongs to, for whoever cleans up by hand
        atomic_write_text(owner, str(Path(out_dir).expanduser().resolve()) + "\n")
    checkpoint = folder / CHECKPOINT_FILE
    legacy = Path(out_dir) / CHECKPOINT_FILE
    if resume and legacy.is_file():
        if checkpoint.exists():
            warnings.warn(f"{legacy} (left in the run directory by an older featuredp) holds private RNG states and "
                          f"keys; the run resumes from {checkpoint}: delete {legacy}", PrivacyRiskWarning,
                          stacklevel=2)  # fmt: skip
        else:
            shutil.move(str(legacy), str(checkpoint))  # a copy then a delete when the two are on other file systems
            os.chmod(checkpoint, 0o600)
            warnings.warn(f"moved the checkpoint {legacy} (left in the run directory by an older featuredp, where "
                          f"others may read its private RNG states) to {checkpoint} before resuming",
                          PrivacyRiskWarning, stacklevel=2)  # fmt: skip
    return checkpoint


def close_private_checkpoint(out_dir: str | Path, *, keep: bool = False) -> Path | None:
    """At the end of a run: delete the private checkpoint folder of ``out_dir`` (whatever the ranks wrote there),
    or with ``keep`` make every file in it readable by its owner only (0600). Returns the kept folder, else None.

    The run's data fingerprint (:func:`record_data_fingerprint`) and the file naming the run directory stay:
    ``featuredp audit`` needs the fingerprint after the run. Several processes may call it at once
    (data-parallel ranks): a file another one removed first is no error.
    """
    folder = _private_run_dir(out_dir)
    if not folder.exists():
        return None
    if not keep:
        if not (folder / DATA_FINGERPRINT_FILE).is_file():
            _remove_tree(folder)
            return None
        for entry in folder.iterdir():
            if entry.name in (DATA_FINGERPRINT_FILE, _OWNER_FILE):
                continue
            if entry.is_dir() and not entry.is_symlink():
                _remove_tree(entry)
            else:
                with contextlib.suppress(FileNotFoundError):
                    entry.unlink()
        return None
    private_dir(folder)
    for entry in folder.iterdir():
        if entry.is_file() and not entry.is_symlink():
            with contextlib.suppress(FileNotFoundError):
                os.chmod(entry, 0o600)
    return folder


def _remove_tree(folder: Path) -> None:
    """``shutil.rmtree`` that tolerates entries removed meanwhile by another process, and nothing else."""
    for root, dirs, files in os.walk(folder, topdown=False):
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(root, name))
        for name in dirs:
            path = os.path.join(root, name)
            with contextlib.suppress(FileNotFoundError):
                if os.path.islink(path):
                    os.unlink(path)
                else:
                    os.rmdir(path)
    with contextlib.suppress(FileNotFoundError):
        os.rmdir(folder)


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

    @property
    def replacement_epsilon(self) -> float | None:
        """The replace-one ε of the same steps (two values of one record's private part); ∞ without DP; None for a
        run.json written before it was recorded (recompute: ``PrivacyPlan.replacement_epsilon``)."""
        result = self.info.get("result", {})
        if "replacement_epsilon" not in result:
            return None
        e = result["replacement_epsilon"]
        return float("inf") if e in (None, "inf") else float(e)

    def load_data(self) -> tuple[Any, Any]:
        """Reload (train, test) with the loader and options recorded in run.json."""
        ds = self.dataset
        if not ds.get("name"):
            raise ValueError(f"run {self.path} records no dataset name; load the data yourself")
        return load_dataset(ds["name"], **(ds.get("options") or {}))


def _sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def data_files_fingerprint(options: dict[str, Any] | None) -> dict[str, str]:
    """The SHA-256 of the bytes of each file the loader ``options`` name (``path``, ``schema``, ``test``).

    Keyed by the option, not the path, so that the same bytes given from another place (``featuredp audit
    --data``) match. A function of the private data: keep it in the private place only, never in run.json.
    Empty for a dataset that names no file (a bundled or cached one).
    """
    return {key: _sha256_file(value) for key in _DATA_FILE_OPTIONS
            if (value := (options or {}).get(key)) and Path(value).is_file()}  # fmt: skip


def record_data_fingerprint(out_dir: str | Path, fingerprint: dict[str, str]) -> Path | None:
    """Keep ``fingerprint`` (:func:`data_files_fingerprint`) of the run in ``out_dir`` in its private folder (0600).

    An empty one removes what an earlier run there left. Returns the file written, else None.
    """
    target = _private_run_dir(out_dir) / DATA_FINGERPRINT_FILE
    if not fingerprint:
        with contextlib.suppress(FileNotFoundError):
            target.unlink()
        return None
    private_dir(private_root())
    private_dir(target.parent)
    with atomic_path(target, private=True) as tmp:
        tmp.write_text(json.dumps({"format": FORMAT, "sha256": fingerprint}, indent=2) + "\n", encoding="utf-8")
    return target


def check_data_fingerprint(run: Run) -> None:
    """Refuse (ValueError naming the file) data files of ``run`` whose bytes differ from those it was trained on.

    Reads the files named by ``run.dataset["options"]`` (what run.json records, or what ``--data`` replaced it
    with) and compares them with the fingerprint that training kept in the run's private folder. Without one
    (a run trained by an older featuredp, moved, or copied from another machine) nothing can be checked: a
    PrivacyRiskWarning says so and the data is used as it is.
    """
    options = run.dataset.get("options") or {}
    if not any(options.get(key) for key in _DATA_FILE_OPTIONS):
        return
    record = _private_run_dir(run.path) / DATA_FINGERPRINT_FILE
    try:
        kept = json.loads(record.read_text(encoding="utf-8"))["sha256"]
        if not isinstance(kept, dict):
            raise TypeError("not a mapping")
    except FileNotFoundError:
        warnings.warn(f"no fingerprint of the data of run {run.path} was kept (trained by an older featuredp, moved, "
                      f"or copied from another place): cannot check that {options.get('path')} holds the records "
                      "it was trained on", PrivacyRiskWarning, stacklevel=2)  # fmt: skip
        return
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"the data fingerprint {record} of run {run.path} is unreadable ({type(exc).__name__}: "
                         f"{exc}); delete it to audit without the check") from None  # fmt: skip
    for key in _DATA_FILE_OPTIONS:
        value = options.get(key)
        if value and key in kept and Path(value).is_file() and _sha256_file(value) != kept[key]:
            what = {"path": "data file", "schema": "schema file", "test": "test file"}[key]
            raise ValueError(f"the {what} {value} changed since the run was trained (its fingerprint differs); "
                             "audit the run on the data it was trained on, or train again")


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
    The checkpoint is written by ``Trainer.fit(checkpoint=open_private_checkpoint(out_dir))``, outside ``out_dir``.
    In a data-parallel run only rank 0 writes (every rank holds the same model); a sharded one is gathered whole
    first, on every rank.
    """
    out = Path(out_dir)
    weights = whole_state_dict(trainer.model)  # a collective when the model is sharded (FSDP2)
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
        torch.save(weights, tmp)
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

    When the block succeeds the old run's files (:data:`RUN_FILES`: run.json, model.pt, the audit
    reports, a checkpoint.pt an older featuredp left there) and its private checkpoint
    (:func:`private_checkpoint`) are deleted, so nothing of the old run stays next to the new one;
    when it fails (an error, Ctrl-C) they are put back, replacing whatever the block wrote, so
    nothing is lost. Yields the names set aside (the private checkpoint as ``"private checkpoint"``).
    """
    p = Path(path)
    names = run_files(p)
    private = _private_run_dir(p)
    # The old run's private checkpoint waits next to its own folder (same file system, owner-only parent).
    private_aside = private.with_name(f".replaced-{private.name}") if private.exists() else None
    if not names and private_aside is None:
        yield []
        return
    aside = Path(tempfile.mkdtemp(prefix=".replaced-run.", dir=p)) if names else None
    moved: list[str] = []
    try:
        if private_aside is not None:
            if private_aside.exists():  # left by a replacement that was killed before it could clean up
                _remove_tree(private_aside)
            os.replace(private, private_aside)
        for name in names:
            assert aside is not None
            os.replace(p / name, aside / name)
            moved.append(name)
        yield names + (["private checkpoint"] if private_aside is not None else [])
    except BaseException:
        for name in moved:
            assert aside is not None
            target = p / name
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            elif target.exists() or target.is_symlink():
                target.unlink()
            os.replace(aside / name, target)
        if private_aside is not None and private_aside.exists():
            if private.exists():
                _remove_tree(private)
            os.replace(private_aside, private)
        if aside is not None:
            shutil.rmtree(aside, ignore_errors=True)
        raise
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)
    if private_aside is not None:
        _remove_tree(private_aside)
