"""The typed contracts between stages (issue 30, parts 1-2): the codes defined once, the round record, checker codes,
the meta-agent protocol, mechanisms matched per fingerprint entry, and a round that is a sequence of stage calls."""

from __future__ import annotations

import ast
import inspect
import json
from pathlib import Path

import pandas as pd
import pytest

from components.codes import CheckCode, FindingKind, Owner, Verdict
from components.errors import InputError
from components.evolution.plan import parse_plan
from components.evolution.record import RoundRecord
from components.evolution.validate import fired
from components.io import dumps

PLAN = {
    "owner": "rho",
    "cluster": "c1",
    "summary": "rho: rebind",
    "evidence": [{"episode_id": "t1#0", "step": 1, "hash": "h" * 64}],
    "operations": [{"op": "set_wm", "field": "board", "value": True}],
    "mechanism": "board",
    "source_items": ["t1"],
}


def test_codes_keep_their_spellings_in_files_and_compare_equal_to_strings():
    assert (
        json.dumps({"o": Owner.RHO, "v": Verdict.NO_PLAN, "k": FindingKind.CARD_NOT_FIRED})
        == '{"o": "rho", "v": "no_plan", "k": "card_not_fired"}'
    )
    assert f"{Verdict.ACCEPT:<7}|" == "accept |" and str(Owner.NONE) == "none"
    assert "rho" in {Owner.RHO: 1} and ("C", "overflow") in {(Owner.C, FindingKind.OVERFLOW): 1}  # hashed as str


def test_a_plan_holds_its_owner_as_the_enum_and_refuses_others_naming_the_strings():
    plan = parse_plan(PLAN)
    assert plan.owner is Owner.RHO and json.loads(plan.model_dump_json())["owner"] == "rho"
    with pytest.raises(InputError, match=r"owner: Input should be 'E', 'W', 'rho' or 'C'"):
        parse_plan({**PLAN, "owner": "none"})


# a stage's figures as the flow writes them (GateResult.as_dict(), ...): ints stay ints, a refusal's dropped_errors -1
GATE = {
    "accept": True,
    "net": 0.1,
    "ci_lo": 0.01,
    "ci_hi": 0.2,
    "n_items": 40,
    "n_improved": 6,
    "n_regressed": 1,
    "reason": "net +0.1000",
    "base_mean": 0.5,
    "cand_mean": 0.6,
    "dropped_errors": 0,
}
REFUSED = {
    **GATE,
    "accept": False,
    "net": 0.0,
    "ci_lo": 0.0,
    "ci_hi": 0.0,
    "n_items": 0,
    "n_improved": 0,
    "n_regressed": 0,
    "reason": "refused: 6 of 10",
    "base_mean": 0.0,
    "cand_mean": 0.0,
    "dropped_errors": -1,
}
REPAIR = {
    "ok": False,
    "repaired": 0,
    "broken": 1,
    "base_mean": 0.5,
    "cand_mean": 0.25,
    "n_items": 4,
    "reason": "repaired 0",
}
SEQ_GATE = {
    "looks": 2,
    "spending": "pocock",
    "by": "seeds",
    "looks_used": 1,
    "stopped_early": True,
    "why": "early",
    "per_look": [
        {"look": 1, "n_looks": 2, "n_items": 40, "level": 0.0123, "lo": 0.01, "hi": 0.2, "net": 0.1, "regressed": 1}
    ],
}
EVALUATION = {
    "benchmark": "data/benchmarks/retail",
    "split": "dev",
    "seeds": [0, 1],
    "model": "sim",
    "model_cfg": {"skill": 0.7},
    "max_turns": 40,
    "gate": {
        "alpha": 0.0045,
        "n_boot": 10000,
        "seed": 0,
        "reg_cap": 2,
        "material": 0.05,
        "max_error_share": 0.25,
        "min_items": 5,
        "campaign_alpha": 0.05,
        "reg_share": 0.0,
    },
    "sequential": {"looks": 2, "spending": "pocock", "by": "seeds", "looks_used": 1},
}

RECORDS = [  # one of every shape a round's record has, as the flow wrote them when they were dicts
    {
        "round": 3,
        "round_dir": "rounds/r03",
        "champion_before": "M1",
        "reason": "no patchable cluster left",
        "verdict": "no_plan",
    },
    {
        "round": 2,
        "round_dir": "rounds/r02",
        "champion_before": "M1",
        "reason": "meta-agent: not JSON",
        "verdict": "rejected_plan",
        "meta_agent": {"failure": "not JSON", "replies": [{"turn": 0, "raw": "x"}]},
    },
    {
        "round": 1,
        "round_dir": "rounds/r01",
        "champion_before": "M0",
        "validation": {"schema": "ok", "lint": "bad"},
        "candidate_digest": "c" * 64,
        "benchmark_digest": "b" * 64,
        "reason": "invalid: lint: bad",
        "verdict": "reject",
        "plan_key": "k1",
        "owner": "W",
        "summary": "W: board",
        "parent": {"version": "M0", "digest": "d"},
        "child": None,
    },
    {
        "round": 4,
        "round_dir": "rounds/r04",
        "champion_before": "M1",
        "gate": GATE,
        "dev_look": {"look": 1, "alpha": 0.0045, "spent": 0.00225, "campaign_alpha": 0.05},
        "sequential": {"repair": None, "gate": SEQ_GATE},
        "reason": "ok",
        "verdict": "accept",
        "version": "M2",
        "plan_key": "k2",
        "owner": "E",
        "summary": "E: card",
        "mechanism": "deliver:x@",
        "evaluation": EVALUATION,
    },
    {
        "round": 5,
        "round_dir": "rounds/r05",
        "champion_before": "M2",
        "repair": REPAIR,
        "sequential": {"repair": {"looks": 1, "looks_used": 1, "stopped_early": False, "why": "full screen"}},
        "reason": "repair screen: repaired 0",
        "verdict": "reject",
        "plan_key": "k3",
        "owner": "rho",
        "summary": "rho",
        "candidate_digest": "c" * 64,
        "benchmark_digest": "b" * 64,
        "parent": {"version": "M2", "digest": "e"},
        "child": None,
        "from_an_older_ratchet": {"kept": True},
    },
]


@pytest.mark.parametrize("rec", RECORDS, ids=[r["verdict"] for r in RECORDS])
def test_a_round_record_writes_the_bytes_its_dict_did(rec):
    typed = RoundRecord.of(rec)
    assert dumps(typed.dump()) == dumps(rec)  # round.json, summary.json
    assert json.dumps(typed.dump(), sort_keys=True) == json.dumps(rec, sort_keys=True)  # the lineage
    assert typed.accepted == (rec["verdict"] == "accept")
    assert typed.stops_campaign == (rec["verdict"] in ("no_plan", "rejected_plan"))


def test_a_round_records_stage_results_are_typed_and_read_back_as_written():
    from components.evolution.gate import GateConfig, GateResult, RepairResult
    from components.evolution.record import Evaluation, Looks, StageLooks, VersionRef

    rec = RoundRecord.of(RECORDS[3])
    assert isinstance(rec.gate, GateResult) and rec.gate.ci_lo == 0.01 and rec.gate.n_items == 40
    assert isinstance(rec.evaluation.gate, GateConfig) and rec.evaluation.gate.alpha == 0.0045
    assert rec.evaluation.sequential.looks_used == 1 and rec.sequential.gate.per_look[0].level == 0.0123
    assert rec.sequential.stages() == {"repair": None, "gate": rec.sequential.gate}
    assert RoundRecord.of(RECORDS[4]).repair == RepairResult(**REPAIR) and RoundRecord.of(RECORDS[4]).child is None
    assert RoundRecord.of(RECORDS[4]).champion_after == VersionRef(version="M2", digest="e")
    # each nested model reads back what it wrote, to the byte
    for model, data in (
        (Looks, SEQ_GATE),
        (StageLooks, RECORDS[4]["sequential"]),
        (Evaluation, EVALUATION),
        (VersionRef, {"version": "M1", "digest": "d"}),
    ):
        assert dumps(model.model_validate(data).model_dump(exclude_unset=True)) == dumps(data)
    for data in (GATE, REFUSED):
        held = RoundRecord.of({**RECORDS[3], "gate": data})
        assert dumps(held.dump()["gate"]) == dumps(data) == dumps(GateResult.from_dict(data).as_dict())
    assert RoundRecord.of({**RECORDS[3], "gate": REFUSED}).gate.refused  # -1 in the file, None held
    assert dumps(RepairResult.from_dict(REPAIR).as_dict()) == dumps(REPAIR)
    # a typed record built from the stages' own results writes what the dicts did
    built = RoundRecord(
        **{
            **RECORDS[3],
            "gate": GateResult.from_dict(GATE),
            "evaluation": {**EVALUATION, "gate": GateConfig(**EVALUATION["gate"])},
        }
    )
    assert dumps(built.dump()) == dumps(RECORDS[3])


def test_a_damaged_stage_result_is_refused_naming_the_field():
    with pytest.raises(ValueError, match=r"gate\n.*missing 1 required positional argument: 'reason'"):
        RoundRecord.of({**RECORDS[3], "gate": {k: v for k, v in GATE.items() if k != "reason"}})
    with pytest.raises(ValueError, match=r"evaluation\.gate\n.*n_boot"):
        RoundRecord.of({**RECORDS[3], "evaluation": {**EVALUATION, "gate": {**EVALUATION["gate"], "n_boot": 3}}})
    with pytest.raises(ValueError, match=r"repair\n.*expected a RepairResult mapping"):
        RoundRecord.of({**RECORDS[4], "repair": [1, 2]})


def test_a_round_record_refuses_an_unknown_verdict_or_owner():
    with pytest.raises(ValueError, match="verdict"):
        RoundRecord.of({**RECORDS[0], "verdict": "maybe"})
    with pytest.raises(ValueError, match="owner"):
        RoundRecord.of({**RECORDS[2], "owner": "none"})


def test_the_simulated_agent_reads_bounces_by_code_through_the_messages_checkers_send(monkeypatch):
    from components.memory import strategies

    confirm = strategies.bounce(CheckCode.UNCONFIRMED, tool="modify_order", confirm="confirm")
    finish = strategies.bounce(CheckCode.PENDING_WORK, items="L1 cancel order_id=#1")
    assert (confirm.ok, confirm.code, finish.code) == (False, CheckCode.UNCONFIRMED, CheckCode.PENDING_WORK)
    feedback = f"# Draft bounced\nYour draft was not accepted:\n{confirm.reason}\n{finish.reason}\nRevise it."
    assert strategies.bounce_codes(feedback) == {CheckCode.UNCONFIRMED, CheckCode.PENDING_WORK}
    # the words alone are not a bounce (what the agent used to look for)
    assert strategies.bounce_codes("the confirmation card says: cannot finish early") == frozenset()
    # reworded, the message still reads back to its code: rewording changes no behaviour
    monkeypatch.setitem(strategies.BOUNCES, CheckCode.UNCONFIRMED, "ask the customer before `{tool}` ({confirm})")
    reworded = strategies.bounce(CheckCode.UNCONFIRMED, tool="modify_order", confirm="confirm").reason
    assert "confirmation" not in reworded and strategies.bounce_codes(reworded) == {CheckCode.UNCONFIRMED}


def test_a_mechanism_fires_on_a_fingerprint_entry_never_inside_one():
    def traces(*fingerprints):
        return pd.DataFrame({"fingerprint": [json.dumps(f) for f in fingerprints]})

    assert fired(traces(["ground:L1:done"], ["deliver:card-a@intent_recorded"]), "deliver:card-a@")
    assert fired(traces(["board"]), "board")
    assert not fired(traces(["deliver:card-b@intent_recorded"]), "deliver:card-a@")
    # a quote inside an entry's text is not the start of an entry (the JSON text holds `"deliver:card-a@`)
    assert not fired(traces(['note:said "deliver:card-a@ now"']), "deliver:card-a@")
    assert not fired(pd.DataFrame({"fingerprint": []}), "board")


def test_meta_agents_answer_with_a_typed_outcome_and_say_whether_they_spend():
    from components.evolution.meta import PlanOutcome, make_meta_agent

    rules = make_meta_agent("rules", {})
    llm = make_meta_agent("llm", {"model": "sim"})
    assert callable(rules.plan) and callable(llm.plan)
    assert (rules.spends, llm.spends) == (False, True)
    assert not hasattr(llm, "usage")  # what a plan cost is in its outcome, not on the agent
    assert "usage" in PlanOutcome.__dataclass_fields__ and "usage" not in PlanOutcome().record()


ROUND_STAGES = (
    "run_round",
    "evaluate_train",
    "diagnose_train",
    "plan_round",
    "patch_candidate",
    "validate_candidate",
    "repair_screen",
    "dev_gate",
    "gate_figures",
    "reject",
    "commit",
)


def test_a_round_is_a_sequence_of_stage_calls_without_nested_closures():
    import flows.round as campaign

    tree = ast.parse(Path(inspect.getsourcefile(campaign)).read_text())
    funcs = {f.name: f for f in tree.body if isinstance(f, ast.FunctionDef)}
    for name in ROUND_STAGES:
        nested = [
            n
            for n in ast.walk(funcs[name])
            if n is not funcs[name] and isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        ]
        assert not nested, f"{name} defines {len(nested)} nested function(s)"
    body = funcs["run_round"]
    assert body.end_lineno - body.lineno < 40  # was 148 lines with six closures
    called = {n.func.id for n in ast.walk(body) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    assert set(ROUND_STAGES[1:9]) <= called  # every stage, called from the round itself
