"""The projection the meta-agent reads stays within its character limit as emitted (records and JSON wrapper)."""

from __future__ import annotations

import json

from components.evidence.graph import EvidenceGraph, Expiry
from components.evidence.graph_record import project


def test_the_serialized_projection_is_within_its_limit(tmp_path):
    bench, now = "b" * 64, Expiry(benchmark="b" * 64, model="sim")
    with EvidenceGraph(tmp_path / "e.db", campaign="c") as g:
        with g.batch():
            for i in range(12):  # verdicts and open questions of the current evidence: every record is shown if it fits
                g.add(
                    "decision",
                    f"verdict:p{i}:{bench}",
                    f"rejected at the gate: net below zero ({i})" * 2,
                    {
                        "type": "gate_verdict",
                        "plan_key": f"p{i}",
                        "accept": False,
                        "stage": "gate",
                        "benchmark_digest": bench,
                        "model": "sim",
                    },
                    expiry=now,
                )
                g.add(
                    "question",
                    f"unknown:kind{i}:tool{i}:{bench}",
                    f"unexplained failures: kind{i} on tool{i}",
                    {"kind": f"kind{i}", "tool": f"tool{i}", "benchmark_digest": bench},
                    expiry=now,
                )
        whole = project(g, [], now, 200_000)
        assert whole["omitted"] == 0 and len(whole["verdicts"]) == len(whole["open_questions"]) == 12
        full = len(json.dumps(whole, separators=(",", ":")))
        # limits the first k records (in the projection's order) fill exactly, separators counted: the old budget
        # counted the records alone, kept all k and emitted the wrapper (~80 chars) on top of the limit
        ranked = whole["verdicts"] + whole["open_questions"]
        sizes = [len(json.dumps(x, separators=(",", ":"))) + 1 for x in ranked]
        for limit in [sum(sizes[:k]) for k in range(1, len(ranked) + 1, 2)] + [200, full]:
            p = project(g, [], now, limit)
            emitted = len(json.dumps(p, separators=(",", ":")))
            assert emitted <= limit, (limit, emitted)
            kept = sum(len(v) for v in p.values() if isinstance(v, list))
            assert kept + p["omitted"] == 24  # what did not fit is counted, never silently cut
            assert kept >= (limit - 100) // 400  # and the limit is used: each record here is under 300 chars
        # a few characters over the whole projection's size leave nothing out (the count errs short by a comma a section)
        assert project(g, [], now, full + 5) == whole
