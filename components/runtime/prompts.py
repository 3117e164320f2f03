"""The harness's fixed instructions to the model. Same words for every model backend."""

MEMORY_HEADER = "# Memory (from the harness; the ledger is settled only by real tool receipts)"
PROPOSE = (
    "# Ledger update\n"
    'Return only JSON: {"pending": [{"tool": <the write tool that will settle the request>, "args": '
    '{<the arguments that identify what the write acts on>}, "note": <a few words>}], "next_tool": <the tool you '
    "will call next, or the write you are preparing; null if none>}. List every request that is not settled yet."
)
FEEDBACK = "# Draft bounced\nYour draft was not accepted:\n{reasons}\nRevise it."
NOTE = "# Harness note\n{note}"  # what the harness tells the model of its own doing (a message it blocked)
FINISH_SCHEMA = {
    "type": "function",
    "function": {
        "name": "finish",
        "description": "Declare the task complete. Only when every request is settled.",
        "parameters": {
            "type": "object",
            "properties": {"summary": {"type": "string"}},
            "required": ["summary"],
            "additionalProperties": False,
        },
    },
}

CONFIRM_SCHEMA = {
    "type": "function",
    "function": {
        "name": "confirm",
        "description": 'Ask the customer to confirm one write before making it. Returns {"confirmed": true|false}; '
        "a confirmation covers the next write of that tool on those arguments only.",
        "parameters": {
            "type": "object",
            "properties": {
                "tool": {"type": "string", "description": "the write tool you are about to call"},
                "args": {"type": "object", "description": "the arguments that identify what the write acts on"},
                "summary": {"type": "string", "description": "one line: what will be done"},
            },
            "required": ["tool", "args", "summary"],
            "additionalProperties": False,
        },
    },
}

PLAN_MARK = "# Ratchet meta-agent"  # heads the llm meta-agent's planning prompt


def system_message(
    prompt: str, memory: str = "", notes: tuple[str, ...] | list[str] = (), tail: str = ""
) -> dict[str, str]:
    """The one system message every request starts with: the prompt (the world's policy), the memory the kernel
    compiled for this turn (left out when there is none), the harness's notes, and this call's own instruction
    (`PROPOSE`, or `FEEDBACK` for a redraft). One system message, first: chat templates of current open models
    refuse a system message anywhere else."""
    parts = [prompt]
    if memory:
        parts.append(f"{MEMORY_HEADER}\n\n{memory}")
    parts += [NOTE.format(note=n) for n in notes]
    if tail:
        parts.append(tail)
    return {"role": "system", "content": "\n\n".join(parts)}


def split_system(text: str) -> tuple[str, str, str]:
    """(prompt, memory, tail) of a `system_message`'s text: the inverse a reader of requests needs (the simulated
    agent). `tail` is the call's instruction (`PROPOSE` or `FEEDBACK`, from its first line on), "" for a draft."""
    tail = ""
    for head in (PROPOSE.split("\n")[0], FEEDBACK.split("\n")[0]):
        at = text.rfind("\n\n" + head)
        if at >= 0:
            text, tail = text[:at], text[at + 2 :]
            break
    note = text.find("\n\n" + NOTE.split("\n")[0] + "\n")
    if note >= 0:
        text = text[:note]
    prompt, sep, memory = text.partition("\n\n" + MEMORY_HEADER + "\n\n")
    return prompt, memory if sep else "", tail
