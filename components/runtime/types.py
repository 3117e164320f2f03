"""Plain data that crosses the port between the kernel, a world and a model."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Role = Literal["user", "assistant", "tool", "system"]  # who said a line of the conversation (`Turn.role`)
FINISH_TOOL = "finish"  # the draft that declares the task complete
CONFIRM_TOOL = "confirm"  # the harness tool that asks the world's user to confirm one write (see runtime/confirm.py)


class ToolCall(BaseModel):
    model_config = ConfigDict(frozen=True)
    id: str
    name: str
    args: dict[str, Any] = Field(default_factory=dict)


class Draft(BaseModel):
    """What the model proposes to do this turn: a message to the user, one tool call, or `finish`."""

    model_config = ConfigDict(frozen=True)
    content: str = ""
    tool_call: ToolCall | None = None

    @property
    def kind(self) -> Literal["message", "tool", "finish"]:
        if self.tool_call is None:
            return "message"
        return "finish" if self.tool_call.name == FINISH_TOOL else "tool"


class Receipt(BaseModel):
    """The result of executing a tool call. `genuine` is set only by a world that really ran the call;
    bounces, blocks and anything the harness makes up are synthetic and can never settle a ledger entry.

    The receipt schema every world follows (the one place it is defined; docs/worlds.md, "Receipts"):
      ok        the call did what it asked; `content` is its result (JSON-serializable)
      code      when not ok, the error class: free for the world (e.g. invalid_args, not_found, invalid_state);
                the harness adds `blocked` (a draft the kernel bounced) and `invalid_args` (a malformed `confirm`)
      rule_id   a *rule refusal*: the machine-readable id of the written or unwritten rule the call broke (retrying
                correctly can work); generic code tells a rule refusal by this field alone, never by `code` or text
      rule      the rule's text, as a careful agent or a card would state it
      blocking  an *external* refusal: nothing the agent can do makes this request possible (wrong state, no account)
      content   for a refusal, at least {"error": <a human message>}
    What the model sees as the tool result is JSON: the content for a success; for a refusal the content plus `code`,
    and `rule_id` + `rule` (rule refusal) or `blocking: true` (external refusal): see `ChatHarness.result_body`.
    A `confirm` receipt is genuine, never a write, content {"confirmed": true|false}."""

    model_config = ConfigDict(frozen=True)
    call_id: str
    tool: str
    args: dict[str, Any] = Field(default_factory=dict)
    ok: bool
    code: str | None = None
    content: Any = None
    genuine: bool = False
    write: bool = False
    rule_id: str | None = None
    rule: str | None = None
    blocking: bool = False


class Intent(BaseModel):
    """One pending unit of work as the model proposes it: the write tool that will settle it and its arguments."""

    model_config = ConfigDict(frozen=True)
    tool: str
    args: dict[str, str] = Field(default_factory=dict)
    note: str = ""


class Proposal(BaseModel):
    """The model's proposed pending state and the tool it means to call next."""

    model_config = ConfigDict(frozen=True)
    pending: list[Intent] = Field(default_factory=list)
    next_tool: str | None = None


class Usage(BaseModel):
    model_config = ConfigDict(frozen=True)
    tokens_in: int = 0
    tokens_out: int = 0
    calls: int = 0


class Turn(BaseModel):
    """One line of the conversation as checkers see it (a tool line names its tool and whether it wrote)."""

    model_config = ConfigDict(frozen=True)
    role: Role
    text: str
    tool: str | None = None
    write: bool = False
    ok: bool = True
    args: dict[str, Any] = Field(default_factory=dict)  # a tool line: the call's arguments
    granted: bool | None = None  # a `confirm` line: the world's answer (see runtime/confirm.py)
    # an assistant tool line: the call came in the same model message as the call before it (a parallel call). Not
    # part of what a step records (`TraceStep.incoming`): only a world that counts messages as its reference does reads it
    parallel: bool = Field(default=False, exclude=True)
