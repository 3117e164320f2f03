"""The gate on two score files (`ratchet gate`, `ratchet power`): one reader for score tables, numpy to pair them.

read_table   the csv module over the file's bytes, read once (a pipe, `<(...)`, is a file too): a header with
             item_id, seed and score (`error` optional; other columns ignored), every row as wide as the header.
             Ids stay the text they are (`NA`, `None`, `007` and an empty string are ids, never pandas' missing
             values); a seed is an integer written out (`3`, `-0`, `3.0`) within 64 bits, read exactly (`1e300`
             and `inf` are refused, never rounded onto another seed); a score is a decimal number (an empty cell
             or `nan` is read as missing, which pairing refuses naming the item); an `error` cell is an error
             unless empty. Anything else is refused, one line naming the file, the field and the line.
pair_light   numpy: a table that pairs completely is paired and judged without pandas (pandas costs more to
             import than numpy does). The per-item means are summed as pandas' groupby sums them (Kahan, in the
             base table's row order), so the verdict is the same to the last bit.
gate.gate    a pairing the light path would not decide (incomplete, a duplicate, a score out of range or missing,
             too many errors, too few items) goes to `gate.gate` on the tables as read, which refuses it with its
             one-line message.
"""

from __future__ import annotations

import csv
import io
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from components.errors import InputError
from components.evolution import gate as gate_mod
from components.evolution.gate import GateConfig, GateResult, PairingError

if TYPE_CHECKING:  # imported where a frame is built (`ratchet gate`'s light path reads no pandas)
    import pandas as pd

_SEED = re.compile(r"[+-]?([0-9]{1,18})(?:\.0*)?")  # an integer written out; 18 digits fit 64 bits
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]{1,3})?")
_MISSING_SCORE = frozenset({"", "nan", "NaN", "-nan", "-NaN"})  # read as a missing score (refused when pairing)
MAX_TABLE_BYTES = 1 << 30  # a score table of a billion bytes is not one a campaign wrote
CLI_KEYS = ("accept", "net", "ci_lo", "ci_hi", "n_items", "n_improved", "n_regressed", "reason")


@dataclass
class ScoreTable:
    """A score table as read: item ids as text, seeds as exact integers, scores as floats (NaN: missing)."""

    path: str
    items: list[str]
    seeds: list[int]
    scores: np.ndarray
    errors: list[str]

    @property
    def errored(self) -> np.ndarray:
        return np.array([e != "" for e in self.errors], dtype=bool)

    def frame(self) -> pd.DataFrame:
        """The table as the pandas gate takes it (ids as text: no missing-value parsing on the way)."""
        import pandas as pd

        return pd.DataFrame(
            {
                "item_id": pd.Series(self.items, dtype=object),
                "seed": pd.Series(self.seeds, dtype="int64"),
                "score": self.scores,
                "error": pd.Series(self.errors, dtype=object),
            }
        )


def _bytes(path: Path, name: str) -> bytes:
    if path.is_dir():
        raise InputError(f"{path}: -: is a directory, not a CSV file ({name})")
    try:
        with open(path, "rb") as f:  # read once: a pipe has no second reading
            data = f.read(MAX_TABLE_BYTES + 1)
    except FileNotFoundError:
        raise InputError(f"{path}: -: no such file ({name})") from None
    except OSError as e:
        raise InputError(f"{path}: -: cannot read ({e.strerror or e}) ({name})") from None
    if len(data) > MAX_TABLE_BYTES:
        raise InputError(f"{path}: -: larger than {MAX_TABLE_BYTES} bytes: not a score table ({name})")
    return data


def read_table(path: str | Path, name: str = "table") -> ScoreTable:
    """A score table read exactly, or InputError (one line naming the file, the field and the line)."""
    path = Path(path)
    rows = _csv_rows(path, _text(path, name), name)
    head = rows[0][1]
    twice = sorted({c for c in head if head.count(c) > 1})
    if twice:
        raise InputError(f"{path}: {twice[0]}: the column is named more than once ({name})")
    missing = [c for c in ("item_id", "seed", "score") if c not in head]
    if missing:
        raise InputError(f"{path}: {missing[0]}: missing column(s) {', '.join(missing)} ({name})")
    i, s, v = head.index("item_id"), head.index("seed"), head.index("score")
    ec = head.index("error") if "error" in head else None
    items, seeds, scores, errors = [], [], [], []
    for line, r in rows[1:]:
        if len(r) != len(head):
            raise InputError(
                f"{path}: -: not a readable CSV (Expected {len(head)} fields in line {line}, saw {len(r)}) ({name})"
            )
        seeds.append(_seed(path, r[s].strip(), line, name))
        scores.append(_score(path, r[v].strip(), line, name))
        items.append(r[i])
        errors.append("" if ec is None else r[ec].strip())
    return ScoreTable(str(path), items, seeds, np.array(scores, dtype=float), errors)


def _text(path: Path, name: str) -> str:
    """The file as UTF-8 text (a byte-order mark dropped), or InputError for bytes no CSV file holds."""
    data = _bytes(path, name)
    try:
        text = data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: -: not UTF-8 text (byte {e.start}) ({name})") from None
    if "\x00" in text:
        raise InputError(f"{path}: -: holds a NUL byte: not a CSV file ({name})")
    return text


def _csv_rows(path: Path, text: str, name: str) -> list[tuple[int, list[str]]]:
    """The CSV's non-blank rows with their line numbers, the header first (InputError: none, or not CSV)."""
    if csv.field_size_limit() < len(text) + 1:  # one cell may be the whole file: read it, then judge it
        csv.field_size_limit(min(sys.maxsize, max(len(text) + 1, 131072)))
    reader = csv.reader(io.StringIO(text, newline=""))
    rows: list[tuple[int, list[str]]] = []
    try:
        for r in reader:
            if r:  # blank lines skipped
                rows.append((reader.line_num, r))
    except csv.Error as e:
        raise InputError(f"{path}: -: not a readable CSV (line {reader.line_num}: {e}) ({name})") from None
    if not rows:
        raise InputError(f"{path}: -: not a readable CSV (no header) ({name})")
    return rows


def _seed(path: Path, seed: str, line: int, name: str) -> int:
    """A seed cell: an integer written out, or InputError."""
    m = _SEED.fullmatch(seed)
    if m is None:
        shown = seed if len(seed) <= 40 else seed[:37] + "..."
        raise InputError(
            f"{path}: seed: {shown!r} on line {line} is not an integer written out (at most 18 "
            f"digits; 1e3, inf and fractions are not read as seeds) ({name})"
        )
    value = int(m.group(1))
    return -value if seed.startswith("-") else value


def _score(path: Path, score: str, line: int, name: str) -> float:
    """A score cell: a finite decimal, or NaN where the score is missing; else InputError."""
    if score in _MISSING_SCORE:
        return float("nan")
    if _DECIMAL.fullmatch(score) and np.isfinite(x := float(score)):
        return x
    shown = score if len(score) <= 40 else score[:37] + "..."
    raise InputError(f"{path}: score: {shown!r} on line {line} is not a finite decimal number ({name})")


def pair_light(b: ScoreTable, c: ScoreTable, cfg: GateConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray, int] | None:
    """(base, cand, d) per item in sorted item order and the pairs dropped for errors, as `gate.pair` computes them;
    None for anything `gate.pair` would refuse (it says why)."""
    for arm in (b, c):
        if not ((arm.scores >= 0) & (arm.scores <= 1)).all():  # out of range, or missing (NaN)
            return None
    kb, kc = list(zip(b.items, b.seeds)), list(zip(c.items, c.seeds))
    at_c = {k: n for n, k in enumerate(kc)}
    if len(at_c) != len(kc) or len(set(kb)) != len(kb) or set(kb) != at_c.keys():
        return None
    ci = np.fromiter((at_c[k] for k in kb), dtype=np.intp, count=len(kb))
    errored = b.errored | c.errored[ci]
    dropped = int(errored.sum())
    if dropped / len(kb) > cfg.max_error_share or dropped == len(kb):
        return None
    keep = ~errored
    items = np.array(b.items, dtype=object)[keep]
    names, inv = np.unique(items, return_inverse=True)
    if len(names) < cfg.min_items:
        return None
    base = _group_means(inv, b.scores[keep], len(names))
    cand = _group_means(inv, c.scores[ci][keep], len(names))
    return base, cand, cand - base, dropped


def _group_means(group: np.ndarray, values: np.ndarray, n_groups: int) -> np.ndarray:
    """Per-group means as pandas' groupby mean computes them, bit for bit (`gate.pair`'s per-item means): rows
    already sorted by group go through `np.add.reduceat` (pandas 3's fast path for monotonic groups), any other
    order through a Kahan-compensated sum in row order (its Cython group_mean)."""
    if len(group) and (np.diff(group) >= 0).all():
        starts = np.flatnonzero(np.r_[True, group[1:] != group[:-1]])
        return np.add.reduceat(np.ascontiguousarray(values, dtype=np.float64), starts) / np.diff(
            starts, append=len(group)
        ).astype(np.float64)
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


def read_scores(path: Path, name: str) -> pd.DataFrame:
    """A score table as a pandas frame (`ratchet power`), read by `read_table`."""
    return read_table(path, name).frame()


def gate_files(base: Path, cand: Path, cfg: GateConfig) -> GateResult:
    """The gate's verdict on two score files; InputError (one line) for a table it cannot read or pair."""
    b, c = read_table(base, "--base"), read_table(cand, "--cand")
    paired = pair_light(b, c, cfg)
    if paired is not None:
        pb, pc, d, dropped = paired
        return gate_mod.decide_d(d, cfg, float(pb.mean()), float(pc.mean()), dropped_errors=dropped)
    try:  # what the light path does not decide: the pandas gate on the same tables, for its one-line refusal
        verdict, _ = gate_mod.gate(b.frame(), c.frame(), cfg)
    except PairingError as e:
        raise InputError(f"{base} vs {cand}: {e}") from None
    return verdict


def gate_command(base: Path, cand: Path, as_json: bool = False, **options: Any) -> tuple[int, str]:
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
