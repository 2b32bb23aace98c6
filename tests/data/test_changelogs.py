"""Debian changelogs as a real-text corpus: parsing, exact author spans, order, the fetch, .deb files read in Python."""

from __future__ import annotations

import gzip
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from deb_synth import calls, fake_apt_get, make_deb

import featuredp.data.changelogs as changelogs
from featuredp.cli import main
from featuredp.data.changelogs import (
    changelog_records,
    changelogs_cache,
    deb_changelog,
    entry_record,
    fetch_debian_changelogs,
    local_changelogs,
    parse_changelog,
)
from featuredp.data.debian import DebPackage
from featuredp.data.text import load_text_jsonl
from featuredp.errors import DataValidationError
from featuredp.features.text import Span, TextSpans

ZEBRA = """zebra (2.0-1) unstable; urgency=medium

  * New upstream release.
  * Fix the build on arm64 (thanks to Ann Lee <ann.lee@example.org>).
    Closes: #1000001.

 -- Zoë Ångström-Núñez <zoe@example.net>  Mon, 02 Jan 2023 13:06:21 +0100

zebra (1.9-2) unstable; urgency=low

  [ Jörg Müller ]
  * Translate the manual page.

 -- Jörg Müller <joerg@example.com>  Sat, 31 Dec 2022 11:32:01 +0100

Local variables:
mode: debian-changelog
End:
"""

APPLE = """apple (0.5-1) experimental; urgency=medium

  * Initial release.   Whitespace    collapsed.

 -- Bob O'Neil <bob@example.com>  Tue, 01 Feb 2022 10:00:00 +0000
"""


def test_entries_are_parsed_in_file_order_newest_first() -> None:
    entries = parse_changelog(ZEBRA)
    assert [(e.package, e.version) for e in entries] == [("zebra", "2.0-1"), ("zebra", "1.9-2")]
    assert entries[0].author == "Zoë Ångström-Núñez" and entries[0].email == "zoe@example.net"
    assert entries[0].bullets() == ("New upstream release. Fix the build on arm64 (thanks to Ann Lee "
                                    "<ann.lee@example.org>). Closes: #1000001.")  # fmt: skip


def test_records_have_exact_author_spans_and_leave_bullet_pii_unannotated() -> None:
    recs = changelog_records([("zebra", ZEBRA), ("apple", APPLE)], max_chars=400)
    # packages sorted by name, entries newest first within a package
    assert [(r.package, r.version) for r in recs] == [("apple", "0.5-1"), ("zebra", "2.0-1"), ("zebra", "1.9-2")]
    for r in recs:
        (n0, n1, nt), (e0, e1, et) = r.spans
        assert (nt, et) == ("name", "email")
        assert r.text[n0:n1] == r.author
        assert r.text[e0:e1] == r.email
        assert r.text.startswith(f"Author: {r.author} <{r.email}>\n{r.package} ({r.version}): ")
    assert recs[0].text.endswith("): Initial release. Whitespace collapsed.")
    zoe = recs[1]
    assert zoe.values() == ["Zoë Ångström-Núñez", "zoe@example.net"]  # only the author is annotated
    assert "ann.lee@example.org" in zoe.text and "Ann Lee" in zoe.text
    assert zoe.bullet_emails == ("ann.lee@example.org",)  # the ground truth of the missed PII
    assert recs[2].bullet_emails == () and "[ Jörg Müller ]" in recs[2].text
    # Ψ hides the author, not the people the bullets name: that is what a detector has to find
    spans = [Span(*s) for s in zoe.spans]
    public = TextSpans(("name", "email"))(zoe.text, spans)
    assert "Zoë" not in public and "zoe@" not in public
    assert "Ann Lee <ann.lee@example.org>" in public
    assert "ann.lee" not in TextSpans(("name", "email"), ("email",))(zoe.text, spans)


def test_a_repeated_entry_is_kept_once_and_the_cut_is_on_a_word_boundary() -> None:
    recs = changelog_records([("zebra", ZEBRA), ("zebra-doc", ZEBRA)])
    assert len(recs) == 2  # binary packages of one source ship one changelog
    entry = parse_changelog(ZEBRA)[0]
    for limit in range(60, 140, 7):
        rec = entry_record(entry, max_chars=limit)
        assert len(rec.text) <= limit
        body = rec.text.split("): ", 1)[1] if "): " in rec.text else ""
        assert body == "" or (entry.bullets().startswith(body) and (
            len(body) == len(entry.bullets()) or entry.bullets()[len(body)] == " "))
        assert rec.values("name") == [entry.author]  # the author line is never cut


def test_trailers_without_email_and_old_changelog_sections_are_skipped() -> None:
    text = ("a (1) u; urgency=low\n\n  * x\n\n -- Someone  Mon, 01 Jan 2001 00:00:00 +0000\n\n" + APPLE
            + "\nOld Changelog:\n\nb (1) u; urgency=low\n  * y\n -- C D <c@d.org>  Mon, 01 Jan 2001\n")
    assert [e.package for e in parse_changelog(text)] == ["apple"]


def _doc_root(root: Path) -> Path:
    for pkg, text in (("zebra", ZEBRA), ("apple", APPLE)):
        (root / pkg).mkdir(parents=True)
        (root / pkg / "changelog.Debian.gz").write_bytes(gzip.compress(text.encode()))
    (root / "zebra-doc").symlink_to(root / "zebra")  # a doc folder that is a link: read once
    (root / "native").mkdir()
    (root / "native" / "changelog.gz").write_bytes(gzip.compress(APPLE.replace("apple", "native").encode()))
    (root / "upstream").mkdir()
    (root / "upstream" / "changelog.gz").write_bytes(gzip.compress(b"2020-01-01  Ann Lee  <a@b.org>\n\n\t* x\n"))
    return root


def test_the_module_does_not_import_torch() -> None:
    code = "import sys, featuredp.data.changelogs; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_local_doc_root(tmp_path: Path) -> None:
    got = local_changelogs(_doc_root(tmp_path / "doc"))
    assert [name for name, _ in got] == ["apple", "native", "zebra"]


def test_fetch_writes_annotated_jsonl_atomically_and_refuses_a_different_corpus(tmp_path: Path) -> None:
    root = _doc_root(tmp_path / "doc")
    path, stats = fetch_debian_changelogs(tmp_path / "cache", source=root)
    assert path == changelogs_cache(tmp_path / "cache")
    assert stats["records"] == 4 and stats["authors"] == 3 and stats["largest_author_records"] == 2
    assert stats["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    records = load_text_jsonl(path, spans=["name", "email"])
    assert records[0].values() == ["Bob O'Neil", "bob@example.com"]
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert [r["bullet_emails"] for r in rows] == [[], [], ["ann.lee@example.org"], []]
    assert sorted(p.name for p in path.parent.iterdir()) == ["changelogs.jsonl", "provenance.json"]  # no temp files
    # the same corpus again: fine; another one: refused without force, and the file is left as it was
    fetch_debian_changelogs(tmp_path / "cache", source=root)
    before = path.read_bytes()
    with pytest.raises(ValueError, match=r"holds a different corpus.*--force"):
        fetch_debian_changelogs(tmp_path / "cache", source=root, max_chars=60)
    assert path.read_bytes() == before
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataValidationError, match="no Debian changelog entries"):
        fetch_debian_changelogs(tmp_path / "cache", source=empty, force=True)
    assert path.read_bytes() == before
    _, stats = fetch_debian_changelogs(tmp_path / "cache", source=root, max_chars=60, force=True)
    assert all(len(r.text) <= 60 for r in load_text_jsonl(path, spans=["name"]) if "Ångström" not in r.text)


def _debs(folder: Path) -> Path:
    folder.mkdir()
    make_deb(folder / "zebra_2.0-1_amd64.deb", {
        "usr/share/doc/zebra/changelog.Debian.gz": gzip.compress(ZEBRA.encode()),
        "usr/share/doc/zebra/changelog.gz": b"not gzip, upstream"})
    make_deb(folder / "apple_0.5-1_all.deb", {"usr/share/doc/apple/changelog.gz": gzip.compress(APPLE.encode())}, "gz")
    make_deb(folder / "nodoc_1_all.deb", {"usr/bin/x": b"x"})
    return folder


def test_debs_are_read_in_python(tmp_path: Path) -> None:
    folder = _debs(tmp_path / "debs")
    assert deb_changelog(folder / "zebra_2.0-1_amd64.deb") == ZEBRA  # changelog.Debian.gz first
    assert deb_changelog(folder / "apple_0.5-1_all.deb") == APPLE  # a native package's changelog.gz
    assert deb_changelog(folder / "nodoc_1_all.deb") is None
    linked = make_deb(tmp_path / "link.deb", {}, links={"usr/share/doc/x/changelog.Debian.gz": "/etc/passwd"})
    assert deb_changelog(linked) is None  # a link is never followed
    _, stats = fetch_debian_changelogs(tmp_path / "cache", source=folder)
    assert stats["records"] == 3 and stats["changelogs"] == 2 and len(stats["debs"]) == 3


def test_pinned_packages_are_downloaded_and_their_sha256_checked(tmp_path: Path, monkeypatch) -> None:
    deb = make_deb(tmp_path / "zebra_2.0-1_amd64.deb",
                   {"usr/share/doc/zebra/changelog.Debian.gz": gzip.compress(ZEBRA.encode())})
    good = DebPackage("zebra", "2.0-1", hashlib.sha256(deb.read_bytes()).hexdigest(), "amd64")
    bin_dir = tmp_path / "bin"
    fake_apt_get(bin_dir, deb)
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.delenv("FEATUREDP_OFFLINE", raising=False)
    monkeypatch.setattr(changelogs, "PINNED_PACKAGES", (good,))
    _, stats = fetch_debian_changelogs(tmp_path / "cache", source="pinned", progress=False)
    assert calls(bin_dir, "apt-get") == ["download zebra=2.0-1"]
    assert stats["records"] == 2 and stats["packages"] == ["zebra=2.0-1"]
    # a package whose bytes are not the pinned ones is refused, and nothing is written
    monkeypatch.setattr(changelogs, "PINNED_PACKAGES", (DebPackage("zebra", "2.0-1", "0" * 64, "amd64"),))
    with pytest.raises(DataValidationError, match="is not the pinned"):
        fetch_debian_changelogs(tmp_path / "other", source="pinned", progress=False)
    assert not changelogs_cache(tmp_path / "other").exists()
    monkeypatch.setenv("FEATUREDP_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="downloads are off"):
        fetch_debian_changelogs(tmp_path / "third", source="pinned")


def test_the_pinned_list_is_well_formed() -> None:
    pins = changelogs.PINNED_PACKAGES
    assert 30 <= len(pins) <= 60 and len({p.name for p in pins}) == len(pins)
    assert all(len(p.sha256) == 64 and int(p.sha256, 16) >= 0 and p.arch in ("amd64", "all") for p in pins)


def test_cli_fetch_prints_the_corpus_stats(tmp_path: Path, capsys) -> None:
    root = _doc_root(tmp_path / "doc")
    assert main(["data", "fetch", "debian-changelogs", "--source", str(root), "--cache-dir", str(tmp_path / "c"),
                 "--max-chars", "120"]) == 0
    out = capsys.readouterr().out
    assert str(changelogs_cache(tmp_path / "c")) in out
    assert "4 records" in out and "3 distinct authors" in out and "at most 2 records by one author" in out
    assert main(["data", "fetch", "debian-changelogs", "--source", str(root), "--cache-dir", str(tmp_path / "c"),
                 "--max-chars", "60"]) == 2  # a different corpus without --force
    assert "--force" in capsys.readouterr().err
    assert main(["data", "fetch", "census-income", "--max-chars", "60", "--cache-dir", str(tmp_path / "c")]) == 2
