"""Localization scoring on small hand-made label tables (issue 24, part 5): every scored failure counts, compound
ones only when the named owner is in a minimal set of switches that fixes them; `unknown` is a miss; a row under 50% coverage fails;
the trace-rule baseline is the best owner per trace-signal pattern fitted on other labels; and the trace signals
themselves, read off hand-built traces."""

from __future__ import annotations

import zlib

import pandas as pd

from components.evolution.localization import Key, fit, fit_baselines, labelled, localization
from components.evolution.trace_rule import Owner, Signals, from_pattern, signals, three_line
from tests.test_diagnose_mutants import CANCEL, FINISH, WRITES, TARGETS, call, confirmed_write, st

# patterns (blocking, refusal, unconfirmed, early_finish, bounced, unfinished)
REFUSAL = Signals(
    blocking=False, refusal=True, unconfirmed=False, early_finish=False, bounced=False, unfinished=False
).pattern()
BOUNCED = Signals(
    blocking=False, refusal=False, unconfirmed=False, early_finish=False, bounced=True, unfinished=True
).pattern()


def table(rows):
    """rows: (item, cause, fixing_sets, pattern, diagnosed owner) -> findings, causes, scores, signals frames."""
    eids = [f"{i}#0" for i, *_ in rows]
    causes = pd.DataFrame(
        {
            "episode_id": eids,
            "item_id": [r[0] for r in rows],
            "cause": [r[1] for r in rows],
            "fixing_sets": [r[2] for r in rows],
            "fired": "",
        }
    )
    scores = pd.DataFrame({"episode_id": eids, "score": 0.5})
    signals_ = pd.DataFrame({"episode_id": eids, "pattern": [r[3] for r in rows]})
    findings = pd.DataFrame({"episode_id": eids, "owner": [r[4] for r in rows]})
    return findings, causes, scores, signals_


def test_compound_counts_only_when_the_owner_is_in_a_minimal_fixing_set_and_unknown_is_a_miss():
    f, c, s, sig = table(
        [
            ("a", "E", "", REFUSAL, "E"),  # right
            ("b", "compound", "E+C", REFUSAL, "C"),  # right: C is in the pair that fixes it
            ("c", "compound", "E+C", REFUSAL, "W"),  # wrong: W fired perhaps, but no minimal fixing set has W
            ("d", "compound", "", REFUSAL, "E"),  # only all four switches fix it: no owner is right
            ("e", "C", "", BOUNCED, "unknown"),  # not covered: a miss, and counted in n
            ("f", "external", "", REFUSAL, "none"),  # the diagnoser's `none` is external
            ("g", "compound", "rho+W+C", REFUSAL, "W"),  # right: W is in a minimal triple that fixes it
            ("h", "compound", "E+C;rho+W+C", REFUSAL, "rho"),  # right: rho is in one of its minimal sets
        ]
    )
    loc = localization(f, c, s, sig)
    assert loc["n"] == 8 and loc["n_single"] == 3
    assert loc["accuracy"] == 5 / 8
    assert loc["single_accuracy"] == 2 / 3
    assert loc["coverage"] == 7 / 8
    assert loc["ceiling"] == 7 / 8  # "d" has no right answer
    # the constant guess is scored by the same rule: C is in a fixing set of b, c, g and h
    assert loc["compound"] == {"n": 5, "coverage": 1.0, "accuracy": 3 / 5, "constant": 4 / 5, "no_fix": 1}
    assert sum(sum(r.values()) for r in loc["confusion"].values()) == 8


def test_a_row_under_half_coverage_fails_whatever_its_accuracy():
    rows = [(f"i{k}", "E", "", REFUSAL, "E" if k < 4 else "unknown") for k in range(10)]
    loc = localization(*table(rows))
    assert loc["coverage"] == 0.4
    assert loc["checks"]["coverage"] is False and loc["passes"] is False


def test_the_trace_rule_is_fitted_per_pattern_and_falls_back_on_the_three_line_rule():
    # on train, a bounced unfinished episode is C every time (the three-line rule would say W)
    _, c, s, sig = table([(f"t{k}", "C", "", BOUNCED, "C") for k in range(5)] + [("u", "E", "", REFUSAL, "E")])
    rule = fit(labelled(c, s, sig), Key.PATTERN)
    assert rule.by_key[BOUNCED] is Owner.C
    assert three_line(from_pattern(BOUNCED)) is Owner.W
    unseen = Signals(
        blocking=True, refusal=True, unconfirmed=True, early_finish=False, bounced=False, unfinished=False
    ).pattern()
    frame = pd.DataFrame({"pattern": [BOUNCED, unseen]})
    assert list(rule.predict(frame)) == ["C", "external"]
    assert fit(labelled(c, s, sig), Key.CONSTANT).default is Owner.C


def test_the_diagnoser_must_beat_the_fitted_trace_rule_by_ten_points():
    train = table(
        [(f"t{k}", "C", "", BOUNCED, "C") for k in range(6)] + [(f"r{k}", "E", "", REFUSAL, "E") for k in range(4)]
    )
    baselines = fit_baselines(*train[1:])
    # dev: the same patterns; a diagnoser that says exactly what the fitted rule says only ties it
    dev = table(
        [(f"d{k}", "C", "", BOUNCED, "C") for k in range(6)] + [(f"e{k}", "E", "", REFUSAL, "E") for k in range(4)]
    )
    loc = localization(*dev, baselines)
    assert loc["accuracy"] == 1.0 and loc["trace_rule_accuracy"] == 1.0 and loc["margin"] == 0.0
    assert loc["checks"] == {"coverage": True, "accuracy": True, "margin": False} and not loc["passes"]
    assert loc["constant_accuracy"] == 0.6  # C on every episode
    assert loc["three_line_accuracy"] == 0.4  # bounced reads as W to the unfitted rule


def test_without_baselines_each_is_cross_fitted_on_the_other_half_of_the_items():
    # the same pattern means C on one half of the items and E on the other: fitted on the other half, the trace
    # rule is wrong on every episode (fitted in-sample it would be right on half)
    items = [f"item{k}" for k in range(40)]
    half = {i: zlib.crc32(i.encode()) % 2 for i in items}
    assert set(half.values()) == {0, 1}
    loc = localization(*table([(i, "C" if half[i] else "E", "", BOUNCED, "C" if half[i] else "E") for i in items]))
    assert loc["accuracy"] == 1.0
    assert loc["trace_rule_accuracy"] == 0.0 and loc["constant_accuracy"] == 0.0


def test_signals_read_off_a_trace():
    refused = [
        st(0, *call(CANCEL, "1", ok=False, rule_id="r1", rule="x", error="no")),
        st(1, *call(CANCEL, "1")),
        st(2, FINISH, {"ok": True}, pending=[(CANCEL, "2")]),
    ]
    s = signals(refused, WRITES, TARGETS)
    assert (s.refusal, s.unconfirmed, s.early_finish, s.blocking, s.bounced, s.unfinished) == (
        True,
        True,
        True,
        False,
        False,
        False,
    )
    bounced = [st(0, *call(CANCEL, "1"), blocked="confirm_before_write: no confirmation")]
    s = signals(bounced, WRITES, TARGETS)
    assert s.bounced and s.unfinished and not s.unconfirmed and not s.refusal
    clean = [*confirmed_write(0, CANCEL, "1"), st(2, FINISH, {"ok": True})]
    assert signals(clean, WRITES, TARGETS).pattern() == "000000"
    assert signals([], WRITES, TARGETS).blocking  # nothing ran: a model fault


def test_the_trace_rule_without_refusals_cannot_see_them():
    """Blanking the rule-refusal signal (a world whose refusals say nothing): refused episodes look like the others."""
    plain = Signals(
        blocking=False, refusal=False, unconfirmed=False, early_finish=False, bounced=False, unfinished=False
    ).pattern()
    rows = [(f"e{k}", "E", "", REFUSAL, "E") for k in range(4)] + [(f"w{k}", "W", "", plain, "W") for k in range(6)]
    train = table(rows)
    loc = localization(*table([(f"d{r[0]}", *r[1:]) for r in rows]), fit_baselines(*train[1:]))
    assert loc["trace_rule_accuracy"] == 1.0
    assert loc["trace_rule_no_refusal_accuracy"] == 0.6  # W everywhere: the refused ones are lost


def test_without_counterfactual_labels_localization_is_unscored_and_says_what_it_could_not_attribute():
    """A world with no fault switches (a real benchmark): every failure is `unlabelled`. Nothing is scored (accuracy
    None: neither 0% nor 100%), and the diagnoser's unattributed failures are counted by the evidence it had."""
    from components.evolution.localization import localization_notes

    f, c, s, sig = table(
        [
            ("a", "unlabelled", "", REFUSAL, "unknown"),
            ("b", "unlabelled", "", REFUSAL, "unknown"),
            ("c", "unlabelled", "", BOUNCED, "E"),
        ]
    )
    f = f.assign(kind=["missing_write", "wrong_args", "refusal"])
    loc = localization(f, c, s, sig)
    assert loc["accuracy"] is None and loc["n"] == 0 and loc["scored"] is False and not loc["passes"]
    assert loc["unlabelled"] == 3 and "no fault switches" in loc["unscored"]
    assert loc["diagnosed"] == 3 and loc["unattributed"] == {"missing_write": 1, "wrong_args": 1}
    assert localization_notes(loc) == [
        "diagnosis localization: unscored (no counterfactual cause: the world has no fault switches to replay (3 "
        "failed episode(s) unlabelled))",
        "diagnosis could not attribute 2 of 3 diagnosed failed episode(s) to an owner; its evidence there: "
        "missing_write 1, wrong_args 1",
    ]
    # one labelled failure among them: scored (on that one alone), and nothing said about being unscored
    f2, c2, s2, sig2 = table([("a", "unlabelled", "", REFUSAL, "unknown"), ("d", "E", "", REFUSAL, "E")])
    loc = localization(f2.assign(kind="missing_write"), c2, s2, sig2)
    assert loc["scored"] is True and loc["unscored"] is None and loc["n"] == 1 and loc["accuracy"] == 1.0
    assert localization_notes(loc)[0].startswith("diagnosis could not attribute 1 of 2")
