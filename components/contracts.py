"""Data contracts, checked by great-expectations suites before the data is used:

    benchmark     tasks.csv: task ids unique, every task in exactly one of train/dev/test, rubric weights > 0,
                  and splits.json naming exactly the same (task, split) pairs
    paired scores both arms of a gate or repair screen: every (item, seed) in both arms, once, with a score in
                  [0, 1], no missing value

A failure raises ContractError with one readable line per failed expectation; callers run the contract before
they write anything, so nothing downstream is written.
"""

from __future__ import annotations

import json
import threading
from functools import lru_cache
from pathlib import Path

import pandas as pd

from components.errors import InputError

SPLITS = ["train", "dev", "test"]
_lock = threading.Lock()  # one ephemeral context shared by threads; GX's fluent registry is not thread-safe


class ContractError(InputError):
    def __init__(self, where: str, failures: list[str]):
        self.failures = failures
        super().__init__("\n".join(f"{where}: {f}" for f in failures))


@lru_cache(maxsize=1)
def _gx():
    """great_expectations, imported once with the collector paused (~3.5 CPU-s of imports that live as long as the
    process: components/heap.py)."""
    from components.heap import long_lived

    with long_lived("great_expectations"):
        import great_expectations as gx
    return gx


@lru_cache(maxsize=1)
def _context():
    import logging

    gx = _gx()
    for name in [n for n in logging.root.manager.loggerDict if n.startswith("great_expectations")]:
        logging.getLogger(name).setLevel(logging.WARNING)  # its import sets INFO on some of its loggers
    ctx = gx.get_context(mode="ephemeral")
    try:  # no progress bars in logs (TQDM_DISABLE covers the rest)
        from great_expectations.data_context.types.base import ProgressBarsConfig

        ctx.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
    except (ImportError, AttributeError):  # pragma: no cover - older layouts
        pass
    return ctx, ctx.data_sources.add_pandas("ratchet")


PHRASE = {
    "expect_column_values_to_not_be_null": "missing or not a number",
    "expect_column_values_to_be_between": "outside [{min_value}, {max_value}]",
    "expect_compound_columns_to_be_unique": "duplicated",
    "expect_column_values_to_be_unique": "not unique",
    "expect_column_values_to_be_in_set": "not one of {value_set}",
    "expect_column_values_to_be_of_type": "not of type {type_}",
}


def _results(df: pd.DataFrame, name: str, expectations: list, ids: list[str]) -> list:
    """The great-expectations results of `expectations` on `df`, with the `ids` columns of every unexpected row."""
    gx = _gx()

    with _lock:
        _ctx, source = _context()
        try:
            asset = source.get_asset(name)
        except LookupError:
            asset = source.add_dataframe_asset(name=name)
        try:
            batch_def = asset.get_batch_definition("whole")
        except KeyError:
            batch_def = asset.add_batch_definition_whole_dataframe("whole")
        suite = gx.ExpectationSuite(name=name, expectations=expectations)
        fmt = {"result_format": "COMPLETE", "unexpected_index_column_names": ids}
        batch = batch_def.get_batch(batch_parameters={"dataframe": df.reset_index(drop=True)})
        return batch.validate(suite, result_format=fmt).results


def _line(r, rows: list[str], target: str | None = None) -> str:
    """One failed expectation as a line: '<column> <what is wrong> for <row ids> [<expectation>]'."""
    cfg = r.expectation_config
    if target is None:
        target = cfg.kwargs.get("column") or ",".join(cfg.kwargs.get("column_list") or []) or "-"
    kw = {"min_value": "-inf", "max_value": "inf"}
    kw.update({k: (f"{v:g}" if isinstance(v, float) else v) for k, v in cfg.kwargs.items() if v is not None})
    what = PHRASE.get(cfg.type, "unexpected").format(**kw)
    where = f" for {', '.join(rows[:5])}" + (f" and {len(rows) - 5} more" if len(rows) > 5 else "") if rows else ""
    return f"{target} {what}{where} [{cfg.type}]"


def _unexpected(r) -> list[dict]:
    return (r.result or {}).get("unexpected_index_list") or []


def _validate(df: pd.DataFrame, name: str, expectations: list, ids: list[str]) -> list[str]:
    """Failed expectations as lines: '<column> <what is wrong> for <row ids> [<expectation>]'."""
    return [
        _line(r, ["#".join(str(row.get(k)) for k in ids) for row in _unexpected(r)])
        for r in _results(df, name, expectations, ids)
        if not r.success
    ]


def check_benchmark(root: str | Path) -> None:
    gx = _gx()

    root = Path(root)
    tasks = pd.read_csv(root / "tasks.csv", dtype={"task_id": str, "split": str})
    split_rows = [
        {"task_id": t, "split": s} for s, ids in json.loads((root / "splits.json").read_text()).items() for t in ids
    ]
    joined = tasks[["task_id", "split"]].merge(
        pd.DataFrame(split_rows, columns=["task_id", "split"]), on=["task_id", "split"], how="outer", indicator=True
    )
    joined["_merge"] = joined["_merge"].astype(str)
    E = gx.expectations
    failures = _validate(
        tasks,
        "benchmark_tasks",
        [
            E.ExpectColumnValuesToNotBeNull(column="task_id"),
            E.ExpectColumnValuesToBeUnique(column="task_id"),
            E.ExpectColumnValuesToBeOfType(column="task_id", type_="str"),
            E.ExpectColumnValuesToNotBeNull(column="split"),
            E.ExpectColumnValuesToBeInSet(column="split", value_set=SPLITS),
            E.ExpectColumnValuesToBeBetween(column="min_weight", min_value=0, strict_min=True),
            E.ExpectColumnValuesToNotBeNull(column="min_weight"),
        ],
        ["task_id"],
    )
    failures += _validate(
        joined,
        "benchmark_splits",
        [
            E.ExpectColumnValuesToBeInSet(column="_merge", value_set=["both"]),
            E.ExpectCompoundColumnsToBeUnique(column_list=["task_id", "split"]),
        ],
        ["task_id", "split"],
    )
    if failures:
        raise ContractError(str(root), failures)


def check_paired_scores(base: pd.DataFrame, cand: pd.DataFrame, where: str = "paired scores") -> None:
    """Each arm: item_id, seed and score present, score in [0, 1], (item_id, seed) unique; then, when both arms pass,
    their pairing: every (item_id, seed) in both. One great-expectations validation of both arms stacked (an arm
    column keeps their rows apart) checks all of it: the same expectations over the same rows as validating each arm
    and the pairing table apart, at a third of the cost (a validation's overhead, ~0.1 s, dwarfs these tables)."""
    gx = _gx()

    E = gx.expectations
    lines: dict[str, list[str]] = {"base": [], "cand": []}  # each arm's failures, base first
    arms = []
    for arm, df in (("base", base), ("cand", cand)):
        missing = [c for c in ("item_id", "seed", "score") if c not in df.columns]
        if missing:
            lines[arm].append(f"{arm}: missing column(s) {', '.join(missing)}")
        else:
            arms.append((arm, df[["item_id", "seed", "score"]].reset_index(drop=True)))
    if not arms:
        raise ContractError(where, lines["base"] + lines["cand"])
    stacked = _stacked_arms(arms)
    results = _results(
        stacked.drop(columns="_key"),
        "scores",
        [
            E.ExpectColumnValuesToNotBeNull(column="item_id"),
            E.ExpectColumnValuesToNotBeNull(column="seed"),
            E.ExpectColumnValuesToNotBeNull(column="score"),
            E.ExpectColumnValuesToBeBetween(column="score", min_value=0, max_value=1),
            E.ExpectCompoundColumnsToBeUnique(column_list=["_arm", "item_id", "seed"]),
            E.ExpectColumnValuesToBeInSet(column="pair", value_set=["both"]),
        ],
        ["_arm", "_id", "_pid"],
    )
    failed = [r for r in results if not r.success]
    _arm_lines(
        lines, [arm for arm, _ in arms], [r for r in failed if r.expectation_config.kwargs.get("column") != "pair"]
    )
    failures = lines["base"] + lines["cand"]
    if not failures and len(arms) == 2:
        failures += _pairing_lines(stacked, failed)
    if failures:
        raise ContractError(where, failures)


def _stacked_arms(arms: list[tuple[str, pd.DataFrame]]) -> pd.DataFrame:
    """The arms' rows stacked, each with its arm, its id as the arm alone names it, and its pairing: an outer join of
    the arms' keys (as strings) reads it, a key is in both or in one arm only."""
    keys = ["item_id", "seed"]
    str_keys = {arm: df[keys].astype(str) for arm, df in arms}
    key_sets = {arm: set(zip(k["item_id"], k["seed"])) for arm, k in str_keys.items()}
    parts = []
    for arm, df in arms:
        other = key_sets.get("cand" if arm == "base" else "base", set())
        k = str_keys[arm]
        pair = ["both" if key in other else f"{arm} only" for key in zip(k["item_id"], k["seed"])]
        parts.append(
            df.assign(
                _arm=arm,
                _id=["#".join(str(v) for v in row) for row in df[keys].itertuples(index=False, name=None)],  # as alone
                _key=list(zip(k["item_id"], k["seed"])),
                pair=pair,
                _pid=[f"{i}#{s}#{p}" for i, s, p in zip(k["item_id"], k["seed"], pair)],
            )
        )
    return pd.concat(parts, ignore_index=True)


def _arm_lines(lines: dict[str, list[str]], arms: list[str], arm_failed: list) -> None:
    """Each arm's failed expectations (all but the pairing), as lines naming that arm's rows."""
    for arm in arms:
        for r in arm_failed:
            rows = _unexpected(r)
            mine = [row["_id"] for row in rows if row.get("_arm") == arm]
            if mine or not rows:
                target = "item_id,seed" if r.expectation_config.kwargs.get("column_list") else None
                lines[arm].append(f"{arm}: {_line(r, mine, target)}")


def _pairing_lines(stacked: pd.DataFrame, failed: list) -> list[str]:
    """The pairing's failure, its keys in the order of an outer join (sorted keys)."""
    out = []
    for r in failed:
        if r.expectation_config.kwargs.get("column") == "pair":
            order = {row["_pid"]: i for i, row in enumerate(_unexpected(r))}
            only = stacked[stacked["_pid"].isin(order)].sort_values(["_key"], kind="stable")
            out.append(f"incomplete pairing: {_line(r, list(only['_pid']), 'pair')}")
    return out
