"""Model and meta-agent plug-ins: an installed package's `ratchet.models` / `ratchet.meta_agents` entry point is a
name params accept (validated against the live registries, not a list in the params model), and what runs when it is
named; a bad name is one line naming the file and field. The tau2 world contributes its `gold` model the same way."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from components.errors import InputError
from tests.conftest import PACKAGES, run_cli

PLUGIN = textwrap.dedent('''
    """ratchet-echo: a model that is the simulated agent, counting the requests it answers; and a meta-agent that
    never plans."""
    from components.evolution.meta import PlanOutcome
    from components.models.simulated import SimulatedAgent

    CALLS = []


    class Echo:
        name = "echo"

        def __init__(self, tag):
            self.tag, self.inner = tag, SimulatedAgent()

        def complete(self, messages, *, tools, seed, json_mode=False):
            CALLS.append(self.tag)
            return self.inner.complete(messages, tools=tools, seed=seed, json_mode=json_mode)


    def model(*, tag: str = "echo"):
        return Echo(tag)


    class Idle:
        spends = False

        def plan(self, ctx):
            return PlanOutcome(None)


    def planner(*, patience: int = 1):
        return Idle()


    def broken(*, x: int = 0):
        return None
''')


@pytest.fixture
def echo_installed(tmp_path, monkeypatch):
    """`pip install ratchet-echo`, as files: the module and a dist-info with its entry points on sys.path."""
    from components.evolution.meta_agents import META_AGENTS
    from components.models import MODELS

    site = tmp_path / "site"
    site.mkdir()
    (site / "ratchet_echo.py").write_text(PLUGIN)
    info = site / "ratchet_echo-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ratchet-echo\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[ratchet.models]\necho = ratchet_echo:model\n[ratchet.meta_agents]\nidle = ratchet_echo:planner\n"
    )
    for registry in (MODELS, META_AGENTS):  # the registries as they were, after the test
        monkeypatch.setattr(registry, "_strategies", dict(registry._strategies))
        monkeypatch.setattr(registry, "_declared", dict(registry._declared))
        monkeypatch.setattr(registry, "_origins", dict(registry._origins))
    monkeypatch.syspath_prepend(str(site))
    yield site
    sys.modules.pop("ratchet_echo", None)


def test_a_plugin_model_is_named_in_params_and_runs_the_episodes(echo_installed, bench_dir, tmp_path):
    from components.params import load_params
    from components.runtime.evaluate import run_shard
    from flows.api import EvalRequest, evaluate

    p = load_params(
        None,
        {
            "campaign.model": "echo",
            "campaign.model_cfg": {"tag": "campaign"},
            "campaign.meta_agent": "idle",
            "benchmark.out": str(bench_dir),
        },
    )
    assert (p.campaign.model, p.campaign.meta_agent) == ("echo", "idle")
    import ratchet_echo

    # what a campaign's evaluation task runs with its params (flows/tasks.py: run_shard(..., c.model, c.model_cfg))
    t = run_shard(
        PACKAGES / "seed",
        bench_dir,
        _items(bench_dir)[:1],
        [0],
        p.campaign.model,
        p.campaign.model_cfg,
        p.campaign.max_turns,
    )
    assert len(t.scores) == 1 and set(ratchet_echo.CALLS) == {"campaign"}
    # and through the Python API, as `ratchet eval --model echo` runs it
    r = evaluate(
        EvalRequest(
            package=PACKAGES / "seed",
            benchmark=bench_dir,
            items=tuple(_items(bench_dir)[:2]),
            seeds=1,
            out=tmp_path / "eval",
            model="echo",
        )
    )
    assert r.summary.episodes == 2 and "echo" in ratchet_echo.CALLS
    sim = evaluate(
        EvalRequest(
            package=PACKAGES / "seed",
            benchmark=bench_dir,
            items=tuple(_items(bench_dir)[:2]),
            seeds=1,
            out=tmp_path / "sim",
        )
    )
    assert (r.summary.mean_score, r.summary.model_calls) == (sim.summary.mean_score, sim.summary.model_calls)


def test_a_plugin_meta_agent_is_built_from_its_entry_point(echo_installed):
    from components.evolution.meta import make_meta_agent

    agent = make_meta_agent("idle", {"patience": 2})
    assert type(agent).__name__ == "Idle"
    with pytest.raises(InputError, match=r"^meta_agent\.patience: Input should be a valid integer"):
        make_meta_agent("idle", {"patience": "x"})


def test_names_are_checked_against_the_registries_in_one_line(echo_installed, tmp_path):
    from components.params import load_params

    bad = tmp_path / "params.yaml"
    bad.write_text("campaign:\n  model: ecko\n")
    with pytest.raises(InputError) as e:
        load_params(bad)
    assert str(e.value) == f"{bad}: campaign.model: unknown model 'ecko' (one of echo, gold, local, openai, sim)"
    bad.write_text("campaign:\n  meta_agent: planner\n")
    with pytest.raises(InputError) as e:
        load_params(bad)
    assert str(e.value) == f"{bad}: campaign.meta_agent: unknown meta_agent 'planner' (one of idle, llm, rules)"


def test_the_command_line_refuses_an_unknown_model_in_one_line(capsys, tmp_path):
    code, out, err = run_cli(
        capsys,
        "campaign",
        "run",
        "--params",
        str(PACKAGES.parent.parent / "params.yaml"),
        "--out",
        str(tmp_path / "c"),
        "--set",
        "campaign.meta_agent=ruels",
    )
    assert (code, out) == (2, "")
    assert err.splitlines() == [
        f"error: {PACKAGES.parent.parent / 'params.yaml'}: campaign.meta_agent: unknown "
        "meta_agent 'ruels' (one of llm, rules)"
    ]
    assert not (tmp_path / "c").exists()


def test_a_broken_or_clashing_plugin_is_one_line_naming_its_entry_point(echo_installed, bench_dir, tmp_path):
    from components.models import MODELS, make_model

    info = echo_installed / "ratchet_echo-0.1.dist-info" / "entry_points.txt"
    info.write_text("[ratchet.models]\nmissing = ratchet_echo:nothing_here\n")
    with pytest.raises(
        InputError,
        match=r"^ratchet\.models: missing: ratchet_echo:nothing_here failed to load: "
        r"AttributeError",
    ):
        make_model("missing")
    info.write_text("[ratchet.models]\nsim = ratchet_echo:model\n")
    with pytest.raises(
        InputError,
        match=r"^ratchet\.models: sim: ratchet_echo:model names a model already "
        "registered by a built-in",
    ):
        MODELS.names()


def test_the_tau2_world_contributes_its_gold_model_through_an_entry_point(echo_installed):
    """No import runs back up from the model backends to a world: `gold` is the tau2 world's, by entry point. Once
    loaded, its entry point is still its own on the next scan (not a second registration of the name)."""
    from importlib.metadata import entry_points

    import components.models as models

    assert "gold" in models.MODELS.names()
    assert "benchmark" in models.MODELS.get("gold").options.model_fields  # loaded and registered
    assert models.MODELS.names() == ["echo", "gold", "local", "openai", "sim"]  # a scan after it: the same
    assert [ep.value for ep in entry_points(group="ratchet.models", name="gold")] == [
        "components.worlds.taubench.gold:model"
    ]
    source = Path(models.__file__).read_text(encoding="utf-8")
    assert "taubench" not in source.split('"""', 2)[2]  # the code, below the docstring, imports no world's module


def _items(bench_dir: Path) -> list[str]:
    from components.worlds import load_benchmark

    return load_benchmark(bench_dir).ids("dev")
