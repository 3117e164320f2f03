"""The gate on two score files (`ratchet gate`): a light reader for the tables the gate is usually given, pandas for
the rest.

    light    the csv module and numpy: a well-formed table (a header with item_id, seed and score, every row as long
             as the header, no quotes, integer seeds, plain decimal scores in [0, 1]; `error` optional) that pairs
             completely is read, paired and judged without pandas (pandas costs more to import than numpy does).
             The per-item means are summed as pandas' groupby sums them (Kahan, in the base table's row order), so
             the verdict is the same to the last bit.
    pandas   anything else (a missing file, a directory, a ragged or quoted table, an NA cell, a seed written 1.0,
             an incomplete pairing, a duplicate, too many errors, too few items) goes through `pd.read_csv` and
             `gate.gate`, which read or refuse it with the same one-line message as always.

So the light path decides only what the pandas path would decide the same way; every refusal is the pandas path's.
"""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path

import numpy as np

from components.errors import InputError
from components.evolution import gate as gate_mod
from components.evolution.gate import GateConfig, GateResult, PairingError

# pandas' default NA strings (pandas._libs.parsers.STR_NA_VALUES): such a cell is NaN to read_csv
NA_STRINGS = frozenset({"", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND", "1.#QNAN",
                        "<NA>", "N/A", "NA", "NULL", "NaN", "None", "n/a", "nan", "null"})
_INT = re.compile(r"-?[0-9]{1,18}")
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]{1,3})?")
CLI_KEYS = ("accept", "net", "ci_lo", "ci_hi", "n_items", "n_improved", "n_regressed", "reason")


def read_light(path: Path) -> dict | None:
    """A well-formed score table as columns (items, seeds, scores, errored), or None: leave it to pandas."""
    try:
        with open(path, encoding="utf-8", newline="") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError):
        return None
    if '"' in text or text.startswith("\ufeff"):
        return None
    rows = [r for r in csv.reader(io.StringIO(text)) if r]  # blank lines skipped, as read_csv skips them
    if len(rows) < 2 or len(set(rows[0])) != len(rows[0]):
        return None
    head = rows[0]
    try:
        i, s, v = head.index("item_id"), head.index("seed"), head.index("score")
    except ValueError:
        return None
    e = head.index("error") if "error" in head else None
    width = len(head)
    items, seeds, scores, errored = [], [], [], []
    for r in rows[1:]:
        if len(r) != width or r[i] in NA_STRINGS or not _INT.fullmatch(r[s]) or not _DECIMAL.fullmatch(r[v]):
            return None
        items.append(r[i])
        seeds.append(int(r[s]))
        scores.append(float(r[v]))
        errored.append(e is not None and r[e] not in NA_STRINGS)
    return {"items": items, "seeds": seeds, "scores": np.array(scores), "errored": np.array(errored, dtype=bool)}


def pair_light(b: dict, c: dict, cfg: GateConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray, int] | None:
    """(base, cand, d) per item in sorted item order and the pairs dropped for errors, as `gate.pair` computes them;
    None for anything `gate.pair` would refuse (it says why)."""
    for arm in (b, c):
        if ((arm["scores"] < 0) | (arm["scores"] > 1)).any():
            return None
    kb, kc = list(zip(b["items"], b["seeds"])), list(zip(c["items"], c["seeds"]))
    at_c = {k: n for n, k in enumerate(kc)}
    if len(at_c) != len(kc) or len(set(kb)) != len(kb) or set(kb) != at_c.keys():
        return None
    ci = np.fromiter((at_c[k] for k in kb), dtype=np.intp, count=len(kb))
    errored = b["errored"] | c["errored"][ci]
    dropped = int(errored.sum())
    if dropped / len(kb) > cfg.max_error_share or dropped == len(kb):
        return None
    keep = ~errored
    items = np.array(b["items"], dtype=str)[keep]
    names, inv = np.unique(items, return_inverse=True)
    if len(names) < cfg.min_items:
        return None
    base = _group_means(inv, b["scores"][keep], len(names))
    cand = _group_means(inv, c["scores"][ci][keep], len(names))
    return base, cand, cand - base, dropped


def _group_means(group: np.ndarray, values: np.ndarray, n_groups: int) -> np.ndarray:
    """Per-group means as pandas' groupby mean computes them, bit for bit (`gate.pair`'s per-item means): rows
    already sorted by group go through `np.add.reduceat` (pandas 3's fast path for monotonic groups), any other
    order through a Kahan-compensated sum in row order (its Cython group_mean)."""
    if len(group) and (np.diff(group) >= 0).all():
        starts = np.flatnonzero(np.r_[True, group[1:] != group[:-1]])
        return np.add.reduceat(np.ascontiguousarray(values, dtype=np.float64), starts) / np.diff(
            starts, append=len(group)).astype(np.float64)
    return _kahan_means(group, values, n_groups)


def _kahan_means(group: np.ndarray, values: np.ndarray, n_groups: int) -> np.ndarray:
    """Per-group means summed in row order with Kahan compensation, as pandas' Cython group_mean sums."""
    order = np.argsort(group, kind="stable")
    counts = np.bincount(group, minlength=n_groups)
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    rank = np.empty(len(group), dtype=np.intp)
    rank[order] = np.arange(len(group)) - np.repeat(starts, counts)
    total, comp = np.zeros(n_groups), np.zeros(n_groups)
    for r in range(int(counts.max())):
        at = rank == r
        g = group[at]
        y = values[at] - comp[g]
        t = total[g] + y
        comp[g] = t - total[g] - y
        total[g] = t
    return total / counts


def read_scores(path: Path, name: str):
    """A score table through pandas, or one line saying why it cannot be read."""
    import pandas as pd

    if path.is_dir():
        raise InputError(f"{path}: -: is a directory, not a CSV file ({name})")
    try:
        return pd.read_csv(path, dtype={"item_id": str})
    except FileNotFoundError:
        raise InputError(f"{path}: -: no such file ({name})") from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: -: not a readable CSV ({str(e).strip().splitlines()[0]})") from None


def gate_files(base: Path, cand: Path, cfg: GateConfig) -> GateResult:
    """The gate's verdict on two score files; InputError (one line) for a table it cannot read or pair."""
    b, c = read_light(base), read_light(cand)
    paired = pair_light(b, c, cfg) if b is not None and c is not None else None
    if paired is not None:
        pb, pc, d, dropped = paired
        return gate_mod.decide_d(d, cfg, float(pb.mean()), float(pc.mean()), dropped_errors=dropped)
    tb, tc = read_scores(base, "--base"), read_scores(cand, "--cand")
    try:
        verdict, _ = gate_mod.gate(tb, tc, cfg)
    except PairingError as e:
        raise InputError(f"{base} vs {cand}: {e}") from None
    return verdict


def gate_command(base: Path, cand: Path, as_json: bool = False, **options) -> tuple[int, str]:
    """`ratchet gate`: (exit code, the line to print: stdout for 0 and 1, stderr for 3). Bad input raises
    InputError (exit 2). `options` are GateConfig's fields by name; what is not given is GateConfig's default."""
    try:
        cfg = GateConfig(**options)
        verdict = gate_files(Path(base), Path(cand), cfg)
    except InputError:
        raise
    except Exception as e:  # a crash must never read as REJECT (exit 1)
        return 3, f"internal error: {type(e).__name__}: {e}"
    if verdict.refused:  # too many errored pairs: nothing was compared
        raise InputError(f"{base} vs {cand}: {verdict.reason}")
    if as_json:
        import json

        v = verdict.as_dict()
        return (0 if verdict.accept else 1), json.dumps({k: v[k] for k in CLI_KEYS}, sort_keys=True)
    word = "ACCEPT" if verdict.accept else "REJECT"
    return (0 if verdict.accept else 1), f"{word}: {verdict.reason} ({verdict.n_items} items)"
