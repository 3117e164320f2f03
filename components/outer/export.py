"""`ratchet export`: a finished campaign's **train** episodes as data a model trainer reads.

    sft.jsonl          the champion's successful episodes, OpenAI chat fine-tuning records: {"messages", "tools"}
    preferences.jsonl  same item and seed, the champion's success against the start package's failure:
                       {"prompt", "chosen", "rejected"} (conversational; the layout TRL's DPO trainer reads)
    rollouts.jsonl     every train episode of both arms with its reward and the reward of each rubric criterion (RL)
    manifest.json      campaign, champion and start versions and digests, benchmark digest, and per file its sha256,
                       bytes and record count

Where the episodes come from: each round evaluates its base (the champion of the moment) on train and keeps
`rounds/rNN/train/{scores.csv,traces.parquet,meta.json}`. The start package is round 1's base; the final champion is
the base of every round after the last promotion. When the last round promoted, no train evaluation of the champion
exists: it is run here (the same `run_shard` a round runs, the campaign's model and seeds), so export stays a pure
function of the campaign directory.

How messages are rebuilt: a trace step keeps the committed action (text, or a tool call and its arguments) and the
receipt with its call id, but not the messages. The episode is replayed: a fresh environment of the task receives the
recorded actions, in order, through the same `ChatHarness.commit` the episode ran (so tool results and the simulated
user's replies are the world's own), and the replay's score must equal the recorded score, or export refuses the
episode's campaign. The messages are then `[policy, memory, *conversation]`: `memory` is one system message with the
cards the harness delivered during the episode, rendered as the kernel renders them, in order of first delivery.
The model saw memory per turn (with the ledger board and deliverer notes); those per-turn parts are not in the trace
and are not reproduced. A blocked tool call stays in the conversation (its synthetic result follows it) with
`weight: 0`, so a trainer does not learn it.

Only train items are exported: dev scores promotions and test certifies the champion, and a model trained on them
would make both meaningless (`check_split`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from pydantic import BaseModel, ConfigDict

from components.defaults import MAX_TURNS
from components.errors import InputError
from components.io import atomic_dir, confined, dumps, read_json_object
from components.memory.package import MemoryPackage, load_package
from components.models.base import ChatResult
from components.outer.chat_schema import problems
from components.runtime.chat import ChatHarness
from components.runtime.episode import episode_seed
from components.runtime.evaluate import benchmark_at, run_shard
from components.runtime.trace import frame_steps
from components.runtime.types import Draft, ToolCall
from components.worlds import Benchmark, world

SPLIT = "train"
FILES = ("sft.jsonl", "preferences.jsonl", "rollouts.jsonl")
MANIFEST = "manifest.json"
MARK = "export"


class ExportedFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    path: str
    sha256: str
    bytes: int
    records: int


class ExportManifest(BaseModel):
    """What an export holds and what it was made from; the trainer and the outer round read it."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    campaign: str  # the campaign's name
    campaign_dir: str
    world: str
    split: str
    benchmark_digest: str
    champion: str  # version name (M<k>)
    champion_digest: str
    start: str
    start_digest: str
    model: str  # the model the episodes were run with (campaign.model, and its cfg's identity)
    model_cfg: dict[str, Any]
    seeds: int
    champion_train_source: str  # the round directory its train episodes came from, or "evaluated"
    files: dict[str, ExportedFile]

    def digest(self) -> str:
        """One digest of the export: the sha256 of its files' digests, by name."""
        return hashlib.sha256(json.dumps({k: v.sha256 for k, v in sorted(self.files.items())}).encode()).hexdigest()


def check_split(split: str) -> None:
    if split != SPLIT:
        raise InputError(
            f"--split: {split}: export reads train items only ({split} is held out: dev decides "
            "promotions and test certifies the champion; training on them would void both)"
        )


@dataclass(frozen=True)
class Episode:
    item_id: str
    seed: int
    score: float
    success: bool
    criteria: dict[str, float]
    messages: list[dict]  # [policy, memory?, *conversation], OpenAI chat format
    tools: list[dict]
    conversation_at: int  # index in `messages` where the conversation starts (after the system messages)


def _assistant_weight(messages: list[dict], blocked_ids: set[str]) -> list[dict]:
    out = []
    for m in messages:
        if m["role"] == "assistant" and any(c["id"] in blocked_ids for c in m.get("tool_calls") or []):
            m = {**m, "weight": 0}
        out.append(m)
    return out


class _NoModel:
    """The model of a replay: the committed actions are the trace's, so nothing asks a model."""

    name = "replay"

    def complete(
        self, messages: list[dict], *, tools: list[dict] | None, seed: int, json_mode: bool | dict[str, Any] = False
    ) -> ChatResult:
        raise RuntimeError("a replay of recorded actions asks no model")


def replay(
    bench: Benchmark,
    package: MemoryPackage,
    item_id: str,
    seed: int,
    steps: pd.DataFrame,
    recorded_score: float,
    where: str,
) -> Episode:
    """The episode's messages, tools and per-criterion scores, by replaying its committed actions (module doc)."""
    spec = world(bench.world)
    task = bench.tasks[item_id]
    env = spec.make_env(bench, task)
    port = ChatHarness(env, model=_NoModel(), seed=episode_seed(item_id, seed), targets=bench.targets)
    delivered: list[str] = []
    blocked_ids: set[str] = set()
    for s in frame_steps(steps):
        for c in s.delivered:
            if c not in delivered:
                delivered.append(c)
        a = s.action
        if a.get("kind") == "error" or port.ended:
            break
        call = None
        if a.get("tool"):
            call_id = s.observation.get("call_id") or f"call_{s.step + 1:03d}"
            call = ToolCall(id=call_id, name=a["tool"], args=a.get("args") or {})
            if s.blocked:
                blocked_ids.add(call_id)
        port.commit(Draft(content=a.get("content") or "", tool_call=call), s.blocked)
    score = env.score(port.transcript())
    if abs(score.reward - recorded_score) > 1e-9:
        raise InputError(
            f"{where}: score: replaying {item_id}#{seed} scores {score.reward:.4f}, the trace recorded "
            f"{recorded_score:.4f} (the benchmark or the world changed since the campaign ran)"
        )
    system = [{"role": "system", "content": env.system_prompt}]
    cards = [package.cards[c].render() for c in delivered if c in package.cards]
    if cards:
        from components.runtime import prompts

        system.append({"role": "system", "content": f"{prompts.MEMORY_HEADER}\n\n" + "\n\n".join(cards)})
    messages = _assistant_weight([*system, *port.messages], blocked_ids)
    return Episode(
        item_id, seed, score.reward, bool(score.success), dict(score.criteria), messages, port.tools, len(system)
    )


@dataclass(frozen=True)
class TrainEpisodes:
    scores: pd.DataFrame
    traces: pd.DataFrame
    source: str


def _train_eval_of(campaign: Path, digest: str) -> TrainEpisodes | None:
    """The latest round's train evaluation of the package with this digest, if any round evaluated it."""
    for meta_path in sorted(campaign.glob("rounds/r*/train/meta.json"), reverse=True):
        meta = read_json_object(meta_path)
        if meta.get("package_digest") == digest and meta.get("split") == SPLIT:
            d = meta_path.parent
            return TrainEpisodes(
                _read(d / "scores.csv"), _read(d / "traces.parquet"), d.relative_to(campaign).as_posix()
            )
    return None


def _read(path: Path) -> pd.DataFrame:
    """A campaign's table (ids as text), or one line naming the file: a truncated parquet or a damaged CSV is the
    campaign directory's fault, not a traceback."""
    try:
        if path.suffix == ".parquet":
            return pd.read_parquet(path)
        return pd.read_csv(path, dtype={"item_id": str}, keep_default_na=False)
    except FileNotFoundError:
        raise InputError(f"{path}: -: no such file (an unfinished or damaged campaign)") from None
    except (OSError, ValueError, UnicodeDecodeError) as e:  # pyarrow's ArrowInvalid is a ValueError
        raise InputError(f"{path}: -: damaged, cannot be read ({str(e).strip().splitlines()[0][:160]})") from None


def _evaluate(
    package: Path, bench: Benchmark, seeds: int, model: str, model_cfg: dict, max_turns: int
) -> TrainEpisodes:
    t = run_shard(package, bench, bench.ids(SPLIT), list(range(seeds)), model, model_cfg, max_turns)
    return TrainEpisodes(t.scores, t.traces, "evaluated")


def _episodes(
    eps: TrainEpisodes, bench: Benchmark, package: MemoryPackage, where: str
) -> dict[tuple[str, int], Episode]:
    by_ep = {k: g for k, g in eps.traces.groupby(["item_id", "seed"], sort=True)} if len(eps.traces) else {}
    out = {}
    train = set(bench.ids(SPLIT))
    for r in eps.scores.itertuples(index=False):
        key = (str(r.item_id), int(r.seed))
        if key[0] not in train:
            raise InputError(f"{where}: item_id: {key[0]} is not a train item of the benchmark")
        if isinstance(r.error, str) and r.error:
            continue  # a model fault: no conversation worth training on or scoring
        steps = by_ep.get(key)
        if steps is None:
            raise InputError(f"{where}: traces.parquet: no trace of {key[0]}#{key[1]}")
        ep = replay(bench, package, key[0], key[1], steps.sort_values("step"), float(r.score), where)
        out[key] = ep
    return out


def sft_record(ep: Episode) -> dict:
    return {"messages": ep.messages, "tools": ep.tools}


def preference_record(win: Episode, lose: Episode) -> dict:
    """Prompt: the longest shared prefix of the two conversations (policy + what both saw), ending before an
    assistant message; chosen and rejected: the rest of each. The memory message is left out: the two arms had
    different packages, and the pair contrasts the behaviour, not the harness."""
    a = [win.messages[0], *win.messages[win.conversation_at :]]
    b = [lose.messages[0], *lose.messages[lose.conversation_at :]]
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    while n > 1 and a[n - 1]["role"] == "assistant":  # a completion starts with the assistant's turn
        n -= 1
    return {
        "prompt": a[:n],
        "chosen": a[n:],
        "rejected": b[n:],
        "item_id": win.item_id,
        "seed": win.seed,
        "tools": win.tools,
    }


def rollout_record(ep: Episode, arm: str, version: str, digest: str, weights: dict[str, float]) -> dict:
    return {
        "item_id": ep.item_id,
        "seed": ep.seed,
        "arm": arm,
        "version": version,
        "package_digest": digest,
        "reward": ep.score,
        "success": ep.success,
        "criteria": ep.criteria,
        "weights": weights,
        "messages": ep.messages,
        "tools": ep.tools,
    }


def _jsonl(records: list[dict]) -> bytes:
    return "".join(json.dumps(r, sort_keys=True, ensure_ascii=False) + "\n" for r in records).encode("utf-8")


def export_campaign(campaign: str | Path, bench_dir: str | Path, out: str | Path, split: str = SPLIT) -> ExportManifest:
    """Write `out` (atomically, replacing an older export) from a finished campaign; return its manifest."""
    from components.evolution.lineage import Lineage

    check_split(split)
    campaign = Path(campaign)
    summary = read_json_object(campaign / "summary.json")
    params = summary.get("params") or {}
    c = params.get("campaign") or {}
    bench = benchmark_at(bench_dir)
    if summary.get("benchmark_digest") != bench.digest:
        raise InputError(
            f"{Path(bench_dir)}: digest: {bench.digest[:12]} is not the benchmark the campaign ran "
            f"({str(summary.get('benchmark_digest'))[:12]}, {campaign / 'summary.json'})"
        )
    lineage = Lineage(campaign / "lineage")
    versions = lineage.versions()
    start, champ = versions[0], versions[-1]
    for v in {start.name: start, champ.name: champ}.values():  # the bytes the manifest pins are the bytes read
        lineage.check_bytes(v)
    seeds = int(c.get("seeds", 1))
    model, model_cfg = str(c.get("model", "sim")), dict(c.get("model_cfg") or {})
    champ_pkg, start_pkg = load_package(champ.path), load_package(start.path)

    champ_eps = _train_eval_of(campaign, champ.digest) or _evaluate(
        champ.path, bench, seeds, model, model_cfg, int(c.get("max_turns", MAX_TURNS))
    )
    start_eps = _train_eval_of(campaign, start.digest)
    if start_eps is None:
        raise InputError(f"{campaign}: rounds: no train evaluation of the start package (an unfinished campaign?)")
    where = str(campaign)
    champ_by = _episodes(champ_eps, bench, champ_pkg, f"{campaign / champ_eps.source}")
    start_by = (
        champ_by
        if start.digest == champ.digest
        else _episodes(start_eps, bench, start_pkg, f"{campaign / start_eps.source}")
    )

    sft = _sft_records(champ_by, f"{campaign / champ_eps.source}")
    prefs = [
        preference_record(e, start_by[k])
        for k, e in sorted(champ_by.items())
        if e.success and k in start_by and not start_by[k].success
    ]
    rollouts = [*_rollouts(bench, "start", start, start_by), *_rollouts(bench, "champion", champ, champ_by)]
    data = {
        "sft.jsonl": (sft, _jsonl(sft)),
        "preferences.jsonl": (prefs, _jsonl(prefs)),
        "rollouts.jsonl": (rollouts, _jsonl(rollouts)),
    }
    manifest = ExportManifest(
        campaign=str(summary.get("campaign") or c.get("name") or campaign.name),
        campaign_dir=where,
        world=bench.world,
        split=SPLIT,
        benchmark_digest=bench.digest,
        champion=champ.name,
        champion_digest=champ.digest,
        start=start.name,
        start_digest=start.digest,
        model=model,
        model_cfg=model_cfg,
        seeds=seeds,
        champion_train_source=champ_eps.source,
        files={
            name: ExportedFile(path=name, sha256=hashlib.sha256(b).hexdigest(), bytes=len(b), records=len(recs))
            for name, (recs, b) in data.items()
        },
    )
    with atomic_dir(out, mark=MARK) as tmp:
        for name, (_, b) in data.items():
            (tmp / name).write_bytes(b)
        (tmp / MANIFEST).write_text(dumps(manifest.model_dump()))
    return manifest


def _sft_records(champ_by: dict, source: str) -> list[dict]:
    """A chat record per successful champion episode; one a trainer would refuse is an error, never written."""
    sft = []
    for k, e in sorted(champ_by.items()):
        if not e.success:
            continue
        rec = sft_record(e)
        bad = problems(rec)
        if bad:  # what a trainer would refuse is not written
            raise InputError(f"{source}: {k[0]}#{k[1]}: not a fine-tuning chat record: {bad[0]}")
        sft.append(rec)
    return sft


def _rollouts(bench: Any, arm: str, version: Any, by: dict) -> list[dict]:
    """Every episode of one arm as a rollout, with its task's criterion weights."""
    out = []
    for k, e in sorted(by.items()):
        weights = {cr.id: cr.weight for cr in bench.tasks[k[0]].rubric}
        out.append(rollout_record(e, arm, version.name, version.digest, weights))
    return out


def read_manifest(export_dir: str | Path, verify: bool = True) -> ExportManifest:
    """An export's manifest; with `verify`, every file's bytes are checked against their pinned sha256."""
    from pydantic import ValidationError

    d = Path(export_dir)
    raw = read_json_object(d / MANIFEST)
    try:
        m = ExportManifest.model_validate(raw)
    except ValidationError as e:
        first = e.errors()[0]
        raise InputError(f"{d / MANIFEST}: {'.'.join(str(x) for x in first['loc']) or '-'}: {first['msg']}") from None
    for name, f in m.files.items():  # an entry names a file of this export, never one outside it
        confined(d, f.path, f"{d / MANIFEST}: files.{name}.path")
    if verify:
        for name, f in m.files.items():
            p = d / f.path
            if not p.is_file():
                raise InputError(f"{p}: -: no such file (listed in {d / MANIFEST})")
            got = hashlib.sha256(p.read_bytes()).hexdigest()
            if got != f.sha256:
                raise InputError(f"{p}: sha256: {got[:12]} is not the pinned {f.sha256[:12]} ({d / MANIFEST})")
    return m


def read_jsonl(path: str | Path) -> list[dict]:
    p = Path(path)
    out = []
    for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(f"{p}: line {n}: not JSON ({e.msg})") from None
        if not isinstance(rec, dict):
            raise InputError(f"{p}: line {n}: not a JSON object")
        out.append(rec)
    return out
