"""`ratchet gate`'s light path (flows/entry.py, components/evolution/gate_files.py): one reader for score tables
(ids as text, seeds as exact integers, what it cannot read exactly refused); its pairing decides exactly what the
pandas path decides, to the last bit, leaves every refusal to the pandas gate, and the options are parsed as the
typer command declares them."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from components.evolution import gate_files
from components.evolution.gate import GateConfig, gate, pair
from flows.entry import GATE_OPTIONS, parse_gate

ROOT = Path(__file__).resolve().parents[1]


def random_table(rng: np.random.Generator, n_items: int, seeds: int, kind: str) -> pd.DataFrame:
    rows = []
    for i in range(n_items):
        name = f"it{int(rng.integers(0, 10**6)):06d}-{i}"
        for s in range(seeds):
            if kind == "rubric":
                score = int(rng.integers(0, 7)) / 6
            elif kind == "continuous":
                score = float(rng.random())
            else:  # sevenths and thirteenths: sums whose rounding depends on the order they are added in
                score = int(rng.integers(0, 14)) / 13 if rng.random() < 0.5 else int(rng.integers(0, 8)) / 7
            rows.append({"item_id": name, "seed": s, "score": score})
    return pd.DataFrame(rows)


def shuffled_cand(rng: np.random.Generator, base: pd.DataFrame) -> pd.DataFrame:
    step = rng.integers(-2, 3, len(base)) / 6
    cand = base.assign(score=np.clip(base["score"] + step, 0.0, 1.0))
    return cand.sample(frac=1.0, random_state=int(rng.integers(0, 2**31))).reset_index(drop=True)


@pytest.mark.parametrize("case", range(24))
def test_light_pairing_is_pandas_pairing_bit_for_bit(tmp_path, case):
    rng = np.random.default_rng(case)
    kind = ("rubric", "continuous", "mixed")[case % 3]
    base = random_table(rng, int(rng.integers(5, 60)), int(rng.integers(1, 13)), kind)
    if case % 4 < 2:  # base rows in any order (pandas then sums with Kahan), else sorted (pandas: np.add.reduceat)
        base = base.sample(frac=1.0, random_state=case).reset_index(drop=True)
    else:
        base = base.sort_values(["item_id", "seed"]).reset_index(drop=True)
    cand = shuffled_cand(rng, base)
    if case % 2:  # some errored pairs, in either arm (an empty cell is no error)
        base["error"] = np.where(rng.random(len(base)) < 0.03, "timeout", "")
        cand["error"] = np.where(rng.random(len(cand)) < 0.03, "boom", "")
    b, c = tmp_path / "b.csv", tmp_path / "c.csv"
    base.to_csv(b, index=False)
    cand.to_csv(c, index=False)
    cfg = GateConfig(n_boot=2000, seed=case)
    lb, lc = gate_files.read_table(b), gate_files.read_table(c)
    light = gate_files.pair_light(lb, lc, cfg)
    rb, rc = pd.read_csv(b, dtype={"item_id": str}), pd.read_csv(c, dtype={"item_id": str})
    per, dropped = pair(rb, rc, cfg.max_error_share, cfg.min_items)
    assert light is not None
    pb, pc, d, ldropped = light
    assert ldropped == dropped
    # the same bits, not merely close: the CI and the verdict then cannot differ
    assert pb.tobytes() == per["base"].to_numpy(float).tobytes()
    assert pc.tobytes() == per["cand"].to_numpy(float).tobytes()
    assert d.tobytes() == per["d"].to_numpy(float).tobytes()
    expected, _ = gate(rb, rc, cfg)
    assert gate_files.gate_files(b, c, cfg) == expected


@pytest.mark.parametrize("order", ["rows in any order", "rows sorted by group"])
def test_group_means_are_pandas_groupby_means_to_the_bit(order):
    # sums whose rounding depends on how they are added: pandas sums unsorted rows with Kahan compensation and
    # sorted rows with np.add.reduceat, which groups the terms its own way
    rng = np.random.default_rng(7)
    group = rng.integers(0, 40, 2000)
    if order == "rows sorted by group":
        group = np.sort(group)
    vals = rng.integers(0, 14, 2000) / 13 * rng.choice([1.0, 1e-9, 1e9], 2000)
    got = gate_files._group_means(np.unique(group, return_inverse=True)[1], vals, len(np.unique(group)))
    want = pd.DataFrame({"g": group, "v": vals}).groupby("g")["v"].mean().to_numpy()
    assert got.tobytes() == want.tobytes()
    naive = np.array([sum(vals[group == g].tolist()) / (group == g).sum() for g in np.unique(group)])
    assert naive.tobytes() != want.tobytes()  # the order of the additions shows: this test can fail


@pytest.mark.parametrize(
    "text,items,seeds",
    [
        ('item_id,seed,score\n"a,b",0,0.5\n', ["a,b"], [0]),  # quoted, as the csv module reads it
        ("item_id,seed,score\nNA,0,0.5\n,1,0.5\nNone,2,0.5\nnan,3,0.5\n", ["NA", "", "None", "nan"], [0, 1, 2, 3]),
        ("item_id,seed,score\na,1.0,0.5\nb,-0,0.5\nc,+7,0.5\n", ["a", "b", "c"], [1, 0, 7]),  # integers written out
        ("\ufeffitem_id,seed,score\na,0,0.5\n", ["a"], [0]),  # a byte-order mark
        ("item_id,seed,score\na,0, 0.5\n", ["a"], [0]),  # a space before a number
        ("item_id,seed,score\n007,999999999999999999,0.5\n", ["007"], [999999999999999999]),  # exact, not a float
    ],
)
def test_the_reader_keeps_ids_as_text_and_seeds_exact(tmp_path, text, items, seeds):
    p = tmp_path / "t.csv"
    p.write_text(text, encoding="utf-8")
    got = gate_files.read_table(p)
    assert got.items == items and got.seeds == seeds and all(type(s) is int for s in got.seeds)
    frame = got.frame()
    assert list(frame["item_id"]) == items and frame["item_id"].map(type).eq(str).all()


@pytest.mark.parametrize(
    "text,field",
    [
        ("item_id,seed,score\na,1e300,0.5\n", "seed: '1e300' on line 2"),  # a float: 1e300 and 2e300 were one seed
        ("item_id,seed,score\na,inf,0.5\n", "seed: 'inf' on line 2"),  # was exit 3
        ("item_id,seed,score\na,1.5,0.5\n", "seed: '1.5'"),
        ("item_id,seed,score\na,,0.5\n", "seed: '' on line 2"),
        ("item_id,seed,score\na,1234567890123456789,0.5\n", "seed: '1234567890123456789'"),  # beyond 64 bits
        ("item_id,seed,score\na,0,1_0\n", "score: '1_0'"),  # float() would take it
        ("item_id,seed,score\na,0,0.5,1\n", "-: not a readable CSV (Expected 3 fields in line 2, saw 4)"),
        ("item_id,seed\na,0\n", "score: missing column(s) score"),
        ("item_id,seed,score,score\na,0,0.5,0.5\n", "score: the column is named more than once"),
        ("", "-: not a readable CSV (no header)"),
        ("item_id,seed,score\na,0,0.5\x00\n", "-: holds a NUL byte"),
    ],
)
def test_the_reader_refuses_what_it_cannot_read_exactly(tmp_path, text, field):
    p = tmp_path / "t.csv"
    p.write_text(text, encoding="utf-8")
    with pytest.raises(gate_files.InputError) as e:
        gate_files.read_table(p, "--cand")
    assert str(e.value).startswith(f"{p}: {field}"), str(e.value)
    assert len(str(e.value).splitlines()) == 1


def test_a_huge_cell_is_read_then_judged_not_a_csv_error(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("item_id,seed,score\n" + "x" * 200_000 + ",0,0.5\n" + "b,0," + "1" * 200_000 + "\n")
    with pytest.raises(gate_files.InputError, match="score: '1111"):
        gate_files.read_table(p)


def test_reader_reads_a_table_and_its_error_column_as_text(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("x,item_id,seed,score,error\n1,007,3,0.5,\n\n2,b,-0,1,None\n3,c,2,1e-1,oops\n", encoding="utf-8")
    got = gate_files.read_table(p)
    assert got.items == ["007", "b", "c"] and got.seeds == [3, 0, 2] and got.scores.tolist() == [0.5, 1.0, 0.1]
    assert got.errored.tolist() == [False, True, True]  # an error cell is an error unless empty ("None" is text)


@pytest.mark.parametrize(
    "mutate,why",
    [
        (lambda b, c: (b, c.iloc[:-1]), "incomplete"),
        (lambda b, c: (b, pd.concat([c, c.iloc[:1]])), "duplicate"),
        (lambda b, c: (b, c.assign(score=c["score"].where(c.index != 0, 1.5))), "range"),
        (lambda b, c: (b.iloc[: 4 * 3], c.iloc[: 4 * 3]), "too few items"),
        (lambda b, c: (b.assign(error="x"), c), "every pair errored"),
    ],
)
def test_what_pandas_would_refuse_is_left_to_it(tmp_path, mutate, why):
    base = random_table(np.random.default_rng(5), 10, 3, "rubric").sort_values(["item_id", "seed"])
    cand = base.copy()
    b, c = mutate(base, cand)
    pb, pcand = tmp_path / "b.csv", tmp_path / "c.csv"
    b.to_csv(pb, index=False)
    c.to_csv(pcand, index=False)
    lb, lc = gate_files.read_table(pb), gate_files.read_table(pcand)
    assert gate_files.pair_light(lb, lc, GateConfig()) is None, why


# -- the options: the light parser against the typer command -------------------------------------------------


def test_light_options_are_the_typer_commands_with_gateconfigs_defaults():
    from flows.cli import gate_cmd

    params = inspect.signature(gate_cmd).parameters
    assert set(params) == set(GATE_OPTIONS.values()) | {"as_json"}
    config = {f.name: f.default for f in fields(GateConfig)}
    for name in GATE_OPTIONS.values():
        if name in ("base", "cand"):
            assert params[name].default is inspect.Parameter.empty
        else:  # one home for the defaults: the typer command shows GateConfig's
            assert params[name].default == config[name] and type(params[name].default) is type(config[name])
    assert "--" + "n_boot".replace("_", "-") in GATE_OPTIONS


@pytest.mark.parametrize(
    "args,want",
    [
        (["--base", "b", "--cand", "c"], {"base": "b", "cand": "c"}),
        (
            ["--cand=c", "--base=b", "--json", "--n-boot", "2000", "--material", "0.1", "--seed", "-1"],
            {"base": "b", "cand": "c", "as_json": True, "n_boot": 2000, "material": 0.1, "seed": -1},
        ),
        (["--base", "b", "--cand", "c", "--alpha", "nan"], "nan"),
        (["--base", "b"], None),  # --cand missing: typer says so
        (["--base", "b", "--cand", "c", "--help"], None),
        (["--base", "b", "--cand", "c", "--seed", "1", "--seed", "2"], None),  # repeated
        (["--base", "b", "--cand", "c", "--n-boot", "1e4"], None),  # not an int to click either
        (["--base", "b", "--cand", "c", "--bogus"], None),
        (["--base", "b", "--cand", "c", "--seed"], None),  # a value missing
        (["--base", "--json", "--cand", "c"], None),
        (["--base", "", "--cand", "c"], None),
        (["--base", "b", "--cand", "c", "extra"], None),
    ],
)
def test_parse_gate_takes_only_what_it_reads_as_typer_would(args, want):
    got = parse_gate(args)
    if want == "nan":
        assert got is not None and np.isnan(got["alpha"])
    else:
        assert got == want


@pytest.fixture(scope="module")
def pair_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("light")
    rng = np.random.default_rng(3)
    base = random_table(rng, 30, 3, "rubric")
    win = base.assign(score=np.clip(base["score"] + 0.25, 0, 1))
    files = {"base": d / "base.csv", "win": d / "win.csv", "bad": d / "bad.csv", "dir": d}
    base.to_csv(files["base"], index=False)
    win.to_csv(files["win"], index=False)
    base.iloc[:-1].to_csv(files["bad"], index=False)
    return files


@pytest.mark.parametrize(
    "args",
    [
        ["--base", "{base}", "--cand", "{win}", "--json", "--n-boot", "2000"],
        ["--base", "{win}", "--cand", "{base}"],
        ["--base", "{base}", "--cand", "{base}", "--material=0.2", "--reg-cap", "0"],
        ["--base", "{base}", "--cand", "{win}", "--reg-share", "0", "--reg-cap=1"],
        ["--base", "{base}", "--cand", "{bad}"],  # incomplete pairing: the pandas path's message
        ["--base", "{base}", "--cand", "{dir}/none.csv"],  # a missing file
        ["--base", "{base}", "--cand", "{win}", "--n-boot", "5"],  # GateConfig refuses
        ["--base", "{base}", "--cand", "{win}", "--alpha", "inf"],
    ],
)
def test_light_path_prints_and_exits_as_the_typer_command(pair_files, capsys, args):
    from flows.cli import app
    from flows.entry import gate_light

    argv = [a.format(**pair_files) for a in args]
    code = gate_light(argv)
    light = capsys.readouterr()
    assert code is not None  # taken by the light path
    r = CliRunner().invoke(app, ["gate", *argv])
    assert (code, light.out, light.err) == (r.exit_code, r.stdout, r.stderr)
    assert code in (0, 1, 2) and (light.out.strip() or light.err.startswith("error: "))


def test_console_script_runs_the_light_path():
    """The installed `ratchet` script's entry point is flows.entry:main (pyproject.toml)."""
    import tomllib

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["ratchet"] == "flows.entry:main"


def test_gate_help_and_other_commands_go_to_typer(capsys):
    from tests.conftest import run_cli

    code, out, _ = run_cli(capsys, "gate", "--help")
    assert code == 0 and "--n-boot" in out and "10000" in out  # typer's help, with GateConfig's default
    code, out, err = run_cli(capsys, "gate", "--base", "x.csv")
    assert code == 2 and "--cand" in err and len(err.strip().splitlines()) == 1


def test_bench_startup_quick():
    p = subprocess.run(
        [sys.executable, "benchmarks/bench_startup.py", "--quick", "--repeat", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr
    lines = p.stdout.strip().splitlines()
    assert "the same on both paths" in lines[0]
    verdict = json.loads(lines[0].split("verdict: ", 1)[1].rsplit(" (exit", 1)[0])
    assert verdict["n_items"] == 60
    import re

    row = re.compile(r"(bytecode|no bytecode) +(numpy|gate|typer) +[0-9.]+s +[0-9.]+s +[0-9.]+x +[0-9.]+x")
    rows = [row.fullmatch(ln) for ln in lines[2:-1]]
    assert all(rows) and {(m[1], m[2]) for m in rows} == {
        (c, k) for c in ("bytecode", "no bytecode") for k in ("numpy", "gate", "typer")
    }, p.stdout
    assert lines[-1].startswith("ratchet gate / import numpy (bytecode): wall ")
