"""Plain data that crosses the port between the kernel, a world and a model."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

FINISH_TOOL = "finish"  # the draft that declares the task complete


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
    bounces, blocks and anything the harness makes up are synthetic and can never settle a ledger entry."""

    model_config = ConfigDict(frozen=True)
    call_id: str
    tool: str
    args: dict[str, Any] = Field(default_factory=dict)
    ok: bool
    code: str | None = None  # error class when not ok: policy | invalid_state | not_found | invalid_args | blocked
    content: Any = None
    genuine: bool = False
    write: bool = False


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
    role: Literal["user", "assistant", "tool", "system"]
    text: str
    tool: str | None = None
    write: bool = False
    ok: bool = True
