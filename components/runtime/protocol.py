"""How the chat harness runs an episode: Ratchet's own harness, or the reference orchestrator of a benchmark that has
one (a world that declares `standard` among its `WorldSpec.protocols`, whose environment then carries the protocol),
so that a run's score is comparable to the benchmark's published ones.

`custom` (every world; `CUSTOM`): the harness offers `confirm` and `finish` beside the world's tools, asks the model
for its pending state in a call of its own every turn, shows a tool's result as the receipt's JSON
(`chat.result_body`), and cuts an episode off after the run's turn limit (`max_turns`).

`standard` (a world's reference protocol): what the reference orchestrator does, and nothing the reference would
count differently. Only the world's tools are offered; the model's intent is the tool its draft calls (no separate
state call: a card routed to that tool arrives with one redraft); a tool's result reads as the reference renders it
(the tool's own text, a failure as `error_text`); every call of a draft with several runs, in order; the agent
speaks first with `greeting` when the reference does; and the episode ends by the reference's limits, counted as it
counts them (`max_steps` messages, a batch of tool results being one, and `max_errors` failed tool calls), or when the
user ends it. Memory reaches the model inside the one system message either way (`prompts.system_message`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

STANDARD, CUSTOM_NAME = "standard", "custom"
ProtocolName = Literal["standard", "custom"]


@dataclass(frozen=True)
class Protocol:
    name: str = CUSTOM_NAME
    harness_tools: bool = True  # `confirm` and `finish` are offered beside the world's tools
    state_proposal: bool = True  # a model call of its own each turn for the pending state and the next tool
    max_steps: int | None = None  # messages as the reference counts them (None: the run's turn limit alone)
    max_errors: int | None = None  # failed calls of the world's tools; reaching it ends the episode
    greeting: str | None = None  # the agent's first message, said before the user speaks
    system_prompt: str | None = None  # the reference's agent prompt around the policy (None: the world's own)
    error_text: str | None = None  # a failed call's result as the model reads it, `{error}` its message (None: JSON)

    @property
    def text_results(self) -> bool:
        """Tool results read as the reference renders them (the tool's text), not as Ratchet's receipt JSON."""
        return self.error_text is not None


CUSTOM = Protocol()
