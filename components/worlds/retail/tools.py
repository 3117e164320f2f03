"""The retail world's tools: preconditions, effects and receipts.

Reads never change the database. Writes check their preconditions and either apply their effect or return an error
receipt (the schema is `components.runtime.types.Receipt`). Error codes: `policy` (the call broke a rule of
`facts.FACTS`, written in the policy or not: the receipt carries its `rule_id` and `rule` text, and the message quotes
it; retrying correctly can work), `invalid_args` (retryable), `invalid_state` and `not_found` (the request cannot be
done: marked `blocking`).
"""

from __future__ import annotations

import copy
from typing import Any

from components.worlds.accounts import AccountTools
from components.worlds.retail.catalog import normalize_address
from components.worlds.retail import facts as F
from components.worlds.retail.facts import BY_ID

ADDRESS_PARAMS = {
    "address1": {"type": "string"},
    "city": {"type": "string"},
    "state": {"type": "string"},
    "zip": {"type": "string"},
}


def _fn(name: str, description: str, params: dict[str, Any], required: list[str]) -> dict:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": params, "required": required, "additionalProperties": False},
        },
    }


TOOLS: list[dict] = [
    _fn("find_user_id_by_email", "Find a customer's user id by email.", {"email": {"type": "string"}}, ["email"]),
    _fn(
        "get_user_details",
        "A customer's profile: name, address, payment methods, order ids.",
        {"user_id": {"type": "string"}},
        ["user_id"],
    ),
    _fn(
        "get_order_details",
        "An order: status, items, payment method, shipping address.",
        {"order_id": {"type": "string"}},
        ["order_id"],
    ),
    _fn(
        "get_product_variants",
        "A product's variants with their item ids, options, prices and availability.",
        {"product_id": {"type": "string"}},
        ["product_id"],
    ),
    _fn("validate_address", "Normalize a postal address.", ADDRESS_PARAMS, list(ADDRESS_PARAMS)),
    _fn(
        "cancel_pending_order",
        "Cancel a pending order and refund it.",
        {"order_id": {"type": "string"}, "reason": {"type": "string"}, "refund_amount": {"type": "number"}},
        ["order_id", "reason", "refund_amount"],
    ),
    _fn(
        "return_delivered_order_items",
        "Return items of a delivered order and refund them.",
        {
            "order_id": {"type": "string"},
            "item_ids": {"type": "array", "items": {"type": "string"}},
            "payment_method_id": {"type": "string"},
            "refund_amount": {"type": "number"},
        },
        ["order_id", "item_ids", "payment_method_id", "refund_amount"],
    ),
    _fn(
        "exchange_delivered_order_items",
        "Exchange items of a delivered order for other variants of the same product.",
        {
            "order_id": {"type": "string"},
            "item_ids": {"type": "array", "items": {"type": "string"}},
            "new_item_ids": {"type": "array", "items": {"type": "string"}},
            "exchange_fee": {"type": "number"},
        },
        ["order_id", "item_ids", "new_item_ids", "exchange_fee"],
    ),
    _fn(
        "modify_user_address",
        "Change the default address on a customer's account.",
        {"user_id": {"type": "string"}, **ADDRESS_PARAMS},
        ["user_id", *ADDRESS_PARAMS],
    ),
    _fn(
        "modify_pending_order_address",
        "Change the shipping address of a pending order.",
        {"order_id": {"type": "string"}, **ADDRESS_PARAMS, "reroute_fee": {"type": "number"}},
        ["order_id", *ADDRESS_PARAMS, "reroute_fee"],
    ),
    _fn(
        "issue_store_credit",
        "Grant a customer store credit for a late delivery of an order.",
        {"order_id": {"type": "string"}, "amount": {"type": "number"}, "payment_method_id": {"type": "string"}},
        ["order_id", "amount", "payment_method_id"],
    ),
    _fn(
        "transfer_to_human_agents",
        "Hand the conversation to a human agent; ends the conversation.",
        {"summary": {"type": "string"}},
        ["summary"],
    ),
]
READ_TOOLS = frozenset(
    {"find_user_id_by_email", "get_user_details", "get_order_details", "get_product_variants", "validate_address"}
)
WRITE_TOOLS = frozenset(
    {
        "cancel_pending_order",
        "return_delivered_order_items",
        "exchange_delivered_order_items",
        "modify_user_address",
        "modify_pending_order_address",
        "issue_store_credit",
    }
)
TERMINAL_TOOLS = frozenset({"transfer_to_human_agents"})
TOOL_NAMES = READ_TOOLS | WRITE_TOOLS | TERMINAL_TOOLS


class RetailTools(AccountTools):
    tool_names, write_tools, facts = TOOL_NAMES, WRITE_TOOLS, BY_ID

    def __init__(self, db: dict, facts=None):
        super().__init__(db)
        if facts is not None:  # a changed world's rules (its benchmark's meta.json "facts")
            self.facts = facts

    shared = "products"  # the catalog is never written (reads hand out copies)

    # -- helpers -------------------------------------------------------------------------------------------
    def _order(self, order_id: str):
        return self.db["orders"].get(order_id)

    # -- reads -----------------------------------------------------------------------------------------------
    def _t_get_order_details(self, order_id: str):
        o = self._order(order_id)
        if o is None:
            return self._fail("not_found", f"no order {order_id}", blocking=True)
        return True, None, copy.deepcopy(o)

    def _t_get_product_variants(self, product_id: str):
        p = self.db["products"].get(product_id)
        if p is None:
            return self._fail("not_found", f"no product {product_id}")
        return (
            True,
            None,
            {
                "product_id": product_id,
                "name": p["name"],
                "variants": [copy.deepcopy(v) for _, v in sorted(p["variants"].items())],
            },
        )

    def _t_validate_address(self, address1: str, city: str, state: str, zip: str):
        return True, None, {"normalized": normalize_address(address1, city, state, zip)}

    # -- writes ----------------------------------------------------------------------------------------------
    def _pending(self, order_id: str, verb: str, need: str = "pending"):
        o = self._order(order_id)
        if o is None:
            return None, self._fail("not_found", f"no order {order_id}", blocking=True)
        if o["status"] != need:
            return None, self._fail(
                "invalid_state", f"order {order_id} is {o['status']}; only {need} orders can be {verb}", blocking=True
            )
        return o, None

    def _t_cancel_pending_order(self, order_id: str, reason: str, refund_amount: float):
        o, err = self._pending(order_id, "cancelled")
        if err:
            return err
        if reason not in self.facts["cancel_reason"].value:
            if (no := self._breach("cancel_reason", f"reason {reason!r} refused.")) is not None:
                return no
        due = F.cancel_refund(o, self.facts["cancel_fee"].value)
        if not F.same_amount(refund_amount, due):
            if (no := self._breach("cancel_fee", f"refund amount {refund_amount!r} refused.")) is not None:
                return no
            due = refund_amount  # silent: what the agent passed is what happens
        o["status"] = "cancelled"
        o["cancel_reason"] = reason
        o["refund_amount"] = due
        return True, None, {"order_id": order_id, "status": "cancelled", "refunded": due}

    def _refund_to(self, order: dict) -> str:
        """Where the refund rule sends a return: the order's own method, or the account's first."""
        if self.facts["refund_original"].value == "original":
            return order["payment_method_id"]
        methods = self.db["users"].get(order["user_id"], {}).get("payment_methods") or [
            {"id": order["payment_method_id"]}
        ]
        return methods[0]["id"]

    def _method_kind(self, order: dict, method_id: str) -> str | None:
        user = self.db["users"].get(order["user_id"], {})
        return next((m["kind"] for m in user.get("payment_methods", []) if m["id"] == method_id), None)

    def _t_return_delivered_order_items(
        self, order_id: str, item_ids: list, payment_method_id: str, refund_amount: float
    ):
        o, err = self._pending(order_id, "returned", need="delivered")
        if err:
            return err
        have = [i["item_id"] for i in o["items"]]
        if not item_ids or any(i not in have for i in item_ids):
            return self._fail("invalid_args", f"items {item_ids} are not all in order {order_id}")
        if payment_method_id != self._refund_to(o):
            if (no := self._breach("refund_original", f"refund to {payment_method_id} refused.")) is not None:
                return no
        gift = self._method_kind(o, payment_method_id) == "gift_card"
        fee, bonus = self.facts["restocking_fee"].value, self.facts["gift_card_bonus"].value
        due = F.return_refund(o, item_ids, fee, bonus, gift)
        if not F.same_amount(refund_amount, due):
            # which rule the amount broke: the fee was right when it matches the amount before the bonus
            fee_right = gift and F.same_amount(refund_amount, F.return_refund(o, item_ids, fee, None, gift))
            if (
                no := self._breach(
                    "gift_card_bonus" if fee_right else "restocking_fee", f"refund amount {refund_amount!r} refused."
                )
            ) is not None:
                return no
            due = refund_amount
        o["status"] = "return requested"
        o["return"] = {"item_ids": sorted(item_ids), "payment_method_id": payment_method_id, "refund_amount": due}
        return (
            True,
            None,
            {"order_id": order_id, "status": "return requested", "refund_to": payment_method_id, "refunded": due},
        )

    def _t_exchange_delivered_order_items(self, order_id: str, item_ids: list, new_item_ids: list, exchange_fee: float):
        o, err = self._pending(order_id, "exchanged", need="delivered")
        if err:
            return err
        by_id = {i["item_id"]: i for i in o["items"]}
        if not item_ids or len(item_ids) != len(new_item_ids) or any(i not in by_id for i in item_ids):
            return self._fail("invalid_args", f"items {item_ids} / {new_item_ids} do not match order {order_id}")
        for old, new in zip(item_ids, new_item_ids):
            variants = self.db["products"][by_id[old]["product_id"]]["variants"]
            if new not in variants:
                return self._fail("invalid_args", f"{new} is not a variant of the same product as {old}")
            if not variants[new]["available"]:
                if (no := self._breach("exchange_available", f"item {new} is not available.")) is not None:
                    return no
        due = F.exchange_fee(o, len(item_ids), self.facts["exchange_fee"].value)
        if not F.same_amount(exchange_fee, due):
            if (no := self._breach("exchange_fee", f"exchange fee {exchange_fee!r} refused.")) is not None:
                return no
            due = exchange_fee
        o["status"] = "exchange requested"
        o["exchange"] = {"item_ids": list(item_ids), "new_item_ids": list(new_item_ids), "exchange_fee": due}
        return True, None, {"order_id": order_id, "status": "exchange requested"}

    def _t_modify_user_address(self, user_id: str, address1: str, city: str, state: str, zip: str):
        u = self.db["users"].get(user_id)
        if u is None:
            return self._fail("not_found", f"no user {user_id}", blocking=True)
        given = {"address1": address1, "city": city, "state": state, "zip": zip}
        if given != normalize_address(address1, city, state, zip):
            if (no := self._breach("user_address_validated", "address is not normalized.")) is not None:
                return no
        u["address"] = given
        return True, None, {"user_id": user_id, "address": u["address"]}

    def _t_modify_pending_order_address(
        self, order_id: str, address1: str, city: str, state: str, zip: str, reroute_fee: float
    ):
        o, err = self._pending(order_id, "re-addressed")
        if err:
            return err
        given = {"address1": address1, "city": city, "state": state, "zip": zip}
        if given != normalize_address(address1, city, state, zip):
            if (no := self._breach("address_validated", "address is not normalized.")) is not None:
                return no
        due = F.reroute_fee(o, self.facts["reroute_fee"].value)
        if not F.same_amount(reroute_fee, due):
            if (no := self._breach("reroute_fee", f"re-routing fee {reroute_fee!r} refused.")) is not None:
                return no
            due = reroute_fee
        o["address"] = given
        o["reroute_fee"] = due
        return True, None, {"order_id": order_id, "address": given, "reroute_fee": due}

    def _t_issue_store_credit(self, order_id: str, amount: float, payment_method_id: str):
        o, err = self._pending(order_id, "credited for a late delivery", need="delivered")
        if err:
            return err
        if o.get("days_late", 0) <= 0 or "credit" in o:
            return self._fail(
                "invalid_state", f"order {order_id} was not delivered late or is already credited", blocking=True
            )
        rate, cap = self.facts["credit_rate"].value, self.facts["credit_cap"].value
        due = F.credit_amount(o, rate, cap)
        if not F.same_amount(amount, due):
            # the rate was right when the amount is the uncapped per-day credit
            rate_right = F.same_amount(amount, F.credit_amount(o, rate, None))
            if (
                no := self._breach("credit_cap" if rate_right else "credit_rate", f"credit amount {amount!r} refused.")
            ) is not None:
                return no
            due = amount
        to_gift = self.facts["credit_gift_card"].value == "gift_card"
        if (
            (self._method_kind(o, payment_method_id) != "gift_card")
            if to_gift
            else payment_method_id != o["payment_method_id"]
        ):
            if (no := self._breach("credit_gift_card", f"credit to {payment_method_id} refused.")) is not None:
                return no
        o["credit"] = {"amount": due, "payment_method_id": payment_method_id}
        return True, None, {"order_id": order_id, "credited": due, "to": payment_method_id}

    def _t_transfer_to_human_agents(self, summary: str):
        return True, None, {"transferred": True}
