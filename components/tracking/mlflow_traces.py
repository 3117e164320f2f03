"""The failed episodes an evidence packet cites, as MLflow traces linked to the round's run: one span per turn, one
child span per kernel phase, built in memory and written to the campaign's own store
(components/tracking/mlflow_log.py has the overview)."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from components.tracking.mlflow_names import ui_route

if TYPE_CHECKING:
    from mlflow.tracing.client import TracingClient

MAX_TRACES_PER_PACKET = 2

# Traces are written by the trackers themselves, one at a time in this process (see TraceWriter.write).
_TRACE_WRITES = threading.Lock()
_TRACER: Any = None
_ENV_METADATA: dict[str, str] | None = None


def _env_metadata() -> dict[str, str]:
    """What MLflow's span processor records about the writing process (user, source, git), resolved once."""
    global _ENV_METADATA
    if _ENV_METADATA is None:
        from mlflow.tracing.utils.environment import resolve_env_metadata

        _ENV_METADATA = dict(resolve_env_metadata())
    return _ENV_METADATA


def _start_span(
    name: str, kind: str, parent: Any, start_ns: int, spans: list, inputs: Any = None, attributes: dict | None = None
):
    """A live mlflow span from a private OpenTelemetry tracer. The tracer has no span processor, so ending a span
    exports nothing: MLflow's own tracer would send it to the process's tracking URI, not the campaign's."""
    global _TRACER
    from mlflow.entities import LiveSpan
    from mlflow.tracing.utils import generate_trace_id_v3
    from opentelemetry import trace as otel
    from opentelemetry.context import Context

    if _TRACER is None:
        import mlflow
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider

        # the resource MLflow's own provider uses (the default one would add service.* tags to every trace)
        resource = Resource(
            {
                "telemetry.sdk.language": "python",
                "telemetry.sdk.name": "mlflow",
                "telemetry.sdk.version": mlflow.__version__,
            }
        )
        _TRACER = TracerProvider(resource=resource, shutdown_on_exit=False).get_tracer("ratchet.tracking")
    # an empty context for a root: never the child of whatever span is active in this thread
    ctx = otel.set_span_in_context(parent._span) if parent is not None else Context()
    o = _TRACER.start_span(name, context=ctx, start_time=start_ns)
    span = LiveSpan(o, parent.trace_id if parent is not None else generate_trace_id_v3(o), kind)
    if inputs is not None:
        span.set_inputs(inputs)
    span.set_attributes(attributes or {})
    spans.append(span)
    return span


def episode_timings(eval_dir: Path) -> dict[str, dict[int, list[tuple[str, int, int]]]]:
    """An evaluation's recorded timings (`components.runtime.evaluate.TIMINGS`, beside its DVC-tracked tables) as
    episode -> step -> [(turn, start, end), (phase, start, end), ...] in the order they ran; {} when none were kept."""
    import pandas as pd

    from components.runtime.evaluate import TIMINGS

    path = eval_dir / TIMINGS
    if not path.exists():
        return {}
    out: dict[str, dict[int, list[tuple[str, int, int]]]] = {}
    for r in pd.read_parquet(path).sort_values(["item_id", "seed", "step", "i"]).itertuples(index=False):
        out.setdefault(f"{r.item_id}#{r.seed}", {}).setdefault(int(r.step), []).append(
            (str(r.phase), int(r.start_ns), int(r.end_ns))
        )
    return out


def _cited_episodes(packet: dict) -> list[str]:
    """The episodes a packet's claims cite, in the order they are first cited."""
    eps: list[str] = []
    for claim in packet.get("claims", []):
        for c in claim.get("evidence", []):
            if c["episode_id"] not in eps:
                eps.append(c["episode_id"])
    return eps


@dataclass
class TraceWriter:
    """A campaign's traces: built in memory, written through a client bound to the campaign's tracking URI."""

    client: Any  # the campaign's MlflowClient
    experiment_id: str
    traces_per_round: int
    _tracing: TracingClient | None = None  # the traces are written through it, made on first use

    def log(self, run_id: str, rd: Path, round_no: int) -> list[tuple[str, str, str]]:
        """Each cited failed episode as an MLflow trace linked to the round run: one span per turn, one child span
        per kernel phase (memory delivered, model call, checker verdicts, tool call with its receipt)."""
        import pandas as pd

        diag, tp = rd / "diagnosis.json", rd / "train" / "traces.parquet"
        if not diag.exists() or not tp.exists():
            return []
        packets = json.loads(diag.read_text())
        traces = pd.read_parquet(tp)
        timings = episode_timings(rd / "train")
        built: dict[str, Any] = {}  # episode -> its trace, built in memory
        cited: list[tuple[str, str, str]] = []
        for pk in packets:
            for ep in _cited_episodes(pk)[:MAX_TRACES_PER_PACKET]:
                if ep not in built and len(built) < self.traces_per_round:
                    steps = traces[traces["episode_id"] == ep].sort_values("step")
                    cites = {
                        int(c["step"]) for claim in pk["claims"] for c in claim["evidence"] if c["episode_id"] == ep
                    }
                    built[ep] = self.episode_trace(run_id, round_no, pk, ep, steps, cites, timings.get(ep, {}))
                if ep in built:
                    cited.append((pk["id"], ep, built[ep].info.trace_id))
        if built:
            self.write(list(built.values()))
        return cited

    def cited_links(self, rd: Path, cited: list[tuple[str, str, str]]) -> str:
        """Markdown for the round's description: each packet's claims, each followed by links to the traces of the
        episodes it cites (the cited turn named), so a reader clicks from a claim to the trace it rests on."""
        packets = {pk["id"]: pk for pk in json.loads((rd / "diagnosis.json").read_text())}
        trace_of: dict[str, dict[str, str]] = {}
        for pk, ep, tid in cited:
            trace_of.setdefault(pk, {})[ep] = tid
        lines = ["Cited failed episodes (each packet's claim, then the traces of the episodes it cites):"]
        for pk, eps in trace_of.items():
            for claim in packets[pk].get("claims", []):
                links = [
                    f"[{c['episode_id']}, turn {c['step']}]("
                    + ui_route(f"#/experiments/{self.experiment_id}/traces?selectedEvaluationId={eps[c['episode_id']]}")
                    + ")"
                    for c in claim.get("evidence", [])
                    if c["episode_id"] in eps
                ]
                if links:
                    st = claim["statement"]
                    st = st if len(st) <= 160 else st[:157] + "..."
                    lines.append(f'- packet `{pk}` ({packets[pk].get("owner", "?")}): "{st}" → ' + ", ".join(links))
        return "\n".join(lines)

    def write(self, traces: list) -> None:
        """Write finished traces to the campaign's own store, whatever the process's tracking URI: through a
        TracingClient bound to this tracker's URI (the calls MLflow's exporter makes), not through MLflow's
        process-wide exporter, which sends every trace to the process's URI. Synchronous and on this thread, so on a
        SQLite store nothing writes concurrently, and the traces are complete in the store before the round's run is
        finished: each trace's info first, then all of the round's spans in one `log_spans` transaction. In that
        order each `start_trace` is a plain insert; after `log_spans` (the exporter's order) it would meet the row
        `log_spans` created and take MLflow's slower merge path. The stored traces, tags, metadata and spans are the
        same either way (MLflow's internal payload counter aside); writing them takes about a third less CPU."""
        from mlflow.exceptions import RestException
        from mlflow.tracing.client import TracingClient
        from mlflow.tracing.utils import add_size_stats_to_trace_metadata

        if self._tracing is None:
            self._tracing = TracingClient(self.client.tracking_uri)
        client = self._tracing
        with _TRACE_WRITES:
            infos = []
            for t in traces:
                add_size_stats_to_trace_metadata(t)
                infos.append(client.start_trace(t.info))
            try:
                client.log_spans(self.experiment_id, [s for t in traces for s in t.data.spans])
            except NotImplementedError:  # a store without span storage: the spans go to artifacts
                pass
            except RestException as e:  # the same, behind a tracking server (what MLflow's exporter tolerates)
                if "REST OTLP span logging is not supported" not in e.message:
                    raise
            else:
                return
            # Private, with no public equivalent in MLflow 3.17: `mlflow.log_trace` builds a new trace, `mlflow.add_trace`
            # attaches one to the active span, `MlflowClient._log_trace` is private too. This is the call MLflow's own
            # exporter makes (mlflow/tracing/export/mlflow_v3.py) for a store without span storage, the only case here.
            for info, t in zip(infos, traces):
                client._upload_trace_data(info, t.data)

    def episode_trace(
        self,
        run_id: str,
        round_no: int,
        packet: dict,
        ep: str,
        steps,
        cited_steps: set[int],
        timing: dict[int, list[tuple[str, int, int]]] | None = None,
    ):
        """One episode as a finished mlflow Trace, built in memory (nothing is exported): its spans come from a
        private OpenTelemetry tracer with no processor, its info is what MLflow's span processor would record (the
        source run links it to the round run). `timing` (`episode_timings`): when each turn and phase ran, so spans
        have their real start and duration, one span per phase as the kernel ran it (the model is called to propose
        and to draft, memory delivered before each); a turn without it (cut short by a model error, or an
        evaluation recorded before timings were kept) gets its four phases at 1 ms each, the root span saying so."""
        from mlflow.entities import SpanType, Trace, TraceData
        from mlflow.tracing.constant import SpanAttributeKey

        timing = timing or {}
        recorded = sum(int(s in timing) for s in steps["step"].astype(int)) if len(steps) else 0
        first = steps.iloc[0] if len(steps) else None
        starts = [t[0][1] for t in timing.values() if t]
        clock = _Clock(min(starts) if starts else time.time_ns())
        spans: list = []
        root = _start_span(
            f"episode {ep}",
            SpanType.AGENT,
            None,
            clock.at,
            spans,
            inputs={
                "episode": ep,
                "item_id": str(first["item_id"]) if first is not None else "",
                "incoming": json.loads(first["incoming"]) if first is not None else {},
            },
            attributes={
                SpanAttributeKey.EXPERIMENT_ID: self.experiment_id,
                "ratchet.packet": packet["id"],
                "ratchet.owner": packet["owner"],
                "ratchet.kind": packet["kind"],
                "ratchet.timing": f"{recorded} of {len(steps)} turns timed as they ran"
                + ("" if recorded == len(steps) else "; the others at 1 ms per phase"),
            },
        )
        for s in steps.to_dict("records"):
            _turn_spans(root, s, timing.get(int(s["step"])), cited_steps, clock, spans)
        root.end(
            outputs={"claims": [c["statement"] for c in packet.get("claims", [])]}, status="ERROR", end_time_ns=clock.at
        )
        info = self._trace_info(root, run_id, round_no, packet, ep)
        return Trace(info=info, data=TraceData(spans=[s.to_immutable_span() for s in spans]))

    def _trace_info(self, root: Any, run_id: str, round_no: int, packet: dict, ep: str) -> Any:
        """The trace's info as MLflow's span processor would record it, with the round run as its source."""
        from mlflow.entities import TraceInfo, TraceLocation, TraceState
        from mlflow.tracing.constant import (
            MAX_CHARS_IN_TRACE_INFO_METADATA,
            TRACE_SCHEMA_VERSION,
            TRACE_SCHEMA_VERSION_KEY,
            SpanAttributeKey,
            TraceMetadataKey,
            TraceTagKey,
        )

        def preview(key: str) -> str:  # the request/response columns of the Traces tab, cut as MLflow cuts them
            v = root._span.attributes.get(key) or ""
            return (
                v if len(v) <= MAX_CHARS_IN_TRACE_INFO_METADATA else v[: MAX_CHARS_IN_TRACE_INFO_METADATA - 3] + "..."
            )

        start_ns, end_ns = root.start_time_ns, root.end_time_ns
        return TraceInfo(
            trace_id=root.trace_id,
            trace_location=TraceLocation.from_experiment_id(self.experiment_id),
            request_time=start_ns // 1_000_000,
            execution_duration=(end_ns - start_ns) // 1_000_000,
            state=TraceState.ERROR,
            trace_metadata={
                **_env_metadata(),
                TRACE_SCHEMA_VERSION_KEY: str(TRACE_SCHEMA_VERSION),
                TraceMetadataKey.SOURCE_RUN: run_id,
                TraceMetadataKey.INPUTS: preview(SpanAttributeKey.INPUTS),
                TraceMetadataKey.OUTPUTS: preview(SpanAttributeKey.OUTPUTS),
            },
            tags={
                TraceTagKey.TRACE_NAME: f"episode {ep}",
                "ratchet.round": str(round_no),
                "ratchet.packet": packet["id"],
                "ratchet.episode": ep,
                "ratchet.owner": packet["owner"],
            },
        )


class _Clock:
    """Where the next synthetic 1 ms phase starts: a turn or phase that was not timed gets 1 ms from here."""

    def __init__(self, at: int) -> None:
        self.at = at

    def tick(self) -> int:
        self.at += 1_000_000
        return self.at - 1_000_000


def _turn_spans(
    root: Any, s: dict, ran: list[tuple[str, int, int]] | None, cited_steps: set[int], clock: _Clock, spans: list
) -> None:
    """One turn's span under the episode's, with a child per kernel phase; `ran`: [(turn, start, end), (phase, start,
    end), ...] as the kernel ran them (None: not timed, each phase 1 ms on `clock`)."""
    from mlflow.entities import SpanType

    j = {
        k: (
            json.loads(s[k])
            if isinstance(s.get(k), str) and k != "episode_id" and k != "hash" and s[k][:1] in "[{"
            else s.get(k)
        )
        for k in s
    }
    turn = _start_span(
        f"turn {s['step']}" + (" (cited)" if int(s["step"]) in cited_steps else ""),
        SpanType.CHAIN,
        root,
        ran[0][1] if ran else clock.tick(),
        spans,
        inputs={"incoming": j.get("incoming"), "state_before": j.get("state_before")},
        attributes={"step": int(s["step"]), "hash": s.get("hash", ""), "cited": int(s["step"]) in cited_steps},
    )
    phases = _phases(j)
    for name, start, end in ran[1:] if ran else [(n, None, None) for n in phases]:
        kind, inputs, outputs = phases[name]
        _start_span(name, kind, turn, start if start is not None else clock.tick(), spans, inputs=inputs).end(
            outputs=outputs, end_time_ns=end if end is not None else clock.tick()
        )  # (None: not timed, `ran` empty)
    turn.end(outputs={"fingerprint": j.get("fingerprint")}, end_time_ns=ran[0][2] if ran else clock.tick())
    clock.at = max(clock.at, ran[0][2] if ran else clock.at)


def _phases(j: dict) -> dict[str, tuple[str, dict, dict]]:
    """A turn's kernel phases: each one's span kind, inputs and outputs, from the turn's recorded step `j`."""
    from mlflow.entities import SpanType

    from components.runtime.kernel import CHECKS, MEMORY, MODEL, TOOL

    return {
        MEMORY: (SpanType.MEMORY, {"deliveries": j.get("deliveries")}, {"cards": j.get("delivered")}),
        MODEL: (
            SpanType.LLM,
            {"state_before": j.get("state_before")},
            {"proposal": j.get("proposal"), "first_draft": j.get("first_draft"), "draft": j.get("action")},
        ),
        CHECKS: (
            SpanType.GUARDRAIL,
            {"draft": j.get("first_draft") or j.get("action")},
            {"checks": j.get("checks"), "blocked": j.get("blocked")},
        ),
        TOOL: (
            SpanType.TOOL,
            {"action": j.get("action")},
            {"receipt": j.get("observation"), "state_after": j.get("state_after")},
        ),
    }
