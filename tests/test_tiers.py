"""The two tiers of the suite (CONTRIBUTING.md "The two tiers"): tests/conftest.py::SLOW names existing tests only,
and the `slow` mark it gives is registered (pyproject.toml), so that `-m slow` and `-m "not slow"` select what they
say. Read from the sources, without collecting: a key that names nothing would leave its test in the fast tier."""

from __future__ import annotations

import ast
import tomllib

from tests.conftest import ROOT, SLOW, slow_key


def test_every_slow_key_names_a_test_that_exists():
    functions: dict[str, set[str]] = {}
    for key in SLOW:
        module, _, rest = key.partition("::")
        assert (ROOT / module).is_file(), f"SLOW names a module that does not exist: {key}"
        if not rest:
            continue
        if module not in functions:
            tree = ast.parse((ROOT / module).read_text(encoding="utf-8"))
            functions[module] = {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
        assert rest.split("[", 1)[0] in functions[module], f"SLOW names a test that does not exist: {key}"


def test_a_test_is_slow_by_its_id_its_function_or_its_module():
    assert slow_key("tests/test_dvc_pipeline.py::test_experiments_vary_a_param") == "tests/test_dvc_pipeline.py"
    gold = "tests/test_tau2.py::test_gold_replay_scores_as_tau2s_orchestrator_and_grader_do"
    assert slow_key(f"{gold}[tau2-retail-dev]") == gold
    one = "tests/test_budget.py::test_sixteen_concurrent_reservers_never_exceed_the_ceiling"
    assert slow_key(f"{one}[threads]") == f"{one}[threads]"
    assert slow_key(f"{one}[processes]") is None
    assert slow_key("tests/test_tiers.py::test_a_test_is_slow_by_its_id_its_function_or_its_module") is None


def test_the_slow_mark_is_registered():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    markers = config["tool"]["pytest"]["ini_options"]["markers"]
    assert any(m.split(":", 1)[0].strip() == "slow" for m in markers)
