"""Record level against user level on real text: does user-level privacy stop a frequent author's name (issue 44)?

The corpus is ``featuredp data fetch debian-changelogs`` (this machine's /usr/share/doc; each record an
``Author: NAME <EMAIL>`` line and one changelog entry, the name and email annotated private; ``author`` = the email,
the user of ``--user-field author``). The records are shuffled with a public seed and split 90/10; the first
``--train-size`` of the training part are trained on, so every author keeps a share of their records.

Arms, each trained through ``featuredp.experiments.text_lm.train_text_model`` (the code of ``featuredp train --task
text``; the quick text preset's model and schedule, tuned alike for both units):

* non-private;
* for each ε of ``--epsilons`` and each method of ``--methods``: record level, and user level (``--user-field
  author --records-per-user K``: users Poisson-sampled, each user's records summed and clipped as one).

Each model is probed for real identities: greedy continuations of ``Author: `` and ``Author: A`` .. ``Author: Z``
(27 prompts) and ``--samples`` sampled continuations of ``Author: `` (temperature 1, a public seed). A generated
name is compared with the training authors' names exactly, and in fragments: every word of 3+ letters of a
training author's name that occurs in NO training record's public view Ψ (so it can only have been learnt from the
private spans) and appears in a generation. Each hit is reported with the number of training records of its author
(the group size). The held-out perplexity is the cost.

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/user_level_changelogs.py --out results/user-level-changelogs

Writes ``user_level.md`` and ``user_level.json`` under --out (about 40 minutes on the 2 CPU cores here).
"""

from __future__ import annotations

import argparse
import json
import re
import string
import sys
import time
import warnings
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

import featuredp.experiments.text_lm as text_lm
from featuredp._io import atomic_write_json, atomic_write_text
from featuredp.data.changelogs import changelogs_cache, fetch_debian_changelogs
from featuredp.experiments.text_data import TextData, load_text_data
from featuredp.lm import lm_generator, perplexity

PROMPTS = ["Author: "] + [f"Author: {c}" for c in string.ascii_uppercase]
_WORD = re.compile(r"[^\W\d_]{3,}")
BUCKETS = ((1, 9), (10, 99), (100, 10**9))


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The flags."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="results/user-level-changelogs")
    p.add_argument("--train-size", type=int, default=5000)
    p.add_argument("--test-size", type=int, default=500)
    p.add_argument("--epsilons", default="3,8")
    p.add_argument("--methods", default="fdp,dpsgd")
    p.add_argument("--records-per-user", type=int, default=8)
    p.add_argument("--units", default="record,user", help="the arms' units (non-private runs with 'record' only)")
    p.add_argument("--user-epochs", type=float, default=None,
                   help="epochs of the user-level arms (default: the preset's, as at record level)")
    p.add_argument("--samples", type=int, default=30)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--seed", type=int, default=0, help="public: the shuffle, the model's init, the samples")
    p.add_argument("--render-only", action="store_true", help="write the .md again from the .json in --out")
    return p.parse_args(argv)


def shuffled_corpus(out: Path, seed: int) -> Path:
    """The cached corpus (fetched from this machine's docs if missing), its lines shuffled with a public seed."""
    path = changelogs_cache()
    if not path.exists():
        fetch_debian_changelogs()
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if '"author"' not in lines[0]:  # a corpus cached before records named their author
        fetch_debian_changelogs(force=True)
        lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    order = np.random.default_rng(seed).permutation(len(lines))
    shuffled = out / "corpus.shuffled.jsonl"  # removed when the run is done: the corpus stays in the cache only
    atomic_write_text(shuffled, "".join(lines[i] + "\n" for i in order))
    return shuffled


def author_tables(data: TextData) -> dict[str, Any]:
    """The training authors' names and emails with their record counts, and the name words that occur in no public
    view (only the private spans can teach them)."""
    names: Counter[str] = Counter()
    emails: Counter[str] = Counter()
    public_words: set[str] = set()
    for r in data.originals:
        nm, em = r.values("name")[:1], r.values("email")[:1]
        if nm:
            names[nm[0]] += 1
        if em:
            emails[em[0]] += 1
        public_words.update(_WORD.findall(data.psi(r.text, r.spans)))
    public_words.update(_WORD.findall(" ".join(PROMPTS)))
    private_words: dict[str, list[str]] = {}
    for name in names:
        for w in set(_WORD.findall(name)):
            if w not in public_words:
                private_words.setdefault(w, []).append(name)
    return {"names": names, "emails": emails, "private_words": private_words}


def probe(model: torch.nn.Module, data: TextData, tables: dict[str, Any], *, samples: int, max_new_tokens: int,
          seed: int) -> dict[str, Any]:  # fmt: skip
    """The identities ``model`` writes after ``Author: ``: exact names and emails, private name fragments, each with
    its author's group size."""
    tok, max_len = data.train.tokenizer, data.train.max_len
    greedy = lm_generator(model, tok, max_len)
    sampled = lm_generator(model, tok, max_len, temperature=1.0, generator=torch.Generator().manual_seed(seed))
    outputs = [(p, greedy(p, max_new_tokens)) for p in PROMPTS]
    outputs += [(PROMPTS[0], sampled(PROMPTS[0], max_new_tokens)) for _ in range(samples)]
    names, emails, private_words = tables["names"], tables["emails"], tables["private_words"]
    exact_names: set[str] = set()
    exact_emails: set[str] = set()
    fragments: dict[str, list[str]] = {}
    for prompt, out in outputs:
        line = (prompt[len("Author: "):] + out).split("\n", 1)[0]
        name = line.split("<", 1)[0].strip()
        if name in names:
            exact_names.add(name)
        for em in re.findall(r"<([^<>\s]+)>", line):
            if em in emails:
                exact_emails.add(em)
        for w in set(_WORD.findall(line)):
            if w in private_words:
                fragments[w] = private_words[w]
    hit_authors = {a for owners in fragments.values() for a in owners} | exact_names
    top_name, top_count = names.most_common(1)[0]
    return {
        "generations": len(outputs),
        "exact_names": sorted(exact_names), "exact_emails": sorted(exact_emails),
        "fragments": sorted(fragments),
        "authors_hit": sorted(hit_authors, key=lambda a: -names[a]),
        "group_sizes_hit": sorted((names[a] for a in hit_authors), reverse=True),
        "by_group_size": {f"{lo}-{hi if hi < 10**9 else ''}": [sum(1 for a in hit_authors if lo <= names[a] <= hi),
                                                               sum(1 for c in names.values() if lo <= c <= hi)]
                          for lo, hi in BUCKETS},
        "most_frequent_author_hit": top_name in hit_authors, "most_frequent_author_records": top_count,
        "sample_lines": [(p + o).split("\n", 1)[0] for p, o in outputs[:6]],
    }  # fmt: skip


def train_arm(data: TextData, method: str, epsilon: float | None, unit: str, k: int, seed: int,
              user_epochs: float | None = None) -> dict[str, Any]:  # fmt: skip
    """One arm: the model and its facts (ε, σ, rate, steps, wall time, held-out perplexity)."""
    preset = text_lm.text_preset(True)
    params = dict(preset["methods"][method])
    data.options.pop("user_field", None)
    settings: dict[str, Any] = {}
    if unit == "user":
        data.options["user_field"] = "author"
        settings = {"records_per_user": k}
        if user_epochs is not None:
            params["epochs"] = user_epochs
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the counted number of users: known here, it is this benchmark's data
        done = text_lm.train_text_model(data=data, method=method, epsilon=epsilon, delta=1e-5, seed=seed,
                                        model=preset["model"], params=params, **settings)  # fmt: skip
    plan = done.result.plan
    return {
        "model": done.model, "method": method, "unit": unit, "target_epsilon": epsilon, "epsilon": done.epsilon,
        "noise_multiplier": plan.noise_multiplier, "sampling_rate": plan.sampling_rate, "steps": done.result.steps,
        "units": plan.dataset_size, "records_per_user": plan.records_per_user,
        "wall_s": round(time.perf_counter() - t0, 1),
        "perplexity": perplexity(done.model, data.test.batch()), "guarantee": done.result.guarantee,
    }  # fmt: skip


def render(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    """The markdown report."""
    lines = [
        "# Record level against user level on Debian changelogs (issue 44)", "",
        f"{meta['train']:,} training texts by {meta['authors']} authors (largest: {meta['largest']} records), "
        f"{meta['test']:,} held-out texts; name and email private; {meta['prompts']} greedy and {meta['samples']} "
        f"sampled continuations of `Author: ` per model; user level with at most {meta['k']} records per user "
        f"per step ({meta.get('user_epochs') or 4:g} epochs, as the quick text preset's at record level). Command: "
        f"`{meta['command']}`.", "",
        "| arm | ε | σ | rate | steps | held-out ppl | exact names | exact emails | private name fragments | "
        "authors hit (their records) | most frequent author hit | s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        p = r["probe"]
        eps = "—" if r["epsilon"] is None else f"{r['epsilon']:.3g}"
        sigma = "—" if r["noise_multiplier"] is None else f"{r['noise_multiplier']:.3g}"
        hit = ", ".join(str(c) for c in p["group_sizes_hit"][:8]) or "none"
        lines.append(f"| {r['label']} | {eps} | {sigma} | {r['sampling_rate']:.3g} | {r['steps']} | "
                     f"{r['perplexity']:.2f} | {len(p['exact_names'])} | {len(p['exact_emails'])} | "
                     f"{len(p['fragments'])} | {len(p['authors_hit'])} ({hit}) | "
                     f"{'yes' if p['most_frequent_author_hit'] else 'no'} | {r['wall_s']:.0f} |")  # fmt: skip
    lines += ["", "Authors hit by group size (hit / authors in the bucket):", "",
              "| arm | " + " | ".join(f"{k} records" for k in rows[0]["probe"]["by_group_size"]) + " |",
              "|---|" + "---|" * len(rows[0]["probe"]["by_group_size"])]
    for r in rows:
        cells = [f"{a}/{b}" for a, b in r["probe"]["by_group_size"].values()]
        lines.append(f"| {r['label']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def rerender(out: Path) -> None:
    """Write ``user_level.md`` again from ``user_level.json`` (the arms' labels with their ε)."""
    saved = json.loads((out / "user_level.json").read_text(encoding="utf-8"))
    for r in saved["rows"]:
        if r["method"] != "nonprivate":
            r["label"] = f"{r['method']}, {r['unit']} level, ε = {r['target_epsilon']:g}"
    atomic_write_text(out / "user_level.md", render(saved["rows"], saved["meta"]))


def main(argv: Sequence[str] | None = None) -> int:
    """Train every arm, probe it, write the report."""
    args = parse_args(argv)
    if args.render_only:
        rerender(Path(args.out))
        return 0
    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    corpus = shuffled_corpus(out, args.seed)
    data = load_text_data(path=corpus, spans=["name", "email"], user_field="author", n_train=args.train_size,
                          n_test=args.test_size, max_len=160, canary_repeats=(), corpus_seed=args.seed)  # fmt: skip
    tables = author_tables(data)
    users = Counter(data.users or [])
    units = args.units.split(",")
    arms: list[tuple[str, float | None, str]] = [("nonprivate", None, "record")] if "record" in units else []
    for eps in (float(e) for e in args.epsilons.split(",")):
        for method in args.methods.split(","):
            arms += [(method, eps, unit) for unit in units]
    rows = []
    for method, eps, unit in arms:
        row = train_arm(data, method, eps, unit, args.records_per_user, args.seed, args.user_epochs)
        model = row.pop("model")
        row["label"] = method if method == "nonprivate" else f"{method}, {unit} level, ε = {eps:g}"
        row["probe"] = probe(model, data, tables, samples=args.samples, max_new_tokens=args.max_new_tokens,
                             seed=args.seed)  # fmt: skip
        rows.append(row)
        print(f"{row['label']} ε={eps}: ppl {row['perplexity']:.2f}, fragments {row['probe']['fragments']}, "
              f"hit {row['probe']['group_sizes_hit'][:8]} ({row['wall_s']:.0f} s)", file=sys.stderr, flush=True)
    meta = {"train": len(data.train), "test": len(data.test), "authors": len(users),
            "largest": max(users.values()), "prompts": len(PROMPTS), "samples": args.samples,
            "k": args.records_per_user, "private_name_words": len(tables["private_words"]),
            "user_epochs": args.user_epochs,
            "command": "OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/user_level_changelogs.py "
                       + " ".join(argv if argv is not None else sys.argv[1:])}  # fmt: skip
    atomic_write_json(out / "user_level.json", {"meta": meta, "rows": rows})
    atomic_write_text(out / "user_level.md", render(rows, meta))
    corpus.unlink(missing_ok=True)
    print(render(rows, meta))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
