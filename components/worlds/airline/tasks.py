"""Airline task families, their rubrics, the written policy, and materialization to files.

Families: `cancel` (refund route by fare), `change` (fee by fare class and days before departure), `bags` (free
allowance by tier and fare, fee per extra bag), `compensation` (amount by delay and tier, paid as a certificate),
`upgrade` (paid by credit card), `name` (passenger name as on the passport), and `multi` (three to five requests in
one conversation). Every 9th task of a single-request family is impossible by construction (a flown reservation, a
basic fare that cannot be changed or upgraded, a delay too short to compensate, an email that matches no account):
it ends in a blocking refusal and no memory can fix it.
"""

from __future__ import annotations

import random

from components.worlds.airline import facts as F
from components.worlds.airline import language
from components.worlds.airline.catalog import AIRPORTS, TODAY, make_flight, make_reservation, make_user
from components.worlds.airline.tools import MIN_DELAY, WRITE_TOOLS
from components.worlds.base import Criterion, Task

FAMILIES = {"cancel": 30, "change": 30, "bags": 30, "compensation": 30, "upgrade": 30, "name": 30, "multi": 30}
EXTERNAL_EVERY = 9
BAG_FOCUS = ("fee", "allowance", "business")  # single-request tasks where one rule on the write decides it
COMP_FOCUS = ("rate", "gold", "form")
KINDS = ("cancel", "change", "bags", "compensation", "upgrade", "name")
# a request settles most of the reward; money-moving requests weigh more (a wrong fee or amount costs the customer)
REQUEST_WEIGHT = {"cancel": 4.0, "change": 5.0, "bags": 5.0, "compensation": 5.0, "upgrade": 4.0, "name": 3.0}
CONFIRM_WEIGHT, EXTRA_WEIGHT = 1.0, 1.0


# policy sections: their rules in order (a rule the data marks `unstated` is left out), and a line before them
SECTIONS = (
    ("Cancellations", ("refund_original", "basic_credit"), ""),
    ("Flight changes", ("change_fee", "change_window"), ""),
    ("Checked bags", ("bag_allowance", "bag_fee", "bag_business"), ""),
    ("Delay compensation", ("comp_rate", "comp_gold", "comp_form"), "Look up the delay with `get_flight_status`.\n"),
    ("Upgrades", ("upgrade_payment",), ""),
    ("Passenger names", ("name_upper",), ""),
)


def policy_text(facts=None) -> str:
    """The written policy; `facts`: a variant's rules (default: the world's own)."""
    facts = facts or F.BY_ID
    writes = ", ".join(f"`{t}`" for t in sorted(WRITE_TOOLS))
    sections = "\n\n".join(
        f"## {title}\n{lead}" + "\n".join(facts[r].statement for r in ids if facts[r].stated)
        for title, ids, lead in SECTIONS
    )
    return f"""# Airline customer-service policy

You help members of an airline with their reservations. Use the tools; never invent data. Today is
{TODAY.isoformat()}.

## General rules
- Authenticate first: find the member's user id with `find_user_id_by_email`, then read their profile with
  `get_user_details`. If no account matches and the member has no other email, use `transfer_to_human_agents`.
- Read a reservation with `get_reservation_details` before acting on it.
- Before every write ({writes}), get the member's explicit confirmation of that action.
- One write per request; never change anything the member did not ask for.
- Only booked reservations can be cancelled, changed, upgraded, renamed or given bags. Basic fares can be neither
  changed nor upgraded. Delays shorter than {MIN_DELAY // 60} hours are not compensated.
- Call `finish` only when every request has a receipt from a tool, or cannot be done.

{sections}
"""


class _Builder:
    def __init__(self, seed: int, facts=None):
        self.facts = facts or F.BY_ID  # the values the rubric holds come from these rules
        self.rng = random.Random(seed)
        self.users: dict[str, dict] = {}
        self.flights: dict[str, dict] = {}
        self.reservations: dict[str, dict] = {}
        self._uids: set[str] = set()
        self._fnos: set[str] = set()
        self._rids: set[str] = set()

    def user(self, tier: str | None = None, kinds: list[str] | None = None) -> dict:
        rng = self.rng
        tier = tier or rng.choice(("regular", "regular", "silver", "gold"))
        kinds = kinds or rng.sample(["credit_card", "gift_card", "certificate"], k=rng.choice((2, 3)))
        u = make_user(rng, self._uids, tier, kinds)
        self.users[u["user_id"]] = u
        for _ in range(rng.randint(1, 2)):  # reservations the task does not concern
            self.reservation(u, rng.choice(("economy", "flex", "basic")), offset=rng.randint(3, 40))
        return u

    def flight(
        self, offset: int, route: tuple[str, str] | None = None, status: str = "scheduled", delay: int = 0
    ) -> dict:
        route = route or tuple(self.rng.sample(AIRPORTS, 2))
        f = make_flight(self.rng, self._fnos, route[0], route[1], offset, status, delay)
        self.flights[f["flight_no"]] = f
        return f

    def reservation(
        self,
        u: dict,
        fare: str,
        offset: int,
        pax: int = 1,
        pm: str | None = None,
        status: str = "booked",
        delay: int = 0,
    ) -> dict:
        f = self.flight(offset, status="landed" if offset < 0 else "scheduled", delay=delay)
        pm = pm or self.rng.choice(u["payment_methods"])["id"]
        r = make_reservation(self.rng, self._rids, u, f, fare, pax, pm, status)
        self.reservations[r["reservation_id"]] = r
        return r

    # -- one request of each kind; `possible=False` builds the state that forbids it -------------------------------
    def cancel(self, u: dict, possible: bool = True) -> dict:
        rng = self.rng
        fare = rng.choice(("basic", "economy", "economy", "flex", "business"))
        others = [m["id"] for m in u["payment_methods"][1:]]  # never the account's first method
        r = self.reservation(
            u,
            fare,
            rng.randint(2, 30) if possible else -rng.randint(2, 20),
            pm=rng.choice(others),
            status="booked" if possible else "flown",
        )
        refund = (
            r["payment_method_id"]
            if self.facts["refund_original"].value == "original"
            else u["payment_methods"][0]["id"]
        )
        if fare == "basic" and self.facts["basic_credit"].value == "travel_credit":
            refund = "travel_credit"
        return {
            "kind": "cancel",
            "reservation_id": r["reservation_id"],
            "reason": rng.choice(language.CANCEL_REASONS),
            "fare": fare,
            "refund_to": refund,
        }

    def change(self, u: dict, possible: bool = True) -> dict:
        rng = self.rng
        fare = rng.choice(("economy", "economy", "flex", "flex", "business")) if possible else "basic"
        window = self.facts["change_window"].value
        days = rng.randint(2, 2 * window.when.value if window.applies else 14)  # either side of the window
        r = self.reservation(u, fare, days, pax=rng.randint(1, 2))
        new = self.flight(days + rng.randint(1, 10), (r["origin"], r["destination"]))
        fee = F.change_fee(fare, days, self.facts["change_fee"].value, window)
        return {
            "kind": "change",
            "reservation_id": r["reservation_id"],
            "new_flight_no": new["flight_no"],
            "new_date": new["date"],
            "fare": fare,
            "days": days,
            "fee": fee,
        }

    def bags(self, u: dict, possible: bool = True, focus: str | None = None) -> dict:
        """`focus` (the bags family cycles through them) picks the case where that one rule decides the write:
        `fee` a silver member (whose allowance an agent guesses right) with bags beyond it, `allowance` a gold
        member within the allowance, `business` a silver member on a business fare within it. A multi task's
        bags request is drawn at random, where the rules combine."""
        rng = self.rng
        fare = {"business": "business", None: rng.choice(("economy", "flex", "business", "business"))}.get(
            focus, rng.choice(("economy", "flex"))
        )
        pax = rng.randint(1, 2)
        r = self.reservation(
            u,
            fare,
            rng.randint(2, 30) if possible else -rng.randint(2, 20),
            pax=pax,
            status="booked" if possible else "flown",
        )
        free = F.free_bags(u["tier"], fare, pax, self.facts["bag_allowance"].value, self.facts["bag_business"].value)
        n = free + (rng.randint(1, 2) if focus in (None, "fee") else 0)  # beyond the allowance: the fee matters
        n = max(n, 1)
        fee = F.bag_total(n, free, self.facts["bag_fee"].value)
        return {"kind": "bags", "reservation_id": r["reservation_id"], "bags": n, "free_bags": free, "fee": fee}

    def compensation(self, u: dict, possible: bool = True, focus: str | None = None) -> dict:
        """`focus` (the compensation family cycles through them) picks the case where that one rule decides the
        write: `rate` a long delay (the upper band), `gold` a gold member, `form` a member who asks for cash."""
        rng = self.rng
        rate = self.facts["comp_rate"].value
        top = max(MIN_DELAY, 60 * rate[-1][0])  # the highest band's delay, in minutes
        if not possible:
            delay = rng.randrange(40, MIN_DELAY - 10, 5)
        elif focus is None:
            delay = rng.randrange(MIN_DELAY, top + 130, 5)
        else:  # `rate`: the highest band; the others below it
            delay = (
                rng.randrange(top, top + 130, 5)
                if focus == "rate"
                else rng.randrange(MIN_DELAY, max(MIN_DELAY + 5, top - 5), 5)
            )
        r = self.reservation(
            u, rng.choice(("basic", "economy", "flex", "business")), -rng.randint(1, 20), status="flown", delay=delay
        )
        amount = F.compensation(delay, u["tier"], rate, self.facts["comp_gold"].value)
        form = self.facts["comp_form"].value
        return {
            "kind": "compensation",
            "reservation_id": r["reservation_id"],
            "amount": amount,
            "form": form,
            "cash": focus == "form" if focus else rng.random() < 0.5,
        }  # asked for cash: only the rule says no

    def upgrade(self, u: dict, possible: bool = True) -> dict:
        rng = self.rng
        card = next(m["id"] for m in u["payment_methods"] if m["kind"] == "credit_card")
        others = [m["id"] for m in u["payment_methods"] if m["kind"] != "credit_card"]
        r = self.reservation(
            u, rng.choice(("economy", "flex")) if possible else "basic", rng.randint(2, 30), pm=rng.choice(others)
        )
        pay = card if self.facts["upgrade_payment"].value == "credit_card" else r["payment_method_id"]
        return {"kind": "upgrade", "reservation_id": r["reservation_id"], "payment_method_id": pay}

    def name(self, u: dict, possible: bool = True) -> dict:
        r = self.reservation(u, self.rng.choice(("economy", "flex", "business")), self.rng.randint(2, 30))
        # the booking misspelled the lead passenger: the customer gives the right spelling
        r["passengers"][0]["last_name"] = r["passengers"][0]["last_name"][:-1] + "x"
        return {
            "kind": "name",
            "reservation_id": r["reservation_id"],
            "first_name": u["first_name"],
            "last_name": u["last_name"],
        }


def _criterion(i: int, req: dict, upper: bool = True) -> Criterion:
    kind, rid = req["kind"], req["reservation_id"]
    keep = {
        "cancel": ("refund_to",),
        "change": ("new_flight_no", "fee"),
        "bags": ("bags", "fee"),
        "compensation": ("amount", "form"),
        "upgrade": ("payment_method_id",),
        "name": ("first_name", "last_name"),
    }
    args = {"reservation_id": rid, **{k: req[k] for k in keep[kind]}}
    if kind == "name" and upper:
        args = {**args, "first_name": req["first_name"].upper(), "last_name": req["last_name"].upper()}
    return Criterion(
        id=f"req{i}", weight=REQUEST_WEIGHT[kind], check=f"{kind}_done", desc=language.request_sentence(req), args=args
    )


def generate(seed: int, per_family: int | None = None, facts=None) -> tuple[dict, list[Task]]:
    """The database and the tasks for a seed (`per_family` tasks of each family, 30 by default); `facts`: a variant's
    rules (default: the world's own)."""
    b = _Builder(seed, facts)
    upper = b.facts["name_upper"].value == "upper"
    tasks: list[Task] = []
    make = {k: getattr(b, k) for k in KINDS}
    for family, count in FAMILIES.items():
        for k in range(per_family or count):
            possible = not (family != "multi" and k % EXTERNAL_EVERY == EXTERNAL_EVERY - 1)
            tier, kinds, focus = _member(b, family, k)
            u = b.user(tier, kinds)
            reqs, email = _requests(b, make, family, possible, focus, u)
            tasks.append(
                Task(
                    id=f"airline-{family}-{k:03d}",
                    family=family,
                    user_id=u["user_id"],
                    first_message=language.first_message(u["name"], email, reqs),
                    requests=reqs,
                    rubric=_rubric(reqs, upper),
                    possible=possible,
                )
            )
    db = {"users": b.users, "flights": b.flights, "reservations": b.reservations}
    return db, tasks


def _member(b: _Builder, family: str, k: int) -> tuple[str | None, list[str] | None, str | None]:
    """The member a task of `family` needs (number `k` of it): its tier, its payment methods' kinds (None: the
    builder's choice), and the rule the task bears on (bags and compensation)."""
    tier = None
    kinds: list[str] | None = None
    if family in ("upgrade", "multi"):
        kinds = ["credit_card", *b.rng.sample(["gift_card", "certificate"], k=b.rng.choice((1, 2)))]
        b.rng.shuffle(kinds)
        if kinds[0] == "credit_card" and family == "upgrade":  # not the first method: reading the rule matters
            kinds.append(kinds.pop(0))
    focus = BAG_FOCUS[k % len(BAG_FOCUS)] if family == "bags" else None
    if family == "bags":
        tier = {"fee": "silver", "allowance": "gold", "business": "silver"}[focus]
    if family == "compensation":
        focus = COMP_FOCUS[k % len(COMP_FOCUS)]
        tier = "gold" if focus == "gold" else b.rng.choice(("regular", "silver"))
    if family == "cancel":
        kinds = b.rng.sample(["credit_card", "gift_card", "certificate"], k=b.rng.choice((2, 3)))
    return tier, kinds, focus


def _requests(
    b: _Builder, make: dict, family: str, possible: bool, focus: str | None, u: dict
) -> tuple[list[dict], str]:
    """The task's requests, and the email the member gives."""
    email = u["email"]
    if family == "multi":
        n = b.rng.choice((3, 4, 5))
        chosen = b.rng.sample(KINDS, k=n - 1)
        chosen.append(b.rng.choice(chosen))  # a repeated kind: two writes through the same tool
        b.rng.shuffle(chosen)
        return [make[kd](u) for kd in chosen], email
    reqs = [getattr(b, family)(u, possible, focus) if focus else make[family](u, possible)]
    if family == "name" and not possible:  # the customer gives an email that matches no account
        email = email.replace("@", ".old@")
    return reqs, email


def _rubric(reqs: list[dict], upper: bool) -> list[Criterion]:
    """A criterion per request, then confirmation and no extra writes."""
    rubric = [_criterion(i + 1, r, upper) for i, r in enumerate(reqs)]
    rubric.append(
        Criterion(
            id="confirmed",
            weight=CONFIRM_WEIGHT,
            check="writes_confirmed",
            desc="every write was confirmed by the member first",
        )
    )
    rubric.append(
        Criterion(
            id="no_extra_writes",
            weight=EXTRA_WEIGHT,
            check="only_requested_writes",
            desc="no write the member did not ask for",
            args={"targets": sorted({r["reservation_id"] for r in reqs})},
        )
    )
    return rubric


def gold_of(task: Task, facts=None) -> list[dict]:
    """The writes a correct agent makes for `task` (its gold actions, train items only are written): one per request,
    in the member's order; none for an impossible task."""
    if not task.possible:
        return []
    keep = {
        "cancel": ("refund_to",),
        "change": ("new_flight_no", "fee"),
        "bags": ("bags", "free_bags", "fee"),
        "compensation": ("amount", "form"),
        "upgrade": ("payment_method_id",),
        "name": ("first_name", "last_name"),
    }
    out = []
    for r in task.requests:
        args = {"reservation_id": r["reservation_id"], **{k: r[k] for k in keep[r["kind"]]}}
        if r["kind"] == "upgrade":
            args["cabin"] = "business"
        if r["kind"] == "name" and (facts or F.BY_ID)["name_upper"].value == "upper":
            args |= {"first_name": r["first_name"].upper(), "last_name": r["last_name"].upper()}
        out.append({"tool": language.TOOL_OF[r["kind"]], "args": args})
    return out
