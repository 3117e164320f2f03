"""What a careful airline agent does: the airline world's `Competence` (see `components.worlds.competence`).

The fault engine decides when the simulated agent slips; this module says what it does when it does not: read the
member's message (`language`), authenticate by email and load the profile (tier, payment methods), read each
reservation (and the flight's delay for a compensation), and fill in each write's arguments from what it believes
about each rule on that write (`facts`: several rules combine into one fee, allowance or amount).

What an agent that does not follow a rule does (its naive guess) is part of the world too: it refunds to the
account's first method, charges no change fee, assumes one free bag per passenger and $50 per extra bag, gives a
flat $100 in the form the member asked for, charges an upgrade to the reservation's own payment method, and types
names as the member wrote them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from components.worlds.airline import facts as F
from components.worlds.airline import language
from components.worlds.airline.rules import NO_SURCHARGE
from components.worlds.airline.catalog import TODAY, days_before
from components.worlds.accounts import opening
from components.worlds.competence import Beliefs, Request, Step, View, requests_from

NAIVE = {
    "refund_original": "account",
    "basic_credit": "same",
    "change_fee": (),
    "change_window": NO_SURCHARGE,
    "bag_allowance": (("gold", 1), ("regular", 1), ("silver", 1)),
    "bag_fee": 50,
    "bag_business": 0,
    "comp_rate": ((0, 100),),  # a flat $100 voucher, whatever the delay
    "comp_gold": 1,
    "comp_form": None,  # the form the member asked for (see `write`)
    "upgrade_payment": "any",
    "name_upper": "as_given",
}
TODAY_RE = re.compile(r"Today is (\d{4}-\d\d-\d\d)")


class AirlineCompetence:
    facts = F.FACTS
    writes = frozenset(language.TOOL_OF.values())

    # -- reading the member ------------------------------------------------------------------------------------------
    def parse(self, first_message: str) -> tuple[list[Request], dict[str, Any]]:
        return requests_from(language.parse_requests(first_message), "reservation_id"), {
            "email": language.parse_email(first_message)
        }

    # -- session and reads -------------------------------------------------------------------------------------------
    def opening(self, view: View, plan_only: bool = False) -> Step | None:
        return opening(view, plan_only, "member", loaded=_user(view) is not None)

    def prepare(self, view: View, request: Request) -> Step | None:
        rid = request.target["reservation_id"]
        res = _reservation(view, rid)
        if res is None:
            return "", ("get_reservation_details", {"reservation_id": rid})
        if request.kind == "compensation" and "error" not in res and _flight(view, res["flight_no"]) is None:
            return "", ("get_flight_status", {"flight_no": res["flight_no"]})
        return None

    # -- the write ---------------------------------------------------------------------------------------------------
    def write(self, view: View, request: Request, beliefs: Beliefs) -> Step:
        rid = request.target["reservation_id"]
        w = _Write(view, request, rid, _reservation(view, rid) or {}, _user(view) or {}, beliefs)
        write = _WRITES.get(request.kind)
        if write is None:
            raise ValueError(f"unknown airline request kind {request.kind}")
        return write(w)

    # -- what the agent says -----------------------------------------------------------------------------------------
    def give_up(self, request: Request) -> str:
        return f"I'm sorry, I could not complete the request for reservation {request.target['reservation_id']}."

    def summary(self, request: Request) -> str:
        return language.summary(request.kind, request.target["reservation_id"])


# -- the writes, one per request kind ------------------------------------------------------------------------------


@dataclass
class _Write:
    """What a write is built from: the request, its reservation and the member's account as read, the beliefs."""

    view: View
    r: Request
    rid: str
    res: dict
    user: dict
    beliefs: Beliefs

    def know(self, fact_id: str) -> object:
        """The value the agent follows for a rule, else the naive default."""
        follows, value = self.beliefs.get(fact_id, (False, None))
        return value if follows and value is not None else NAIVE[fact_id]


def _cancel(w: _Write) -> Step:
    res = w.res
    methods = w.user.get("payment_methods") or [{"id": res.get("payment_method_id", "")}]
    pm = res.get("payment_method_id", "") if w.know("refund_original") == "original" else methods[0]["id"]
    if res.get("fare") == "basic" and w.know("basic_credit") == "travel_credit":
        pm = "travel_credit"
    return "", (w.r.tool, {"reservation_id": w.rid, "refund_to": pm})


def _change(w: _Write) -> Step:
    res = w.res
    days = (days_before(res["date"]) + (TODAY - _today(w.view)).days) if res.get("date") else 99
    fee = F.change_fee(res.get("fare", ""), days, w.know("change_fee"), w.know("change_window"))
    return "", (w.r.tool, {"reservation_id": w.rid, "new_flight_no": w.r.data["new_flight_no"], "fee": fee})


def _bags(w: _Write) -> Step:
    d, res = w.r.data, w.res
    free = F.free_bags(
        w.user.get("tier", ""),
        res.get("fare", ""),
        len(res.get("passengers") or [1]),
        w.know("bag_allowance"),
        w.know("bag_business"),
    )
    fee = F.bag_total(d["bags"], free, w.know("bag_fee"))
    return "", (w.r.tool, {"reservation_id": w.rid, "bags": d["bags"], "free_bags": free, "fee": fee})


def _compensation(w: _Write) -> Step:
    flight = _flight(w.view, w.res.get("flight_no")) or {}
    amount = F.compensation(
        int(flight.get("delay_minutes", 0)), w.user.get("tier", ""), w.know("comp_rate"), w.know("comp_gold")
    )
    follows, form = w.beliefs.get("comp_form", (False, None))
    if not follows or form is None:  # not knowing the rule, it gives what the member asked for
        form = "cash" if w.r.data.get("cash") else "certificate"
    return "", (w.r.tool, {"reservation_id": w.rid, "amount": amount, "form": str(form)})


def _upgrade(w: _Write) -> Step:
    pm = w.res.get("payment_method_id", "")
    if w.know("upgrade_payment") == "credit_card":
        pm = next((m["id"] for m in w.user.get("payment_methods", []) if m["kind"] == "credit_card"), pm)
    return "", (w.r.tool, {"reservation_id": w.rid, "cabin": "business", "payment_method_id": pm})


def _name(w: _Write) -> Step:
    first, last = w.r.data["first_name"], w.r.data["last_name"]
    if w.know("name_upper") == "upper":
        first, last = first.upper(), last.upper()
    return "", (w.r.tool, {"reservation_id": w.rid, "first_name": first, "last_name": last})


_WRITES = {
    "cancel": _cancel,
    "change": _change,
    "bags": _bags,
    "compensation": _compensation,
    "upgrade": _upgrade,
    "name": _name,
}


# -- reading the results -------------------------------------------------------------------------------------------


def _today(v: View):
    from datetime import date

    m = TODAY_RE.search(v.policy)
    return date.fromisoformat(m.group(1)) if m else TODAY


def _user(v: View) -> dict | None:
    got = [r for _c, r in v.results("get_user_details") if "error" not in r]
    return got[-1] if got else None


def _reservation(v: View, rid: str) -> dict | None:
    return v.latest("get_reservation_details", "reservation_id", rid)


def _flight(v: View, flight_no: str | None) -> dict | None:
    return v.latest("get_flight_status", "flight_no", flight_no)
