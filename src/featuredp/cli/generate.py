"""``featuredp generate``: text from a trained text run's model (``featuredp train --task text``).

Greedy by default, or ``--samples N`` draws at ``--temperature T`` from the public ``--seed``: the model is what the
run released, so generating from it reads nothing private. What it writes may still reveal what the model learnt
(that is what the audits measure): for example ``--prompt "Author: "`` on a commit log.
"""

from __future__ import annotations

import argparse
import json
from typing import Any


def register(subparsers: Any) -> None:
    """Add the ``generate`` parser."""
    p = subparsers.add_parser(
        "generate", help="generate text from a trained text run's model",
        description="Continue each --prompt with the model of a text run (featuredp train --task text): greedy, or "
        "--samples draws at --temperature from the public --seed.",
    )  # fmt: skip
    p.add_argument("--run", required=True, metavar="DIR", help="the run folder (featuredp train --task text --out)")
    p.add_argument("--prompt", action="append", required=True, metavar="TEXT",
                   help="a prompt (repeat for several)")  # fmt: skip
    p.add_argument("--max-new-tokens", type=int, default=60, help="tokens (bytes) per continuation (default 60)")
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default); > 0: sample")
    p.add_argument("--samples", type=int, default=1, help="continuations per prompt (needs --temperature > 0)")
    p.add_argument("--seed", type=int, default=0, help="the sampling seed (public; default 0)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Generate and print."""
    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if not args.temperature >= 0.0:
        raise ValueError(f"--temperature must be >= 0, got {args.temperature}")
    from featuredp.experiments.text_runs import generate_text

    out = generate_text(args.run, args.prompt, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                        samples=args.samples, seed=args.seed)  # fmt: skip
    if args.json:
        print(json.dumps({"run": args.run, "temperature": args.temperature, "generations": out}))
        return 0
    for item in out:
        for text in item["continuations"]:
            print(f"{item['prompt']!r} → {item['prompt'] + text!r}")
    return 0
