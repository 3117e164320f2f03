"""The embedded simulated agent: a deterministic stand-in for a frozen model that makes memory matter offline.

It reads only its messages (system prompt, the harness's memory message, the conversation, tool results) and the
request's seed; the same inputs give the same output. It fails the ways the seeds describe, each at a rate that
memory changes:

  E  family knowledge (a fact of the world's competence): followed at a low base rate when only the long policy states
     it, at a high rate when a card stating it is in this turn's memory. A wrong card is followed too. A fact the
     agent `learned` (a "fine-tune" on exported successes, `components.outer.learn`) is followed at the card's rate
     without a card; a card in memory still takes precedence (context over weights).
  rho  attention: every card in memory that addresses none of the facts on the current write scales that rate by
     1/(1+lambda*n).
  W  drift: a pending request is forgotten with a hazard that grows with the conversation's length, much lower while
     the ledger board lists it as pending; a board entry shown DONE is believed (even when wrongly settled).
  C  discipline: writes without asking for confirmation (the harness's `confirm` tool), and declares done after a
     write while work remains, at base rates; a bounced draft is corrected with high probability.

Every random choice is a hash of (seed, what the choice is about), not of the turn number, so two packages run with
the same seed face the same coin flips wherever their conversations agree: paired evaluation with common random
numbers. It also answers the `llm` meta-agent's planning prompt (see `plan_reply`).

This module is the generic fault engine: it decides WHEN the agent slips. WHAT a careful agent does in a world (how
it reads the customer, opens the session, which reads a request needs, the write's arguments given its beliefs, what it
says) is the world's `Competence` (`components.worlds.competence`), registered with the world; `resolve` finds it from
the request when the agent was not built for one world. Cards and policy are read with the world's facts
(`Fact.read`): the agent follows the value a text instructs; text a fact does not address is ignored.

Fault switches (`off`), one per owner, for the counterfactual ground truth (`components.models.counterfactual`):
  E off    knows every fact correctly, whatever its memory says;
  rho off  every card of the package (`cards`) that concerns the action is in front of it, undiluted;
  W off    no drift; its tracking of pending work is perfect (history, not a possibly wrong board);
  C off    never writes without confirmation, never declares done early.
With `probe`, each call also computes what the agent would have done with each remaining switch off, and records
the first call at which each owner's fault changed its output (`onsets`): a fault that never fires cannot be the
cause, and the earliest one is the cause when several fixes work.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
import json
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from components.codes import CheckCode, Owner
from components.memory.strategies import bounce_codes
from components.models.base import ChatResult, ModelError, count_tokens
from components.runtime import prompts
from components.runtime.confirm import Act, covered
from components.runtime.types import CONFIRM_TOOL, FINISH_TOOL, ToolCall, Usage
from components.worlds.competence import Beliefs, Competence, Fact, Request, Step, View
from components.worlds.outcome_rules import FieldRule, Formula, apply_formulas, policy_today, read_features

NAME = "ratchet-sim"


@dataclass(frozen=True)
class Rates:
    p_base: float = 0.2  # follows a fact stated only in the policy
    p_card: float = 0.97  # follows a fact stated by a card in this turn's memory
    attention: float = 0.35  # lambda: dilution per irrelevant card in memory
    p_recover: float = 0.3  # fixes a policy error by reading the receipt
    p_skip_confirm: float = 0.3  # writes without asking for confirmation
    p_early_done: float = 0.3  # declares done right after a write while work remains
    p_fix: float = 0.95  # corrects a bounced draft
    drift: float = 0.08  # forgetting hazard per turn beyond `drift_after`, for work not on the board
    drift_after: int = 2
    drift_max: float = 0.3
    board_factor: float = 0.02  # hazard multiplier while the board lists the work as pending


RATES = Rates()
OWNERS = (
    Owner.RHO,
    Owner.E,
    Owner.W,
    Owner.C,
)  # the fault switches; also the precedence among faults that fire at the same call


@lru_cache(maxsize=1 << 16)  # pure; drift checks and probe twins ask the same questions many times per episode
def coin(seed: int, *about: object) -> float:
    h = hashlib.blake2b(repr((seed, *about)).encode(), digest_size=8).digest()
    return int.from_bytes(h, "big") / 2**64


# -- reading the messages -----------------------------------------------------------------------------------
# Every call re-reads the whole conversation, so the same strings are parsed again and again within an episode (and
# by the probe's twins and the counterfactual replays). The parsers below are pure functions of one string, memoized;
# what they return is only read, never mutated (the agent builds its outputs from fresh dicts).


@lru_cache(maxsize=1 << 14)
def _json(text: str) -> object:
    return json.loads(text)


@lru_cache(maxsize=1 << 12)
def _parse_first(comp: Competence, first_message: str) -> tuple[list[Request], dict]:
    return comp.parse(first_message)


def parse_first(comp: Competence, first_message: str) -> tuple[list[Request], dict]:
    """`comp.parse` of the customer's first message (memoized when the competence is hashable)."""
    try:
        return _parse_first(comp, first_message)  # type: ignore[arg-type]  # unhashable: the TypeError below
    except TypeError:  # an unhashable plug-in competence
        return comp.parse(first_message)


@lru_cache(maxsize=1 << 16)
def _fact_read(fact: Fact, text: str) -> object:
    return fact.read(text)


@lru_cache(maxsize=1 << 10)
def _fact_value(fact: Fact) -> object:
    return fact.value


def fact_value(fact: Fact) -> object:
    """`fact.value` (the truth: what its own statement instructs), memoized when the fact is hashable."""
    try:
        return _fact_value(fact)  # type: ignore[arg-type]  # unhashable: the TypeError below
    except TypeError:
        return fact.value


def fact_read(fact: Fact, text: str) -> object:
    """`fact.read(text)`: a pure function of the text (see `Fact.read`), memoized when the fact is hashable."""
    try:
        return _fact_read(fact, text)  # type: ignore[arg-type]  # unhashable: the TypeError below
    except TypeError:  # an unhashable plug-in fact
        return fact.read(text)


BOARD_RE = re.compile(r"^- \[(PENDING|DONE|BLOCKED)\] (e\d+) (\w+)((?: \w+=\S+)*)", re.M)
CARD_SPLIT = re.compile(r"^### card ", re.M)


def read(messages: list[dict], comp: Competence) -> View:
    if not messages or messages[0].get("role") != "system":
        raise ModelError("expected the system message first")
    # one system message: the policy, this turn's memory, and the call's own instruction (`prompts.system_message`)
    policy, memory, tail = prompts.split_system(messages[0]["content"] or "")
    mode, feedback = "draft", None
    if tail.startswith(prompts.PROPOSE.split("\n")[0]):
        mode = "propose"
    elif tail.startswith(prompts.FEEDBACK.split("\n")[0]):
        feedback = tail
    cards = [c for c in CARD_SPLIT.split(memory)[1:]]
    board = None
    if "## Working memory (ledger)" in memory:
        board = [
            (tool, dict(a.split("=", 1) for a in args.split()), status)
            for status, _eid, tool, args in BOARD_RE.findall(memory)
        ]
    calls, user_texts, assistant_texts, turn = _conversation(messages[1:])
    reqs, info = parse_first(comp, user_texts[0] if user_texts else "")
    return View(policy, memory, cards, board, reqs, info, calls, user_texts, assistant_texts, turn, feedback, mode)


def _conversation(rest: list[dict]) -> tuple[list[tuple[dict, dict]], list[str], list[str], int]:
    """The conversation after the system message: each executed call with its result, what the user and the
    assistant said, and the assistant's turns so far."""
    calls: list[tuple[dict, dict]] = []
    pending_calls: dict[str | None, dict[str, Any]] = {}  # by the call's id (a tool message may name none)
    user_texts, assistant_texts = [], []
    turn = 0
    for m in rest:
        role = m.get("role")
        if role == "user":
            user_texts.append(m.get("content") or "")
        elif role == "assistant":
            turn += 1
            for tc in m.get("tool_calls") or []:
                pending_calls[tc["id"]] = {"name": tc["function"]["name"], "args": _call_args(tc["function"])}
            if not m.get("tool_calls"):
                assistant_texts.append(m.get("content") or "")
        elif role == "tool":
            call = pending_calls.pop(m.get("tool_call_id"), None)
            if call is not None:
                calls.append((call, _tool_result(m)))
    return calls, user_texts, assistant_texts, turn


def _call_args(fn: dict) -> object:
    """A call's arguments as the model wrote them (any JSON value; {} when they are not JSON)."""
    try:
        return _json(fn["arguments"] or "{}")
    except json.JSONDecodeError:
        return {}


def _tool_result(m: dict) -> dict:
    """A tool message's result as an object (not JSON: an error; JSON but not an object: its value)."""
    try:
        result = _json(m.get("content") or "{}")
    except json.JSONDecodeError:
        result = {"error": m.get("content")}
    return result if isinstance(result, dict) else {"value": result}


def refusal_rule(result: dict) -> str:
    """The rule a refusal receipt quotes (its `rule` field; see `Receipt`); empty when it names none."""
    return str(result.get("rule") or "")


# -- which world it plays -----------------------------------------------------------------------------------------


def _enums(schema: object) -> list[str]:
    """Every string in an `enum` of a JSON schema (a state proposal's schema lists the offered tools)."""
    if isinstance(schema, dict):
        out = [v for v in schema.get("enum", []) if isinstance(v, str)]
        return out + [x for v in schema.values() for x in _enums(v)]
    if isinstance(schema, list):
        return [x for v in schema for x in _enums(v)]
    return []


def offered_tools(tools: list[dict] | None, json_mode: object = False) -> frozenset[str]:
    names = {t["function"]["name"] for t in tools or [] if isinstance(t, dict) and isinstance(t.get("function"), dict)}
    return frozenset(names or _enums(json_mode))


@lru_cache(maxsize=256)
def resolve(offered: frozenset[str], first_message: str) -> Competence:
    """The competence of the registered world this conversation belongs to, from what a model sees: the world whose
    request-settling writes are all offered, else (no tools in the request) whose customer it understands."""
    from components.worlds import names, world

    comps = [world(name).competence for name in names()]
    fit = [c for c in comps if c.writes <= offered] if offered else comps
    if len(fit) > 1:
        fit = [c for c in fit if c.parse(first_message)[0]] or fit
    if not fit:
        raise ModelError(f"no registered world offers these tools ({', '.join(sorted(offered)) or 'none'})")
    return fit[0]


def _first_user(messages: list[dict]) -> str:
    return next((m.get("content") or "" for m in messages if m.get("role") == "user"), "")


# -- the agent --------------------------------------------------------------------------------------------------


class SimulatedAgent:
    """`complete()` with OpenAI chat semantics. Stateless: everything comes from the messages and the seed.

    `competence`: the world it plays; None = the registered world the request belongs to (`resolve`)."""

    name = NAME

    def __init__(
        self,
        rates: Rates = RATES,
        off: frozenset[str] = frozenset(),
        cards: tuple[str, ...] = (),
        probe: bool = False,
        metered: bool = True,
        competence: Competence | None = None,
        learned: frozenset[str] = frozenset(),
        truth: Mapping[str, object] | None = None,
    ):
        self.rates = rates
        # the rules' true values where a benchmark's differ from its world's own (a variant): what E off knows; only
        # the counterfactual replay, which scores, passes them (`WorldSpec.truth`)
        self.truth = dict(truth or {})
        self.off = frozenset(off)
        self.learned = frozenset(learned)  # fact ids a fine-tune taught it (`components.outer.learn`): its weights
        self.cards = tuple(cards)  # the package's cards as rendered, for rho off (perfect routing of what exists)
        self.probe = probe
        self.metered = metered  # token counts; a counterfactual replay needs none
        self.competence = competence
        self.onsets: dict[str, int] = {}  # owner -> index of the first call its fault changed (with probe)
        self.n_calls = 0

    def _twin(self, off: frozenset[str], v: View, seed: int, comp: Competence) -> tuple:
        return SimulatedAgent(
            self.rates, off, self.cards, competence=comp, learned=self.learned, truth=self.truth
        )._respond(v, seed, comp)

    def _probe(self, v: View, seed: int, mine: tuple, comp: Competence) -> None:
        """Record the first call at which each owner's fault (not yet switched off) changes the output."""
        for owner in OWNERS:
            if owner in self.off or owner in self.onsets or (v.mode == "propose" and owner != Owner.W):
                continue  # proposing the state applies no fact and no discipline: only W can change it
            if self._twin(self.off | {owner}, v, seed, comp) != mine:
                self.onsets[owner] = self.n_calls

    def _respond(self, v: View, seed: int, comp: Competence) -> tuple:
        if v.mode == "propose":
            return json.dumps(self._propose(v, seed, comp), sort_keys=True), None
        return self._draft(v, seed, comp)

    def complete(
        self, messages: list[dict], *, tools: list[dict] | None, seed: int, json_mode: bool | dict = False
    ) -> ChatResult:
        if (
            messages
            and messages[0].get("role") == "system"
            and (messages[0].get("content") or "").startswith(prompts.PLAN_MARK)
        ):
            content = plan_reply(messages)
            return ChatResult(content=content, usage=count_tokens(messages, tools, content))
        comp = self.competence or resolve(offered_tools(tools, json_mode), _first_user(messages))
        v = read(messages, comp)
        content, call = self._respond(v, seed, comp)
        if self.probe:
            self._probe(v, seed, (content, call), comp)
        self.n_calls += 1
        if v.mode == "propose":
            return ChatResult(content=content, usage=self._meter(messages, tools, content))
        calls = [] if call is None else [ToolCall(id=f"call_{v.turn + 1:03d}", name=call[0], args=call[1])]
        out = content + (json.dumps({"name": call[0], "args": call[1]}, sort_keys=True) if call else "")
        return ChatResult(content=content, tool_calls=calls, usage=self._meter(messages, tools, out))

    def _meter(self, messages: list[dict], tools: list[dict] | None, out: str) -> Usage:
        return count_tokens(messages, tools, out) if self.metered else Usage(calls=1)

    # -- beliefs about the work ------------------------------------------------------------------------------------
    def _history_status(self, v: View, r: Request, comp: Competence) -> str:
        status = "todo"
        for call, result in v.results(r.tool):
            if not r.targets(call["args"]):
                continue
            if "error" not in result:
                return "done"
            status = "blocked" if result.get("blocking") else "error"
        if any(comp.give_up(r) in t for t in v.assistant_texts):
            return "given_up"
        return status

    @staticmethod
    def _on_board(v: View, r: Request) -> str | None:
        """The status the ledger board shows for the request (its latest line), None when it does not list it."""
        if v.board is None:
            return None
        shown = [status for tool, args, status in v.board if tool == r.tool and r.targets(args)]
        return shown[-1] if shown else None

    def _hazard(self, t: int) -> float:
        return min(self.rates.drift_max, self.rates.drift * max(0, t - self.rates.drift_after))

    def pending(self, v: View, seed: int, comp: Competence) -> list[Request]:
        """The requests the agent believes are still to do, in the customer's order."""
        out = []
        for r in v.requests:
            hist = self._history_status(v, r, comp)
            if Owner.W in self.off:  # perfect tracking: what the history shows, no drift
                if hist not in ("done", "blocked", "given_up"):
                    out.append(r)
                continue
            on_board = self._on_board(v, r)
            if on_board in ("DONE", "BLOCKED"):
                continue  # the ledger says settled: believed, right or wrong
            if on_board is None and hist in ("done", "blocked", "given_up"):
                continue
            if hist == "given_up":
                continue
            if on_board == "PENDING":
                if coin(seed, "drift-board", r.key, v.turn) < self._hazard(v.turn) * self.rates.board_factor:
                    continue
            elif any(coin(seed, "drift", r.key, t) < self._hazard(t) for t in range(1, v.turn + 1)):
                continue  # forgotten somewhere along a long conversation
            out.append(r)
        return out

    # -- knowledge ---------------------------------------------------------------------------------------------
    def follows(self, v: View, fact: Fact, r: Request, seed: int, on_tool: list[Fact]) -> tuple[bool, object]:
        """Whether the agent applies `fact` to request `r` now, and the value it believes the rule has.
        `on_tool`: every fact on the request's write; a card addressing none of them is irrelevant (dilutes)."""
        u = coin(seed, "fact", fact.id, r.key)
        if Owner.E in self.off:
            return True, self._true(fact)
        if Owner.RHO in self.off:  # every card of the package about this action, and nothing else
            stated = [val for text in self.cards if (val := fact_read(fact, text)) is not None]
            if stated:
                return u < self.rates.p_card, stated[0]
        stated = [val for text in v.cards if (val := fact_read(fact, text)) is not None]
        if stated and Owner.RHO not in self.off:
            irrelevant = sum(1 for text in v.cards if all(fact_read(f, text) is None for f in on_tool))
            return u < self.rates.p_card / (1 + self.rates.attention * irrelevant), stated[0]
        if fact.id in self.learned:  # known from training: as reliable as an undiluted card (the same coin), no card
            return u < self.rates.p_card, self._true(fact)
        in_policy = fact_read(fact, v.policy)
        return (in_policy is not None and u < self.rates.p_base), in_policy

    def _true(self, fact: Fact) -> object:
        return self.truth[fact.id] if fact.id in self.truth else fact_value(fact)

    def beliefs(self, v: View, r: Request, seed: int, comp: Competence, attempts: list) -> Beliefs:
        """(follows, value) for every fact on the request's write. Retrying after a refusal, the agent learns only
        what the receipt says (a coded one: that a rule was broken, see below; a silent world refuses nothing). After
        an explained refusal it re-reads the rules every refusal of this request quoted so far: the facts they address take the latest value and are
        followed, the others keep theirs; a last refusal that addresses none of them (not a rule of this write) is
        retried plainly, following none."""
        on_tool = [f for f in comp.facts if f.tool == r.tool]
        out = {f.id: self.follows(v, f, r, seed, on_tool) for f in on_tool}
        if attempts and "error" in attempts[-1][1]:
            last = refusal_rule(attempts[-1][1])
            if not last and attempts[-1][1].get("rule_id"):
                # a coded refusal: some rule of this write was broken, and it does not say which value is right. The
                # agent re-applies, with care, every rule it has a value for (the policy, its cards); a rule nothing
                # it reads states stays unknown, so it repeats that slip and the same refusal makes it give up
                return {fid: (True, val) for fid, (_follows, val) in out.items()}
            if not any(fact_read(f, last) is not None for f in on_tool):
                return {fid: (True, None) for fid in out}
            quoted: dict[str, object] = {}
            for _call, res in attempts:  # every refusal of this request so far: a later rule wins per fact
                if "error" in res:
                    rule = refusal_rule(res)
                    quoted |= {f.id: val for f in on_tool if (val := fact_read(f, rule)) is not None}
            out = {fid: (True, quoted[fid]) if fid in quoted else b for fid, b in out.items()}
        return out

    # -- proposing state -----------------------------------------------------------------------------------------
    def _propose(self, v: View, seed: int, comp: Competence) -> dict:
        todo = self.pending(v, seed, comp)
        pending = [{"tool": r.tool, "args": dict(r.target), "note": r.kind} for r in todo]
        nxt = None
        opening = comp.opening(v, plan_only=True)
        if opening is not None:
            nxt = opening[1][0] if opening[1] else None
        elif todo:
            step = self._step(v, todo[0], seed, comp, plan_only=True)
            nxt = step[1][0] if step[1] else todo[0].tool
        return {"pending": pending, "next_tool": nxt}

    # -- drafting ------------------------------------------------------------------------------------------------
    def _draft(self, v: View, seed: int, comp: Competence) -> Step:
        opening = comp.opening(v)
        if opening is not None:
            return opening
        todo = self.pending(v, seed, comp)
        if not todo:
            return "", (FINISH_TOOL, {"summary": "all requests handled"})
        bounced_finish = CheckCode.PENDING_WORK in bounce_codes(v.feedback)
        last = v.calls[-1] if v.calls else None
        just_wrote = last is not None and last[0]["name"] in comp.writes and "error" not in last[1]
        n_writes = sum(1 for c, r in v.calls if c["name"] in comp.writes and "error" not in r)
        if just_wrote and Owner.C not in self.off and coin(seed, "early", n_writes) < self.rates.p_early_done:
            if not (bounced_finish and coin(seed, "fix", "finish", n_writes) < self.rates.p_fix):
                return "", (FINISH_TOOL, {"summary": "all requests handled"})
        return self._step(v, todo[0], seed, comp)

    def _step(self, v: View, r: Request, seed: int, comp: Competence, plan_only: bool = False) -> Step:
        """The next action for request `r`. With plan_only, no fact is applied (what the agent means to do next)."""
        read_first = comp.prepare(v, r)
        if read_first is not None:
            return read_first
        attempts = [(c, res) for c, res in v.results(r.tool) if r.targets(c["args"])]
        if attempts and "error" in attempts[-1][1] and not plan_only:
            if (
                _gives_up(attempts, sum(1 for f in comp.facts if f.tool == r.tool))
                or coin(seed, "recover", r.key, len(attempts)) >= self.rates.p_recover
            ):
                return comp.give_up(r), None
        if plan_only:
            return "", (r.tool, {})
        beliefs = self.beliefs(v, r, seed, comp, attempts)
        step = comp.write(v, r, beliefs)
        if step[1] is None or step[1][0] != r.tool:
            return step  # a read that a followed rule requires comes first
        step = (step[0], (r.tool, _with_formulas(v, r, beliefs, comp, step[1][1])))
        acts = _acts(v, comp)
        if not covered(acts, r.tool, r.target):
            if _denied(acts, r):
                return comp.give_up(r), None  # the customer said no to this very write
            asked = (
                CheckCode.UNCONFIRMED in bounce_codes(v.feedback)
                and coin(seed, "fix", "confirm", r.key) < self.rates.p_fix
            )
            if asked or Owner.C in self.off or coin(seed, "confirm", r.key) >= self.rates.p_skip_confirm:
                return "", (CONFIRM_TOOL, {"tool": r.tool, "args": dict(r.target), "summary": comp.summary(r)})
        return step


def _with_formulas(v: View, r: Request, beliefs: Beliefs, comp: Competence, args: dict) -> dict:
    """The write's arguments with each field that a followed card states as a formula (a rule inferred from outcomes,
    `components.worlds.outcome_rules`) set to what the formula gives on what the reads showed. A card item is one
    instruction: a field several rules govern takes its formula when the agent follows the first of them the item
    states it for (one coin, as for a card that states one rule)."""
    by_field: dict[str, tuple[bool, FieldRule]] = {}
    for _fid, (follows, value) in beliefs.items():
        if isinstance(value, Formula):
            for rule in value.rules:
                by_field.setdefault(rule.field, (follows, rule))
    rules = [rule for follows, rule in by_field.values() if follows]
    if not rules:
        return args
    skip = comp.writes | {CONFIRM_TOOL, FINISH_TOOL}
    reads = [(c["name"], c["args"], res) for c, res in v.calls if c["name"] not in skip and "error" not in res]
    today = policy_today(v.policy)
    return apply_formulas(rules, args, lambda now: read_features(reads, now, r.target, today))


def _refused_on(result: dict) -> str:
    """What a refusal was about: its rule id, else its rule text, else its message."""
    return str(result.get("rule_id") or refusal_rule(result) or result.get("error") or "")


def _gives_up(attempts: list[tuple[dict, dict]], n_facts: int) -> bool:
    """After a refusal: give up when it repeats what an earlier refusal of this request was about (retrying would
    not learn anything new), or after one attempt more than the write has rules. A write with several rules can
    thus be refused once per rule and still recover."""
    refusals = [_refused_on(res) for _c, res in attempts if "error" in res]
    return refusals[-1] in refusals[:-1] or len(attempts) >= max(2, n_facts + 1)


def _acts(v: View, comp: Competence) -> list[Act]:
    """The calls so far as confirmation reads them (`components.runtime.confirm`, the kernel's one rule): the agent
    believes a write is confirmed exactly when the harness would."""
    return [
        Act(
            c["name"],
            c["args"],
            "error" not in res,
            c["name"] in comp.writes,
            res.get("confirmed") if c["name"] == CONFIRM_TOOL else None,
        )
        for c, res in v.calls
    ]


def _denied(acts: list[Act], r: Request) -> bool:
    """The latest confirmation since the last write asked about this request's write and was refused."""
    for a in reversed(acts):
        if a.write and a.ok:
            return False
        if a.tool == CONFIRM_TOOL:
            return (
                a.granted is False
                and a.args.get("tool") == r.tool
                and isinstance(a.args.get("args"), dict)
                and r.targets(a.args["args"])
            )
    return False


# -- the meta-agent's planning prompt -----------------------------------------------------------------------------


def plan_reply(messages: list[dict]) -> str:
    """Answer the `llm` meta-agent: return the plan the prompt's evidence supports, as JSON.

    The prompt carries the diagnosis and a draft plan the rules would make; a careful model returns it (the point of
    the simulated path is to exercise the llm backend's plumbing and schema validation, not to out-think the rules)."""
    text = messages[-1].get("content") or ""
    m = re.search(r"```json\n(.*?)\n```", text, re.S)
    if not m:
        return json.dumps(
            {"owner": Owner.NONE, "rationale": "no evidence in the prompt", "evidence": [], "operations": []}
        )
    return m.group(1)
