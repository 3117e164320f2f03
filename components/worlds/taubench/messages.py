"""A Ratchet episode as tau2 messages, and tau2's reward on them.

The conversion reads only the transcript (`Turn`s, what every checker reads) and whether the user ended the call:

    user turn                              UserMessage
    assistant message                      AssistantMessage(content)
    assistant tool call + its result       AssistantMessage(content or None, tool_calls=[ToolCall]) + ToolMessage
                                           (a success: the result JSON as the model saw it; a refusal: tau2's own
                                           text, "Error: <message>")
    a call the harness blocked             its text only: it never reached tau2's tools
    `confirm`, `finish`                    their text only: harness tools, not tau2's

Termination, as tau2's orchestrator would record it: `finish` is the agent's stop; a transfer to a human, or the user's
stop token, the user's stop; anything else (the turn budget, a model error) is not a completed simulation, which
tau2 scores 0. The reward is tau2's: its environment, action and communicate evaluators on these messages, multiplied
over the task's `reward_basis` exactly as `tau2.evaluator.evaluator.evaluate_simulation` (evaluation type ALL) does.
That function itself is not called: its module imports tau2's LLM runner (litellm) through tau2's registry.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from types import SimpleNamespace

from components.runtime.types import CONFIRM_TOOL, FINISH_TOOL, Turn
from components.worlds.base import Score

HARNESS_TOOLS = frozenset({CONFIRM_TOOL, FINISH_TOOL})
TRANSFER = "transfer_to_human_agents"


def _body(text: str) -> dict:
    try:
        body = json.loads(text)
    except json.JSONDecodeError:
        return {}
    return body if isinstance(body, dict) else {}


def to_tau2(t2: SimpleNamespace, transcript: list[Turn], user_stopped: bool) -> tuple[list, object]:
    """(tau2 messages, tau2 TerminationReason) for a Ratchet transcript."""
    m = t2.message
    Term = t2.simulation.TerminationReason
    out: list = []
    termination = Term.USER_STOP if user_stopped else Term.MAX_STEPS
    n = 0
    i = 0
    while i < len(transcript):
        t = transcript[i]
        if t.role == "user":
            out.append(m.UserMessage(role="user", content=t.text))
        elif t.role == "assistant" and t.tool is None:
            out.append(m.AssistantMessage(role="assistant", content=t.text))
        elif t.role == "assistant":
            result = transcript[i + 1] if i + 1 < len(transcript) and transcript[i + 1].role == "tool" else None
            i += 1 if result is not None else 0
            body = _body(result.text) if result is not None else {}
            executed = result is not None and t.tool not in HARNESS_TOOLS and body.get("code") != "blocked"
            if not executed:
                if t.text and t.text.strip():
                    out.append(m.AssistantMessage(role="assistant", content=t.text))
                if result is not None and body.get("code") != "blocked":
                    if t.tool == FINISH_TOOL:
                        termination = Term.AGENT_STOP
            else:
                n += 1
                call = m.ToolCall(id=f"call-{n}", name=t.tool, arguments=dict(result.args), requestor="assistant")
                out.append(m.AssistantMessage(role="assistant", content=t.text or None, tool_calls=[call]))
                if result.ok:
                    content, error = result.text, False
                else:  # tau2's own rendering of a tool's exception (`Environment.get_response`)
                    content, error = f"Error: {body.get('error', '')}", True
                out.append(m.ToolMessage(id=call.id, role="tool", content=content, requestor="assistant", error=error))
                if t.tool == TRANSFER and termination != Term.AGENT_STOP:
                    termination = Term.USER_STOP  # tau2's user answers a transfer with ###TRANSFER###
        i += 1
    return out, termination


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
    env = t2.EnvironmentEvaluator.calculate_reward(environment_constructor=construct, task=task,
                                                   full_trajectory=messages, solo_mode=False)
    action = t2.ActionEvaluator.calculate_reward(task=task, full_trajectory=messages)
    communicate = t2.CommunicateEvaluator.calculate_reward(task=task, full_trajectory=messages)
    value = 1.0
    parts: dict[str, float] = {"completed": 1.0}
    for bases, info in (({RT.DB, RT.ENV_ASSERTION}, env), ({RT.ACTION}, action), ({RT.COMMUNICATE}, communicate)):
        if basis & bases:
            parts.update({k.value if hasattr(k, "value") else str(k): float(v)
                          for k, v in (info.reward_breakdown or {}).items()})
            value *= info.reward
    return Score(reward=float(value), success=value == 1.0, criteria=parts)
