"""benchmarks/step_breakdown.py times every part it names at toy sizes, so the table cannot rot or silently lose a
part (a renamed method would leave its row at zero)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("step_breakdown", ROOT / "benchmarks" / "step_breakdown.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("method", ["dpsgd", "fdp"])
def test_every_part_is_timed_and_the_parts_fit_in_the_step(method):
    script = _script()
    total, parts = script.breakdown(method, 32, min_time=0.0)
    assert set(parts) == set(script.PARTS)
    always = [p for p in script.PARTS if p != "chunk check"]  # the chunk check runs on a secret 1 step in 8
    assert all(parts[p] > 0 for p in always), parts
    assert sum(parts.values()) < total
