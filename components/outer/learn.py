"""The offline trainer: a "fine-tune" of the simulated agent on an export's SFT records.

What a successful episode demonstrates: every write it made that the world accepted (a tool message without an
error, the assistant message not weighted 0) follows each rule of the world's competence that governs that write
(`Fact.tool`). A fact demonstrated by at least `min_demos` exported episodes is learned: the trained agent follows it
without a card, at the rate it follows an undiluted card (`SimulatedAgent.learned`; the simulator's own noise, no
more). What the base model had learned stays learned. The result is a `ModelSpec` for the `sim` backend, named by a
digest of what it knows and what it was trained on, so the same export always names the same model.

This reads only the exported messages (the chat records a real trainer reads) and the world's facts as data; it never
reads the benchmark's tasks or gold.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path

from components.errors import InputError
from components.outer.export import read_jsonl, read_manifest
from components.outer.model import ModelSpec

MIN_DEMOS = 2


def accepted_writes(messages: list[dict]) -> list[str]:
    """The tools of the calls in one conversation whose result is not an error, in order (blocked calls excluded)."""
    results = {m.get("tool_call_id"): m.get("content") for m in messages if m.get("role") == "tool"}
    out = []
    for m in messages:
        if m.get("role") != "assistant" or m.get("weight") == 0:
            continue
        for c in m.get("tool_calls") or []:
            try:
                body = json.loads(results.get(c["id"]) or "null")
            except json.JSONDecodeError:
                continue
            if isinstance(body, dict) and "error" not in body and "code" not in body:
                out.append(c["function"]["name"])
    return out


def demonstrated(export_dir: str | Path) -> tuple[Counter, str]:
    """fact id -> how many exported successful episodes demonstrate it; and the export's world."""
    from components.worlds import world

    m = read_manifest(export_dir)
    facts = world(m.world).competence.facts
    counts: Counter = Counter()
    if "sft.jsonl" not in m.files:
        raise InputError(
            f"{Path(export_dir) / 'manifest.json'}: files: no sft.jsonl listed (not an export of `ratchet export`)"
        )
    for rec in read_jsonl(Path(export_dir) / m.files["sft.jsonl"].path):
        tools = set(accepted_writes(rec.get("messages") or []))
        counts.update({f.id for f in facts if f.tool in tools})
    return counts, m.world


def learn_sim(export_dir: str | Path, base: ModelSpec | None = None, min_demos: int = MIN_DEMOS) -> ModelSpec:
    if min_demos < 1:
        raise InputError(f"--min-demos: {min_demos}: must be at least 1")
    m = read_manifest(export_dir)
    if base is not None and base.model != "sim":
        raise InputError(f"--base: model: {base.model}: the offline learner trains the `sim` backend only")
    if base is None and m.model != "sim":
        raise InputError(
            f"{Path(export_dir) / 'manifest.json'}: model: {m.model}: the offline learner trains the "
            "`sim` backend only (use a real trainer for this model)"
        )
    counts, world_name = demonstrated(export_dir)
    before = set((base.model_cfg if base else m.model_cfg).get("learned") or ())
    new = {f for f, n in counts.items() if n >= min_demos}
    learned = sorted(before | new)
    base_id = base.name if base else str(m.model_cfg.get("model") or m.model)
    tag = hashlib.sha256(json.dumps([base_id, m.digest(), learned]).encode()).hexdigest()[:10]
    cfg = {k: v for k, v in (base.model_cfg if base else m.model_cfg).items() if k != "model"}
    return ModelSpec(
        name=f"ratchet-sim-ft-{tag}",
        model="sim",
        model_cfg={**cfg, "learned": learned},
        trained_on=m.digest(),
        base=base_id,
        notes={
            "world": world_name,
            "min_demos": min_demos,
            "sft_records": m.files["sft.jsonl"].records,
            "demonstrations": dict(sorted(counts.items())),
            "newly_learned": sorted(new - before),
        },
    )
