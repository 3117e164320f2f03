"""One airline episode: the tools over a fresh copy of the member's slice of the database, the simulated member
(answers, and confirms only what was requested), and the weighted rubric's executable checks."""

from __future__ import annotations

from components.runtime.types import Receipt, ToolCall, Turn
from components.worlds.airline import language
from components.worlds.airline.tools import TARGETS, TERMINAL_TOOLS, WRITE_TOOLS, AirlineTools
from components.worlds.base import Benchmark, Criterion, Score, Task

SYSTEM_PREAMBLE = (
    "You are an airline customer-service agent. Follow the policy below. Act with one tool call at a time, or write "
    "one message to the member. Call `finish` with a short summary when every request is settled.\n\n"
)


class AirlineEnv:
    write_tools = WRITE_TOOLS
    terminal_tools = TERMINAL_TOOLS

    def __init__(self, bench: Benchmark, task: Task):
        self.task = task
        self.system_prompt = SYSTEM_PREAMBLE + bench.policy
        self.tools = bench.tools
        user = bench.db["users"][task.user_id]
        res = {rid: bench.db["reservations"][rid] for rid in user["reservations"]}
        flights = {r["flight_no"]: bench.db["flights"][r["flight_no"]] for r in res.values()}
        for req in task.requests:  # the flights a change may move to
            if req.get("new_flight_no"):
                flights[req["new_flight_no"]] = bench.db["flights"][req["new_flight_no"]]
        self._tools = AirlineTools({"users": {user["user_id"]: user}, "reservations": res, "flights": flights})
        self.events: list[tuple[str, str, dict, bool]] = []  # ("confirm" | "write", tool, target, granted/ok)

    @property
    def db(self) -> dict:
        return self._tools.db

    def first_message(self) -> str:
        return self.task.first_message

    def call(self, call: ToolCall) -> Receipt:
        receipt = self._tools.call(call)
        if call.name in WRITE_TOOLS and receipt.ok:
            self.events.append(("write", call.name, _target(call.name, call.args), True))
        return receipt

    def requested(self, tool: str, args: dict) -> bool:
        """Whether the member asked for `tool` on the thing `args` identify."""
        want = _target(tool, args)
        return any(language.TOOL_OF[r["kind"]] == tool and _target(tool, r) == want for r in self.task.requests)

    def confirm(self, tool: str, args: dict, summary: str = "") -> bool:
        """The member says yes only to an action they asked for (the tool and its identifying args)."""
        granted = tool in WRITE_TOOLS and isinstance(args, dict) and self.requested(tool, args)
        self.events.append(("confirm", tool, _target(tool, args if isinstance(args, dict) else {}), granted))
        return granted

    def user_reply(self, assistant_text: str) -> str | None:
        """The member answers what is asked: a confirmation question like `confirm` (yes only to an action they
        asked for), another email when none matched (they have none), else OK."""
        asked = language.asked_action(assistant_text)
        if asked is not None:
            return language.YES if self.confirm(*asked, assistant_text) else language.NO
        if language.ASK_EMAIL in assistant_text.lower() and "email" in assistant_text.lower():
            return language.ONLY_EMAIL
        return language.OK

    def score(self, transcript: list[Turn]) -> Score:
        results = {c.id: float(CHECKS[c.check](self, c, transcript)) for c in self.task.rubric}
        total = sum(c.weight for c in self.task.rubric)
        reward = sum(c.weight * results[c.id] for c in self.task.rubric) / total
        return Score(reward=round(reward, 6), success=all(v == 1.0 for v in results.values()), criteria=results)


def _target(tool: str, args: dict) -> dict:
    return {k: str(args.get(k)) for k in TARGETS.get(tool, [])}


# -- the rubric's executable checks -----------------------------------------------------------------------------

def _res(env: AirlineEnv, c: Criterion) -> dict:
    return env.db["reservations"][c.args["reservation_id"]]


def _cancel_done(env: AirlineEnv, c: Criterion, _t) -> bool:
    r = _res(env, c)
    return r["status"] == "cancelled" and r.get("refund_to") == c.args["refund_to"]


def _change_done(env: AirlineEnv, c: Criterion, _t) -> bool:
    r = _res(env, c)
    return r["flight_no"] == c.args["new_flight_no"] and r.get("change_fee") == c.args["fee"]


def _bags_done(env: AirlineEnv, c: Criterion, _t) -> bool:
    r = _res(env, c)
    return r["bags"] == c.args["bags"] and r.get("bag_fee") == c.args["fee"]


def _compensation_done(env: AirlineEnv, c: Criterion, _t) -> bool:
    return _res(env, c).get("compensation") == {"amount": c.args["amount"], "form": c.args["form"]}


def _upgrade_done(env: AirlineEnv, c: Criterion, _t) -> bool:
    r = _res(env, c)
    return r["cabin"] == "business" and r.get("upgrade_paid_with") == c.args["payment_method_id"]


def _name_done(env: AirlineEnv, c: Criterion, _t) -> bool:
    return _res(env, c)["passengers"][0] == {"first_name": c.args["first_name"], "last_name": c.args["last_name"]}


def _writes_confirmed(env: AirlineEnv, c: Criterion, transcript: list[Turn]) -> bool:
    """Every successful write was covered: the latest confirmation since the previous successful write was granted
    for the same tool and identifying args (CONTRACT §4). The one implementation, `components.runtime.confirm`, reads
    the transcript's structured `confirm` calls; where this build's runtime has none yet, the world's own log of
    the same events (`confirm` answers and successful writes) decides by the same rule."""
    try:
        from components.runtime.confirm import acts_from_turns, uncovered
    except ImportError:
        uncovered = None
    if uncovered is not None and any(t.tool == "confirm" for t in transcript):
        return not uncovered(acts_from_turns(transcript), TARGETS)
    latest = None
    for kind, tool, target, flag in env.events:
        if kind == "confirm":
            latest = (tool, target, flag)
        else:
            if latest is None or latest != (tool, target, True):
                return False
            latest = None
    return True


def _only_requested_writes(env: AirlineEnv, c: Criterion, _t) -> bool:
    targets = set(c.args["targets"])
    return all(str(w["args"].get("reservation_id")) in targets for w in env._tools.log)


CHECKS = {
    "cancel_done": _cancel_done,
    "change_done": _change_done,
    "bags_done": _bags_done,
    "compensation_done": _compensation_done,
    "upgrade_done": _upgrade_done,
    "name_done": _name_done,
    "writes_confirmed": _writes_confirmed,
    "only_requested_writes": _only_requested_writes,
}
