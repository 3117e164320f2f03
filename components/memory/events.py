"""The runtime events a package may bind strategies to. The kernel raises exactly these, in its fixed phase order."""

TURN_START = "turn_start"
INTENT_RECORDED = "intent_recorded"
DRAFT_READY = "draft_ready"
PRE_WRITE = "pre_write"
AGENT_DECLARES_DONE = "agent_declares_done"

EVENTS = (TURN_START, INTENT_RECORDED, DRAFT_READY, PRE_WRITE, AGENT_DECLARES_DONE)
DELIVERY_EVENTS = frozenset({TURN_START, INTENT_RECORDED, PRE_WRITE})
CHECK_EVENTS = frozenset({DRAFT_READY, AGENT_DECLARES_DONE, PRE_WRITE})
