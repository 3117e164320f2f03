"""The harness's fixed instructions to the model. Same words for every model backend."""

MEMORY_HEADER = "# Memory (from the harness; the ledger is settled only by real tool receipts)"
PROPOSE = (
    "# Ledger update\n"
    "Return only JSON: {\"pending\": [{\"tool\": <the write tool that will settle the request>, \"args\": "
    "{<the arguments that identify what the write acts on>}, \"note\": <a few words>}], \"next_tool\": <the tool you "
    "will call next, or the write you are preparing; null if none>}. List every request that is not settled yet."
)
FEEDBACK = "# Draft bounced\nYour draft was not accepted:\n{reasons}\nRevise it."
FINISH_SCHEMA = {
    "type": "function",
    "function": {
        "name": "finish",
        "description": "Declare the task complete. Only when every request is settled.",
        "parameters": {"type": "object", "properties": {"summary": {"type": "string"}}, "required": ["summary"],
                       "additionalProperties": False},
    },
}

CONFIRM_SCHEMA = {
    "type": "function",
    "function": {
        "name": "confirm",
        "description": "Ask the customer to confirm one write before making it. Returns {\"confirmed\": true|false}; "
                       "a confirmation covers the next write of that tool on those arguments only.",
        "parameters": {"type": "object", "properties": {
            "tool": {"type": "string", "description": "the write tool you are about to call"},
            "args": {"type": "object", "description": "the arguments that identify what the write acts on"},
            "summary": {"type": "string", "description": "one line: what will be done"}},
            "required": ["tool", "args", "summary"], "additionalProperties": False},
    },
}

PLAN_MARK = "# Ratchet meta-agent"  # heads the llm meta-agent's planning prompt
