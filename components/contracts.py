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
def _context():
    import logging

    import great_expectations as gx

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


def _validate(df: pd.DataFrame, name: str, expectations: list, ids: list[str]) -> list[str]:
    """Failed expectations as lines: '<column> <what is wrong> for <row ids> [<expectation>]'."""
    import great_expectations as gx

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
        result = batch.validate(suite, result_format=fmt)
    failures = []
    for r in result.results:
        if r.success:
            continue
        cfg = r.expectation_config
        target = cfg.kwargs.get("column") or ",".join(cfg.kwargs.get("column_list") or []) or "-"
        kw = {"min_value": "-inf", "max_value": "inf"}
        kw.update({k: (f"{v:g}" if isinstance(v, float) else v) for k, v in cfg.kwargs.items() if v is not None})
        what = PHRASE.get(cfg.type, "unexpected").format(**kw)
        rows = ["#".join(str(row.get(k)) for k in ids) for row in (r.result or {}).get("unexpected_index_list") or []]
        where = f" for {', '.join(rows[:5])}" + (f" and {len(rows) - 5} more" if len(rows) > 5 else "") if rows else ""
        failures.append(f"{target} {what}{where} [{cfg.type}]")
    return failures


def check_benchmark(root: str | Path) -> None:
    import great_expectations as gx

    root = Path(root)
    tasks = pd.read_csv(root / "tasks.csv", dtype={"task_id": str, "split": str})
    split_rows = [{"task_id": t, "split": s} for s, ids in json.loads((root / "splits.json").read_text()).items() for t in ids]
    joined = tasks[["task_id", "split"]].merge(pd.DataFrame(split_rows, columns=["task_id", "split"]),
                                               on=["task_id", "split"], how="outer", indicator=True)
    joined["_merge"] = joined["_merge"].astype(str)
    E = gx.expectations
    failures = _validate(tasks, "benchmark_tasks", [
        E.ExpectColumnValuesToNotBeNull(column="task_id"),
        E.ExpectColumnValuesToBeUnique(column="task_id"),
        E.ExpectColumnValuesToBeOfType(column="task_id", type_="str"),
        E.ExpectColumnValuesToNotBeNull(column="split"),
        E.ExpectColumnValuesToBeInSet(column="split", value_set=SPLITS),
        E.ExpectColumnValuesToBeBetween(column="min_weight", min_value=0, strict_min=True),
        E.ExpectColumnValuesToNotBeNull(column="min_weight"),
    ], ["task_id"])
    failures += _validate(joined, "benchmark_splits", [
        E.ExpectColumnValuesToBeInSet(column="_merge", value_set=["both"]),
        E.ExpectCompoundColumnsToBeUnique(column_list=["task_id", "split"]),
    ], ["task_id", "split"])
    if failures:
        raise ContractError(str(root), failures)


def check_paired_scores(base: pd.DataFrame, cand: pd.DataFrame, where: str = "paired scores") -> None:
    import great_expectations as gx

    E = gx.expectations
    failures = []
    for arm, df in (("base", base), ("cand", cand)):
        missing = [c for c in ("item_id", "seed", "score") if c not in df.columns]
        if missing:
            failures.append(f"{arm}: missing column(s) {', '.join(missing)}")
            continue
        f = _validate(df[["item_id", "seed", "score"]], "scores", [
            E.ExpectColumnValuesToNotBeNull(column="item_id"),
            E.ExpectColumnValuesToNotBeNull(column="seed"),
            E.ExpectColumnValuesToNotBeNull(column="score"),
            E.ExpectColumnValuesToBeBetween(column="score", min_value=0, max_value=1),
            E.ExpectCompoundColumnsToBeUnique(column_list=["item_id", "seed"]),
        ], ["item_id", "seed"])
        failures += [f"{arm}: {x}" for x in f]
    if not failures:
        keys = ["item_id", "seed"]
        joined = base[keys].astype(str).merge(cand[keys].astype(str), on=keys, how="outer", indicator=True)
        joined["pair"] = joined["_merge"].astype(str).map({"both": "both", "left_only": "base only", "right_only": "cand only"})
        joined["arm"] = joined["pair"]
        failures += [f"incomplete pairing: {x}" for x in _validate(joined[["item_id", "seed", "pair", "arm"]], "pairing", [
            E.ExpectColumnValuesToBeInSet(column="pair", value_set=["both"]),
        ], ["item_id", "seed", "arm"])]
    if failures:
        raise ContractError(where, failures)
