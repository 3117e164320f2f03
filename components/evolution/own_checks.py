"""A check that fires on its own criterion: would the write made right have passed it?

A package's checker may bounce a write for a reason of its own (a fraud heuristic, a house limit), not for an agent's
fault it names by a code (`CheckCode`: no confirmation, work pending). Whether such an episode failed for the agent's
fault or for the check's is a question of what the check does to the write made right, so the package's own
pre-write checkers are run again on it, a draft of that write alone (no conversation, an empty ledger: what a check of
the agent's discipline reads is the agent's to fix, and its bounces carry a code). Bounced there too, no switch of the
agent's would have saved the episode (owner none); passed there, a bounced draft with a wrong argument failed for
that argument (E, or rho as the cards tell). A write is made right by its gold where the item has one, by the write a
successful episode of the same item made, else by the rules train's gold shows (`right_forms`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import date
from fractions import Fraction
from itertools import combinations, product
from math import prod
from typing import Any

from components.codes import FindingKind, Owner
from components.evolution.findings import Finding, WriteKey, card_owner, cards_about, keyed_elsewhere, write_target
from components.evolution.outcomes import (
    card_states,
    field_needs,
    field_verdicts,
    predicted_wrong,
    same_value,
    without_own,
    write_feats,
)
from components.memory.events import PRE_WRITE
from components.memory.ledger import Ledger
from components.memory.package import MemoryPackage
from components.memory.strategies import CheckContext
from components.runtime.confirm import Targets
from components.runtime.trace import TraceStep
from components.runtime.types import Draft, ToolCall
from components.worlds.base import Gold
from components.worlds.outcome_rules import FieldRule, Records, evaluate


def own_bounces(
    package: MemoryPackage,
    tool: str,
    args: Mapping[str, Any],
    write_tools: frozenset[str],
    targets: Targets | None = None,
) -> list[str]:
    """The package's pre-write checkers that bounce a draft of `tool(args)` on their own criterion (no code)."""
    checks = [b for b in package.checkers if b.spec.at == PRE_WRITE]
    if not checks:
        return []
    ctx = CheckContext(
        PRE_WRITE,
        Draft(tool_call=ToolCall(id="made-right", name=tool, args=dict(args))),
        Ledger(package.wm),
        [],
        write_tools,
        {t: list(a) for t, a in (targets or {}).items()},
    )
    return [b.label for b in checks if not (v := b.run(ctx)).ok and v.code is None]


def right_forms(
    s: TraceStep,
    steps: list[TraceStep],
    rules: Mapping[str, FieldRule],
    write_tools: frozenset[str],
    targets: Targets | None = None,
    today: date | None = None,
) -> list[dict[str, Any]] | None:
    """Write `s` made right: each field the rules train's gold shows say is wrong there (`field_verdicts`) set to
    what its rule gives, in the form of the agent's own argument (a float stays a float: a check may read the very
    bytes). A rule that names a set of values (allowed values, records to pick from) gives each of them: the forms
    are every combination, at most `MAX_FORMS`. None where the right form is unknown: a rule that cannot be judged
    there, or too many forms. `rules` must hold every field train got wrong on this tool: a field it got wrong with
    no rule found leaves the right form unknown (the caller passes None then: `TrainEvidence.unruled`)."""
    args = dict(s.action.get("args") or {})
    verdicts = field_verdicts(s, steps, rules, write_tools, targets, today) if rules else {}
    if None in verdicts.values():
        return None
    # a set of allowed values does not say which of them is right: a field it rules takes each of them
    wrong = [f for f, ok in verdicts.items() if ok is False or _allowed(rules[f])]
    feats = write_feats(s, steps, write_tools, targets, today) if wrong else {}
    choices = [_choices(rules[f], without_own(feats, f), args.get(f)) for f in wrong]
    if any(c is None for c in choices) or prod(len(c) for c in choices if c) > MAX_FORMS:
        return None
    forms = [{**args, **dict(zip(wrong, values))} for values in product(*[c or [] for c in choices])]
    return [_settled(form, s, steps, {f: rules[f] for f in wrong}, write_tools, targets, today) for form in forms]


def _settled(
    form: dict[str, Any],
    s: TraceStep,
    steps: list[TraceStep],
    rules: Mapping[str, FieldRule],
    write_tools: frozenset[str],
    targets: Targets | None,
    today: date | None,
) -> dict[str, Any]:
    """`form` with each field its rule computes computed again on the form itself, until none changes: a rule may read
    the write's other arguments (a bonus when the refund goes to a gift card), and it reads them made right, not as
    the agent drafted them. A field chosen from a set (allowed values, picks) keeps its choice."""
    given = dict(s.action.get("args") or {})
    for _ in range(len(rules) + 1):  # each round settles at least one more field of a chain of reads
        made = s.model_copy(update={"action": {**s.action, "args": form}})
        feats = write_feats(made, steps, write_tools, targets, today)
        new = dict(form)
        for f, rule in rules.items():
            if _allowed(rule) or rule.then.kind == "pick":
                continue
            ok, v = evaluate(rule, without_own(feats, f), given.get(f))
            if ok:
                new[f] = _as_given(v, given.get(f))
        if new == form:
            break
        form = new
    return form


MAX_FORMS = 16  # beyond that many candidate right forms, a write's right form counts as unknown


def _allowed(rule: FieldRule) -> bool:
    return rule.then.kind == "one_of" and rule.cond is None and not rule.factors and rule.cap is None and not rule.each


def _choices(rule: FieldRule, feats: Mapping[str, Any], given: Any) -> list[Any] | None:
    """The values a field's rule allows on a write: the one it gives, or the set it names (allowed values; as many of
    a list's picks as the agent's list holds); None where it cannot tell."""
    if _allowed(rule):
        return list(rule.then.value)
    ok, v = evaluate(rule, feats, given)
    if ok:
        return [_as_given(v, given)]
    t = rule.then
    if rule.cond is not None or rule.factors or rule.cap is not None or rule.each:
        return None
    records = feats.get(str(t.path))
    if t.kind == "pick" and isinstance(records, Records) and isinstance(given, list) and given:
        key, where = t.value
        ids = [e.get(key) for e in records if all(same_value(e.get(a), w) for a, w in where)]
        return [list(c) for c in combinations(ids, len(given))] or None
    return None


def _as_given(v: Any, given: Any) -> Any:
    if not isinstance(v, Fraction):
        return v
    return float(v) if isinstance(given, float) or v.denominator != 1 else int(v)


def gold_write(s: TraceStep, gold: Gold, targets: Targets | None = None) -> dict[str, Any] | None:
    """The gold write for write `s`'s target (None: the gold makes no such write)."""
    tool = s.action["tool"]
    mine = write_target(tool, s.action.get("args", {}), targets)
    return next(
        (dict(a.args) for a in gold.actions if a.tool == tool and write_target(tool, a.args, targets) == mine), None
    )


@dataclass(frozen=True)
class MadeRight:
    """How an episode's writes are made right. `right(s)`: write `s`'s right forms (each as likely), None where
    unknown. `wrong_chance(s)`: where the right form is unknown, the chance that draft `s` was wrong (None: unknown
    forms are not judged). `pass_rate`: the chance a check lets a draft it never judged through. `needed`: the
    episode's right writes themselves (its gold), judged exactly. `solved`: (tool, target) -> the write a successful
    episode of the same item made (right, as its success says): that target's right form, drafted or not."""

    right: Callable[[TraceStep], list[dict[str, Any]] | None]
    wrong_chance: Callable[[TraceStep], float] | None = None
    pass_rate: float = 1.0
    needed: list[tuple[str, dict[str, Any]]] | None = None
    solved: Mapping[WriteKey, dict[str, Any]] = field(default_factory=dict)

    def forms(self, key: WriteKey, drafts: list[TraceStep]) -> list[dict[str, Any]] | None:
        """A drafted target's right forms: the item's success's write, else its first draft's known forms."""
        return [self.solved[key]] if key in self.solved else next((r for d in drafts if (r := self.right(d))), None)


Bounced = tuple[str, dict[str, Any]]  # a write made right that the checks bounce: (tool, its arguments)


def save_chance(
    steps: list[TraceStep],
    package: MemoryPackage,
    write_tools: frozenset[str],
    made: MadeRight,
    targets: Targets | None = None,
) -> tuple[float, Bounced | None]:
    """The chance that the episode's writes, made right, all pass the package's own checks (what fixing the agent
    could at best have saved), and a write made right they bounce (None when none is known to). With `made.needed`,
    exactly. Else each write target the episode drafted counts once: made right, it passes as often as its forms
    do; with its right form unknown, it is right with chance 1 - `wrong_chance(draft)` (and passes again where a
    draft of it passed: a check judges the same write the same way) or wrong and passes made right with chance
    `pass_rate`; a write of the item's success the episode never drafted is judged as made; one the agent proposed
    and never drafted passes with chance `pass_rate`."""
    if made.needed is not None:
        return _bounced(made.needed, package, write_tools, targets)
    drafts: dict[WriteKey, list[TraceStep]] = {}
    for s in steps:
        if (tool := s.action.get("tool")) in write_tools:
            drafts.setdefault((tool, write_target(tool, s.action.get("args", {}), targets)), []).append(s)
    chance = 1.0
    for key, ds in drafts.items():
        passes, bounced = _target_chance(key[0], ds, made.forms(key, ds), made, package, write_tools, targets)
        if bounced is not None:
            return 0.0, bounced
        chance *= passes
    _, bounced = _bounced([(k[0], a) for k, a in made.solved.items() if k not in drafts], package, write_tools, targets)
    if bounced is not None:
        return 0.0, bounced
    if made.wrong_chance is not None:
        proposed = {
            (p["tool"], write_target(p["tool"], p.get("args") or {}, targets))
            for s in steps
            for p in s.proposal.get("pending", [])
            if p.get("tool") in write_tools
        }
        chance *= made.pass_rate ** len(proposed - set(drafts) - set(made.solved))
    return chance, None


def _bounced(
    writes: list[tuple[str, dict[str, Any]]],
    package: MemoryPackage,
    write_tools: frozenset[str],
    targets: Targets | None,
) -> tuple[float, Bounced | None]:
    """(0, the first of `writes` the checks bounce), or (1, None) when they pass every one."""
    hit = next(((t, a) for t, a in writes if own_bounces(package, t, a, write_tools, targets)), None)
    return (0.0, hit) if hit else (1.0, None)


def _target_chance(
    tool: str,
    drafts: list[TraceStep],
    forms: list[dict[str, Any]] | None,
    made: MadeRight,
    package: MemoryPackage,
    write_tools: frozenset[str],
    targets: Targets | None,
) -> tuple[float, Bounced | None]:
    """One drafted target's chance of passing made right (`save_chance`), and a form bounced when every one is."""
    if forms is not None:
        bounced = [a for a in forms if own_bounces(package, tool, a, write_tools, targets)]
        if len(bounced) == len(forms):
            return 0.0, (tool, bounced[0])
        return 1 - len(bounced) / len(forms), None
    if made.wrong_chance is None:
        return 1.0, None
    p = made.wrong_chance(drafts[-1])
    return (1 - p) * any(d.blocked is None for d in drafts) + p * made.pass_rate, None


def against_checks(
    f: Finding,
    steps: list[TraceStep],
    package: MemoryPackage,
    write_tools: frozenset[str],
    made: MadeRight,
    helps: Mapping[str, bool | None],
    rules: Mapping[str, Mapping[str, FieldRule]],
    targets: Targets | None = None,
    today: date | None = None,
) -> Finding:
    """The episode's finding judged against its package's own checks (see above), by the chance that fixing the
    agent saves it (`save_chance`). An agent's fault (E, W, rho, C) where that chance is below one half, or where a
    write made right is bounced -> none, `checker_false_alarm`; a false alarm found at a bounced draft where it is
    above one half -> the draft's wrong argument (`_wrong_argument`); else `f` as it is."""
    if (
        not any(b.spec.at == PRE_WRITE for b in package.checkers)
        or f.owner == Owner.UNKNOWN
        or (f.owner == Owner.NONE and f.kind != FindingKind.CHECKER_FALSE_ALARM)
    ):
        return f
    chance, bounced = save_chance(steps, package, write_tools, made, targets)
    if f.kind == FindingKind.CHECKER_FALSE_ALARM:
        return (
            _wrong_argument(f, steps, package, write_tools, made, chance, helps, rules, targets, today)
            if chance > 0.5
            else f
        )
    if chance >= 0.5:
        return f
    detail = (
        f"made right, `{bounced[0]}` is still bounced by "
        + ", ".join(own_bounces(package, *bounced, write_tools, targets))
        if bounced
        else f"made right, the episode's writes pass the checks with chance {chance:.0%}"
    )
    return Finding(
        f.episode_id,
        f.item_id,
        f.step,
        f.hash,
        Owner.NONE,
        FindingKind.CHECKER_FALSE_ALARM,
        "*",
        detail,
        "absent",
        "external",
        {"replaces": f"{f.owner}:{f.kind}"},
    )


def _wrong_argument(
    f: Finding,
    steps: list[TraceStep],
    package: MemoryPackage,
    write_tools: frozenset[str],
    made: MadeRight,
    chance: float,
    helps: Mapping[str, bool | None],
    rules: Mapping[str, Mapping[str, FieldRule]],
    targets: Targets | None,
    today: date | None,
) -> Finding:
    """The bounced draft at `f` as a wrong argument, owned as any is (E, or rho as its cards tell): its fields that
    differ from its one right form, or those train's rules say are wrong where that form is unknown."""
    s = next(x for x in steps if x.step == f.step)
    tool, args = s.action["tool"], dict(s.action.get("args") or {})
    forms = made.forms((tool, write_target(tool, args, targets)), [s])
    fixed = forms[0] if forms and len(forms) == 1 else None
    wrong = (
        sorted(k for k in fixed if not same_value(args.get(k), fixed[k]))
        if fixed is not None
        else predicted_wrong(s, steps, rules.get(tool, {}), write_tools, targets, today)
    )
    detail = (
        "; ".join(f"`{k}` {args.get(k)!r}, right {fixed[k]!r}" for k in wrong)
        if fixed is not None
        else "its right form unknown"
    )
    cards = cards_about(package, tool)
    here = [c for c in s.delivered if c in cards]
    states = None
    if cards and not here and helps.get(tool) is not False:
        states = card_states(
            [package.cards[c].body for c in cards],
            field_needs(wrong, rules.get(tool, {}), write_feats(s, steps, write_tools, targets, today)),
            steps,
            s.step,
            cards,
            keyed_elsewhere(package, cards, tool),
        )
    owner, kind, opportunity, patchability = card_owner(
        cards, here, len(s.delivered), helps.get(tool), FindingKind.WRONG_VALUE, states
    )
    return Finding(
        f.episode_id,
        f.item_id,
        s.step,
        s.hash,
        owner,
        kind,
        tool,
        detail + f" (bounced; made right, the episode's writes pass the checks with chance {chance:.0%})",
        opportunity,
        patchability,
        {
            "target": write_target(tool, args, targets),
            "cards": cards,
            "delivered": list(s.delivered),
            "diffs": [{"field": k, "agent": args.get(k), "gold": None if fixed is None else fixed[k]} for k in wrong],
        },
    )
