"""What a careful retail agent does: the retail world's `Competence` (see `components.worlds.competence`).

The simulated agent's fault engine decides when it slips; this module says what it does when it does not: read the
customer's message (`language`), authenticate by email and load the account, read each order (and a product's
variants for an exchange), and fill in each write's arguments from what it believes about the rules (`facts`): two
or three rules on most writes, each read from its own belief, the amounts from the formulas the tools check.
"""

from __future__ import annotations

from typing import Any

from components.worlds.accounts import opening, user_id
from components.worlds.competence import Beliefs, Request, Step, View, requests_from
from components.worlds.retail import language
from components.worlds.retail import facts as F
from components.worlds.retail.facts import FACTS, VERBATIM
from components.worlds.numbers import is_num
from components.worlds.rules import Fee


class RetailCompetence:
    facts = FACTS
    writes = frozenset(language.TOOL_OF.values())

    # -- reading the customer ----------------------------------------------------------------------------------
    def parse(self, first_message: str) -> tuple[list[Request], dict[str, Any]]:
        return requests_from(language.parse_requests(first_message), "order_id"), {
            "email": language.parse_email(first_message)
        }

    # -- session and reads ---------------------------------------------------------------------------------------
    def opening(self, view: View, plan_only: bool = False) -> Step | None:
        return opening(view, plan_only, "customer", loaded=bool(view.results("get_user_details")))

    def prepare(self, view: View, request: Request) -> Step | None:
        oid = request.target.get("order_id")
        if oid:
            got = _order(view, oid)
            if got is None or "error" in got:
                return "", ("get_order_details", {"order_id": oid})
        if request.kind == "exchange":
            item = _item(_order(view, oid), request)
            if _variants(view, item) is None:
                return "", ("get_product_variants", {"product_id": item["product_id"]})
        return None

    # -- the write -----------------------------------------------------------------------------------------------
    def write(self, view: View, request: Request, beliefs: Beliefs) -> Step:
        """The write from the rules the agent believes: a rule it does not follow (or whose value it does not have)
        leaves the naive default (the customer's words, the account's first method, no fee, no bonus, no cap, a flat
        courtesy credit); amounts come from the same formulas the tools check (`facts`)."""
        r = request
        oid = r.target.get("order_id")
        order = _order(view, oid) if oid else None
        know = {fid: (value if follows else None) for fid, (follows, value) in beliefs.items()}
        write = _WRITES.get(r.kind)
        if write is None:
            raise ValueError(f"unknown retail request kind {r.kind}")
        return write(view, r, oid, order, know)

    # -- what the agent says -------------------------------------------------------------------------------------
    def give_up(self, request: Request) -> str:
        return f"I'm sorry, I could not complete the request for {request.target.get('order_id') or 'your account'}."

    def summary(self, request: Request) -> str:
        return f"I will {language.ACTION_PHRASE[request.kind].format(order_id=request.target.get('order_id'))}."


# -- the writes, one per request kind: (view, request, order id, order, what the agent knows) -> the step -----------


def _cancel(view: View, r: Request, oid: Any, order: Any, know: dict) -> Step:
    d = r.data
    reason, value = d["reason_phrase"], know.get("cancel_reason")
    if isinstance(value, tuple) and value and value != VERBATIM:
        want = F.reason_of(d["reason_phrase"])  # what the customer's words mean
        reason = want if want in value else value[0]
    return "", (
        r.tool,
        {"order_id": oid, "reason": reason, "refund_amount": F.cancel_refund(order, _fee(know.get("cancel_fee")))},
    )


def _return(view: View, r: Request, oid: Any, order: Any, know: dict) -> Step:
    ids = sorted(i["item_id"] for i in order["items"] if i["name"] in r.data["item_names"])
    methods = _user_methods(view)
    pm = methods[0]["id"] if methods else order["payment_method_id"]
    value = know.get("refund_original")
    if value == "original":
        pm = order["payment_method_id"]
    elif value == "gift_card":
        pm = next((m["id"] for m in methods if m["kind"] == "gift_card"), pm)
    gift = any(m["id"] == pm and m["kind"] == "gift_card" for m in methods)
    amount = F.return_refund(order, ids, _fee(know.get("restocking_fee")), _num(know.get("gift_card_bonus")), gift)
    return "", (r.tool, {"order_id": oid, "item_ids": ids, "payment_method_id": pm, "refund_amount": amount})


def _exchange(view: View, r: Request, oid: Any, order: Any, know: dict) -> Step:
    d = r.data
    item = _item(order, r)
    variants = _variants(view, item)
    choice = _variant(variants, d["want"])
    if know.get("exchange_available") == "check_available" and (choice is None or not choice["available"]):
        choice = _variant(variants, d["alt"]) or choice
    return "", (
        r.tool,
        {
            "order_id": oid,
            "item_ids": [item["item_id"]],
            "new_item_ids": [choice["item_id"] if choice else item["item_id"]],
            "exchange_fee": F.exchange_fee(order, 1, _fee(know.get("exchange_fee"))),
        },
    )


def _address(view: View, r: Request, oid: Any, order: Any, know: dict) -> Step:
    d = r.data
    if r.kind == "user_address":
        target, extra, rule = {"user_id": user_id(view) or ""}, {}, "user_address_validated"
    else:
        target, rule = {"order_id": oid}, "address_validated"
        extra = {"reroute_fee": F.reroute_fee(order, _fee(know.get("reroute_fee")))}
    normalized = [
        res["normalized"]
        for c, res in view.results("validate_address")
        if c["args"] == d["address"] and "normalized" in res
    ]
    if normalized:
        return "", (r.tool, {**target, **normalized[-1], **extra})
    if know.get(rule) == "validate":
        return "", ("validate_address", dict(d["address"]))
    return "", (r.tool, {**target, **d["address"], **extra})


def _credit(view: View, r: Request, oid: Any, order: Any, know: dict) -> Step:
    pm = order["payment_method_id"]
    if know.get("credit_gift_card") == "gift_card":
        pm = next((m["id"] for m in _user_methods(view) if m["kind"] == "gift_card"), pm)
    amount = F.credit_amount(order, _num(know.get("credit_rate")), _num(know.get("credit_cap")))
    return "", (r.tool, {"order_id": oid, "amount": amount, "payment_method_id": pm})


_WRITES = {
    "cancel": _cancel,
    "return": _return,
    "exchange": _exchange,
    "user_address": _address,
    "order_address": _address,
    "credit": _credit,
}


# -- reading the results ---------------------------------------------------------------------------------------


def _fee(value: object) -> Fee | None:
    """A believed fee rule, or None (no fee) when the belief is not one (a wrong card can say anything)."""
    return value if isinstance(value, Fee) else None


def _num(value: object) -> float | None:
    return float(value) if is_num(value) else None


def _user_methods(v: View) -> list[dict]:
    for _c, res in v.results("get_user_details"):
        return res.get("payment_methods", [])
    return []


def _order(v: View, order_id: str | None) -> dict | None:
    return v.latest("get_order_details", "order_id", order_id)


def _item(order: dict, r: Request) -> dict:
    return next((i for i in order["items"] if i["name"] == r.data["product_name"]), order["items"][0])


def _variants(v: View, item: dict) -> list | None:
    got = v.latest("get_product_variants", "product_id", item["product_id"])
    return got["variants"] if got is not None else None


def _variant(variants: list | None, options: dict) -> dict | None:
    for var in variants or []:
        if all(str(var["options"].get(k)) == str(val) for k, val in options.items()):
            return var
    return None
