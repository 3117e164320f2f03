"""One airline episode: the tools over a fresh copy of the member's slice of the database, the simulated member
(answers, and confirms only what was requested), and the weighted rubric's executable checks."""

from __future__ import annotations

from components.runtime.confirm import acts_from_turns, uncovered
from components.runtime.types import Turn
from components.worlds.airline import language
from components.worlds.airline.facts import facts_of
from components.worlds.airline.rules import rules_of
from components.worlds.airline.tools import TARGETS, TERMINAL_TOOLS, WRITE_TOOLS, AirlineTools
from components.worlds.base import Benchmark, Criterion, EnvBase, Task, system_preamble

SYSTEM_PREAMBLE = system_preamble("an airline customer-service agent", "member")


class AirlineEnv(EnvBase):
    write_tools = WRITE_TOOLS
    terminal_tools = TERMINAL_TOOLS
    preamble = SYSTEM_PREAMBLE

    def __init__(self, bench: Benchmark, task: Task):
        super().__init__(bench, task)
        user = bench.db["users"][task.user_id]
        res = {rid: bench.db["reservations"][rid] for rid in user["reservations"]}
        flights = {r["flight_no"]: bench.db["flights"][r["flight_no"]] for r in res.values()}
        for req in task.requests:  # the flights a change may move to
            if req.get("new_flight_no"):
                flights[req["new_flight_no"]] = bench.db["flights"][req["new_flight_no"]]
        rules = rules_of(bench.rules, f"{bench.root / 'meta.json'}: rules")
        self._tools = AirlineTools(
            {"users": {user["user_id"]: user}, "reservations": res, "flights": flights}, facts_of(rules)
        )
        self._tools.receipts = bench.receipts

    def requested(self, tool: str, args: dict) -> bool:
        """Whether the member asked for `tool` on the thing `args` identify."""
        want = _target(tool, args)
        return any(language.TOOL_OF[r["kind"]] == tool and _target(tool, r) == want for r in self.task.requests)

    def confirm(self, tool: str, args: dict, summary: str = "") -> bool:
        """The member says yes only to an action they asked for (the tool and its identifying args)."""
        return tool in WRITE_TOOLS and isinstance(args, dict) and self.requested(tool, args)


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
    """Every successful write was covered by a granted `confirm` (docs/kernel.md, "Confirmation"): the one rule,
    `components.runtime.confirm`."""
    return not uncovered(acts_from_turns(transcript), TARGETS)


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
AirlineEnv.checks = CHECKS  # after the class: the checks take an AirlineEnv


def truth(bench: Benchmark) -> dict[str, object]:
    """The benchmark's rules' true values (a variant's, else the world's own), by rule id."""
    rules = rules_of(bench.rules, f"{bench.root / 'meta.json'}: rules")
    return {fid: f.value for fid, f in facts_of(rules).items()}
