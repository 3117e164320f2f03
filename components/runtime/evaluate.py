"""Evaluation: every (item, seed) episode of a package on a benchmark split, as tables.

    scores.csv            item_id, seed, score, success, turns, tokens_in, tokens_out, model_calls, tool_calls,
                          user_tokens_in, user_tokens_out, user_model_calls (a simulated user's own model), error
    traces.parquet        one row per turn (see `trace.py`), with item_id and seed
    _hidden/causes.csv    the hidden ground-truth cause of each failed episode: read only by diagnosis scoring
    .timings.parquet      when each turn and its phases ran (wall clock; `TIMING_COLUMNS`): read only to draw MLflow
                          traces. The one file that differs between runs, so DVC ignores it (.dvcignore) and
                          nothing compares or hashes it
    meta.json             package and benchmark digests, split, seed map hash, model

Episodes run in shards (a list of items); a shard is the unit a Prefect task or a Dask worker runs.
The same inputs give byte-identical scores.csv.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar, cast, overload

import pandas as pd

from components.defaults import MAX_TURNS
from components.io import atomic_dir, dumps, tree_stats
from components.memory.package import MemoryPackage, load_package
from components.models import make_model
from components.runtime.episode import EpisodeResult, episode_seed, run_episode
from components.runtime.trace import steps_frame
from components.worlds import Benchmark, load_benchmark

SCORE_COLUMNS = [
    "item_id",
    "seed",
    "score",
    "success",
    "turns",
    "tokens_in",
    "tokens_out",
    "model_calls",
    "tool_calls",
    "user_tokens_in",
    "user_tokens_out",
    "user_model_calls",
    "error",
]
HIDDEN = "_hidden"
TIMINGS = ".timings.parquet"
TIMING_COLUMNS = ["item_id", "seed", "step", "i", "phase", "start_ns", "end_ns"]  # i: the order in its episode


RACY_NS = 2_000_000_000  # a file changed this recently may change again within the same clock tick: do not trust stats


_loaded: dict[tuple[str, str, str, tuple[Any, ...]], Any] = {}  # (kind, path, resolved path, tree stats) -> loaded
_loaded_lock = threading.Lock()
T = TypeVar("T")


def _memo_load(kind: str, loader: Callable[[Path], T], path: str | Path) -> T:
    """`loader(path)`, memoized on the stat of every file under the directory (as `flows.tasks.tree_digest` is): a
    campaign's every shard and stage reads the same benchmark (~0.3 s to parse) and packages. A tree touched within
    the last two seconds is loaded afresh (as in git's "racy" check). What is returned is shared: read-only."""
    p = Path(path)
    rp = p.resolve()
    if not rp.is_dir():
        return loader(p)
    stats, newest = tree_stats(rp)
    if time.time_ns() - newest < RACY_NS:
        return loader(p)
    key = (kind, str(p), str(rp), stats)
    with _loaded_lock:
        hit = _loaded.get(key)
    if hit is not None:
        return cast(T, hit)  # what `loader` returned for this kind
    got = loader(p)
    with _loaded_lock:
        _loaded[key] = got
        while len(_loaded) > 32:
            _loaded.pop(next(iter(_loaded)))
    return got


def benchmark_at(path: str | Path | Benchmark) -> Benchmark:
    """The benchmark at `path` (`load_benchmark`), loaded once while its files are unchanged."""
    return path if isinstance(path, Benchmark) else _memo_load("benchmark", load_benchmark, path)


def package_at(path: str | Path | MemoryPackage) -> MemoryPackage:
    """The memory package at `path` (`load_package`), loaded once while its files are unchanged."""
    return path if isinstance(path, MemoryPackage) else _memo_load("package", load_package, path)


def eval_items(bench: str | Path | Benchmark, split: str | None, items: list[str] | None) -> list[str]:
    """The items an evaluation runs: `items` as given, else those of `split`."""
    if items is not None:
        return list(items)
    if split is None:
        raise ValueError("an evaluation runs a split or the items given: neither was given")
    return benchmark_at(bench).ids(split)


def seed_map(items: list[str], seeds: list[int]) -> dict[str, int]:
    return {f"{i}#{s}": episode_seed(i, s) for i in items for s in seeds}


def seed_map_hash(items: list[str], seeds: list[int]) -> str:
    return hashlib.sha256(json.dumps(seed_map(sorted(items), sorted(seeds)), sort_keys=True).encode()).hexdigest()


@dataclass
class EvalTables:
    scores: pd.DataFrame
    traces: pd.DataFrame
    causes: pd.DataFrame
    paid: dict[str, int] | None = None  # with a reply store: what the calls that missed it cost (scores: logical usage)
    timings: pd.DataFrame | None = field(default=None, compare=False)  # TIMING_COLUMNS; None: not recorded

    @classmethod
    def concat(cls, parts: list[EvalTables]) -> EvalTables:
        def cat(frames: list[pd.DataFrame], keys: list[str]) -> pd.DataFrame:
            frames = [f for f in frames if len(f)]
            if not frames:
                return pd.DataFrame(columns=keys)
            return pd.concat(frames, ignore_index=True).sort_values(keys, kind="stable").reset_index(drop=True)

        timed = [t for p in parts if (t := getattr(p, "timings", None)) is not None]  # a result pickled before
        return cls(
            cat([p.scores for p in parts], ["item_id", "seed"]),
            cat([p.traces for p in parts], ["item_id", "seed", "step"]),
            cat([p.causes for p in parts], ["item_id", "seed"]),
            timings=cat(timed, TIMING_COLUMNS[:4]) if timed else None,
        )


def tables(results: list[EpisodeResult]) -> EvalTables:
    scores = pd.DataFrame([r.row() for r in results], columns=SCORE_COLUMNS)
    traces = [steps_frame(r.steps, item_id=r.item_id, seed=r.seed) for r in results if r.steps]
    causes = pd.DataFrame(columns=["item_id", "seed", "cause"])  # filled by counterfactual replay where wanted
    timings = pd.DataFrame(
        [
            (r.item_id, r.seed, step, i, phase, start, end)
            for r in results
            for i, (step, phase, start, end) in enumerate(r.timings)
        ],
        columns=TIMING_COLUMNS,
    )
    return EvalTables.concat(
        [
            EvalTables(
                scores, pd.concat(traces, ignore_index=True) if traces else pd.DataFrame(), causes, timings=timings
            )
        ]
    )


def run_shard(
    package: str | Path | MemoryPackage,
    bench: str | Path | Benchmark,
    items: list[str],
    seeds: list[int],
    model: str = "sim",
    model_cfg: dict[str, Any] | None = None,
    max_turns: int = MAX_TURNS,
    on_episode: Callable[[EpisodeResult], None] | None = None,
    call_cache: str | Path | None = None,
    journal: Any = None,
) -> EvalTables:
    """Run every (item, seed) of a shard. Paths are accepted so a shard can run in another process.
    `call_cache`: a reply store (`components.models.callcache`) that answers requests already paid for; the tables
    are the same, and `paid` says what the calls that missed it cost. `journal` (`components.runtime.journal`): each
    finished episode is written there as it ends, and an episode it already holds is not run again."""
    pkg, b = package_at(package), benchmark_at(bench)
    chat = make_model(model, model_cfg)
    store = cached = None
    if call_cache is not None:
        from components.models.callcache import CachedModel, CallStore

        store = CallStore(call_cache)
        chat = cached = CachedModel(chat, store, {"model": model, "cfg": model_cfg or {}})
    results = []
    try:
        for item in items:
            for s in seeds:
                r = journal.get(item, s) if journal is not None else None
                if r is None:
                    r = run_episode(pkg, b, item, s, chat, max_turns)
                    if journal is not None:
                        journal.put(r)
                results.append(r)
                if store is not None:
                    store.flush()
                if on_episode:
                    on_episode(r)
    finally:
        if store is not None:
            store.close()
    out = tables(results)
    if cached is not None:  # (with `store`)
        out.paid = {
            "tokens_in": cached.paid.tokens_in,
            "tokens_out": cached.paid.tokens_out,
            "model_calls": cached.paid.calls,
            "hits": cached.hits,
        }
    elif journal is not None and journal.resumed:  # resumed episodes were paid for by the run that finished them
        fresh = [r for r in results if not r.resumed]
        out.paid = {
            "tokens_in": sum(r.tokens_in for r in fresh),
            "tokens_out": sum(r.tokens_out for r in fresh),
            "model_calls": sum(r.model_calls for r in fresh),
            "hits": 0,
        }
    return out


def shards(items: list[str], size: int) -> list[list[str]]:
    return [items[i : i + size] for i in range(0, len(items), max(1, size))]


def write_eval(out: str | Path, t: EvalTables, meta: dict[str, Any], mark: str | None = None) -> Path:
    """Write an evaluation directory atomically (replacing an older one), marked as Ratchet's output if `mark`."""
    with atomic_dir(out, mark=mark) as tmp:
        t.scores.to_csv(tmp / "scores.csv", index=False, lineterminator="\n")
        t.traces.to_parquet(tmp / "traces.parquet", index=False)
        (tmp / HIDDEN).mkdir()
        t.causes.to_csv(tmp / HIDDEN / "causes.csv", index=False, lineterminator="\n")
        (tmp / "meta.json").write_text(dumps(meta))
        if t.timings is not None and len(t.timings):
            t.timings.to_parquet(tmp / TIMINGS, index=False)
    return Path(out)


def error_kinds(scores: pd.DataFrame) -> dict[str, int]:
    """Errored episodes by kind (`components.models.base.ERROR_KINDS`: the word after "model: " in `error`)."""
    errs = scores["error"].fillna("").astype(str) if len(scores) else pd.Series([], dtype=str)
    kinds = errs[errs != ""].str.removeprefix("model: ").str.split(":").str[0]
    return {str(k): int(n) for k, n in sorted(kinds.value_counts().items())}


def summary(scores: pd.DataFrame) -> dict[str, float]:
    """The headline figures, and `errors_<kind>` for each error kind that occurred (flat: MLflow logs them)."""
    return {
        "episodes": int(len(scores)),
        "mean_score": float(scores["score"].mean()) if len(scores) else 0.0,
        "success_rate": float(scores["success"].mean()) if len(scores) else 0.0,
        "errors": int((scores["error"].fillna("") != "").sum()) if len(scores) else 0,
        "tokens_in": int(scores["tokens_in"].sum()) if len(scores) else 0,
        "tokens_out": int(scores["tokens_out"].sum()) if len(scores) else 0,
        "model_calls": int(scores["model_calls"].sum()) if len(scores) else 0,
        "tool_calls": int(scores["tool_calls"].sum()) if len(scores) else 0,
        # a simulated user's own model (0 for a scripted one); absent from a scores.csv older than these columns
        **{
            k: int(scores[k].sum()) if len(scores) and k in scores else 0
            for k in ("user_tokens_in", "user_tokens_out", "user_model_calls")
        },
        **{f"errors_{k}": n for k, n in error_kinds(scores).items()},
    }


@overload
def pass_hat_k(scores: pd.DataFrame, per_item: Literal[False] = False) -> dict[int, float]: ...
@overload
def pass_hat_k(scores: pd.DataFrame, per_item: Literal[True]) -> dict[str, dict[int, float]]: ...


def pass_hat_k(scores: pd.DataFrame, per_item: bool = False) -> dict[int, float] | dict[str, dict[int, float]]:
    """pass^k for k = 1..n (the consistency measure benchmark leaderboards report): for each item with n episodes of which c succeeded,
    C(c, k) / C(n, k), the chance that k episodes drawn without replacement all succeed; averaged over items. Items
    with fewer than k episodes do not count at k. `per_item`: {item: {k: value}} instead of the average."""
    from math import comb

    if not len(scores):
        return {}
    counts = scores.groupby("item_id")["success"].agg(["size", "sum"])
    items = {
        str(i): {k: comb(int(c), k) / comb(int(n), k) for k in range(1, int(n) + 1)} for i, (n, c) in counts.iterrows()
    }
    if per_item:
        return items
    top = max(len(v) for v in items.values())
    return {
        k: float(sum(v[k] for v in items.values() if k in v) / sum(1 for v in items.values() if k in v))
        for k in range(1, top + 1)
    }
