"""The detector table of issue 34: how many of 23 common real-world PII forms stay (at least partly) public in Ψ.

A form stays public when any letter or digit of its PII survives in Ψ(x) with every built-in detector on (and the
names list of the test). The forms are ``FORMS`` in tests/features/test_text_boundary.py. ``--before REV`` runs the
same table on the detectors of an earlier commit (``git show REV:src/featuredp/features/text.py``), e.g. 4080c75,
the release before the boundary work.

    PYTHONPATH=src python benchmarks/detector_table.py --before 4080c75
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "features"))

from test_text_boundary import FORMS, NAMES, stays_public  # noqa: E402


def table(mod: ModuleType) -> list[tuple[str, str]]:
    """(label, Ψ(x)) of every form that stays public under ``mod``'s detectors."""
    dets = (*mod.DETECTORS, "name")
    psi = mod.TextSpans(types=dets, detect=dets, names=NAMES)
    return [(label, psi(sentence)) for label, sentence, pii in FORMS if stays_public(psi, sentence, pii)]


def old_module(rev: str) -> ModuleType:
    """``featuredp.features.text`` as it was at ``rev``."""
    source = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:src/featuredp/features/text.py"],
                            check=True, capture_output=True, text=True).stdout  # fmt: skip
    path = Path(tempfile.mkdtemp()) / "old_text.py"
    path.write_text(source, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("old_text", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["old_text"] = mod
    spec.loader.exec_module(mod)
    return mod


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", default=None, metavar="REV", help="also run the detectors of this commit")
    args = p.parse_args()
    import featuredp.features.text as now

    runs = [("now", now)] + ([(args.before, old_module(args.before))] if args.before else [])
    for name, mod in runs:
        public = table(mod)
        print(f"{name}: {len(public)} of {len(FORMS)} forms stay (at least partly) public")
        for label, out in public:
            print(f"  {label}: {out!r}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
