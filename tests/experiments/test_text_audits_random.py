"""Text audits that do not mislead (issue 34 D): random targets, recurring values, exposure power, held-out labels.

No model is trained here: extraction gets a fake ``generate`` that "memorises" fixed values, span inference a
``score`` that ignores the records, so every check is fast and exact.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import featuredp.experiments.text_audits as text_audits
import featuredp.experiments.text_lm as text_lm
from featuredp.attacks.text import span_inference
from featuredp.data.text import TextRecord, write_jsonl
from featuredp.experiments.text_lm import (
    extraction_audit,
    load_text_data,
    mark_exposure_power,
    span_targets,
    summarize_text,
    text_model_spec,
)
from featuredp.experiments.text_report import render_text_summary
from featuredp.features.text import Span
from featuredp.models import build_model

# ------------------------------------------------------------------------------------------------ extraction


def _authored(i: int, author: str) -> TextRecord:
    email = f"{author}@{author}.org"
    text = f"Commit {i:03d} by {author.title()}: contact {email}"
    return TextRecord(text, [Span(text.index(email), text.index(email) + len(email), "email")])


def _by_author(n: int = 400) -> list[TextRecord]:
    """A log sorted by author: the first half of the file is alice's commits, the second bob's."""
    return [_authored(i, "alice" if i < n // 2 else "bob") for i in range(n)]


def _memorises_alice(prompt: str, n: int) -> str:
    """A model that "memorised" alice's email: it produces it after any prompt (training record or not)."""
    return "alice@alice.org"


def test_a_file_sorted_by_author_gives_the_excess_rate_of_a_shuffled_copy(tmp_path: Path) -> None:
    """On a newest-first log the first training records and the first held-out ones are different populations:
    taken in file order, a value every record may produce looked memorised (or guessable). Drawn at random, the
    sorted file and a shuffled copy give the same excess rate, about 0 (the fake model ignores membership)."""
    records = _by_author()
    shuffled = [records[int(i)] for i in np.random.default_rng(7).permutation(len(records))]
    excess, ci = {}, {}
    for name, recs in (("sorted", records), ("shuffled", shuffled)):
        path = tmp_path / f"{name}.jsonl"
        write_jsonl(recs, path)
        data = load_text_data(path=path, spans=["email"], test_fraction=0.25, canary_repeats=())
        out = extraction_audit(_memorises_alice, data, 100, rng=np.random.default_rng(3))
        assert out["targets"]["train"] == out["targets"]["heldout"] == 100
        excess[name] = out["excess_rate"]["all"]
        (tlo, thi), (hlo, hhi) = out["rate_ci"], out["heldout"]["rate_ci"]
        ci[name] = (tlo - hhi, thi - hlo)
    for name, (lo, hi) in ci.items():
        assert lo <= excess["sorted"] <= hi and lo <= excess["shuffled"] <= hi, (name, excess, ci)
        assert lo <= 0.0 <= hi  # memorising a value held in and out of training is no membership signal


def _tiny_model(data: text_lm.TextData) -> Any:
    spec = text_model_spec(data, {"kind": "causal_transformer", "d_model": 16, "n_layers": 1, "n_heads": 2})
    return build_model(spec, seed=0)


def test_the_audits_extraction_targets_are_not_the_first_records(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Through ``audit_text_model``: the prompts are a fresh random draw, not the first records (file order)."""
    records = [_authored(i, f"user{i:03d}") for i in range(300)]
    path = tmp_path / "log.jsonl"
    write_jsonl(records, path)
    data = load_text_data(path=path, spans=["email"], test_fraction=0.2, canary_repeats=())
    prompts: list[str] = []

    def fake_generator(model: Any, tok: Any, max_len: int) -> Any:
        def generate(prompt: str, n: int) -> str:
            prompts.append(prompt)
            return "x" * n
        return generate

    monkeypatch.setattr(text_audits, "lm_generator", fake_generator)
    model = _tiny_model(data)
    audit = {"extraction": 20, "span_k": 5}
    drawn = []
    for _ in range(2):
        prompts.clear()
        out = text_lm.audit_text_model(model, data, epsilon=None, delta=None, audit=audit, attacks=("extraction",))
        assert out["extraction"]["tried"] == 20 and out["extraction"]["heldout"]["tried"] == 20
        assert "random" in out["extraction"]["targets"]["drawn"]
        drawn.append(set(prompts))
    first = {r.text[: r.spans[0].start] for r in data.originals[:20]} | {
        r.text[: r.spans[0].start] for r in data.test.records[:20]}
    assert drawn[0] != first and drawn[1] != first
    assert drawn[0] != drawn[1]  # OS entropy: each audit draws again


# ------------------------------------------------------------------------------------------------ span inference

_NAMES = ["Ann"] * 120 + ["Bob"] * 60 + ["Cy"] * 30 + [f"P{i:02d}" for i in range(90)]


def _named(name: str, i: int) -> TextRecord:
    text = f"Ticket {i:03d}: {name} asked for a refund"
    return TextRecord(text, [Span(text.index(name, 12), text.index(name, 12) + len(name), "name")])


def _freq_scorer(freq: Counter[str]) -> Any:
    """NLL −log p(name): the model-free best guess (the commonest candidate), blind to the record."""
    names = sorted(freq, key=len, reverse=True)

    def score(prefixes: Sequence[str], suffixes: Sequence[str]) -> np.ndarray:
        return np.array([-math.log(freq[next(n for n in names if s.startswith(n + " "))]) for s in suffixes])
    return score


def test_span_inference_on_recurring_values_reports_groups_and_a_right_prior() -> None:
    """Names recur (Ann 120×, Bob 60×, Cy 30×, 90 held once): targeted, with group sizes; a score that ignores
    the model is no better than the prior baseline, and the best model-free guess scores the baseline."""
    records = [_named(n, i) for i, n in enumerate(_NAMES)]
    drawn = span_targets(records, k=5, n=len(records), rng=np.random.default_rng(0))
    assert len(drawn.targets) == len(records) and not drawn.skipped
    truths = [t[t_span.start : t_span.end] for t, t_span, _ in drawn.targets]
    assert drawn.groups == [_NAMES.count(v) for v in truths]
    uniform = span_inference(lambda p, s: np.zeros(len(s)), drawn.targets, priors=drawn.priors, groups=drawn.groups)
    assert set(uniform["by_group"]) == {"1", ">10"}
    assert uniform["by_group"][">10"]["n"] == 210 and uniform["by_group"]["1"]["n"] == 90
    assert not uniform["accuracy_lower"] > uniform["prior_baseline"]  # no false "beats the prior"
    best = span_inference(_freq_scorer(Counter(_NAMES)), drawn.targets, priors=drawn.priors, groups=drawn.groups)
    assert best["prior_baseline"] == pytest.approx(uniform["prior_baseline"])
    # the prior baseline is the success of the best guess without the model: 1/k would be far below it
    assert best["accuracy_lower"] <= best["prior_baseline"] <= best["accuracy_upper"]
    assert best["prior_baseline"] > 0.4 > 1 / 5


def test_span_types_with_fewer_than_k_distinct_values_are_skipped_with_a_reason() -> None:
    records = [_named(("Ann", "Bob", "Cy")[i % 3], i) for i in range(30)]
    drawn = span_targets(records, k=5, n=10)
    assert drawn.targets == [] and "3 distinct values" in drawn.skipped["name"]


# ------------------------------------------------------------------------------------------------ exposure power


def _cell(method: str, eps: float | None, by: dict[str, float]) -> dict[str, Any]:
    return {"method": method, "target_epsilon": eps, "epsilon": eps, "perplexity": 10.0, "train_wall_s": 1.0,
            "canary_exposure": by["10"], "exposure": {"by_repeats": {k: {"mean_exposure": v} for k, v in by.items()}},
            "extraction": {"rate": 0.0, "tried": 10, "heldout": {"rate": 0.0}, "excess_rate": {"all": 0.0}},
            "span_inference": None}  # fmt: skip


@pytest.mark.parametrize(("nonprivate_100", "no_power"), [(4.0, True), (4.5, False), (12.0, False)])
def test_the_exposure_audit_without_power_is_marked(nonprivate_100: float, no_power: bool) -> None:
    """The non-private model must beat the FDP model by ≥ 3 bits at some repeat count (10× or 100×)."""
    rows = summarize_text([_cell("nonprivate", None, {"1": 1.0, "10": 2.5, "100": nonprivate_100}),
                           _cell("fdp", 3.0, {"1": 0.9, "10": 1.5, "100": 1.5})])  # fmt: skip
    fdp = next(r for r in rows if r["method"] == "fdp")
    assert fdp["exposure_no_power"] is no_power
    assert fdp["exposure_power_bits"] == pytest.approx(nonprivate_100 - 1.5)
    meta = {"source": "s", "disclosure": "d", "model": {"kind": "causal_transformer"}, "delta": 1e-5,
            "command": "c", "audit": {}, "heldout": {"covered": False, "note": "not covered by ε: a split"}}
    md = render_text_summary(rows, meta)
    fdp_line = next(line for line in md.splitlines() if line.startswith("| FDP"))
    assert ("(no power)" in fdp_line) is no_power
    assert "perplexity ↓ (not covered by ε)" in md
    table = [line for line in md.splitlines() if line.startswith("|")]
    assert len({line.count("|") for line in table}) == 1  # header, separator and rows: one column count


def test_a_gap_at_one_repeat_gives_no_power() -> None:
    """Single canaries are rarely memorised even without privacy: they never make the audit powerful."""
    rows = [{"method": "nonprivate", "exposure_by_repeats": {"1": 9.0, "10": 1.5}},
            {"method": "fdp", "exposure_by_repeats": {"1": 1.0, "10": 1.4}}]
    mark_exposure_power(rows)
    assert rows[1]["exposure_no_power"] is True


# ------------------------------------------------------------------------------------------------ held-out metrics


def test_test_data_is_the_held_out_set_and_the_training_file_is_used_whole(tmp_path: Path) -> None:
    train_path, test_path = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
    write_jsonl([_authored(i, f"u{i:03d}") for i in range(50)], train_path)
    held = [_authored(i, f"h{i:03d}") for i in range(12)]
    write_jsonl(held, test_path)
    data = load_text_data(path=train_path, test=test_path, spans=["email"], canary_repeats=())
    assert [r.text for r in data.test.records] == [r.text for r in held] and len(data.originals) == 50
    assert data.heldout["source"] == "test_data" and data.heldout["covered"] is False
    assert "--test-data test.jsonl, outside the training data" in data.heldout["note"]
    assert data.options["test"] == str(test_path)
    split = load_text_data(path=train_path, spans=["email"], canary_repeats=())
    assert split.heldout["source"] == "split" and split.heldout["covered"] is False
    assert "not covered by ε" in split.heldout["note"]
    generated = load_text_data(n_train=20, n_test=10, canary_repeats=())
    assert generated.heldout["covered"] is True and "public generated" in generated.heldout["note"]
    with pytest.raises(ValueError, match="--test-data"):
        load_text_data(test=test_path, canary_repeats=())


def test_span_targets_fit_the_scorer_whatever_the_candidates_length():
    """Real records near the length limit: a candidate longer than the true value must not overflow the scorer
    (it refused with "the suffix would be cut"); the continuation is cut alike for every candidate."""
    from featuredp.data.text import ByteTokenizer, TextRecord
    from featuredp.experiments.text_lm import span_targets
    from featuredp.features.text import Span
    from featuredp.lm import lm_scorer

    names = ["Al", "Bo Li", "Christopher Alexander Montgomery-Smith", *[f"Name{i:02d} Surname" for i in range(12)]]
    records = []
    for nm in names:
        text = f"Author: {nm}\n" + "x" * (150 - len(nm))
        records.append(TextRecord(text, [Span(8, 8 + len(nm), "name")]))
    tok, L = ByteTokenizer(), 160
    drawn = span_targets(records, k=5, n=50, rng=np.random.default_rng(3), tokenizer=tok, max_len=L)
    assert drawn.targets
    for text, span, cands in drawn.targets:
        for c in cands:
            assert len(tok.encode(text[:span.start])) + len(tok.encode(c + text[span.end:])) <= L
    model = torch.nn.Sequential(torch.nn.Embedding(tok.vocab_size, 8), torch.nn.Linear(8, tok.vocab_size))
    score = lm_scorer(model, tok, L)
    text, span, cands = drawn.targets[0]
    assert len(score([text[:span.start]] * len(cands), [c + text[span.end:] for c in cands])) == len(cands)
