"""Language-model audits on fake scorers and generators: exposure, extraction, span inference vs Theorem 4."""

from __future__ import annotations

import itertools
import json
import math
import subprocess
import sys
import time

import numpy as np
import pytest

from featuredp.attacks.text import (
    TextCanary,
    chance_exposure,
    digit_candidates,
    exposure,
    exposure_report,
    extraction,
    span_inference,
)
from featuredp.features.text import Span


def dict_scorer(table: dict[str, float], calls: list[int] | None = None):
    """NLL looked up by suffix (prefix ignored); records the size of every call."""

    def score(prefixes, suffixes):
        assert len(prefixes) == len(suffixes)
        if calls is not None:
            calls.append(len(suffixes))
        return np.array([table[s] for s in suffixes])

    return score


# ----------------------------------------------------------------------------- exposure


def test_exposure_hand_computed_ranks_first_middle_last():
    score = dict_scorer({"a": 1.0, "b": 2.0, "c": 3.0, "d": 4.0})
    cands = ["a", "b", "c", "d"]
    assert exposure(score, "p", "a", cands) == pytest.approx(2.0)  # rank 1 of 4: log2 4
    assert exposure(score, "p", "c", cands) == pytest.approx(2.0 - math.log2(3))
    assert exposure(score, "p", "d", cands) == pytest.approx(0.0)  # ranked last


def test_exposure_ties_count_half():
    score = dict_scorer({"a": 1.0, "b": 1.0, "c": 1.0, "d": 5.0})
    # a ties with b and c: rank 1 + 0 + 2/2 = 2
    assert exposure(score, "p", "a", ["a", "b", "c", "d"]) == pytest.approx(2.0 - 1.0)
    # a scorer that ties everything: rank (|R| + 1)/2, never the maximal exposure
    flat = dict_scorer(dict.fromkeys("abcd", 0.0))
    assert exposure(flat, "p", "b", ["a", "b", "c", "d"]) == pytest.approx(2.0 - math.log2(2.5))


def test_exposure_prefix_reaches_the_scorer_and_chunks_do_not_matter():
    seen = set()

    def score(prefixes, suffixes):
        seen.update(prefixes)
        return np.array([float(int(s)) for s in suffixes])

    cands = digit_candidates(2)
    full = exposure(score, "my pin is ", "07", cands)
    assert seen == {"my pin is "}
    assert (
        exposure(score, "my pin is ", "07", cands, chunk_size=3) == full == pytest.approx(math.log2(100) - math.log2(8))
    )


def test_exposure_refuses_a_secret_outside_the_space_and_duplicate_candidates():
    score = dict_scorer({"a": 1.0, "b": 2.0})
    with pytest.raises(ValueError, match="secret 'z' must be one of the candidates"):
        exposure(score, "p", "z", ["a", "b"])
    with pytest.raises(ValueError, match="distinct"):
        exposure(score, "p", "a", ["a", "b", "a"])


def test_exposure_refuses_a_scorer_of_the_wrong_shape():
    with pytest.raises(ValueError, match="one NLL per"):
        exposure(lambda p, s: np.zeros(1), "p", "a", ["a", "b"])


def test_digit_candidates():
    c = digit_candidates(3)
    assert len(c) == 1000 and c[0] == "000" and c[-1] == "999" and len(set(c)) == 1000
    with pytest.raises(ValueError, match="digits"):
        digit_candidates(0)


@pytest.mark.parametrize("n", [1, 2, 3, 7, 10, 64])
def test_chance_exposure_matches_brute_force(n):
    brute = float(np.mean([math.log2(n) - math.log2(u) for u in range(1, n + 1)]))
    assert chance_exposure(n) == pytest.approx(brute, abs=1e-12)


def test_chance_exposure_tends_to_one_over_ln2():
    assert chance_exposure(10**7) == pytest.approx(1 / math.log(2), abs=1e-5)
    assert chance_exposure(10) < chance_exposure(1000) < 1 / math.log(2)


def test_exposure_report_groups_by_repeats_and_scores_each_prefix_once():
    cands = digit_candidates(4)  # |R| = 10^4
    memorised = {("call ", "1234"): 0.0, ("call ", "0042"): 5.0, ("pin ", "9999"): 0.0}

    calls: list[int] = []

    def score(prefixes, suffixes):
        calls.append(len(suffixes))
        base = 20.0 + np.array([int(s) for s in suffixes]) * 1e-3  # candidate 0000 best among the rest
        return np.array([memorised.get((p, s), b) for p, s, b in zip(prefixes, suffixes, base)])

    canaries = [
        TextCanary("call ", "1234", 100),
        TextCanary("call ", "0042", 10),
        {"prefix": "pin ", "secret": "9999", "repeats": 100},
        TextCanary("call ", "5000", 1),
    ]
    t0 = time.process_time()  # CPU time: other jobs on a busy machine do not count
    rep = exposure_report(score, canaries, cands, chunk_size=4096)
    assert time.process_time() - t0 < 10.0
    # two distinct prefixes: R scored twice, in chunks of at most 4096
    assert sum(calls) == 2 * 10**4 and max(calls) <= 4096
    assert rep["space_size"] == 10**4
    assert rep["max_exposure"] == pytest.approx(math.log2(10**4))
    assert rep["chance_exposure"] == pytest.approx(chance_exposure(10**4))
    ex = [c["exposure"] for c in rep["canaries"]]
    assert ex[0] == pytest.approx(math.log2(10**4))  # strictly best: rank 1
    # NLL 5 beats every unmemorised candidate (>= 20) but not 1234 after the same prefix: rank 2
    assert ex[1] == pytest.approx(math.log2(10**4) - 1.0)
    assert ex[2] == pytest.approx(math.log2(10**4))
    # 5000 is unmemorised: below it lie 0000..4999 and the two memorised secrets (1234 and 0042 counted once)
    assert rep["canaries"][3]["rank"] == pytest.approx(1 + 5000)
    assert set(rep["by_repeats"]) == {"1", "10", "100"}
    assert rep["by_repeats"]["100"]["n"] == 2
    assert rep["by_repeats"]["100"]["mean_exposure"] == pytest.approx(math.log2(10**4))
    assert rep["by_repeats"]["10"]["mean_exposure"] == pytest.approx(ex[1])
    assert rep["by_repeats"]["1"]["mean_exposure"] == pytest.approx(math.log2(10**4) - math.log2(5001))
    json.dumps(rep, allow_nan=False)


# ----------------------------------------------------------------------------- extraction


def memoriser(training: list[str], guesses: dict[str, str] | None = None, calls: list | None = None):
    """Greedy 'model' that continues any prompt that starts a memorised text; else a fixed guess or noise."""

    def generate(prompt, max_new_tokens):
        if calls is not None:
            calls.append((prompt, max_new_tokens))
        for t in training:
            if t.startswith(prompt) and len(t) > len(prompt):
                return t[len(prompt) : len(prompt) + max_new_tokens]
        for end, guess in (guesses or {}).items():
            if prompt.endswith(end):
                return guess[:max_new_tokens]
        return "?" * max_new_tokens

    return generate


def _rec(text: str, *pieces: tuple[str, str]) -> tuple[str, list[Span]]:
    spans = []
    for value, kind in pieces:
        i = text.index(value)
        spans.append(Span(i, i + len(value), kind))
    return text, spans


TRAIN = [
    _rec("Dear Ann, mail bob@ex.org or call 555-0101.", ("Ann", "name"), ("bob@ex.org", "email"),
         ("555-0101", "phone")),
    _rec("Hi Zoë, your card 4111 is due.", ("Zoë", "name"), ("4111", "card")),
    _rec("Dear Ann, write to ann@ex.org today.", ("Ann", "name"), ("ann@ex.org", "email")),
]  # fmt: skip
HELDOUT = [
    _rec("Dear Ann, call 555-0199 now.", ("Ann", "name"), ("555-0199", "phone")),
    _rec("Dear Max, mail max@ex.org.", ("Max", "name"), ("max@ex.org", "email")),
]


def test_extraction_counts_exactly_and_separates_guessable_values():
    # memorises records 0 and 1 (not 2); guesses "Ann" after "Dear " for any text
    gen = memoriser([TRAIN[0][0], TRAIN[1][0]], guesses={"Dear ": "Ann"})
    out = extraction(gen, TRAIN, heldout=HELDOUT)
    assert (out["tried"], out["extracted"]) == (7, 6)  # every span of 0 and 1, and record 2's "Ann"
    assert out["by_type"]["name"] == {"tried": 3, "extracted": 3, "rate": 1.0, "rate_ci": pytest.approx(
        out["by_type"]["name"]["rate_ci"])}  # fmt: skip
    assert out["by_type"]["email"]["extracted"] == 1 and out["by_type"]["email"]["tried"] == 2
    assert out["by_type"]["phone"]["rate"] == 1.0 and out["by_type"]["card"]["rate"] == 1.0
    ho = out["heldout"]
    # held out: "Ann" is produced for a record never trained on (guessable), nothing else
    assert (ho["tried"], ho["extracted"]) == (4, 1)
    assert ho["by_type"]["name"]["extracted"] == 1 and ho["by_type"]["phone"]["extracted"] == 0
    assert out["excess_rate"]["name"] == pytest.approx(1.0 - 0.5)
    assert out["excess_rate"]["phone"] == pytest.approx(1.0)
    assert out["excess_rate"]["all"] == pytest.approx(6 / 7 - 1 / 4)
    lo, hi = out["rate_ci"]
    assert lo < 6 / 7 < hi


def test_extraction_reports_counts_only_unless_show():
    gen = memoriser([t for t, _ in TRAIN])
    out = extraction(gen, TRAIN, heldout=HELDOUT)
    dumped = json.dumps(out, allow_nan=False)
    for text, spans in TRAIN + HELDOUT:
        for s in spans:
            assert text[s.start : s.end] not in dumped
    shown = extraction(gen, TRAIN, show=True)
    values = {e["value"] for e in shown["examples"]}
    assert "bob@ex.org" in values and all(e["extracted"] for e in shown["examples"])


def test_extraction_filters_types_and_sizes_generation_by_bytes():
    calls: list = []
    gen = memoriser([t for t, _ in TRAIN], calls=calls)
    out = extraction(gen, TRAIN, span_types=["name"])
    assert out["tried"] == 3 and set(out["by_type"]) == {"name"}
    # "Zoë" is 4 UTF-8 bytes; the two Ann records share the prompt "Dear " and n, so one generation
    assert sorted(n for _, n in calls) == [3, 4]
    out = extraction(gen, TRAIN, span_types=["name"], max_new_tokens=2)
    assert out["extracted"] == 0  # two tokens cannot reproduce a three-character name
    assert extraction(gen, TRAIN, span_types=["date"])["rate"] is None


def test_extraction_refuses_spans_outside_their_text():
    with pytest.raises(ValueError, match=r"records\[0\] span 0"):
        extraction(memoriser([]), [("short", [Span(2, 40, "name")])])


# ----------------------------------------------------------------------------- span inference


def _targets(n: int, k: int, seed: int = 0):
    """n records "Patient <name> has code <c>." with the name hidden; k candidate names each."""
    rng = np.random.default_rng(seed)
    names = [f"N{i:03d}" for i in range(200)]
    out = []
    for i in range(n):
        true = names[i % len(names)]
        others = [x for x in rng.choice(names, size=k + 1, replace=False).tolist() if x != true][: k - 1]
        cands = [true, *others]
        rng.shuffle(cands)
        text = f"Patient {true} has code {i}."
        out.append((text, Span(8, 8 + len(true), "name"), cands))
    return out


def knowing_scorer(targets):
    truth = {(t[: s.start], t[s.start :]) for t, s, _ in targets}

    def score(prefixes, suffixes):
        return np.array([0.0 if (p, s) in truth else 10.0 for p, s in zip(prefixes, suffixes)])

    return score


def test_a_model_that_knows_every_span_violates_a_small_epsilon():
    targets = _targets(200, 10)
    out = span_inference(knowing_scorer(targets), targets, epsilon=0.5, delta=1e-5)
    assert out["accuracy"] == 1.0 and out["mean_rank"] == 1.0
    assert out["prior_baseline"] == pytest.approx(0.1)
    assert out["bound"] == pytest.approx(min(1.0, math.exp(0.5) * 0.1 + 1e-5), rel=1e-6)
    assert out["accuracy_lower"] > out["bound"]
    assert out["violates"] is True
    assert out["value_elsewhere"] == 0
    assert out["by_type"]["name"]["accuracy"] == 1.0
    json.dumps(out, allow_nan=False)
    # the same attack against a large ε is allowed: the bound reaches 1
    assert span_inference(knowing_scorer(targets), targets, epsilon=5.0)["violates"] is False
    # non-private: no bound, no verdict
    plain = span_inference(knowing_scorer(targets), targets)
    assert plain["bound"] is None and plain["violates"] is None


def test_a_model_that_knows_nothing_is_at_the_prior_and_never_violates():
    targets = _targets(400, 5)

    def constant(prefixes, suffixes):
        return np.zeros(len(suffixes))

    for eps in (0.0, 0.1, 1.0):
        out = span_inference(constant, targets, epsilon=eps, delta=0.0, seed=3)
        assert out["violates"] is False
        assert out["accuracy_lower"] <= 0.2 <= out["accuracy_upper"]
        assert out["mean_rank"] == pytest.approx(3.0)  # every tie counted half: (k + 1)/2
    assert span_inference(constant, targets, epsilon=0.0)["bound"] == pytest.approx(0.2)


def test_an_attack_below_the_prior_has_no_power_and_says_so():
    """A scorer that prefers a wrong candidate scores below the no-model prior: "within the bound" would say nothing
    about privacy (issue 44: 56 % against a 70 % prior, the non-private model included). It is marked no power; a
    scorer that knows the spans is not."""
    targets = _targets(200, 5)
    truth = {(t[: s.start], t[s.start :]) for t, s, _ in targets}

    def wrong(prefixes, suffixes):
        return np.array([10.0 if (p, s) in truth else 0.0 for p, s in zip(prefixes, suffixes, strict=True)])

    out = span_inference(wrong, targets, epsilon=1.0, delta=1e-5)
    assert out["accuracy"] < out["prior_baseline"] and out["no_power"] is True and out["violates"] is False
    assert span_inference(wrong, targets)["no_power"] is True  # non-private: no bound, still no power
    assert span_inference(knowing_scorer(targets), targets, epsilon=5.0)["no_power"] is False


def test_the_audit_line_says_no_power_instead_of_within_the_bound():
    from featuredp.experiments.text_runs import text_audit_lines

    block = {"n": 50, "accuracy": 0.56, "accuracy_lower": 0.45, "prior_baseline": 0.70, "bound": 0.9,
             "violates": False, "no_power": True, "by_group": None}  # fmt: skip
    line = text_audit_lines({"attack": "span", "span_inference": block})[0]
    assert "no power" in line and "within the bound" not in line


def test_bound_grows_with_epsilon_from_the_prior_to_one():
    targets = _targets(50, 4)
    score = knowing_scorer(targets)
    bounds = [span_inference(score, targets, epsilon=e, delta=1e-6)["bound"] for e in
              (0.0, 0.05, 0.2, 0.5, 1.0, 2.0, 4.0, math.inf)]  # fmt: skip
    assert all(a <= b + 1e-12 for a, b in itertools.pairwise(bounds))
    assert bounds[0] == pytest.approx(0.25, abs=1e-5) and bounds[-1] == 1.0
    assert bounds[3] < bounds[4] < bounds[5]


def test_span_inference_scores_the_full_text_after_the_prefix():
    seen = []

    def score(prefixes, suffixes):
        seen.extend(zip(prefixes, suffixes))
        return np.zeros(len(suffixes))

    text = "Hi Ann, bye."
    span_inference(score, [(text, Span(3, 6, "name"), ["Bo", "Ann"])], chunk_size=1)
    assert sorted(seen) == [("Hi ", "Ann, bye."), ("Hi ", "Bo, bye.")]


def test_span_inference_flags_values_repeated_in_the_known_text():
    text = "Ann wrote: regards, Ann."
    out = span_inference(lambda p, s: np.zeros(len(s)), [(text, Span(0, 3, "name"), ["Ann", "Bob"])])
    assert out["value_elsewhere"] == 1


def test_span_inference_refuses_bad_targets():
    score = knowing_scorer([])
    with pytest.raises(ValueError, match=r"targets\[0\] candidates must hold >= 2 values"):
        span_inference(score, [("Hi Ann", Span(3, 6, "name"), ["Bob", "Cy"])])
    with pytest.raises(ValueError, match=r"targets\[0\]: span"):
        span_inference(score, [("Hi", Span(3, 6, "name"), ["Ann", "Bob"])])
    with pytest.raises(ValueError, match="confidence"):
        span_inference(score, _targets(2, 2), confidence=0.4)


def test_text_audits_import_no_torch():
    code = "import sys, featuredp.attacks.text; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
