"""Debian packages without root: the .deb read in Python, apt-get as the current user, atomic folders."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest
from deb_synth import calls, fake_apt_get, fake_client, make_deb, write_ar

from featuredp.data.cache import atomic_dir, run_fetch_command
from featuredp.data.debian import DebPackage, apt_download, deb_files, read_ar
from featuredp.errors import DataValidationError

FILES = {"usr/share/datasets/toy/a.gz": b"alpha" * 100, "usr/share/datasets/toy/b.gz": b"b"}
PKG = DebPackage("dataset-toy", "1.0-1", "0" * 64)


@pytest.mark.parametrize("compression", ["xz", "gz", "bz2", ""])
def test_deb_files_reads_the_data_tarball_of_any_stdlib_compression(tmp_path: Path, compression: str) -> None:
    deb = make_deb(tmp_path / "toy.deb", {**FILES, "usr/share/doc/toy/README": b"doc"}, compression)
    assert list(read_ar(deb)) == ["debian-binary", "control.tar.xz", "data.tar" + ("." + compression if compression
                                                                                    else "")]  # fmt: skip
    got = deb_files(deb, list(FILES))
    assert got == FILES  # exactly the files asked for, by the names asked for
    assert deb_files(deb.read_bytes(), ["./usr/share/datasets/toy/b.gz"], label="x") == {
        "./usr/share/datasets/toy/b.gz": b"b"}  # bytes in, ./-prefixed names accepted


def test_long_ar_names_gnu_and_bsd(tmp_path: Path) -> None:
    long = "a-member-name-longer-than-sixteen.bin"
    gnu = write_ar(tmp_path / "gnu.a", [("//", f"{long}/\n".encode()), ("/0", b"gnu"), ("short/", b"s")])
    assert read_ar(gnu) == {long: b"gnu", "short": b"s"}
    bsd = write_ar(tmp_path / "bsd.a", [(f"#1/{len(long)}", long.encode() + b"bsd")])
    assert read_ar(bsd) == {long: b"bsd"}


def test_broken_packages_are_refused_naming_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.deb"
    bad.write_bytes(b"PK\x03\x04 a zip")
    with pytest.raises(DataValidationError, match=r"bad.deb is not a .deb \(ar\) archive"):
        read_ar(bad)
    deb = make_deb(tmp_path / "cut.deb", FILES)
    deb.write_bytes(deb.read_bytes()[:-100])
    with pytest.raises(DataValidationError, match=r"cut\.deb is cut short"):
        deb_files(deb, list(FILES))
    deb = make_deb(tmp_path / "toy.deb", FILES)
    with pytest.raises(DataValidationError, match=r"does not contain usr/share/datasets/toy/c\.gz"):
        deb_files(deb, ["usr/share/datasets/toy/c.gz"])
    no_data = write_ar(tmp_path / "nodata.deb", [("debian-binary", b"2.0\n")])
    with pytest.raises(DataValidationError, match=r"no single data\.tar"):
        deb_files(no_data, list(FILES))


def test_a_link_in_the_package_is_not_followed(tmp_path: Path) -> None:
    deb = make_deb(tmp_path / "link.deb", {}, links={"usr/share/datasets/toy/a.gz": "/etc/passwd"})
    with pytest.raises(DataValidationError, match=r"a\.gz is not a regular file"):
        deb_files(deb, ["usr/share/datasets/toy/a.gz"])


def test_zstd_without_support_is_a_clear_error(tmp_path: Path) -> None:
    if "zst" in getattr(tarfile.TarFile, "OPEN_METH", {}):
        pytest.skip("this Python's tarfile reads zstd")
    deb = write_ar(tmp_path / "z.deb", [("debian-binary", b"2.0\n"), ("data.tar.zst", b"(\xb5/\xfd")])
    with pytest.raises(DataValidationError, match=r"data.tar.zst.*cannot read zstd.*dpkg-deb -x z.deb DIR"):
        deb_files(deb, list(FILES))


def test_apt_download_runs_apt_get_as_the_user_in_the_folder(tmp_path: Path, monkeypatch) -> None:
    deb = make_deb(tmp_path / f"{PKG.name}_{PKG.version}_all.deb", FILES)
    bin_dir = tmp_path / "bin"
    fake_apt_get(bin_dir, deb)
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.delenv("FEATUREDP_OFFLINE", raising=False)
    work = tmp_path / "work"
    work.mkdir()
    got = apt_download(PKG, work, what="toy", otherwise="do something else", progress=False)
    assert got == work / deb.name and got.read_bytes() == deb.read_bytes()
    assert calls(bin_dir, "apt-get") == ["download dataset-toy=1.0-1"]  # the pinned version


def test_apt_get_missing_or_failing_is_one_clear_line(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("FEATUREDP_OFFLINE", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(FileNotFoundError, match="apt-get is not available here, so toy cannot be fetched from Debian; "
                                                "download it by hand"):  # fmt: skip
        apt_download(PKG, tmp_path, what="toy", otherwise="download it by hand", progress=False)
    bin_dir = tmp_path / "bin"
    fake_client(bin_dir, "apt-get", "print('W: something', file=sys.stderr)\n"
                                    "print(\"E: Can't find a source to download version '1.0-1' of 'dataset-toy'\", "
                                    "file=sys.stderr)\nsys.exit(100)")  # fmt: skip
    monkeypatch.setenv("PATH", str(bin_dir))
    with pytest.raises(RuntimeError, match=r"apt-get download dataset-toy=1.0-1` failed \(exit 100\): W: something \| "
                                           r"E: Can't find a source"):  # fmt: skip
        apt_download(PKG, tmp_path, what="toy", otherwise="...", progress=False)


def test_run_fetch_command_is_refused_offline(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("FEATUREDP_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="downloads are off"):
        run_fetch_command(["false"], tmp_path, what="toy")


def test_atomic_dir_appears_whole_or_not_at_all(tmp_path: Path) -> None:
    dest = tmp_path / "cache" / "toy"
    with pytest.raises(KeyboardInterrupt), atomic_dir(dest) as part:
        (part / "a").write_text("half")
        raise KeyboardInterrupt
    assert not (tmp_path / "cache").exists() or list((tmp_path / "cache").iterdir()) == []
    with atomic_dir(dest) as part:
        (part / "a").write_text("one")
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["toy"]
    with pytest.raises(ValueError, match="refused"), atomic_dir(dest) as part:
        (part / "a").write_text("two")
        raise ValueError("refused")
    assert (dest / "a").read_text() == "one"  # a failed replacement keeps the old copy
    with atomic_dir(dest) as part:
        (part / "b").write_text("two")
    assert sorted(p.name for p in dest.iterdir()) == ["b"]
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["toy"]  # no leftovers


def test_pool_url_and_file_name() -> None:
    pkg = DebPackage("libfoo1", "2:1.0-1", "0" * 64, arch="amd64")
    assert pkg.filename == "libfoo1_2%3a1.0-1_amd64.deb"
    assert pkg.url.endswith("/pool/main/libf/libfoo1/libfoo1_2%3a1.0-1_amd64.deb")
