"""The customer account both built-in desks share (retail, airline): how a customer is drawn (name, unique id, email,
payment methods), the two account reads (`find_user_id_by_email`, `get_user_details`), and the competence's opening
(authenticate by email, then load the profile). A world whose customers have accounts like these builds on it; the
generic contract (`base`, `competence`) names none of these tools or fields.
"""

from __future__ import annotations

import copy
import random

from components.worlds.base import ONLY_EMAIL, ToolBase
from components.worlds.competence import Step, View

FIRST = (
    "Ava",
    "Liam",
    "Noah",
    "Emma",
    "Mia",
    "Lucas",
    "Yusuf",
    "Sofia",
    "Omar",
    "Ivan",
    "Chen",
    "Amara",
    "Raj",
    "Lena",
    "Mateo",
    "Fatima",
    "Ethan",
    "Hana",
    "Olivia",
    "Kofi",
    "Ines",
    "Arjun",
    "Zoe",
    "Daniel",
)
LAST = (
    "Smith",
    "Garcia",
    "Kim",
    "Patel",
    "Nguyen",
    "Silva",
    "Ivanova",
    "Okafor",
    "Rossi",
    "Haddad",
    "Lopez",
    "Moreau",
    "Schmidt",
    "Sato",
    "Kowalski",
    "Brown",
    "Ali",
    "Costa",
    "Hansen",
    "Jones",
)


# -- drawing a customer (the draws' order is part of the seed's data: keep it) ---------------------------------------


def digits(rng: random.Random, n: int) -> str:
    return "".join(rng.choice("0123456789") for _ in range(n))


def new_person(rng: random.Random, used: set[str]) -> tuple[str, str, str]:
    """(user id, first name, last name) with a user id not in `used` (added to it)."""
    while True:
        first, last = rng.choice(FIRST), rng.choice(LAST)
        uid = f"{first.lower()}_{last.lower()}_{digits(rng, 4)}"
        if uid not in used:
            used.add(uid)
            return uid, first, last


def payment_methods(rng: random.Random, kinds: list[str]) -> list[dict]:
    return [{"id": f"{k}_{digits(rng, 7)}", "kind": k} for k in kinds]


def email(rng: random.Random, first: str, last: str) -> str:
    return f"{first.lower()}.{last.lower()}{digits(rng, 3)}@example.com"


# -- the account reads -----------------------------------------------------------------------------------------------


class AccountTools(ToolBase):
    """`ToolBase` with the account reads over `db["users"]` (user id -> profile with `email`)."""

    def _t_find_user_id_by_email(self, email: str):
        for u in self.db["users"].values():
            if u["email"] == str(email).strip().lower():
                return True, None, {"user_id": u["user_id"]}
        return self._fail("not_found", f"no user with email {email}", blocking=True)

    def _t_get_user_details(self, user_id: str):
        u = self.db["users"].get(user_id)
        if u is None:
            return self._fail("not_found", f"no user {user_id}", blocking=True)
        return True, None, copy.deepcopy(u)


# -- the competence's opening ------------------------------------------------------------------------------------------


def user_id(view: View) -> str | None:
    """The user id the email lookup found, if it found one."""
    for _c, r in view.results("find_user_id_by_email"):
        if "user_id" in r:
            return r["user_id"]
    return None


def opening(view: View, plan_only: bool, party: str, loaded: bool) -> Step | None:
    """Authenticate by the email the customer gave (ask for another once; hand over when they have none), then load
    the profile unless `loaded`; None = ready. With plan_only, loading the profile is bookkeeping, not an intent."""
    uid = user_id(view)
    if uid is None:
        if plan_only:
            return "", ("find_user_id_by_email", {})
        if not view.results("find_user_id_by_email"):
            return "", ("find_user_id_by_email", {"email": view.info.get("email") or ""})
        if any(t == ONLY_EMAIL for t in view.user_texts):
            return "", ("transfer_to_human_agents", {"summary": f"{party} could not be authenticated"})
        return "I could not find an account with that email. Could you give me another email?", None
    if plan_only or loaded:
        return None
    return "", ("get_user_details", {"user_id": uid})
