"""Parity against tau2 itself, shared by tests/test_tau2.py and benchmarks/bench_tau2_parity.py.

One scripted plan (`moves`: what the agent says or calls, message by message) is played twice:
- through Ratchet: its kernel, port and harness under the benchmark's protocol, scored by the world (`ratchet_run`);
- through tau2 alone: tau2's own `Orchestrator` (its limits `max_steps` 200 and `max_errors` 10, its step counting,
  its environment answering every call) with a tau2 agent that sends the same messages and a tau2 user that answers
  as Ratchet's scripted user does, graded by tau2's `evaluate_simulation` (`orchestrated_reward`).

Plans (`VARIANTS`), each a function of the task's gold: the gold actions one message each, then the task's
communicate_info in a message; ten failing calls first (tau2 ends the simulation: 0); a hundred harmless calls first
(past the 200 steps); the gold in parallel batches of two calls a message; the communicate_info left out; the team's
mutations of the gold (a write dropped, an argument changed, an extra write, a write repeated). Under Ratchet's
`custom` protocol: the gold ended with `finish` (tau2's agent stop), and the communicate_info said only in a
`confirm` before the first write (tau2's agent asks the same question in a message)."""

from __future__ import annotations

import json
import sys
import types
from copy import deepcopy

from tests.conftest import ROOT

NONE = ROOT / "data" / "packages" / "none"
MUTATIONS = ("drop_write", "change_arg", "extra_write")
STANDARD_VARIANTS = ("gold", "errors_first", "steps_first", "parallel", "no_communicate", *MUTATIONS, "duplicate_write")
CUSTOM_VARIANTS = ("gold", "confirm_info", "parallel")
ERRORS, STEPS = 10, 100  # failing calls first; harmless calls first (200 steps and more)
NOBODY = "nobody_00000"  # a user id no tau2 database holds: `get_user_details` refuses it (an error in tau2's count)


def _stub_litellm():
    """tau2's orchestrator and evaluator import its LLM runner, and through it litellm, left out of this install (the
    worlds never import it). For the reference runs only, an inert stand-in module answers that import; nothing here
    calls an LLM. Returns the names to remove after the import."""
    if "litellm" in sys.modules:
        return []
    try:
        import litellm  # noqa: F401

        return []
    except ImportError:
        pass

    class _Inert(types.ModuleType):
        def __getattr__(self, name):
            return type(name, (), {"__init__": lambda self, *a, **k: None})

    stubs = ["litellm", "litellm.caching", "litellm.caching.caching", "litellm.main"]
    for mod in stubs:
        sys.modules[mod] = _Inert(mod)
    return stubs


def _tau2(*names: str):
    stubs = _stub_litellm()
    try:
        from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation
        from tau2.orchestrator.orchestrator import Orchestrator
    finally:  # the stand-in leaves with the import: nothing else in the process may take it for litellm
        for mod in stubs:
            sys.modules.pop(mod, None)
    got = {"evaluate_simulation": evaluate_simulation, "EvaluationType": EvaluationType, "Orchestrator": Orchestrator}
    return [got[n] for n in names]


def tau2_evaluate_simulation():
    return tuple(_tau2("evaluate_simulation", "EvaluationType"))


# -- plans -------------------------------------------------------------------------------------------------------------


def _gold(bench, item: str):
    from components.worlds.taubench.world import CRITERION

    t = bench.tasks[item]
    ec = next(c for c in t.rubric if c.check == CRITERION).args["task"].get("evaluation_criteria") or {}
    actions = [(a["name"], dict(a.get("arguments") or {})) for a in ec.get("actions") or []]
    return actions, list(ec.get("communicate_info") or [])


def moves(bench, item: str, variant: str) -> list[tuple] | None:
    """The plan: ("say", text) | ("calls", [(tool, args), ...]) | ("confirm", tool, args, summary); None when the
    variant does not apply to the task (a mutation with nothing to edit)."""
    from components.models import make_model
    from components.worlds.taubench import DOMAINS, TARGETS
    from components.worlds.taubench.gold import communicate_text

    actions, infos = _gold(bench, item)
    domain = DOMAINS[bench.world]
    tell = [("say", communicate_text(infos))] if infos else []
    one = [("calls", [a]) for a in actions]
    if variant == "gold":
        return one + tell
    if variant == "errors_first":
        return [("calls", [("get_user_details", {"user_id": NOBODY})])] * ERRORS + one + tell
    if variant == "steps_first":
        return [("calls", [("calculate", {"expression": "1 + 1"})])] * STEPS + one + tell
    if variant == "parallel":
        return [("calls", actions[k : k + 2]) for k in range(0, len(actions), 2)] + tell
    if variant == "no_communicate":
        return one if infos else None
    if variant == "confirm_info":
        if not infos:
            return None
        write = next(((n, a) for n, a in actions if n in TARGETS[domain]), None)
        tool, args = write if write else (sorted(TARGETS[domain])[0], {})
        ident = {k: args[k] for k in TARGETS[domain][tool] if k in args}
        at = next((i for i, (n, _) in enumerate(actions) if (n, _) == write), len(actions)) if write else len(actions)
        return one[:at] + [("confirm", tool, ident, communicate_text(infos))] + one[at:]
    if variant == "duplicate_write":
        k = next((i for i, (n, _) in enumerate(actions) if n in TARGETS[domain]), None)
        return None if k is None else one[: k + 1] + [one[k]] + one[k + 1 :] + tell
    model = make_model("gold", {"benchmark": str(bench.root), "mutation": variant})
    _, plan, _ = model.plan(bench.tasks[item].first_message)
    return None if plan is None else [("calls", [a]) for a in plan] + tell


# -- Ratchet's side ----------------------------------------------------------------------------------------------------


class PlanModel:
    """A chat model that plays `moves` one model message each (parallel calls as one reply), then talks on until
    the user ends the call (tau2's protocol offers no `finish`) or, where `finish` is offered, finishes."""

    name = "plan"

    def __init__(self, plan: list[tuple]):
        self.plan = list(plan)
        self.k = 0

    def complete(self, messages, *, tools, seed, json_mode=False):
        from components.models.base import ChatResult
        from components.runtime.types import FINISH_TOOL, ToolCall
        from components.worlds.taubench.gold import CLOSING, EMPTY_PROPOSAL

        if json_mode:
            return ChatResult(content=EMPTY_PROPOSAL)
        if self.k >= len(self.plan):
            if any(t["function"]["name"] == FINISH_TOOL for t in tools or []):
                return ChatResult(tool_calls=[ToolCall(id="done", name=FINISH_TOOL, args={"summary": "done"})])
            return ChatResult(content=CLOSING)
        move, k = self.plan[self.k], self.k
        self.k += 1
        if move[0] == "say":
            return ChatResult(content=move[1])
        if move[0] == "confirm":
            return ChatResult(
                tool_calls=[
                    ToolCall(id=f"p{k}", name="confirm", args={"tool": move[1], "args": move[2], "summary": move[3]})
                ]
            )
        return ChatResult(tool_calls=[ToolCall(id=f"p{k}-{j}", name=n, args=a) for j, (n, a) in enumerate(move[1])])


def episode(bench, item: str, model, max_turns: int = 80):
    """One episode through Ratchet's kernel and port (what `run_episode` does), keeping the environment and port."""
    from components.memory.package import load_package
    from components.runtime.chat import ChatHarness
    from components.runtime.episode import episode_seed, protocol_of, turn_cap
    from components.runtime.kernel import Episode, run_turn
    from components.worlds import world

    env = world(bench.world).make_env(bench, bench.tasks[item])
    protocol = protocol_of(env)
    port = ChatHarness(env, model, episode_seed(item, 0), targets=bench.targets, protocol=protocol)
    ep = Episode.start(f"{item}#0", load_package(NONE), sealed=False)
    port.start()
    while not port.ended and len(ep.steps) < turn_cap(protocol, max_turns):
        run_turn(ep, port)
    return env, port


def ratchet_run(bench, item: str, plan: list[tuple]) -> tuple[float, str]:
    """(Ratchet's score, how the harness saw the episode end) for the plan."""
    env, port = episode(bench, item, PlanModel(plan))
    return env.score(port.transcript()).reward, str(port.ended_by)


# -- tau2's side -------------------------------------------------------------------------------------------------------


def orchestrated_reward(bench, item: str, plan: list[tuple], agent_stops: bool = False) -> tuple[float, str]:
    """(tau2's reward, its termination reason) for the plan run by tau2's own Orchestrator, with its own environment
    over the benchmark's database and tau2's defaults (max_steps 200, max_errors 10). `agent_stops`: after the plan
    the agent stops (Ratchet's `finish`) instead of talking on until the user ends the call."""
    from tau2.agent.base import LocalAgent
    from tau2.config import DEFAULT_MAX_ERRORS, DEFAULT_MAX_STEPS
    from tau2.data_model.message import AssistantMessage, ToolCall, UserMessage
    from tau2.user.base import BaseUser, UserState

    from components.worlds.taubench import DOMAINS
    from components.worlds.taubench.gold import CLOSING
    from components.worlds.taubench.user import SCRIPTED_REPLIES, STOP, TRANSFER, confirm_question, scripted_reply
    from components.worlds.taubench.world import environment_constructor

    Orchestrator, evaluate_simulation, EvaluationType = _tau2("Orchestrator", "evaluate_simulation", "EvaluationType")
    domain = DOMAINS[bench.world]
    env_ratchet = None
    from components.worlds import world

    env_ratchet = world(bench.world).make_env(bench, bench.tasks[item])  # the tau2 task, and the first message
    task = env_ratchet.tau_task
    first = bench.tasks[item].first_message
    known = (getattr(task.user_scenario.instructions, "known_info", None) or "").strip()
    environment = environment_constructor(domain, bench)()
    transferred = []
    get_response = environment.get_response

    def response(call):
        msg = get_response(call)
        if call.name == "transfer_to_human_agents" and not msg.error:
            transferred.append(True)
        return msg

    environment.get_response = response

    class Agent(LocalAgent):
        def __init__(self):
            super().__init__(tools=environment.get_tools(), domain_policy=environment.get_policy())
            self.k = 0

        def get_init_state(self, message_history=None):
            return None

        def generate_next_message(self, message, state):
            if self.k >= len(plan):
                content = "###STOP###" if agent_stops else CLOSING
                return AssistantMessage(role="assistant", content=content), state
            move, k = plan[self.k], self.k
            self.k += 1
            if move[0] == "say":
                return AssistantMessage(role="assistant", content=move[1]), state
            if move[0] == "confirm":
                return AssistantMessage(role="assistant", content=confirm_question(*move[1:])), state
            calls = [
                ToolCall(id=f"p{k}-{j}", name=n, arguments=deepcopy(a), requestor="assistant")
                for j, (n, a) in enumerate(move[1])
            ]
            return AssistantMessage(role="assistant", tool_calls=calls), state

        @classmethod
        def is_stop(cls, message):
            return message.content == "###STOP###"

        def set_seed(self, seed):
            pass

    class User(BaseUser):
        """Ratchet's scripted user in tau2's terms: the task's first message, then "Yes. <known info>" to every
        message, ###TRANSFER### after a transfer, ###STOP### after SCRIPTED_REPLIES replies."""

        def __init__(self):
            super().__init__(instructions=None)
            self.n = None

        def get_init_state(self, message_history=None):
            return UserState(system_messages=[], messages=[])

        def generate_next_message(self, message, state):
            if self.n is None:
                self.n, text = 0, first
            elif transferred:
                text = TRANSFER
            elif self.n >= SCRIPTED_REPLIES:
                text = STOP
            else:
                self.n += 1
                text = scripted_reply(known)
            return UserMessage(role="user", content=text), state

        @classmethod
        def is_stop(cls, message):
            return False  # the orchestrator asks tau2's UserSimulator.is_stop

        def set_seed(self, seed):
            pass

    run = Orchestrator(
        domain,
        agent=Agent(),
        user=User(),
        environment=environment,
        task=task,
        max_steps=DEFAULT_MAX_STEPS,
        max_errors=DEFAULT_MAX_ERRORS,
    ).run()
    info = evaluate_simulation(run, task, EvaluationType.ALL, solo_mode=False, domain=domain)
    return float(info.reward), str(getattr(run.termination_reason, "value", run.termination_reason))


def parity_rows(bench, variant: str, items: list[str] | None = None) -> list[tuple[str, float, float, str, str]]:
    """(item, Ratchet's score, tau2's reward, Ratchet's end, tau2's termination) for each item (default: every
    task) the variant applies to, under the benchmark's protocol."""
    rows = []
    custom = bench.protocol == "custom"
    for item in items if items is not None else sorted(bench.tasks):
        plan = moves(bench, item, variant)
        if plan is None:
            continue
        ours, end = ratchet_run(bench, item, plan)
        ref, term = orchestrated_reward(bench, item, plan, agent_stops=custom)
        rows.append((item, ours, ref, end, term))
    return rows


def materialized(root, name: str, protocol: str = "standard"):
    """The world's benchmark (seed 0) under `protocol`, materialized at `root` once."""
    from pathlib import Path

    from components.params import BenchmarkParams
    from components.worlds import load_benchmark

    out = Path(root) / f"{name}-{protocol}"
    if not out.exists():
        BenchmarkParams(world=name, seed=0, out=str(out), per_family=None, protocol=protocol).materialize()
    return load_benchmark(out)


def dump(rows) -> str:
    return json.dumps(rows)
