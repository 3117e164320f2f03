"""The retail world's data: a product catalog with variants, users with payment methods and addresses, orders.
Generated from a seed; the same seed gives the same bytes."""

from __future__ import annotations

import hashlib
import itertools
import random

from components.worlds.accounts import digits, email, new_person, payment_methods

PRODUCTS: tuple[tuple[str, dict[str, tuple[str, ...]]], ...] = (
    ("T-Shirt", {"color": ("black", "white", "blue", "red"), "size": ("S", "M", "L", "XL")}),
    ("Hiking Boots", {"size": ("8", "9", "10", "11"), "material": ("leather", "synthetic")}),
    ("Water Bottle", {"capacity": ("500ml", "750ml", "1000ml"), "color": ("green", "black", "blue")}),
    ("Desk Lamp", {"color": ("white", "black", "silver"), "brightness": ("low", "medium", "high")}),
    ("Backpack", {"color": ("grey", "navy", "black"), "size": ("small", "medium", "large")}),
    ("Headphones", {"color": ("black", "white", "red"), "connection": ("wired", "wireless")}),
    ("Coffee Maker", {"capacity": ("4 cups", "8 cups", "12 cups"), "color": ("black", "steel")}),
    ("Yoga Mat", {"thickness": ("4mm", "6mm", "8mm"), "color": ("purple", "blue", "green")}),
    ("Running Shoes", {"size": ("7", "8", "9", "10"), "color": ("white", "black", "orange")}),
    ("Wall Clock", {"style": ("modern", "classic"), "color": ("black", "wood", "white")}),
)

STREETS = (
    "Maple Street",
    "Oak Avenue",
    "Cedar Lane",
    "Pine Road",
    "Elm Street",
    "Lake Drive",
    "Hill Road",
    "River Avenue",
    "Park Lane",
    "Sunset Boulevard",
    "Main Street",
    "Willow Way",
)
CITIES = (
    ("Austin", "TX", "787"),
    ("Denver", "CO", "802"),
    ("Seattle", "WA", "981"),
    ("Boston", "MA", "021"),
    ("Phoenix", "AZ", "850"),
    ("Columbus", "OH", "432"),
    ("Portland", "OR", "972"),
    ("Chicago", "IL", "606"),
)
ABBREV = {"Street": "ST", "Avenue": "AVE", "Lane": "LN", "Road": "RD", "Drive": "DR", "Boulevard": "BLVD", "Way": "WAY"}


def normalize_address(address1: str, city: str, state: str, zip: str) -> dict[str, str]:
    """What `validate_address` returns: upper case, street suffix abbreviated, ZIP+4."""
    line = " ".join(ABBREV.get(w.strip(".,"), w.strip(".,")) for w in address1.split()).upper()
    base_zip = zip.split("-")[0].strip()
    plus4 = int(hashlib.sha256(f"{line}|{base_zip}".encode()).hexdigest()[:6], 16) % 10000  # idempotent
    return {
        "address1": line,
        "city": city.strip().upper(),
        "state": state.strip().upper(),
        "zip": f"{base_zip}-{plus4:04d}",
    }


def make_catalog(rng: random.Random) -> dict[str, dict]:
    products = {}
    for name, dims in PRODUCTS:
        pid = digits(rng, 10)
        variants = {}
        keys = list(dims)
        base = rng.randint(15, 180)
        for combo in itertools.product(*(dims[k] for k in keys)):
            item_id = digits(rng, 10)
            variants[item_id] = {
                "item_id": item_id,
                "options": dict(zip(keys, combo)),
                "price": round(base * rng.uniform(0.9, 1.2), 2),
                "available": rng.random() < 0.7,
            }
        products[pid] = {"product_id": pid, "name": name, "variants": variants}
    return products


def make_address(rng: random.Random) -> dict[str, str]:
    city, state, zp = rng.choice(CITIES)
    return {
        "address1": f"{rng.randint(10, 999)} {rng.choice(STREETS)}",
        "city": city,
        "state": state,
        "zip": zp + digits(rng, 2),
    }


def make_user(rng: random.Random, used: set[str]) -> dict:
    uid, first, last = new_person(rng, used)
    methods = payment_methods(rng, rng.sample(["credit_card", "paypal", "gift_card"], k=rng.choice((2, 3))))
    return {
        "user_id": uid,
        "name": f"{first} {last}",
        "email": email(rng, first, last),
        "address": make_address(rng),
        "payment_methods": methods,
        "orders": [],
    }


def make_order(
    rng: random.Random,
    user: dict,
    products: dict,
    status: str,
    n_items: int,
    used: set[str],
    payment_method_id: str | None = None,
    ages: random.Random | None = None,
) -> dict:
    """An order; `ages` draws its ages (a stream of its own, so the rest of the data does not shift with them)."""
    while True:
        oid = "#W" + digits(rng, 7)
        if oid not in used:
            used.add(oid)
            break
    items = []
    for pid in rng.sample(sorted(products), k=n_items):
        p = products[pid]
        item_id = rng.choice(sorted(p["variants"]))
        v = p["variants"][item_id]
        items.append(
            {
                "item_id": item_id,
                "product_id": pid,
                "name": p["name"],
                "options": dict(v["options"]),
                "price": v["price"],
            }
        )
    order = {
        "order_id": oid,
        "user_id": user["user_id"],
        "status": status,
        "items": items,
        "payment_method_id": payment_method_id or rng.choice(user["payment_methods"])["id"],
        "address": dict(user["address"]),
    }
    # the ages the fee rules read: hours since a not-yet-delivered order was placed, days since delivery
    ages = ages or rng
    if status == "delivered":
        order.update(delivered_days_ago=ages.randint(1, 60), days_late=0)
    else:
        order["placed_hours_ago"] = ages.randint(1, 96)
    user["orders"].append(oid)
    return order
