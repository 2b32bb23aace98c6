"""The run is one public object and the loops build on it (ARCHITECTURE rule 19), read from the source.

* ``featuredp.privacy_engine`` (the user's loop) never imports ``featuredp.engine`` (featuredp's loop), nor the
  reverse: both import ``featuredp.run``;
* neither loop reaches into the other's private names, nor into the run's: every name either uses on a
  :class:`~featuredp.run.PrivateRun` is public;
* the options of ``make_private`` are explicit keyword arguments, not ``**options``.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "featuredp"
LOOPS = {"engine.py": "featuredp.privacy_engine", "privacy_engine.py": "featuredp.engine",
         "dp_wrappers.py": "featuredp.engine", "private_loader.py": "featuredp.engine",
         "private_output.py": "featuredp.engine", "own_loop_checks.py": "featuredp.engine"}  # fmt: skip


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def test_the_two_loops_never_import_each_other_and_both_build_on_the_run():
    for name, other in LOOPS.items():
        imported = _imports(SRC / name)
        assert not any(i == other or i.startswith(other + ".") for i in imported), f"{name} imports {other}"
    assert "featuredp.run" in _imports(SRC / "engine.py")
    assert "featuredp.run" in _imports(SRC / "privacy_engine.py")


def _private_uses(path: Path, receivers: tuple[str, ...]) -> list[str]:
    """``x._name`` where x is one of ``receivers`` (an attribute chain ending in it: ``self.run``, ``trainer``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            base = node.value
            label = base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", "")
            if label in receivers:
                bad.append(f"{path.name}:{node.lineno} {label}.{node.attr}")
    return bad


def test_no_loop_reaches_into_the_runs_or_the_other_loops_private_names():
    receivers = ("run", "_run", "trainer", "_trainer")
    bad = []
    for name in LOOPS:
        bad += _private_uses(SRC / name, receivers)
    assert not bad, bad


def test_make_private_takes_explicit_keyword_arguments():
    from featuredp import PrivacyEngine

    for method in (PrivacyEngine.make_private, PrivacyEngine.make_private_with_epsilon):
        kinds = {p.kind for p in inspect.signature(method).parameters.values()}
        assert inspect.Parameter.VAR_KEYWORD not in kinds, method.__name__
        names = set(inspect.signature(method).parameters)
        assert {"feature_map", "record_epsilon", "noise", "epochs", "dataset", "public_weight"} <= names
