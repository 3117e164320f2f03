"""What every world provides (`WorldSpec`), and a benchmark as it lies on disk.

A benchmark directory (written by `ratchet bench materialize`, pinned by DVC):

    meta.json       world name, seed, version, task counts, write_tools, targets (write tool -> identifying args)
    policy.md       the written policy (the agent's system prompt; where a diagnoser finds the rules)
    tools.json      tool schemas (OpenAI function format)
    db.json         the world's initial database
    tasks.jsonl     one task per line: requests, rubric, first message
    splits.json     {"train": [...], "dev": [...], "test": [...]}: fixed by the seed
    tasks.csv       one row per task (id, family, split, rubric weights): the table the data contract checks
    gold_train.jsonl  (optional) the labelled train items' gold: one `Gold` per train task, nothing of dev or test

`meta.json` may name `receipts` (`ReceiptMode`: what a refusal tells the agent); absent = explained.
"""

from __future__ import annotations

import copy
import inspect
import json
import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from functools import cached_property
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from components.defaults import SPLIT_SHARES
from components.errors import InputError
from components.memory.package import digest as tree_digest
from components.runtime.types import Receipt, ToolCall, Turn
from components.worlds.competence import Competence

SPLITS = ("train", "dev", "test")


class ReceiptMode(str, Enum):
    """What a world's receipt says when a write breaks one of its rules (a benchmark setting, `benchmark.receipts`):
    explained  a rule refusal with the rule's id and its statement (the refusal is, in effect, the fix);
    coded      a rule refusal with the rule's id and the tool, no statement and no value;
    silent     no refusal: the write goes through with the agent's arguments, as tau2-bench's tools do, and the
               episode fails at the rubric (only outcomes show the rule)."""

    explained = "explained"
    coded = "coded"
    silent = "silent"


BENCH_FILES = ("meta.json", "policy.md", "tools.json", "db.json", "tasks.jsonl", "splits.json", "tasks.csv")


class Criterion(BaseModel):
    """One rubric line: an executable check with a weight. reward = sum(w_i * s_i) / sum(w_i)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    id: str
    weight: float = Field(gt=0)
    check: str
    args: dict[str, Any] = Field(default_factory=dict)
    desc: str = ""


class Task(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    id: str
    family: str
    user_id: str
    first_message: str
    requests: list[dict[str, Any]]
    rubric: list[Criterion] = Field(min_length=1)
    possible: bool = True  # False: no agent can complete it (an external failure by construction)


class GoldAction(BaseModel):
    """One write a correct agent makes for a labelled item: the tool and its full arguments."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    tool: str
    args: dict[str, Any]


class Gold(BaseModel):
    """What a labelled benchmark gives for a train item (tau2-bench gives the same): the gold writes, in the order of
    the customer's requests; the expected final state is the initial database with these writes applied."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    task_id: str
    actions: list[GoldAction]


GOLD_FILE = "gold_train.jsonl"  # train items only: nothing reads dev or test gold but the rubric, in scoring


@dataclass(frozen=True)
class Score:
    reward: float
    success: bool
    criteria: dict[str, float] = field(default_factory=dict)


class Environment(Protocol):
    """One episode of a world, as the chat harness sees it. Optional: `party_usage` (a `Usage`), what the episode's
    other party spent on a model of its own (a user simulated by an LLM), recorded beside the agent's tokens
    (`components.runtime.episode.party_usage`); a world without one spends nothing there. Optional: `protocol` (a
    `components.runtime.protocol.Protocol`), how the harness runs the episode (`episode.protocol_of`; none: Ratchet's
    own harness)."""

    system_prompt: str
    tools: list[dict]
    write_tools: frozenset[str]
    terminal_tools: frozenset[str]

    def first_message(self) -> str: ...
    def call(self, call: ToolCall) -> Receipt: ...
    def user_reply(self, assistant_text: str) -> str | None: ...
    def confirm(self, tool: str, args: dict, summary: str) -> bool:
        """The simulated user's answer to the harness `confirm` tool: yes only to an action the customer asked for."""
        ...

    def score(self, transcript: list[Turn]) -> Score: ...


ONLY_EMAIL = "Sorry, that is the only email I have."  # the simulated user's answer when its email matched no account
OK = "OK."


def system_preamble(agent: str, party: str) -> str:
    """The system prompt's opening, before the world's policy: who the agent is (`agent`, with its article) and whom
    it writes to (`party`)."""
    return (
        f"You are {agent}. Follow the policy below. Act with one tool call at a time, or write one message to the "
        f"{party}. Call `finish` with a short summary when every request is settled.\n\n"
    )


class BenchmarkError(InputError):
    """A benchmark directory that cannot be used; the message names the file and the field."""


@dataclass
class Benchmark:
    """A materialized benchmark. Its meta.json is read through the properties below (checked at load: `_meta`)."""

    root: Path
    meta: dict
    policy: str
    tools: list[dict]
    db: dict
    tasks: dict[str, Task]
    splits: dict[str, list[str]]

    @cached_property
    def digest(self) -> str:
        return tree_digest(self.root)

    @property
    def world(self) -> str:
        return self.meta["world"]

    def ids(self, split: str) -> list[str]:
        if split not in self.splits:
            raise BenchmarkError(
                f"{self.root / 'splits.json'}: {split}: no such split (one of {', '.join(self.splits)})"
            )
        return list(self.splits[split])

    @property
    def write_tools(self) -> frozenset[str]:
        return frozenset(self.meta["write_tools"])

    @property
    def receipts(self) -> ReceiptMode:
        return ReceiptMode(self.meta.get("receipts", ReceiptMode.explained.value))  # checked at load

    @property
    def protocol(self) -> str:
        """How its episodes run (`components.runtime.protocol`): meta.json `protocol`, absent = custom."""
        return self.meta.get("protocol", "custom")

    @property
    def confirmation(self) -> bool:
        """Whether the benchmark's grading asks a write to be confirmed (the harness `confirm`): meta.json
        `confirmation`, absent = true. False where the gold never confirms (tau2-bench's): diagnosis then never puts
        a failure down to a missing confirmation."""
        return bool(self.meta.get("confirmation", True))

    @property
    def targets(self) -> dict[str, list[str]]:
        """Write tool -> the args that identify what it acts on ([] = the session's account). Generic code reads
        this instead of naming a world's fields."""
        return {t: list(a) for t, a in self.meta["targets"].items()}

    @property
    def rules(self) -> dict | None:
        """The world's rules as data, as the benchmark was materialized with them (meta.json `rules`; absent: the
        world's built-in values)."""
        return self.meta.get("rules")

    @cached_property
    def tool_names(self) -> frozenset[str]:
        return frozenset(t["function"]["name"] for t in self.tools)


class ToolBase:
    """One episode's database and a world's tools over it: the dispatch and the receipts every world shares
    (docs/worlds.md, "Receipts"). A world subclasses it, names its tools and rules in the class attributes and writes
    one method `_t_<tool>(**args) -> (ok, code, content)` per tool. `log` keeps every successful write for scoring."""

    tool_names: frozenset[str] = frozenset()  # every tool this class serves (a `_t_` method alone is not enough)
    write_tools: frozenset[str] = frozenset()
    facts: Mapping[str, Any] = {}  # rule id -> the world's fact (its `rule` is the text a refusal cites)
    shared: str = ""  # the database key no write changes (a catalog): shared between episodes, not copied

    receipts: ReceiptMode = ReceiptMode.explained  # the benchmark's mode; a world's env sets it per episode

    def __init__(self, db: dict):
        self.db = {k: (v if k == self.shared else copy.deepcopy(v)) for k, v in db.items()}
        self.log: list[dict] = []
        self.breaches: list[dict] = []  # silent mode: the rules writes broke and went through with (never shown)
        self._calling = ""

    def call(self, call: ToolCall) -> Receipt:
        self._calling = call.name
        fn = getattr(self, f"_t_{call.name}", None)
        if fn is None or call.name not in self.tool_names:
            return self._receipt(call, False, "invalid_args", {"error": f"unknown tool {call.name!r}"})
        try:
            inspect.signature(fn).bind(**call.args)
        except TypeError:  # wrong or missing arguments: the agent's mistake, a receipt
            return self._bad_arguments(call, fn)
        ok, code, content = fn(**call.args)  # a TypeError raised inside a tool is a bug in the tool: it propagates
        if ok and call.name in self.write_tools:
            self.log.append({"tool": call.name, "args": dict(call.args), "call_id": call.id})
        return self._receipt(call, ok, code, content)

    def _bad_arguments(self, call: ToolCall, fn: Callable) -> Receipt:
        """The receipt of a call whose arguments do not bind: it quotes the interpreter's own message for the
        mismatch, as receipts always have (the call fails while binding, before the tool's body runs)."""
        try:
            fn(**call.args)
        except TypeError as e:
            return self._receipt(call, False, "invalid_args", {"error": f"bad arguments: {e}"})
        raise AssertionError(f"{call.name}: arguments that do not bind were accepted")  # pragma: no cover

    def _receipt(self, call: ToolCall, ok: bool, code: str | None, content: Any) -> Receipt:
        c = content if isinstance(content, dict) and not ok else {}
        return Receipt(
            call_id=call.id,
            tool=call.name,
            args=dict(call.args),
            ok=ok,
            code=code,
            content=content,
            genuine=True,
            write=call.name in self.write_tools,
            rule_id=c.get("rule_id"),
            rule=c.get("rule"),
            blocking=bool(c.get("blocking")),
        )

    @staticmethod
    def _fail(code: str, msg: str, blocking: bool = False):
        """A refusal that is not a rule's: `blocking` when no agent can do the request (an external failure)."""
        content = {"error": msg}
        if blocking:
            content["blocking"] = True
        return False, code, content

    def _policy(self, fact_id: str, msg: str):
        """A rule refusal: the receipt carries the rule's id and text (also for rules the policy does not state); the
        episode's own rules (`self.facts`: a changed world's, when its benchmark changes one)."""
        rule = self.facts[fact_id].rule
        # the message also quotes the rule after "Policy: " for readers of the error text alone
        return False, "policy", {"error": f"{msg} Policy: {rule}", "rule_id": fact_id, "rule": rule}

    def _breach(self, fact_id: str, msg: str):
        """A write broke rule `fact_id`: the refusal the benchmark's receipt mode gives, or None in silent mode, where
        the write goes on with the agent's own arguments (the tool then stores those, not the correct values).
        coded: the rule's id and the tool, never its statement nor any value (`msg` may quote one: not used)."""
        if self.receipts is ReceiptMode.silent:
            self.breaches.append({"tool": self._calling, "rule_id": fact_id})
            return None
        if self.receipts is ReceiptMode.coded:
            return (
                False,
                "policy",
                {"error": f"`{self._calling}` refused: the call breaks a rule of this tool.", "rule_id": fact_id},
            )
        return self._policy(fact_id, msg)


class EnvBase:
    """One episode of a world (the `Environment` protocol): what every world's episode shares. A world sets the class
    attributes, calls `super().__init__` and builds `self._tools` (a `ToolBase` over the task's slice of the
    database), and writes `confirm` (its user grants only what the customer asked for). `checks` maps each rubric
    check name to `check(env, criterion, transcript) -> bool`."""

    write_tools: frozenset[str] = frozenset()
    terminal_tools: frozenset[str] = frozenset()
    preamble: str = ""
    checks: Mapping[str, Callable[..., bool]] = {}
    _tools: ToolBase

    def __init__(self, bench: Benchmark, task: Task):
        self.task = task
        self.system_prompt = self.preamble + bench.policy
        self.tools = bench.tools
        self.calls = 0  # calls of the world's tools this episode (the harness's `confirm` and `finish` are not)

    @property
    def db(self) -> dict:
        return self._tools.db

    def first_message(self) -> str:
        return self.task.first_message

    def call(self, call: ToolCall) -> Receipt:
        self.calls += 1
        return self._tools.call(call)

    def user_reply(self, assistant_text: str) -> str | None:
        """The customer answers what is asked: another email when none matched (they have none), else OK. (A
        confirmation is the structured `confirm`, not a reply: see `components.runtime.confirm`.)"""
        low = assistant_text.lower()
        return ONLY_EMAIL if "could not find" in low and "email" in low else OK

    def score(self, transcript: list[Turn]) -> Score:
        results = {c.id: float(self.checks[c.check](self, c, transcript)) for c in self.task.rubric}
        if self.task.requests and not self.calls:
            # a task that asks for writes, and not one call of the world's tools: the criteria that hold vacuously
            # when nothing was written (every write confirmed, no extra write) earn nothing, so doing nothing scores 0
            results = dict.fromkeys(results, 0.0)
        total = sum(c.weight for c in self.task.rubric)
        reward = sum(c.weight * results[c.id] for c in self.task.rubric) / total
        return Score(reward=round(reward, 6), success=all(v == 1.0 for v in results.values()), criteria=results)


@dataclass(frozen=True)
class WorldSpec:
    """What a world provides (docs/worlds.md, "Adding a world"); registered by name in `components.worlds`."""

    name: str
    materialize: Callable[..., Path]  # (out, seed, per_family=None, fractions=(train, dev)) -> out
    make_env: Callable[[Benchmark, Task], Environment]
    competence: Competence  # what a careful agent does there: the simulated agent plays the world with it
    packages: dict[str, Path] = field(default_factory=dict)  # built-in memory packages by name (none, seed, ...)
    # the receipt modes its benchmarks can have (`benchmark.receipts`, meta.json `receipts`), checked when the world is
    # loaded, materialized and read. More than `explained` needs a `materialize` that takes `receipts`: a world whose
    # tools enforce no rule of their own (tau2-bench's) declares `silent` alone.
    receipts: tuple[ReceiptMode, ...] = (ReceiptMode.explained,)
    # the simulated agent plays this world with fault switches (its `competence`), so a failed episode's cause is found
    # by replaying it with them off (`components.models.counterfactual`). False (a world a real model plays, with no
    # fault to switch off): failures are `unlabelled` and diagnosis localization is reported as unscored.
    counterfactual: bool = True
    # the world's rules as data (`components.worlds.rules`): a module with `rules_of(changes, where)` and
    # `random_rules(seed)`; None: rules that are code (no `benchmark.rules`, no `ratchet bench rules`)
    rules: Any = None
    # a benchmark's rules' true values (rule id -> value), where they may differ from the world's own (a variant):
    # what the counterfactual replay's agent knows with E off. None: the competence's facts are the truth
    truth: Callable[[Benchmark], Mapping[str, object]] | None = None
    # how its episodes can run (`benchmark.protocol`, meta.json `protocol`; `components.runtime.protocol`), the default
    # first: `custom` (Ratchet's harness) for every world; a world that has a reference orchestrator (tau2-bench's)
    # also `standard`, which its environment then follows. More than `custom` needs a `materialize` taking `protocol`.
    protocols: tuple[str, ...] = ("custom",)
    # settings outside the benchmark that change its episodes and are read where episodes run (a user simulator's
    # model, from the environment): () -> a JSON-able dict, {} when there are none. Part of a run's identity: eval
    # meta.json and resume key, a campaign's identity and cache keys (`components.worlds.run_settings`)
    settings: Callable[[], dict] | None = None
    # the world's own check of a benchmark's files beyond the generic ones (tau2-bench: its database and the items'
    # tasks validate as tau2's models): (benchmark, item ids) -> None, a BenchmarkError naming file and field.
    # Called before a run writes anything (`ratchet eval`, a campaign's start), so a damaged file is one line
    check: Callable[[Benchmark, list[str]], None] | None = None


def load_benchmark(root: str | Path) -> Benchmark:
    """A materialized benchmark, each of its files checked; a bad one is refused in one line naming file and field."""
    root = Path(root)
    for name in BENCH_FILES:
        if not (root / name).is_file():
            raise BenchmarkError(f"{root / name}: missing (materialize with `ratchet bench materialize`)")
        if (root / name).is_symlink():  # the digest (what a lineage pins) hashes a link, not the bytes read through it
            raise BenchmarkError(f"{root / name}: -: a symlink: a benchmark's files are its own (copy it)")
    meta = _meta(root)
    tasks = _tasks(root)
    splits = _splits(root, tasks)
    tools, db = _json(root / "tools.json"), _json(root / "db.json")
    if not isinstance(tools, list) or not all(
        isinstance(t, dict) and isinstance(t.get("function"), dict) and isinstance(t["function"].get("name"), str)
        for t in tools
    ):
        raise BenchmarkError(f"{root / 'tools.json'}: -: must be a list of tools, each with function.name")
    if not isinstance(db, dict):
        raise BenchmarkError(f"{root / 'db.json'}: -: must be a mapping")
    try:
        policy = (root / "policy.md").read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise BenchmarkError(f"{root / 'policy.md'}: -: not UTF-8 text (byte {e.start})") from None
    return Benchmark(root, meta, policy, tools, db, tasks, splits)


def _meta(root: Path) -> dict:
    """meta.json: a registered world, its write tools (the world's own), a receipt mode it has, and each write
    tool's identifying arguments."""
    meta = _json(root / "meta.json")
    for key in ("world", "write_tools", "targets"):
        if not isinstance(meta, dict) or key not in meta:
            raise BenchmarkError(
                f"{root / 'meta.json'}: {key}: missing (re-materialize with `ratchet bench materialize`)"
            )
    spec = _meta_world(root, meta)
    _meta_episodes(root, meta, spec)
    targets = meta["targets"]
    if not isinstance(targets, dict) or not all(
        isinstance(a, list) and all(isinstance(x, str) for x in a) for a in targets.values()
    ):
        raise BenchmarkError(f"{root / 'meta.json'}: targets: must map each write tool to a list of argument names")
    if set(targets) != set(meta["write_tools"]):
        odd = sorted(set(targets) ^ set(meta["write_tools"]))
        raise BenchmarkError(
            f"{root / 'meta.json'}: targets: must name exactly the write tools (differs on {', '.join(odd)})"
        )
    return meta


def _meta_world(root: Path, meta: dict) -> Any:
    """The registered world meta.json names, with write tools that are that world's own."""
    from components.worlds import world  # here: the registry imports this module

    if not isinstance(meta["world"], str):
        raise BenchmarkError(f"{root / 'meta.json'}: world: must be a world's name")
    try:
        spec = world(meta["world"])
    except InputError as e:  # say which file names the unknown world
        raise BenchmarkError(f"{root / 'meta.json'}: world: {e}") from None
    if not isinstance(meta["write_tools"], list) or not all(isinstance(t, str) for t in meta["write_tools"]):
        raise BenchmarkError(f"{root / 'meta.json'}: write_tools: must be a list of tool names")
    foreign = sorted(set(meta["write_tools"]) - spec.competence.writes)
    if foreign:  # another world's benchmark under this world's name: its episodes would fail deep in the environment
        raise BenchmarkError(
            f"{root / 'meta.json'}: write_tools: {', '.join(foreign[:3])} not a write tool of the "
            f"{meta['world']!r} world (a benchmark of another world?)"
        )
    return spec


def _meta_episodes(root: Path, meta: dict, spec: Any) -> None:
    """How meta.json says episodes run (receipt mode, protocol, confirmation): settings the world has."""
    if "receipts" in meta and meta["receipts"] not in {m.value for m in ReceiptMode}:
        raise BenchmarkError(
            f"{root / 'meta.json'}: receipts: {meta['receipts']!r} is not a receipt mode "
            f"(one of {', '.join(m.value for m in ReceiptMode)})"
        )
    mode = meta.get("receipts", ReceiptMode.explained.value)
    if ReceiptMode(mode) not in spec.receipts:
        raise BenchmarkError(
            f"{root / 'meta.json'}: receipts: {mode!r}, but the {meta['world']} world's receipts are "
            f"{' | '.join(m.value for m in spec.receipts)} (re-materialize with `ratchet bench "
            "materialize`)"
        )
    protocol = meta.get("protocol", "custom")
    if protocol not in spec.protocols:
        raise BenchmarkError(
            f"{root / 'meta.json'}: protocol: {protocol!r}, but the {meta['world']} world's episodes "
            f"run under {' | '.join(spec.protocols)} (re-materialize with `ratchet bench materialize`)"
        )
    if not isinstance(meta.get("confirmation", True), bool):
        raise BenchmarkError(f"{root / 'meta.json'}: confirmation: must be true or false")


def _tasks(root: Path) -> dict[str, Task]:
    """tasks.jsonl: one task a line, ids unique."""
    tasks: dict[str, Task] = {}
    try:
        task_lines = (root / "tasks.jsonl").read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise BenchmarkError(f"{root / 'tasks.jsonl'}: -: not UTF-8 text (byte {e.start})") from None
    for n, line in enumerate(task_lines, 1):
        if not line.strip():
            continue
        try:
            t = Task.model_validate_json(line)
        except ValidationError as e:
            err = e.errors()[0]
            loc = ".".join(str(p) for p in err["loc"]) or "-"
            raise BenchmarkError(f"{root / 'tasks.jsonl'}: line {n}: {loc}: {err['msg']}") from None
        if t.id in tasks:
            raise BenchmarkError(f"{root / 'tasks.jsonl'}: line {n}: id: duplicate task id {t.id!r}")
        tasks[t.id] = t
    return tasks


def _splits(root: Path, tasks: dict[str, Task]) -> dict:
    """splits.json: every split, each a list of known task ids, every task in exactly one."""
    splits = _json(root / "splits.json")
    if not isinstance(splits, dict):
        raise BenchmarkError(f"{root / 'splits.json'}: -: must be a mapping of split name to ids")
    seen: dict[str, str] = {}
    for name in SPLITS:
        if name not in splits:
            raise BenchmarkError(f"{root / 'splits.json'}: {name}: missing split")
        if not isinstance(splits[name], list) or not all(isinstance(t, str) for t in splits[name]):
            raise BenchmarkError(f"{root / 'splits.json'}: {name}: must be a list of task ids")
        for tid in splits[name]:
            if tid not in tasks:
                raise BenchmarkError(f"{root / 'splits.json'}: {name}: unknown task id {tid!r}")
            if tid in seen:
                raise BenchmarkError(f"{root / 'splits.json'}: {name}: {tid!r} is also in {seen[tid]}")
            seen[tid] = name
    missing = sorted(set(tasks) - set(seen))
    if missing:
        raise BenchmarkError(f"{root / 'splits.json'}: -: tasks in no split: {', '.join(missing[:5])}")
    return splits


def train_gold(bench: Benchmark) -> dict[str, Gold]:
    """The train items' gold (task id -> `Gold`), or {} when the benchmark has none. The one reader of gold outside
    scoring: it reads a file that holds train items only, and refuses one that holds any other split's item."""
    path = bench.root / GOLD_FILE
    if not path.is_file():
        return {}
    train = set(bench.splits["train"])
    out: dict[str, Gold] = {}
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            g = Gold.model_validate_json(line)
        except ValidationError as e:
            err = e.errors()[0]
            loc = ".".join(str(p) for p in err["loc"]) or "-"
            raise BenchmarkError(f"{path}: line {n}: {loc}: {err['msg']}") from None
        if g.task_id not in train:
            raise BenchmarkError(f"{path}: line {n}: task_id: {g.task_id!r} is not a train item (gold is train-only)")
        out[g.task_id] = g
    return out


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BenchmarkError(f"{path}: -: not valid JSON ({e})") from None


def stratified_split(
    tasks: list[Task], seed: int, families: Iterable[str], fractions: tuple[float, float] = SPLIT_SHARES
) -> dict[str, list[str]]:
    """Train/dev/test, stratified by family, fixed by the seed; `fractions` are the train and dev shares."""
    rng = random.Random(seed * 7919 + 1)
    out: dict[str, list[str]] = {"train": [], "dev": [], "test": []}
    for family in families:
        ids = sorted(t.id for t in tasks if t.family == family)
        rng.shuffle(ids)
        a = round(len(ids) * fractions[0])
        b = a + round(len(ids) * fractions[1])
        out["train"] += sorted(ids[:a])
        out["dev"] += sorted(ids[a:b])
        out["test"] += sorted(ids[b:])
    return out


def materializer(
    world: str,
    version: int,
    generate: Callable[..., tuple[dict, list[Task]]],
    families: Mapping[str, int],
    policy_text: Callable[..., str],
    tools: list[dict],
    targets: Mapping[str, list[str]],
    rules_of: Callable[..., Any] | None = None,
    facts_of: Callable[[Any], Mapping] | None = None,
    packages: Callable[[Any], Mapping[str, str]] | None = None,
    gold_of: Callable[[Task], list[dict]] | None = None,
) -> Callable[..., Path]:
    """A world's `materialize` from its parts: `generate(seed, per_family) -> (db, tasks)`, the families (name ->
    default count; the split is stratified by them), the policy, the tool schemas and the write tools' targets.
    A world whose rules are data (`components.worlds.rules`) passes `rules_of(changes, where) -> rules` and
    `facts_of(rules) -> facts`; its `generate` and `policy_text` then take the facts, its `materialize` takes `rules`
    (a mapping or a YAML file: the rules to change), meta.json records the whole record, and `packages(facts)`
    (relative path -> text) are written beside a variant's files (its own `reference` and `all-skills`)."""

    def build(
        out: str | Path,
        seed: int,
        per_family: int | None,
        fractions: tuple[float, float],
        rules: Any,
        receipts: ReceiptMode | str = ReceiptMode.explained,
    ) -> Path:
        facts = data = None
        if rules_of is not None:
            data = rules_of(rules)
            facts = facts_of(data)
        db, tasks = generate(seed, per_family, facts) if facts is not None else generate(seed, per_family)
        splits = stratified_split(tasks, seed, families, fractions)
        meta = {
            "world": world,
            "version": version,
            "seed": seed,
            "n_tasks": len(tasks),
            "families": {f: per_family or n for f, n in families.items()},
            "splits": {k: len(v) for k, v in splits.items()},
            "write_tools": sorted(targets),
            "targets": {t: list(targets[t]) for t in sorted(targets)},
        }
        if data is not None:
            meta["rules"] = data.model_dump(mode="json")
        receipts = ReceiptMode(receipts)
        if receipts is not ReceiptMode.explained:  # explained benchmarks keep their bytes and digest
            meta["receipts"] = receipts.value
        policy = policy_text(facts) if facts is not None else policy_text()
        gold = None
        if gold_of is not None:  # the labelled train items only: dev and test gold is never written beside them
            by_id = {t.id: t for t in tasks}
            gold = [
                Gold(task_id=tid, actions=gold_of(by_id[tid], facts) if facts is not None else gold_of(by_id[tid]))
                for tid in sorted(splits["train"])
            ]
        extra = packages(facts) if packages is not None and data is not None and data != rules_of(None) else None
        return write_benchmark(out, meta, policy, tools, db, tasks, splits, gold, extra)  # checked by the contract

    if rules_of is None:  # rules that are code: params refuse `benchmark.rules` for this world

        def materialize(
            out: str | Path,
            seed: int = 0,
            per_family: int | None = None,
            fractions: tuple[float, float] = SPLIT_SHARES,
            receipts: ReceiptMode | str = ReceiptMode.explained,
        ) -> Path:
            """Write the benchmark files for `seed` atomically; the same arguments give the same bytes."""
            return build(out, seed, per_family, fractions, None, receipts)

        return materialize

    def materialize_rules(
        out: str | Path,
        seed: int = 0,
        per_family: int | None = None,
        fractions: tuple[float, float] = SPLIT_SHARES,
        rules: Any = None,
        receipts: ReceiptMode | str = ReceiptMode.explained,
    ) -> Path:
        """Write the benchmark files for `seed` atomically; the same arguments give the same bytes. `rules`: the rules
        to change (a mapping, or a YAML file's path); None: the world's own."""
        return build(out, seed, per_family, fractions, rules, receipts)

    return materialize_rules


def write_benchmark(
    out: str | Path,
    meta: dict,
    policy: str,
    tools: list[dict],
    db: dict,
    tasks: list[Task],
    splits: dict[str, list[str]],
    gold: list[Gold] | None = None,
    extra: Mapping[str, str] | None = None,
) -> Path:
    """Write a benchmark directory atomically (tasks.csv derived from the tasks), checked by the data contract before
    anything is moved into place: what a world's `materialize` ends with. `meta` needs world, write_tools, targets."""
    import pandas as pd

    from components.contracts import check_benchmark
    from components.io import atomic_dir, dumps

    where = {tid: name for name, ids in splits.items() for tid in ids}
    rows = [
        {
            "task_id": t.id,
            "family": t.family,
            "split": where.get(t.id),
            "n_requests": len(t.requests),
            "possible": t.possible,
            "n_criteria": len(t.rubric),
            "min_weight": min(c.weight for c in t.rubric),
            "total_weight": sum(c.weight for c in t.rubric),
        }
        for t in tasks
    ]
    with atomic_dir(out) as tmp:
        (tmp / "meta.json").write_text(dumps(meta))
        (tmp / "policy.md").write_text(policy)
        (tmp / "tools.json").write_text(dumps(tools))
        (tmp / "db.json").write_text(json.dumps(db, sort_keys=True) + "\n")
        (tmp / "tasks.jsonl").write_text("".join(t.model_dump_json() + "\n" for t in tasks))
        (tmp / "splits.json").write_text(dumps(splits))
        pd.DataFrame(rows).to_csv(tmp / "tasks.csv", index=False, lineterminator="\n")
        if gold is not None:
            train = set(splits.get("train", []))
            assert all(g.task_id in train for g in gold), "gold is written for train items only"
            (tmp / GOLD_FILE).write_text("".join(g.model_dump_json() + "\n" for g in gold))
        for rel, text in sorted((extra or {}).items()):  # a variant's own packages (packages/<name>/...)
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp / rel).write_text(text)
        check_benchmark(tmp)
    return Path(out)
