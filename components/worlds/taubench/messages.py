"""A Ratchet episode as tau2 messages, and tau2's reward on them.

The conversion reads only the transcript (`Turn`s, what every checker reads), how the episode ran (its `Protocol`) and
whether the user ended the call:

    tau2's greeting (standard)             AssistantMessage, first, as tau2's orchestrator starts every simulation
    user turn                              UserMessage
    assistant message                      AssistantMessage(content)
    assistant tool call + its result       AssistantMessage(content or None, tool_calls=[ToolCall]) + ToolMessage
                                           (a success: the result as tau2 renders it; a refusal: tau2's own text,
                                           "Error: <message>"); the calls of one model message in one AssistantMessage,
                                           their results after it in order
    a call the harness blocked             its text only: it never reached tau2's tools
    `finish` (custom)                      its text only: a harness tool, tau2's agent stop
    `confirm` (custom)                     the question the customer was asked (an AssistantMessage: what it says is
                                           credited as tau2 credits a message) and the answer (a UserMessage)
    the user's closing line                UserMessage (###STOP###, ###TRANSFER###: tau2 keeps it)

Termination, as tau2's orchestrator would record it. Under tau2's protocol (`standard`): its count of steps (one a
message, a batch of tool results being one) and failed tool calls replayed over these messages, ending the simulation
at `max_steps` or `max_errors` (each overriding a user's stop) or at the user's stop token (`_as_orchestrated`). Under
Ratchet's harness (`custom`): `finish` is the agent's stop; a transfer to a human, or the user's stop token, the
user's stop. Anything else (the turn limit, a model error) is not a completed simulation, which tau2 scores 0. The
reward is tau2's: its environment, action and communicate evaluators on these messages, multiplied over the task's
`reward_basis` exactly as `tau2.evaluator.evaluator.evaluate_simulation` (evaluation type ALL) does. That function
itself is not called: its module imports tau2's LLM runner (litellm) through tau2's registry.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from components.runtime.protocol import CUSTOM, Protocol
from components.runtime.types import CONFIRM_TOOL, FINISH_TOOL, Turn
from components.worlds.base import Score
from components.worlds.taubench.user import STOP, STOP_TOKENS, confirm_question

HARNESS_TOOLS = frozenset({CONFIRM_TOOL, FINISH_TOOL})
TRANSFER = "transfer_to_human_agents"


def _body(text: str) -> dict:
    try:
        body = json.loads(text)
    except json.JSONDecodeError:
        return {}
    return body if isinstance(body, dict) else {}


def to_tau2(
    t2: SimpleNamespace, transcript: list[Turn], user_stopped: bool, final: str = "", protocol: Protocol = CUSTOM
) -> tuple[list, object]:
    """(tau2 messages, tau2 TerminationReason) for a Ratchet transcript (see the module doc)."""
    m = t2.message
    Term = t2.simulation.TerminationReason
    c = _Conversion(m, protocol, HARNESS_TOOLS if protocol.harness_tools else frozenset())
    if protocol.greeting:
        c.out.append(m.AssistantMessage(role="assistant", content=protocol.greeting))
    i = 0
    while i < len(transcript):
        t = transcript[i]
        if t.role == "user":
            c.say(m.UserMessage(role="user", content=t.text))
        elif t.role == "assistant" and t.tool is None:
            c.say(m.AssistantMessage(role="assistant", content=t.text))
        elif t.role == "assistant":
            result = transcript[i + 1] if i + 1 < len(transcript) and transcript[i + 1].role == "tool" else None
            i += 1 if result is not None else 0
            c.call(t, result)
        i += 1
    out = c.out
    if user_stopped:  # tau2 keeps the line that ended the call
        out.append(m.UserMessage(role="user", content=final or STOP))
    if protocol.max_steps is not None:
        return _as_orchestrated(t2, out, protocol, bool(protocol.greeting))
    if c.agent_stop:
        termination = Term.AGENT_STOP
    elif user_stopped or c.transferred:  # tau2's user answers a transfer with ###TRANSFER###
        termination = Term.USER_STOP
    else:
        termination = Term.MAX_STEPS
    return out, termination


class _Conversion:
    """The tau2 messages of a transcript so far, and what its calls said about how it ended."""

    def __init__(self, m: Any, protocol: Protocol, harness: frozenset) -> None:
        self.m, self.protocol, self.harness = m, protocol, harness
        self.out: list = []
        self.agent_stop = self.transferred = False
        self.batch: Any = None  # the assistant message the last executed call went into (a parallel call joins it)
        self.n = 0  # tool calls so far (their ids)

    def say(self, msg: Any) -> None:
        """A message of its own: a later parallel call starts a new assistant message."""
        self.out.append(msg)
        self.batch = None

    def call(self, t: Turn, result: Turn | None) -> None:
        """An assistant's tool call and its result (None: it was never executed)."""
        body = _body(result.text) if result is not None else {}
        blocked = result is None or body.get("code") == "blocked"
        if t.tool in self.harness or blocked:
            self._not_executed(t, result, blocked)
        else:
            assert result is not None  # (not blocked: it ran)
            self._executed(t, result, body)

    def _not_executed(self, t: Turn, result: Turn | None, blocked: bool) -> None:
        """A harness tool or a blocked call: tau2 sees what the agent said, a confirmation as its question and the
        customer's answer."""
        m = self.m
        if t.text and t.text.strip():
            self.say(m.AssistantMessage(role="assistant", content=t.text))
        if not blocked and t.tool == FINISH_TOOL:
            self.agent_stop = True
        elif not blocked and t.tool == CONFIRM_TOOL and result.ok:
            # what the customer was asked is what the agent said: credited as tau2 credits a message
            a = result.args
            self.out.append(
                m.AssistantMessage(
                    role="assistant",
                    content=confirm_question(a.get("tool"), a.get("args") or {}, a.get("summary") or ""),
                )
            )
            self.say(m.UserMessage(role="user", content="Yes." if result.granted else "No."))

    def _executed(self, t: Turn, result: Turn, body: dict) -> None:
        """A call the world ran: a tau2 tool call (joining the last assistant message when parallel) and its result."""
        m = self.m
        self.n += 1
        call = m.ToolCall(id=f"call-{self.n}", name=t.tool, arguments=dict(result.args), requestor="assistant")
        if result.ok:
            content, error = _text(result, self.protocol), False
        else:  # tau2's own rendering of a tool's exception (`Environment.get_response`)
            content, error = f"Error: {body.get('error', '') if body else _error_of(result.text)}", True
        tool_msg = m.ToolMessage(id=call.id, role="tool", content=content, requestor="assistant", error=error)
        if t.parallel and self.batch is not None:  # the same model message: tau2 runs its calls in order
            self.batch.tool_calls.append(call)
            self.out.append(tool_msg)
        else:
            self.batch = m.AssistantMessage(role="assistant", content=t.text or None, tool_calls=[call])
            self.out += [self.batch, tool_msg]
        if t.tool == TRANSFER:
            self.transferred = True


def _text(result: Turn, protocol: Protocol) -> str:
    """A successful call's result as tau2's `get_response` renders it: under tau2's protocol the model read exactly
    that; under Ratchet's harness, the receipt's JSON re-encoded as tau2 encodes a result."""
    if protocol.text_results:
        return result.text
    try:
        content = json.loads(result.text)
    except json.JSONDecodeError:
        return result.text
    return content if isinstance(content, str) else json.dumps(content)


def _error_of(text: str) -> str:
    return text.removeprefix("Error: ")


def _as_orchestrated(t2: SimpleNamespace, msgs: list, protocol: Protocol, greeting: bool) -> tuple[list, object]:
    """The messages and termination as tau2's `Orchestrator.run` would have them: it counts a step per message (a
    batch of tool results being one) and, after each one that goes to the agent or the user, ends the simulation at
    `max_steps` steps, then at `max_errors` failed tool calls (each overriding a user's stop); a user's stop token
    ends it. Messages after the end are not the simulation's; a conversation that never ends was cut off (by a model
    fault, or the run's safety cap): not completed."""
    Term = t2.simulation.TerminationReason
    m = t2.message
    steps = errors = 0
    j = 1 if greeting else 0
    while j < len(msgs):
        msg = msgs[j]
        term = None
        if isinstance(msg, m.AssistantMessage) and msg.is_tool_call():
            k = len(msg.tool_calls)
            errors += sum(1 for r in msgs[j + 1 : j + 1 + k] if r.error)
            steps += 2
            j += k
        else:
            steps += 1
            if isinstance(msg, m.UserMessage) and any(tok in (msg.content or "") for tok in STOP_TOKENS):
                term = Term.USER_STOP
        if steps >= protocol.max_steps:
            term = Term.MAX_STEPS
        if protocol.max_errors is not None and errors >= protocol.max_errors:
            term = Term.TOO_MANY_ERRORS
        if term is not None:
            return msgs[: j + 1], term
        j += 1
    return msgs, Term.MAX_STEPS


def reward(t2: SimpleNamespace, task, messages: list, termination, construct: Callable) -> Score:
    """tau2's reward for `messages` (evaluation type ALL): 0 unless the simulation completed; else the product of the
    environment (DB, ENV_ASSERTION), action (ACTION) and communicate (COMMUNICATE) rewards over the task's basis."""
    Term = t2.simulation.TerminationReason
    RT = t2.tasks.RewardType
    if termination not in {Term.AGENT_STOP, Term.USER_STOP}:
        return Score(reward=0.0, success=False, criteria={"completed": 0.0})
    crit = task.evaluation_criteria
    if crit is None:
        return Score(reward=1.0, success=True, criteria={"completed": 1.0})
    basis = set(crit.reward_basis)
    if RT.NL_ASSERTION in basis:  # evaluate_simulation refuses this too under evaluation type ALL
        raise ValueError(f"tau2 task {task.id}: NL_ASSERTION in reward_basis needs an LLM judge")
    env = t2.EnvironmentEvaluator.calculate_reward(
        environment_constructor=construct, task=task, full_trajectory=messages, solo_mode=False
    )
    action = t2.ActionEvaluator.calculate_reward(task=task, full_trajectory=messages)
    communicate = t2.CommunicateEvaluator.calculate_reward(task=task, full_trajectory=messages)
    value = 1.0
    parts: dict[str, float] = {"completed": 1.0}
    for bases, info in (({RT.DB, RT.ENV_ASSERTION}, env), ({RT.ACTION}, action), ({RT.COMMUNICATE}, communicate)):
        if basis & bases:
            parts.update(
                {k.value if hasattr(k, "value") else str(k): float(v) for k, v in (info.reward_breakdown or {}).items()}
            )
            value *= info.reward
    return Score(reward=float(value), success=value == 1.0, criteria=parts)
