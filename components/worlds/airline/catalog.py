"""The airline world's data: members with tiers and payment methods, flights (some delayed), reservations with a
fare class, passengers and bags. Generated from a seed; the same seed gives the same bytes.

Dates are relative to one fixed `TODAY` (stated in the written policy), so "days before departure" is the same on
every machine and every run."""

from __future__ import annotations

import random
from datetime import date, timedelta

from components.worlds.accounts import FIRST, digits, email, new_person, payment_methods

TODAY = date(2026, 6, 1)
TIERS = ("regular", "silver", "gold")
FARES = ("basic", "economy", "flex", "business")
AIRPORTS = ("JFK", "LAX", "ORD", "SEA", "BOS", "DEN", "ATL", "SFO", "MIA", "PHX", "DFW", "MSP")
ALNUM = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"


def day(offset: int) -> str:
    return (TODAY + timedelta(days=offset)).isoformat()


def days_before(departure: str) -> int:
    """Whole days from TODAY to a departure date (what the change-fee window counts)."""
    return (date.fromisoformat(departure) - TODAY).days


def make_user(rng: random.Random, used: set[str], tier: str, kinds: list[str]) -> dict:
    uid, first, last = new_person(rng, used)
    methods = payment_methods(rng, kinds)
    return {
        "user_id": uid,
        "name": f"{first} {last}",
        "first_name": first,
        "last_name": last,
        "email": email(rng, first, last),
        "tier": tier,
        "payment_methods": methods,
        "reservations": [],
    }


def make_flight(
    rng: random.Random,
    used: set[str],
    origin: str,
    destination: str,
    offset: int,
    status: str = "scheduled",
    delay_minutes: int = 0,
) -> dict:
    while True:
        no = "AX" + digits(rng, 4)
        if no not in used:
            used.add(no)
            break
    return {
        "flight_no": no,
        "origin": origin,
        "destination": destination,
        "date": day(offset),
        "departure_time": f"{rng.randint(6, 21):02d}:{rng.choice(('00', '15', '30', '45'))}",
        "status": status,
        "delay_minutes": delay_minutes,
    }


def make_reservation(
    rng: random.Random,
    used: set[str],
    user: dict,
    flight: dict,
    fare: str,
    n_passengers: int,
    payment_method_id: str,
    status: str = "booked",
) -> dict:
    while True:
        rid = "".join(rng.choice(ALNUM) for _ in range(6))
        if rid not in used:
            used.add(rid)
            break
    passengers = [{"first_name": user["first_name"], "last_name": user["last_name"]}]
    for _ in range(n_passengers - 1):
        passengers.append({"first_name": rng.choice(FIRST), "last_name": user["last_name"]})
    res = {
        "reservation_id": rid,
        "user_id": user["user_id"],
        "flight_no": flight["flight_no"],
        "origin": flight["origin"],
        "destination": flight["destination"],
        "date": flight["date"],
        "fare": fare,
        "cabin": "business" if fare == "business" else "economy",
        "passengers": passengers,
        "payment_method_id": payment_method_id,
        "status": status,
        "bags": 0,
        "price": rng.randint(90, 400) * (3 if fare == "business" else 1) * n_passengers,
    }
    user["reservations"].append(rid)
    return res
