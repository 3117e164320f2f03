"""The retail world and the simulated agent's contract: determinism, memory that matters, the HTTP path."""

from __future__ import annotations

import filecmp
import json
import math
import subprocess
import sys
import time

import httpx
import pytest

from components.memory import digest, load_package
from components.models.simulated import SimulatedAgent
from components.runtime.evaluate import run_shard
from components.worlds import world
from components.runtime.types import ToolCall
from components.worlds.retail import facts as F
from components.worlds.retail import language
from components.worlds.retail.catalog import normalize_address
from components.worlds.retail.facts import BY_ID, FACTS
from components.worlds.rules import NO_FEE, Fee, Window
from tests.conftest import PACKAGES, ROOT


def cli(*args, **kw):
    return subprocess.run(
        [sys.executable, "-m", "flows.cli", *args], cwd=ROOT, capture_output=True, text=True, timeout=600, **kw
    )


# -- the world ---------------------------------------------------------------------------------------------------


def test_materialize_same_seed_same_bytes(tmp_path, bench_dir):
    again = world("retail").materialize(tmp_path / "again", 0)
    assert digest(again) == digest(bench_dir)
    other = world("retail").materialize(tmp_path / "other", 1)
    assert digest(other) != digest(bench_dir)


def test_benchmark_shape(bench):
    assert len(bench.tasks) >= 150
    families = {t.family for t in bench.tasks.values()}
    assert len(families) >= 6
    ids = [set(bench.ids(s)) for s in ("train", "dev", "test")]
    assert not (ids[0] & ids[1]) and not (ids[0] & ids[2]) and not (ids[1] & ids[2])
    assert set().union(*ids) == set(bench.tasks)
    for t in bench.tasks.values():
        assert all(c.weight > 0 for c in t.rubric)
    # horizons differ: multi-request tasks are longer than single-request ones
    n = {f: max(len(t.requests) for t in bench.tasks.values() if t.family == f) for f in families}
    assert n["multi"] >= 3 and n["cancel"] == 1


def test_the_knowledge_is_written_down(bench, bench_dir):
    """What the agent lacks is in the policy it is shown, or only in the receipts: a violated rule comes back, cited
    and stated, in the refusal receipt; the unstated rules are nowhere in the policy."""
    policy = (bench_dir / "policy.md").read_text()
    env = world(bench.world).make_env(bench, bench.tasks[bench.ids("train")[0]])
    assert policy in env.system_prompt  # the policy on disk is what the agent reads
    assert len(FACTS) >= 12 and len({f.tool for f in FACTS}) < len(FACTS)  # rules share writes: they interact
    assert sum(not f.stated for f in FACTS) >= 3
    for fact in FACTS:
        assert fact.value is not None and fact.read(fact.statement) == fact.value
        if not fact.stated:  # learnable only from receipts or successful episodes
            assert fact.read(policy) is None and fact.statement not in policy, fact.id
            continue
        assert fact.read(policy) == fact.value
        without = policy.replace(fact.statement, "")
        assert without != policy and fact.read(without) is None  # the policy says it in that statement, nowhere else
    # one seed: every task already brings every rule back in some receipt (deterministic; three seeds cost 3x)
    t = run_shard(PACKAGES / "seed", bench, sorted(bench.tasks), [0]).traces
    refused: dict[str, int] = {}
    for action, observation in zip(t["action"], t["observation"]):
        obs = json.loads(observation)
        if not obs.get("rule_id"):
            continue
        tool = json.loads(action)["tool"]
        fact = next(f for f in FACTS if f.id == obs["rule_id"])  # the receipt names the rule it refused on
        assert obs["ok"] is False and obs["genuine"] and obs["tool"] == tool == fact.tool and not obs["blocking"]
        assert fact.read(obs["rule"]) == fact.value  # ... and states it correctly
        if fact.id == "cancel_reason":
            assert obs["args"]["reason"] not in fact.value  # and it is refused for breaking it
        refused[fact.id] = refused.get(fact.id, 0) + 1
    assert set(refused) == {f.id for f in FACTS}, refused  # every rule the seed lacks comes back in some receipt


@pytest.mark.parametrize(
    "text,fid,value",
    [
        # numbers: the clause naming the fee gives the amount, the first age of the clause (else paragraph) the threshold
        (
            "- `return_delivered_order_items`: a 15% restocking fee applies to items delivered more than 20 days ago.",
            "restocking_fee",
            Fee(amount=15, when=Window(op=">", value=20)),
        ),
        (
            "- `return_delivered_order_items` charges a restocking fee of 10 percent on every return.",
            "restocking_fee",
            Fee(amount=10),
        ),
        ("- For `return_delivered_order_items` there is no restocking fee.", "restocking_fee", NO_FEE),
        ("- A 10% restocking fee applies to returns after 30 days.", "restocking_fee", None),  # no tool named: outside
        (
            "- Cancelling with `cancel_pending_order` after 24 hours costs a 5% cancellation fee.",
            "cancel_fee",
            Fee(amount=5, when=Window(op=">", value=24)),
        ),
        ("- `cancel_pending_order` never charges a cancellation fee.", "cancel_fee", NO_FEE),
        (
            "- `exchange_delivered_order_items`: exchanges are free for 14 days; later, the `exchange_fee` is $8.",
            "exchange_fee",
            Fee(amount=8, when=Window(op=">", value=14)),
        ),
        ("- `modify_pending_order_address` does not carry a re-routing fee.", "reroute_fee", NO_FEE),
        ("- `return_delivered_order_items` to a gift card adds a 5% bonus.", "gift_card_bonus", 5.0),
        ("- `return_delivered_order_items` pays no bonus on gift cards.", "gift_card_bonus", 0.0),
        ("- `issue_store_credit`: $4 per day late.", "credit_rate", 4.0),
        ("- `issue_store_credit`: the credit is at most $30.", "credit_cap", 30.0),
        ("- `issue_store_credit`: the credit is not capped.", "credit_cap", math.inf),
        ("- `issue_store_credit` pays back to the method the order was paid with.", "credit_gift_card", "original"),
        ("- `issue_store_credit` never credits a gift card.", "credit_gift_card", "original"),
        (
            "- `modify_user_address` takes the address as given; do not call `validate_address`.",
            "user_address_validated",
            "raw",
        ),
        (
            "- For `modify_user_address`, normalize the address with `validate_address` first.",
            "user_address_validated",
            "validate",
        ),
        (
            "- For `modify_pending_order_address`, normalize the address with `validate_address` first.",
            "user_address_validated",
            None,
        ),  # another write's rule
    ],
)
def test_reading_numbers_negation_and_scope(text, fid, value):
    assert BY_ID[fid].read(text) == value


def test_every_fact_is_enforced_by_its_write(bench):
    """For each fact, on a task that exercises it: the write with every rule applied succeeds; the same write with
    only this rule unknown (the naive default) is refused, citing this rule and no other."""
    exercised: set[str] = set()
    for fact in FACTS:
        for item in bench.ids("train") + bench.ids("dev"):
            task = bench.tasks[item]
            if not task.possible:
                continue
            env = world(bench.world).make_env(bench, task)
            reqs = [r for r in task.requests if language.TOOL_OF[r["kind"]] == fact.tool]
            if not reqs:
                continue
            right = careful_args(env, task, reqs[0], {f.id: f.value for f in FACTS})
            naive = careful_args(env, task, reqs[0], {f.id: (None if f is fact else f.value) for f in FACTS})
            if naive == right:
                continue  # this request does not exercise the fact
            r = env.call(ToolCall(id="c1", name=fact.tool, args=naive))
            assert not r.ok and r.code == "policy", (fact.id, r.content)
            assert r.content["error"].split("Policy: ", 1)[1] == fact.statement.lstrip("- ")
            ok = env.call(ToolCall(id="c2", name=fact.tool, args=right))
            assert ok.ok, (fact.id, ok.content)
            score = env.score([])
            crit = next(
                c.id for c in task.rubric if c.id.startswith("req") and task.requests[int(c.id[3:]) - 1] is reqs[0]
            )
            assert score.criteria[crit] == 1.0  # the rubric credits the write that follows every rule
            exercised.add(fact.id)
            break
    assert exercised == {f.id for f in FACTS}


def test_the_tasks_exercise_every_fact(bench):
    """Each fact decides a good share of the requests of its write, not all and not none (so a rule is learnable
    from contrast, and an agent ignorant of it still passes some)."""
    share = {}
    for fact in FACTS:
        hits = n = 0
        for task in bench.tasks.values():
            if not task.possible:
                continue
            env = world(bench.world).make_env(bench, task)
            for req in task.requests:
                if language.TOOL_OF[req["kind"]] != fact.tool:
                    continue
                n += 1
                hits += careful_args(env, task, req, {f.id: f.value for f in FACTS}) != careful_args(
                    env, task, req, {f.id: (None if f is fact else f.value) for f in FACTS}
                )
        share[fact.id] = hits / n
    assert all(0.2 <= v <= 1.0 for v in share.values()), share
    assert sum(v < 1.0 for v in share.values()) >= 6, share  # the thresholds leave room on both sides


def careful_args(env, task, req: dict, know: dict) -> dict:
    """The write for one request by an agent that knows the rules in `know` (None: the naive default)."""
    db, kind = env.db, req["kind"]
    user = db["users"][task.user_id]
    order = db["orders"].get(req.get("order_id"), {})
    if kind == "cancel":
        reason = req["reason"] if know["cancel_reason"] else req["reason_phrase"]
        return {
            "order_id": req["order_id"],
            "reason": reason,
            "refund_amount": F.cancel_refund(order, know["cancel_fee"]),
        }
    if kind == "return":
        pm = order["payment_method_id"] if know["refund_original"] else user["payment_methods"][0]["id"]
        gift = any(m["id"] == pm and m["kind"] == "gift_card" for m in user["payment_methods"])
        return {
            "order_id": req["order_id"],
            "item_ids": req["item_ids"],
            "payment_method_id": pm,
            "refund_amount": F.return_refund(
                order, req["item_ids"], know["restocking_fee"], know["gift_card_bonus"], gift
            ),
        }
    if kind == "exchange":
        new = (
            req["new_item_ids"]
            if know["exchange_available"]
            else [
                v["item_id"]
                for p in db["products"].values()
                for v in p["variants"].values()
                if v["options"] == req["want"] and p["name"] == req["product_name"]
            ]
        )
        return {
            "order_id": req["order_id"],
            "item_ids": req["item_ids"],
            "new_item_ids": new,
            "exchange_fee": F.exchange_fee(order, 1, know["exchange_fee"]),
        }
    if kind == "user_address":
        addr = normalize_address(**req["address"]) if know["user_address_validated"] else req["address"]
        return {"user_id": task.user_id, **addr}
    if kind == "order_address":
        addr = normalize_address(**req["address"]) if know["address_validated"] else req["address"]
        return {"order_id": req["order_id"], **addr, "reroute_fee": F.reroute_fee(order, know["reroute_fee"])}
    gift = next(m["id"] for m in user["payment_methods"] if m["kind"] == "gift_card")
    pm = gift if know["credit_gift_card"] else order["payment_method_id"]
    return {
        "order_id": req["order_id"],
        "payment_method_id": pm,
        "amount": F.credit_amount(order, know["credit_rate"], know["credit_cap"]),
    }


def test_reward_is_weighted_rubric(bench):
    """reward = sum(w_i * s_i) / sum(w_i): checked against hand-computed rubrics and against real episodes."""
    from components.models import make_model
    from components.runtime.episode import run_episode

    # an episode where the agent only looked something up: every request criterion fails, the two conduct criteria
    # hold (with no call at all, they earn nothing either: tests/test_real_model_path.py)
    from components.runtime.types import ToolCall

    spec = world(bench.world)
    for item in bench.ids("dev")[:30]:
        task = bench.tasks[item]
        conduct = [c for c in task.rubric if not c.id.startswith("req")]
        assert len(conduct) == 2 and len(task.rubric) == len(task.requests) + 2
        env = spec.make_env(bench, task)
        env.call(ToolCall(id="c1", name="find_user_id_by_email", args={"email": "nobody@example.com"}))
        score = env.score([])
        total = sum(c.weight for c in task.rubric)
        assert score.reward == pytest.approx(sum(c.weight for c in conduct) / total, abs=1e-6)
        assert not score.success
    weights = {c.weight for t in bench.tasks.values() for c in t.rubric}
    assert len(weights) > 1  # requests and conduct weigh differently, so the weighting is observable

    chat, weighted_differs = make_model("sim", None), 0
    for name in ("seed", "reference"):
        pkg = load_package(PACKAGES / name)
        for item in bench.ids("dev")[:20]:
            r = run_episode(pkg, bench, item, 0, chat)
            task = bench.tasks[item]
            w = {c.id: c.weight for c in task.rubric}
            assert set(r.criteria) == set(w) and set(r.criteria.values()) <= {0.0, 1.0}
            expect = sum(w[k] * s for k, s in r.criteria.items()) / sum(w.values())
            assert r.score == pytest.approx(expect, abs=1e-6)
            assert r.success == (min(r.criteria.values()) == 1.0) == (r.score == 1.0)
            weighted_differs += abs(expect - sum(r.criteria.values()) / len(w)) > 1e-6
            if task.family == "cancel":  # the request criterion agrees with the trace: a genuine cancel receipt
                order = task.requests[0]["order_id"]
                done = any(
                    s.observation.get("ok")
                    and s.observation.get("genuine")
                    and s.action.get("tool") == "cancel_pending_order"
                    and s.action.get("args", {}).get("order_id") == order
                    for s in r.steps
                )
                assert r.criteria["req1"] == float(done)
    assert weighted_differs > 0  # partial credit happened, and the weights decided it


# -- the simulated agent -------------------------------------------------------------------------------------------


def test_agent_is_a_pure_function_of_messages_and_seed():
    agent = SimulatedAgent()
    msgs = [
        {"role": "system", "content": "policy"},
        {"role": "system", "content": "# Memory\n(empty)"},
        {
            "role": "user",
            "content": "Hi, I'm Ava Smith (email ava.smith1@example.com). Please cancel order #W1234567: I no longer need it.",
        },
    ]
    a = agent.complete(msgs, tools=None, seed=7)
    b = agent.complete(msgs, tools=None, seed=7)
    assert a == b
    assert a.tool_calls[0].name == "find_user_id_by_email"
    assert a.tool_calls[0].args == {"email": "ava.smith1@example.com"}


def test_evaluation_is_deterministic(bench):
    a = run_shard(PACKAGES / "seed", bench, bench.ids("dev")[:12], [0, 1])
    b = run_shard(PACKAGES / "seed", bench, bench.ids("dev")[:12], [0, 1])
    assert a.scores.to_csv() == b.scores.to_csv()
    assert list(a.traces["hash"]) == list(b.traces["hash"])


_MEAN_DEV: dict[tuple[str, str], float] = {}


def mean_score(package, bench, items, seeds) -> float:
    """The mean of `run_shard`'s score column, each episode run by the same kernel call with the same model, but
    unsealed (no step hashes, as a counterfactual replay runs) and without building the trace table: neither changes
    a score, and together they were half of the CPU of the tests below."""
    import pandas as pd

    from components.models import make_model
    from components.runtime.episode import run_episode

    pkg, chat = load_package(package), make_model("sim")
    return float(
        pd.Series([run_episode(pkg, bench, i, s, chat, sealed=False).score for i in items for s in seeds]).mean()
    )


# One seed: what memory changes shows on each seed alone. Measured on the session's benchmark, seeds 0, 1 and 2 each
# give the designed order with reference - seed >= 0.42, reference - all-skills >= 0.37 and routed - all-skills >= 0.23
# (asserted: 0.30, 0.10, 0.05), as three seeds together do, at a third of the episodes.
DEV_SEEDS = [0]


def mean_dev(bench, name):
    """A shipped package's mean dev score (DEV_SEEDS). Deterministic (the tests above show it), so it is computed
    once per process: two tests below read all-skills' (whichever runs first pays for it)."""
    key = (bench.digest, name)
    if key not in _MEAN_DEV:
        _MEAN_DEV[key] = mean_score(PACKAGES / name, bench, bench.ids("dev"), DEV_SEEDS)
    return _MEAN_DEV[key]


def test_memory_changes_the_scores_in_the_designed_order(bench):
    s = {name: mean_dev(bench, name) for name in ("none", "seed", "all-skills", "reference")}
    assert s["reference"] >= s["seed"] + 0.30, s
    assert s["reference"] >= s["all-skills"] + 0.10, s  # 13 facts: routing beats attention dilution
    assert s["none"] < s["seed"] < s["all-skills"] < s["reference"], s
    assert s["reference"] < 1.0


def test_routed_cards_beat_the_same_cards_everywhere(bench, package_copy):
    """rho: the same cards and wm, delivered by trigger instead of every turn, score higher (attention)."""
    routed = package_copy("all-skills")
    text = (
        (routed / "manifest.yaml")
        .read_text()
        .replace("use: all_cards\n    at: turn_start", "use: event_cards\n    at: intent_recorded")
    )
    (routed / "manifest.yaml").write_text(text)
    a = mean_dev(bench, "all-skills")  # the same shard as the designed-order test's: computed once
    b = mean_score(routed, bench, bench.ids("dev"), DEV_SEEDS)
    assert b > a + 0.05


# -- CLI eval and the HTTP path ----------------------------------------------------------------------------------


def test_cli_eval_writes_tables_byte_identically(tmp_path, bench_dir, capsys):
    # two processes (each its own hash seed), on one dev item of each family (dev sorted by id is 12 per family):
    # identical bytes need no more items to show. The second is this one, through the real entry point: a second
    # subprocess would prove nothing more.
    from tests.conftest import run_cli

    items = ",".join(sorted(json.loads((bench_dir / "splits.json").read_text())["dev"])[::12])
    args = [
        "eval",
        "--package",
        str(PACKAGES / "seed"),
        "--benchmark",
        str(bench_dir),
        "--items",
        items,
        "--seeds",
        "2",
    ]
    r1 = cli(*args, "--out", str(tmp_path / "a"))
    code, _, err = run_cli(capsys, *args, "--out", str(tmp_path / "b"))
    assert r1.returncode == 0, r1.stderr
    assert code == 0, err
    assert filecmp.cmp(tmp_path / "a" / "scores.csv", tmp_path / "b" / "scores.csv", shallow=False)
    head = (tmp_path / "a" / "scores.csv").read_text().splitlines()[0].split(",")
    for col in ("item_id", "seed", "score", "success", "turns", "tokens_in", "tokens_out", "error"):
        assert col in head
    assert (tmp_path / "a" / "traces.parquet").stat().st_size > 0
    assert (tmp_path / "a" / "_hidden" / "causes.csv").exists()
    assert "mean score" in r1.stdout


def test_http_path_gives_identical_scores(tmp_path, bench_dir, free_port, capsys):
    import threading

    import uvicorn

    from components.models.server import HEADER_TIMEOUT, _header_timeout_protocol, create_app
    from tests.conftest import run_cli

    # serve-sim's app and server (components.models.server.serve) in a thread on a loopback port: every turn crosses
    # HTTP as it would to another process, and no interpreter starts and imports the stack again for it
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(),
            host="127.0.0.1",
            port=port,
            log_level="warning",
            access_log=False,
            http=_header_timeout_protocol(HEADER_TIMEOUT),
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        # one dev item of each family (dev sorted by id is 12 per family): every turn crosses HTTP either way, more
        # items prove nothing more
        items = ",".join(sorted(json.loads((bench_dir / "splits.json").read_text())["dev"])[::12])
        common = [
            "eval",
            "--package",
            str(PACKAGES / "reference"),
            "--benchmark",
            str(bench_dir),
            "--items",
            items,
            "--seeds",
            "2",
        ]
        # both evals in this process, through the real entry point. The local one runs while the server starts up.
        local = run_cli(capsys, *common, "--out", str(tmp_path / "local"))
        for _ in range(200):
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        else:
            pytest.fail("serve-sim did not start")
        remote = run_cli(
            capsys,
            *common,
            "--out",
            str(tmp_path / "http"),
            "--model",
            "openai",
            "--base-url",
            f"http://127.0.0.1:{port}/v1",
        )
        assert local[0] == 0, local[2]
        assert remote[0] == 0, remote[2]
        assert filecmp.cmp(tmp_path / "local" / "scores.csv", tmp_path / "http" / "scores.csv", shallow=False)
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def test_openai_backend_without_base_url_is_a_clear_error(tmp_path, bench_dir, capsys):
    from tests.conftest import run_cli

    # in-process, through the real entry point and its error handling: a subprocess would prove nothing more
    code, _, err = run_cli(
        capsys,
        "eval",
        "--package",
        str(PACKAGES / "seed"),
        "--benchmark",
        str(bench_dir),
        "--model",
        "openai",
        "--out",
        str(tmp_path / "x"),
    )
    assert code == 2
    assert "--base-url" in err and "Traceback" not in err


def test_arguments_that_do_not_bind_are_a_receipt_and_a_tool_bug_raises():
    """Only argument validation becomes a `bad arguments` receipt (the agent's mistake, with the interpreter's own
    message); a TypeError raised inside a tool's body is a bug in the tool and reaches the caller."""
    from components.worlds.base import ToolBase

    class Tools(ToolBase):
        tool_names = frozenset({"lookup", "broken"})

        def _t_lookup(self, order_id: str):
            return True, None, {"order_id": order_id}

        def _t_broken(self, order_id: str):
            return True, None, {"n": order_id + 1}  # a bug: str + int

    t = Tools({})
    assert t.call(ToolCall(id="1", name="lookup", args={"order_id": "7"})).ok
    for args, words in (
        ({}, "missing 1 required positional argument: 'order_id'"),
        ({"order_id": "7", "x": 1}, "got an unexpected keyword argument 'x'"),
    ):
        r = t.call(ToolCall(id="2", name="lookup", args=args))
        assert (r.ok, r.code) == (False, "invalid_args")
        assert r.content["error"].startswith("bad arguments: ") and r.content["error"].endswith(words)
    with pytest.raises(TypeError):
        t.call(ToolCall(id="3", name="broken", args={"order_id": "7"}))
