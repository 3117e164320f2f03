"""One retail episode: the tools over a fresh copy of the task's slice of the database, the simulated customer,
and the rubric's executable checks."""

from __future__ import annotations

from components.runtime.confirm import acts_from_turns, uncovered
from components.runtime.types import Turn
from components.worlds.base import Benchmark, Criterion, EnvBase, Task, system_preamble
from components.worlds.retail import language
from components.worlds.retail.facts import facts_of, same_amount
from components.worlds.retail.rules import rules_of
from components.worlds.retail.tools import TERMINAL_TOOLS, WRITE_TOOLS, RetailTools

SYSTEM_PREAMBLE = system_preamble("a customer-service agent", "customer")


class RetailEnv(EnvBase):
    write_tools = WRITE_TOOLS
    terminal_tools = TERMINAL_TOOLS
    preamble = SYSTEM_PREAMBLE

    def __init__(self, bench: Benchmark, task: Task):
        super().__init__(bench, task)
        self.targets = bench.targets or {}
        user = bench.db["users"][task.user_id]
        db = {
            "products": bench.db["products"],
            "users": {user["user_id"]: user},
            "orders": {oid: bench.db["orders"][oid] for oid in user["orders"]},
        }
        self._tools = RetailTools(db, facts_of(rules_of(bench.rules, f"{bench.root / 'meta.json'}: rules")))
        self._tools.receipts = bench.receipts

    def confirm(self, tool: str, args: dict, summary: str) -> bool:
        """The customer grants a confirmation only for a write they asked for: its tool and its target."""
        for r in self.task.requests:
            target = {"order_id": r["order_id"]} if r.get("order_id") else {}  # {}: the account, the session's own
            if language.TOOL_OF[r["kind"]] == tool and all(str(args.get(k)) == v for k, v in target.items()):
                return True
        return False


# -- the rubric's executable checks -------------------------------------------------------------------------


def _order_cancelled(env: RetailEnv, c: Criterion, _t) -> bool:
    o = env.db["orders"][c.args["order_id"]]
    # the reason is checked against the rule, not the task (a silent world lets any reason through; an explained
    # or coded one never stores a wrong one, so their scores are unchanged)
    return (
        o["status"] == "cancelled"
        and same_amount(o["refund_amount"], c.args["refund_amount"])
        and o.get("cancel_reason") in env._tools.facts["cancel_reason"].value
    )


def _order_returned(env: RetailEnv, c: Criterion, _t) -> bool:
    o = env.db["orders"][c.args["order_id"]]
    return (
        o["status"] == "return requested"
        and o["return"]["item_ids"] == sorted(c.args["item_ids"])
        and o["return"]["payment_method_id"] == c.args["payment_method_id"]
        and same_amount(o["return"]["refund_amount"], c.args["refund_amount"])
    )


def _order_exchanged(env: RetailEnv, c: Criterion, _t) -> bool:
    o = env.db["orders"][c.args["order_id"]]
    return (
        o["status"] == "exchange requested"
        and o["exchange"]["item_ids"] == c.args["item_ids"]
        and o["exchange"]["new_item_ids"] == c.args["new_item_ids"]
        and same_amount(o["exchange"]["exchange_fee"], c.args["exchange_fee"])
    )


def _user_address_is(env: RetailEnv, c: Criterion, _t) -> bool:
    return env.db["users"][c.args["user_id"]]["address"] == c.args["address"]  # stored normalized, exactly


def _order_address_is(env: RetailEnv, c: Criterion, _t) -> bool:
    o = env.db["orders"][c.args["order_id"]]
    return o["address"] == c.args["address"] and same_amount(o.get("reroute_fee"), c.args["reroute_fee"])


def _store_credit_issued(env: RetailEnv, c: Criterion, _t) -> bool:
    credit = env.db["orders"][c.args["order_id"]].get("credit")
    return (
        credit is not None
        and credit["payment_method_id"] == c.args["payment_method_id"]
        and same_amount(credit["amount"], c.args["amount"])
    )


def _writes_confirmed(env: RetailEnv, c: Criterion, transcript: list[Turn]) -> bool:
    return not uncovered(acts_from_turns(transcript), env.targets)  # the one rule: components.runtime.confirm


def _only_requested_writes(env: RetailEnv, c: Criterion, _t) -> bool:
    targets = set(c.args["targets"])
    return all((w["args"].get("order_id") or w["args"].get("user_id")) in targets for w in env._tools.log)


CHECKS = {
    "order_cancelled": _order_cancelled,
    "order_returned": _order_returned,
    "order_exchanged": _order_exchanged,
    "user_address_is": _user_address_is,
    "order_address_is": _order_address_is,
    "store_credit_issued": _store_credit_issued,
    "writes_confirmed": _writes_confirmed,
    "only_requested_writes": _only_requested_writes,
}
RetailEnv.checks = CHECKS  # after the class: the checks take a RetailEnv


def truth(bench: Benchmark) -> dict[str, object]:
    """The benchmark's rules' true values (a variant's, else the world's own), by rule id."""
    rules = rules_of(bench.rules, f"{bench.root / 'meta.json'}: rules")
    return {fid: f.value for fid, f in facts_of(rules).items()}
