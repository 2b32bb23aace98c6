"""The text task (issue 26): span-inference targets, the data with canaries, the audits' power, the comparison.

A tiny preset replaces ``TEXT_PRESET`` so that every model here trains in about a second on one core.
"""

from __future__ import annotations

import copy
import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

import featuredp.experiments.text_lm as text_lm
from _text_preset import TINY
from featuredp.data.text import ByteTokenizer, TextRecord, write_jsonl
from featuredp.data.text_corpus import support_dialogues
from featuredp.experiments.text_lm import (
    CORPUS_SPANS,
    TEXT_METHODS,
    TextCompareConfig,
    audit_text_model,
    load_text_data,
    run_text_compare,
    span_targets,
    train_text_model,
)
from featuredp.features.text import Span, TextSpans, placeholder

# ------------------------------------------------------------------------------------------------ span targets


def _record(name: str, first: str, second: str) -> TextRecord:
    """One text with a name and two emails, spans found by position."""
    text = f"Hi I'm {name}, write to {first} or to {second} please"
    spans = [Span(text.index(v), text.index(v) + len(v), t) for v, t in ((name, "name"), (first, "email"),
                                                                          (second, "email"))]  # fmt: skip
    return TextRecord(text, spans)


def _records(n: int = 30, *, distinct_names: bool = False) -> list[TextRecord]:
    return [_record(f"Person{i:02d}" if distinct_names else ("Ann", "Bob")[i % 2], f"a{i:02d}@one.org",
                    f"b{i:02d}@two.net") for i in range(n)]  # fmt: skip


def test_span_targets_show_the_target_and_placeholders_only() -> None:
    records = _records(distinct_names=True)
    drawn = span_targets([TextRecord(r.text, r.spans[1:]) for r in records], k=5, n=12)
    assert len(drawn.targets) == 12 == len(drawn.priors) == len(drawn.groups)
    by_first = {r.values("email")[0]: r for r in records}
    all_emails = {v for r in records for v in r.values("email")}
    for text, span, cands in drawn.targets:
        true = text[span.start : span.end]
        record = by_first[true]  # the first span of a targeted type is the one to infer
        name, _, second = record.values()
        # Ψ(x) with the target filled in: the other email is a placeholder, not its contents
        assert text == f"Hi I'm {name}, write to {true} or to {placeholder('email')} please"
        assert second not in text
        assert span.type == "email" and len(cands) == 5 == len(set(cands)) and true in cands
        assert set(cands) <= all_emails  # the others are values of that type from the data


def test_span_targets_take_recurring_values_with_their_prior_and_skip_types_with_few() -> None:
    """Two first names for 30 records: targeted no more (fewer than k distinct values: skipped, with a reason)."""
    repeated = span_targets(_records(), k=5, n=30)
    assert len(repeated.targets) == 30 and {s.type for _, s, _ in repeated.targets} == {"email"}
    assert "name" in repeated.skipped and "fewer than k = 5" in repeated.skipped["name"]
    # distinct names: names are the first span, so they are targeted
    distinct = span_targets(_records(distinct_names=True), k=5, n=30)
    assert {s.type for _, s, _ in distinct.targets} == {"name"} and set(distinct.groups) == {1}
    # names that recur (27 distinct among 30) are targeted as well, with their group sizes and prior weights
    few = [_record(f"Person{min(i, 26):02d}", f"a{i:02d}@one.org", f"b{i:02d}@two.net") for i in range(30)]
    drawn = span_targets(few, k=5, n=30)
    assert {s.type for _, s, _ in drawn.targets} == {"name"}
    assert sorted(drawn.groups)[-4:] == [4, 4, 4, 4]  # Person26 is held by 4 records
    for (_, _, cands), prior in zip(drawn.targets, drawn.priors):
        assert prior == [4.0 if c == "Person26" else 1.0 for c in cands]


def test_span_targets_are_a_secret_draw() -> None:
    records = _records(distinct_names=True)
    assert span_targets(records, k=5, n=10).targets != span_targets(records, k=5, n=10).targets


def test_span_targets_on_the_corpus_are_its_public_view_with_one_span_filled() -> None:
    records = support_dialogues(150, seed=1)
    psi = TextSpans(CORPUS_SPANS)
    public = {psi(r.text, r.spans) for r in records}
    drawn = span_targets(records, k=10, n=60)
    assert len(drawn.targets) == 60
    for text, span, cands in drawn.targets:
        assert text[: span.start] + placeholder(span.type) + text[span.end :] in public
        assert text[span.start : span.end] in cands and len(set(cands)) == 10


# ------------------------------------------------------------------------------------------------ data


def test_corpus_canaries_are_private_spans_absent_from_the_public_view() -> None:
    data = load_text_data(n_train=60, n_test=15, max_len=128, canary_repeats=[1, 10], canaries_per_repeat=2)
    assert len(data.train) == 60 + 2 * 1 + 2 * 10 and len(data.test) == 15 and len(data.originals) == 60
    assert "secret" in data.psi.types and set(CORPUS_SPANS) <= set(data.psi.types)
    for c in data.canaries:
        copies = [r for r in data.train.records if r.text == c.text]
        assert len(copies) == c.repeats
        assert all(r.spans == [Span(len(c.prefix), len(c.prefix) + len(c.secret), "secret")] for r in copies)
    tok = ByteTokenizer()
    batch = data.train.batch()
    public = data.train.public_texts()
    x_pub = [tok.decode(row) for row in batch["x_pub"].tolist()]  # what the public loss reads
    assert sum(t == "my pin is [SECRET]" for t in public) == 22
    for c in data.canaries:
        assert not any(c.secret in t for t in public + x_pub)
    x = [tok.decode(row) for row in batch["x"].tolist()]  # the full text does hold them
    assert all(sum(c.text == t for t in x) == c.repeats for c in data.canaries)
    # held-out texts are never trained on, canaries included
    assert not {r.text for r in data.test.records} & {r.text for r in data.train.records}


def test_jsonl_only_the_named_types_are_private_and_the_split_is_disjoint(tmp_path: Path) -> None:
    records = support_dialogues(100, seed=3)
    path = tmp_path / "d.jsonl"
    write_jsonl(records, path)
    data = load_text_data(path=path, spans=["email", "phone"], canary_repeats=[3], canaries_per_repeat=1)
    assert data.psi.types == ("email", "phone", "secret")
    train_texts, test_texts = [r.text for r in data.originals], [r.text for r in data.test.records]
    assert not set(train_texts) & set(test_texts)
    assert sorted(train_texts + test_texts) == sorted(r.text for r in records)
    public = "\n".join(data.train.public_texts())
    for r in data.originals:
        assert {s.type for s in r.spans} <= {"email", "phone"}
        assert not any(v in public for v in r.values())
    names = [v for r in records if r.text in train_texts for s in r.spans if s.type == "name"
             for v in [r.text[s.start : s.end]]]  # fmt: skip
    assert names and all(v in public for v in names)  # a type not in spans stays public
    with pytest.raises(ValueError, match="--spans"):
        load_text_data(path=path)
    with pytest.raises(ValueError, match="--spans"):
        load_text_data(path=path, spans=[])


@pytest.mark.parametrize("source", ["corpus", "jsonl"])
def test_options_rebuild_the_same_data(tmp_path: Path, source: str) -> None:
    """The audit rebuilds a run's data from its options: the same training texts, not those plus as many more as
    there are canary copies (taken from the held-out texts, for the corpus)."""
    if source == "corpus":
        data = load_text_data(n_train=40, n_test=10, canary_repeats=[1, 10], canaries_per_repeat=1)
    else:
        path = tmp_path / "d.jsonl"
        write_jsonl(support_dialogues(200, seed=4), path)
        data = load_text_data(path=path, spans=["email"], n_train=60, canary_repeats=[5])
    # the names of a name detector are counted, never kept (none here)
    again = load_text_data(**{k: v for k, v in data.options.items() if k != "names"})
    assert again.train.records == data.train.records and again.test.records == data.test.records
    assert again.canaries == data.canaries and again.psi == data.psi


def test_canary_digits_set_the_exposure_space() -> None:
    data = load_text_data(n_train=20, n_test=10, canary_repeats=[1], canaries_per_repeat=3, canary_digits=2)
    assert all(len(c.secret) == 2 and c.secret.isdigit() for c in data.canaries)


# ------------------------------------------------------------------------------------------------ the audits' power


def test_exposure_finds_the_non_private_models_canaries_and_not_the_public_models() -> None:
    """The control of issue 26: canaries planted 100 times are exposed by a non-private model (close to the top of
    1,000 candidates) and not by the model trained on Ψ(S) only, which never saw a secret."""
    # eight canaries: the public model's mean over them stays near chance for any seed (its spread shrinks)
    data = load_text_data(n_train=150, n_test=20, max_len=64, canary_repeats=[100], canaries_per_repeat=8,
                          canary_digits=3)  # fmt: skip
    model = {"kind": "causal_transformer", "d_model": 32, "n_layers": 1, "n_heads": 2}
    params = {"epochs": 4, "batch_size": 32, "lr": 3e-3, "optimizer": "adam"}
    found = {}
    for method in ("nonprivate", "public"):
        done = train_text_model(data=data, method=method, epsilon=None, delta=1e-5, seed=0, model=model,
                                params=params)  # fmt: skip
        found[method] = audit_text_model(done.model, data, epsilon=None, delta=None, audit={}, attacks=("exposure",))
    space = found["public"]["exposure"]["space_size"]
    assert space == 1000 and math.isclose(found["public"]["exposure"]["max_exposure"], math.log2(1000))
    # without 10× canaries the headline is the mean over the fewest repeats planted (here the only ones)
    for f in found.values():
        assert f["canary_exposure"] == f["exposure"]["by_repeats"]["100"]["mean_exposure"]
    # of 9.97 bits (about 7.9 for public seeds 0 to 5): the eight secrets rank near the top of 1,000
    assert found["nonprivate"]["canary_exposure"] >= 6.0
    assert found["public"]["canary_exposure"] <= 3.0  # chance is 1.44 bits (1.0 to 2.2 for seeds 0 to 5)


def _with_emails_replaced(record: TextRecord, i: int) -> TextRecord:
    """``record`` with each email's contents changed (a neighbour: the same Ψ(x))."""
    text, spans, shift = record.text, [], 0
    for s in sorted(record.spans):
        start, end = s.start + shift, s.end + shift
        if s.type == "email":
            value = f"someone.else{i}@changed.example"
            text = text[:start] + value + text[end:]
            shift += len(value) - (s.end - s.start)
            end = start + len(value)
        spans.append(Span(start, end, s.type))
    return TextRecord(text, spans)


def test_the_public_model_is_the_same_for_neighbouring_datasets(tmp_path: Path) -> None:
    """Datasets that differ only in the contents of private spans give the public-only model bit for bit."""
    records = support_dialogues(60, seed=2)
    neighbour = [_with_emails_replaced(r, i) for i, r in enumerate(records)]
    models = []
    for name, recs in (("a", records), ("b", neighbour)):
        write_jsonl(recs, tmp_path / f"{name}.jsonl")
        data = load_text_data(path=tmp_path / f"{name}.jsonl", spans=["email"], canary_repeats=[3], max_len=128)
        done = train_text_model(data=data, method="public", epsilon=None, delta=1e-5, seed=0, model=TINY["model"],
                                params=TINY["methods"]["public"])  # fmt: skip
        assert done.result.steps > 0
        models.append((data, done.model))
    (a, model_a), (b, model_b) = models
    assert a.train.public_texts() == b.train.public_texts()
    assert [r.text for r in a.train.records] != [r.text for r in b.train.records]  # the full texts differ
    for (key, pa), pb in zip(model_a.state_dict().items(), model_b.state_dict().values()):
        assert torch.equal(pa, pb), key


# ------------------------------------------------------------------------------------------------ the comparison


@pytest.fixture(scope="module")
def compared(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every method at ε = 3 on the tiny preset (about 8 s)."""
    out = tmp_path_factory.mktemp("text_compare") / "out"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(text_lm, "TEXT_PRESET", copy.deepcopy(TINY))
        result = run_text_compare(TextCompareConfig(out=out, epsilons=[3.0], progress=False))
    return result


@pytest.fixture
def tiny(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(text_lm, "TEXT_PRESET", copy.deepcopy(TINY))


def test_compare_writes_rows_summary_and_plot(compared: dict[str, Any]) -> None:
    out = Path(compared["out"])
    saved = json.loads((out / "results.json").read_text())
    assert saved["rows"] == json.loads(json.dumps(compared["rows"]))
    assert [r["method"] for r in saved["rows"]] == list(TEXT_METHODS)
    for r in saved["rows"]:
        assert {"method", "epsilon", "perplexity", "canary_exposure", "extraction", "span_inference"} <= set(r)
    assert (out / "text_privacy.png").stat().st_size > 0
    md = (out / "summary.md").read_text()
    assert "| method |" in md and "FDP (Alg. 1)" in md


def test_compare_rows_meet_the_issues_contract(compared: dict[str, Any]) -> None:
    """method, epsilon (the target; None for the references), perplexity, canary_exposure (mean bits of the
    10× canaries)."""
    rows = {r["method"]: r for r in compared["rows"]}
    cells = {c["method"]: c for c in compared["cells"]}
    for method, r in rows.items():
        private = method in ("dpsgd", "fdp_dpsgd", "fdp")
        assert r["epsilon"] == (3.0 if private else None)
        assert math.isfinite(r["perplexity"]) and 1.0 < r["perplexity"] < 267  # below uniform over the vocabulary
        tens = [c["exposure"] for c in cells[method]["exposure"]["canaries"] if c["repeats"] == 10]
        assert tens and r["canary_exposure"] == pytest.approx(sum(tens) / len(tens))
        assert r["canary_exposure"] == pytest.approx(r["exposure_by_repeats"]["10"])
        assert 0.0 <= r["canary_exposure"] <= math.log2(100)  # digits 2: 100 candidates
        si = r["span_inference"]
        if private:
            assert 0 < r["epsilon_spent"] <= 3.0 + 1e-9 and si["prior"] <= si["bound"] <= 1.0
        else:
            assert si["bound"] is None if method == "nonprivate" else si["bound"] == pytest.approx(si["prior"],
                                                                                                   abs=1e-3)
    assert rows["nonprivate"]["epsilon_spent"] is None and rows["public"]["epsilon_spent"] == 0.0


def test_compare_files_hold_no_private_span_contents(compared: dict[str, Any]) -> None:
    data = load_text_data(**TINY["load"])
    values = {v for r in data.originals + data.test.records for s in r.spans if s.type in ("name", "email", "address")
              for v in [r.text[s.start : s.end]]}  # fmt: skip
    out = Path(compared["out"])
    for f in ("results.json", "summary.md", "grid.json", *(str(p.relative_to(out)) for p in out.glob("cells/*"))):
        text = (out / f).read_text()
        assert not [v for v in values if v in text], f


def test_a_rerun_trains_nothing_and_returns_the_same_rows(compared: dict[str, Any], tiny: None, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    def refuse(**kwargs: Any) -> None:
        raise AssertionError(f"trained again: {kwargs['method']}")

    monkeypatch.setattr(text_lm, "train_text_cell", refuse)
    again = run_text_compare(TextCompareConfig(out=Path(compared["out"]), epsilons=[3.0], progress=False))
    assert again["rows"] == compared["rows"] and again["cells"] == compared["cells"]
    with pytest.raises(AssertionError, match="trained again"):  # the stub is the one a new cell would call
        run_text_compare(TextCompareConfig(out=tmp_path / "fresh", methods=["public"], progress=False))


def test_a_different_grid_in_the_same_out_is_refused_unless_overwrite(compared: dict[str, Any], tiny: None,
                                                                     tmp_path: Path) -> None:  # fmt: skip
    out = tmp_path / "copy"
    shutil.copytree(compared["out"], out)
    before = (out / "results.json").read_text()
    with pytest.raises(ValueError, match=r"--out .*different text comparison.*--overwrite"):
        run_text_compare(TextCompareConfig(out=out, methods=["public"], epsilons=[8.0], progress=False))
    assert (out / "results.json").read_text() == before
    done = run_text_compare(TextCompareConfig(out=out, methods=["public"], epsilons=[8.0], progress=False,
                                              overwrite=True))  # fmt: skip
    assert [r["method"] for r in done["rows"]] == ["public"]


def test_compare_config_refuses_unknown_methods_and_bad_epsilons(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="methods"):
        TextCompareConfig(out=tmp_path, methods=["fdp_label"])
    with pytest.raises(ValueError, match="epsilons"):
        TextCompareConfig(out=tmp_path, epsilons=[0.0])


def test_report_only_trains_nothing_and_reports_the_finished_cells(
    compared: dict[str, Any], tiny: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(**kwargs: Any) -> None:
        raise AssertionError(f"trained: {kwargs['method']}")

    monkeypatch.setattr(text_lm, "train_text_cell", refuse)
    out = tmp_path / "partial"
    shutil.copytree(compared["out"], out)
    for cell in out.glob("cells/fdp__*"):
        cell.unlink()
    done = run_text_compare(TextCompareConfig(out=out, epsilons=[3.0], progress=False, report_only=True))
    assert [r["method"] for r in done["rows"]] == [m for m in TEXT_METHODS if m != "fdp"]
    assert "0 cells trained, 4 reused" in (out / "summary.md").read_text()
    for cell in out.glob("cells/*"):
        cell.unlink()
    with pytest.raises(FileNotFoundError, match="no finished cells"):
        run_text_compare(TextCompareConfig(out=out, epsilons=[3.0], progress=False, report_only=True))


def test_a_users_file_is_used_whole_not_cut_to_the_corpus_size(tmp_path: Path) -> None:
    """The preset's corpus sizes must not silently drop most of a user's file."""
    preset = copy.deepcopy(TINY)
    opts = text_lm.data_options(preset, {"path": "f.jsonl", "spans": ["email"]})
    assert "n_train" not in opts and "n_test" not in opts and opts["max_len"] == TINY["load"]["max_len"]
    assert text_lm.data_options(preset, {"path": "f.jsonl", "n_train": 30})["n_train"] == 30
    assert text_lm.data_options(preset, {})["n_train"] == TINY["load"]["n_train"]  # the corpus keeps its size
    path = tmp_path / "big.jsonl"
    write_jsonl(support_dialogues(3 * TINY["load"]["n_train"], seed=5), path)
    data = load_text_data(**text_lm.data_options(preset, {"path": str(path), "spans": ["email"],
                                                          "canary_repeats": []}))  # fmt: skip
    assert len(data.train) + len(data.test) == 3 * TINY["load"]["n_train"]


def test_a_methods_subset_reuses_the_cells_it_shares(compared: dict[str, Any], tiny: None, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """A cell's key depends on its own settings only, not on which other methods or ε the grid holds."""
    def refuse(**kwargs: Any) -> None:
        raise AssertionError(f"trained again: {kwargs['method']}")

    monkeypatch.setattr(text_lm, "train_text_cell", refuse)
    out = tmp_path / "subset"
    shutil.copytree(compared["out"], out)
    done = run_text_compare(TextCompareConfig(out=out, methods=["public", "fdp"], epsilons=[3.0], progress=False,
                                              overwrite=True))  # fmt: skip
    assert [r["method"] for r in done["rows"]] == ["public", "fdp"]


def test_the_canary_span_type_is_private_only_where_canaries_are_planted():
    """Old code listed ``secret`` among the protected span types (and in the guarantee) with no canary planted."""
    from featuredp.experiments.text_data import CANARY_TYPE, load_text_data

    without = load_text_data(spans=["email"], n_train=20, n_test=10, canary_repeats=())
    assert CANARY_TYPE not in without.psi.types and without.options["spans"] == ["email"]
    planted = load_text_data(spans=["email"], n_train=20, n_test=10, canary_repeats=(1,), canaries_per_repeat=1)
    assert planted.psi.types == ("email", CANARY_TYPE)
