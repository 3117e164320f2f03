"""The gate's inputs and verdicts, without numpy or pandas (components.params and the CLI's option defaults read
them): the pairing's errors, the input bounds and `GateConfig`, and the results the gate returns with their file
form (`as_dict`, `from_dict`). The arithmetic is components/evolution/gate.py's, which re-exports the public names here."""

from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

from components.errors import InputError


class PairingError(InputError):
    """The two arms are not a complete pairing; no statistic is computed."""


class TooManyErrors(PairingError):
    """So many (item, seed) pairs errored that what is left cannot stand for the benchmark: the gate refuses."""


class TooFewItems(PairingError):
    """Fewer items than `min_items`: a bootstrap over so few items has no width to trust."""


MIN_ITEMS = 5  # with fewer items the percentile bootstrap is degenerate (1 item: a zero-width CI)
MIN_BOOT = 1_000  # below this the CI's own Monte-Carlo error is a sizeable share of its width
MAX_BOOT = 1_000_000  # above this the CI does not move, only the time and memory grow (10^11 ran out of memory)


def _finite(
    name: str, v: object, lo: float, hi: float = math.inf, *, lo_open: bool = False, hi_open: bool = False
) -> None:
    """One home for the gate's input bounds (the CLI, params.yaml and the library all land here)."""
    try:
        x = float(v)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise InputError(f"gate: {name}: {v!r} is not a number") from None
    if not math.isfinite(x):
        raise InputError(f"gate: {name}: {v!r} is not a finite number")
    if x < lo or (lo_open and x == lo) or x > hi or (hi_open and x == hi):
        left, right = "(" if lo_open else "[", ")" if hi_open or hi == math.inf else "]"
        raise InputError(f"gate: {name}: {v!r} is not in {left}{lo:g}, {hi:g}{right}")


@dataclass(frozen=True)
class GateConfig:
    alpha: float = 0.05
    n_boot: int = 10_000
    seed: int = 0
    reg_cap: int = 2
    material: float = 0.05
    max_error_share: float = 0.25
    min_items: int = MIN_ITEMS
    campaign_alpha: float = 0.05  # a campaign's budget for P(any false promotion) over all its dev looks
    # the regression cap grows with the items compared: a candidate that really changes behaviour perturbs a share of
    # items, so an absolute count rejects more real improvements the larger dev is (0: the absolute reg_cap only).
    # 0.1 keeps null and harmful candidates at 0% promoted (benchmarks/README.md, "A proportional regression cap")
    reg_share: float = 0.1
    # cost as a second objective: a candidate whose score stays within `material` of the parent (the lower bound of
    # the paired difference above -material) and whose prompt tokens per episode drop (the upper bound of their
    # paired difference below 0) is promoted as "cheaper" (off: only "better" promotes). The two claims share the
    # look's alpha half and half (`route_alpha`): a change within the margin whose tokens do not drop could
    # otherwise be promoted falsely by either route, up to twice the look's share
    cheaper: bool = False

    @property
    def route_alpha(self) -> float:
        """The two-sided alpha each claim ("better", "cheaper") is tested at: all of `alpha` without the cost
        objective, half of it with."""
        return self.alpha / 2 if self.cheaper else self.alpha

    def cap(self, n_items: int) -> int:
        """Regressed items allowed among n_items compared."""
        return max(int(self.reg_cap), math.floor(self.reg_share * n_items + 1e-9))

    def __post_init__(self) -> None:
        _finite("alpha", self.alpha, 0, 1, lo_open=True, hi_open=True)
        _finite("campaign_alpha", self.campaign_alpha, 0, 0.5, lo_open=True, hi_open=True)
        _finite("material", self.material, 0, 1)
        _finite("reg_cap", self.reg_cap, 0)
        _finite("max_error_share", self.max_error_share, 0, 1)
        _finite("reg_share", self.reg_share, 0, 1)
        if not isinstance(self.cheaper, bool):
            raise InputError(f"gate: cheaper: {self.cheaper!r} is not true or false")
        for name in ("n_boot", "seed", "reg_cap", "min_items"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Integral):  # int or a numpy integer
                raise InputError(f"gate: {name}: {v!r} is not an integer")
        if self.n_boot < MIN_BOOT:
            raise InputError(
                f"gate: n_boot: {self.n_boot} is below {MIN_BOOT} (the CI would carry its own sampling noise)"
            )
        if self.n_boot > MAX_BOOT:
            raise InputError(f"gate: n_boot: {self.n_boot} is above {MAX_BOOT} (more resamples do not move the CI)")
        if self.seed < 0:
            raise InputError(f"gate: seed: {self.seed} must be >= 0")
        if self.min_items < 2:
            raise InputError(f"gate: min_items: {self.min_items} must be at least 2")


REFUSED_DROPPED = -1  # how files spell a refusal's dropped_errors (GateResult.dropped_errors is None)


class PromotedAs(StrEnum):
    """What an accept promotes with the cost objective on (`gate.cheaper`): a better score, or the same score within
    `material` at fewer prompt tokens per episode."""

    BETTER = "better"
    CHEAPER = "cheaper"


COST_FIELDS = ("promoted_as", "tokens_net", "tokens_ci_lo", "tokens_ci_hi")  # absent from files when not computed


@dataclass(frozen=True)
class GateResult:
    accept: bool
    net: float
    ci_lo: float
    ci_hi: float
    n_items: int
    n_improved: int
    n_regressed: int
    reason: str
    base_mean: float = 0.0
    cand_mean: float = 0.0
    # (item, seed) pairs dropped because an arm errored; None: the gate refused, too many errored to compare anything
    dropped_errors: int | None = 0
    # with GateConfig.cheaper: what an accept promotes ("better" | "cheaper") and the paired difference of prompt
    # tokens per episode (cand - base) with its bound at the same level; None (and absent from files) otherwise
    promoted_as: PromotedAs | None = None
    tokens_net: float | None = None
    tokens_ci_lo: float | None = None
    tokens_ci_hi: float | None = None

    @property
    def refused(self) -> bool:
        return self.dropped_errors is None

    def as_dict(self) -> dict[str, Any]:
        """The verdict as gate.json, round.json, the lineage and MLflow have it (a refusal's dropped_errors: -1;
        the cost figures only when they were computed)."""
        d = asdict(self)
        if self.refused:
            d["dropped_errors"] = REFUSED_DROPPED
        for k in COST_FIELDS:
            if d[k] is None:
                del d[k]
        if "promoted_as" in d:
            d["promoted_as"] = str(d["promoted_as"])
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GateResult:
        """A verdict as `as_dict` wrote it (keys it does not know, from another Ratchet, are left out)."""
        kept = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        if kept.get("dropped_errors") == REFUSED_DROPPED:
            kept["dropped_errors"] = None
        if kept.get("promoted_as") is not None:
            kept["promoted_as"] = PromotedAs(kept["promoted_as"])
        return cls(**kept)


@dataclass(frozen=True)
class RepairResult:
    ok: bool
    repaired: int
    broken: int
    base_mean: float
    cand_mean: float
    n_items: int
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RepairResult:
        """A screen's result as `as_dict` wrote it (keys it does not know, from another Ratchet, are left out)."""
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


@dataclass(frozen=True)
class SequentialResult:
    accept: bool
    look: int  # the look that decided (1-based)
    n_looks: int
    n_seen: int
    n_items: int
    reason: str
    looks: tuple[dict[str, Any], ...] = ()  # each look's figures (gate.sequential_gate)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class RemovalResult:
    """A card removal under a model that may no longer need the card: two paired intervals over the same items.

    score   d_i = cand - base (mean over seeds), its bootstrap CI: non-inferior iff ci_lo > -material
    tokens  t_i = cand - base prompt tokens per episode (mean over seeds), its bootstrap CI: cheaper iff ci_hi < 0
    Accepted iff both, and regressed items <= the cap. Ties on tokens (or a score CI reaching below -material) keep
    the parent: "ties keep the parent" still holds for score, and a removal must pay for itself in tokens."""

    accept: bool
    reason: str
    net: float
    ci_lo: float
    ci_hi: float
    tokens_net: float
    tokens_ci_lo: float
    tokens_ci_hi: float
    base_tokens: float
    cand_tokens: float
    n_items: int
    n_regressed: int
    base_mean: float = 0.0
    cand_mean: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
