"""Retail task families, their rubrics, the written policy, and materialization to files.

Families, by horizon: `cancel` (one pending order), `return` (delivered items, refund to the original payment),
`exchange` (a variant of the same product), `address` (account address, then the pending orders' shipping address),
`credit` (store credit for a late delivery), `multi` (three or four requests in one conversation). Some tasks are
impossible by construction (the order is in the wrong state, the customer's email matches no account): no memory can
fix them. The ages and payment methods are drawn so that each fact decides a good share of its family's requests
(a fee is due in a third to three fifths of them, a gift card paid two fifths of the returns, ...), and the
rubric's request criteria hold the amounts the facts' true values give.
"""

from __future__ import annotations

import math
import random

from components.worlds.base import Criterion, Task
from components.worlds.retail import language
from components.worlds.retail.catalog import make_address, make_catalog, make_order, make_user, normalize_address
from components.worlds.retail import facts as F
from components.worlds.retail.facts import BY_ID
from components.worlds.retail.rules import REASONS
from components.worlds.retail.tools import WRITE_TOOLS

FAMILIES = {"cancel": 36, "return": 36, "exchange": 36, "address": 36, "multi": 36, "credit": 36}
EXTERNAL_EVERY = 9  # every 9th task of every family but multi is impossible
REQUEST_WEIGHT = 3.0


def _ages(fee, lo: int, span: float, default: int) -> tuple[int, int]:
    """The ages a request's order is drawn from: from `lo` to `span` times the fee's threshold (a fee is then due in
    a good share of the requests, whichever its direction); no threshold: up to `default`."""
    if fee.when is None:
        return lo, default
    return lo, max(lo + 6, round(fee.when.value * span))


def _days_late(rate, cap, naive) -> tuple[int, ...]:
    """Days late to draw from: every count below the cap where the naive flat credit is not right by chance, and
    two above it (where the cap decides)."""
    if cap is None or (isinstance(cap, float) and math.isinf(cap)):
        return tuple(d for d in range(1, 9) if rate * d != naive)
    k = math.floor(cap / rate)
    return tuple(d for d in range(1, k + 1) if rate * d != naive) + (k + 1, k + 3)


# policy sections and the writes whose stated rules they hold; rules with `stated=False` are not written down
SECTIONS = (
    ("Cancellations", "cancel_pending_order"),
    ("Returns", "return_delivered_order_items"),
    ("Exchanges", "exchange_delivered_order_items"),
    ("Shipping addresses", "modify_pending_order_address"),
    ("Late deliveries", "issue_store_credit"),
)


def policy_text(facts=None) -> str:
    """The written policy; `facts`: a changed world's rules (default: the world's own)."""
    facts = (facts or BY_ID).values()
    sections = "\n\n".join(
        f"## {title}\n" + "\n".join(f.statement for f in facts if f.tool == tool and f.stated)
        for title, tool in SECTIONS
    )
    writes = ", ".join(f"`{t}`" for t in sorted(WRITE_TOOLS))
    return f"""# Retail customer-service policy

You help customers of an online store with their orders and account. Use the tools; never invent data.

## General rules
- Authenticate first: find the customer's user id with `find_user_id_by_email`, then read their profile with
  `get_user_details`. If no account matches and the customer has no other email, use `transfer_to_human_agents`.
- Before every write ({writes}), call `confirm` with that tool, the arguments that identify what it acts on
  and a one-line summary; make the write only if the customer confirmed it. A confirmation covers one write.
- One write per request; never change anything the customer did not ask for.
- Only pending orders can be cancelled or re-addressed; only delivered orders can be returned, exchanged or
  credited for a late delivery.
- Call `finish` only when every request has a receipt from a tool, or cannot be done.

{sections}
"""


class _Builder:
    def __init__(self, seed: int, facts=None):
        self.facts = facts or BY_ID  # the amounts the rubric holds come from these rules' values
        self.rng = random.Random(seed)
        # what the deeper world added (ages, gift cards, late days) draws from its own stream: the orders, users and
        # requests of the first five families stay those of the same seed before it
        self.extra = random.Random(seed * 104729 + 3)
        self.products = make_catalog(self.rng)
        self.users: dict[str, dict] = {}
        self.orders: dict[str, dict] = {}
        self._uids: set[str] = set()
        self._oids: set[str] = set()

    def user(self) -> dict:
        u = make_user(self.rng, self._uids)
        self.users[u["user_id"]] = u
        for _ in range(self.rng.randint(1, 2)):  # orders the task does not concern
            self.order(u, self.rng.choice(("delivered", "pending", "processed")))
        return u

    def order(self, user: dict, status: str, n_items: int | None = None, pm: str | None = None) -> dict:
        o = make_order(
            self.rng, user, self.products, status, n_items or self.rng.randint(1, 3), self._oids, pm, self.extra
        )
        self.orders[o["order_id"]] = o
        return o

    # -- one request of each kind; `possible=False` puts the order in a state that forbids it ---------------
    def cancel(self, user: dict, possible: bool = True) -> dict:
        o = self.order(user, "pending" if possible else "delivered")
        fee = self.facts["cancel_fee"].value
        if possible:  # the cancellation fee is due in about two fifths
            o["placed_hours_ago"] = self.extra.randint(*_ages(fee, 2, 5 / 3, 40))
        allowed = self.facts["cancel_reason"].value
        phrase = self.rng.choice(sorted(p for r in allowed for p in REASONS[r]))
        return {
            "kind": "cancel",
            "order_id": o["order_id"],
            "reason_phrase": phrase,
            "reason": F.reason_of(phrase),
            "refund_amount": F.cancel_refund(o, fee) if possible else None,
        }

    def return_(self, user: dict, possible: bool = True) -> dict:
        others = user["payment_methods"][1:]  # not the account's first method
        gift = [m["id"] for m in others if m["kind"] == "gift_card"]
        n_items = self.rng.randint(2, 3)
        pm = self.rng.choice([m["id"] for m in others])
        if gift and self.extra.random() < 0.2:  # raise the share of gift-card orders to about two fifths
            pm = gift[0]
        o = self.order(user, "delivered" if possible else "processed", n_items, pm)
        items = self.rng.sample(o["items"], k=self.rng.randint(1, len(o["items"]) - 1))
        ids = sorted(i["item_id"] for i in items)
        due = None
        to = (
            o["payment_method_id"]
            if self.facts["refund_original"].value == "original"
            else user["payment_methods"][0]["id"]
        )  # where the rule refunds: the order's method, or the account's first
        if possible:  # the restocking fee is due in about two fifths
            fee = self.facts["restocking_fee"].value
            o["delivered_days_ago"] = self.extra.randint(*_ages(fee, 3, 5 / 3, 50))
            to_gift = any(m["id"] == to and m["kind"] == "gift_card" for m in user["payment_methods"])
            due = F.return_refund(o, ids, fee, self.facts["gift_card_bonus"].value, to_gift)
        return {
            "kind": "return",
            "order_id": o["order_id"],
            "item_ids": ids,
            "item_names": [i["name"] for i in items],
            "payment_method_id": to,
            "refund_amount": due,
        }

    def exchange(self, user: dict, possible: bool = True) -> dict:
        while True:
            o = self.order(user, "delivered" if possible else "processed", 1)
            item = o["items"][0]
            variants = self.products[item["product_id"]]["variants"]
            others = [v for k, v in sorted(variants.items()) if k != item["item_id"]]
            gone = [v for v in others if not v["available"]]
            there = [v for v in others if v["available"]]
            if gone and there:
                want, alt = self.rng.choice(gone), self.rng.choice(there)
                fee = None
                if possible:  # on either side of the fee's threshold in about half
                    rule = self.facts["exchange_fee"].value
                    o["delivered_days_ago"] = (
                        self.extra.randint(*_ages(rule, 3, 2, 26))
                        if rule.when is None
                        else self.extra.randint(3, max(9, 2 * rule.when.value - 2))
                    )
                    fee = F.exchange_fee(o, 1, rule)
                return {
                    "kind": "exchange",
                    "order_id": o["order_id"],
                    "item_ids": [item["item_id"]],
                    "product_name": item["name"],
                    "want": want["options"],
                    "alt": alt["options"],
                    "new_item_ids": [alt["item_id"]],
                    "exchange_fee": fee,
                }
            user["orders"].remove(o["order_id"])
            del self.orders[o["order_id"]]

    def order_address(self, user: dict, address: dict | None = None) -> dict:
        o = self.order(user, "pending")
        fee = self.facts["reroute_fee"].value
        o["placed_hours_ago"] = self.extra.randint(*_ages(fee, 2, 5 / 3, 80))  # the fee is due in about two fifths
        return {
            "kind": "order_address",
            "order_id": o["order_id"],
            "address": address or make_address(self.rng),
            "reroute_fee": F.reroute_fee(o, fee),
        }

    def credit(self, user: dict, possible: bool = True) -> dict:
        if not any(m["kind"] == "gift_card" for m in user["payment_methods"]):
            gid = f"gift_card_{self.extra.randint(10**6, 10**7 - 1)}"
            user["payment_methods"].append({"id": gid, "kind": "gift_card"})
        gift = next(m["id"] for m in user["payment_methods"] if m["kind"] == "gift_card")
        paid = [m["id"] for m in user["payment_methods"] if m["kind"] != "gift_card"]
        pm = gift if self.extra.random() < 0.4 else self.extra.choice(paid)  # a gift-card order needs no redirect
        o = self.order(user, "delivered" if possible else "processed", None, pm)
        rate, cap = self.facts["credit_rate"].value, self.facts["credit_cap"].value
        o["days_late"] = self.extra.choice(_days_late(rate, cap, F.NAIVE_CREDIT))
        to = gift if self.facts["credit_gift_card"].value == "gift_card" else pm
        return {
            "kind": "credit",
            "order_id": o["order_id"],
            "payment_method_id": to,
            "amount": F.credit_amount(o, rate, cap),
        }


def _criterion(i: int, req: dict, user: dict) -> Criterion:
    kind = req["kind"]
    desc = language.request_sentence(req)
    if kind == "cancel":
        return Criterion(
            id=f"req{i}",
            weight=REQUEST_WEIGHT,
            check="order_cancelled",
            desc=desc,
            args={"order_id": req["order_id"], "refund_amount": req["refund_amount"]},
        )
    if kind == "return":
        return Criterion(
            id=f"req{i}",
            weight=REQUEST_WEIGHT,
            check="order_returned",
            desc=desc,
            args={k: req[k] for k in ("order_id", "item_ids", "payment_method_id", "refund_amount")},
        )
    if kind == "exchange":
        return Criterion(
            id=f"req{i}",
            weight=REQUEST_WEIGHT,
            check="order_exchanged",
            desc=desc,
            args={k: req[k] for k in ("order_id", "item_ids", "new_item_ids", "exchange_fee")},
        )
    if kind == "credit":
        return Criterion(
            id=f"req{i}",
            weight=REQUEST_WEIGHT,
            check="store_credit_issued",
            desc=desc,
            args={k: req[k] for k in ("order_id", "amount", "payment_method_id")},
        )
    if kind == "user_address":
        return Criterion(
            id=f"req{i}",
            weight=REQUEST_WEIGHT,
            check="user_address_is",
            desc=desc,
            args={"user_id": user["user_id"], "address": normalize_address(**req["address"])},
        )
    return Criterion(
        id=f"req{i}",
        weight=REQUEST_WEIGHT,
        check="order_address_is",
        desc=desc,
        args={
            "order_id": req["order_id"],
            "address": normalize_address(**req["address"]),
            "reroute_fee": req["reroute_fee"],
        },
    )


def generate(seed: int, per_family: int | None = None, facts=None) -> tuple[dict, list[Task]]:
    """The database and the tasks for a seed (`per_family` tasks of each family, 36 by default)."""
    b = _Builder(seed, facts)
    tasks: list[Task] = []
    for family, count in FAMILIES.items():
        for k in range(per_family or count):
            u = b.user()
            possible = not (family != "multi" and k % EXTERNAL_EVERY == EXTERNAL_EVERY - 1)
            email = u["email"]
            if family == "cancel":
                reqs = [b.cancel(u, possible)]
            elif family == "return":
                reqs = [b.return_(u, possible)]
            elif family == "exchange":
                reqs = [b.exchange(u, possible)]
            elif family == "credit":
                reqs = [b.credit(u, possible)]
            elif family == "address":
                new = make_address(b.rng)
                reqs = [{"kind": "user_address", "address": new}]
                reqs += [b.order_address(u, new) for _ in range(b.rng.randint(1, 2))]
                if not possible:  # the customer gives an email that matches no account
                    email = email.replace("@", ".old@")
            else:
                kinds = b.rng.sample(
                    ["cancel", "return", "exchange", "order_address", "credit"], k=b.rng.choice((2, 3))
                )
                kinds.append(b.rng.choice(kinds))  # a repeated kind: two writes through the same tool
                b.rng.shuffle(kinds)
                make = {
                    "cancel": b.cancel,
                    "return": b.return_,
                    "exchange": b.exchange,
                    "order_address": b.order_address,
                    "credit": b.credit,
                }
                reqs = [make[kd](u) for kd in kinds]
            rubric = [_criterion(i + 1, r, u) for i, r in enumerate(reqs)]
            rubric.append(
                Criterion(
                    id="confirmed",
                    weight=1.0,
                    check="writes_confirmed",
                    desc="every write was confirmed by the customer first",
                )
            )
            rubric.append(
                Criterion(
                    id="no_extra_writes",
                    weight=1.0,
                    check="only_requested_writes",
                    desc="no write the customer did not ask for",
                    args={"targets": sorted({r.get("order_id") or u["user_id"] for r in reqs})},
                )
            )
            tasks.append(
                Task(
                    id=f"retail-{family}-{k:03d}",
                    family=family,
                    user_id=u["user_id"],
                    first_message=language.first_message(u["name"], email, reqs),
                    requests=reqs,
                    rubric=rubric,
                    possible=possible,
                )
            )
    db = {"products": b.products, "users": b.users, "orders": b.orders}
    return db, tasks


def gold_of(task: Task, facts=None) -> list[dict]:
    """The writes a correct agent makes for `task` (its gold actions, train items only are written): one per request,
    in the customer's order; none for an impossible task."""
    if not task.possible:
        return []
    out = []
    for r in task.requests:
        kind = r["kind"]
        if kind == "cancel":
            args = {"order_id": r["order_id"], "reason": r["reason"], "refund_amount": r["refund_amount"]}
        elif kind == "return":
            args = {k: r[k] for k in ("order_id", "item_ids", "payment_method_id", "refund_amount")}
        elif kind == "exchange":
            args = {k: r[k] for k in ("order_id", "item_ids", "new_item_ids", "exchange_fee")}
        elif kind == "credit":
            args = {k: r[k] for k in ("order_id", "amount", "payment_method_id")}
        elif kind == "user_address":
            args = {"user_id": task.user_id, **normalize_address(**r["address"])}
        else:
            args = {"order_id": r["order_id"], **normalize_address(**r["address"]), "reroute_fee": r["reroute_fee"]}
        out.append({"tool": language.TOOL_OF[kind], "args": args})
    return out
