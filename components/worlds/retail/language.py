"""How the retail world's people talk: the sentences a customer uses for each request (and their parser), and the
phrase the agent's confirmation summary uses. The simulated user speaks with these templates; the simulated agent understands
them (it plays a model that has seen this kind of customer before). Real models just read the text."""

from __future__ import annotations

import re

ORDER_RE = re.compile(r"#W\d{7}")
EMAIL_RE = re.compile(r"[a-z0-9._]+@[a-z0-9.]+\.[a-z]+")
ADDRESS_RE = r"(?P<address1>\d+ [A-Za-z ]+?), (?P<city>[A-Za-z ]+?), (?P<state>[A-Z]{2}) (?P<zip>\d{5})"


def address_text(a: dict) -> str:
    return f"{a['address1']}, {a['city']}, {a['state']} {a['zip']}"


def options_text(opts: dict) -> str:
    return ", ".join(f"{k}: {v}" for k, v in opts.items())


def parse_options(text: str) -> dict[str, str]:
    return dict(re.findall(r"([a-z]+): ([^,;.]+?)(?=,|;|\.|$)", text))


# -- the customer ----------------------------------------------------------------------------------------


def request_sentence(req: dict) -> str:
    kind = req["kind"]
    if kind == "cancel":
        return f"Please cancel order {req['order_id']}: {req['reason_phrase']}."
    if kind == "return":
        return f"I want to return the {' and '.join(req['item_names'])} from order {req['order_id']}."
    if kind == "exchange":
        return (
            f"In order {req['order_id']}, please exchange my {req['product_name']} for the variant with "
            f"{options_text(req['want'])}; if that is not available, {options_text(req['alt'])} is fine."
        )
    if kind == "user_address":
        return f"I have moved: please update my account address to {address_text(req['address'])}."
    if kind == "order_address":
        return f"Please ship pending order {req['order_id']} to {address_text(req['address'])}."
    if kind == "credit":
        return f"My order {req['order_id']} arrived late: I would like the late-delivery credit for it."
    raise ValueError(kind)


def first_message(name: str, email: str, requests: list[dict]) -> str:
    return f"Hi, I'm {name} (email {email}). " + " ".join(request_sentence(r) for r in requests)


PATTERNS = {
    "cancel": re.compile(r"Please cancel order (?P<order_id>#W\d{7}): (?P<reason>[^.]+)\."),
    "return": re.compile(r"I want to return the (?P<items>.+?) from order (?P<order_id>#W\d{7})\."),
    "exchange": re.compile(
        r"In order (?P<order_id>#W\d{7}), please exchange my (?P<product>.+?) for the variant with "
        r"(?P<want>.+?); if that is not available, (?P<alt>.+?) is fine\."
    ),
    "user_address": re.compile(r"please update my account address to " + ADDRESS_RE + r"\."),
    "order_address": re.compile(r"Please ship pending order (?P<order_id>#W\d{7}) to " + ADDRESS_RE + r"\."),
    "credit": re.compile(r"My order (?P<order_id>#W\d{7}) arrived late: I would like the late-delivery credit"),
}
TOOL_OF = {
    "cancel": "cancel_pending_order",
    "return": "return_delivered_order_items",
    "exchange": "exchange_delivered_order_items",
    "user_address": "modify_user_address",
    "order_address": "modify_pending_order_address",
    "credit": "issue_store_credit",
}


def parse_requests(text: str) -> list[dict]:
    """The requests in a customer's message, in the order they were made."""
    found = []
    for kind, pat in PATTERNS.items():
        for m in pat.finditer(text):
            g = m.groupdict()
            req: dict = {"kind": kind, "tool": TOOL_OF[kind], "pos": m.start()}
            if "order_id" in g:
                req["order_id"] = g["order_id"]
            if kind == "cancel":
                req["reason_phrase"] = g["reason"].strip()
            elif kind == "return":
                req["item_names"] = [s.strip() for s in g["items"].split(" and ")]
            elif kind == "exchange":
                req.update(product_name=g["product"], want=parse_options(g["want"]), alt=parse_options(g["alt"]))
            elif kind == "credit":
                pass
            else:
                req["address"] = {k: g[k] for k in ("address1", "city", "state", "zip")}
            found.append(req)
    found.sort(key=lambda r: r.pop("pos"))
    return found


def parse_email(text: str) -> str | None:
    m = re.search(r"\(email (" + EMAIL_RE.pattern + r")\)", text)
    return m.group(1) if m else None


# -- what the agent's confirmation summary says (the `confirm` tool's summary) ---------------------------------

ACTION_PHRASE = {
    "cancel": "cancel order {order_id}",
    "return": "return items from order {order_id}",
    "exchange": "exchange an item in order {order_id}",
    "user_address": "update your account address",
    "order_address": "update the shipping address of order {order_id}",
    "credit": "issue a late-delivery credit for order {order_id}",
}
