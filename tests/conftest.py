"""Test setup: the quiet/offline environment in a temp home, a benchmark materialized once per run, one temporary
Prefect server per run, and one small campaign shared by every test that only reads a campaign's results.

Under pytest-xdist (the default: `-n auto --dist loadgroup`, pyproject.toml: cores + 1 workers) each worker is its own
process with its own home, MLflow store and task cache; the Prefect server is the run's (RunPrefectServer below). The
benchmark is plain files, so the first worker to need it materializes it once for all (a file lock, as pytest-xdist
documents). The small campaign is not files only: the tests that read it also read its MLflow runs from their
process's default tracking store and rely on its Prefect task cache, so they all run on one worker (the
`xdist_group` mark and id suffix added below), which builds it once; so do the tests of a module that share a
module-scoped fixture."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from components.env import quiet_offline

HOME = Path(tempfile.mkdtemp(prefix="ratchet-test-home-"))
quiet_offline(HOME)  # before anything imports prefect or mlflow

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ROOT / "data" / "packages"


# Seconds each heavy scheduling unit takes (a group, or one test: what pytest-xdist hands a worker whole), printed from
# a suite log by scripts/heavy_units.py. Only the order of the queue depends on these: the heaviest units start first,
# on different workers (longest-processing-time first), so that neither worker is left with a long unit at the end.
# A unit not listed weighs nothing and keeps its place (pytest-randomly's order, or the files' order). Stale figures
# cost balance, never correctness. Figures: the idle run of main after the session-6 merges (`./test.sh -p randomly
# --randomly-seed=4242 --durations=0 --durations-min=0.3 -vv`, two workers); "postgres" runs only with the `postgres`
# extra (CI).
HEAVY = {
    "test_operations": 83.4,
    "test_dvc_pipeline": 81.2,
    "small_campaign": 72.1,
    "server_dies": 60.0,  # not measured idle: 97 s wall under load (two Prefect server starts and a campaign)
    "tests/test_campaign.py::test_a_rejected_plan_is_not_tried_again": 17.3,
    # not measured on the idle machine: 16.6 CPU-s for the whole script under load (imports included)
    "tests/test_bench_peers.py::test_bench_peers_quick_runs_every_arm_and_ends_on_its_ratio": 15.0,
    "tests/test_round_replay.py::test_a_round_is_replayed_whole_only_on_the_same_inputs_and_memory": 17.1,
    "tests/test_benchmarks.py::test_benchmark_quick_runs_and_ends_on_its_ratio[bench_memory.py]": 13.1,
    "tests/test_misuse.py::test_a_moved_or_copied_campaign_resumes_and_reproduces_in_place": 12.9,
    "tests/test_operations.py::test_twenty_percent_model_faults": 9.5,
    "test_misuse": 8.1,
    "tests/test_benchmarks.py::test_benchmark_quick_runs_and_ends_on_its_ratio[bench_scaleout.py]": 7.5,
    "tests/test_operations.py::test_dask_gives_the_same_scores_as_threads": 6.3,
    "tests/test_campaign.py::test_cli_campaign_prints_rounds_and_certification": 5.9,
    "test_diagnosis_scoring": 5.4,
    "tests/test_world_and_agent.py::test_memory_changes_the_scores_in_the_designed_order": 5.1,
    "tests/test_world_and_agent.py::test_http_path_gives_identical_scores": 4.6,
    "tests/test_benchmarks.py::test_benchmark_quick_runs_and_ends_on_its_ratio[bench_round.py]": 4.3,
    "tests/test_world_plugin.py::test_an_installed_world_is_found_materialized_and_evolved": 4.3,
    "tests/test_gate.py::test_bench_gate_quick": 4.1,
    "tests/test_gate.py::test_bench_gate_calibration_quick": 4.1,
    "tests/test_budget.py::test_sixteen_concurrent_reservers_never_exceed_the_ceiling[threads]": 3.7,
    "tests/test_contract_cache.py::test_the_paired_contract_is_cached_on_the_frames_and_a_broken_pairing_fails": 3.5,
    "tests/test_operations.py::test_with_a_configured_server_the_temporary_one_is_not_tied_nor_imported": 3.4,
    "tests/test_contract_cache.py::test_the_benchmark_contract_is_cached_on_the_bytes_and_an_edit_is_validated_again": 3.4,
    "tests/test_world_and_agent.py::test_routed_cards_beat_the_same_cards_everywhere": 3.0,
    "tests/test_world_and_agent.py::test_the_knowledge_is_written_down": 3.0,
    "test_gate": 2.9,
    "tests/test_diagnosis_scoring.py::test_ratchet_diagnose_prints_one_json_object": 2.6,
    "tests/test_diagnosis_scoring.py::test_bench_diagnosis_quick_prints_the_table": 2.5,
    "tests/test_budget.py::test_sixteen_concurrent_reservers_never_exceed_the_ceiling[processes]": 2.2,
    "tests/test_world_and_agent.py::test_cli_eval_writes_tables_byte_identically": 2.1,
    "postgres": 4.4,  # CI only (the `postgres` extra): s6-infra's figure
    "signals": 120,  # tests/test_misuse.py's signal test: 371 s at load 15 (s8-misuse), not yet measured idle
    "tests/test_benchmarks.py::test_benchmark_quick_runs_and_ends_on_its_ratio": 2,  # a benchmark not listed above
    # two queued DVC experiments run by DVC's Celery workers: ~20 CPU-s, mostly waiting on the workers (2.5 min at load 8)
    "tests/test_dvc_queue_records.py::test_queued_variants_record_into_the_real_repository": 20,
    # not measured idle: the slowest units of the slow tier at load 5-8 (s14-44's run for SLOW below), so that they
    # start first in `./test.sh --all` and `--slow` rather than last (heavier than their idle figures: only the order
    # among the heaviest moves)
    "tests/test_tau2.py::test_gold_replay_scores_as_tau2s_orchestrator_and_grader_do[tau2-retail-train]": 221.1,
    "tests/test_tau2.py::test_gold_replay_scores_as_tau2s_orchestrator_and_grader_do[tau2-airline-train]": 198.7,
    "tests/test_scale.py::test_bench_fixed_cost_quick_fits_three_campaigns_on_one_server": 183.1,
    "tests/test_tau2.py::test_gold_replay_scores_as_tau2s_orchestrator_and_grader_do[tau2-airline-test]": 172.1,
    "tests/test_tau2.py::test_gold_replay_scores_as_tau2s_orchestrator_and_grader_do[tau2-retail-test]": 169.1,
    "tests/test_tau2.py::test_gold_replay_scores_as_tau2s_orchestrator_and_grader_do[tau2-retail-dev]": 91.1,
    "tests/test_scale.py::test_bench_campaign_scaleout_quick_gives_one_lineage_on_threads_and_dask": 88.8,
    "tests/test_tau2.py::test_gold_replay_scores_as_tau2s_orchestrator_and_grader_do[tau2-airline-dev]": 82.9,
    "tests/test_tau2.py::test_every_plan_ends_and_scores_as_tau2s_orchestrator_has_it[tau2-airline-drop_write]": 77.8,
    "tests/test_tau2.py::test_every_plan_ends_and_scores_as_tau2s_orchestrator_has_it[tau2-airline-change_arg]": 73.3,
    "tests/test_tau2.py::test_every_plan_ends_and_scores_as_tau2s_orchestrator_has_it[tau2-airline-extra_write]": 55.9,
}


# The slow tier (`pytest -m slow`; `./test.sh` runs the other tests, `./test.sh --all` both, CI both: CONTRIBUTING.md
# "The two tiers"). A key is a module (all its tests), a test function (all its parameters) or one test id; its figure
# is the seconds it took (setup, call and teardown) in the run it was picked from: `./test.sh -p randomly
# --randomly-seed=4242 --durations=0 --durations-min=0.3 -vv` on 2 cores at load average 5 to 8 (other campaigns
# running), about twice to three times the idle figures of HEAVY. Picked: every test of 5 s or more there, and whole
# kinds: the benchmark scripts' runs (`--quick` and the like), tau2's gold parity checks, the modules whose tests
# share a heavy module fixture (a DVC project, a preloaded process and its campaign) and DVC's queue. What is left
# runs in under 5 minutes on 2 idle cores. Only the selection depends on these figures; a key that names no test
# fails tests/test_tiers.py. A new slow test goes here with its measured figure (or takes `@pytest.mark.slow`).
SLOW = {
    # modules: one scheduling unit each (a module fixture), or DVC's Celery queue
    "tests/test_dvc_pipeline.py": 86.1,  # its first test also waited for the run's Prefect server
    "tests/test_operations.py": 136.8,
    "tests/test_dvc_queue_records.py": 22.4,
    # tau2's gold parity and its orchestrator checks: tau2's own Orchestrator and grader beside Ratchet's, every task
    "tests/test_tau2.py::test_gold_replay_scores_as_tau2s_orchestrator_and_grader_do": 935.0,  # 6 cases, 83-221 s
    "tests/test_tau2.py::test_every_plan_ends_and_scores_as_tau2s_orchestrator_has_it": 430.5,  # 16 cases, 3-78 s
    "tests/test_tau2.py::test_ratchets_own_harness_is_graded_as_tau2_grades_the_same_conversation": 79.8,  # 6 cases
    "tests/test_tau2.py::test_the_diagnosis_reads_tau2s_outcomes_of_a_policy_blind_agent": 65.8,  # 2 cases
    # the benchmark scripts' runs
    "tests/test_benchmarks.py::test_benchmark_quick_runs_and_ends_on_its_ratio": 60.6,  # 4 scripts, 2-29 s
    "tests/test_benchmarks.py::test_inference_on_random_worlds_quick": 118.0,  # s14: 118 CPU-s with the new forms
    "tests/test_benchmarks.py::test_variants_quick_runs_a_campaign_on_a_random_variant": 51.0,
    "tests/test_bench_peers.py::test_bench_peers_quick_runs_every_arm_and_ends_on_its_ratio": 38.8,
    "tests/test_diagnosis_scoring.py::test_bench_diagnosis_quick_prints_the_table": 28.7,
    "tests/test_diagnosis_scoring.py::test_bench_diagnosis_runs_a_silent_world": 4.8,
    "tests/test_gate.py::test_bench_gate_quick": 2.3,
    "tests/test_gate.py::test_bench_gate_calibration_quick": 17.0,  # s15: + the refund's null campaigns
    "tests/test_gate.py::test_bench_gate_sequential_replays_a_campaign": 4.0,
    "tests/test_gate.py::test_bench_gate_sequential_compares_two_campaigns": 4.5,
    "tests/test_gate_light.py::test_bench_startup_quick": 17.2,
    "tests/test_scale.py::test_bench_fixed_cost_quick_fits_three_campaigns_on_one_server": 183.1,
    "tests/test_scale.py::test_bench_campaign_scaleout_quick_gives_one_lineage_on_threads_and_dask": 88.8,
    "tests/test_tau2.py::test_bench_tau2_scoring_quick_scores_each_gold_replay_one_twice": 30.5,
    "tests/test_tau2.py::test_bench_tau2_requests_quick_is_accepted_by_a_strict_server": 29.2,
    "tests/test_tau2.py::test_bench_tau2_diagnosis_quick_reads_the_wrong_argument": 45.7,
    # signals, a dying Prefect server, kills, campaigns and their reruns, CLI processes: 5 s or more each
    "tests/test_misuse.py::test_sigint_and_sigterm_stop_a_campaign_within_10_s_resumably_and_leave_no_process": 140.6,
    "tests/test_misuse.py::test_a_campaign_whose_prefect_server_dies_stops_within_60_s_with_one_line_and_resumes": 79.0,
    "tests/test_misuse.py::test_a_moved_or_copied_campaign_resumes_and_reproduces_in_place": 18.5,
    "tests/test_misuse.py::test_a_running_campaign_is_refused_before_prefect_says_anything": 14.0,
    "tests/test_misuse.py::test_a_temporary_prefect_server_that_does_not_come_up_is_one_line_saying_what_to_do": 12.8,
    "tests/test_misuse.py::test_kill_9_of_a_campaign_leaves_no_prefect_server": 11.7,
    "tests/test_misuse.py::test_a_campaign_on_a_full_disk_is_one_line_naming_the_path_and_resumes": 10.0,
    "tests/test_misuse.py::test_a_flag_shows_no_value_placeholder": 5.4,
    "tests/test_outer.py::test_one_offline_outer_round": 46.8,
    "tests/test_outer.py::test_a_failing_training_command_is_one_line_exit_1_without_prefects_traceback": 5.6,
    "tests/test_scale.py::test_a_worker_in_another_directory_gives_identical_results": 27.3,
    "tests/test_round_replay.py::test_a_round_is_replayed_whole_only_on_the_same_inputs_and_memory": 24.5,
    "tests/test_campaign_isolation.py::test_an_experiment_and_its_undo_leave_the_default_campaigns_records_alone": 22.8,
    "tests/test_campaign.py::test_a_changed_input_recomputes_only_what_depends_on_it": 20.5,
    "tests/test_campaign.py::test_shards_sized_to_the_look_change_no_result": 15.6,
    "tests/test_campaign.py::test_a_rejected_plan_is_not_tried_again": 15.3,
    "tests/test_campaign.py::test_cli_campaign_prints_rounds_and_certification": 12.6,
    "tests/test_campaign.py::test_llm_meta_agent_goes_through_the_model_and_the_same_schema": 9.3,
    "tests/test_campaign.py::test_rerun_with_the_same_bytes_runs_no_episode": 8.7,
    "tests/test_campaign.py::test_rounds_without_a_plan_retry_from_the_pool_and_ablate": 56.0,  # s15: 5 rounds, -n 0
    # 3 and 2 rounds of a variant of the small campaign: not measured, estimated from the 5-round one above
    "tests/test_campaign.py::test_a_campaign_with_futility_refunds_keeps_its_alpha_account": 45.0,
    "tests/test_campaign.py::test_a_campaign_with_the_cost_objective_tests_both_claims_and_says_which_promoted": 30.0,
    "tests/test_evidence_campaign.py::test_a_second_campaign_does_not_retry_what_the_first_rejected_on_the_same_evidence": 11.6,
    "tests/test_notebook.py::test_campaign_notebook_executes_against_a_campaign": 10.2,
    "tests/test_trace_destination.py::test_traces_land_in_the_campaigns_store_not_the_processs": 5.6,  # + the small campaign
    "tests/test_world_plugin.py::test_an_installed_world_is_found_materialized_and_evolved": 13.3,
    "tests/test_prefect_records.py::test_our_task_runs_read_back_through_the_client_and_the_cli": 7.4,
    "tests/test_diagnosis_scoring.py::test_a_checker_bounce_is_read_as_c": 23.4,
    "tests/test_diagnosis_scoring.py::test_ratchet_diagnose_prints_one_json_object": 10.2,
    "tests/test_diagnosis_scoring.py::test_localization_over_every_failure_beats_the_simple_guesses[all-skills-8]": 7.7,
    "tests/test_diagnosis_scoring.py::test_localization_over_every_failure_beats_the_simple_guesses[all-skills-40]": 7.6,
    "tests/test_diagnosis_scoring.py::test_localization_over_every_failure_beats_the_simple_guesses[none-40]": 5.7,
    "tests/test_random_worlds.py::test_a_random_rule_of_every_form_is_recovered[table_factor]": 9.3,
    "tests/test_random_worlds.py::test_a_random_rule_of_every_form_is_recovered[product2]": 8.5,
    "tests/test_random_worlds.py::test_a_random_rule_of_every_form_is_recovered[const_product]": 7.8,
    "tests/test_random_worlds.py::test_a_random_rule_of_every_form_is_recovered[product3]": 7.1,
    "tests/test_random_worlds.py::test_a_random_rule_of_every_form_is_recovered[cap]": 6.8,
    "tests/test_random_worlds.py::test_a_random_rule_of_every_form_is_recovered[table2]": 5.7,
    "tests/test_real_model_path.py::test_a_perfect_agent_scores_one_on_every_possible_dev_task_of_each_world": 9.0,
    "tests/test_real_model_path.py::test_a_killed_eval_leaves_its_finished_episodes_and_a_rerun_resumes_them": 8.3,
    "tests/test_routing_faults.py::test_a_rotated_reference_fails_on_routing_and_is_diagnosed_rho": 9.2,
    "tests/test_world_and_agent.py::test_http_path_gives_identical_scores": 8.0,
    "tests/test_world_and_agent.py::test_memory_changes_the_scores_in_the_designed_order": 5.5,
    "tests/test_package_load_errors.py::test_a_card_nested_too_deeply_is_one_line_where_yaml_has_no_c_loader": 5.4,
    "tests/test_budget.py::test_sixteen_concurrent_reservers_never_exceed_the_ceiling[threads]": 5.9,
    "tests/test_tau2.py::test_a_strict_chat_template_server_runs_whole_episodes_under_both_protocols": 17.4,
    "tests/test_tau2.py::test_an_eval_records_its_protocol_user_and_the_splits_its_items_came_from": 7.6,
    "tests/test_tau2.py::test_materialize_is_deterministic_and_dev_follows_the_seed": 6.4,
    "tests/test_tau2.py::test_a_user_simulator_server_that_is_down_errs_the_episode_and_an_all_errored_eval_is_one_line": 6.4,
    "tests/test_tau2.py::test_the_gold_side_of_scoring_is_computed_once_per_task": 6.2,
    "tests/test_tau2.py::test_the_user_models_tokens_are_recorded_beside_the_agents": 6.2,
}


def slow_key(nodeid: str) -> str | None:
    """The key of SLOW that puts a test (its id as collected, before any "@group" suffix) in the slow tier, if any:
    the test itself, its function (any parameters) or its module."""
    function = nodeid.split("[", 1)[0]
    for key in (nodeid, function, function.split("::", 1)[0]):
        if key in SLOW:
            return key
    return None


def weight(unit: str) -> float:
    """HEAVY's figure for a group name or a test id (a parametrized test also matches by its function)."""
    return HEAVY.get(unit, HEAVY.get(unit.split("[", 1)[0], 0.0))


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook, which reads the marks into the test ids; after
def pytest_collection_modifyitems(config, items):  # pytest-randomly's shuffle (a hook wrapper that runs first)
    """The tests of the slow tier (SLOW) take the `slow` mark, which `-m` then selects on (pytest's own
    `-m` deselection runs after this hook). Under `--dist loadgroup`, fixtures built once stay built once: the tests
    that read the small campaign go to one worker, and so do a module's tests that share a module-scoped fixture (a
    DVC project, a preloaded process) and the tests marked with one `xdist_group`. Then the heaviest units go to the
    front of the queue (HEAVY)."""
    loadgroup = getattr(config.option, "loadgroup", False)
    units = {}
    for item in items:
        if slow_key(item.nodeid) is not None:
            item.add_marker(pytest.mark.slow)
        fixturedefs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
        # a test's own group (named as pytest-xdist names it): for a fixture its closure does not show because it is
        # reached through getfixturevalue, e.g. the Postgres server of tests/test_evidence_graph.py
        marked = sorted(
            {str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in item.iter_markers("xdist_group")}
        )
        if marked:
            group = "_".join(marked)
        elif "small_campaign" in getattr(item, "fixturenames", ()):
            group = "small_campaign"
        elif any(d.scope == "module" for defs in fixturedefs.values() for d in defs):
            group = item.path.stem
        else:
            units[item] = item.nodeid
            continue
        units[item] = group
        if not marked:
            item.add_marker(pytest.mark.xdist_group(group))
        if loadgroup and hasattr(item, "_id"):
            # pytest 9 keeps the id in `item._id`; pytest-xdist 3.8 suffixes `item._nodeid`, which it no longer
            # reads. Suffix the id here the way xdist would (its scheduler groups by the part after "@").
            from _pytest.nodeid import NodeId

            item._id = NodeId.parse(f"{item.nodeid}@{group}")
    if loadgroup:
        # pytest-xdist queues the units in the order of their first test (with `--no-loadscope-reorder`, addopts):
        # heaviest first, ties in the order given. The same on every worker (the same collection and seed), as
        # xdist requires.
        first = {}
        for i, item in enumerate(items):
            first.setdefault(units[item], i)
        items.sort(key=lambda item: (-weight(units[item]), first[units[item]]))


def shared_dir(tmp_path_factory, worker_id: str, name: str) -> tuple[Path, Any]:
    """(a directory every xdist worker of this run sees, a lock on it); in a run without workers, this session's own."""
    from filelock import FileLock

    if worker_id == "master":  # not under xdist: the parent is shared by every run of this user, so stay in ours
        root = tmp_path_factory.getbasetemp()
    else:
        root = tmp_path_factory.getbasetemp().parent
    return root / name, FileLock(str(root / f"{name}.lock"))


@pytest.fixture(scope="session")
def worker_id(request) -> str:
    """pytest-xdist's worker id ("gw0", ...), "master" when not under xdist (also when xdist is not installed)."""
    workerinput = getattr(request.config, "workerinput", None)
    return workerinput["workerid"] if workerinput else "master"


@pytest.fixture(scope="session")
def bench_dir(tmp_path_factory, worker_id) -> Path:
    """The retail benchmark (seed 0), materialized once per run, read-only. Materializing writes it atomically, so
    it exists whole or not at all."""
    from components.worlds import world

    root, lock = shared_dir(tmp_path_factory, worker_id, "bench")
    out = root / "retail"
    with lock:
        if not out.exists():
            world("retail").materialize(out, 0)
    return out


@pytest.fixture(scope="session")
def bench(bench_dir):
    from components.worlds import load_benchmark

    return load_benchmark(bench_dir)


@pytest.fixture
def package_copy(tmp_path):
    """Copy a shipped package into a temp dir so a test can break it."""
    import shutil

    def make(name: str = "reference") -> Path:
        dst = tmp_path / name
        shutil.copytree(PACKAGES / name, dst)
        return dst

    return make


SERVER_URL_KEY = "ratchet_prefect_api_url"  # in each xdist worker's `workerinput`: the run's Prefect server
SERVER_LOG_KEY = "ratchet_prefect_server_log"


def migrated_database(db: Path) -> None:
    """Start the run's Prefect database as a copy of an empty one that Prefect's own command migrated
    (`prefect server database upgrade -y`), made once per Prefect version in `$XDG_CACHE_HOME/ratchet` (else
    `~/.cache/ratchet`, beside MLflow's store template: components/tracking/mlflow_log.py). A server starting on a
    new file runs every migration first: 17 CPU-s to answer instead of 8 on a migrated copy (idle-ish machine, load
    5-8); making the template costs ~6 CPU-s once. The server still runs its migrations on start, which find nothing
    to do. On any failure the server migrates its own new file, as before."""
    import os
    import shutil
    import subprocess
    import sys
    from importlib.metadata import version

    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ratchet"
    template = cache / f"prefect-{version('prefect')}-migrated.db"
    try:
        if not template.exists():
            cache.mkdir(parents=True, exist_ok=True)
            tmp = cache / f".{template.name}.{os.getpid()}"
            tmp.unlink(missing_ok=True)
            with open(db.with_name("template.log"), "wb") as log:
                subprocess.run(
                    [sys.executable, "-m", "prefect", "server", "database", "upgrade", "-y"],
                    check=True,
                    env={**os.environ, "PREFECT_SERVER_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{tmp}"},
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    timeout=600,
                )
            os.replace(tmp, template)  # whole or not at all; another run's identical template may win the race
        shutil.copyfile(template, db)
    except (OSError, subprocess.SubprocessError):
        db.unlink(missing_ok=True)


class RunPrefectServer:
    """In the xdist controller: one temporary Prefect server (and SQLite database) for the whole run, not one per
    worker (starting one costs ~8 CPU-s on a migrated database: `migrated_database`). It is started, without
    waiting, as the first worker is set up, so it boots while the workers import and collect; each worker's
    `prefect_server` waits until it answers. It is Prefect's own
    temporary server (Prefect 3.9.1's `SubprocessASGIServer` command and environment, as `prefect_test_harness`
    runs it) started through flows/prefect_setup.py's wrapper, which stops it when this process dies however it
    died; a normal end stops it at once. Only the server is shared: each worker keeps its own home, result storage
    (the task cache) and MLflow store (`quiet_offline` above)."""

    def __init__(self) -> None:
        self.proc = self.thread = None
        self.url = self.log = self.tmp = None

    def start(self) -> None:
        """Pick the port now (the workers are told the URL at once); the database and the server come in a thread,
        so that making the template the first time (`migrated_database`) never holds up the workers' start."""
        import socket
        import threading

        self.tmp = Path(tempfile.mkdtemp(prefix="ratchet-test-prefect-"))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}/api"
        self.log = self.tmp / "server.log"
        self.thread = threading.Thread(target=self._serve, args=(port,), daemon=True)
        self.thread.start()

    def _serve(self, port: int) -> None:
        import importlib.util
        import os
        import subprocess
        import sys

        db = self.tmp / "prefect.db"
        migrated_database(db)
        site = Path(importlib.util.find_spec("prefect").origin).parents[1]  # `prefect.__module_path__.parent`
        env = {
            **os.environ,
            "PREFECT_UI_ENABLED": "0",
            "PREFECT__SERVER_EPHEMERAL": "1",
            "PREFECT__SERVER_FINAL": "1",
            "PREFECT_SERVER_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{db}",
            "PYTHONPATH": os.pathsep.join(x for x in (str(ROOT), os.environ.get("PYTHONPATH", "")) if x),
        }
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "flows.prefect_setup",
                    str(os.getpid()),
                    "--app-dir",
                    str(site),
                    "--factory",
                    "prefect.server.api.server:create_app",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--log-level",
                    "error",
                    "--lifespan",
                    "on",
                ],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.tmp,
            )

    def pytest_configure_node(self, node) -> None:  # pytest-xdist's hook, in the controller, per worker
        if self.thread is None:
            self.start()
        node.workerinput[SERVER_URL_KEY] = self.url
        node.workerinput[SERVER_LOG_KEY] = str(self.log)

    def pytest_unconfigure(self, config) -> None:
        import shutil
        import subprocess

        if self.thread is not None:
            self.thread.join()
        if self.proc is not None:
            self.proc.terminate()  # SIGTERM: uvicorn shuts down cleanly
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)


def pytest_xdist_auto_num_workers(config) -> int:
    """`-n auto` (pyproject.toml): one worker more than the cores this process may use. A worker spends about a
    quarter of its time waiting (fresh interpreters starting, Prefect polling, DVC's stage processes), which a third
    worker on two cores fills: idle, 3m52s with three against 4m01s-4m13s with two (CONTRIBUTING.md, "How the suite
    runs")."""
    import os

    return len(os.sched_getaffinity(0)) + 1 if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1) + 1


def pytest_configure(config):
    # the controller of an xdist run (not a worker, not a run without workers, which keep the fixture's own server)
    if config.pluginmanager.hasplugin("xdist") and not hasattr(config, "workerinput"):
        config.pluginmanager.register(RunPrefectServer(), "ratchet-run-prefect-server")


def wait_for_server(url: str, log: str, timeout: float = 180) -> None:
    import time

    import httpx

    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=5) as client:
        while True:
            try:
                if client.get(f"{url}/health").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                tail = Path(log).read_text(errors="replace")[-3000:] if Path(log).exists() else "(no log)"
                raise RuntimeError(
                    f"the run's Prefect server at {url} did not answer in {timeout:.0f} s; its log ({log}):\n{tail}"
                )
            time.sleep(0.1)


@pytest.fixture(scope="session")
def prefect_server(request):
    """The Prefect server of the run: under xdist, the one the controller started for every worker (RunPrefectServer
    above); without workers, the same kind of server started by this session (on a migrated database too, where
    Prefect's test harness would migrate a new one). Its API URL is set in this process's Prefect settings;
    subprocesses (CLI, worker) reach the same server through the URL this returns."""
    import prefect.context
    from prefect.settings import PREFECT_API_URL, temporary_settings

    workerinput = getattr(request.config, "workerinput", {})
    own = None
    if SERVER_URL_KEY in workerinput:
        url, log = workerinput[SERVER_URL_KEY], workerinput[SERVER_LOG_KEY]
    else:
        own = RunPrefectServer()
        own.start()
        url, log = own.url, str(own.log)
    try:
        wait_for_server(url, log)
        # as prefect_test_harness does: also the process-global settings, for contexts copied before this point
        with (
            temporary_settings(updates={PREFECT_API_URL: url}),
            prefect.context._temporary_global_settings_context(prefect.context.get_settings_context()),
        ):
            yield url
    finally:
        if own is not None:
            own.pytest_unconfigure(request.config)


@pytest.fixture(scope="session")
def free_port():
    import socket

    def get() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    return get


@pytest.fixture(autouse=True)
def own_evidence_graph(tmp_path_factory, monkeypatch):
    """Each test's campaigns (and the CLI processes it starts) record into a graph of their own: with one shared
    graph, a campaign plans from what other tests' campaigns on the same benchmark accepted or rejected, so results
    would depend on test order. A test that wants shared memory passes `evidence.db` itself."""
    monkeypatch.setenv("RATCHET_EVIDENCE_DB", str(tmp_path_factory.mktemp("evidence") / "evidence.db"))


@dataclass(frozen=True)
class Campaign:
    params: Any  # components.params.Params
    out: Path
    summary: dict


# Small campaigns: 3 rounds, 2 seeds per item (the shared one, `small_campaign`, sets its own benchmark size and round
# count). Tests that vary a knob of it start from these overrides and its benchmark (tests/test_campaign.py `variant`)
# so that everything they do not vary comes from the Prefect task cache this campaign filled.
# explained receipts: the session's benchmark (`bench_dir`) is the world's own build, whose refusals state the rule;
# the small campaign's claims (a rule card written from a refusal) are about that mode, whatever params.yaml defaults to
SMALL = {
    "campaign.name": "small",
    "campaign.rounds": 3,
    "campaign.seeds": 2,
    "gate.n_boot": 2000,
    "evidence.memory": False,
    "benchmark.receipts": "explained",
}  # stateless: a test that wants memory turns it on
EXPLAINED = ["--set", "benchmark.receipts=explained"]  # the same pin on a command line


def small_params(bench_dir: Path, out: Path, **over):
    from components.params import load_params

    return load_params(
        ROOT / "params.yaml", {"benchmark.out": str(bench_dir), "campaign.out": str(out), **SMALL, **over}
    )


@pytest.fixture(scope="session")
def small_campaign(prefect_server, tmp_path_factory) -> Campaign:
    """One small campaign, run once in-process, for every test that reads a campaign (records, reproduce, reruns,
    the notebook). Read-only: a test that changes files copies `out` first. A test that runs a variant of it takes
    its benchmark from `params.benchmark` (the same bytes at the same path: the task cache answers)."""
    from components.worlds import world
    from flows.campaign import run_campaign

    root = tmp_path_factory.mktemp("small-campaign")
    # half the session's benchmark (18 tasks per family), two rounds: ~3x less work, and still what its readers
    # look at: a round rejected by the gate, then one promoted, and a champion certified on the test split (dev a
    # little larger than a third, so that the promotion is not too small to show). What they check does not depend
    # on the size.
    size = {
        "benchmark.per_family": 18,
        "benchmark.train_share": 0.34,
        "benchmark.dev_share": 0.46,
        "campaign.rounds": 2,
    }
    bench = world("retail").materialize(
        root / "bench", 0, size["benchmark.per_family"], (size["benchmark.train_share"], size["benchmark.dev_share"])
    )
    out = root / "camp"
    # How it is cut into Prefect tasks and what it logs, neither of which changes a result (RERUN_MAY_CHANGE): an
    # evaluation in one shard (up to 50 items) rather than one per 10 (~10% less CPU: fewer task runs, here and on
    # the server); 3 traces a round (params.yaml: 12), as many as the trace tests need (each packet's first cited
    # episodes, a second packet, the round's cap). Variants copy both (tests/test_campaign.py `variant`).
    recording = {"campaign.shard_size": 50, "campaign.traces_per_round": 3}
    # its own evidence graph: other tests' campaigns named "small" must not record over what this one's tests read
    p = small_params(bench, out, **size, **recording, **{"evidence.db": str(root / "evidence.db")})
    s = run_campaign(p)
    # what its readers need, said here rather than as a puzzling failure in one of them: a round rejected by the
    # gate, one promoted (narrowly: dev CI lower bound just above 0), and a champion certified on the test split
    verdicts = [r["verdict"] for r in s["history"]]
    gated_reject = [r for r in s["history"] if r["verdict"] == "reject" and r.get("gate")]
    assert gated_reject and "accept" in verdicts and s["accepted"] >= 1 and s["test"] and s["test"]["ci_lo"] > 0, (
        "the shared small campaign no longer has a gate rejection, a promotion and a certified champion: "
        f"verdicts {verdicts}, gates {[(r.get('gate') or {}).get('ci_lo') for r in s['history']]}, test {s['test']}"
    )
    return Campaign(p, out, s)


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    """`ratchet ...` in this process, through the real entry point (its error handling included): exit code, stdout,
    stderr. A subprocess would prove nothing more and cost an interpreter start and the imports."""
    import sys

    from flows.entry import main  # the console script's: `gate` on its light path, every other command via typer

    argv = sys.argv
    sys.argv = ["ratchet", *args]
    try:
        main()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.argv = argv
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """A run of the fast tier (`./test.sh`, `-m "not slow"`) that ran nothing says how to run what it left out,
    e.g. `./test.sh tests/test_dvc_pipeline.py`, all of whose tests are slow."""
    if (
        exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED
        and config.option.markexpr == "not slow"
        and not hasattr(config, "workerinput")
    ):
        terminalreporter.write_line(
            'no test ran in the fast tier (-m "not slow"): the tests selected may all be in '
            "the slow tier (tests/conftest.py::SLOW); `./test.sh --all ...` runs them too"
        )
