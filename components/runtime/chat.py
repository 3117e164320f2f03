"""ChatHarness: the HarnessPort for any world Environment and any chat model, in OpenAI message format.

The model sees: the system prompt (the world's policy), one memory message compiled by the kernel, and the
conversation (user turns, its own messages and tool calls, tool results). Nothing else reaches it.

Two harness tools are offered next to the world's: `confirm` (routed to `Environment.confirm`; see
`components.runtime.confirm`) and `finish`."""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from components.models.base import ChatModel, ModelError, add_usage
from components.runtime import prompts
from components.runtime.types import CONFIRM_TOOL, FINISH_TOOL, Draft, Intent, Proposal, Receipt, ToolCall, Turn, Usage
from components.worlds.base import Environment


# bounds of the state proposal (a task has at most five requests; a tool at most five arguments)
MAX_PENDING, MAX_ARGS, MAX_TEXT = 8, 8, 200


class ChatHarness:
    def __init__(self, env: Environment, model: ChatModel, seed: int, targets: dict[str, list[str]] | None = None):
        self.env = env
        self.model = model
        self.seed = seed
        self.write_tools = frozenset(env.write_tools)
        self.targets = dict(targets or {})  # write tool -> identifying args (the benchmark's meta), for confirmation
        self.tools = [*env.tools, prompts.CONFIRM_SCHEMA, prompts.FINISH_SCHEMA]
        self._tool_names = {t["function"]["name"] for t in self.tools}
        names = sorted(self._tool_names)
        # the proposal's shape as a JSON schema: servers with structured output can only produce well-formed state,
        # and bounded: an unbounded list let a small model repeat one entry until max_tokens cut every proposal
        text = {"type": "string", "maxLength": MAX_TEXT}
        self._proposal_schema = {
            "type": "object", "required": ["pending", "next_tool"],
            "properties": {
                "pending": {"type": "array", "maxItems": MAX_PENDING, "items": {
                    "type": "object", "required": ["tool", "args", "note"],
                    "properties": {"tool": {"enum": names},
                                   "args": {"type": "object", "additionalProperties": text, "maxProperties": MAX_ARGS},
                                   "note": text}}},
                "next_tool": {"anyOf": [{"enum": names}, {"type": "null"}]}}}
        self.messages: list[dict] = []
        self._turns: list[Turn] = []
        self._receipts: list[Receipt] = []
        self.usage = Usage()
        self.tool_calls = 0
        self._ended = False
        self._say("user", env.first_message())

    # -- HarnessPort -----------------------------------------------------------------------------------------
    @property
    def ended(self) -> bool:
        return self._ended

    def receipts(self) -> list[Receipt]:
        out, self._receipts = self._receipts, []
        return out

    def transcript(self) -> list[Turn]:
        return list(self._turns)

    def propose(self, memory: str) -> Proposal:
        msgs = [*self._context(memory), {"role": "system", "content": prompts.PROPOSE}]
        res = self._complete(msgs, tools=None, json_mode=self._proposal_schema)
        try:
            raw = json.loads(res.content)
            if not isinstance(raw, dict) or not isinstance(raw.get("pending", []), list):
                raise TypeError("expected an object with a `pending` list")
            if len(raw.get("pending", [])) > MAX_PENDING:  # a server that ignored the schema's bound
                raise ValueError(f"{len(raw['pending'])} pending entries (at most {MAX_PENDING})")
            pending = []
            for p in raw.get("pending", []):
                self._known_tool(p.get("tool"), "pending tool")
                pending.append(Intent(tool=p["tool"], args={k: str(v) for k, v in (p.get("args") or {}).items()},
                                      note=str(p.get("note") or "")))
            nxt = raw.get("next_tool")
            if nxt is not None:
                self._known_tool(nxt, "next_tool")
            return Proposal(pending=pending, next_tool=nxt or None)
        except (json.JSONDecodeError, AttributeError, KeyError, TypeError, ValueError, ValidationError) as e:
            raise ModelError(f"malformed state proposal: {e}", "malformed", res.usage) from None

    def _known_tool(self, name, field: str) -> None:
        """A proposal names offered tools only: a null or invented tool is malformed, never the string "None"."""
        if not isinstance(name, str) or name not in self._tool_names:
            raise ValueError(f"{field} {name!r} is not an offered tool")

    def draft(self, memory: str, feedback: str | None = None) -> Draft:
        msgs = self._context(memory)
        if feedback:
            msgs.append({"role": "system", "content": prompts.FEEDBACK.format(reasons=feedback)})
        res = self._complete(msgs, tools=self.tools, json_mode=False)
        if not res.tool_calls:
            if not (res.content or "").strip():  # sent on, the user answers an empty message and nothing happens
                raise ModelError("empty reply: no tool call and no text, with tools offered", "empty", res.usage)
            return Draft(content=res.content)
        call = res.tool_calls[0]
        if call.name not in self._tool_names:
            raise ModelError(f"call to a tool that does not exist: {call.name!r}", "unknown_tool", res.usage)
        return Draft(content=res.content, tool_call=call)

    def commit(self, draft: Draft, blocked: str | None = None) -> dict:
        call = draft.tool_call
        if call is None:
            if blocked:
                self.messages.append({"role": "system", "content": f"Your last message was blocked: {blocked}"})
                return {"blocked": blocked}
            self._say("assistant", draft.content)
            reply = self.env.user_reply(draft.content)
            if reply is None:
                self._ended = True
                return {"role": "user", "text": None}
            self._say("user", reply)
            return {"role": "user", "text": reply}
        # "" and not null: llama-cpp-python rejects a null content with a 500
        self.messages.append({"role": "assistant", "content": draft.content or "", "tool_calls": [{
            "id": call.id, "type": "function",
            "function": {"name": call.name, "arguments": json.dumps(call.args, sort_keys=True)}}]})
        self._turns.append(Turn(role="assistant", text=draft.content, tool=call.name))
        if blocked:  # never executed; a synthetic result that can ground nothing
            receipt = Receipt(call_id=call.id, tool=call.name, args=call.args, ok=False, code="blocked",
                              content={"error": f"blocked by the harness: {blocked}"}, genuine=False,
                              write=call.name in self.write_tools)
        elif call.name == FINISH_TOOL:
            receipt = Receipt(call_id=call.id, tool=call.name, args=call.args, ok=True, content={"finished": True})
            self._ended = True
        elif call.name == CONFIRM_TOOL:
            receipt = self._confirm(call)
        else:
            receipt = self.env.call(call)
            self.tool_calls += 1
            if call.name in self.env.terminal_tools:
                self._ended = True
        text = json.dumps(result_body(receipt), sort_keys=True)
        self.messages.append({"role": "tool", "tool_call_id": call.id, "content": text})
        granted = receipt.content.get("confirmed") if call.name == CONFIRM_TOOL and receipt.ok else None
        self._turns.append(Turn(role="tool", text=text, tool=call.name, write=receipt.write, ok=receipt.ok,
                                args=dict(call.args), granted=granted))
        self._receipts.append(receipt)
        return {"role": "tool", **receipt.model_dump()}

    # -- internals ------------------------------------------------------------------------------------------
    def _confirm(self, call: ToolCall) -> Receipt:
        """Route a `confirm` to the world's user. Genuine (the world answered), never a write."""
        tool, args, summary = call.args.get("tool"), call.args.get("args"), call.args.get("summary", "")
        if tool not in self.write_tools or not isinstance(args, dict) or not isinstance(summary, str):
            return Receipt(call_id=call.id, tool=call.name, args=call.args, ok=False, code="invalid_args",
                           content={"error": "confirm takes tool (one of the write tools: "
                                             f"{', '.join(sorted(self.write_tools))}), args (an object) and summary"},
                           genuine=True)
        granted = bool(self.env.confirm(tool, dict(args), summary))
        return Receipt(call_id=call.id, tool=call.name, args=call.args, ok=True, content={"confirmed": granted},
                       genuine=True)

    def _say(self, role: str, text: str) -> None:
        self.messages.append({"role": role, "content": text})
        self._turns.append(Turn(role=role, text=text))

    def _context(self, memory: str) -> list[dict]:
        return [
            {"role": "system", "content": self.env.system_prompt},
            {"role": "system", "content": f"{prompts.MEMORY_HEADER}\n\n{memory or '(empty)'}"},
            *self.messages,
        ]

    def _complete(self, msgs: list[dict], tools: list[dict] | None, json_mode: bool | dict):
        try:
            res = self.model.complete(msgs, tools=tools, seed=self.seed, json_mode=json_mode)
        except ModelError as e:  # a failed call still spent what it spent
            self.usage = add_usage(self.usage, e.usage)
            raise
        u = res.usage
        self.usage = add_usage(self.usage, u if u.calls >= 1 else u.model_copy(update={"calls": 1}))
        return res


def result_body(receipt: Receipt) -> Any:
    """The tool result the model sees (the receipt schema in `types.Receipt`): the content of a success; for a
    refusal the content plus `code`, and `rule_id` + `rule` (a rule refusal) or `blocking: true` (an external one)."""
    if receipt.ok:
        return receipt.content
    body = {**(receipt.content if isinstance(receipt.content, dict) else {"error": str(receipt.content)}),
            "code": receipt.code}
    if receipt.rule_id is not None:
        body.update(rule_id=receipt.rule_id, rule=receipt.rule or "")
    if receipt.blocking:
        body["blocking"] = True
    return body
