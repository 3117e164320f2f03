"""Test doubles for τ²-bench over the OpenAI protocol, shared by tests/test_tau2.py and benchmarks/bench_tau2_*.py.

`PolicyBlind`: the gold agent (`components.worlds.taubench.gold`), except that it breaks one written rule of each tau2
domain, the way an agent that did not read the policy would:
  retail   a return's refund goes to a gift card of the customer's (or, with none, another payment method of
           theirs; with no other, a made-up one) instead of the order's original payment method (policy: "the refund
           must either go to the original payment method, or an existing gift card" and tau2's gold always takes the
           original). A gift card goes through (a wrong database); anything else tau2's tool refuses.
  airline  a flight change or a baggage update is paid with the customer's travel certificate (a made-up one if
           they have none), where the policy asks for "a single gift card or credit card": tau2's tool refuses it.
`served(agent, strict_system=...)`: any chat model behind `ratchet serve-sim`'s OpenAI-compatible app, on loopback."""

from __future__ import annotations

import contextlib
import socket
import threading
import time

from components.worlds.taubench.gold import GoldAgent

MADE_UP = {"retail": "credit_card_0000000", "airline": "certificate_0000000"}
BROKEN = {
    "retail": {"return_delivered_order_items": "payment_method_id"},
    "airline": {"update_reservation_flights": "payment_id", "update_reservation_baggages": "payment_id"},
}


class PolicyBlind(GoldAgent):
    name = "policy-blind"

    def __init__(self, benchmark):
        super().__init__(benchmark)
        from components.worlds import load_benchmark
        from components.worlds.taubench import DOMAINS

        bench = load_benchmark(self.root)
        self.db, self.domain = bench.db, DOMAINS[bench.world]

    def complete(self, messages, *, tools, seed, json_mode=False):
        # a state proposal, wherever the harness puts its instruction (an older server passed no JSON mode on for it)
        proposal = any(m.get("role") == "system" and "# Ledger update" in (m.get("content") or "") for m in messages)
        return super().complete(messages, tools=tools, seed=seed, json_mode=json_mode or proposal)

    def plan(self, first_message: str):
        task_id, plan, communicate = super().plan(first_message)
        return task_id, [(name, self._blind(name, dict(args))) for name, args in plan or []], communicate

    def _blind(self, name: str, args: dict) -> dict:
        field = BROKEN[self.domain].get(name)
        if field is None or field not in args:
            return args
        if self.domain == "retail":
            order = self.db["orders"].get(args.get("order_id"), {})
            original = (order.get("payment_history") or [{}])[0].get("payment_method_id")
            methods = sorted(self.db["users"].get(order.get("user_id"), {}).get("payment_methods", {}))
            others = [m for m in methods if m != original]
            gift = [m for m in others if m.startswith("gift_card")]
            return {**args, field: (gift or others or [MADE_UP["retail"]])[0]}
        reservation = self.db["reservations"].get(args.get("reservation_id"), {})
        methods = sorted(self.db["users"].get(reservation.get("user_id"), {}).get("payment_methods", {}))
        return {**args, field: next((m for m in methods if m.startswith("certificate")), MADE_UP["airline"])}


@contextlib.contextmanager
def served(agent, strict_system: bool = True):
    """`agent` behind serve-sim's app on a free loopback port; yields the base URL (…/v1)."""
    import uvicorn

    from components.models.server import create_app

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    strict = {"strict_system": True} if strict_system else {}  # (an older app, measured by benchmarks, has none)
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(agent=agent, **strict), host="127.0.0.1", port=port, log_level="error", access_log=False
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
