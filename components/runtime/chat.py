"""ChatHarness: the HarnessPort for any world Environment and any chat model, in OpenAI message format.

The model sees one system message first (the world's policy, the memory the kernel compiled this turn, the
harness's notes, and the call's own instruction: `prompts.system_message`), then the conversation (user turns, its
own messages and tool calls, tool results). Nothing else reaches it.

How the episode runs is its `Protocol` (`components.runtime.protocol`): under `custom` (every world) two harness tools
are offered next to the world's, `confirm` (routed to `Environment.confirm`; see `components.runtime.confirm`) and
`finish`, and the model states its pending work in a call of its own each turn; under a world's `standard` protocol
only the world's tools are offered, there is no state call (the kernel takes the draft's tool as the intent), results
read as the reference renders them, and the episode ends by the reference's limits (`steps`, `errors`).

A draft with several tool calls (a model's parallel calls) runs them all, in order: the first is this turn's
draft, each of the others the next turn's (no model call while any of them lacks its result), every one reviewed by
the checkers and recorded as its own trace step (its observation's `parallel`: [i, n]); the model's message keeps
them together, as it wrote them."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import ValidationError

from components.models.base import ChatModel, ChatResult, ModelError, add_usage
from components.runtime import prompts
from components.runtime.protocol import CUSTOM, Protocol
from components.runtime.types import CONFIRM_TOOL, FINISH_TOOL, Draft, Intent, Proposal, Receipt, ToolCall, Turn, Usage
from components.worlds.base import Environment


# bounds of the state proposal (a task has at most five requests; a tool at most five arguments)
MAX_PENDING, MAX_ARGS, MAX_TEXT = 8, 8, 200

# why an episode ended, as the harness saw it (`ChatHarness.ended_by`)
FINISHED, TERMINAL, USER_STOP, MAX_STEPS, MAX_ERRORS = "finish", "terminal_tool", "user_stop", "max_steps", "max_errors"


class ChatHarness:
    def __init__(
        self,
        env: Environment,
        model: ChatModel,
        seed: int,
        targets: dict[str, list[str]] | None = None,
        protocol: Protocol = CUSTOM,
    ):
        self.env = env
        self.model = model
        self.seed = seed
        self.protocol = protocol
        self.write_tools = frozenset(env.write_tools)
        self.targets = dict(targets or {})  # write tool -> identifying args (the benchmark's meta), for confirmation
        harness = [prompts.CONFIRM_SCHEMA, prompts.FINISH_SCHEMA] if protocol.harness_tools else []
        self.tools = [*env.tools, *harness]
        self._tool_names = {t["function"]["name"] for t in self.tools}
        self.proposes = protocol.state_proposal
        names = sorted(self._tool_names)
        # the proposal's shape as a JSON schema: servers with structured output can only produce well-formed state,
        # and bounded: an unbounded list let a small model repeat one entry until max_tokens cut every proposal
        text = {"type": "string", "maxLength": MAX_TEXT}
        self._proposal_schema: dict[str, Any] = {
            "type": "object",
            "required": ["pending", "next_tool"],
            "properties": {
                "pending": {
                    "type": "array",
                    "maxItems": MAX_PENDING,
                    "items": {
                        "type": "object",
                        "required": ["tool", "args", "note"],
                        "properties": {
                            "tool": {"enum": names},
                            "args": {"type": "object", "additionalProperties": text, "maxProperties": MAX_ARGS},
                            "note": text,
                        },
                    },
                },
                "next_tool": {"anyOf": [{"enum": names}, {"type": "null"}]},
            },
        }
        self.messages: list[dict[str, Any]] = []
        self._turns: list[Turn] = []
        self._receipts: list[Receipt] = []
        self._notes: list[str] = []  # what the harness told the model of its own doing (shown in the system message)
        self.usage = Usage()
        self.tool_calls = 0
        self._ended = False
        self.ended_by: str | None = None
        # the reference's counts (`Protocol.max_steps`, `max_errors`): messages, a batch of tool results being one
        self.steps = 0
        self.errors = 0
        # a draft's calls: those the model wrote with the draft last returned, and those still to run of the one committed
        self._drafted: list[ToolCall] = []
        self._queue: list[ToolCall] = []
        self._batch: dict[str, int] = {}  # the running batch: size (n), position (i), calls executed (ran), errors
        self._last_proposal = Proposal()
        self._started = False
        if protocol.greeting:  # the reference's agent opens the conversation
            self.messages.append({"role": "assistant", "content": protocol.greeting})

    def start(self) -> None:
        """The user's first message (a user simulated by a model may fail here: inside the episode's error handling)."""
        if not self._started:
            self._started = True
            self._say("user", self.env.first_message())
            self._count(1)

    # -- HarnessPort -----------------------------------------------------------------------------------------
    @property
    def ended(self) -> bool:
        return self._ended

    def receipts(self) -> list[Receipt]:
        out, self._receipts = self._receipts, []
        return out

    def transcript(self) -> list[Turn]:
        self.start()
        return list(self._turns)

    def propose(self, memory: str) -> Proposal:
        self.start()
        if self._queue:  # the rest of a parallel draft runs first: no request while a call lacks its result
            return self._last_proposal
        msgs = self._context(memory, prompts.PROPOSE)
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
                pending.append(
                    Intent(
                        tool=p["tool"],
                        args={k: str(v) for k, v in (p.get("args") or {}).items()},
                        note=str(p.get("note") or ""),
                    )
                )
            nxt = raw.get("next_tool")
            if nxt is not None:
                self._known_tool(nxt, "next_tool")
            self._last_proposal = Proposal(pending=pending, next_tool=nxt or None)
            return self._last_proposal
        except (json.JSONDecodeError, AttributeError, KeyError, TypeError, ValueError, ValidationError) as e:
            raise ModelError(f"malformed state proposal: {e}", "malformed", res.usage) from None

    def _known_tool(self, name: object, field: str) -> None:
        """A proposal names offered tools only: a null or invented tool is malformed, never the string "None"."""
        if not isinstance(name, str) or name not in self._tool_names:
            raise ValueError(f"{field} {name!r} is not an offered tool")

    def draft(self, memory: str, feedback: str | None = None) -> Draft:
        self.start()
        if self._queue:  # the next call of a parallel draft: written already, never asked for again
            return Draft(content="", tool_call=self._queue[0])
        tail = prompts.FEEDBACK.format(reasons=feedback) if feedback else ""
        res = self._complete(self._context(memory, tail), tools=self.tools, json_mode=False)
        self._drafted = []
        if not res.tool_calls:
            if not (res.content or "").strip():  # sent on, the user answers an empty message and nothing happens
                raise ModelError("empty reply: no tool call and no text, with tools offered", "empty", res.usage)
            return Draft(content=res.content)
        if not self.protocol.text_results:  # under a reference protocol, an unknown tool is the world's to refuse
            for call in res.tool_calls:
                if call.name not in self._tool_names:
                    raise ModelError(f"call to a tool that does not exist: {call.name!r}", "unknown_tool", res.usage)
        self._drafted = list(res.tool_calls)
        return Draft(content=res.content, tool_call=res.tool_calls[0])

    def commit(self, draft: Draft, blocked: str | None = None) -> dict[str, Any]:
        self.start()
        call = draft.tool_call
        if call is None:
            return self._commit_message(draft, blocked)
        queued = bool(self._queue) and call is self._queue[0]
        if queued:
            self._queue.pop(0)
        else:
            self._open_batch(draft, call)
        self._batch["i"] += 1
        part = (self._batch["i"], self._batch["n"]) if self._batch["n"] > 1 else None
        self._turns.append(
            Turn(role="assistant", text=draft.content if not queued else "", tool=call.name, parallel=queued)
        )
        receipt = self._execute(call, blocked)
        text = self.result_text(receipt)
        self.messages.append({"role": "tool", "tool_call_id": call.id, "content": text})
        granted = receipt.content.get("confirmed") if call.name == CONFIRM_TOOL and receipt.ok else None
        self._turns.append(
            Turn(
                role="tool",
                text=text,
                tool=call.name,
                write=receipt.write,
                ok=receipt.ok,
                args=dict(call.args),
                granted=granted,
            )
        )
        self._receipts.append(receipt)
        if not self._queue:  # the batch is whole: as the reference counts it, one message and one batch of results
            if self._batch["ran"]:
                self.errors += self._batch["errors"]
                self._count(2)
            self._end_by_limit()
        out = {"role": "tool", **receipt.model_dump()}
        if part is not None:
            out["parallel"] = list(part)
        return out

    def _commit_message(self, draft: Draft, blocked: str | None) -> dict[str, Any]:
        """A message to the user (no tool call): blocked, or said and answered (unless a limit ends the episode)."""
        self._drafted = []
        if blocked:
            self._notes.append(f"Your last message was blocked: {blocked}")
            return {"blocked": blocked}
        self._say("assistant", draft.content)
        if self._count(1):  # the reference ends the episode here, before the user answers
            self._end_by_limit()
            return {"ended": self.ended_by}
        reply = self.env.user_reply(draft.content)
        self._count(1)  # the user's answer, or the line that ends the call
        if reply is None:
            self._end(USER_STOP)
            self._end_by_limit()
            return {"role": "user", "text": None}
        self._say("user", reply)
        self._end_by_limit()
        return {"role": "user", "text": reply}

    def _open_batch(self, draft: Draft, call: ToolCall) -> None:
        """The assistant message of a new batch of calls (the drafted ones, when `call` leads them): its later calls
        are queued, each committed in turn."""
        calls = self._drafted if self._drafted and self._drafted[0] is call else [call]
        self._drafted = []
        # "" and not null: llama-cpp-python rejects a null content with a 500
        self.messages.append(
            {
                "role": "assistant",
                "content": draft.content or "",
                "tool_calls": [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": json.dumps(c.args, sort_keys=True)},
                    }
                    for c in calls
                ],
            }
        )
        self._queue = calls[1:]
        self._batch = {"n": len(calls), "i": 0, "ran": 0, "errors": 0}

    def _execute(self, call: ToolCall, blocked: str | None) -> Receipt:
        """The call's receipt: blocked (never executed), the harness's own tools, or the world's."""
        if blocked:  # never executed; a synthetic result that can ground nothing
            return Receipt(
                call_id=call.id,
                tool=call.name,
                args=call.args,
                ok=False,
                code="blocked",
                content={"error": f"blocked by the harness: {blocked}"},
                genuine=False,
                write=call.name in self.write_tools,
            )
        if call.name == FINISH_TOOL and self.protocol.harness_tools:
            receipt = Receipt(call_id=call.id, tool=call.name, args=call.args, ok=True, content={"finished": True})
            self._end(FINISHED)
            return receipt
        if call.name == CONFIRM_TOOL and self.protocol.harness_tools:
            return self._confirm(call)
        receipt = self.env.call(call)
        self.tool_calls += 1
        self._batch["ran"] += 1
        self._batch["errors"] += not receipt.ok
        if call.name in self.env.terminal_tools:
            self._end(TERMINAL)
        return receipt

    def result_text(self, receipt: Receipt) -> str:
        """A tool's result as the model reads it: the receipt's JSON (`result_body`), or under a reference protocol
        the tool's own text (a failure as the reference renders it)."""
        error_text = self.protocol.error_text  # set: the protocol's `text_results`
        if error_text is None or receipt.code == "blocked":
            return json.dumps(result_body(receipt), sort_keys=True)
        if receipt.ok:
            c = receipt.content
            return c if isinstance(c, str) else json.dumps(c)
        body = receipt.content if isinstance(receipt.content, dict) else {"error": str(receipt.content)}
        return error_text.format(error=body.get("error", ""))

    # -- internals ------------------------------------------------------------------------------------------
    def _end(self, why: str) -> None:
        self._ended = True
        if self.ended_by is None:
            self.ended_by = why

    def _count(self, n: int) -> bool:
        """Count `n` messages; whether the reference's step limit is reached."""
        self.steps += n
        return self.protocol.max_steps is not None and self.steps >= self.protocol.max_steps

    def _end_by_limit(self) -> None:
        """The reference's checks after a message that goes to the agent or the user: the step limit, then the error
        limit (either ends the episode, and each overrides the user's stop, as the reference's loop does)."""
        p = self.protocol
        for limit, count, why in ((p.max_steps, self.steps, MAX_STEPS), (p.max_errors, self.errors, MAX_ERRORS)):
            if limit is not None and count >= limit:
                self._ended = True
                self.ended_by = why

    def _confirm(self, call: ToolCall) -> Receipt:
        """Route a `confirm` to the world's user. Genuine (the world answered), never a write."""
        tool, args, summary = call.args.get("tool"), call.args.get("args"), call.args.get("summary", "")
        if tool not in self.write_tools or not isinstance(args, dict) or not isinstance(summary, str):
            return Receipt(
                call_id=call.id,
                tool=call.name,
                args=call.args,
                ok=False,
                code="invalid_args",
                content={
                    "error": "confirm takes tool (one of the write tools: "
                    f"{', '.join(sorted(self.write_tools))}), args (an object) and summary"
                },
                genuine=True,
            )
        granted = bool(self.env.confirm(tool, dict(args), summary))
        return Receipt(
            call_id=call.id, tool=call.name, args=call.args, ok=True, content={"confirmed": granted}, genuine=True
        )

    def _say(self, role: Literal["user", "assistant"], text: str) -> None:
        self.messages.append({"role": role, "content": text})
        self._turns.append(Turn(role=role, text=text))

    def _context(self, memory: str, tail: str = "") -> list[dict[str, Any]]:
        prompt = self.protocol.system_prompt if self.protocol.system_prompt is not None else self.env.system_prompt
        return [prompts.system_message(prompt, memory, self._notes, tail), *self.messages]

    def _complete(
        self, msgs: list[dict[str, Any]], tools: list[dict[str, Any]] | None, json_mode: bool | dict[str, Any]
    ) -> ChatResult:
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
    body = {
        **(receipt.content if isinstance(receipt.content, dict) else {"error": str(receipt.content)}),
        "code": receipt.code,
    }
    if receipt.rule_id is not None:
        body.update(rule_id=receipt.rule_id, rule=receipt.rule or "")
    if receipt.blocking:
        body["blocking"] = True
    return body
