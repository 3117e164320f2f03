"""A campaign's alpha: one budget, `gate.campaign_alpha`, for the chance of any false promotion over all its dev looks.

Every round that reaches the gate looks at the same dev items, so each look takes a one-sided share from one
budget, and the chance that the campaign promotes anything that does not hold what it claims (better than its
parent; for a "cheaper" promotion, within the margin of its parent and cheaper) stays at most `campaign_alpha`.

How looks share it (`gate.campaign_spending`, declared before the campaign):

    linear   look k of at most `rounds` takes campaign_alpha / rounds; every look spends its share
    wealth   the wealth W starts at campaign_alpha; round r's look reserves W / (rounds - r + 1) (the wealth left,
             shared by the rounds left). A look that keeps the parent spends its charge; a look that promotes
             gives its share back; a round without a look spends nothing. With no promotion and a look in every
             round it is the linear rule exactly

and what a look is charged (`gate.futility_refund`):

    off      the charge is the share reserved, whatever the look's verdict: the test runs at that share
    on       the test runs at a lower level `a` (`refund_design`) so that a stop for futility at interim look g
             can be charged only spend(t_g, a), the part of its spending function it reached, and give the rest
             back; any other ending is charged the whole share A. `a` is the largest level with
             E[charge] >= P(promote) under no effect (exact, by recursive integration), checked for harmful
             changes too (tests/test_alpha.py)

Why the bound holds (docs/gate.md has it in full): a look's charge C, given the past, has E[C] >= P(it promotes)
under its null. Let tau be the first false promotion. Every null look before tau kept the parent, so its charge was
booked; the looks before tau that promoted tested changes that hold. The charges of the null looks up to tau add up
to at most what was booked before tau plus the share at tau, itself at most the wealth then: campaign_alpha in all,
on every path. So P(tau exists) <= E[sum of their charges] <= campaign_alpha.

A futility stop cannot simply give back the part of its share it did not reach (`naive_give_back` measures it):
the paths that are not stopped are the ones that go on to cross, so the round still promotes falsely about as
often as its whole share says while it is charged a third less. Under no effect a refund is a trade, not a gift:
E[charge] stays at least the test's level, so it pays off when the changes gated are harmful (they stop early and
cost little) and costs power when they help.

Pure arithmetic; no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from functools import lru_cache
from typing import Any, Protocol

import numpy as np

from components.errors import InputError

EPS = 1e-12  # float slack of the sums (a charge is at most the wealth left; their sums never pass campaign_alpha)


class Spending(StrEnum):
    """How a campaign's looks share campaign_alpha (`gate.campaign_spending`)."""

    LINEAR = "linear"
    WEALTH = "wealth"


@dataclass(frozen=True)
class Settled:
    """One dev look as the account sees it: the round, the one-sided share it reserved, what it was charged, and
    whether it promoted."""

    round: int
    share: float
    charge: float
    promoted: bool


@dataclass
class Wealth:
    """The campaign's alpha account over the looks settled so far (in order)."""

    campaign_alpha: float
    rounds: int
    rule: Spending = Spending.WEALTH
    looks: list[Settled] = field(default_factory=list)

    def __post_init__(self) -> None:
        try:
            self.rule = Spending(self.rule)
        except ValueError:
            raise InputError(
                f"gate: campaign_spending: {self.rule!r} is not one of {', '.join(s.value for s in Spending)}"
            ) from None
        if not 0 < self.campaign_alpha < 0.5:
            raise InputError(f"gate: campaign_alpha: {self.campaign_alpha!r} is not in (0, 0.5)")
        if self.rounds < 1:
            raise InputError(f"gate: max_looks: {self.rounds} must be at least 1")

    def _booked(self, x: Settled) -> bool:
        return self.rule == Spending.LINEAR or not x.promoted

    @property
    def spent(self) -> float:
        """One-sided alpha spent: the charges of the looks that kept the parent (under `linear`, of every look)."""
        return sum(x.charge for x in self.looks if self._booked(x))

    @property
    def returned(self) -> float:
        """One-sided alpha given back: by promotions (`wealth`) and by refunded futility stops (share - charge)."""
        return sum(x.share - (x.charge if self._booked(x) else 0.0) for x in self.looks)

    @property
    def wealth(self) -> float:
        return max(0.0, self.campaign_alpha - self.spent)

    def share(self, round_no: int) -> float:
        """The one-sided share round `round_no`'s look may reserve (refused beyond the declared rounds and looks)."""
        if self.rule == Spending.LINEAR:
            k = len(self.looks) + 1
            if k > self.rounds:
                raise InputError(
                    f"gate: dev look {k} is beyond the {self.rounds} declared looks: no alpha left to spend"
                )
            return self.campaign_alpha / self.rounds
        if not 1 <= round_no <= self.rounds:
            raise InputError(
                f"gate: round {round_no} is beyond the {self.rounds} declared rounds: no alpha left to spend"
            )
        return self.wealth / (self.rounds - round_no + 1)

    def settle(self, round_no: int, share: float, promoted: bool, charge: float | None = None) -> None:
        """Book a look that reserved `share` (one-sided) and was charged `charge` (default: the share). Refuses a
        share above the wealth left and a charge above the share: the bound rests on both."""
        charge = share if charge is None else charge
        for name, v in (("share", share), ("charge", charge)):
            if not (math.isfinite(v) and v >= 0):
                raise InputError(f"gate: dev look of round {round_no}: {name} {v!r} is not a number >= 0")
        if share > self.wealth + EPS:
            raise InputError(
                f"gate: dev look of round {round_no}: share {share:.6g} is above the wealth left "
                f"{self.wealth:.6g} of campaign_alpha {self.campaign_alpha:g}"
            )
        if charge > share + EPS:
            raise InputError(f"gate: dev look of round {round_no}: charge {charge:.6g} is above its share {share:.6g}")
        if self.looks and round_no < self.looks[-1].round:
            raise InputError(f"gate: dev look of round {round_no} booked after round {self.looks[-1].round}'s")
        self.looks.append(Settled(round_no, float(share), float(charge), bool(promoted)))


class _LookRecord(Protocol):  # what `account` reads of a round record (components.evolution.record.DevLook)
    alpha: Any
    reserved: Any
    charge: Any


class _RoundRecord(Protocol):
    round: int
    dev_look: Any
    accepted: bool


def account(
    history: list[Any],
    campaign_alpha: float,
    rounds: int,
    rule: Spending | str = Spending.WEALTH,
    before: int | None = None,
) -> Wealth:
    """The account of the looks a campaign recorded (RoundRecords: `round`, `dev_look` with `alpha` two-sided and,
    when a refund was possible, `reserved` and `charge` one-sided; `accepted`), those of rounds before `before` only
    when it is given."""
    w = Wealth(campaign_alpha, rounds, Spending(rule))
    for r in history:
        look = r.dev_look
        if look is None or (before is not None and r.round >= before):
            continue
        share = look.reserved if look.reserved is not None else look.alpha / 2
        w.settle(r.round, share, r.accepted, look.charge)
    return w


# -- the futility refund ---------------------------------------------------------------------------------------------

GRID = np.linspace(-8, 8, 1601)  # the z-statistic's grid (as gate._efficacy_levels integrates it)


@lru_cache(maxsize=16)
def _kernel(prev_t: float, t: float, theta: float) -> np.ndarray:
    """The transition of the z-statistic on GRID from information prev_t to t (B(t) = z sqrt(t): B(t) - B(prev_t) ~
    N(theta dt, dt)), weighted for the integral over the earlier grid."""
    z, h, dt = GRID, GRID[1] - GRID[0], t - prev_t
    kern = np.exp(-((z[None, :] * math.sqrt(t) - z[:, None] * math.sqrt(prev_t) - theta * dt) ** 2) / (2 * dt))
    weighted: np.ndarray = kern * h * math.sqrt(t / dt) / math.sqrt(2 * math.pi)
    return weighted


def _paths(fractions: tuple[float, ...], crit: tuple[float, ...], theta: float) -> tuple[list[float], list[float]]:
    """Under a drift `theta` (the z-statistic at information t is N(theta sqrt(t), 1)): per look, the chance of
    crossing `crit[g]` and the chance of a futility stop (z <= 0 at an interim look), each not stopped before."""
    z, h = GRID, GRID[1] - GRID[0]
    t0 = fractions[0]
    dens = np.exp(-((z - theta * math.sqrt(t0)) ** 2) / 2) / math.sqrt(2 * math.pi)
    cross, futile, prev_t = [], [], t0
    for g, t in enumerate(fractions):
        if g:
            dens = dens @ _kernel(prev_t, t, theta)
        # each grid cell [z - h/2, z + h/2] counted by the share of it beyond the boundary: P(promote) then moves
        # smoothly with the level (a whole-cell cut would step, and the level's search would chase the steps)
        up = np.clip((z - crit[g]) / h + 0.5, 0.0, 1.0)
        cross.append(float((dens * h * up).sum()))
        dens = dens * (1 - up)
        if g < len(fractions) - 1:
            low = np.clip(-z / h + 0.5, 0.0, 1.0)
            futile.append(float((dens * h * low).sum()))
            dens = dens * (1 - low)
        prev_t = t
    return cross, futile


@dataclass(frozen=True)
class Refund:
    """A round's test under the futility refund: it reserves `share` (one-sided), tests at `level` (one-sided,
    spent over the looks by the design's spending function), and a futility stop at interim look g is charged
    `charges[g-1]`; any other ending is charged `share`."""

    share: float
    level: float
    charges: tuple[float, ...]

    def charge(self, futile_at: int | None) -> float:
        """What a look that stopped for futility at look `futile_at` (None: it did not) is charged."""
        return self.share if futile_at is None or futile_at > len(self.charges) else self.charges[futile_at - 1]


def refund_budget(
    fractions: tuple[float, ...], spending: str, share: float, level: float, theta: float = 0.0
) -> tuple[float, float]:
    """(E[charge], P(promote)) of a round that reserves `share` and tests at `level` under drift `theta`."""
    from components.evolution.gate import SPENDING, _n01, efficacy_levels

    crit = tuple(_n01().inv_cdf(1 - p) for p in efficacy_levels(list(fractions), level, spending))
    cross, futile = _paths(fractions, crit, theta)
    charges = [SPENDING[spending](t, level) for t in fractions[:-1]]
    expected = share * (1 - sum(futile)) + sum(f * c for f, c in zip(futile, charges))
    return expected, sum(cross)


@lru_cache(maxsize=256)
def refund_design(fractions: tuple[float, ...], spending: str, share: float) -> Refund:
    """The largest one-sided level whose charges cover its false promotions under no effect (E[charge] >=
    P(promote), with a relative margin of 1e-3 for the integration's error). The slack E[charge] - P(promote) falls
    almost linearly in the level: secant steps from half the share find its root, then the level is stepped down
    until it is covered (checked, never assumed). One look: no interim look to stop at, the level is the share."""
    from components.evolution.gate import SPENDING

    if len(fractions) < 2 or share <= 0:
        return Refund(share, share, ())

    def slack(level: float) -> float:
        expected, promote = refund_budget(fractions, spending, share, level)
        return expected - promote * (1 + 1e-3)

    x0, x1 = 0.5 * share, 0.6 * share
    f0, f1 = slack(x0), slack(x1)
    for _ in range(4):
        if f1 == f0 or abs(f1) < 1e-6 * share:
            break
        x0, f0, x1 = x1, f1, min(share, max(1e-6 * share, x1 - f1 * (x1 - x0) / (f1 - f0)))
        f1 = slack(x1)
    level = x1 * (1 - 2e-3)  # below the root by more than the grid's noise in the slack
    while slack(level) < 0:  # checked, never assumed
        level *= 0.98
    return Refund(share, level, tuple(SPENDING[spending](t, level) for t in fractions[:-1]))


def naive_give_back(a: float, fractions: tuple[float, ...], spending: str = "pocock") -> tuple[float, float]:
    """The rule "a look stopped for futility gives back the part of its share its spending function did not
    reach", at the share's own level: (P(promote), E[charge]) of a round under no effect (exact). The charge falls
    short of the error: this rule does not keep the bound."""
    expected, promote = refund_budget(fractions, spending, a, a)
    return promote, expected
