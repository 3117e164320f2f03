"""Our task runs read back through Prefect: the client (`read_task_runs`, `read_task_run`) and `prefect task-run ls`.

Prefect sends a task run's result metadata to the server dumped as its declared type, so a serializer is stored by its
`type` alone; a type that needs more than its name (Prefect's "compressed" needs its inner serializer) then fails to
validate wherever the task run is read (flows/resultzip.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import PACKAGES


def test_our_task_runs_read_back_through_the_client_and_the_cli(prefect_server, bench_dir, tmp_path, monkeypatch):
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.settings import PREFECT_LOCAL_STORAGE_PATH, temporary_settings

    from components.worlds import load_benchmark
    from flows.tasks import PERSIST, eval_shard

    items = load_benchmark(bench_dir).ids("train")[:2]

    @flow(name="prefect-records")
    def tiny() -> str:
        from prefect.runtime import flow_run

        eval_shard(str(PACKAGES / "reference"), str(bench_dir), items, [0], "sim", {}, 40, label="records")
        return flow_run.id

    with temporary_settings(updates={PREFECT_LOCAL_STORAGE_PATH: tmp_path / "results"}):  # a fresh cache: it runs
        run_id = tiny()

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run_id])))
        assert [r.name for r in runs] == ["eval records"]
        again = client.read_task_run(runs[0].id)
    assert again.state.is_completed()
    # the metadata names the serializer whole: a client that has our module reads back the one the task wrote
    assert again.state.data.serializer == PERSIST["result_serializer"]
    assert (tmp_path / "results" / again.state.data.storage_key).is_file()

    # the `prefect` CLI does not import our module: it must still list the run (Prefect's stand-in for a serializer
    # it cannot import)
    env = {**os.environ, "PREFECT_API_URL": prefect_server}
    done = subprocess.run(
        [
            str(Path(sys.executable).parent / "prefect"),
            "task-run",
            "ls",
            "--task-run-name",
            "eval records",
            "--limit",
            "100",
            "-o",
            "json",
        ],
        env=env,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    listed = {r["id"]: r for r in json.loads(done.stdout)}
    assert listed[str(runs[0].id)]["state"]["data"]["serializer"]["type"] == PERSIST["result_serializer"].type


def test_every_persisted_task_names_a_serializer_that_its_type_alone_restores():
    """What the server keeps of each persisted stage's serializer (Prefect dumps the metadata as declared: the type
    name only) validates back to that same serializer, for every stage, without a server."""
    from prefect import Task
    from prefect._internal.result_records import ResultRecordMetadata

    import flows.tasks

    stages = [t for t in vars(flows.tasks).values() if isinstance(t, Task) and t.persist_result]
    # every stage a round persists (a stage added later is checked too; a renamed or lost one fails here)
    assert {
        "benchmark_contract",
        "causes",
        "diagnose",
        "eval_shard",
        "gate_look",
        "paired_contract",
        "plan",
        "repair_look",
        "validate",
    } <= {t.name for t in stages}
    for t in stages:
        sent = ResultRecordMetadata(storage_key="k", serializer=t.result_serializer).model_dump(mode="json")
        assert ResultRecordMetadata.model_validate(sent).serializer == t.result_serializer, t.name


def test_results_persisted_as_compressed_still_load_and_the_bytes_are_unchanged(tmp_path):
    """A store written before the type had a name of its own (Prefect's "compressed" with flows.resultzip) loads on a
    resume, and the new serializer writes the very same result bytes."""
    import pandas as pd
    from prefect.filesystems import LocalFileSystem
    from prefect.results import ResultStore
    from prefect.serializers import CompressedSerializer, PickleSerializer

    from flows.tasks import PERSIST

    before = CompressedSerializer(serializer=PickleSerializer(), compressionlib="flows.resultzip")
    frame = pd.DataFrame({"item_id": [f"t{i}" for i in range(50)], "score": [i / 7 for i in range(50)]})
    storage = LocalFileSystem(basepath=str(tmp_path))
    ResultStore(result_storage=storage, serializer=before).write(frame, key="before")
    got = ResultStore(result_storage=storage, serializer=PERSIST["result_serializer"]).read("before")
    pd.testing.assert_frame_equal(got.result, frame)
    assert got.metadata.serializer == before  # the record names the serializer that wrote it
    assert PERSIST["result_serializer"].dumps(frame) == before.dumps(frame)
