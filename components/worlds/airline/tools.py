"""The airline world's tools: preconditions, effects and receipts (docs/worlds.md, "Receipts").

Reads never change the database. A write checks its preconditions and either applies its effect or refuses:
  - a rule refusal (code `policy`): the call broke one of the facts; the receipt carries `rule_id` and the rule's text
    (`rule`), also for the rules policy.md does not state. Retrying with the rule applied can work.
  - a blocking refusal (`invalid_state`, `not_found`, `not_eligible`): the request cannot be done by anyone
    (`blocking: true`); external tasks are built to end here.
  - `invalid_args`: a malformed call, retryable.
"""

from __future__ import annotations

import copy
from typing import Any

from components.worlds.airline import facts as F
from components.worlds.airline.catalog import days_before
from components.worlds.accounts import AccountTools

MIN_DELAY = 180  # minutes: shorter delays are not compensated (a stated general rule; a blocking refusal)


def _fn(name: str, description: str, params: dict[str, Any], required: list[str]) -> dict:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": params, "required": required, "additionalProperties": False},
        },
    }


S, INT = {"type": "string"}, {"type": "integer"}
TOOLS: list[dict] = [
    _fn("find_user_id_by_email", "Find a member's user id by email.", {"email": S}, ["email"]),
    _fn(
        "get_user_details",
        "A member's profile: name, membership tier, payment methods, reservation ids.",
        {"user_id": S},
        ["user_id"],
    ),
    _fn(
        "get_reservation_details",
        "A reservation: flight, date, fare class, cabin, passengers, bags, payment method, status.",
        {"reservation_id": S},
        ["reservation_id"],
    ),
    _fn("get_flight_status", "A flight: route, date, status and delay in minutes.", {"flight_no": S}, ["flight_no"]),
    _fn(
        "cancel_reservation",
        "Cancel a booked reservation and refund it.",
        {"reservation_id": S, "refund_to": S},
        ["reservation_id", "refund_to"],
    ),
    _fn(
        "change_flight",
        "Move a booked reservation to another flight on the same route, charging a change fee.",
        {"reservation_id": S, "new_flight_no": S, "fee": INT},
        ["reservation_id", "new_flight_no", "fee"],
    ),
    _fn(
        "add_checked_bags",
        "Add checked bags to a booked reservation. `bags`: bags added; `free_bags`: the free "
        "allowance applied; `fee`: the total charged.",
        {"reservation_id": S, "bags": INT, "free_bags": INT, "fee": INT},
        ["reservation_id", "bags", "free_bags", "fee"],
    ),
    _fn(
        "issue_compensation",
        "Compensate a delayed flight on a reservation.",
        {"reservation_id": S, "amount": INT, "form": S},
        ["reservation_id", "amount", "form"],
    ),
    _fn(
        "upgrade_cabin",
        "Upgrade a booked reservation to the business cabin, charged to a payment method.",
        {"reservation_id": S, "cabin": S, "payment_method_id": S},
        ["reservation_id", "cabin", "payment_method_id"],
    ),
    _fn(
        "update_passenger_name",
        "Correct the name of a reservation's lead passenger.",
        {"reservation_id": S, "first_name": S, "last_name": S},
        ["reservation_id", "first_name", "last_name"],
    ),
    _fn(
        "transfer_to_human_agents",
        "Hand the conversation to a human agent; ends the conversation.",
        {"summary": S},
        ["summary"],
    ),
]
READ_TOOLS = frozenset({"find_user_id_by_email", "get_user_details", "get_reservation_details", "get_flight_status"})
WRITE_TOOLS = frozenset(
    {
        "cancel_reservation",
        "change_flight",
        "add_checked_bags",
        "issue_compensation",
        "upgrade_cabin",
        "update_passenger_name",
    }
)
TERMINAL_TOOLS = frozenset({"transfer_to_human_agents"})
TOOL_NAMES = READ_TOOLS | WRITE_TOOLS | TERMINAL_TOOLS
TARGETS = {t: ["reservation_id"] for t in sorted(WRITE_TOOLS)}  # what each write acts on (meta.json "targets")


def _int(x: Any) -> int | None:
    if isinstance(x, bool):
        return None
    if isinstance(x, int):
        return x
    if isinstance(x, float) and x.is_integer():
        return int(x)
    if isinstance(x, str) and x.strip().lstrip("-").isdigit():
        return int(x.strip())
    return None


class AirlineTools(AccountTools):
    tool_names, write_tools, facts = TOOL_NAMES, WRITE_TOOLS, F.BY_ID
    shared = "flights"  # flights are never written

    def __init__(self, db: dict, facts=None):
        super().__init__(db)
        if facts is not None:  # a variant's rules (its benchmark's meta.json "rules")
            self.facts = facts

    def _v(self, fid: str) -> object:
        return self.facts[fid].value

    def _booked(self, rid: str, verb: str, need: str = "booked"):
        r = self.db["reservations"].get(rid)
        if r is None:
            return None, self._fail("not_found", f"no reservation {rid}", blocking=True)
        if r["status"] != need:
            return None, self._fail(
                "invalid_state",
                f"reservation {rid} is {r['status']}; only {need} reservations can be {verb}",
                blocking=True,
            )
        return r, None

    def _tier(self, r: dict) -> str:
        return self.db["users"][r["user_id"]]["tier"]

    # -- reads -----------------------------------------------------------------------------------------------------
    def _t_get_reservation_details(self, reservation_id: str):
        r = self.db["reservations"].get(reservation_id)
        if r is None:
            return self._fail("not_found", f"no reservation {reservation_id}", blocking=True)
        return True, None, copy.deepcopy(r)

    def _t_get_flight_status(self, flight_no: str):
        f = self.db["flights"].get(flight_no)
        if f is None:
            return False, "not_found", {"error": f"no flight {flight_no}"}
        return True, None, copy.deepcopy(f)

    # -- writes ----------------------------------------------------------------------------------------------------
    def _t_cancel_reservation(self, reservation_id: str, refund_to: str):
        r, err = self._booked(reservation_id, "cancelled")
        if err:
            return err
        methods = self.db["users"][r["user_id"]]["payment_methods"]
        own = r["payment_method_id"] if self._v("refund_original") == "original" else methods[0]["id"]
        if r["fare"] == "basic" and self._v("basic_credit") == "travel_credit":
            if refund_to != "travel_credit":
                no = self._breach("basic_credit", f"refund of basic fare {reservation_id} to {refund_to} refused.")
                if no is not None:
                    return no
        elif refund_to != own:
            rule = "basic_credit" if r["fare"] == "basic" and refund_to == "travel_credit" else "refund_original"
            if (no := self._breach(rule, f"refund to {refund_to} refused.")) is not None:
                return no
        r["status"] = "cancelled"
        r["refund_to"] = refund_to
        return True, None, {"reservation_id": reservation_id, "status": "cancelled", "refund_to": refund_to}

    def _t_change_flight(self, reservation_id: str, new_flight_no: str, fee: Any):
        r, err = self._booked(reservation_id, "changed")
        if err:
            return err
        if r["fare"] == "basic":
            return self._fail(
                "invalid_state",
                f"reservation {reservation_id} is a basic fare; basic fares cannot be changed",
                blocking=True,
            )
        new = self.db["flights"].get(new_flight_no)
        if new is None or (new["origin"], new["destination"]) != (r["origin"], r["destination"]):
            route = f"{r['origin']}-{r['destination']}"
            return False, "invalid_args", {"error": f"{new_flight_no} is not a flight on {route}"}
        fee_i = _int(fee)
        if fee_i is None:
            return False, "invalid_args", {"error": f"fee {fee!r} is not a whole number of dollars"}
        days = days_before(r["date"])
        want = F.change_fee(r["fare"], days, self._v("change_fee"), self._v("change_window"))
        if fee_i != want:
            base = F.change_fee(r["fare"], days, self._v("change_fee"), None)
            rule = "change_window" if base != want and fee_i == base else "change_fee"
            if (no := self._breach(rule, f"change fee {fee_i} refused.")) is not None:
                return no
        r.update(flight_no=new["flight_no"], date=new["date"], change_fee=fee_i)
        return (
            True,
            None,
            {
                "reservation_id": reservation_id,
                "flight_no": new["flight_no"],
                "date": new["date"],
                "fee_charged": fee_i,
            },
        )

    def _t_add_checked_bags(self, reservation_id: str, bags: Any, free_bags: Any, fee: Any):
        r, err = self._booked(reservation_id, "given bags")
        if err:
            return err
        n, free, fee_i = _int(bags), _int(free_bags), _int(fee)
        if n is None or n < 1 or free is None or free < 0 or fee_i is None:
            return False, "invalid_args", {"error": "bags must be >= 1; free_bags and fee whole numbers"}
        tier, pax = self._tier(r), len(r["passengers"])
        allowance, business = self._v("bag_allowance"), self._v("bag_business")
        want_free = F.free_bags(tier, r["fare"], pax, allowance, business)
        if free != want_free:
            tier_only = F.free_bags(tier, r["fare"], pax, allowance, 0)
            rule = "bag_business" if r["fare"] == "business" and free == tier_only else "bag_allowance"
            if (no := self._breach(rule, f"free allowance {free} refused.")) is not None:
                return no
        want_fee = F.bag_total(n, want_free, self._v("bag_fee"))
        if fee_i != want_fee:
            if (no := self._breach("bag_fee", f"bag fee {fee_i} refused.")) is not None:
                return no
        r["bags"] += n
        r["bag_fee"] = r.get("bag_fee", 0) + fee_i
        return True, None, {"reservation_id": reservation_id, "bags": r["bags"], "fee_charged": fee_i}

    def _t_issue_compensation(self, reservation_id: str, amount: Any, form: str):
        r = self.db["reservations"].get(reservation_id)
        if r is None:
            return self._fail("not_found", f"no reservation {reservation_id}", blocking=True)
        if r.get("compensation"):
            return self._fail("invalid_state", f"reservation {reservation_id} was already compensated", blocking=True)
        delay = self.db["flights"][r["flight_no"]]["delay_minutes"]
        if delay < MIN_DELAY:
            return self._fail(
                "not_eligible",
                f"flight {r['flight_no']} was delayed {delay} minutes; only delays "
                f"of {MIN_DELAY // 60} hours or more are compensated",
                blocking=True,
            )
        amt = _int(amount)
        if amt is None:
            return False, "invalid_args", {"error": f"amount {amount!r} is not a whole number of dollars"}
        if form != self._v("comp_form"):
            if (no := self._breach("comp_form", f"compensation as {form!r} refused.")) is not None:
                return no
        tier = self._tier(r)
        want = F.compensation(delay, tier, self._v("comp_rate"), self._v("comp_gold"))
        if amt != want:
            plain = F.compensation(delay, tier, self._v("comp_rate"), 1)
            rule = "comp_gold" if tier == "gold" and amt == plain else "comp_rate"
            if (no := self._breach(rule, f"amount {amt} refused.")) is not None:
                return no
        r["compensation"] = {"amount": amt, "form": form}
        return True, None, {"reservation_id": reservation_id, "compensation": amt, "form": form}

    def _t_upgrade_cabin(self, reservation_id: str, cabin: str, payment_method_id: str):
        r, err = self._booked(reservation_id, "upgraded")
        if err:
            return err
        if r["fare"] == "basic":
            return self._fail(
                "invalid_state",
                f"reservation {reservation_id} is a basic fare; basic fares cannot be upgraded",
                blocking=True,
            )
        if cabin != "business":
            return False, "invalid_args", {"error": f"cabin {cabin!r}: only 'business' is an upgrade"}
        methods = {m["id"]: m["kind"] for m in self.db["users"][r["user_id"]]["payment_methods"]}
        if payment_method_id not in methods:
            return False, "invalid_args", {"error": f"{payment_method_id} is not a payment method of the account"}
        if (
            (methods[payment_method_id] != "credit_card")
            if self._v("upgrade_payment") == "credit_card"
            else payment_method_id != r["payment_method_id"]
        ):
            if (no := self._breach("upgrade_payment", f"payment with {payment_method_id} refused.")) is not None:
                return no
        r["cabin"] = "business"
        r["upgrade_paid_with"] = payment_method_id
        return True, None, {"reservation_id": reservation_id, "cabin": "business", "charged_to": payment_method_id}

    def _t_update_passenger_name(self, reservation_id: str, first_name: str, last_name: str):
        r, err = self._booked(reservation_id, "renamed")
        if err:
            return err
        if self._v("name_upper") == "upper" and (first_name != first_name.upper() or last_name != last_name.upper()):
            if (no := self._breach("name_upper", f"name {first_name} {last_name} refused.")) is not None:
                return no
        r["passengers"][0] = {"first_name": first_name, "last_name": last_name}
        return True, None, {"reservation_id": reservation_id, "passenger": r["passengers"][0]}

    def _t_transfer_to_human_agents(self, summary: str):
        return True, None, {"transferred": True}
