"""How the airline world's customers talk: one sentence per request kind, and the parser for them. The simulated
user speaks with these templates; the world's competence (what the simulated agent understands) parses them. Real
models just read the text."""

from __future__ import annotations

import re

RES = r"(?P<reservation_id>[A-Z0-9]{6})"
EMAIL_RE = re.compile(r"\(email ([a-z0-9._]+@[a-z0-9.]+\.[a-z]+)\)")

TOOL_OF = {
    "cancel": "cancel_reservation",
    "change": "change_flight",
    "bags": "add_checked_bags",
    "compensation": "issue_compensation",
    "upgrade": "upgrade_cabin",
    "name": "update_passenger_name",
}
CANCEL_REASONS = ("my plans changed", "I can no longer travel", "the meeting was cancelled", "I booked the wrong trip")


def request_sentence(req: dict) -> str:
    kind, rid = req["kind"], req["reservation_id"]
    if kind == "cancel":
        return f"Please cancel reservation {rid}, {req['reason']}."
    if kind == "change":
        return f"Please move reservation {rid} to flight {req['new_flight_no']} on {req['new_date']}."
    if kind == "bags":
        n = req["bags"]
        return f"I'd like to add {n} checked bag{'s' if n > 1 else ''} to reservation {rid}."
    if kind == "compensation":
        how = "in cash, please" if req.get("cash") else "in whatever form you issue it"
        return f"My flight on reservation {rid} was badly delayed and I'd like the compensation I'm owed, {how}."
    if kind == "upgrade":
        return f"Please upgrade reservation {rid} to business class."
    if kind == "name":
        name = f"{req['first_name']} {req['last_name']}"
        return f"The passenger name on reservation {rid} is misspelled: it should be {name}."
    raise ValueError(kind)


def first_message(name: str, email: str, requests: list[dict]) -> str:
    return f"Hello, this is {name} (email {email}). " + " ".join(request_sentence(r) for r in requests)


PATTERNS = {
    "cancel": re.compile(r"Please cancel reservation " + RES + r", [^.]+\."),
    "change": re.compile(
        r"Please move reservation " + RES + r" to flight (?P<new_flight_no>AX\d{4}) on "
        r"(?P<new_date>\d{4}-\d\d-\d\d)\."
    ),
    "bags": re.compile(r"I'd like to add (?P<bags>\d+) checked bags? to reservation " + RES + r"\."),
    "compensation": re.compile(
        r"My flight on reservation " + RES + r" was badly delayed and I'd like the "
        r"compensation I'm owed, (?P<how>in cash, please|in whatever form you issue it)\."
    ),
    "upgrade": re.compile(r"Please upgrade reservation " + RES + r" to business class\."),
    "name": re.compile(
        r"The passenger name on reservation " + RES + r" is misspelled: it should be "
        r"(?P<first_name>[A-Za-z]+) (?P<last_name>[A-Za-z]+)\."
    ),
}


def parse_requests(text: str) -> list[dict]:
    """The requests in a customer's message, in the order they were made."""
    found = []
    for kind, pat in PATTERNS.items():
        for m in pat.finditer(text):
            req = {"kind": kind, "tool": TOOL_OF[kind], "pos": m.start(), **m.groupdict()}
            if "bags" in req:
                req["bags"] = int(req["bags"])
            if "how" in req:
                req["cash"] = req.pop("how").endswith("please")
            found.append(req)
    found.sort(key=lambda r: r.pop("pos"))
    return found


def parse_email(text: str) -> str | None:
    m = EMAIL_RE.search(text)
    return m.group(1) if m else None


# -- what the agent's confirmation summary says (the `confirm` tool's summary) -------------------------------------

ACTION_PHRASE = {
    "cancel": "cancel reservation {rid}",
    "change": "move reservation {rid} to another flight",
    "bags": "add checked bags to reservation {rid}",
    "compensation": "issue delay compensation on reservation {rid}",
    "upgrade": "upgrade reservation {rid} to business",
    "name": "correct the passenger name on reservation {rid}",
}


def summary(kind: str, rid: str) -> str:
    return ACTION_PHRASE[kind].format(rid=rid)
