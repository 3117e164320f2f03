"""Defaults that the params model (`components/params.py`, which every command reads) shares with the code that
applies them: one home for each, in a module that imports nothing, so that reading the params does not import the
runtime or the meta-agents."""

MAX_TURNS = 40  # turns per episode before it is cut off (`campaign.max_turns`, `ratchet eval --max-turns`)
MAX_SOURCE_ITEMS = 12  # source tasks a plan names at most (`campaign.repair_max_items`)
SPLIT_SHARES = (
    1 / 3,
    1 / 3,
)  # a benchmark's train and dev shares of its tasks; test has the rest (`benchmark.*_share`)
# cited failed episodes logged to MLflow as traces per round, the first ones of each packet
# (`campaign.traces_per_round`, components/tracking/mlflow_traces.py): each trace costs a few hundred spans written to
# the store; no result depends on them
MAX_TRACES_PER_ROUND = 12
