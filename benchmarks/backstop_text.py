"""The record-level backstop on text: what ``--record-epsilon E`` costs in perplexity and buys against missed PII.

On the generated support corpus (the quick text preset's data and model), a "missed" canary — a phone-like
secret in text that no span marks (``insert_canaries(..., span_type=None)``), so Ψ leaves it public like PII
that no annotation or detector finds — is planted ``--repeats`` times. Each arm trains at FDP ε = 3 without and
with the backstop at E ∈ ``--record-epsilons`` and reports held-out perplexity, the record ε, and the missed
canaries' exposure (bits; log2 10⁴ = 13.3 is full memorisation, about 1.44 is chance). Usage::

    OMP_NUM_THREADS=1 python benchmarks/backstop_text.py                 # the table in docs/text.md
    OMP_NUM_THREADS=1 python benchmarks/backstop_text.py --json

One seed per arm (the private noise is fresh OS entropy): differences below a few tenths of perplexity are noise.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import numpy as np
import torch

from featuredp.attacks.text import digit_candidates, exposure_report
from featuredp.data.text import TextDataset, insert_canaries
from featuredp.experiments.text_lm import load_text_data, text_preset, train_text_model
from featuredp.lm import lm_scorer, perplexity


def main() -> None:
    """Train the arms and print the table (or JSON)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", default="fdp_dpsgd,fdp")
    ap.add_argument("--epsilon", type=float, default=3.0)
    ap.add_argument("--record-epsilons", default="4,8,16")
    ap.add_argument("--repeats", type=int, default=20, help="copies of each missed canary (default 20)")
    ap.add_argument("--canaries", type=int, default=2, help="missed canaries (default 2)")
    ap.add_argument("--epochs", type=float, default=2.0, help="private epochs and pre-training epochs (default 2)")
    ap.add_argument("--n-train", type=int, default=1000)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    preset = text_preset(True)
    load = {**preset["load"], "n_train": args.n_train, "canary_repeats": []}
    data = load_text_data(**load)
    recs, missed = insert_canaries(data.train.records, repeats=(args.repeats,), per_repeat=args.canaries,
                                   rng=np.random.default_rng(7), template="call me on {secret} anytime",
                                   span_type=None)  # fmt: skip
    data.train = TextDataset(recs, data.psi, tokenizer=data.train.tokenizer, max_len=data.train.max_len,
                             name="text-train")  # fmt: skip
    cands = digit_candidates(len(missed[0].secret))
    rows: list[dict[str, Any]] = []
    started = time.perf_counter()
    for method in args.methods.split(","):
        params = {**preset["methods"][method], "epochs": args.epochs}
        if "pretrain_epochs" in params:
            params["pretrain_epochs"] = args.epochs
        for e in [None, *(float(x) for x in args.record_epsilons.split(","))]:
            extra = {} if e is None else {"record_epsilon": e}
            done = train_text_model(data=data, method=method, epsilon=args.epsilon, delta=preset["delta"], seed=0,
                                    model=preset["model"], params=params, **extra)  # fmt: skip
            model = done.model.eval()
            rep = exposure_report(lm_scorer(model, data.train.tokenizer, data.train.max_len), missed, cands)
            rows.append({"method": method, "record_epsilon_target": e, "epsilon": done.result.epsilon,
                         "record_epsilon": done.result.record_epsilon,
                         "sigma_pub": done.result.plan.record_noise_multiplier,
                         "perplexity": perplexity(model, data.test.batch()),
                         "missed_exposure": rep["mean_exposure"], "train_wall_s": round(done.wall_s, 1)})  # fmt: skip
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)  # each arm as it finishes
    total = round(time.perf_counter() - started, 1)
    if args.json:
        print(json.dumps({"rows": rows, "wall_s": total, "settings": vars(args)}, indent=2))
        return
    print(f"{data.source}; {args.canaries} missed canaries × {args.repeats} (unmarked: public in Ψ); "
          f"{args.epochs:g} epochs; ε = {args.epsilon:g}; {total:.0f} s")
    print("| method | backstop E | ε (FDP) | record ε | σ_pub | held-out perplexity | missed-canary exposure (bits) |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        rec = "—" if r["record_epsilon"] is None else f"{r['record_epsilon']:.2f}"
        sig = "—" if r["sigma_pub"] is None else f"{r['sigma_pub']:.2f}"
        e = "none" if r["record_epsilon_target"] is None else f"{r['record_epsilon_target']:g}"
        print(f"| {r['method']} | {e} | {r['epsilon']:.2f} | {rec} | {sig} | {r['perplexity']:.2f} "
              f"| {r['missed_exposure']:.2f} |")


if __name__ == "__main__":
    main()
