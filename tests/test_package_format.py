"""The memory package format and `ratchet package lint/digest`.

Malformed packages are built as broken copies of the shipped ones (the `package_copy` fixture) and checked through the
real CLI, run as a subprocess: non-zero exit, exactly one stderr line per problem, each naming the file and the field,
and never a traceback.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from components.errors import InputError
from components.memory import PackageError, digest, lint, load_package

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ROOT / "data" / "packages"
SHIPPED = ["none", "seed", "all-skills", "reference"]
REFERENCE_CARDS = [
    "em/procedure/account-address.md",
    "em/procedure/cancel-reason.md",
    "em/procedure/exchange-available-variant.md",
    "em/procedure/late-delivery-credit.md",
    "em/procedure/normalize-shipping-address.md",
    "em/procedure/refund-original-payment.md",
]
CARD = "em/procedure/cancel-reason.md"
WIDE = "4096"


def run_cli(*args: str, columns: str | None = WIDE) -> subprocess.CompletedProcess:
    """Run `python -m flows.cli ...` from the project root, stdin closed, output captured (never a terminal).

    Rich wraps console output at $COLUMNS (80 when unset and not a terminal); `columns=WIDE` keeps each problem
    on its line so the other checks are independent of the wrapping bug tested in
    `test_lint_cli_one_line_per_problem_at_default_width`. `columns=None` runs with COLUMNS unset."""
    env = dict(os.environ)
    env.pop("COLUMNS", None)
    if columns is not None:
        env["COLUMNS"] = columns
    return subprocess.run(
        [sys.executable, "-m", "flows.cli", *args],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )


def parse_problem_lines(stderr: str, pkg: Path) -> list[tuple[str, str, str]]:
    """Every stderr line as (relative file, field, message); fails on a line that is not `<pkg>/<rel>: field: msg`."""
    prefix = pkg.as_posix() + "/"
    out = []
    for line in stderr.splitlines():
        assert line.startswith(prefix), f"line does not name a file in the package: {line!r}"
        parts = line[len(prefix) :].split(": ", 2)
        assert len(parts) == 3, f"line is not 'file: field: message': {line!r}"
        rel, field, message = parts
        assert message.strip(), f"empty message: {line!r}"
        out.append((rel, field, message))
    return out


# -- editing helpers --------------------------------------------------------------------------------------------


def replace_once(path: Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert text.count(old) == 1, f"{old!r} should occur exactly once in {path}"
    path.write_text(text.replace(old, new), encoding="utf-8")


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def card_text(id: str, type: str = "procedure", trigger: str | None = "intent_recorded", extra: str = "") -> str:
    trig = f"trigger:\n  event: {trigger}\n" if trigger else ""
    return f"---\nid: {id}\ntype: {type}\n{trig}{extra}source: tests\n---\nA card body.\n"


# -- the malformed cases ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    id: str
    breaker: Callable[[Path], None]
    expected: tuple[tuple[str, str], ...]  # (relative file, field regex), one per expected stderr line
    base: str = "reference"
    cli: bool = True  # checked through the CLI subprocess; the other variants through lint() in-process (speed)


def unreachable() -> tuple[tuple[str, str], ...]:
    """The reference cards all route through delivery[0] (event_cards@intent_recorded): when that binding is broken,
    each card is also reported as undeliverable, on its own line."""
    return tuple((rel, re.escape("trigger.event")) for rel in REFERENCE_CARDS)


def _symlink_card(p: Path) -> None:
    (p / "em/procedure/alias.md").symlink_to("cancel-reason.md")


def _dangling_symlink(p: Path) -> None:
    (p / "em/procedure/ghost.md").symlink_to("nowhere.md")


def _symlink_dir(p: Path) -> None:
    (p / "em/knowledge").symlink_to("procedure", target_is_directory=True)


def _non_utf8_card(p: Path) -> None:
    with open(p / CARD, "ab") as f:
        f.write(b"\xff\xfe caf\xe9\n")


def _non_utf8_manifest(p: Path) -> None:
    with open(p / "manifest.yaml", "ab") as f:
        f.write(b"# \xe9t\xe9\n")


def _drop_trigger(p: Path) -> None:
    replace_once(p / CARD, "trigger:\n  event: intent_recorded\n  tool: cancel_pending_order\n", "")


def _duplicate_id(p: Path) -> None:
    text = (p / CARD).read_text(encoding="utf-8").replace("type: procedure", "type: knowledge")
    write(p / "em/knowledge/cancel-reason.md", text)


CASES = [
    # -- manifest: strategy bindings
    Case(
        "unknown-strategy-checker",
        lambda p: replace_once(
            p / "manifest.yaml", "use: completion_requires_receipts", "use: completion_requires_receipt"
        ),
        (("manifest.yaml", re.escape("checkers[0].use")),),
    ),
    Case(
        "unknown-strategy-delivery",
        lambda p: replace_once(p / "manifest.yaml", "use: event_cards", "use: evnt_cards"),
        (("manifest.yaml", re.escape("delivery[0].use")),) + unreachable(),
        cli=False,
    ),
    Case(
        "unknown-event-checker",
        lambda p: replace_once(p / "manifest.yaml", "at: agent_declares_done", "at: agent_declares_finished"),
        (("manifest.yaml", re.escape("checkers[0].at")),),
    ),
    Case(
        "unknown-event-delivery",
        lambda p: replace_once(p / "manifest.yaml", "at: intent_recorded", "at: intent_recordedd"),
        (("manifest.yaml", re.escape("delivery[0].at")),) + unreachable(),
        cli=False,
    ),
    Case(
        "unsupported-event-completion-at-pre-write",
        lambda p: replace_once(p / "manifest.yaml", "at: agent_declares_done", "at: pre_write"),
        (("manifest.yaml", re.escape("checkers[0].at")),),
        cli=False,
    ),
    Case(
        "unsupported-event-confirm-at-turn-start",
        lambda p: replace_once(p / "manifest.yaml", "at: pre_write", "at: turn_start"),
        (("manifest.yaml", re.escape("checkers[1].at")),),
    ),
    Case(
        "unsupported-event-deliverer-at-draft-ready",
        lambda p: replace_once(p / "manifest.yaml", "at: intent_recorded", "at: draft_ready"),
        (("manifest.yaml", re.escape("delivery[0].at")),) + unreachable(),
        cli=False,
    ),
    Case(
        "unknown-option-checker",
        lambda p: replace_once(p / "manifest.yaml", "match_args: [order_id]", "match_arg: [order_id]"),
        (("manifest.yaml", re.escape("checkers[1].cfg.match_arg")),),
    ),
    Case(
        "unknown-option-delivery",
        lambda p: replace_once(p / "manifest.yaml", "max_per_episode: 6", "max_per_episod: 6"),
        (("manifest.yaml", re.escape("delivery[0].cfg.max_per_episod")),) + unreachable(),
        cli=False,
    ),
    Case(
        "unknown-option-wm",
        lambda p: replace_once(p / "manifest.yaml", "max_entries: 8", "max_entry: 8"),
        (("manifest.yaml", re.escape("wm.max_entry")),),
        cli=False,
    ),
    Case(
        "ill-typed-option-int",
        lambda p: replace_once(p / "manifest.yaml", "max_per_episode: 6", 'max_per_episode: "three"'),
        (("manifest.yaml", re.escape("delivery[0].cfg.max_per_episode")),) + unreachable(),
    ),
    Case(
        "ill-typed-option-list",
        lambda p: replace_once(p / "manifest.yaml", "match_args: [order_id]", "match_args: order_id"),
        (("manifest.yaml", re.escape("checkers[1].cfg.match_args")),),
        cli=False,
    ),
    Case(
        "ill-typed-option-bool",
        lambda p: replace_once(
            p / "manifest.yaml",
            "at: agent_declares_done",
            'at: agent_declares_done\n    cfg:\n      allow_blocked: "no"',
        ),
        (("manifest.yaml", re.escape("checkers[0].cfg.allow_blocked")),),
        cli=False,
    ),
    Case(
        "ill-typed-wm",
        lambda p: replace_once(p / "manifest.yaml", "max_entries: 8", "max_entries: eight"),
        (("manifest.yaml", re.escape("wm.max_entries")),),
        cli=False,
    ),
    # -- manifest: YAML and presence
    Case(
        "malformed-yaml-manifest",
        lambda p: replace_once(p / "manifest.yaml", "bind_on: [order_id]", "bind_on: [order_id"),
        (("manifest.yaml", r"line \d+"),),
    ),
    Case("missing-manifest", lambda p: (p / "manifest.yaml").unlink(), (("manifest.yaml", "-"),)),
    Case("non-utf8-manifest", _non_utf8_manifest, (("manifest.yaml", "-"),), cli=False),
    # -- cards
    Case(
        "malformed-front-matter",
        lambda p: replace_once(p / CARD, "type: procedure", "type: [procedure"),
        ((CARD, re.escape("front matter")),),
    ),
    Case("duplicate-card-id", _duplicate_id, ((CARD, "id"),)),
    Case(
        "card-id-not-file-name",
        lambda p: replace_once(p / CARD, "id: cancel-reason", "id: cancel-reasons"),
        ((CARD, "id"),),
    ),
    Case(
        "unknown-card-type-directory",
        lambda p: write(p / "em/recipe/new-card.md", card_text("new-card")),
        (("em/recipe/new-card.md", "type"),),
    ),
    Case(
        "unknown-card-type-front-matter",
        lambda p: replace_once(p / CARD, "type: procedure", "type: recipe"),
        ((CARD, "type"),),
    ),
    Case(
        "card-type-not-its-directory",
        lambda p: replace_once(p / CARD, "type: procedure", "type: knowledge"),
        ((CARD, "type"),),
        cli=False,
    ),
    Case(
        "unknown-trigger-event",
        lambda p: replace_once(p / CARD, "event: intent_recorded", "event: intent_recordedd"),
        ((CARD, re.escape("trigger.event")),),
        cli=False,
    ),
    Case(
        "trigger-event-no-binding-delivers",
        lambda p: replace_once(p / CARD, "event: intent_recorded", "event: turn_start"),
        ((CARD, re.escape("trigger.event")),),
    ),
    Case("no-trigger-no-all-cards", _drop_trigger, ((CARD, "trigger"),)),
    Case(
        "unknown-front-matter-key",
        lambda p: replace_once(p / CARD, "source: ", "author: someone\nsource: "),
        ((CARD, "author"),),
    ),
    Case(
        "empty-card-body",
        lambda p: write(p / "em/knowledge/hollow.md", card_text("hollow", "knowledge").replace("A card body.\n", "\n")),
        (("em/knowledge/hollow.md", "body"),),
        cli=False,
    ),
    # -- files
    Case("symlink-card", _symlink_card, (("em/procedure/alias.md", "-"),)),
    Case("dangling-symlink", _dangling_symlink, (("em/procedure/ghost.md", "-"),), cli=False),
    Case("symlink-directory", _symlink_dir, (("em/knowledge", "-"),), cli=False),
    Case("non-utf8-card", _non_utf8_card, ((CARD, "-"),)),
    Case("unexpected-file", lambda p: write(p / "notes.txt", "hi\n"), (("notes.txt", "-"),), cli=False),
    # all-skills routes every card through all_cards, so a trigger-less card there is fine; in `seed` it is not
    Case(
        "no-trigger-in-seed",
        lambda p: write(p / "em/knowledge/orphan.md", card_text("orphan", "knowledge", None)),
        (("em/knowledge/orphan.md", "trigger"),),
        base="seed",
        cli=False,
    ),
]


def build_case(package_copy, case: Case) -> Path:
    pkg = package_copy(case.base)
    assert lint(pkg) == [], "the base package must be clean before it is broken"
    case.breaker(pkg)
    return pkg


# -- shipped packages -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_package_lints_clean(name):
    path = PACKAGES / name
    assert lint(path) == []
    r = run_cli("package", "lint", str(path))
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    assert r.stdout.strip() == f"ok: {path}"


def test_shipped_packages_load():
    ref = load_package(PACKAGES / "reference")
    assert ref.name == "reference"
    assert sorted(c.path for c in ref.cards.values()) == REFERENCE_CARDS
    assert [b.label for b in ref.delivery] == ["event_cards@intent_recorded"]
    assert [b.label for b in ref.checkers] == [
        "completion_requires_receipts@agent_declares_done",
        "confirm_before_write@pre_write",
    ]
    assert ref.wm.bind_on == ["order_id"] and ref.wm.max_entries == 8
    assert ref.digest == digest(PACKAGES / "reference")
    none = load_package(PACKAGES / "none")
    assert none.cards == {} and none.delivery == () and none.checkers == () and none.wm.board is False


def test_trigger_less_card_is_fine_under_all_cards(package_copy):
    pkg = package_copy("all-skills")
    write(pkg / "em/knowledge/orphan.md", card_text("orphan", "knowledge", None))
    assert lint(pkg) == []
    assert "orphan" in load_package(pkg).cards


# -- malformed packages through the CLI -------------------------------------------------------------------------


def assert_expected_problems(lines: list[tuple[str, str, str]], case: Case, output: str) -> None:
    """Exactly one line per expected problem, each naming the right file and field."""
    assert len(lines) == len(case.expected), output
    unmatched = list(lines)
    for rel, field_re in case.expected:
        hit = next((x for x in unmatched if x[0] == rel and re.fullmatch(field_re, x[1])), None)
        assert hit is not None, f"no line for {rel}: {field_re}\n{output}"
        unmatched.remove(hit)


CLI_CASES = [c for c in CASES if c.cli]
LIB_CASES = [c for c in CASES if not c.cli]


@pytest.mark.parametrize("case", CLI_CASES, ids=[c.id for c in CLI_CASES])
def test_lint_cli_rejects_malformed_package(package_copy, case):
    pkg = build_case(package_copy, case)
    r = run_cli("package", "lint", str(pkg))

    assert r.returncode != 0
    assert "Traceback" not in r.stdout and "Traceback" not in r.stderr
    assert "ok:" not in r.stdout
    lines = parse_problem_lines(r.stderr, pkg)
    assert_expected_problems(lines, case, r.stderr)
    # the CLI prints exactly what lint() finds, one line each
    assert [(Path(p.file).as_posix(), p.field, p.message) for p in lint(pkg)] == [
        ((pkg / rel).as_posix(), field, msg) for rel, field, msg in lines
    ]


@pytest.mark.parametrize("case", LIB_CASES, ids=[c.id for c in LIB_CASES])
def test_lint_rejects_malformed_package(package_copy, case):
    """More variants of the same rules, checked in-process (the CLI prints lint()'s problems verbatim, see above)."""
    pkg = build_case(package_copy, case)
    problems = lint(pkg)
    text = "\n".join(str(p) for p in problems)
    lines = parse_problem_lines(text, pkg)
    assert len(lines) == len(problems)  # no problem spans two lines
    assert_expected_problems(lines, case, text)


LONG_LINE_CASES = [c for c in CASES if c.id in {"unknown-strategy-checker", "missing-manifest"}]


@pytest.mark.parametrize("case", LONG_LINE_CASES, ids=[c.id for c in LONG_LINE_CASES])
def test_lint_cli_one_line_per_problem_at_default_width(package_copy, case):
    pkg = build_case(package_copy, case)
    r = run_cli("package", "lint", str(pkg), columns=None)
    assert r.returncode != 0
    assert "Traceback" not in r.stderr
    expected = [str(p) for p in lint(pkg)]
    assert max(len(x) for x in expected) > 80  # the case really exercises long lines
    assert r.stderr.splitlines() == expected


def test_lint_cli_reports_every_problem_at_once(package_copy):
    pkg = package_copy("reference")
    replace_once(pkg / "manifest.yaml", "use: completion_requires_receipts", "use: nope")
    replace_once(pkg / CARD, "source: ", "author: x\nsource: ")
    write(pkg / "em/recipe/x.md", card_text("x"))
    r = run_cli("package", "lint", str(pkg))
    assert r.returncode != 0
    got = sorted((rel, field) for rel, field, _ in parse_problem_lines(r.stderr, pkg))
    assert got == sorted([("manifest.yaml", "checkers[0].use"), (CARD, "author"), ("em/recipe/x.md", "type")])


def test_lint_cli_not_a_directory(tmp_path):
    r = run_cli("package", "lint", str(tmp_path / "missing"))
    assert r.returncode != 0
    assert "Traceback" not in r.stdout + r.stderr
    assert r.stderr.strip() == f"{(tmp_path / 'missing').as_posix()}: -: not a package directory"


# -- gaps: mechanisms that load but are silently inert ------------------------------------------------------------


@pytest.mark.parametrize(
    "manifest_edit",
    [
        ("max_per_episode: 6", "types: [knowledge]"),
        (
            "use: event_cards\n    at: intent_recorded\n    cfg:\n      max_per_episode: 6",
            "use: all_cards\n    at: intent_recorded\n    cfg:\n      types: [knowledge]",
        ),
    ],
    ids=["event_cards-types", "all_cards-types"],
)
def test_lint_rejects_cards_excluded_by_types_filter(package_copy, manifest_edit):
    pkg = package_copy("reference")
    replace_once(pkg / "manifest.yaml", *manifest_edit)
    # all four reference cards are procedures: the only delivery binding only delivers knowledge cards
    problems = lint(pkg)
    assert sorted(Path(p.file).relative_to(pkg).as_posix() for p in problems) == REFERENCE_CARDS


@pytest.mark.parametrize("value", [0, -1])
def test_lint_rejects_max_per_episode_that_disables_delivery(package_copy, value):
    pkg = package_copy("reference")
    replace_once(pkg / "manifest.yaml", "max_per_episode: 6", f"max_per_episode: {value}")
    fields = [(Path(p.file).name, p.field) for p in lint(pkg)]
    assert ("manifest.yaml", "delivery[0].cfg.max_per_episode") in fields


def test_lint_rejects_duplicate_manifest_key(package_copy):
    pkg = package_copy("reference")
    with open(pkg / "manifest.yaml", "a", encoding="utf-8") as f:
        f.write("checkers: []\n")
    problems = lint(pkg)
    assert any(Path(p.file).name == "manifest.yaml" and "checkers" in f"{p.field} {p.message}" for p in problems)


# -- load_package, unit level ------------------------------------------------------------------------------------


UNIT_CASES = {c.id: c for c in CASES}


@pytest.mark.parametrize(
    "case_id",
    [
        "unknown-strategy-checker",
        "ill-typed-option-int",
        "unknown-option-checker",
        "unsupported-event-confirm-at-turn-start",
        "unknown-front-matter-key",
        "card-id-not-file-name",
        "missing-manifest",
    ],
)
def test_load_package_raises_package_error_naming_the_field(package_copy, case_id):
    case = UNIT_CASES[case_id]
    pkg = build_case(package_copy, case)
    with pytest.raises(PackageError) as info:
        load_package(pkg)
    err = info.value
    assert isinstance(err, InputError)  # what the CLI turns into an error line instead of a traceback
    got = [(Path(p.file).relative_to(pkg).as_posix(), p.field) for p in err.problems]
    first_rel, first_field = case.expected[0]
    assert any(rel == first_rel and re.fullmatch(first_field, field) for rel, field in got), got
    assert len(err.problems) == len(case.expected)
    assert str(err).splitlines() == [str(p) for p in err.problems]


def test_load_package_problem_messages(package_copy):
    pkg = package_copy("reference")
    replace_once(pkg / "manifest.yaml", "max_per_episode: 6", 'max_per_episode: "three"')
    replace_once(pkg / "manifest.yaml", "use: completion_requires_receipts", "use: completion_requires_receipt")
    _duplicate_id(pkg)
    replace_once(pkg / "em/procedure/exchange-available-variant.md", "source: ", "author: x\nsource: ")
    with pytest.raises(PackageError) as info:
        load_package(pkg)
    by_field = {(Path(p.file).relative_to(pkg).as_posix(), p.field): p.message for p in info.value.problems}
    assert "valid integer" in by_field[("manifest.yaml", "delivery[0].cfg.max_per_episode")]
    assert "completion_requires_receipt" in by_field[("manifest.yaml", "checkers[0].use")]
    assert "completion_requires_receipts" in by_field[("manifest.yaml", "checkers[0].use")]  # lists the known ones
    assert "em/knowledge/cancel-reason.md" in by_field[(CARD, "id")]  # names the other file
    assert by_field[("em/procedure/exchange-available-variant.md", "author")] == "unknown option"


def test_load_package_not_a_directory(tmp_path):
    f = tmp_path / "file.txt"
    f.write_text("x")
    with pytest.raises(PackageError) as info:
        load_package(f)
    assert [(p.file, p.field) for p in info.value.problems] == [(str(f), "-")]


# -- digest ------------------------------------------------------------------------------------------------------


def test_digest_identical_for_byte_identical_copy(tmp_path):
    src = PACKAGES / "reference"
    a = tmp_path / "one" / "reference"
    b = tmp_path / "two" / "elsewhere"
    shutil.copytree(src, a)
    shutil.copytree(src, b)
    os.utime(b / CARD, (0, 0))  # timestamps are not content
    assert digest(a) == digest(b) == digest(src)
    assert re.fullmatch(r"[0-9a-f]{64}", digest(a))


def test_digest_differs_between_packages():
    assert len({digest(PACKAGES / n) for n in SHIPPED}) == len(SHIPPED)


def test_digest_changes_when_one_byte_of_a_card_changes(package_copy):
    pkg = package_copy("reference")
    before = digest(pkg)
    data = bytearray((pkg / CARD).read_bytes())
    i = data.rindex(b"mistake")
    data[i] = ord("M")  # same length, one byte different
    (pkg / CARD).write_bytes(bytes(data))
    assert digest(pkg) != before


def test_digest_changes_when_a_file_is_renamed(package_copy):
    pkg = package_copy("reference")
    before = digest(pkg)
    (pkg / "em/procedure/refund-original-payment.md").rename(pkg / "em/procedure/refund-original-paymenu.md")
    assert digest(pkg) != before


def test_digest_frames_each_file(package_copy):
    # without the length in the (path, length, bytes) framing, one file whose bytes spell out the next file's
    # path and content would hash like the two files
    pkg = package_copy("none")
    (pkg / "README.md").write_bytes(b"")
    (pkg / "em").mkdir()
    (pkg / "em/README.md").write_bytes(b"zz")
    before = digest(pkg)
    (pkg / "em/README.md").unlink()
    (pkg / "README.md").write_bytes(b"em/README.md\0zz")
    assert digest(pkg) != before


@pytest.mark.parametrize("name", ["reference", "none"])
def test_cli_digest_matches_library(package_copy, name):
    pkg = package_copy(name)
    r = run_cli("package", "digest", str(pkg))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == digest(pkg) == digest(PACKAGES / name)


@pytest.mark.parametrize("what", ["missing", "empty", "foreign"])
def test_cli_digest_not_a_package_directory(tmp_path, what):
    path = tmp_path / what
    if what != "missing":  # an empty directory, or one without a manifest, printed a digest of no package
        path.mkdir()
        if what == "foreign":
            (path / "notes.txt").write_text("mine\n")
    r = run_cli("package", "digest", str(path))
    assert r.returncode == 2 and r.stdout == ""
    assert "Traceback" not in r.stderr and len(r.stderr.splitlines()) == 1
    assert "not a package directory" in r.stderr


@pytest.mark.parametrize("breaker", [_dangling_symlink, _symlink_dir], ids=["dangling", "directory"])
def test_cli_digest_symlink_is_an_error_line_not_a_traceback(package_copy, breaker):
    pkg = package_copy("reference")
    breaker(pkg)
    link = next(p for p in pkg.rglob("*") if p.is_symlink())
    r = run_cli("package", "digest", str(pkg))
    assert r.returncode == 2 and r.stdout == ""  # no digest of a tree whose bytes depend on where a link points
    assert r.stderr.splitlines() == [f"error: {link}: -: symlinks are not allowed in a package"]
