"""A world plugs in through the `ratchet.worlds` entry point: a tiny third world, installed from a temporary package
(a module and its `.dist-info` on sys.path, the way pip lays out an install), is found by name, materialized, played
by the simulated agent through its own competence, and evolved for one round by the unchanged campaign."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from tests.conftest import PACKAGES, small_params

# The whole plug-in: one write tool, one rule that the written policy states, a competence, a rubric scorer.
LAMP = '''
"""A tiny world: lamps in rooms, one write (`set_lamp`) and one rule about its level."""
import random
import re
from dataclasses import dataclass
from pathlib import Path

from components.runtime.types import Receipt
from components.worlds.base import Criterion, Score, Task, WorldSpec, write_benchmark
from components.worlds.competence import Request

RULE = "`set_lamp` takes a `level` that must be exactly 3; any other level is refused."
TOOLS = [{"type": "function", "function": {
    "name": "set_lamp", "description": "Set the lamp of a room to a level.",
    "parameters": {"type": "object", "required": ["room", "level"],
                   "properties": {"room": {"type": "string"}, "level": {"type": "integer"}}}}}]


@dataclass(frozen=True)
class Fact:
    id: str
    tool: str

    def read(self, text):
        m = re.search(r"`set_lamp`[^\\n]*?exactly (\\d+)", text)
        return int(m.group(1)) if m else None

    @property
    def value(self):
        return self.read(RULE)


LEVEL = Fact("lamp_level", "set_lamp")


class Competence:
    facts = (LEVEL,)
    writes = frozenset({"set_lamp"})

    def parse(self, text):
        return [Request("set", "set_lamp", {"room": r}) for r in re.findall(r"set the lamp in (room\\d+)", text)], {}

    def opening(self, view, plan_only=False):
        return None

    def prepare(self, view, request):
        return None

    def write(self, view, request, beliefs):
        follows, value = beliefs.get(LEVEL.id, (False, None))
        return "", ("set_lamp", {"room": request.target["room"], "level": value if follows and value else 5})

    def give_up(self, request):
        return f"Sorry, I could not set the lamp in {request.target['room']}."

    def summary(self, request):
        return f"set the lamp in {request.target['room']}"

    def confirm_question(self, request):
        return f"Shall I {self.summary(request)}? (yes/no)"

    def is_yes(self, reply):
        return reply == "yes"


class Env:
    write_tools = frozenset({"set_lamp"})
    terminal_tools = frozenset()

    def __init__(self, bench, task):
        self.task, self.tools = task, bench.tools
        self.system_prompt = "You control the lamps of a house. Follow the policy.\\n\\n" + bench.policy
        self.levels = dict(bench.db["levels"])
        self.room = task.requests[0]["room"]

    def first_message(self):
        return self.task.first_message

    def call(self, call):
        r = dict(call_id=call.id, tool=call.name, args=dict(call.args), genuine=True, write=call.name == "set_lamp")
        if call.name != "set_lamp" or call.args.get("room") not in self.levels:
            return Receipt(**r, ok=False, code="invalid_args", content={"error": "no such tool or room"})
        if call.args.get("level") != 3:
            rule = {"rule_id": LEVEL.id, "rule": RULE}
            return Receipt(**r, ok=False, code="policy", content={"error": f"level refused. Policy: {RULE}", **rule},
                           **rule)
        self.levels[call.args["room"]] = 3
        return Receipt(**r, ok=True, content={"room": call.args["room"], "level": 3})

    def user_reply(self, text):
        return "yes" if text == f"Shall I set the lamp in {self.room}? (yes/no)" else "OK."

    def confirm(self, tool, args, summary):
        return tool == "set_lamp" and args.get("room") == self.room

    def score(self, transcript):
        got = {c.id: float(self.levels[c.args["room"]] == c.args["level"]) for c in self.task.rubric}
        return Score(reward=min(got.values()), success=all(v == 1.0 for v in got.values()), criteria=got)


def materialize(out, seed=0, per_family=None, fractions=(1 / 3, 1 / 3)):
    n = per_family or 30
    rooms = [f"room{i}" for i in range(n)]
    tasks = [Task(id=f"lamp-{i:03d}", family="lamp", user_id="house", first_message=f"Hi. Please set the lamp in {r}.",
                  requests=[{"kind": "set", "room": r}],
                  rubric=[Criterion(id="level", weight=1.0, check="level_is", args={"room": r, "level": 3})])
             for i, r in enumerate(rooms)]
    ids = [t.id for t in tasks]
    random.Random(seed).shuffle(ids)
    a, b = round(n * fractions[0]), round(n * (fractions[0] + fractions[1]))
    splits = {"train": sorted(ids[:a]), "dev": sorted(ids[a:b]), "test": sorted(ids[b:])}
    meta = {"world": "lamp", "version": 1, "seed": seed, "n_tasks": n, "write_tools": ["set_lamp"],
            "targets": {"set_lamp": ["room"]}}
    policy = "# Lamp policy\\n\\n- " + RULE + "\\n"
    db = {"levels": {r: 0 for r in rooms}}
    return write_benchmark(out, meta, policy, TOOLS, db, tasks, splits)


def spec():
    return WorldSpec("lamp", materialize, Env, Competence(), {"seed": Path(__file__).parent / "packages" / "seed"})
'''


@pytest.fixture
def lamp_installed(tmp_path, monkeypatch):
    """`pip install ratchet-lamp`, as files: the module, a seed package, and the dist-info with the entry point.
    The world registry and the simulated agent's world cache are restored afterwards."""
    import components.worlds as worlds
    from components.models import simulated

    site = tmp_path / "site"
    mod = site / "ratchet_lamp"
    (mod / "packages" / "seed").mkdir(parents=True)
    (mod / "__init__.py").write_text(textwrap.dedent(LAMP))
    (mod / "packages" / "seed" / "manifest.yaml").write_text((PACKAGES / "seed" / "manifest.yaml").read_text())
    info = site / "ratchet_lamp-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ratchet-lamp\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[ratchet.worlds]\nlamp = ratchet_lamp:spec\n")
    monkeypatch.setattr(worlds.WORLDS, "_strategies", dict(worlds.WORLDS._strategies))
    monkeypatch.setattr(worlds, "_specs", dict(worlds._specs))
    monkeypatch.setattr(worlds, "_from_entry_points", dict(worlds._from_entry_points))
    monkeypatch.syspath_prepend(str(site))
    yield site
    simulated.resolve.cache_clear()


def test_an_installed_world_is_found_materialized_and_evolved(lamp_installed, prefect_server, tmp_path, monkeypatch):
    from components.evolution.lineage import Lineage
    from components.worlds import load_benchmark, names, world
    from flows.campaign import run_campaign

    assert "lamp" in names() and "retail" in names()
    spec = world("lamp")
    p = small_params(
        Path("unused"),
        tmp_path / "camp",
        **{
            "benchmark.world": "lamp",
            "benchmark.out": str(tmp_path / "bench"),
            "benchmark.per_family": 18,
            "campaign.name": "lamp",
            "campaign.rounds": 1,
            "campaign.start": str(spec.packages["seed"]),
            # one seed, the smallest n_boot: every dev item goes from a refused write to a success, so the promotion
            # does not depend on more seeds or resamples (this world is its own; nothing here comes from the shared cache)
            "campaign.seeds": 1,
            "gate.n_boot": 1000,
            "campaign.traces_per_round": 0,
        },
    )  # no claim here reads MLflow traces
    p.benchmark.materialize()  # what `ratchet bench materialize` does, through the registry
    b = load_benchmark(p.benchmark.out)
    assert b.world == "lamp" and b.targets == {"set_lamp": ["room"]} and len(b.ids("dev")) == 6

    s = run_campaign(p)
    assert s["rounds"] == 1 and s["episodes"]["total"] > 0 and s["episodes"]["errors"] == 0
    (rec,) = s["history"]
    # the agent slips on the one rule of this world (it did not know it): the loop must see that and act on it
    assert rec["verdict"] == "accept", rec.get("reason")
    assert rec["owner"] == "E" and rec["gate"]["ci_lo"] > 0
    champion = Lineage(Path(p.campaign.out) / "lineage").champion()
    assert champion.name == s["champion"] != "M0"
    cards = [f.read_text() for f in (champion.path / "em").rglob("*.md")]
    fact = spec.competence.facts[0]  # the card it learned states the rule the way the agent reads it
    assert any(fact.read(c) == fact.value for c in cards), cards


def test_a_broken_or_clashing_world_is_one_clear_error(lamp_installed, monkeypatch):
    import components.worlds as worlds
    from components.worlds import BenchmarkError, world

    with pytest.raises(BenchmarkError, match="unknown world 'nowhere'.*lamp"):
        world("nowhere")
    (lamp_installed / "ratchet_lamp-0.1.dist-info" / "entry_points.txt").write_text(
        "[ratchet.worlds]\nretail = ratchet_lamp:spec\n"
    )
    monkeypatch.setattr(
        worlds.WORLDS, "_strategies", {k: v for k, v in worlds.WORLDS._strategies.items() if k == "retail"}
    )
    monkeypatch.setattr(worlds, "_from_entry_points", {})
    with pytest.raises(BenchmarkError, match="retail: entry point ratchet_lamp:spec names a world already registered"):
        worlds.discover()
    (lamp_installed / "ratchet_lamp-0.1.dist-info" / "entry_points.txt").write_text(
        "[ratchet.worlds]\nbroken = ratchet_lamp:nothing\n"
    )
    with pytest.raises(BenchmarkError, match="broken: entry point ratchet_lamp:nothing failed: AttributeError"):
        world("broken")


def test_the_simulated_agent_finds_its_world_from_the_request(lamp_installed):
    from components.errors import InputError
    from components.models import ModelError, make_model
    from components.models.simulated import offered_tools, resolve
    from components.worlds import world

    lamp, retail = world("lamp").competence, world("retail").competence
    assert resolve(offered_tools([{"function": {"name": "set_lamp"}}, {"function": {"name": "finish"}}]), "") is lamp
    first = "Hi. Please set the lamp in room4."  # no tools offered (a state proposal over HTTP): by the customer
    assert resolve(frozenset(), first) is lamp
    assert resolve(frozenset(retail.writes) | {"find_user_id_by_email"}, first) is retail
    with pytest.raises(ModelError, match="no registered world offers these tools"):
        resolve(frozenset({"launch_rocket"}), first)
    assert make_model("sim", {"world": "lamp"}).competence is lamp  # or pinned to one world
    with pytest.raises(InputError, match="unknown world 'nowhere'"):
        make_model("sim", {"world": "nowhere"})


# -- generic code names no world ---------------------------------------------------------------------------------

GENERIC = [
    "components/evolution",
    "components/runtime",
    "components/models/simulated.py",
    "components/models/counterfactual.py",
]


def _generic_files() -> list[str]:
    from tests.conftest import ROOT

    out = []
    for entry in GENERIC:
        path = ROOT / entry
        out += sorted(p.relative_to(ROOT).as_posix() for p in (path.rglob("*.py") if path.is_dir() else [path]))
    return out


@pytest.fixture(scope="module")
def world_words(tmp_path_factory) -> dict[str, set[str]]:
    """Every built-in world's tool names and write-target field names, read from what the world materializes."""
    from components import worlds
    from components.worlds import WORLDS, load_benchmark, world

    words: dict[str, set[str]] = {}
    for name in WORLDS.names():  # the built-ins (the lamp fixture unregisters its entry point afterwards)
        if name in worlds._from_entry_points:  # a plug-in found earlier in this process (tau2's: tests/test_tau2.py)
            continue
        b = load_benchmark(world(name).materialize(tmp_path_factory.mktemp(name) / "bench", 0, 3))
        words[name] = set(b.tool_names) | {arg for args in b.targets.values() for arg in args}
    return words


@pytest.mark.parametrize("rel", _generic_files())
def test_generic_code_names_no_world(rel, world_words):
    import re

    from tests.conftest import ROOT

    text = (ROOT / rel).read_text(encoding="utf-8")
    hits = sorted(
        {
            f"{w} ({world})"
            for world, ws in world_words.items()
            for w in ws
            if re.search(rf"(?<!\w){re.escape(w)}(?!\w)", text)
        }
    )
    assert not hits, f"{rel} names world-specific tools or fields: {', '.join(hits)}"


def test_a_benchmark_without_targets_or_its_task_table_is_refused_by_name(tmp_path):
    from components.worlds import BenchmarkError, load_benchmark, world

    root = world("retail").materialize(tmp_path / "bench", 0, 3)
    meta = json.loads((root / "meta.json").read_text())
    assert load_benchmark(root).targets == meta["targets"] and set(meta["targets"]) == set(meta["write_tools"])
    for change, error in (
        (lambda m: m.pop("targets"), "meta.json: targets: missing"),
        (lambda m: m["targets"].pop(m["write_tools"][0]), "targets: must name exactly the write tools"),
        (lambda m: m["targets"].update({m["write_tools"][0]: "order"}), "targets: must map each"),
    ):
        broken = json.loads(json.dumps(meta))
        change(broken)
        (root / "meta.json").write_text(json.dumps(broken))
        with pytest.raises(BenchmarkError, match=error):
            load_benchmark(root)
    (root / "meta.json").write_text(json.dumps(meta))
    (root / "tasks.csv").unlink()
    with pytest.raises(BenchmarkError, match="tasks.csv: missing"):
        load_benchmark(root)


def test_a_world_declares_its_receipt_modes_and_a_bad_declaration_is_one_line(lamp_installed, monkeypatch, tmp_path):
    """`WorldSpec.receipts`: the modes a world's benchmarks can have. The lamp world declares none (explained only):
    `benchmark.receipts: silent` is refused in one line naming the modes. A declaration that is not ReceiptModes, or
    that names more than explained with a `materialize` unable to write them, is refused when the world is loaded."""
    import dataclasses
    import re

    import components.worlds as worlds
    from components.params import BenchmarkParams
    from components.worlds import BenchmarkError, ReceiptMode, world

    assert world("lamp").receipts == (ReceiptMode.explained,) and world("retail").receipts == tuple(ReceiptMode)
    with pytest.raises(
        BenchmarkError,
        match=r"^benchmark.receipts: 'silent': the lamp world's receipts are explained "
        r"only \(set benchmark.receipts: explained\)$",
    ):
        BenchmarkParams(world="lamp", receipts="silent", out=str(tmp_path / "b")).materialize()
    lamp = world("lamp")
    for receipts, says in (
        (("silent",), "must be a non-empty tuple of ReceiptMode"),
        ((), "must be a non-empty tuple of ReceiptMode"),
        ((ReceiptMode.silent,), "declares silent, but its materialize takes no `receipts`"),
    ):
        monkeypatch.setattr(worlds, "_specs", {})
        monkeypatch.setitem(
            worlds.WORLDS._strategies,
            "lamp",
            dataclasses.replace(
                worlds.WORLDS._strategies["lamp"], factory=lambda r=receipts: dataclasses.replace(lamp, receipts=r)
            ),
        )
        with pytest.raises(BenchmarkError, match=f"^world 'lamp': receipts: {re.escape(says)}"):
            world("lamp")
