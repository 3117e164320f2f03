"""The embedded simulated agent: a deterministic stand-in for a frozen model that makes memory matter offline.

It reads only its messages (system prompt, the harness's memory message, the conversation, tool results) and the
request's seed; the same inputs give the same output. It fails the ways the seeds describe, each at a rate that
memory changes:

  E  family knowledge (a fact of `worlds.retail.facts`): followed at a low base rate when only the long policy states
     it, at a high rate when a card stating it is in this turn's memory. A wrong card is followed too.
  rho  attention: every card in memory that does not concern the current action scales that rate by 1/(1+lambda*n).
  W  drift: a pending request is forgotten with a hazard that grows with the conversation's length, much lower while
     the ledger board lists it as pending; a board entry shown DONE is believed (even when wrongly settled).
  C  discipline: writes without asking for confirmation, and declares done after a write while work remains, at base
     rates; a bounced draft is corrected with high probability.

Every random choice is a hash of (seed, what the choice is about), not of the turn number, so two packages run with
the same seed face the same coin flips wherever their conversations agree: paired evaluation with common random
numbers. It also answers the `llm` meta-agent's planning prompt (see `plan_reply`).

Cards and policy are read with the world's grammar (`worlds.retail.facts`): the agent follows the value a text
instructs, a negated instruction included; text outside the grammar is ignored.

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
import json
import re
from dataclasses import dataclass, field
from functools import lru_cache

from components.models.base import ChatResult, ModelError, count_tokens
from components.runtime import prompts
from components.runtime.types import ToolCall, Usage
from components.worlds.retail import language
from components.worlds.retail.facts import BY_TOOL, VERBATIM, Fact

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
OWNERS = ("rho", "E", "W", "C")  # the fault switches; also the precedence among faults that fire at the same call


@lru_cache(maxsize=1 << 16)  # pure; drift checks and probe twins ask the same questions many times per episode
def coin(seed: int, *about: object) -> float:
    h = hashlib.blake2b(repr((seed, *about)).encode(), digest_size=8).digest()
    return int.from_bytes(h, "big") / 2**64


# -- reading the messages -----------------------------------------------------------------------------------

BOARD_RE = re.compile(r"^- \[(PENDING|DONE|BLOCKED)\] (e\d+) (\w+)((?: \w+=\S+)*)", re.M)
CARD_SPLIT = re.compile(r"^### card ", re.M)


@dataclass
class Request:
    kind: str
    tool: str
    order_id: str | None = None
    item_names: list[str] = field(default_factory=list)
    reason_phrase: str = ""
    product_name: str = ""
    want: dict = field(default_factory=dict)
    alt: dict = field(default_factory=dict)
    address: dict = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.kind}:{self.order_id or 'account'}"


@dataclass
class View:
    """Everything the agent can read, parsed."""

    policy: str
    memory: str
    cards: list[str]
    board: dict[tuple[str, str], str] | None  # (tool, target) -> status; None when no board is rendered
    requests: list[Request]
    email: str | None
    calls: list[tuple[dict, dict]]  # (call, result) in order
    user_texts: list[str]
    assistant_texts: list[str]
    turn: int  # assistant turns so far
    feedback: str | None
    mode: str  # draft | propose

    def results(self, tool: str) -> list[tuple[dict, dict]]:
        return [(c, r) for c, r in self.calls if c["name"] == tool]


def _target(tool: str, args: dict) -> str:
    return str(args.get("order_id") or "account")


def read(messages: list[dict]) -> View:
    if len(messages) < 2 or messages[0].get("role") != "system":
        raise ModelError("expected a system prompt and a memory message first")
    policy = messages[0]["content"] or ""
    memory = messages[1]["content"] or "" if messages[1].get("role") == "system" else ""
    rest = messages[2:]
    mode, feedback = "draft", None
    if rest and rest[-1]["role"] == "system":
        tail = rest[-1]["content"] or ""
        if tail.startswith(prompts.PROPOSE.split("\n")[0]):
            mode = "propose"
        elif tail.startswith(prompts.FEEDBACK.split("\n")[0]):
            feedback = tail
        rest = rest[:-1]
    cards = [c for c in CARD_SPLIT.split(memory)[1:]]
    board = None
    if "## Working memory (ledger)" in memory:
        board = {}
        for status, _eid, tool, args in BOARD_RE.findall(memory):
            kv = dict(a.split("=", 1) for a in args.split())
            board[(tool, kv.get("order_id", "account"))] = status
    calls: list[tuple[dict, dict]] = []
    pending_calls: dict[str, dict] = {}
    user_texts, assistant_texts = [], []
    turn = 0
    for m in rest:
        role = m.get("role")
        if role == "user":
            user_texts.append(m.get("content") or "")
        elif role == "assistant":
            turn += 1
            for tc in m.get("tool_calls") or []:
                fn = tc["function"]
                try:
                    args = json.loads(fn["arguments"] or "{}")
                except json.JSONDecodeError:
                    args = {}
                pending_calls[tc["id"]] = {"name": fn["name"], "args": args}
            if not m.get("tool_calls"):
                assistant_texts.append(m.get("content") or "")
        elif role == "tool":
            call = pending_calls.pop(m.get("tool_call_id"), None)
            if call is not None:
                try:
                    result = json.loads(m.get("content") or "{}")
                except json.JSONDecodeError:
                    result = {"error": m.get("content")}
                calls.append((call, result if isinstance(result, dict) else {"value": result}))
    first = user_texts[0] if user_texts else ""
    reqs = [Request(**{k: v for k, v in r.items() if k in Request.__dataclass_fields__}) for r in language.parse_requests(first)]
    return View(policy, memory, cards, board, reqs, language.parse_email(first), calls, user_texts, assistant_texts,
                turn, feedback, mode)


# -- the agent --------------------------------------------------------------------------------------------------


class SimulatedAgent:
    """`complete()` with OpenAI chat semantics. Stateless: everything comes from the messages and the seed."""

    name = NAME

    def __init__(self, rates: Rates = RATES, off: frozenset[str] = frozenset(), cards: tuple[str, ...] = (),
                 probe: bool = False, metered: bool = True):
        self.rates = rates
        self.off = frozenset(off)
        self.cards = tuple(cards)  # the package's cards as rendered, for rho off (perfect routing of what exists)
        self.probe = probe
        self.metered = metered  # token counts; a counterfactual replay needs none
        self.onsets: dict[str, int] = {}  # owner -> index of the first call its fault changed (with probe)
        self.n_calls = 0

    def _twin(self, off: frozenset[str], v: View, seed: int) -> tuple:
        return SimulatedAgent(self.rates, off, self.cards)._respond(v, seed)

    def _probe(self, v: View, seed: int, mine: tuple) -> None:
        """Record the first call at which each owner's fault (not yet switched off) changes the output."""
        for owner in OWNERS:
            if owner in self.off or owner in self.onsets or (v.mode == "propose" and owner != "W"):
                continue  # proposing the state applies no fact and no discipline: only W can change it
            if self._twin(self.off | {owner}, v, seed) != mine:
                self.onsets[owner] = self.n_calls

    def _respond(self, v: View, seed: int) -> tuple:
        if v.mode == "propose":
            return json.dumps(self._propose(v, seed), sort_keys=True), None
        return self._draft(v, seed)

    def complete(self, messages: list[dict], *, tools: list[dict] | None, seed: int, json_mode: bool = False) -> ChatResult:
        if messages and messages[0].get("role") == "system" and (messages[0].get("content") or "").startswith(prompts.PLAN_MARK):
            content = plan_reply(messages)
            return ChatResult(content=content, usage=count_tokens(messages, tools, content))
        v = read(messages)
        content, call = self._respond(v, seed)
        if self.probe:
            self._probe(v, seed, (content, call))
        self.n_calls += 1
        if v.mode == "propose":
            return ChatResult(content=content, usage=self._meter(messages, tools, content))
        calls = [] if call is None else [ToolCall(id=f"call_{v.turn + 1:03d}", name=call[0], args=call[1])]
        out = content + (json.dumps({"name": call[0], "args": call[1]}, sort_keys=True) if call else "")
        return ChatResult(content=content, tool_calls=calls, usage=self._meter(messages, tools, out))

    def _meter(self, messages: list[dict], tools: list[dict] | None, out: str) -> Usage:
        return count_tokens(messages, tools, out) if self.metered else Usage(calls=1)

    # -- beliefs -------------------------------------------------------------------------------------------------
    def _history_status(self, v: View, r: Request) -> str:
        status = "todo"
        for call, result in v.results(r.tool):
            if _target(r.tool, call["args"]) != (r.order_id or "account"):
                continue
            if "error" not in result:
                return "done"
            status = "blocked" if result.get("blocking") else "error"
        if any(f"could not complete the request for {r.order_id or 'your account'}" in t for t in v.assistant_texts):
            return "given_up"
        return status

    def _hazard(self, t: int) -> float:
        return min(self.rates.drift_max, self.rates.drift * max(0, t - self.rates.drift_after))

    def pending(self, v: View, seed: int) -> list[Request]:
        """The requests the agent believes are still to do, in the customer's order."""
        out = []
        for r in v.requests:
            hist = self._history_status(v, r)
            if "W" in self.off:  # perfect tracking: what the history shows, no drift
                if hist not in ("done", "blocked", "given_up"):
                    out.append(r)
                continue
            on_board = v.board.get((r.tool, r.order_id or "account")) if v.board is not None else None
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
    def follows(self, v: View, fact: Fact, r: Request, seed: int) -> tuple[bool, object]:
        """Whether the agent applies `fact` to request `r` now, and the value it believes the rule has."""
        u = coin(seed, "fact", fact.id, r.key)
        if "E" in self.off:
            return True, fact.value
        if "rho" in self.off:  # every card of the package about this action, and nothing else
            stated = [(i, val) for i, text in enumerate(self.cards) if (val := fact.read(text)) is not None]
            if stated:
                return u < self.rates.p_card, stated[0][1]
        stated = [(i, val) for i, text in enumerate(v.cards) if (val := fact.read(text)) is not None]
        if stated and "rho" not in self.off:
            irrelevant = len(v.cards) - len(stated)
            return u < self.rates.p_card / (1 + self.rates.attention * irrelevant), stated[0][1]
        in_policy = fact.read(v.policy)
        return (in_policy is not None and u < self.rates.p_base), in_policy

    # -- proposing state -----------------------------------------------------------------------------------------
    def _propose(self, v: View, seed: int) -> dict:
        todo = self.pending(v, seed)
        pending = [{"tool": r.tool, "args": {"order_id": r.order_id} if r.order_id else {}, "note": r.kind} for r in todo]
        nxt = None
        if self._user_id(v) is None:
            nxt = "find_user_id_by_email"
        elif todo:
            step = self._step(v, todo[0], seed, plan_only=True)
            nxt = step[1][0] if step[1] else todo[0].tool
        return {"pending": pending, "next_tool": nxt}

    # -- drafting ------------------------------------------------------------------------------------------------
    @staticmethod
    def _user_id(v: View) -> str | None:
        for _c, r in v.results("find_user_id_by_email"):
            if "user_id" in r:
                return r["user_id"]
        return None

    def _draft(self, v: View, seed: int) -> tuple[str, tuple[str, dict] | None]:
        uid = self._user_id(v)
        if uid is None:
            tried = v.results("find_user_id_by_email")
            if not tried:
                return "", ("find_user_id_by_email", {"email": v.email or ""})
            if any("only email" in t for t in v.user_texts):
                return "", ("transfer_to_human_agents", {"summary": "customer could not be authenticated"})
            return "I could not find an account with that email. Could you give me another email?", None
        if not v.results("get_user_details"):
            return "", ("get_user_details", {"user_id": uid})

        todo = self.pending(v, seed)
        if not todo:
            return "", ("finish", {"summary": "all requests handled"})
        bounced_finish = bool(v.feedback and "cannot finish" in v.feedback)
        last = v.calls[-1] if v.calls else None
        just_wrote = last is not None and last[0]["name"] in language.TOOL_OF.values() and "error" not in last[1]
        n_writes = sum(1 for c, r in v.calls if c["name"] in language.TOOL_OF.values() and "error" not in r)
        if just_wrote and "C" not in self.off and coin(seed, "early", n_writes) < self.rates.p_early_done:
            if not (bounced_finish and coin(seed, "fix", "finish", n_writes) < self.rates.p_fix):
                return "", ("finish", {"summary": "all requests handled"})
        return self._step(v, todo[0], seed)

    def _step(self, v: View, r: Request, seed: int, plan_only: bool = False) -> tuple[str, tuple[str, dict] | None]:
        """The next action for request `r`. With plan_only, no fact is applied (what the agent means to do next)."""
        uid = self._user_id(v) or ""
        order = None
        if r.order_id:
            got = [res for c, res in v.results("get_order_details") if c["args"].get("order_id") == r.order_id]
            if not got or "error" in got[-1]:
                return "", ("get_order_details", {"order_id": r.order_id})
            order = got[-1]
        variants = None
        if r.kind == "exchange":
            item = next((i for i in order["items"] if i["name"] == r.product_name), order["items"][0])
            got = [res for c, res in v.results("get_product_variants") if c["args"].get("product_id") == item["product_id"]]
            if not got:
                return "", ("get_product_variants", {"product_id": item["product_id"]})
            variants = got[-1]["variants"]

        attempts = [(c, res) for c, res in v.results(r.tool) if _target(r.tool, c["args"]) == (r.order_id or "account")]
        if attempts and "error" in attempts[-1][1] and not plan_only:
            if len(attempts) >= 2 or coin(seed, "recover", r.key, len(attempts)) >= self.rates.p_recover:
                return f"I'm sorry, I could not complete the request for {r.order_id or 'your account'}.", None

        if plan_only:
            return "", (r.tool, {})
        args = self._write_args(v, r, seed, uid, order, variants, attempts)
        if args is None:  # a lookup the rule requires comes first
            return "", ("validate_address", dict(r.address))

        if not self._confirmed(v, r):
            asked = bool(v.feedback and "confirmation" in v.feedback) and coin(seed, "fix", "confirm", r.key) < self.rates.p_fix
            if asked or "C" in self.off or coin(seed, "confirm", r.key) >= self.rates.p_skip_confirm:
                return language.confirm_question(r.kind, r.order_id), None
        return "", (r.tool, args)

    def _confirmed(self, v: View, r: Request) -> bool:
        question = language.confirm_question(r.kind, r.order_id)
        msgs = v.assistant_texts
        # confirmed when the latest user message is a yes to this very question
        return bool(v.user_texts) and v.user_texts[-1] == language.YES and bool(msgs) and msgs[-1] == question

    def _write_args(self, v: View, r: Request, seed: int, uid: str, order: dict | None, variants: list | None,
                    attempts: list) -> dict | None:
        fact = BY_TOOL.get(r.tool)
        follow, value = self.follows(v, fact, r, seed) if fact else (False, None)
        if attempts and "error" in attempts[-1][1]:  # retrying: the error receipt quotes the rule after "Policy: "
            follow, value = True, fact.read(attempts[-1][1]["error"].split("Policy: ", 1)[-1]) if fact else None
        if r.kind == "cancel":
            reason = r.reason_phrase
            if follow and isinstance(value, tuple) and value and value != VERBATIM:
                want = "no longer needed" if "need" in r.reason_phrase else "ordered by mistake"
                reason = want if want in value else value[0]
            return {"order_id": r.order_id, "reason": reason}
        if r.kind == "return":
            ids = sorted(i["item_id"] for i in order["items"] if i["name"] in r.item_names)
            methods = self._user_methods(v)
            pm = methods[0]["id"] if methods else order["payment_method_id"]
            if follow and value == "original":
                pm = order["payment_method_id"]
            elif follow and value == "gift_card":
                pm = next((m["id"] for m in methods if m["kind"] == "gift_card"), pm)
            return {"order_id": r.order_id, "item_ids": ids, "payment_method_id": pm}
        if r.kind == "exchange":
            item = next((i for i in order["items"] if i["name"] == r.product_name), order["items"][0])
            choice = _variant(variants, r.want)
            if follow and value == "check_available" and (choice is None or not choice["available"]):
                choice = _variant(variants, r.alt) or choice
            return {"order_id": r.order_id, "item_ids": [item["item_id"]],
                    "new_item_ids": [choice["item_id"] if choice else item["item_id"]]}
        if r.kind == "user_address":
            return {"user_id": uid, **r.address}
        if r.kind == "order_address":
            normalized = [res["normalized"] for c, res in v.results("validate_address")
                          if c["args"] == r.address and "normalized" in res]
            if normalized:
                return {"order_id": r.order_id, **normalized[-1]}
            if follow and value == "validate":
                return None
            return {"order_id": r.order_id, **r.address}
        raise ModelError(f"unknown request kind {r.kind}")

    @staticmethod
    def _user_methods(v: View) -> list[dict]:
        for _c, res in v.results("get_user_details"):
            return res.get("payment_methods", [])
        return []


def _variant(variants: list | None, options: dict) -> dict | None:
    for var in variants or []:
        if all(str(var["options"].get(k)) == str(val) for k, val in options.items()):
            return var
    return None


# -- the meta-agent's planning prompt -----------------------------------------------------------------------------

def plan_reply(messages: list[dict]) -> str:
    """Answer the `llm` meta-agent: return the plan the prompt's evidence supports, as JSON.

    The prompt carries the diagnosis and a draft plan the rules would make; a careful model returns it (the point of
    the simulated path is to exercise the llm backend's plumbing and schema validation, not to out-think the rules)."""
    text = messages[-1].get("content") or ""
    m = re.search(r"```json\n(.*?)\n```", text, re.S)
    if not m:
        return json.dumps({"owner": "none", "rationale": "no evidence in the prompt", "evidence": [], "operations": []})
    return m.group(1)
