"""Real text with real names and emails: Debian changelog entries as annotated records (no torch).

Every Debian package ships ``/usr/share/doc/<pkg>/changelog.Debian.gz``: entries, newest first, each a header
``pkg (version) dist; urgency=...``, bullet lines, and a trailer `` -- Full Name <email>  Date`` naming the person
who made the upload. :func:`parse_changelog` reads the entries; :func:`entry_record` turns one into one record::

    Author: Matthias Klose <doko@debian.org>
    bash (5.2.15-2): Remove one more pdf file without source. Closes: #1024598.

the author line first (a prompt ``Author: `` probes whether a model gives out real identities), then package,
version and the entry's bullets, whitespace collapsed and cut on a word boundary so that the record has at most
``max_chars`` characters. Only the author's name (type ``name``) and email (type ``email``) are annotated. Names
and emails inside the bullets (``(Bastian Germann)``, ``Thanks to ann@example.org``) are NOT annotated: they are
the PII an annotation misses and a detector has to find. For measurement only, each record also carries
``bullet_emails``: the emails a regular expression finds in its bullet text (ground truth of a measurement, not an
annotation; it misses obfuscated addresses such as ``ann at example dot org``).

Sources (:func:`fetch_debian_changelogs`, ``featuredp data fetch debian-changelogs``):

* the local ``/usr/share/doc`` (default): every ``<pkg>/changelog.Debian.gz`` (or, for Debian-native packages, a
  ``changelog.gz`` whose first line is a Debian changelog header). The corpus then depends on the packages
  installed on the machine; the provenance file records the count and the sha256 of the output;
* ``pinned``: :data:`PINNED_PACKAGES`, 51 Debian bookworm packages at exact versions with the sha256 of each ``.deb``,
  fetched with ``apt-get download`` as the current user and read in Python (:mod:`featuredp.data.debian`): the same
  corpus on any machine that reaches a Debian mirror;
* a folder: ``.deb`` files in it are read like the pinned ones (no sha256 to check), otherwise it is read as a doc
  root like ``/usr/share/doc``.

Order is deterministic: packages sorted by name, entries in file order (newest first, as Debian writes them); an
entry seen before (the same package, version, author and date: binary packages of one source ship one changelog)
is kept once, at its first place.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import tempfile
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from featuredp._io import atomic_write_json, atomic_write_text
from featuredp._validate import check_int
from featuredp.data.cache import cache_dir as _cache_dir
from featuredp.data.cache import check_online
from featuredp.data.debian import DebPackage, apt_download, deb_matching
from featuredp.errors import DataValidationError

__all__ = [
    "CHANGELOGS_FETCH",
    "DEFAULT_MAX_CHARS",
    "PINNED_PACKAGES",
    "ChangelogEntry",
    "ChangelogRecord",
    "changelog_records",
    "changelogs_cache",
    "corpus_stats",
    "deb_changelog",
    "entry_record",
    "fetch_debian_changelogs",
    "local_changelogs",
    "parse_changelog",
    "read_changelog_jsonl",
    "write_changelog_jsonl",
]

#: the command that builds the corpus (named in errors)
CHANGELOGS_FETCH = "featuredp data fetch debian-changelogs"
#: characters per record: with the author line, almost every record fits 160 byte tokens (BOS and EOS included)
DEFAULT_MAX_CHARS = 150
_FILE = "changelogs.jsonl"

_HEADER = re.compile(r"^(?P<package>[a-z0-9][a-z0-9+.\-]*) \((?P<version>[^()\s]+)\)(?P<rest>[^;]*;.*)?$")
_TRAILER = re.compile(r"^ -- (?P<name>\S.*?) <(?P<email>[^<>\s]+@[^<>\s]+)>\s+(?P<date>\S.*)$")
_BULLET = re.compile(r"^[*+\-]\s+")
#: emails in free text (the ground truth of the measurement of missed PII, not an annotation)
EMAIL_RE = re.compile(r"[A-Za-z0-9._%+\-]+@[A-Za-z0-9\-]+(?:\.[A-Za-z0-9\-]+)+")

#: Debian bookworm packages with long changelogs, pinned by version and the sha256 of their .deb (from the
#: archive's Packages index, apt-cache show); ``apt-get download NAME=VERSION`` fetches each.
_PINS = """
bash 5.2.15-2+b13 amd64 82130bb6a560cd2a7234d8018baf73f188f5dd56413d5aa0accc987b2197a6a1
coreutils 9.1-1 amd64 61038f857e346e8500adf53a2a0a20859f4d3a3b51570cc876b153a2d51a3091
libc6 2.36-9+deb12u14 amd64 ba4f88f73dbc3ae9055f3c20f4523bfdbaf1ad13ff95e258924f77d20b4fbedf
dpkg 1.21.23 amd64 f89e9f8d1a4a50ade44be3ed59a6ec55460fce205d2f8520c5c492137c5b609b
apt 2.6.1 amd64 6ea03cbbc7a7bfcee601c9fb08d4e026fd522ede5350561f06867ad9c0a0fa6b
python3.11 3.11.2-6+deb12u8 amd64 cd7b10c24281416a6acb22cd23ed7391c7dddd4a3d4d4a63d37faa786639b5de
openssl 3.0.20-1~deb12u2 amd64 4d218561dc838de081de97f54584c4a29e77e26c7ed9fe3440d776d8e6071bf9
systemd 252.39-1~deb12u2 amd64 286f879c537bfba92e59d580c075ad20ab49020244c79634656850a306dd462b
util-linux 2.38.1-5+deb12u3 amd64 8eb241ff24b2e1ee9c0373f4fc9bc728b85bf5966c1496154df7da01c0e42f34
tar 1.34+dfsg-1.2+deb12u1 amd64 24fb92e98c2969171f81a8b589263d705f6b1670f95d121cd74c810d4605acc3
grep 3.8-5 amd64 3264acea728df3c48a54f20e9291b965130e306b9d00adac76647049da7196df
sed 4.9-1+deb12u1 amd64 fd557efeee8aae4619c2cb7f68aadccb804322ad4a99ab048aaae5901d253885
gzip 1.12-1 amd64 eabec1dde2834f72540d7b93fc5df2625f52611c06d93d61f5cdb12480e0e6a3
perl-base 5.36.0-7+deb12u3 amd64 8ec874926e211807cde71e1b0a2311d2534ab3539dffcb2c8553633f542efc1a
findutils 4.9.0-4 amd64 5dd86bd0af4aa73f067dfd6b8339dd868f2dd84056aa79db29d1206d4fbc5e04
diffutils 1:3.8-4 amd64 8bdfedc14c1035e3750e9f055ac9c1ecd9b5d05d9e6dc6466c4e9237eef407dd
bzip2 1.0.8-5+b1 amd64 438871b3f5c5c7a357a9840951dab9dab8db7eb1ff760a563226fafa111b99e5
xz-utils 5.4.1-1+deb12u1 amd64 cc6dc501e0c06be3f89e9a7f8dfd7a97f92aadfd9daa60fad19b90d6a5558b80
zlib1g 1:1.2.13.dfsg-1 amd64 d7dd1d1411fedf27f5e27650a6eff20ef294077b568f4c8c5e51466dc7c08ce4
curl 7.88.1-10+deb12u15 amd64 0dd9b6bf7a0bd11af2d68a52ec44c2a223fa7c11f9104c36ce1047e1137d4a8f
wget 1.21.3-1+deb12u1 amd64 b389052d1d8a8cacec4f0380d9ee54e8082bfbebe374299be95b5286c9380f80
git 1:2.39.5-0+deb12u3 amd64 637a85ddd6247fab13bdd0592f2f39aff04ce4dbf0655d3ab553ac359a38ce6f
openssh-client 1:9.2p1-2+deb12u10 amd64 42c250b8b9110382488c53c066a960bc564ddac2cb9e449f47b6cdbb5fc1cb60
gnupg 2.2.40-1.1+deb12u2 all d3f860cf16da5d61875a324859045fd1f4a888ed0ddef55d7e9f977dd729a76e
make 4.3-4.1 amd64 a1a83af8cbd854af887b72ad196b1f4af58387815e21ced1000253a116a46e2a
binutils 2.40-2 amd64 83c3e20b53e1fbd84d764c3ba27d26a0376e361ae5d7fb37120196934dd87424
vim 2:9.0.1378-2+deb12u2 amd64 298464600a708a3cc7fd7e55a7719dd1adfa8d2de1645c3ecbd05b5d24ffae73
nano 7.2-1+deb12u1 amd64 45a9b3960aa5ac18552459225ec26800abb73fc2edd11626046daf6d968ac968
less 590-2.1~deb12u2 amd64 3c4ee8ce5e0f625e1169da9584e309c375a8a68e22de5821461d14446825cc1a
procps 2:4.0.2-3 amd64 d9d0e75779cb79af869181f17b93c5c263a2b89cac6a0193c436160a4483ddc1
sudo 1.9.13p3-1+deb12u4 amd64 ea9987f92630be504998516e1ed9c821c483131d0576ff35a09d6e7f8deff10f
login 1:4.13+dfsg1-1+deb12u2 amd64 f1cc45bf505a8457340dc3c36f3a01a1835aaf564d73d9d394afb8ccfb6595a0
passwd 1:4.13+dfsg1-1+deb12u2 amd64 fb787363372903e03627e53fd483e51dfb6861047a1e02c7d5a5f27d66546d08
ncurses-bin 6.4-4 amd64 396d6e453aee6d71b7141f0bfb333a6c08a44c64f77632bdf52894ccd123db46
e2fsprogs 1.47.0-2+b2 amd64 fedd424691c08ef0739729026be298e7be8236337bf8e031b3c7ec66794e6fc2
mawk 1.3.4.20200120-3.1 amd64 bcbc83f391854ea9d50ce2a4101aacf330de3b8b71d81a798faadba14a157f78
hostname 3.23+nmu1 amd64 17d9a2f3c05004499d80e180d2440fd716f84c32b65f09d96c9a024af4d1d0e7
debianutils 5.7-0.5~deb12u1 amd64 55f951359670eb3236c9e2ccd5fac9ccb3db734f5a22aff21589e7a30aee48c9
base-files 12.4+deb12u15 amd64 3eb1ea6d85488f488cc2a163b98ad640ef88cee4c79287cf14e361aaf6206f47
tzdata 2026b-0+deb12u1 all 0edb49f4dffe0d5608069f7e4ba4d69544d3b9e86fc314dd8b75e9958d8e5e98
ca-certificates 20230311+deb12u1 all 0d5f444f594e48c1e16a41d8fc628a09b24c658916a1274025c2330f2a802bed
file 1:5.44-3 amd64 2c57221bf8cc0ff5d2295ececb9215cc1b9ff9040dacb152c385bba3087ab1df
patch 2.7.6-7 amd64 8c6d49b771530dbe26d7bd060582dc7d2b4eeb603a20789debc1ef4bbbc4ef67
rsync 3.2.7-1+deb12u6 amd64 ce99de6b36cbb62dc614a73463e467f2c1ef509545a9a2b33cab19b50530b672
sqlite3 3.40.1-2+deb12u2 amd64 58e59f7db8a88f87333c3f9896b98146fdf4dc33eda75a1f79d9100d1b819909
libxml2 2.9.14+dfsg-1.3~deb12u6 amd64 4460e39dda10a815881374217cde08474747cfa018358cd8612c14b390eff53b
cron 3.0pl1-162 amd64 c1e12d9c993460e6396107668aa7ba79f8633decebb53aa6c38049584448be3f
logrotate 3.21.0-1 amd64 4e6acd31f55af85b2f12bd61a636c84e19fc1d0f419540b71bbe8aba6985aa32
iproute2 6.1.0-3 amd64 1204b29e916e836267096d0b9d778106752f821ebde0d281539008b4386d9070
iputils-ping 3:20221126-1+deb12u1 amd64 5a206d74e2147990e08b89d09a4655e59a17222e0513a309a48e16ed2281589b
dash 0.5.12-2 amd64 33ea40061da2f1a861ec46212b2b6a34f0776a049b1a3f0abce2fb8cb994258f
"""
PINNED_PACKAGES: tuple[DebPackage, ...] = tuple(
    DebPackage(name, version, sha256, arch)
    for name, version, arch, sha256 in (line.split() for line in _PINS.strip().splitlines())
)


@dataclass(frozen=True)
class ChangelogEntry:
    """One entry of a Debian changelog: header, bullet lines, and the trailer's author, email and date."""

    package: str
    version: str
    author: str
    email: str
    date: str
    lines: tuple[str, ...]

    def bullets(self) -> str:
        """The body lines, bullet markers dropped, whitespace collapsed into single spaces."""
        parts = [_BULLET.sub("", line.strip()) for line in self.lines]
        return " ".join(" ".join(p for p in parts if p).split())


@dataclass(frozen=True)
class ChangelogRecord:
    """One record of the corpus: the text, its annotated spans ``(start, end, type)`` (character offsets), where
    it came from, and the emails its bullets mention. Plain tuples keep this module free of torch; the JSONL is
    read back as :class:`~featuredp.data.text.TextRecord` by ``load_text_jsonl``."""

    text: str
    spans: tuple[tuple[int, int, str], ...]
    package: str
    version: str
    author: str
    email: str
    bullet_emails: tuple[str, ...] = field(default_factory=tuple)

    def values(self, span_type: str | None = None) -> list[str]:
        """The contents of the annotated spans (of ``span_type`` only, when given), in order."""
        return [self.text[a:b] for a, b, t in self.spans if span_type is None or t == span_type]

    def to_json(self) -> dict[str, Any]:
        """The JSONL object: ``text`` and ``spans`` (what ``load_text_jsonl`` reads), ``author`` (the author's email,
        lower-cased: the user of ``--user-field author``) and the measurement fields."""
        return {"text": self.text, "spans": [{"start": a, "end": b, "type": t} for a, b, t in self.spans],
                "author": self.email.lower(), "package": self.package, "version": self.version,
                "bullet_emails": list(self.bullet_emails)}


def parse_changelog(text: str) -> list[ChangelogEntry]:
    """The entries of a Debian changelog, in file order (newest first in Debian's files).

    An entry runs from a header line to its trailer. Lines outside an entry (an emacs ``Local variables`` footer,
    a header without a trailer) are skipped; an ``Old Changelog:`` line ends the parse (what follows is not in
    Debian's format). An entry whose trailer has no ``<email>`` is skipped.
    """
    out: list[ChangelogEntry] = []
    current: tuple[str, str] | None = None
    lines: list[str] = []
    for raw in text.splitlines():
        line = raw.rstrip()
        if line.startswith("Old Changelog:") or line.startswith("Older entries have been removed"):
            break
        head = _HEADER.match(line)
        if head:
            current, lines = (head["package"], head["version"]), []
            continue
        if current is None:
            continue
        trailer = _TRAILER.match(line)
        if trailer:
            out.append(ChangelogEntry(current[0], current[1], " ".join(trailer["name"].split()), trailer["email"],
                                      trailer["date"].strip(), tuple(x for x in lines if x.strip())))
            current, lines = None, []
        elif line.startswith(" -- "):  # a trailer without an email: not a record
            current, lines = None, []
        else:
            lines.append(line)
    return out


def _cut(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters at a word boundary ("" if not even one word fits)."""
    if len(text) <= limit:
        return text
    cut = text[: limit + 1].rsplit(" ", 1)[0] if " " in text[: limit + 1] else ""
    return cut[:limit].rstrip()


def entry_record(entry: ChangelogEntry, *, max_chars: int = DEFAULT_MAX_CHARS) -> ChangelogRecord:
    """One record: ``Author: NAME <EMAIL>`` then ``pkg (version): bullets``, the bullets cut so that the text has
    at most ``max_chars`` characters (the author line and the package header are never cut). The name and email
    are annotated (types ``name`` and ``email``); nothing in the bullets is."""
    max_chars = check_int("max_chars", max_chars, minimum=1)
    prefix = "Author: "
    author_line = f"{prefix}{entry.author} <{entry.email}>"
    head = f"{entry.package} ({entry.version}):"
    room = max_chars - len(author_line) - 1 - len(head) - 1
    body = _cut(entry.bullets(), room) if room > 0 else ""
    text = f"{author_line}\n{head}" + (f" {body}" if body else "")
    n0 = len(prefix)
    e0 = n0 + len(entry.author) + 2
    spans = ((n0, n0 + len(entry.author), "name"), (e0, e0 + len(entry.email), "email"))
    emails = tuple(dict.fromkeys(EMAIL_RE.findall(body)))
    return ChangelogRecord(text, spans, entry.package, entry.version, entry.author, entry.email, emails)


def changelog_records(changelogs: Iterable[tuple[str, str]], *, max_chars: int = DEFAULT_MAX_CHARS
                      ) -> list[ChangelogRecord]:  # fmt: skip
    """Records of ``(name, changelog text)`` pairs: the pairs sorted by name, entries in file order, an entry seen
    before (same package, version, author and date) kept once."""
    seen: set[tuple[str, str, str, str]] = set()
    out: list[ChangelogRecord] = []
    for _, text in sorted(changelogs, key=lambda p: p[0]):
        for e in parse_changelog(text):
            key = (e.package, e.version, e.author, e.date)
            if key in seen:
                continue
            seen.add(key)
            out.append(entry_record(e, max_chars=max_chars))
    return out


def _is_debian_changelog(text: str) -> bool:
    first = next((line for line in text.splitlines() if line.strip()), "")
    return _HEADER.match(first.rstrip()) is not None


def _gunzip(data: bytes, label: str) -> str:
    try:
        return gzip.decompress(data).decode("utf-8", errors="replace")
    except (OSError, EOFError) as exc:
        raise DataValidationError(f"{label} is not a readable gzip file ({exc})") from None


def local_changelogs(root: str | os.PathLike[str] = "/usr/share/doc") -> list[tuple[str, str]]:
    """``(package, changelog text)`` of every ``ROOT/<pkg>/changelog.Debian.gz`` (else a ``changelog.gz`` in
    Debian's format), sorted by package; a doc folder that is a link to another is read once (as the other)."""
    base = Path(root)
    if not base.is_dir():
        raise FileNotFoundError(f"source {str(root)!r} is not a folder")
    out: list[tuple[str, str]] = []
    seen: set[Path] = set()
    for folder in sorted(p for p in base.iterdir() if p.is_dir()):
        real = folder.resolve()
        if real in seen or folder.is_symlink():
            continue
        seen.add(real)
        for name, native_only in (("changelog.Debian.gz", False), ("changelog.gz", True)):
            path = folder / name
            if path.is_file() and not path.is_symlink():
                text = _gunzip(path.read_bytes(), str(path))
                if not native_only or _is_debian_changelog(text):
                    out.append((folder.name, text))
                    break
    return out


def deb_changelog(deb: str | os.PathLike[str] | bytes, *, label: str | None = None) -> str | None:
    """The Debian changelog inside a ``.deb`` (``usr/share/doc/<pkg>/changelog.Debian.gz``, else a
    ``changelog.gz`` in Debian's format), read in Python; None if it has neither (a link is not followed)."""
    files = deb_matching(deb, re.compile(r"usr/share/doc/[^/]+/changelog(\.Debian)?\.gz"), label=label)
    for path in sorted(files, key=lambda p: (not p.endswith(".Debian.gz"), p)):
        text = _gunzip(files[path], f"{label or 'the package'}: {path}")
        if path.endswith(".Debian.gz") or _is_debian_changelog(text):
            return text
    return None


def _deb_changelogs(debs: Sequence[Path]) -> list[tuple[str, str]]:
    out = []
    for deb in debs:
        text = deb_changelog(deb, label=deb.name)
        if text is not None:
            out.append((deb.name.split("_", 1)[0], text))
    return out


def changelogs_cache(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Where the corpus is kept: ``<cache>/debian-changelogs/changelogs.jsonl``."""
    return _cache_dir(cache_dir) / "debian-changelogs" / _FILE


def write_changelog_jsonl(records: Sequence[ChangelogRecord], path: str | os.PathLike[str]) -> str:
    """Write ``records`` atomically as annotated JSONL (one :meth:`ChangelogRecord.to_json` per line); its sha256."""
    text = _jsonl(records)
    atomic_write_text(path, text)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _jsonl(records: Sequence[ChangelogRecord]) -> str:
    return "".join(json.dumps(r.to_json(), ensure_ascii=False) + "\n" for r in records)


def read_changelog_jsonl(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The JSON objects of a corpus file (text, spans, package, version, bullet_emails), in order."""
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def corpus_stats(records: Sequence[ChangelogRecord] | Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Records, distinct authors (by email), the largest number of records of one author, bullet emails."""
    emails: list[str] = []
    bullet = 0
    for r in records:
        if isinstance(r, ChangelogRecord):
            emails.append(r.email)
            bullet += len(r.bullet_emails)
        else:
            span = next(s for s in r["spans"] if s["type"] == "email")
            emails.append(r["text"][span["start"]:span["end"]])
            bullet += len(r.get("bullet_emails") or [])
    counts = Counter(emails)
    top = counts.most_common(1)
    return {"records": len(records), "authors": len(counts), "largest_author_records": top[0][1] if top else 0,
            "bullet_emails": bullet}


def fetch_debian_changelogs(cache_dir: str | os.PathLike[str] | None = None, *,
                            source: str | os.PathLike[str] | None = None, max_chars: int = DEFAULT_MAX_CHARS,
                            force: bool = False, progress: bool | None = None) -> tuple[Path, dict[str, Any]]:
    """Build the corpus and write ``changelogs.jsonl`` (and ``provenance.json``) into the cache atomically.

    ``source``: None = the local ``/usr/share/doc``; ``"pinned"`` = :data:`PINNED_PACKAGES` via ``apt-get
    download`` (each .deb's sha256 checked); a folder = its ``.deb`` files, or a doc root. An existing corpus with
    different contents is kept unless ``force`` (ValueError); the same contents are left as they are. Returns the
    path and :func:`corpus_stats` with the source and the file's sha256.
    """
    max_chars = check_int("max_chars", max_chars, minimum=40)
    path = changelogs_cache(cache_dir)
    provenance: dict[str, Any] = {"max_chars": max_chars}
    if source is None:
        pairs = local_changelogs()
        provenance["source"] = "local /usr/share/doc (depends on the packages installed on this machine)"
    elif str(source) == "pinned":
        check_online("the pinned Debian changelogs", f"{CHANGELOGS_FETCH} --source pinned", path.parent)
        pairs = []
        with tempfile.TemporaryDirectory(prefix="featuredp-apt-") as tmp:
            for pkg in PINNED_PACKAGES:
                folder = Path(tmp) / pkg.name
                folder.mkdir()
                deb = apt_download(pkg, folder, what=f"{pkg.name} {pkg.version}", progress=progress,
                                   otherwise=f"download {pkg.url} into a folder DIR and run "
                                   f"`{CHANGELOGS_FETCH} --source DIR`")  # fmt: skip
                raw = deb.read_bytes()
                got = hashlib.sha256(raw).hexdigest()
                if got != pkg.sha256:
                    raise DataValidationError(f"{deb.name}: sha256 {got} is not the pinned {pkg.sha256}")
                text = deb_changelog(raw, label=deb.name)
                if text is not None:
                    pairs.append((pkg.name, text))
        provenance["source"] = (f"{len(PINNED_PACKAGES)} pinned Debian bookworm packages "
                                "(featuredp.data.changelogs.PINNED_PACKAGES, sha256 checked)")  # fmt: skip
        provenance["packages"] = [f"{p.name}={p.version}" for p in PINNED_PACKAGES]
    else:
        folder = Path(source)
        if not folder.is_dir():
            raise FileNotFoundError(f"--source {str(source)!r}: not a folder (give a doc root like /usr/share/doc, a "
                                    "folder of .deb files, or 'pinned')")  # fmt: skip
        debs = sorted(folder.glob("*.deb"))
        if debs:
            pairs = _deb_changelogs(debs)
            provenance["source"] = f"{len(debs)} .deb files in {folder}"
            provenance["debs"] = {d.name: hashlib.sha256(d.read_bytes()).hexdigest() for d in debs}
        else:
            pairs = local_changelogs(folder)
            provenance["source"] = f"doc root {folder}"
    records = changelog_records(pairs, max_chars=max_chars)
    if not records:
        raise DataValidationError(f"source {source or '/usr/share/doc'}: no Debian changelog entries found")
    text = _jsonl(records)
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    if path.exists() and not force:
        old = hashlib.sha256(path.read_bytes()).hexdigest()
        if old != digest:
            raise ValueError(f"{path} holds a different corpus (sha256 {old[:12]}…, this source gives "
                             f"{digest[:12]}…); pass --force to replace it")  # fmt: skip
    atomic_write_text(path, text)
    stats = {**corpus_stats(records), "changelogs": len(pairs), "sha256": digest, **provenance}
    atomic_write_json(path.with_name("provenance.json"), stats)
    return path, stats
