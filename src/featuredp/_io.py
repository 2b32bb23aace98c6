"""Atomic file writes: a crash or a repeated run never leaves a half-written file.

Write to a temporary file in the same directory, fsync, then ``os.replace``. Names that come from
data (column names, categories, dataset names) become file names only through :func:`safe_filename`,
and :func:`inside` refuses a path that would land outside its folder.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str], *, private: bool = False) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on success it replaces ``path`` atomically.

    Use it with writers that take a path (``torch.save``, ``savefig``, ``to_csv``).
    On an exception the temporary file is removed and ``path`` is untouched.
    ``private=True``: the file is readable by its owner only (mode 0600) from its first byte, and a
    directory the call creates is 0700 (keys, RNG states; :func:`private_dir` also tightens an existing one).
    """
    target = Path(path)
    # A folder this call creates for a private file is the owner's alone; an existing folder is left as it is.
    target.parent.mkdir(parents=True, exist_ok=True, **({"mode": 0o700} if private else {}))
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    # mkstemp creates 0600 files; a public file gets the mode a plain open() would (0666 minus the umask).
    os.chmod(tmp_path, 0o600 if private else 0o666 & ~_current_umask())
    try:
        yield tmp_path
        with open(tmp_path, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp_path, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp_path.unlink()
        raise


#: what :func:`safe_filename` keeps; everything else becomes ``_``
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
#: hex digits of the SHA-256 suffix :func:`safe_filename` adds to a name it had to change
_DIGEST_CHARS = 10


def safe_filename(name: str, *, max_length: int = 64) -> str:
    """``name`` as one safe path component: only ``[A-Za-z0-9._-]``, no leading dot, 1 to ``max_length`` chars.

    A name that is already safe is returned as it is. Any other (``a/b``, ``..``, ``""``, a name too long)
    gets its unsafe characters replaced by ``_`` and a suffix from the SHA-256 of the original name, so
    that two names that differ only where characters were replaced (``a/b``, ``a?b``) keep different files.

    >>> safe_filename("age"), safe_filename("a/b") == safe_filename("a?b"), safe_filename("..")[0] != "."
    ('age', False, True)
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    if max_length < 2 * _DIGEST_CHARS:
        raise ValueError(f"max_length must be >= {2 * _DIGEST_CHARS}, got {max_length}")
    cleaned = _UNSAFE.sub("_", name).lstrip(".")
    if cleaned == name and 0 < len(name) <= max_length:
        return name
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:_DIGEST_CHARS]
    stem = cleaned[: max_length - _DIGEST_CHARS - 1]
    return f"{stem}-{digest}" if stem else digest


def inside(folder: str | os.PathLike[str], name: str) -> Path:
    """``folder / name``, refused (ValueError naming both) unless it resolves to a place inside ``folder``.

    The last check before a write: ``name`` should already be a :func:`safe_filename`; this also catches
    a symbolic link in ``folder`` that points elsewhere.
    """
    base = Path(folder)
    target = base / name
    if not target.resolve().is_relative_to(base.resolve()) or target.resolve() == base.resolve():
        raise ValueError(f"refusing to write {str(target)!r}: the file name {name!r} leads outside {str(base)!r}")
    return target


def private_dir(path: str | os.PathLike[str]) -> Path:
    """``path`` as a directory only its owner can read (created with mode 0700; an existing one is tightened)."""
    target = Path(path)
    target.mkdir(parents=True, exist_ok=True, mode=0o700)
    if target.stat().st_mode & 0o077:
        os.chmod(target, 0o700)
    return target


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike[str], obj: Any, *, indent: int = 2) -> None:
    """Write ``obj`` as JSON to ``path`` atomically."""
    atomic_write_text(path, json.dumps(obj, indent=indent, sort_keys=False, default=_json_default) + "\n")


def _json_default(obj: Any) -> Any:
    # numpy scalars and arrays appear in results; store them as plain JSON.
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"object of type {type(obj).__name__} is not JSON serialisable")


def atomic_save_png(fig: Any, path: str | os.PathLike[str], *, dpi: int = 120, tight: bool = True) -> None:
    """Save a matplotlib figure as PNG to ``path`` atomically, then close it (``tight``: tight layout first)."""
    import matplotlib.pyplot as plt  # here: only the commands that draw need matplotlib

    if tight:
        fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=dpi)
    plt.close(fig)


def atomic_save_torch(path: str | os.PathLike[str], obj: Any, *, private: bool = False) -> None:
    """``torch.save(obj)`` to ``path`` atomically (tensors and plain containers: checkpoints, models).

    ``private=True`` for anything holding keys or RNG states (checkpoints): mode 0600 (:func:`atomic_path`).
    """
    import torch  # here, not at the top: the accountant imports this module and must not pull in torch

    with atomic_path(path, private=private) as tmp:
        torch.save(obj, tmp)


def load_torch_safely(path: str | os.PathLike[str], *, what: str = "checkpoint") -> Any:
    """Read a file written by :func:`atomic_save_torch` with the safe loader (``weights_only=True``).

    A missing file is ``FileNotFoundError`` and a truncated or foreign one a ``ValueError``, each naming
    the file; a file holding arbitrary Python objects is refused by torch's safe unpickler.
    """
    import pickle

    import torch

    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"{what} not found: {p}")
    try:
        return torch.load(p, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise
    except (RuntimeError, EOFError, OSError) as exc:
        raise ValueError(f"{what} {p} is truncated or not a featuredp file ({type(exc).__name__}: {exc})") from None
