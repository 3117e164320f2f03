"""The airline world's procedure knowledge (12 facts), and the one grammar in which it can be read.

Eight facts are stated in the written policy (policy.md); four are NOT (`unstated`): the world enforces them, a
refusal receipt carries their `rule_id` and text, and successful episodes follow them, but no agent can read them in
the policy. Several facts govern the same write (their effects combine: the change fee is the fare's fee, doubled
inside the window; the free bag allowance is the tier's plus the business bonus).

`read(text)` reads a piece of text (a card, the policy, a receipt's `rule`) into the value it *instructs*, or None
when the text does not address the fact. The simulated agent reads its context with it, so this module is also the
definition of what the simulated agent understands in this world.

The grammar (anything else is ignored, as if the card were not there):

  1. Scope. Only a paragraph or list item that names the fact's write tool in backticks addresses the fact
     (`cancel_reservation`, `change_flight`, `add_checked_bags`, `issue_compensation`, `upgrade_cabin`,
     `update_passenger_name`).
  2. Clauses. The paragraph is split into clauses at `.`, `;`, `:`, `!`, `?` and at `, but` / `, while`.
  3. Negation. A clause is negated when `not`, `never`, `no`, `don't`/`do not`/`doesn't`, `cannot`, `avoid`,
     `instead of`, `rather than`, `other than` or `without` comes before the value phrase. A negated clause instructs
     the fact's opposite (below). The first clause that instructs a value wins, except for the two tables
     (change fee, bag allowance), whose entries are merged over the paragraph's clauses (the first entry per key wins).
  4. Value phrases, per fact:
     - refund_original: "original payment method", "payment method of the reservation", "paid with",
       "reservation's `payment_method_id`" -> original; "account's first/default/preferred method", "first method on
       the account" -> account. Opposites: original <-> account.
     - basic_credit: "travel credit" / "travel_credit" -> travel_credit (a basic fare is refunded as travel credit);
       negated -> same (basic fares are refunded like any other).
     - change_fee: a table fare -> fee. "$N for economy (and ...) fares" gives each fare named after `$N` (up to the
       next `$`) that fee; "<fares> ... free" or a negated "fee" clause naming fares gives them 0.
     - change_window: "within N days" with "doubl"/"twice" (or "K times") -> (N, 2 or K); negated -> (0, 1): no
       surcharge.
     - bag_allowance: a table tier -> free bags per passenger, "regular members 0, silver members 1, gold 2" (a
       tier followed by a count); negated ("no free bags") -> every tier 0.
     - bag_fee: "$N per/for each (extra) bag" -> N; negated ("no fee per bag") -> 0.
     - bag_business: "business" with "N more/extra/additional free bag(s)" -> N; negated -> 0.
     - comp_rate: a table of bands, "$A ... N hours" pairs -> ((N, A), ...) (the amount from N hours of delay on);
       negated -> () (no compensation).
     - comp_gold: "gold" with "double(s|d)"/"twice"/"N times" -> 2 or N; negated -> 1.
     - comp_form: "certificate" -> certificate; "cash" -> cash. Opposites: certificate <-> cash.
     - upgrade_payment: "credit card" / "`credit_card`" -> credit_card; negated -> any (the reservation's method).
     - name_upper: "upper case", "uppercase", "capital letters", "as printed on the passport" -> upper; negated ->
       as_given.
"""

from __future__ import annotations

import re
from dataclasses import replace

from components.worlds.grammar import NEGATION, Fact, clauses, first, negated, on_tool
from components.worlds.outcome_rules import ends, with_outcomes
from components.worlds.grammar import facts_read as read_all

NUMBER_WORDS = {"no": 0, "zero": 0, "one": 1, "two": 2, "three": 3, "four": 4}
FARES = ("basic", "economy", "flex", "business")
TIERS = ("regular", "silver", "gold")


def _num(s: str) -> int:
    return NUMBER_WORDS[s.lower()] if s.lower() in NUMBER_WORDS else int(s)


# -- cancel_reservation ---------------------------------------------------------------------------------------------

REFUND = {
    "original": re.compile(r"original payment method|payment method of the reservation|paid with|"
                           r"reservation's `?payment_method_id", re.I),
    "account": re.compile(r"account's (first|preferred|default)|(first|preferred|default) (payment )?method "
                          r"(on|of) the account", re.I),
}


def _read_refund(text: str) -> object | None:
    return first(text, "cancel_reservation", REFUND, {"original": "account", "account": "original"})


CREDIT = {"travel_credit": re.compile(r"travel[ _]credit", re.I)}


def _read_credit(text: str) -> object | None:
    return first(text, "cancel_reservation", CREDIT, {"travel_credit": "same"})


# -- change_flight ------------------------------------------------------------------------------------------------

DOLLARS = re.compile(r"\$(\d+)")
FARE_RE = re.compile(r"\b(basic|economy|flex|business)\b", re.I)


def _read_change_fee(text: str) -> tuple | None:
    table: dict[str, int] = {}
    for clause in clauses(text, "change_flight"):
        low = clause.lower()
        if "fee" not in low and "$" not in low and "free" not in low:
            continue
        amounts = list(DOLLARS.finditer(low))
        for m in FARE_RE.finditer(low):
            before = [a for a in amounts if a.start() < m.start()]
            if before:
                fee = int(before[-1].group(1))
            elif re.search(r"\bfree\b", low) or (NEGATION.search(low) and "fee" in low):
                fee = 0
            else:
                continue
            table.setdefault(m.group(1), fee)
    return tuple(sorted(table.items())) if table else None


WINDOW = re.compile(r"within (\d+) days", re.I)
FACTOR = re.compile(r"doubl|twice|(\d+) times", re.I)


def _read_window(text: str) -> tuple | None:
    for clause in clauses(text, "change_flight"):
        w, f = WINDOW.search(clause), FACTOR.search(clause)
        if w and f:
            if negated(clause, f.start()):
                return (0, 1)
            return (int(w.group(1)), int(f.group(1)) if f.group(1) else 2)
    return None


# -- add_checked_bags ---------------------------------------------------------------------------------------------

TIER_COUNT = re.compile(r"\b(regular|silver|gold)\b(?: members?)?(?: get| have)?:? (\d+|no|zero|one|two|three)\b", re.I)


def _read_allowance(text: str) -> tuple | None:
    table: dict[str, int] = {}
    for clause in clauses(text, "add_checked_bags"):
        hits = list(TIER_COUNT.finditer(clause))
        if not hits:
            if re.search(r"\bfree (checked )?bags?\b", clause, re.I) and re.search(r"\bno free", clause, re.I) \
                    and not re.search(r"business", clause, re.I):
                return tuple(sorted((t, 0) for t in TIERS))
            continue
        if negated(clause, hits[0].start()):
            return tuple(sorted((t, 0) for t in TIERS))
        for m in hits:
            table.setdefault(m.group(1).lower(), _num(m.group(2)))
    return tuple(sorted(table.items())) if table else None


PER_BAG = re.compile(r"\$(\d+) (?:per|for each|for every|a) (?:extra |additional )?(?:checked )?bag", re.I)
NO_BAG_FEE = re.compile(r"\bfee\b.*\b(per|each) (?:extra |additional )?bag|\bbags?\b.*\bfee\b", re.I)


def _read_bag_fee(text: str) -> int | None:
    for clause in clauses(text, "add_checked_bags"):
        m = PER_BAG.search(clause)
        if m:
            return 0 if negated(clause, m.start()) else int(m.group(1))
        n = NO_BAG_FEE.search(clause)
        if n and negated(clause, n.end()) and "business" not in clause.lower() and not TIER_COUNT.search(clause):
            return 0
    return None


BONUS = re.compile(r"(\d+|one|two|three) (?:more|extra|additional) free (?:checked )?bags?", re.I)


def _read_business(text: str) -> int | None:
    for clause in clauses(text, "add_checked_bags"):
        if "business" not in clause.lower():
            continue
        m = BONUS.search(clause)
        if m:
            return 0 if negated(clause, m.start()) else _num(m.group(1))
        if re.search(r"\bno (more|extra|additional) free", clause, re.I):
            return 0
    return None


# -- issue_compensation -------------------------------------------------------------------------------------------

TIER_AMOUNT = re.compile(r"\$(\d+)[^$]*?\b(\d+) hours", re.I)


def _read_rate(text: str) -> tuple | None:
    """A table of (hours of delay from which it applies, amount): "$100 for a delay of 3 hours or more and $250
    for a delay of 6 hours or more" -> ((3, 100), (6, 250)); negated ("never pays $100 ...") -> () (nothing)."""
    for clause in clauses(text, "issue_compensation"):
        hits = list(TIER_AMOUNT.finditer(clause))
        if hits:
            if negated(clause, hits[0].start()):
                return ()
            return tuple(sorted((int(m.group(2)), int(m.group(1))) for m in hits))
    return None


GOLD_FACTOR = re.compile(r"doubl\w*|twice|(\d+) times", re.I)


def _read_gold(text: str) -> int | None:
    for clause in clauses(text, "issue_compensation"):
        if not re.search(r"\bgold\b", clause, re.I):
            continue
        m = GOLD_FACTOR.search(clause)
        if m:
            return 1 if negated(clause, m.start()) else (int(m.group(1)) if m.group(1) else 2)
    return None


FORM = {"certificate": re.compile(r"certificate", re.I), "cash": re.compile(r"\bcash\b", re.I)}


def _read_form(text: str) -> object | None:
    return first(text, "issue_compensation", FORM, {"certificate": "cash", "cash": "certificate"})


# -- upgrade_cabin, update_passenger_name -------------------------------------------------------------------------

CARD = {"credit_card": re.compile(r"credit[ _]card", re.I)}


def _read_upgrade(text: str) -> object | None:
    return first(text, "upgrade_cabin", CARD, {"credit_card": "any"})


UPPER = {"upper": re.compile(r"upper ?case|capital letters|as printed on the passport", re.I)}


def _read_upper(text: str) -> object | None:
    return first(text, "update_passenger_name", UPPER, {"upper": "as_given"})


FACTS: tuple[Fact, ...] = (
    Fact("refund_original", "cancel_reservation",
         "- `cancel_reservation` refunds to the original payment method of the reservation: pass its "
         "`payment_method_id` as `refund_to`, not the account's first method.", _read_refund),
    Fact("basic_credit", "cancel_reservation",
         "- `cancel_reservation` of a basic fare refunds as travel credit only: pass `refund_to` 'travel_credit' "
         "for basic fares.", _read_credit, stated=False),
    Fact("change_fee", "change_flight",
         "- `change_flight` charges a change fee, passed as `fee`: $75 for economy fares and $25 for flex fares, "
         "while business fares change free.", _read_change_fee),
    Fact("change_window", "change_flight",
         "- `change_flight` within 7 days of departure (days from today to the departure date) doubles the change "
         "fee.", _read_window, stated=False),
    Fact("bag_allowance", "add_checked_bags",
         "- `add_checked_bags` takes the free allowance as `free_bags`, per passenger by tier: regular members 0, "
         "silver members 1, gold members 2 (times the number of passengers).", _read_allowance),
    Fact("bag_fee", "add_checked_bags",
         "- `add_checked_bags` charges $35 per bag beyond the free allowance, passed as the total `fee`.",
         _read_bag_fee),
    Fact("bag_business", "add_checked_bags",
         "- `add_checked_bags` on a business fare gives 1 more free bag per passenger on top of the tier allowance.",
         _read_business, stated=False),
    Fact("comp_rate", "issue_compensation",
         "- `issue_compensation` pays $100 for a delay of 3 hours or more and $250 for a delay of 6 hours or more, "
         "passed as `amount`.", _read_rate),
    Fact("comp_gold", "issue_compensation",
         "- `issue_compensation` doubles the amount for gold members.", _read_gold, stated=False),
    Fact("comp_form", "issue_compensation",
         "- `issue_compensation` is paid as a travel certificate (`form` 'certificate'), never as cash.", _read_form),
    Fact("upgrade_payment", "upgrade_cabin",
         "- `upgrade_cabin` is paid only with a credit card on the account: pass a `credit_card` payment method, "
         "not the gift card or certificate the reservation was paid with.", _read_upgrade),
    Fact("name_upper", "update_passenger_name",
         "- `update_passenger_name` takes names in upper case, exactly as printed on the passport.", _read_upper),
)



# -- the same rules inferred from outcomes (components/worlds/outcome_rules.py): what such a card instructs ---------------

def _refund(part: str):
    """`refund_to`: equal to the reservation's method (original) when it is not a basic fare; a basic fare's constant
    'travel_credit' (the condition on the fare)."""

    def value(rules: dict):
        r = rules.get("refund_to")
        if r is None:
            return None
        orig = any(t.kind == "equal" and ends(t.path, "get_reservation_details.payment_method_id") for t in r.terms())
        if part == "original":
            return "original" if orig else None
        basic = r.cond is not None and r.cond.op == "is" and ends(r.cond.path, ".fare") and r.cond.value == "basic"
        return "travel_credit" if basic and r.then.kind == "const" and r.then.value == "travel_credit" else None

    return value


def _form(rules: dict):
    r = rules.get("form")
    return r.then.value if r is not None and r.cond is None and r.then.kind == "const" \
        and r.then.value in ("certificate", "cash") else None


def _upgrade(rules: dict):
    r = rules.get("payment_method_id")
    return "credit_card" if r is not None and r.cond is None and r.then.kind == "equal" \
        and ends(r.then.path, "[kind=credit_card].id") else None


def _comp(part: str):
    """The compensation: a base amount, times a factor above a delay in minutes (the upper band), times a factor for
    gold members."""

    def value(rules: dict):
        r = rules.get("amount")
        if r is None or not r.factors or r.then.kind != "const" or not _is_number(r.then.value):
            return None
        for c, k in r.factors:
            if part == "rate" and c.op == ">" and ends(c.path, "delay_minutes"):
                return ((0, int(r.then.value)), ((int(c.value) + 1) / 60, int(round(r.then.value * k))))
            if part == "gold" and c.op == "is" and c.value == "gold" and float(k).is_integer():
                return int(k)
        return None

    return value


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _change(part: str):
    """The change fee: a table by fare (`table`), times a factor below 1 when the departure is more than N days from
    today (the window is the days up to N, where the fee is the table's, `1/k` times the fee outside it)."""

    def value(rules: dict):
        r = rules.get("fee")
        if r is None or r.then.kind != "table" or not ends(r.then.path, ".fare") or r.cond is not None:
            return None
        window = [(c, k) for c, k in r.factors if c.op == ">" and ends(c.path, "@days_from_today")]
        if len(window) != len(r.factors) or len(window) > 1 or (window and not 0 < window[0][1] < 1):
            return None
        k = window[0][1] if window else 1.0
        if part == "fee":
            return tuple(sorted((fare, int(round(n * k))) for fare, n in r.then.value))
        return (int(window[0][0].value), int(round(1 / k))) if window else None  # no window in the rule: not stated

    return value


def _bag_fee(rules: dict):
    """The fee per bag beyond the allowance: `fee` = k * the bags + -k * the free bags (a sum of the write's own
    arguments), k the fee per bag."""
    r = rules.get("fee")
    if r is None or r.then.kind != "sum" or r.cond is not None or r.factors or r.cap is not None:
        return None
    const, parts = r.then.value
    by = {p: k for k, p in parts}
    k = by.get("@bags")
    if const or len(by) != 2 or k is None or by.get("@free_bags") != -k or not float(k).is_integer() or k < 0:
        return None
    return int(k)


OUTCOME_VALUES = {"refund_original": _refund("original"), "bag_fee": _bag_fee, "basic_credit": _refund("basic"), "comp_form": _form,
                  "upgrade_payment": _upgrade, "comp_rate": _comp("rate"), "comp_gold": _comp("gold"),
                  "change_fee": _change("fee"), "change_window": _change("window")}
# the bag fee is a sum of the write's own arguments (`_bag_fee`); the allowance (a tier table plus a fare's bonus,
# times the passengers) is a per-passenger sum no inferred form states
FACTS = tuple(replace(f, read=with_outcomes(f.read, f.tool, OUTCOME_VALUES[f.id])) if f.id in OUTCOME_VALUES else f
              for f in FACTS)
BY_ID: dict[str, Fact] = {f.id: f for f in FACTS}
BY_TOOL: dict[str, tuple[Fact, ...]] = on_tool(FACTS)
STATED = tuple(f for f in FACTS if f.stated)
UNSTATED = tuple(f for f in FACTS if not f.stated)


def facts_read(text: str) -> dict[str, object]:
    """Every fact `text` addresses, with the value it instructs."""
    return read_all(FACTS, text)


# -- what the rules make of a request (the world's truth; the tools and the rubric use these) ------------------------

def table(value: object) -> dict:
    return dict(value) if isinstance(value, tuple) else {}


def change_fee(fare: str, days: int, fee_table: object, window: object) -> int:
    """The change fee for a fare `days` before departure, under a fee table and a (days, factor) window."""
    fee = table(fee_table).get(fare, 0)
    w_days, factor = window if isinstance(window, tuple) and len(window) == 2 else (0, 1)
    return fee * factor if days <= w_days else fee


def free_bags(tier: str, fare: str, passengers: int, allowance: object, business: object) -> int:
    per = table(allowance).get(tier, 0) + (business if fare == "business" and isinstance(business, int) else 0)
    return per * passengers


def bag_total(bags: int, free: int, per_bag: object) -> int:
    return max(0, bags - free) * (per_bag if isinstance(per_bag, int) else 0)


def compensation(delay_minutes: int, tier: str, rate: object, gold: object) -> int:
    """The amount of the highest band of `rate` ((hours, amount), ...) the delay reaches, times the gold factor."""
    hours = delay_minutes / 60
    bands = [amount for h, amount in (rate if isinstance(rate, tuple) else ()) if hours >= h]
    mult = gold if tier == "gold" and isinstance(gold, int) else 1
    return (max(bands) if bands else 0) * mult
