"""The text task's flags (``--task text`` of ``compare`` and ``train``): the data, the private spans, the canaries.

Torch-free: building the parser never imports the training code; :func:`text_data_options` checks the values
(one line naming the flag) before any work.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

#: the built-in span detectors (``--detect``): :data:`featuredp.features.text.DETECTORS`, repeated here so that
#: building the parser stays light
DETECTOR_NAMES = ("email", "iban", "card", "ssn", "date", "phone", "number", "name")


def _list(text: str) -> list[str]:
    items = [v.strip() for v in text.split(",") if v.strip()]
    if not items:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {text!r}")
    return items


def _counts(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    return values


def add_text_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``text`` argument group: --spans, --detect, --names-file, --max-len, --text-train-size, --canaries,
    --user-field, --records-per-user, --num-users, --group-stats (train only)."""
    g = parser.add_argument_group(
        "text (--task text; docs/text.md)",
        "a causal LM on texts whose private spans are protected: --data FILE.jsonl (one {\"text\", \"spans\": "
        "[{\"start\", \"end\", \"type\"}]} per line) --spans email,phone,name, or the generated support corpus "
        "without --data",
    )
    g.add_argument("--spans", type=_list, default=None, metavar="T1,T2",
                   help="the private span types (with --data: required, each annotated in the file or a built-in "
                   "detector; default for the generated corpus: all of name,email,phone,card,address,date,number)")
    g.add_argument("--detect", type=_list, default=[], metavar="D1,D2",
                   help=f"built-in detectors to run as well ({','.join(DETECTOR_NAMES)}); each must be in --spans. "
                   "A span no annotation marks and no detector finds is public")
    g.add_argument("--names-file", default=None, metavar="FILE",
                   help="one name per line, for --detect name")
    # --test-data (the data flags): a JSONL of held-out texts, so held-out metrics are not computed on --data
    g.add_argument("--max-len", type=int, default=None, help="tokens per text (UTF-8 bytes + specials; default 128)")
    g.add_argument("--text-train-size", type=int, default=None, metavar="N",
                   help="use the first N training texts (default: the preset's for the corpus, all of --data)")
    g.add_argument("--canaries", type=_counts, default=None, metavar="R1,R2",
                   help="plant the exposure audit's canaries this many times each (compare: default 1,10,100; "
                   "train: none unless given; 0: none). They are private spans of type 'secret' from a public seed")
    g.add_argument("--user-field", default=None, metavar="F",
                   help="user-level privacy (docs/users.md): the JSON field naming each record's user (e.g. author); "
                   "users are sampled, each user's records clipped as one, and ε covers a whole user. See the "
                   "records per user with featuredp data scan --user-field F")
    g.add_argument("--records-per-user", type=int, default=None, metavar="K",
                   help="with --user-field: the most records of one sampled user in a step (a secret random subset "
                   "of a larger user's; default: all). It changes speed and utility, not ε")
    g.add_argument("--num-users", type=int, default=None, metavar="U",
                   help="with --user-field: the number of users, when it is public (else it is counted from the data "
                   "and a PrivacyLeakWarning says so)")
    g.add_argument("--group-stats", action="store_true",
                   help="train only: also print which private values repeat across training records (the largest "
                   "repeat per type) and the group ε of such a value. These numbers read the private values, are not "
                   "covered by ε and are printed only (run.json records that they were asked for, not them)")


def read_names(path: str) -> list[str]:
    """The names of a ``--names-file`` (one per line, blank lines skipped); a missing file is a one-line error."""
    names_path = Path(path)
    if not names_path.is_file():
        raise ValueError(f"--names-file: no file {path!r}")
    return [n.strip() for n in names_path.read_text(encoding="utf-8").splitlines() if n.strip()]


def text_data_options(args: argparse.Namespace, *, train: bool = False) -> dict[str, Any]:
    """``load_text_data`` keyword arguments from the flags, each checked with a one-line error naming it.

    ``train``: the caller is ``train --task text``, the one command that takes ``--group-stats`` (read from
    ``args`` by the caller, never part of these options); elsewhere the flag is refused."""
    if getattr(args, "group_stats", False) and not train:
        raise ValueError("--group-stats is for train --task text (it prints statistics of the private values)")
    return {**_file_options(args), **_span_options(args), **_size_options(args), **_canary_options(args),
            **_user_options(args)}


def _user_options(args: argparse.Namespace) -> dict[str, Any]:
    """``user_field`` (--user-field, for --data); --records-per-user and --num-users need it (they go to the
    Trainer: :func:`user_settings`)."""
    field = getattr(args, "user_field", None)
    for flag, name in (("--records-per-user", "records_per_user"), ("--num-users", "num_users")):
        value = getattr(args, name, None)
        if value is not None and field is None:
            raise ValueError(f"{flag} {value} is for user-level privacy: give --user-field F too")
        if value is not None and value < 1:
            raise ValueError(f"{flag} must be >= 1, got {value}")
    if field is None:
        return {}
    if getattr(args, "data", None) is None:
        raise ValueError("--user-field: give --data FILE.jsonl whose records name their users (the generated corpus "
                         "has none)")  # fmt: skip
    return {"user_field": field}


def user_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The Trainer's user-level settings from --records-per-user and --num-users (checked by
    :func:`text_data_options`)."""
    return {name: getattr(args, name) for name in ("records_per_user", "num_users")
            if getattr(args, name, None) is not None}


def _file_options(args: argparse.Namespace) -> dict[str, Any]:
    """``path`` (--data, which then needs --spans) and ``test`` (--test-data, which needs --data)."""
    opts: dict[str, Any] = {}
    data = getattr(args, "data", None)
    if data is not None:
        path = Path(data)
        if not path.is_file():
            raise ValueError(f"--data: no file {data!r}")
        if not args.spans:
            raise ValueError("--spans: name the private span types of --data (e.g. --spans email,phone,name)")
        opts["path"] = str(path)
    test_data = getattr(args, "test_data", None)
    if test_data is not None:
        if data is None:
            raise ValueError("--test-data: give --data FILE.jsonl too (the generated corpus has its own held-out "
                             "split)")  # fmt: skip
        if not Path(test_data).is_file():
            raise ValueError(f"--test-data: no file {test_data!r}")
        opts["test"] = str(Path(test_data))
    return opts


def _span_options(args: argparse.Namespace) -> dict[str, Any]:
    """``spans``, ``detect`` (each a built-in detector of a private type) and ``names`` (--names-file, for
    --detect name)."""
    opts: dict[str, Any] = {}
    if args.spans:
        opts["spans"] = list(args.spans)
    for d in args.detect:
        if d not in DETECTOR_NAMES:
            raise ValueError(f"--detect must be among {','.join(DETECTOR_NAMES)}, got {d!r}")
        if not args.spans or d not in args.spans:
            raise ValueError(f"--detect {d}: add {d!r} to --spans (a detected span is private only if its type is)")
    if args.detect:
        opts["detect"] = list(args.detect)
    if "name" in args.detect:
        if not args.names_file:
            raise ValueError("--detect name needs --names-file FILE (one name per line)")
        opts["names"] = read_names(args.names_file)
    return opts


def _size_options(args: argparse.Namespace) -> dict[str, Any]:
    """``max_len`` (--max-len >= 16) and ``n_train`` (--text-train-size >= 10)."""
    opts: dict[str, Any] = {}
    if args.max_len is not None:
        if args.max_len < 16:
            raise ValueError(f"--max-len must be >= 16, got {args.max_len}")
        opts["max_len"] = args.max_len
    if args.text_train_size is not None:
        if args.text_train_size < 10:
            raise ValueError(f"--text-train-size must be >= 10, got {args.text_train_size}")
        opts["n_train"] = args.text_train_size
    return opts


def _canary_options(args: argparse.Namespace) -> dict[str, Any]:
    """``canary_repeats`` (--canaries: non-negative counts, the zeros dropped)."""
    if args.canaries is None:
        return {}
    counts = [c for c in args.canaries if c != 0]
    if any(c < 0 for c in counts):
        raise ValueError(f"--canaries must be non-negative counts, got {args.canaries}")
    return {"canary_repeats": counts}
