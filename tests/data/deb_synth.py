"""Fake Debian packages and fake package clients for the fetch tests (no network, no apt, no pip)."""

from __future__ import annotations

import io
import stat
import sys
import tarfile
from pathlib import Path


def ar_member(name: str, data: bytes) -> bytes:
    """One ``ar`` member: a 60-byte header (dpkg's plain short names) and the data, padded to even length."""
    header = (f"{name:<16}" + f"{0:<12}" + f"{0:<6}" + f"{0:<6}" + f"{100644:<8}" + f"{len(data):<10}").encode()
    return header + b"`\n" + data + (b"\n" if len(data) % 2 else b"")


def write_ar(path: Path, members: list[tuple[str, bytes]]) -> Path:
    """An ``ar`` archive holding ``members`` in order."""
    path.write_bytes(b"!<arch>\n" + b"".join(ar_member(n, d) for n, d in members))
    return path


def tar_bytes(files: dict[str, bytes], compression: str = "xz", *, links: dict[str, str] | None = None) -> bytes:
    """A tarball (``compression``: xz, gz, bz2 or "" for none) of ``files`` under ``./``, plus symlinks."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=f"w:{compression}" if compression else "w") as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(f"./{name}")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(f"./{name}")
            info.type = tarfile.SYMTYPE
            info.linkname = target
            tf.addfile(info)
    return buf.getvalue()


def make_deb(path: Path, files: dict[str, bytes], compression: str = "xz", **tar_options) -> Path:
    """A ``.deb``: ``debian-binary``, ``control.tar.xz`` and ``data.tar.<compression>`` holding ``files``."""
    control = tar_bytes({"control": b"Package: fake\nVersion: 1\n"}, "xz")
    data_name = "data.tar" + (f".{compression}" if compression else "")
    return write_ar(path, [("debian-binary", b"2.0\n"), ("control.tar.xz", control),
                           (data_name, tar_bytes(files, compression, **tar_options))])  # fmt: skip


def fake_client(bin_dir: Path, name: str, body: str) -> Path:
    """An executable Python script ``bin_dir/name`` (a stand-in for apt-get or pip) running ``body``.

    The script appends its argv to ``bin_dir/<name>.calls`` (one line per call) before running ``body``.
    """
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / name
    calls = bin_dir / f"{name}.calls"
    script.write_text(
        f"#!{sys.executable}\nimport os, shutil, sys\n"
        f"with open({str(calls)!r}, 'a') as fh:\n    fh.write(' '.join(sys.argv[1:]) + '\\n')\n{body}\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return script


def fake_apt_get(bin_dir: Path, deb: Path) -> Path:
    """A fake ``apt-get`` whose ``download`` copies ``deb`` into the current folder, as the real one does."""
    return fake_client(bin_dir, "apt-get", f"assert sys.argv[1] == 'download'\nshutil.copy({str(deb)!r}, os.getcwd())")


def calls(bin_dir: Path, name: str) -> list[str]:
    """The argument lines the fake client ``name`` was called with."""
    path = bin_dir / f"{name}.calls"
    return path.read_text().splitlines() if path.exists() else []
