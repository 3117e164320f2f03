"""Plan schema, patching a disposable copy, static validation, the lineage of versions, and evidence citations."""

from __future__ import annotations

import copy
import dataclasses
import filecmp
import json
import os
import shutil
from pathlib import Path

import pandas as pd
import pytest

from components.errors import InputError
from components.evidence.packets import Citation, Claim, EvidencePacket, verify_citations
from components.evolution.lineage import CommitError, Lineage
from components.evolution.patch import PatchError, apply_plan
from components.evolution.plan import Plan, parse_plan
from components.evolution.validate import fired, leak_tokens, leakage, reachability, static_checks
from components.memory import load_package
from components.memory.cards import Card, CardMeta, Trigger
from components.memory.package import digest
from components.runtime.evaluate import run_shard

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ROOT / "data" / "packages"
HASH = "ab" * 32


# -- helpers -----------------------------------------------------------------------------------------------------


def plan_dict(*ops: dict, owner: str = "E", mechanism: str = "deliver:new-card") -> dict:
    return {
        "owner": owner,
        "cluster": "cluster-1",
        "summary": "a test change",
        "rationale": "",
        "evidence": [{"episode_id": "retail-cancel-002#0", "step": 3, "hash": HASH}],
        "operations": list(ops),
        "mechanism": mechanism,
        "source_items": ["retail-cancel-002"],
    }


def add_card(
    path: str = "em/procedure/new-card.md",
    body: str = "Check the order status before a write.",
    event: str = "intent_recorded",
    tool: str | None = "cancel_pending_order",
    **meta,
) -> dict:
    card_id = Path(path).stem
    trigger = {"event": event, **({"tool": tool} if tool else {})}
    return {
        "op": "add_card",
        "path": path,
        "body": body,
        "meta": {"id": card_id, "type": path.split("/")[1], "trigger": trigger, "source": "tests", **meta},
    }


def plan(*ops: dict, **kw) -> Plan:
    return parse_plan(plan_dict(*ops, **kw))


def tree(root: Path) -> dict[str, bytes]:
    """Every file (and link target) under root, by relative path: to prove nothing changed."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if p.is_symlink():
            out[rel] = b"link:" + os.readlink(p).encode()
        elif p.is_file():
            out[rel] = p.read_bytes()
    return out


def leftovers(parent: Path, name: str) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith(f".{name}."))


def write_card(
    pkg: Path,
    card_id: str,
    body: str,
    *,
    tool: str = "cancel_pending_order",
    source: str = "tests",
    event: str = "intent_recorded",
    type: str = "procedure",
) -> str:
    rel = f"em/{type}/{card_id}.md"
    (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
    (pkg / rel).write_text(
        f"---\nid: {card_id}\ntype: {type}\ntrigger:\n  event: {event}\n  tool: {tool}\n"
        f"source: {json.dumps(source)}\n---\n{body}\n",
        encoding="utf-8",
    )
    return rel


# -- plan schema -------------------------------------------------------------------------------------------------


def test_a_valid_plan_parses_from_dict_and_json():
    raw = plan_dict(add_card(), {"op": "set_wm", "field": "max_entries", "value": 6})
    p = parse_plan(raw)
    assert parse_plan(json.dumps(raw)) == p
    assert [o.op for o in p.operations] == ["add_card", "set_wm"]
    # the key is the change itself: same owner + operations, same key; another owner, another key
    other = copy.deepcopy(raw)
    other["summary"], other["cluster"] = "reworded", "cluster-2"
    assert parse_plan(other).key() == p.key()
    assert parse_plan({**raw, "owner": "C"}).key() != p.key()


BAD_PATHS = [
    "/etc/x.md",
    "../x.md",
    "em/procedure/../../x.md",
    "em/../em/procedure/x.md",
    "em\\procedure\\x.md",
    "em/procedure\\x.md",
    "em/procedure/sub/x.md",
    "em/bogus/x.md",
    "notes/x.md",
    "x.md",
    "em/procedure/x.txt",
    "em/procedure/./x.md",
    "em/procedure/X.md",
    "/work/main/em/procedure/x.md",
]


@pytest.mark.parametrize("path", BAD_PATHS)
@pytest.mark.parametrize("op", ["add_card", "set_trigger"])
def test_path_escaping_card_paths_are_refused(path, op):
    o = add_card(path="em/procedure/x.md") if op == "add_card" else {"op": "set_trigger", "event": "intent_recorded"}
    o["path"] = path
    with pytest.raises(InputError) as exc:
        parse_plan(plan_dict(o), where="round-3/plan.json")
    msg = str(exc.value)
    assert msg.startswith("round-3/plan.json: operations.0.")
    assert f"{op}.path" in msg
    assert repr(path) in msg


def test_card_path_with_trailing_newline_is_refused():
    with pytest.raises(InputError, match="path"):
        parse_plan(plan_dict(add_card(path="em/procedure/x.md\n")))


def test_unknown_op_is_refused():
    with pytest.raises(InputError) as exc:
        parse_plan(plan_dict({"op": "delete_tree", "path": "em/procedure/x.md"}))
    assert "operations.0" in str(exc.value) and "delete_tree" in str(exc.value)


def test_empty_operations_are_refused():
    with pytest.raises(InputError, match=r"^plan: operations: "):
        parse_plan(plan_dict())


@pytest.mark.parametrize("evidence", [None, []])
def test_missing_evidence_is_refused(evidence):
    raw = plan_dict(add_card())
    if evidence is None:
        del raw["evidence"]
    else:
        raw["evidence"] = evidence
    with pytest.raises(InputError, match=r"^plan: evidence: "):
        parse_plan(raw)


def test_other_schema_refusals_name_the_field():
    with pytest.raises(InputError, match=r"evidence\.0\.hash"):
        parse_plan({**plan_dict(add_card()), "evidence": [{"episode_id": "e", "step": 0, "hash": "short"}]})
    with pytest.raises(InputError, match=r"^plan: owner: "):
        parse_plan({**plan_dict(add_card()), "owner": "model"})
    with pytest.raises(InputError, match=r"operations.0.add_card.surprise"):
        parse_plan(plan_dict({**add_card(), "surprise": 1}))
    with pytest.raises(InputError, match=r"^plan: operations: "):
        parse_plan(plan_dict(*[add_card(path=f"em/procedure/c{k}.md") for k in range(5)]))


# -- patch -------------------------------------------------------------------------------------------------------


def test_apply_plan_on_seed_gives_a_loadable_candidate(package_copy, tmp_path):
    base = package_copy("seed")
    before_digest, before = digest(base), tree(base)
    p = plan(
        add_card(body="Map the customer's words onto an allowed reason."),
        {"op": "add_binding", "section": "delivery", "use": "event_cards", "at": "intent_recorded"},
        {"op": "set_wm", "field": "max_entries", "value": 6},
    )
    out = apply_plan(p, base, tmp_path / "cand")
    assert out == tmp_path / "cand"
    pkg = load_package(out)
    assert set(pkg.cards) == {"new-card"}
    card = pkg.cards["new-card"]
    assert card.path == "em/procedure/new-card.md"
    assert card.body.strip() == "Map the customer's words onto an allowed reason."
    assert card.meta.trigger == Trigger(event="intent_recorded", tool="cancel_pending_order")
    assert [b.label for b in pkg.delivery] == ["event_cards@intent_recorded"]
    assert pkg.wm.max_entries == 6
    assert pkg.name == "seed"
    assert digest(base) == before_digest and tree(base) == before  # the base is untouched
    assert leftovers(tmp_path, "cand") == []


def test_apply_plan_on_reference_changes_trigger_and_bindings(package_copy, tmp_path):
    base = package_copy("reference")
    before = digest(base)
    p = plan(
        {"op": "set_trigger", "path": "em/procedure/cancel-reason.md", "event": "turn_start"},
        {"op": "remove_binding", "section": "checkers", "use": "confirm_before_write", "at": "pre_write"},
        {
            "op": "add_binding",
            "section": "delivery",
            "use": "event_cards",
            "at": "turn_start",
            "cfg": {"max_per_episode": 2},
        },
        owner="rho",
    )
    out = apply_plan(p, base, tmp_path / "cand")
    pkg = load_package(out)
    assert pkg.cards["cancel-reason"].meta.trigger == Trigger(event="turn_start")
    assert pkg.cards["normalize-shipping-address"].meta.trigger.event == "intent_recorded"
    assert [b.label for b in pkg.checkers] == ["completion_requires_receipts@agent_declares_done"]
    assert [b.label for b in pkg.delivery] == ["event_cards@intent_recorded", "event_cards@turn_start"]
    assert pkg.delivery[1].spec.cfg == {"max_per_episode": 2}
    assert digest(base) == before
    assert pkg.digest != before
    # the body of the re-triggered card is kept
    assert (base / "em/procedure/cancel-reason.md").read_text().split("---")[-1].strip() == pkg.cards[
        "cancel-reason"
    ].body.strip()


@pytest.mark.parametrize("link", ["em/procedure", "em"])
@pytest.mark.parametrize("op", ["add_card", "set_trigger"])
def test_symlink_in_base_is_refused_before_any_write(package_copy, tmp_path, link, op):
    base = package_copy("reference")
    outside = tmp_path / "outside"
    shutil.move(str(base / link), str(outside))  # the real directory now lives outside the package
    os.symlink(outside, base / link, target_is_directory=True)
    before_outside, before_base = tree(outside), tree(base)
    o = (
        add_card(path="em/procedure/evil.md")
        if op == "add_card"
        else {"op": "set_trigger", "path": "em/procedure/cancel-reason.md", "event": "turn_start"}
    )
    out = tmp_path / "work" / "cand"
    with pytest.raises(PatchError) as exc:
        apply_plan(plan(o), base, out)
    assert "symlink" in str(exc.value) and "operations.0.path" in str(exc.value)
    assert not out.exists()
    assert not out.parent.exists()  # refused before even the parent was made
    assert tree(outside) == before_outside
    assert tree(base) == before_base


@pytest.mark.parametrize(
    "op,words",
    [
        (add_card(path="em/procedure/cancel-reason.md"), "already exists"),
        ({"op": "remove_binding", "section": "checkers", "use": "confirm_before_write", "at": "draft_ready"}, "has no"),
        ({"op": "remove_binding", "section": "delivery", "use": "all_cards", "at": "intent_recorded"}, "has no"),
        ({"op": "add_binding", "section": "delivery", "use": "event_cards", "at": "intent_recorded"}, "already binds"),
        ({"op": "set_trigger", "path": "em/procedure/missing.md", "event": "turn_start"}, "does not exist"),
    ],
)
def test_conflicting_operations_leave_nothing_behind(package_copy, tmp_path, op, words):
    base = package_copy("reference")
    before = digest(base)
    good = add_card(path="em/procedure/fine.md")  # a first op that succeeds in the temp dir
    out = tmp_path / "cand"
    with pytest.raises(PatchError) as exc:
        apply_plan(plan(good, op), base, out)
    assert words in str(exc.value) and "operations.1" in str(exc.value)
    assert not out.exists()
    assert leftovers(tmp_path, "cand") == []
    assert digest(base) == before


def test_failed_patch_keeps_an_existing_candidate(package_copy, tmp_path):
    base = package_copy("reference")
    out = apply_plan(plan(add_card(path="em/procedure/first.md")), base, tmp_path / "cand")
    before = tree(out)
    with pytest.raises(PatchError):
        apply_plan(plan(add_card(path="em/procedure/cancel-reason.md")), base, out)
    assert tree(out) == before
    assert leftovers(tmp_path, "cand") == []


# -- validation: leakage -----------------------------------------------------------------------------------------


def _task_of(bench, split: str, pred) -> object:
    return next(bench.tasks[i] for i in bench.ids(split) if pred(bench.tasks[i]))


def _leaky_values(bench) -> dict[str, str]:
    """One value of each kind a card must never contain, drawn from each split."""
    test_task = bench.tasks[bench.ids("test")[0]]
    dev_order = next(r["order_id"] for i in bench.ids("dev") for r in bench.tasks[i].requests if "order_id" in r)
    train_task = bench.tasks[bench.ids("train")[0]]
    addr_task = next(t for t in bench.tasks.values() if any("address" in c.args for c in t.rubric))
    normalized = next(c.args["address"]["address1"] for c in addr_task.rubric if "address" in c.args)
    item_task = next(t for t in bench.tasks.values() if any("item_ids" in c.args for c in t.rubric))
    item_id = next(c.args["item_ids"][0] for c in item_task.rubric if "item_ids" in c.args)
    return {
        "task id (test)": test_task.id,
        "order id (dev)": dev_order,
        "user id (train)": train_task.user_id,
        "email (train)": bench.db["users"][train_task.user_id]["email"],
        "normalized address": normalized,
        "item id": item_id,
    }


LEAK_KINDS = ["task id (test)", "order id (dev)", "user id (train)", "email (train)", "normalized address", "item id"]


@pytest.mark.parametrize("kind", LEAK_KINDS)
def test_leakage_flags_task_data_from_any_split(bench, package_copy, kind):
    value = _leaky_values(bench)[kind]
    assert value in leak_tokens(bench)
    pkg_dir = package_copy("reference")
    rel = write_card(pkg_dir, "leaky", f"If the customer says so, remember {value.upper()} for later.")
    found = leakage(load_package(pkg_dir), bench)
    assert len(found) == 1
    assert found[0].startswith(f"{rel}: contains task data")
    assert repr(value) in found[0]


def test_leakage_looks_at_the_front_matter_too(bench, package_copy):
    pkg_dir = package_copy("reference")
    task_id = bench.ids("train")[0]
    rel = write_card(pkg_dir, "from-failure", "Read the order before writing.", source=f"failure in {task_id}")
    found = leakage(load_package(pkg_dir), bench)
    assert len(found) == 1 and found[0].startswith(rel) and task_id in found[0]


def test_reference_cards_are_clean(bench):
    assert leakage(load_package(PACKAGES / "reference"), bench) == []
    assert leakage(load_package(PACKAGES / "all-skills"), bench) == []


def test_policy_vocabulary_is_not_a_leak(bench, package_copy):
    pkg_dir = package_copy("reference")
    body = (
        "Use "
        + ", ".join(f"`{t}`" for t in sorted(bench.tool_names))
        + ". A cancellation reason is exactly 'no longer needed' or 'ordered by mistake'; confirm every write."
    )
    write_card(pkg_dir, "vocabulary", body)
    pkg = load_package(pkg_dir)
    assert "vocabulary" in pkg.cards
    assert leakage(pkg, bench) == []


# -- validation: reachability ------------------------------------------------------------------------------------


def test_reference_is_reachable(bench):
    assert reachability(load_package(PACKAGES / "reference"), bench) == []


def test_trigger_tool_not_in_world_is_flagged(bench, package_copy):
    pkg_dir = package_copy("reference")
    rel = write_card(pkg_dir, "ghost-tool", "Do the thing.", tool="frobnicate_order")
    write_card(pkg_dir, "finish-tool", "Before finishing, check every receipt.", tool="finish")
    problems = reachability(load_package(pkg_dir), bench)
    assert len(problems) == 1
    assert problems[0].startswith(rel) and "'frobnicate_order'" in problems[0] and "trigger.tool" in problems[0]


def test_event_without_delivering_binding_is_flagged(bench):
    pkg = load_package(PACKAGES / "reference")
    # load_package already refuses this shape; reachability must catch it on its own too
    stripped = dataclasses.replace(pkg, delivery=tuple(b for b in pkg.delivery if not b.strategy.delivers_cards))
    problems = reachability(stripped, bench)
    assert len(problems) == len(pkg.cards) == 6
    assert all("no binding delivers cards at 'intent_recorded'" in p for p in problems)
    assert {p.split(":")[0] for p in problems} == {c.path for c in pkg.cards.values()}


def test_event_cards_are_never_delivered_at_is_flagged(bench):
    pkg = load_package(PACKAGES / "reference")
    meta = CardMeta(id="at-done", type="procedure", trigger=Trigger(event="agent_declares_done"), source="tests")
    card = Card(meta=meta, body="x", path="em/procedure/at-done.md")
    problems = reachability(dataclasses.replace(pkg, cards={**pkg.cards, "at-done": card}), bench)
    assert problems == [
        "em/procedure/at-done.md: trigger.event 'agent_declares_done' is not an event cards are delivered at"
    ]


def test_blanket_delivery_reaches_every_event(bench):
    pkg = load_package(PACKAGES / "all-skills")
    assert any(b.strategy.ignores_triggers for b in pkg.delivery)
    assert reachability(pkg, bench) == []


# -- validation: static checks -----------------------------------------------------------------------------------


def test_static_checks_pass_a_clean_candidate(bench, package_copy, tmp_path):
    p = plan(add_card(body="Before any write, read the order with `get_order_details`."))
    cand = apply_plan(p, package_copy("reference"), tmp_path / "cand")
    v, pkg = static_checks(p, cand, bench)
    assert v.ok is True and v.problems == []
    assert v.checks == {"schema": "ok", "lint": "ok", "leakage": "ok", "reachability": "ok"}
    assert pkg is not None and "new-card" in pkg.cards


def test_static_checks_refuse_a_leaking_candidate(bench, package_copy, tmp_path):
    order = _leaky_values(bench)["order id (dev)"]
    p = plan(add_card(body=f"For order {order}, cancel it without asking."))
    cand = apply_plan(p, package_copy("reference"), tmp_path / "cand")
    v, pkg = static_checks(p, cand, bench)
    assert v.ok is False
    assert v.checks["lint"] == "ok" and v.checks["reachability"] == "ok"
    assert len(v.problems) == 1 and v.problems[0].startswith("leakage: em/procedure/new-card.md")
    assert order in v.problems[0]


def test_static_checks_refuse_an_unreachable_tool(bench, package_copy, tmp_path):
    p = plan(add_card(tool="teleport_package"))
    cand = apply_plan(p, package_copy("reference"), tmp_path / "cand")
    v, _ = static_checks(p, cand, bench)
    assert v.ok is False and [x.split(":")[0] for x in v.problems] == ["reachability"]


def test_static_checks_refuse_a_candidate_that_does_not_load(bench, package_copy, tmp_path):
    # the seed delivers no cards: a card added without a binding is dead weight, a lint error
    p = plan(add_card())
    cand = apply_plan(p, package_copy("seed"), tmp_path / "cand")
    v, pkg = static_checks(p, cand, bench)
    assert v.ok is False and pkg is None
    assert "lint" in v.checks and v.checks["lint"] != "ok"
    assert "new-card.md" in v.checks["lint"]
    assert "leakage" not in v.checks


# -- validation: did the mechanism fire --------------------------------------------------------------------------


def test_fired_on_a_tiny_frame():
    traces = pd.DataFrame(
        {
            "fingerprint": [
                json.dumps(["board", "ledger:add:e1"]),
                json.dumps(["deliver:cancel-reason@intent_recorded", "redraft"]),
                json.dumps([]),
            ]
        }
    )
    assert fired(traces, "deliver:cancel-reason") is True
    assert fired(traces, "deliver:cancel-reason@intent_recorded") is True
    assert fired(traces, "redraft") is True
    assert fired(traces, "deliver:normalize-shipping-address") is False
    assert fired(traces, "cancel-reason") is False  # a prefix of an entry, not any substring
    assert fired(traces, "check:") is False
    assert fired(pd.DataFrame(), "board") is False


@pytest.fixture(scope="module")
def cancel_item(bench) -> str:
    return next(i for i in bench.ids("train") if bench.tasks[i].family == "cancel")


@pytest.fixture(scope="module")
def reference_traces(bench, cancel_item):
    return run_shard(PACKAGES / "reference", bench, [cancel_item], [0]).traces


def test_fired_on_real_traces(reference_traces):
    assert fired(reference_traces, "deliver:cancel-reason") is True
    assert fired(reference_traces, "deliver:refund-original-payment") is False
    assert fired(reference_traces, "check:confirm_before_write") is True
    assert fired(reference_traces, "check:completion_requires_receipts@draft_ready") is False


# -- lineage -----------------------------------------------------------------------------------------------------


def assert_jsonl(lin: Lineage) -> list[dict]:
    text = lin.log.read_text(encoding="utf-8")
    assert text.endswith("\n")
    lines = text.splitlines()
    assert all(line.strip() for line in lines)
    recs = [json.loads(line) for line in lines]
    assert all(isinstance(r, dict) for r in recs)
    return recs


def same_tree(a: Path, b: Path) -> bool:
    return tree(a) == tree(b)


@pytest.fixture
def campaign(package_copy, tmp_path):
    start = package_copy("seed")
    lin = Lineage(tmp_path / "lineage")
    return lin, start


def _candidate(start: Path, tmp_path: Path) -> Path:
    """The start package with one manifest change: a candidate the gate could have evaluated."""
    return apply_plan(plan({"op": "set_wm", "field": "max_entries", "value": 5}), start, tmp_path / "cand")


def test_start_commits_m0_idempotently(campaign):
    lin, start = campaign
    v0 = lin.start(start)
    assert v0.name == "M0" and v0.path == lin.versions_dir / "M0" and v0.digest == digest(start)
    assert same_tree(v0.path, start)
    recs = assert_jsonl(lin)
    assert [r["verdict"] for r in recs] == ["start"]
    again = lin.start(start)
    assert again == v0
    assert len(assert_jsonl(lin)) == 1
    assert sorted(p.name for p in lin.versions_dir.iterdir()) == ["M0"]
    assert lin.champion() == v0


def test_commit_refuses_a_changed_candidate(campaign, package_copy, tmp_path):
    lin, start = campaign
    lin.start(start)
    cand = _candidate(start, tmp_path)
    evaluated = digest(cand)
    (cand / "manifest.yaml").write_text((cand / "manifest.yaml").read_text() + "# edited after the gate\n")
    log_before = lin.log.read_bytes()
    with pytest.raises(CommitError, match="differs from the evaluated"):
        lin.commit(cand, evaluated, 1, {"reason": "accepted"})
    assert not (lin.versions_dir / "M1").exists()
    assert lin.log.read_bytes() == log_before
    assert leftovers(lin.versions_dir, "M1") == []


def test_commit_creates_a_byte_identical_version(campaign, package_copy, tmp_path):
    lin, start = campaign
    v0 = lin.start(start)
    cand = _candidate(start, tmp_path)
    d = digest(cand)
    v1 = lin.commit(cand, d, 1, {"reason": "net +0.1", "plan_key": "k1"})
    assert v1.name == "M1" and v1.digest == d
    assert same_tree(v1.path, cand)
    cmp = filecmp.dircmp(v1.path, cand)
    assert not cmp.left_only and not cmp.right_only and not cmp.diff_files
    recs = assert_jsonl(lin)
    assert [r["verdict"] for r in recs] == ["start", "accept"]
    rec = recs[-1]
    assert rec["round"] == 1 and rec["reason"] == "net +0.1" and rec["plan_key"] == "k1"
    assert rec["parent"] == {"version": "M0", "digest": v0.digest}
    assert rec["child"] == {"version": "M1", "digest": d}
    assert lin.champion() == v1
    assert [v.name for v in lin.versions()] == ["M0", "M1"]
    assert lin.round_record(1) == rec


def test_commit_refuses_to_overwrite_a_version_with_other_bytes(campaign, package_copy, tmp_path):
    lin, start = campaign
    lin.start(start)
    squatter = lin.versions_dir / "M1"
    shutil.copytree(PACKAGES / "reference", squatter)
    before = tree(squatter)
    log_before = lin.log.read_bytes()
    cand = _candidate(start, tmp_path)
    with pytest.raises(CommitError, match="refusing to overwrite"):
        lin.commit(cand, digest(cand), 1, {})
    assert tree(squatter) == before
    assert lin.log.read_bytes() == log_before
    assert_jsonl(lin)


def test_commit_repeated_after_a_crash_completes_without_duplicating(campaign, package_copy, tmp_path):
    lin, start = campaign
    lin.start(start)
    cand = _candidate(start, tmp_path)
    d = digest(cand)
    shutil.copytree(cand, lin.versions_dir / "M1")  # the crash: version renamed into place, record not written
    v1 = lin.commit(cand, d, 1, {"reason": "retry"})
    assert v1.name == "M1" and v1.digest == d
    assert sorted(p.name for p in lin.versions_dir.iterdir()) == ["M0", "M1"]
    recs = assert_jsonl(lin)
    assert [(r["verdict"], r["child"]["version"]) for r in recs] == [("start", "M0"), ("accept", "M1")]
    assert same_tree(lin.versions_dir / "M1", cand)


def test_reject_records_the_plan(campaign, tmp_path):
    lin, start = campaign
    v0 = lin.start(start)
    p = plan(add_card())
    lin.reject(2, {"plan_key": p.key(), "reason": "gate: CI does not exclude zero"}, p.model_dump())
    saved = json.loads((lin.rejected_dir / f"{p.key()}.json").read_text())
    assert saved["reason"] == "gate: CI does not exclude zero"
    assert parse_plan(saved["plan"]) == p
    assert lin.rejected_keys() == {p.key()}
    recs = assert_jsonl(lin)
    assert recs[-1]["verdict"] == "reject" and recs[-1]["child"] is None and recs[-1]["round"] == 2
    assert recs[-1]["parent"] == {"version": "M0", "digest": v0.digest}
    assert lin.champion() == v0  # a reject never moves the champion
    # a round with no plan is recorded but adds no key
    lin.reject(3, {"reason": "nothing to try", "verdict": "no_plan"})
    assert lin.rejected_keys() == {p.key()}
    assert [r["verdict"] for r in assert_jsonl(lin)] == ["start", "reject", "no_plan"]


def test_lineage_needs_a_start(tmp_path, package_copy):
    lin = Lineage(tmp_path / "fresh")
    assert lin.records() == [] and lin.rejected_keys() == set()
    with pytest.raises(CommitError, match="no committed version"):
        lin.champion()
    cand = package_copy("seed")
    with pytest.raises(CommitError):
        lin.commit(cand, digest(cand), 1, {})
    assert not (lin.versions_dir / "M0").exists()


# -- evidence packets --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def seed_traces(bench):
    items = [i for i in bench.ids("train") if bench.tasks[i].family in ("cancel", "return")][:2]
    t = run_shard(PACKAGES / "seed", bench, items, [0])
    assert len(t.traces) > 2 and t.traces["episode_id"].nunique() == 2
    return t.traces


def packet(*cites: Citation) -> EvidencePacket:
    return EvidencePacket(
        id="pk-1",
        corpus="pkg:bench:seeds",
        owner="E",
        opportunity="present",
        patchability="memory",
        kind="wrong_reason",
        episodes=sorted({c.episode_id for c in cites}),
        items=["x"],
        claims=[Claim(statement="the agent passed the customer's words", evidence=list(cites))],
    )


def cite(traces: pd.DataFrame, row: int, **over) -> Citation:
    r = traces.iloc[row]
    return Citation(**{"episode_id": r["episode_id"], "step": int(r["step"]), "hash": r["hash"], **over})


def test_real_citations_verify(seed_traces):
    last = len(seed_traces) - 1
    pk = packet(cite(seed_traces, 0), cite(seed_traces, 2), cite(seed_traces, last))
    assert verify_citations(pk, seed_traces) == []


def test_citations_verify_after_a_parquet_round_trip(seed_traces, tmp_path):
    seed_traces.to_parquet(tmp_path / "traces.parquet", index=False)
    back = pd.read_parquet(tmp_path / "traces.parquet")
    pk = packet(*[cite(back, i) for i in range(len(back))])
    assert verify_citations(pk, back) == []


def test_wrong_hash_is_reported(seed_traces):
    good = cite(seed_traces, 1)
    pk = packet(cite(seed_traces, 0), cite(seed_traces, 1, hash="0" * 64))
    problems = verify_citations(pk, seed_traces)
    assert len(problems) == 1
    assert f"{good.episode_id} step {good.step}" in problems[0] and "hash 000000000000" in problems[0]


def test_step_that_does_not_exist_is_reported(seed_traces):
    ep = seed_traces.iloc[0]["episode_id"]
    pk = packet(cite(seed_traces, 0, step=999), cite(seed_traces, 0, episode_id="retail-nope-000#0"))
    problems = verify_citations(pk, seed_traces)
    assert problems == [
        f"pk-1: citation {ep} step 999 does not resolve",
        "pk-1: citation retail-nope-000#0 step 0 does not resolve",
    ]


@pytest.mark.parametrize("column", ["observation", "fingerprint", "delivered"])
def test_tampered_step_is_reported(seed_traces, column):
    tampered = seed_traces.copy()
    row = 1
    value = json.loads(tampered.at[tampered.index[row], column])
    value = (value + ["injected"]) if isinstance(value, list) else {**value, "injected": True}
    tampered.at[tampered.index[row], column] = json.dumps(value, sort_keys=True)
    c = cite(seed_traces, row)  # cites the original, recorded hash; the frame row kept it too
    assert tampered.iloc[row]["hash"] == c.hash
    problems = verify_citations(packet(c, cite(seed_traces, 0)), tampered)
    assert len(problems) == 1
    assert "no longer matches" in problems[0] and f"step {c.step}" in problems[0]
