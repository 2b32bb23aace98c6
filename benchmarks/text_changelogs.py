"""Feature DP for text on REAL text: Debian changelog entries, real names and emails (issue 34, part E).

One command: (a) builds or locates the corpus (``featuredp data fetch debian-changelogs``: one record per changelog
entry, ``Author: NAME <EMAIL>`` annotated, names and emails inside the bullets NOT annotated); (b) runs
``featuredp compare --task text --data changelogs.jsonl --spans name,email --detect email`` at ε ∈ {1, 3, 8} with the
five methods (non-private, public = scrubbed only, DP-SGD, FDP (DP-SGD), FDP (Alg. 1)), passing ``--record-epsilon
E`` through only when given; (c) probes every trained model for real identities: greedy generation after
``Author: `` and after ``Author: A`` ... ``Author: Z`` (27 public prompts), each generated ``Name <email>`` compared
with the training authors (exact match of the name, of the email), with the number of training records of that
author (its group size: an identity repeated in hundreds of records is protected per record, not per person), and
whether the matched string also appears in the public view Ψ of some training record (a name in bullet text is not
annotated, so every method may learn it from Ψ); (d) writes ``changelogs.md`` and ``changelogs.json`` under --out.

``featuredp compare`` keeps no models, so the script runs compare in this process (``featuredp.cli.main``, the same
flags as on the command line) and keeps each model that compare's ``train_text_cell`` returns. A cell compare
reuses from an earlier run has no model here: run with a fresh --out (or --fresh) to probe every cell.

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/text_changelogs.py --quick --out results/text-changelogs

--quick: 800 training texts; without it 2,000. The quick run took 40 minutes on 2 cores shared with other jobs (load
about 10); its time on an idle machine is not measured (the target was 7 minutes, 15 without --quick).
Both use compare's ``--quick`` model (d = 64, 2 layers); 160 byte tokens per text; no canaries (``--canaries 0``:
the probe here is the real authors).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import string
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

import featuredp.experiments.text_lm as text_lm
from featuredp._io import atomic_write_json, atomic_write_text
from featuredp.cli import main as featuredp_main
from featuredp.data.changelogs import (
    DEFAULT_MAX_CHARS,
    changelogs_cache,
    corpus_stats,
    fetch_debian_changelogs,
    read_changelog_jsonl,
)
from featuredp.lm import lm_generator
from featuredp.methods import get_method

PROMPTS = ["Author: "] + [f"Author: {c}" for c in string.ascii_uppercase]
_IDENTITY = re.compile(r"^(?P<name>[^<\n]*?)\s*<(?P<email>[^<>\s]*)>")
LABELS = {"nonprivate": "non-private", "public": "public only", "dpsgd": "DP-SGD", "fdp_dpsgd": "FDP (DP-SGD)",
          "fdp": "FDP (Alg. 1)"}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The flags."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="results/text-changelogs")
    p.add_argument("--quick", action="store_true", help="800 training texts instead of 2,000")
    p.add_argument("--train-size", type=int, default=None, help="training texts (overrides --quick's)")
    p.add_argument("--source", default=None, help="corpus source: a doc root, a folder of .deb files, or 'pinned' "
                   "(default: this machine's /usr/share/doc)")  # fmt: skip
    p.add_argument("--rebuild", action="store_true", help="rebuild the cached corpus from --source")
    p.add_argument("--cache-dir", default=None)
    p.add_argument("--max-chars", type=int, default=DEFAULT_MAX_CHARS)
    p.add_argument("--max-len", type=int, default=160)
    p.add_argument("--epsilons", default="1,3,8")
    p.add_argument("--methods", default=",".join(text_lm.TEXT_METHODS))
    p.add_argument("--record-epsilon", default=None, metavar="E",
                   help="passed to compare as --record-epsilon E (only when given)")
    p.add_argument("--fresh", action="store_true", help="delete --out's compare cells first (so every model is "
                   "trained here and probed)")  # fmt: skip
    p.add_argument("--max-new-tokens", type=int, default=70)
    p.add_argument("--render-only", action="store_true", help="rewrite changelogs.md from --out's changelogs.json")
    p.add_argument("--file-order", action="store_true", help="train on the corpus in file order (packages "
                   "alphabetically, entries newest first); default: a copy shuffled with the public seed 0, so that "
                   "--text-train-size's first N texts are a uniform sample rather than the first packages")
    return p.parse_args(argv)


def corpus(args: argparse.Namespace) -> tuple[Path, dict[str, Any]]:
    """The cached corpus (built from --source if missing or --rebuild) and its stats."""
    path = changelogs_cache(args.cache_dir)
    if args.rebuild or not path.exists():
        fetch_debian_changelogs(args.cache_dir, source=args.source, max_chars=args.max_chars, force=args.rebuild)
    rows = read_changelog_jsonl(path)
    prov = path.with_name("provenance.json")
    meta = json.loads(prov.read_text()) if prov.exists() else {}
    return path, {**meta, **corpus_stats(rows)}


def identity(generated: str) -> tuple[str, str | None]:
    """(name, email or None) of the first line of a generation after ``Author: ``."""
    line = generated.split("\n", 1)[0]
    m = _IDENTITY.match(line)
    if m:
        return m["name"].strip(), m["email"]
    return line.strip(), None


def probe(model: Any, data: text_lm.TextData, *, max_new_tokens: int) -> dict[str, Any]:
    """Greedy ``Author: `` generations of ``model`` against the training authors (exact matches, group sizes)."""
    train = data.originals
    names: Counter[str] = Counter()
    emails: Counter[str] = Counter()
    pairs: set[tuple[str, str]] = set()
    public_text: list[str] = []
    for r in train:
        nm, em = r.values("name")[:1], r.values("email")[:1]
        if nm:
            names[nm[0]] += 1
        if em:
            emails[em[0]] += 1
        if nm and em:
            pairs.add((nm[0], em[0]))
        public_text.append(data.psi(r.text, r.spans))
    public = "\n".join(public_text)
    generate = lm_generator(model, data.train.tokenizer, data.train.max_len)
    rows: list[dict[str, Any]] = []
    for prompt in PROMPTS:
        out = generate(prompt, max_new_tokens)
        name, email = identity(prompt[len("Author: "):] + out)
        rows.append({"prompt": prompt, "generated": out.split("\n", 1)[0], "name": name, "email": email,
                     "name_match": name in names, "email_match": email is not None and email in emails,
                     "pair_match": email is not None and (name, email) in pairs,
                     "name_records": names.get(name, 0), "email_records": emails.get(email or "", 0),
                     "name_in_public_view": bool(name) and name in public,
                     "email_in_public_view": bool(email) and (email or "") in public})  # fmt: skip
    got_names: set[str] = {r["name"] for r in rows if r["name_match"]}
    got_emails: set[str] = {r["email"] for r in rows if r["email_match"]}
    return {
        "prompts": len(rows), "distinct_identities": len({(r["name"], r["email"]) for r in rows}),
        "names_matched": sorted(got_names), "emails_matched": sorted(got_emails),
        "pairs_matched": sorted({f"{r['name']} <{r['email']}>" for r in rows if r["pair_match"]}),
        "group_sizes": sorted({names[n] for n in got_names} | {emails[e] for e in got_emails}, reverse=True),
        "matched_only_in_private_spans": sorted({r["name"] for r in rows if r["name_match"]
                                                 and not r["name_in_public_view"]}
                                                | {r["email"] for r in rows if r["email_match"]
                                                   and not r["email_in_public_view"]}),
        "generations": rows,
    }  # fmt: skip


def run_compare(args: argparse.Namespace, data_path: Path, out: Path, n_train: int
                ) -> tuple[dict[tuple[str, float | None, float | None], Any], Any]:  # fmt: skip
    """``featuredp compare --task text`` in this process; the models its cells trained, and the data."""
    models: dict[tuple[str, float | None, float | None], Any] = {}
    seen: dict[str, Any] = {}
    original = text_lm.train_text_cell

    def keep(*a: Any, **kw: Any) -> Any:
        row, model = original(*a, **kw)
        models[(kw["method"], kw["epsilon"], kw.get("record_epsilon"))] = model
        seen["data"] = kw["data"]
        return row, model

    argv = ["compare", "--task", "text", "--quick", "--data", str(data_path), "--spans", "name,email",
            "--detect", "email", "--epsilons", args.epsilons, "--methods", args.methods, "--out", str(out),
            "--max-len", str(args.max_len), "--text-train-size", str(n_train), "--canaries", "0"]  # fmt: skip
    if args.record_epsilon is not None:
        argv += ["--record-epsilon", str(args.record_epsilon)]
    print("running: featuredp " + " ".join(argv), file=sys.stderr, flush=True)
    text_lm.train_text_cell = keep
    try:
        rc = featuredp_main(argv)
    finally:
        text_lm.train_text_cell = original
    if rc:
        raise SystemExit(f"featuredp compare failed (exit {rc})")
    if "data" not in seen:  # every cell reused: rebuild the data to describe it
        opts = json.loads((out / "grid.json").read_text())["load"]
        seen["data"] = text_lm.load_text_data(**opts)
    return models, seen["data"]


def render(corpus_path: Path, stats: dict[str, Any], summary: dict[str, Any], probes: dict[str, Any],
           command: str, wall: float) -> str:  # fmt: skip
    """The Markdown report."""
    lines = ["# Feature DP on real text: Debian changelogs (real names and emails)", "",
             f"* Corpus: `{corpus_path.name}` from {stats.get('source', '?')}: {stats['records']:,} records, "
             f"{stats['authors']:,} distinct authors (by email), at most {stats['largest_author_records']:,} records "
             f"by one author, {stats['bullet_emails']} emails inside bullet texts (regex ground truth, not "
             f"annotated); sha256 `{stats.get('sha256', '?')}`.",
             f"* Compare data: {summary['meta']['source']}. Private: {summary['meta']['disclosure']}.",
             f"* Command: `{command}` ({wall / 60:.1f} min).", "",
             "| method | ε | ε spent | replacement ε | record ε | perplexity ↓ | extraction train / held-out | span "
             "inference (prior) | `Author:` names matched | emails matched | name+email pairs | group sizes of "
             "matches | matched only via private spans |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in summary["rows"]:
        eps, backstop = r["epsilon"], r.get("backstop")
        key = f"{r['method']}@{eps}" + ("" if backstop is None else f"+E{backstop:g}")
        p = probes.get(key)
        ex = r["extraction"]
        si = r.get("span_inference") or {}
        spent = "—" if r["epsilon_spent"] is None else f"{r['epsilon_spent']:.3f}"
        acc = "—" if not si else f"{100 * si['accuracy']:.1f}% ({100 * si['prior']:.1f}%)"
        if p is None:
            probe_cells = ["not probed (cell reused)"] + [""] * 4
        else:
            probe_cells = [f"{len(p['names_matched'])} of {p['prompts']}", str(len(p["emails_matched"])),
                           str(len(p["pairs_matched"])), ", ".join(map(str, p["group_sizes"])) or "—",
                           ", ".join(p["matched_only_in_private_spans"]) or "—"]  # fmt: skip
        label = LABELS.get(r["method"], r["method"]) + ("" if backstop is None else f" + backstop E={backstop:g}")
        extra = " | ".join("—" if r.get(k) is None else f"{r[k]:.3f}"
                           for k in ("replacement_epsilon_spent", "record_epsilon"))  # fmt: skip
        lines.append(f"| {label} | {'—' if eps is None else f'{eps:g}'} | {spent} | {extra} | "
                     f"{r['perplexity']:.2f} | {100 * (ex['rate'] or 0):.1f}% / {100 * (ex['heldout_rate'] or 0):.1f}%"
                     f" | {acc} | " + " | ".join(probe_cells) + " |")  # fmt: skip
    lines += ["", "Perplexity: held-out full texts. Extraction and span inference: compare's audits of the annotated "
              "spans (name, email). `Author:` probe: greedy generation after `Author: ` and `Author: A` … `Author: Z`"
              " (27 prompts); a generated name or email counts if it equals a training author's exactly; group size ="
              " the training records of that author (a person with hundreds of uploads is protected per record, not "
              "per person: feature DP bounds what one record's spans change). \"Matched only via private spans\": "
              "the matched string occurs nowhere in the public view Ψ of the training records (names in bullet text "
              "are not annotated, so a model may learn them from Ψ legitimately).", ""]  # fmt: skip
    for key, p in probes.items():
        shown = [g for g in p["generations"] if g["name_match"] or g["email_match"]][:6]
        if shown:
            lines.append(f"* {key}: " + "; ".join(f"`{g['prompt']}` → `{g['generated'][:60]}`" for g in shown))
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Build the corpus, run compare, probe the models, write the report."""
    args = parse_args(argv)
    t0 = time.perf_counter()
    out = Path(args.out)
    if args.render_only:
        saved = json.loads((out / "changelogs.json").read_text())
        summary = json.loads((out / "compare" / "results.json").read_text())
        corpus_info = dict(saved["corpus"])
        text = render(Path(corpus_info.pop("path")), corpus_info, summary, saved["probes"], saved["command"],
                      saved["wall_s"])  # fmt: skip
        atomic_write_text(out / "changelogs.md", text)
        print(text)
        return 0
    out.mkdir(parents=True, exist_ok=True)
    data_path, stats = corpus(args)
    print(f"corpus {data_path}: {stats['records']:,} records, {stats['authors']:,} authors, largest "
          f"{stats['largest_author_records']:,}", file=sys.stderr, flush=True)
    n_train = args.train_size or (800 if args.quick else 2000)
    if not args.file_order:  # a public permutation: the corpus is public Debian text, its order is no secret
        lines = [ln for ln in data_path.read_text(encoding="utf-8").splitlines() if ln.strip()]
        order = np.random.default_rng(0).permutation(len(lines))
        data_path = data_path.with_name("changelogs-shuffled.jsonl")  # in the cache, beside the corpus
        atomic_write_text(data_path, "".join(lines[int(i)] + "\n" for i in order))
    compare_out = out / "compare"
    if args.fresh and (compare_out / "cells").exists():
        shutil.rmtree(compare_out / "cells")
    models, data = run_compare(args, data_path, compare_out, n_train)
    summary = json.loads((compare_out / "results.json").read_text())
    probes: dict[str, Any] = {}
    for (method, eps, backstop), model in models.items():
        arm = "" if backstop is None else f"+E{backstop:g}"
        key = f"{method}@{eps if get_method(method).private else None}{arm}"
        probes[key] = probe(model, data, max_new_tokens=args.max_new_tokens)
        print(f"probe {key}: names {probes[key]['names_matched']}, emails {probes[key]['emails_matched']}",
              file=sys.stderr, flush=True)
    command = "python benchmarks/text_changelogs.py " + " ".join(sys.argv[1:] if argv is None else argv)
    wall = time.perf_counter() - t0
    atomic_write_json(out / "changelogs.json", {"corpus": {"path": str(data_path), **stats}, "n_train": n_train,
                                                "command": command, "wall_s": round(wall, 1),
                                                "compare": summary["rows"], "probes": probes})  # fmt: skip
    atomic_write_text(out / "changelogs.md", render(data_path, stats, summary, probes, command, wall))
    print((out / "changelogs.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
