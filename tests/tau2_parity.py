"""Gold parity against tau2's own grader, shared by tests/test_tau2.py and benchmarks/bench_tau2_parity.py.

An episode runs through Ratchet's kernel and port (`episode`); Ratchet's score is the world's (`Tau2Env.score`); the
reference is tau2 alone (`native_reward`): the episode's messages rebuilt as tau2 objects, every tool call answered by
a fresh tau2 environment's own `get_response` (not by Ratchet's receipts), graded by tau2's `evaluate_simulation`."""

from __future__ import annotations

import json
import sys
import types

from tests.conftest import ROOT

NONE = ROOT / "data" / "packages" / "none"
MUTATIONS = ("drop_write", "change_arg", "extra_write")


def tau2_evaluate_simulation():
    """tau2's own `evaluate_simulation`. Its module imports tau2's registry, which imports tau2's LLM runner and so
    litellm, left out of this install (the worlds never import it). For this native reference only, an inert stand-in
    module answers that import; nothing here calls an LLM."""
    stubs = []
    if "litellm" not in sys.modules:
        try:
            import litellm  # noqa: F401
        except ImportError:
            class _Inert(types.ModuleType):
                def __getattr__(self, name):
                    return type(name, (), {"__init__": lambda self, *a, **k: None})

            stubs = ["litellm", "litellm.caching", "litellm.caching.caching", "litellm.main"]
            for mod in stubs:
                sys.modules[mod] = _Inert(mod)
    try:
        from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation
    finally:  # the stand-in leaves with the import: nothing else in the process may take it for litellm
        for mod in stubs:
            sys.modules.pop(mod, None)
    return evaluate_simulation, EvaluationType


def episode(bench, item: str, model, max_turns: int = 80):
    """One episode through Ratchet's kernel and port (what `run_episode` does), keeping the port's message history."""
    from components.memory.package import load_package
    from components.runtime.chat import ChatHarness
    from components.runtime.episode import episode_seed
    from components.runtime.kernel import Episode, run_turn
    from components.worlds import world

    env = world(bench.world).make_env(bench, bench.tasks[item])
    port = ChatHarness(env, model, episode_seed(item, 0), targets=bench.targets)
    ep = Episode.start(f"{item}#0", load_package(NONE), sealed=False)
    while not port.ended and len(ep.steps) < max_turns:
        run_turn(ep, port)
    return env, port


def native_reward(domain: str, env, port) -> float:
    """tau2 alone: the episode's messages rebuilt as tau2 objects, every tool call answered by a fresh tau2
    environment's own `get_response` (not by Ratchet's receipts), graded by tau2's `evaluate_simulation`."""
    from tau2.data_model.message import AssistantMessage, ToolCall, UserMessage
    from tau2.data_model.simulation import SimulationRun, TerminationReason

    evaluate_simulation, EvaluationType = tau2_evaluate_simulation()
    from importlib import import_module

    native = import_module(f"tau2.domains.{domain}.environment").get_environment()
    tau_tools = {t.name for t in native.get_tools()}
    msgs, stop = [], TerminationReason.USER_STOP if env.user_stopped else TerminationReason.MAX_STEPS
    results = {m["tool_call_id"]: json.loads(m["content"]) for m in port.messages if m["role"] == "tool"}
    results = {k: v if isinstance(v, dict) else {} for k, v in results.items()}  # only a refusal's code is read
    for m in port.messages:
        if m["role"] == "user":
            msgs.append(UserMessage(role="user", content=m["content"]))
        elif m["role"] == "assistant" and not m.get("tool_calls"):
            msgs.append(AssistantMessage(role="assistant", content=m["content"]))
        elif m["role"] == "assistant":
            (c,) = m["tool_calls"]
            name, args = c["function"]["name"], json.loads(c["function"]["arguments"])
            if name == "finish" and results[c["id"]].get("finished"):
                stop = TerminationReason.AGENT_STOP
            if name not in tau_tools or results[c["id"]].get("code") == "blocked":
                continue
            call = ToolCall(id=c["id"], name=name, arguments=args, requestor="assistant")
            msgs.append(AssistantMessage(role="assistant", content=m["content"] or None, tool_calls=[call]))
            msgs.append(native.get_response(call))
            if name == "transfer_to_human_agents" and stop != TerminationReason.AGENT_STOP:
                stop = TerminationReason.USER_STOP
    run = SimulationRun(id="parity", task_id=env.tau_task.id, start_time="", end_time="", duration=0.0,
                        termination_reason=stop, messages=msgs)
    return evaluate_simulation(run, env.tau_task, EvaluationType.ALL, solo_mode=False, domain=domain).reward


def parity_rows(bench, domain: str, mutation: str | None, items: list[str] | None = None) -> list[tuple[str, float, float]]:
    """(item, Ratchet's score, tau2's native reward) for each item (default: every task) the mutation applies to."""
    from components.models import make_model

    model = make_model("gold", {"benchmark": str(bench.root), **({"mutation": mutation} if mutation else {})})
    rows = []
    for item in items if items is not None else sorted(bench.tasks):
        _, plan, _ = model.plan(bench.tasks[item].first_message)
        if plan is None:  # the mutation does not apply (no gold write to drop or change)
            continue
        env, port = episode(bench, item, model)
        ours = env.score(port.transcript()).reward
        rows.append((item, ours, native_reward(domain, env, port)))
    return rows


