"""What a careful retail agent does: the retail world's `Competence` (see `components.worlds.competence`).

The simulated agent's fault engine decides when it slips; this module says what it does when it does not: read the
customer's message (`language`), authenticate by email and load the account, read each order (and a product's
variants for an exchange), and fill in each write's arguments from what it believes about the rules (`facts`).
"""

from __future__ import annotations

from typing import Any

from components.worlds.competence import Beliefs, Request, Step, View
from components.worlds.retail import language
from components.worlds.retail.facts import FACTS, VERBATIM

# which fact governs each request kind's write
FACT_OF = {"cancel": "cancel_reason", "return": "refund_original", "exchange": "exchange_available",
           "order_address": "address_validated"}


class RetailCompetence:
    facts = FACTS
    writes = frozenset(language.TOOL_OF.values())

    # -- reading the customer ----------------------------------------------------------------------------------
    def parse(self, first_message: str) -> tuple[list[Request], dict[str, Any]]:
        reqs = []
        for r in language.parse_requests(first_message):
            kind, tool, oid = r.pop("kind"), r.pop("tool"), r.pop("order_id", None)
            reqs.append(Request(kind, tool, {"order_id": oid} if oid else {}, r))
        return reqs, {"email": language.parse_email(first_message)}

    # -- session and reads ---------------------------------------------------------------------------------------
    def opening(self, view: View, plan_only: bool = False) -> Step | None:
        uid = _user_id(view)
        if uid is None:
            if plan_only:
                return "", ("find_user_id_by_email", {})
            if not view.results("find_user_id_by_email"):
                return "", ("find_user_id_by_email", {"email": view.info.get("email") or ""})
            if any("only email" in t for t in view.user_texts):
                return "", ("transfer_to_human_agents", {"summary": "customer could not be authenticated"})
            return "I could not find an account with that email. Could you give me another email?", None
        if plan_only:
            return None  # loading the account is bookkeeping: the intent is the first request's next step
        if not view.results("get_user_details"):
            return "", ("get_user_details", {"user_id": uid})
        return None

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
        r, d = request, request.data
        oid = r.target.get("order_id")
        order = _order(view, oid) if oid else None
        follow, value = beliefs.get(FACT_OF.get(r.kind, ""), (False, None))
        if r.kind == "cancel":
            reason = d["reason_phrase"]
            if follow and isinstance(value, tuple) and value and value != VERBATIM:
                want = "no longer needed" if "need" in d["reason_phrase"] else "ordered by mistake"
                reason = want if want in value else value[0]
            return "", (r.tool, {"order_id": oid, "reason": reason})
        if r.kind == "return":
            ids = sorted(i["item_id"] for i in order["items"] if i["name"] in d["item_names"])
            methods = _user_methods(view)
            pm = methods[0]["id"] if methods else order["payment_method_id"]
            if follow and value == "original":
                pm = order["payment_method_id"]
            elif follow and value == "gift_card":
                pm = next((m["id"] for m in methods if m["kind"] == "gift_card"), pm)
            return "", (r.tool, {"order_id": oid, "item_ids": ids, "payment_method_id": pm})
        if r.kind == "exchange":
            item = _item(order, r)
            variants = _variants(view, item)
            choice = _variant(variants, d["want"])
            if follow and value == "check_available" and (choice is None or not choice["available"]):
                choice = _variant(variants, d["alt"]) or choice
            return "", (r.tool, {"order_id": oid, "item_ids": [item["item_id"]],
                                 "new_item_ids": [choice["item_id"] if choice else item["item_id"]]})
        if r.kind == "user_address":
            return "", (r.tool, {"user_id": _user_id(view) or "", **d["address"]})
        if r.kind == "order_address":
            normalized = [res["normalized"] for c, res in view.results("validate_address")
                          if c["args"] == d["address"] and "normalized" in res]
            if normalized:
                return "", (r.tool, {"order_id": oid, **normalized[-1]})
            if follow and value == "validate":
                return "", ("validate_address", dict(d["address"]))
            return "", (r.tool, {"order_id": oid, **d["address"]})
        raise ValueError(f"unknown retail request kind {r.kind}")

    # -- what the agent says -------------------------------------------------------------------------------------
    def give_up(self, request: Request) -> str:
        return f"I'm sorry, I could not complete the request for {request.target.get('order_id') or 'your account'}."

    def summary(self, request: Request) -> str:
        return language.ACTION_PHRASE[request.kind].format(order_id=request.target.get("order_id"))

    def confirm_question(self, request: Request) -> str:
        return language.confirm_question(request.kind, request.target.get("order_id"))

    def is_yes(self, reply: str) -> bool:
        return reply == language.YES


# -- reading the results ---------------------------------------------------------------------------------------

def _user_id(v: View) -> str | None:
    for _c, r in v.results("find_user_id_by_email"):
        if "user_id" in r:
            return r["user_id"]
    return None


def _user_methods(v: View) -> list[dict]:
    for _c, res in v.results("get_user_details"):
        return res.get("payment_methods", [])
    return []


def _order(v: View, order_id: str | None) -> dict | None:
    got = [res for c, res in v.results("get_order_details") if c["args"].get("order_id") == order_id]
    return got[-1] if got else None


def _item(order: dict, r: Request) -> dict:
    return next((i for i in order["items"] if i["name"] == r.data["product_name"]), order["items"][0])


def _variants(v: View, item: dict) -> list | None:
    got = [res for c, res in v.results("get_product_variants") if c["args"].get("product_id") == item["product_id"]]
    return got[-1]["variants"] if got else None


def _variant(variants: list | None, options: dict) -> dict | None:
    for var in variants or []:
        if all(str(var["options"].get(k)) == str(val) for k, val in options.items()):
            return var
    return None
