"""Evidence from outcomes: a failed train episode compared with its item's gold (the writes a labelled benchmark
gives, as the field's public benchmarks do), for worlds whose receipts do not say which rule a write broke (`coded`, `silent`).

`outcome_diffs` lists what the episode's successful writes got wrong against the gold writes, matched on the write's
identifying args (the benchmark's `targets`):
    missing_write  a gold write the agent never made successfully (nor tried with a wrong argument the world refused)
    extra_write    a successful write no gold write asks for
    wrong_arg      a successful write with a wrong argument: which field, the agent's value, the gold value; also a
                   write the world refused as impossible (`blocking`) whose arguments differ from the gold write it
                   was meant for (`refused`: the refusal's message): the refusal was the agent's own doing
(no confirmation and a finish with work pending are read off the trace by `diagnose`, as before).

`value_evidence` judges, from the whole train corpus, whether the package's cards about a write help its arguments
come out right (first writes per target with such a card in memory against those without), as `card_evidence` does
for rule refusals; `outcome_finding` then decides the owner of a wrong argument from the trace: no card about the
tool (E), a card that does not help (E), a helpful card not delivered at that write or drowned among others (rho).

`TrainEvidence` carries what a labelled train corpus shows to the diagnosis of a corpus without gold (dev, or any
evaluation of unlabelled items): per write tool, whether its cards help (`value_evidence`) and how often its first
write carries a wrong argument; and how often a train failure whose trace shows no divergence at all turned out, against
its gold, to hold a wrong argument. Where that is most of them (a silent world: a broken rule's write goes through), an
unlabelled failure the trace cannot explain is read as a wrong argument on the write train most often got wrong
(`unseen_value_finding`), its owner decided from the trace as above; else it stays unexplained.

Gold reaches this module only through `components.worlds.base.train_gold`: train items only. Dev and test gold (the
rubric) is read by scoring alone.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import date
from fractions import Fraction
from numbers import Real
from typing import Any

from pydantic import BaseModel, ConfigDict

from components.codes import FindingKind, Owner
from components.evolution.findings import (
    Finding,
    WriteKey,
    WriteTarget,
    card_helps,
    card_owner,
    cards_about,
    keyed_elsewhere,
    own_bounce_rate,
    write_target,
)
from components.evolution.infer import Row, features, holds, infer_rows, rows_for
from components.memory.package import MemoryPackage
from components.runtime.confirm import Targets
from components.runtime.trace import TraceStep
from components.worlds.base import Gold
from components.worlds.outcome_rules import Cond, FieldRule, Term

WRONG_ARG = "wrong_arg"  # a diff's kind: a write with an argument its gold does not have (a finding's is wrong_value)

AMOUNT_TOL = 0.005  # amounts are cents: two values within half a cent are the same amount


@dataclass(frozen=True)
class Diff:
    kind: str  # missing_write | extra_write | wrong_arg
    tool: str
    target: WriteTarget
    step: int  # the agent's write (wrong_arg, extra_write) or the episode's last step (missing_write)
    hash: str
    field: str = ""
    agent: Any = None
    gold: Any = None
    refused: str = ""  # a wrong_arg at a write the world refused (`blocking`): the refusal's message


def same_value(a: Any, b: Any) -> bool:
    """Equal as a database would hold them: numbers to the cent, lists of ids (or of records, whatever their keys'
    order) in any order, else exactly."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return abs(float(a) - float(b)) < AMOUNT_TOL
    if isinstance(a, list) and isinstance(b, list):
        return sorted(map(_canonical, a)) == sorted(map(_canonical, b))
    equal: bool = a == b
    return equal


def _canonical(x: Any) -> str:
    """A list element as text, a record's keys in one order (a model's arguments arrive with their keys sorted)."""
    return json.dumps(x, sort_keys=True, default=str) if isinstance(x, (dict, list)) else str(x)


def successful_writes(steps: list[TraceStep], write_tools: frozenset[str]) -> list[TraceStep]:
    return [s for s in steps if s.action.get("tool") in write_tools and s.blocked is None and s.observation.get("ok")]


def outcome_diffs(
    steps: list[TraceStep], gold: Gold, write_tools: frozenset[str], targets: Targets | None = None
) -> list[Diff]:
    """The episode's writes against the gold writes, in step order (missing writes last)."""
    if not steps:
        return []
    done: dict[WriteKey, TraceStep] = {}
    for s in successful_writes(steps, write_tools):  # the last successful write per target is what the state holds
        done[(s.action["tool"], write_target(s.action["tool"], s.action.get("args", {}), targets))] = s
    wanted = {(a.tool, write_target(a.tool, a.args, targets)): a for a in gold.actions}
    out: list[Diff] = []
    for key, s in sorted(done.items(), key=lambda kv: kv[1].step):
        tool, target = key
        a = wanted.get(key)
        if a is None:
            out.append(Diff(FindingKind.EXTRA_WRITE, tool, target, s.step, s.hash))
            continue
        args = s.action.get("args", {})
        for field in sorted(a.args):
            if not same_value(args.get(field), a.args[field]):
                out.append(Diff(WRONG_ARG, tool, target, s.step, s.hash, field, args.get(field), a.args[field]))
    refused = _refused_attempts(steps, done, wanted, write_tools, targets)
    for key, s in refused.items():
        a, args = wanted[key], s.action.get("args", {})
        why = _refusal_text(s)
        out += [
            Diff(WRONG_ARG, key[0], key[1], s.step, s.hash, field, args.get(field), a.args[field], why)
            for field in sorted(a.args)
            if not same_value(args.get(field), a.args[field])
        ]
    out.sort(key=lambda d: d.step)
    last = steps[-1]
    tried = {(d.tool, d.target) for d in out if d.refused}  # never made, but tried with a wrong argument: that diff
    for key, a in wanted.items():
        if key not in done and key not in tried:
            out.append(Diff(FindingKind.MISSING_WRITE, key[0], key[1], last.step, last.hash))
    return out


def _refused_attempts(
    steps: list[TraceStep],
    done: Mapping[WriteKey, TraceStep],
    wanted: Mapping[WriteKey, Any],
    write_tools: frozenset[str],
    targets: Targets | None,
) -> dict[WriteKey, TraceStep]:
    """Per gold write never made, the first write the world refused as impossible (`blocking`) that was meant for it:
    the same tool on the same target, else the same tool when that gold write is the tool's only one left undone (a
    wrong identifying argument: the world found no such target). Its arguments against the gold's show whether the
    refusal was the agent's own doing."""
    out: dict[WriteKey, TraceStep] = {}
    for s in steps:
        tool = s.action.get("tool")
        if (
            tool not in write_tools
            or s.blocked is not None
            or s.observation.get("ok")
            or not s.observation.get("blocking")
        ):
            continue
        key: WriteKey | None = (tool, write_target(tool, s.action.get("args", {}), targets))
        if key not in wanted:
            undone = [k for k in wanted if k[0] == tool and k not in done]
            key = undone[0] if len(undone) == 1 else None
        if key is not None and key not in done and key not in out:
            out[key] = s
    return out


def _refusal_text(s: TraceStep) -> str:
    content = s.observation.get("content")
    return str(content.get("error", "")).strip() if isinstance(content, dict) else ""


def value_evidence(
    episodes: Mapping[str, list[TraceStep]],
    gold: Mapping[str, Gold],
    package: MemoryPackage,
    write_tools: frozenset[str],
    targets: Targets | None = None,
) -> dict[str, bool | None]:
    """Per write tool: do the package's cards about it help its arguments come out right? Over every first successful
    write per (episode, target) that a gold write matches, the share with every argument right when a card about the
    tool was in that turn's memory, against the share without one (as `card_evidence`). None: never delivered."""
    tally = _value_tally(episodes, gold, package, write_tools, targets)
    # as `card_evidence`: against the tool's own rate without a card, else the corpus's pooled rate, else zero
    pooled = [x for t in tally.values() for x in t[False]]
    return {tool: card_helps(t, pooled) for tool, t in tally.items()}


def _value_tally(
    episodes: Mapping[str, list[TraceStep]],
    gold: Mapping[str, Gold],
    package: MemoryPackage,
    write_tools: frozenset[str],
    targets: Targets | None,
) -> dict[str, dict[bool, list[int]]]:
    """Per write tool, first successful writes per (episode, target) that a gold write matches: 1 = every argument
    right, split by whether a card about the tool was in that turn's memory."""
    tally: dict[str, dict[bool, list[int]]] = {}
    for eid, steps in episodes.items():
        g = gold.get(eid.split("#", 1)[0])
        if g is None:
            continue
        wanted = {(a.tool, write_target(a.tool, a.args, targets)): a for a in g.actions}
        seen: set[WriteKey] = set()
        for s in successful_writes(steps, write_tools):
            tool = s.action["tool"]
            key = (tool, write_target(tool, s.action.get("args", {}), targets))
            if key in seen or key not in wanted:
                continue
            seen.add(key)
            about = set(cards_about(package, tool))
            right = all(same_value(s.action.get("args", {}).get(f), v) for f, v in wanted[key].args.items())
            tally.setdefault(tool, {True: [], False: []})[bool(set(s.delivered) & about)].append(int(right))
    return tally


class TrainEvidence(BaseModel):
    """What the labelled train corpus shows the diagnosis of an unlabelled one (see the module doc)."""

    model_config = ConfigDict(frozen=True)
    value_helps: dict[str, bool | None] = {}  # write tool -> do its cards help its arguments (`value_evidence`)
    wrong_rate: dict[str, float] = {}  # write tool -> share of its first gold-matched writes with a wrong argument
    unexplained: int = 0  # train failures whose trace shows no divergence
    unexplained_wrong: int = 0  # of those, the ones whose gold shows a wrong argument
    rules: dict[str, dict[str, FieldRule]] = {}  # write tool -> field -> the rule train's gold shows (`inferred_rules`)
    today: date | None = None  # the policy's date, for the rules' days-from-today features
    # where a check fired on its own criterion (`own_checks.against_checks`): per write tool, the fields train got wrong with no
    # rule that gives their right value (such a write's right form is unknown), and the share of distinct drafts
    # such checks bounced (how likely a draft they never judged passes them)
    unruled: dict[str, tuple[str, ...]] = {}
    own_bounce_rate: float | None = None

    @property
    def unexplained_are_values(self) -> bool:
        """Most train failures the trace cannot explain hold a wrong argument."""
        return self.unexplained > 0 and 2 * self.unexplained_wrong > self.unexplained


def train_evidence(
    episodes: Mapping[str, list[TraceStep]],
    failed: Mapping[str, str],
    gold: Mapping[str, Gold],
    package: MemoryPackage,
    write_tools: frozenset[str],
    targets: Targets | None = None,
    unexplained: frozenset[str] = frozenset(),
    today: date | None = None,
) -> TrainEvidence:
    """`episodes`: the train corpus; `failed`: failed episode id -> item id; `unexplained`: the failed episodes whose
    trace finding was `no_divergence`; `today`: the policy's date (`infer.policy_today`)."""
    tally = _value_tally(episodes, gold, package, write_tools, targets)
    pooled = [x for t in tally.values() for x in t[False]]
    rate = {
        tool: 1 - sum(t[True] + t[False]) / len(t[True] + t[False]) for tool, t in tally.items() if t[True] or t[False]
    }
    wrong = sum(
        1
        for eid in unexplained
        if failed.get(eid) in gold
        and any(
            d.kind == WRONG_ARG for d in outcome_diffs(episodes.get(eid, []), gold[failed[eid]], write_tools, targets)
        )
    )
    helps = {tool: card_helps(t, pooled) for tool, t in tally.items()}
    # the rules are read to judge a card's text against a write it was not at (`card_states`), and, where a check
    # fired on its own criterion, to make a write right before that check is run on it again (`own_checks.against_checks`)
    bounce_rate = own_bounce_rate(episodes.values(), write_tools)
    judged = (
        sorted(write_tools)
        if bounce_rate is not None
        else [tool for tool in write_tools if helps.get(tool) is not False and cards_about(package, tool)]
    )
    rules, gaps = rules_and_gaps(judged, episodes, gold, write_tools, targets, today)
    return TrainEvidence(
        value_helps=helps,
        wrong_rate=rate,
        unexplained=len([e for e in unexplained if failed.get(e) in gold]),
        unexplained_wrong=wrong,
        rules=rules,
        today=today,
        unruled=gaps if bounce_rate is not None else {},
        own_bounce_rate=bounce_rate,
    )


def unseen_value_finding(
    eid: str,
    item_id: str,
    steps: list[TraceStep],
    package: MemoryPackage,
    write_tools: frozenset[str],
    train: TrainEvidence,
    targets: Targets | None = None,
) -> Finding | None:
    """For a failure with no gold whose trace shows no divergence, in a corpus whose train failures of that kind are
    mostly wrong arguments: the episode's write that train most often got wrong (ties: the earliest), owned as a
    wrong argument there would be. None: train says otherwise, or the episode wrote nothing."""
    writes = successful_writes(steps, write_tools)
    if not train.unexplained_are_values or not writes:
        return None
    s = max(writes, key=lambda w: (train.wrong_rate.get(w.action["tool"], 0.0), -w.step))
    tool = s.action["tool"]
    cards = cards_about(package, tool)
    here = [c for c in s.delivered if c in cards]
    helps = train.value_helps.get(tool)
    states = None
    if cards and not here and helps is not False:
        needs = write_needs(s, steps, train.rules.get(tool, {}), write_tools, targets, train.today)
        states = card_states(
            [package.cards[c].body for c in cards], needs, steps, s.step, cards, keyed_elsewhere(package, cards, tool)
        )
    owner, kind, opportunity, patchability = card_owner(
        cards, here, len(s.delivered), helps, FindingKind.UNSEEN_VALUE, states
    )
    return Finding(
        eid,
        item_id,
        s.step,
        s.hash,
        owner,
        kind,
        tool,
        f"no divergence in the trace; on train, {train.unexplained_wrong} of {train.unexplained} such "
        f"failures held a wrong argument",
        opportunity,
        patchability,
        {
            "target": write_target(tool, s.action.get("args", {}), targets),
            "cards": cards,
            "delivered": list(s.delivered),
        },
    )


def outcome_finding(
    eid: str,
    item_id: str,
    diffs: list[Diff],
    steps: list[TraceStep],
    package: MemoryPackage,
    helps: Mapping[str, bool | None],
    rules: Mapping[str, Mapping[str, FieldRule]] | None = None,
    write_tools: frozenset[str] | None = None,
    targets: Targets | None = None,
    today: date | None = None,
) -> Finding | None:
    """The finding for the episode's earliest wrong argument, its owner read from the trace (see the module doc);
    a missing or extra write no trace finding explains is `unknown` (reported, never planned). None: no diff.
    `rules`: per write tool, the rules the corpus's gold shows (`inferred_rules`), for a card never in memory at
    its write (`card_states`); with `write_tools` (and `targets`, `today`), judged in the case the write is in
    (`rule_constants` on what its reads showed)."""
    wrong = [d for d in diffs if d.kind == WRONG_ARG]
    if not wrong:
        return _other_finding(eid, item_id, diffs)
    step = min(d.step for d in wrong)
    at = [d for d in wrong if d.step == step]
    d0 = at[0]
    s = next(x for x in steps if x.step == step)
    cards = cards_about(package, d0.tool)
    here = [c for c in s.delivered if c in cards]
    h = helps.get(d0.tool)
    detail, extra = _wrong_detail(at, s, cards)
    states = None
    if cards and not here and h is not False:
        feats = None if write_tools is None else write_feats(s, steps, write_tools, targets, today)
        states = card_states(
            [package.cards[c].body for c in cards],
            field_needs([d.field for d in at], (rules or {}).get(d0.tool, {}), feats),
            steps,
            step,
            cards,
            keyed_elsewhere(package, cards, d0.tool),
        )
    owner, kind, opportunity, patchability = card_owner(
        cards, here, len(s.delivered), h, FindingKind.WRONG_VALUE, states
    )
    return Finding(eid, item_id, step, s.hash, owner, kind, d0.tool, detail, opportunity, patchability, extra)


def _other_finding(eid: str, item_id: str, diffs: list[Diff]) -> Finding | None:
    """A missing or extra write (no wrong argument): `unknown`, reported and never planned; None: no diff."""
    other = next(iter(diffs), None)
    if other is None:
        return None
    return Finding(
        eid,
        item_id,
        other.step,
        other.hash,
        Owner.UNKNOWN,
        other.kind,
        other.tool,
        f"{other.kind.replace('_', ' ')} on `{other.tool}`",
        "unknown",
        "unknown",
        {"target": other.target},
    )


def _wrong_detail(at: list[Diff], s: TraceStep, cards: list[str]) -> tuple[str, dict[str, Any]]:
    """The finding's detail and extra for the wrong arguments of one write (`at`, at step `s`)."""
    d0 = at[0]
    extra = {
        "target": d0.target,
        "cards": cards,
        "delivered": list(s.delivered),
        "diffs": [{"field": d.field, "agent": d.agent, "gold": d.gold} for d in at],
    }
    detail = "; ".join(f"`{d.field}` {d.agent!r}, gold {d.gold!r}" for d in at)
    if d0.refused:  # the world refused the write for it: its own words on what was wrong
        extra["refused"] = d0.refused
        detail += f" (refused: {d0.refused})"
    return detail, extra


# -- what a card's own text covers: E or rho for a card never in memory at its write -----------------------------------
# Where the corpus never had a tool's card in memory at a write of it, no tally says whether it helps. Its text still
# says something a reader without the model's understanding can check: a rule that needs a constant (a fee's rate, a
# threshold, the allowed values of a field) is stated only by a text that carries that constant, so a card without it
# cannot have fixed that field, whatever the routing (E). A card that carries the constants of every field that went
# wrong, or whose rules need none (a value read from the task's data), is taken to state them: had routing put it at
# the write, the write would have been right (rho). The rules are those train's gold shows (`infer`), never a world's
# own reading of the card. Without any such rule, the delivery timing alone: a card the router delivered later in
# the same episode, after the write it was for, is a routing fault. A card that carries the constants but negates
# them reads as stating them: telling "must not be 'x'" from "must be 'x'" takes the model's reading of the text.

NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?")


@dataclass(frozen=True)
class Gap:
    """A threshold as train's rows show it: any number from `lo` to `hi` separates them (`Cond.seen`)."""

    lo: float
    hi: float


def rule_constants(rule: FieldRule, feats: Mapping[str, Any] | None = None) -> frozenset[object]:
    """The constants a text must carry to state `rule`: its constant values, allowed values, factors, a table's
    numbers, a sum's factors and constant, its thresholds (as the gap train's rows left, `Gap`, where the inference
    records one: a threshold placed in the gap is one reading of it, any number in it states it as well) and cap (a
    feature it reads, or a case change, needs none). With `feats` (what a write's reads showed, its own arguments as
    `@<arg>`), only what that write takes: the term its condition chooses there and the factors that apply there
    (every threshold still: it is what tells the cases apart)."""
    terms, factors = _taken(rule, feats)
    out: set[object] = {v for t in terms if t is not None for v in _term_constants(t)}
    out.update(_thresholds(rule))
    out.update(k for _c, k in factors)
    if rule.cap is not None:
        out.add(rule.cap)
    return frozenset(v for v in out if not isinstance(v, bool) and v not in (0, 1, ""))


def _taken(
    rule: FieldRule, feats: Mapping[str, Any] | None
) -> tuple[tuple[Term | None, ...], list[tuple[Cond, Fraction]]]:
    """The rule's terms and factors, or with `feats` those a write with these features takes (the term its
    condition chooses, the factors that apply; a condition or factor whose feature it lacks: all of them)."""
    terms: tuple[Term | None, ...]
    terms, factors = rule.terms(), list(rule.factors)
    if feats is not None:
        if rule.cond is not None and rule.cond.path in feats:
            terms = (rule.then,) if rule.cond.true(feats[rule.cond.path]) else (rule.other,)
        factors = [(c, k) for c, k in factors if c.path not in feats or c.true(feats[c.path])]
    return terms, factors


def _thresholds(rule: FieldRule) -> list[object]:
    """Every threshold of the rule's condition and factors, in order: the gap train's rows left where the inference
    records one (`Gap`), else the threshold itself."""
    conds = ([rule.cond] if rule.cond is not None else []) + [c for c, _k in rule.factors]
    return [Gap(float(c.seen[0]), float(c.seen[1])) if c.seen is not None else c.value for c in conds if c.op != "is"]


def _term_constants(t: Term) -> set[object]:
    """The constants a term names: its value or factor, allowed values, a table's numbers, a sum's factors and
    constant (a feature it reads, or a case change, names none)."""
    if t.kind in ("const", "share"):
        return {t.value}
    if t.kind == "one_of":
        return set(t.value)
    if t.kind == "table":
        return {n for _c, n in t.value}
    if t.kind == "sum":
        const, parts = t.value
        return {k for k, _p in parts} | ({const} if const else set())
    return set()


def mentions(text: str, constants: Iterable[object]) -> bool:
    """Whether `text` carries one of `constants`: a string (any case), a number (an int, float or exact fraction) as
    written, as a percentage (0.05: 5%) or as what a factor takes off or adds (0.95 or 1.05: 5%), or a number inside
    a threshold's `Gap`."""
    low = text.lower()
    numbers = {round(float(n), 2) for n in NUMBER.findall(text)}
    for c in constants:
        if isinstance(c, str):
            if c.strip() and c.lower() in low:
                return True
        elif isinstance(c, Gap):
            if any(c.lo <= n <= c.hi for n in numbers):
                return True
        elif isinstance(c, Real) and not isinstance(c, bool):
            x = float(c)
            if {round(abs(v), 2) for v in (x, 100 * x, 100 * (1 - x))} & numbers:
                return True
    return False


def card_states(
    texts: list[str],
    needs: Iterable[frozenset[object]],
    steps: list[TraceStep],
    step: int,
    cards: Iterable[str],
    elsewhere: bool = False,
) -> bool | None:
    """Whether the cards about a write (their `texts`) state what went wrong at it (see above). `needs`: per thing
    that went wrong there and has a known rule, the constants stating it takes (`rule_constants`,
    `statement_constants`; none for a value read from the task's data). False when one needs constants none of the
    cards carries; True when every one is carried (a rule taking none is taken as stated); with no known rule, the
    routing: True when such a card was delivered later in the episode than `step`, or when the cards are keyed where
    this write never is (`elsewhere`, `findings.keyed_elsewhere`); None when nothing tells."""
    text = "\n".join(texts)
    needs = list(needs)
    if any(need and not mentions(text, need) for need in needs):
        return False
    if needs:
        return True
    mine = set(cards)
    return True if elsewhere or any(s.step > step and mine & set(s.delivered) for s in steps) else None


def field_needs(
    wrong: Iterable[str], rules: Mapping[str, FieldRule], feats: Mapping[str, Any] | None = None
) -> list[frozenset[object]]:
    """The constants each wrong field's rule takes (a field with no rule takes none that can be checked); with
    `feats`, what the write takes there (`rule_constants`; the field's own value left out of its `@<arg>`s)."""
    return [rule_constants(rules[f], None if feats is None else without_own(feats, f)) for f in wrong if f in rules]


def write_needs(
    s: TraceStep,
    steps: list[TraceStep],
    rules: Mapping[str, FieldRule],
    write_tools: frozenset[str],
    targets: Targets | None = None,
    today: date | None = None,
) -> list[frozenset[object]]:
    """What stating the rules of write `s` (no gold of its own) takes, by the rules train's gold shows: the constants
    of the fields they say are wrong there (`predicted_wrong`), in the case that write is in. When they say none is,
    what went wrong is a field whose right value the reads do not tell: one with a set of allowed values (the card
    must carry them), or one with no rule at all (nothing to check)."""
    wrong = predicted_wrong(s, steps, rules, write_tools, targets, today) if rules else []
    if not wrong:
        return [rule_constants(r) for r in rules.values() if r.cond is None and r.then.kind == "one_of"]
    return field_needs(wrong, rules, write_feats(s, steps, write_tools, targets, today))


def write_feats(
    s: TraceStep,
    steps: list[TraceStep],
    write_tools: frozenset[str],
    targets: Targets | None = None,
    today: date | None = None,
) -> dict[str, Any]:
    """What the episode's reads showed before write `s`, with its own numeric arguments as `@<arg>`."""
    from components.worlds.outcome_rules import own

    tool, args = s.action.get("tool", ""), dict(s.action.get("args") or {})
    target = {k: str(v) for k, v in write_target(tool, args, targets)}
    return {**features(steps, s.step, args, target, write_tools, today), **own(args, "")}


def without_own(feats: Mapping[str, Any], field: str) -> Mapping[str, Any]:
    """A write's features without the field's own argument (`@<field>`): a rule may not read what it gives."""
    return {k: v for k, v in feats.items() if k != f"@{field}"}


QUOTED = re.compile(r"(?<!\w)'([^']+?)'(?!\w)|\"([^\"]+)\"")  # an apostrophe inside a word opens no quote


def statement_constants(text: str) -> frozenset[object]:
    """The constants a rule's statement (an explained refusal's receipt) carries: its quoted values and numbers."""
    quoted = {a or b for a, b in QUOTED.findall(text)}
    return frozenset(quoted | {float(n) for n in NUMBER.findall(text)} - {0.0, 1.0})


def inferred_rules(
    tools: Iterable[str],
    episodes: Mapping[str, list[TraceStep]],
    gold: Mapping[str, Gold],
    write_tools: frozenset[str],
    targets: Targets | None = None,
    today: date | None = None,
) -> dict[str, dict[str, FieldRule]]:
    """`rules_and_gaps`'s rules."""
    return rules_and_gaps(tools, episodes, gold, write_tools, targets, today)[0]


def rules_and_gaps(
    tools: Iterable[str],
    episodes: Mapping[str, list[TraceStep]],
    gold: Mapping[str, Gold],
    write_tools: frozenset[str],
    targets: Targets | None = None,
    today: date | None = None,
) -> tuple[dict[str, dict[str, FieldRule]], dict[str, tuple[str, ...]]]:
    """Per tool, the rule of each field some episode got wrong, as `infer` finds it on this corpus's gold; a field
    with no rule that passed its check, whose gold values recur across the items (`recurring`: constants a rule
    states, not values read from each task's data), as the set of those values (`one_of`: what stating its rule
    takes at least); any other field is left out of the rules, and listed per tool as a gap
    (a field some write got wrong whose right value no rule gives)."""

    out: dict[str, dict[str, FieldRule]] = {}
    gaps: dict[str, tuple[str, ...]] = {}
    for tool in sorted(set(tools)):
        got, wrong = _tool_rules(tool, rows_for(tool, episodes, gold, write_tools, targets, today), targets)
        if got:
            out[tool] = got
        if missing := tuple(f for f in sorted(wrong) if f not in got):
            gaps[tool] = missing
    return out, gaps


def _tool_rules(tool: str, rows: list[Row], targets: Targets | None) -> tuple[dict[str, FieldRule], set[str]]:
    """(the rules of the tool's fields: `infer`'s, else a recurring field's values as `one_of`; the fields some write
    got wrong that `infer` found no rule for)."""
    got = {i.field: i.rule for i in infer_rows(tool, rows, targets) if i.rule}
    ident = {k for r in rows for k, _v in write_target(tool, r.gold, targets)}
    wrong = {
        f
        for r in rows
        if r.agent is not None
        for f in r.gold
        if f not in ident and f not in got and not same_value(r.agent.get(f), r.gold[f])
    }
    for f in sorted(wrong):
        values = recurring(
            {
                (r.item, write_target(tool, r.gold, targets)): r.gold[f]
                for r in rows
                if r.agent is not None and f in r.gold
            }
        )
        if values:
            got[f] = FieldRule(f, Term("one_of", values))
    return got, wrong


def recurring(by_item: Mapping[tuple[str, WriteTarget], Any]) -> tuple[Any, ...]:
    """The values of a field over its items' writes (one per item and target), when they recur: scalars, at most half
    as many distinct ones as writes (a value read from each task's data, an amount or an id, seldom does), over at
    least `MIN_RECUR` writes; () otherwise."""
    values = list(by_item.values())
    if len(values) < MIN_RECUR or any(isinstance(v, bool) or not isinstance(v, (str, Real)) for v in values):
        return ()
    distinct = sorted(set(values), key=str)
    return tuple(distinct) if 2 * len(distinct) <= len(values) else ()


MIN_RECUR = 4


def predicted_wrong(
    s: TraceStep,
    steps: list[TraceStep],
    rules: Mapping[str, FieldRule],
    write_tools: frozenset[str],
    targets: Targets | None = None,
    today: date | None = None,
) -> list[str]:
    """The fields of write `s` (no gold of its own) that the rules train's gold shows say are wrong, from what the
    episode's reads showed before it; a field whose rule cannot be evaluated there is not listed (`field_verdicts`)."""
    return [f for f, ok in field_verdicts(s, steps, rules, write_tools, targets, today).items() if ok is False]


def field_verdicts(
    s: TraceStep,
    steps: list[TraceStep],
    rules: Mapping[str, FieldRule],
    write_tools: frozenset[str],
    targets: Targets | None = None,
    today: date | None = None,
) -> dict[str, bool | None]:
    """Per field of write `s` that has a rule: whether the rule holds on the write's value there (None: it cannot be
    evaluated there). A field whose rule names its value outright (a constant, or a value a read showed) is judged
    first, and the others are judged with it set right: a rule that reads the write's own argument (a bonus when
    the refund goes to a gift card) is judged on the argument the write should have had, not on the wrong one it got."""
    from components.worlds.outcome_rules import term_value

    tool, args = s.action["tool"], dict(s.action.get("args") or {})
    target = {k: str(v) for k, v in write_target(tool, args, targets)}

    def judged(write: dict[str, Any]) -> dict[str, bool | None]:
        feats = features(steps, s.step, write, target, write_tools, today)
        return {
            f: holds(rule, Row("", s.episode_id, feats, {**write, f: args[f]}, args))
            for f, rule in rules.items()
            if f in args
        }

    first = judged(args)
    fixed = dict(args)
    feats = features(steps, s.step, args, target, write_tools, today)
    for f, rule in rules.items():
        plain = rule.cond is None and not rule.factors and rule.cap is None and rule.then.kind in ("const", "equal")
        if first.get(f) is False and plain:
            ok, v = term_value(rule.then, feats, rule.quantum)
            if ok:
                fixed[f] = v
    verdict = judged(fixed) if fixed != args else first
    return {f: first[f] if verdict[f] is None else verdict[f] for f in sorted(verdict)}
