"""What a package author sees when a package does not load: every problem at once, one line each, naming the file,
the field, the offending value and what would have been allowed. In-process calls to the loader on small packages
built here (found by mutation testing of components/memory/package.py; the CLI tests show the same lines through a
subprocess, which mutmut cannot attribute)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import frontmatter
import pytest
import yaml

from components.memory.errors import PackageError
from components.memory.package import digest, lint, load_package

TYPES = "knowledge, procedure, action_result"
EVENTS = "turn_start, intent_recorded, draft_ready, pre_write, agent_declares_done"
LAYOUT = "cards live at em/<type>/<id>.md"
EVENT_CARDS = "delivery:\n  - use: event_cards\n    at: intent_recorded\n"


def card(
    cid: str,
    ctype: str = "procedure",
    event: str | None = "intent_recorded",
    body: str = "Do it right.\n",
    extra: str = "",
) -> str:
    trigger = f"trigger:\n  event: {event}\n" if event else ""
    return f"---\nid: {cid}\ntype: {ctype}\n{trigger}source: a failure\n{extra}---\n{body}"


def make(tmp_path: Path, files: dict[str, str | bytes], manifest: str | None = "name: t\n" + EVENT_CARDS) -> Path:
    root = tmp_path / "pkg"
    root.mkdir()
    if manifest is not None:
        files = {"manifest.yaml": manifest, **files}
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
    return root


def problems(root: Path) -> list[tuple[str, str, str]]:
    """(file relative to the package, field, message) of every problem; each must be one line naming its file."""
    with pytest.raises(PackageError) as info:
        load_package(root)
    err = info.value
    assert str(err).splitlines() == [str(p) for p in err.problems]  # one line per problem, in order
    out = []
    for p in err.problems:
        assert "\n" not in p.message
        assert Path(p.file).is_relative_to(root), p.file  # the full path of the file, under the package given
        out.append((Path(p.file).relative_to(root).as_posix(), p.field, p.message))
    assert lint(root) == err.problems
    return out


# -- the package as a whole -------------------------------------------------------------------------------------------


def test_not_a_directory_and_missing_manifest_name_the_path(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(PackageError) as info:
        load_package(missing)
    assert [(p.file, p.field, p.message) for p in info.value.problems] == [
        (str(missing), "-", "not a package directory")
    ]

    root = make(tmp_path, {"em/procedure/a.md": card("a")}, manifest=None)
    (root / "manifest.yaml").mkdir()  # a directory of that name is not a manifest
    with pytest.raises(PackageError) as info:
        load_package(root)
    assert [(p.file, p.field, p.message) for p in info.value.problems] == [
        (str(root / "manifest.yaml"), "-", "missing manifest.yaml")
    ]


def test_symlinks_stray_files_and_bad_bytes_are_all_reported(tmp_path):
    root = make(
        tmp_path,
        {
            "README.md": "free text\n",
            ".gitkeep": "",
            "docs/README.md": "free text anywhere\n",  # a README or .gitkeep is fine at any depth
            "em/procedure/a.md": card("a"),
            "em/procedure/b.md": card("b").encode() + b"caf\xe9\n",
            "notes.txt": "stray\n",
            "emx/c.md": card("c"),
        },
    )
    os.symlink(root / "notes.txt", root / "em" / "link.md")
    os.symlink(root / "README.md", root / "a-link")
    os.symlink(root / "docs", root / "em" / "dir-link")  # a link to a directory too, and not followed
    bad_byte = len(card("b").encode()) + 3
    unexpected = "unexpected file (a package holds manifest.yaml and em/<type>/<id>.md)"
    assert problems(root) == [
        ("a-link", "-", "symlinks are not allowed in a package"),
        ("em/dir-link", "-", "symlinks are not allowed in a package"),
        ("em/link.md", "-", "symlinks are not allowed in a package"),
        ("em/procedure/b.md", "-", f"not UTF-8 (byte {bad_byte})"),
        ("emx/c.md", "-", unexpected),
        ("notes.txt", "-", unexpected),
    ]


def test_a_package_that_loads_is_compiled_with_its_bindings_in_manifest_order(tmp_path):
    manifest = (
        "name: t\nwm:\n  board: false\ndelivery:\n  - use: state_reminder\n    at: turn_start\n"
        "  - use: event_cards\n    at: intent_recorded\n    cfg:\n      max_per_episode: 2\n"
        "checkers:\n  - use: completion_requires_receipts\n    at: agent_declares_done\n"
    )
    root = make(
        tmp_path,
        {
            "em/procedure/b.md": card("b"),
            "em/knowledge/a.md": card("a", "knowledge"),
            "em/README.md": "about the cards\n",
            "em/procedure/.gitkeep": "",
        },
        manifest,
    )
    pkg = load_package(root)
    assert pkg.name == "t" and pkg.wm.board is False and pkg.root == root
    assert sorted(pkg.cards) == ["a", "b"]
    assert pkg.cards["a"].path == "em/knowledge/a.md" and pkg.cards["a"].body == "Do it right."
    assert [(b.label, b.index) for b in pkg.delivery] == [
        ("state_reminder@turn_start", 0),
        ("event_cards@intent_recorded", 1),
    ]
    assert [(b.label, b.index) for b in pkg.checkers] == [("completion_requires_receipts@agent_declares_done", 0)]
    assert pkg.digest == digest(root)
    assert lint(root) == []


# -- manifest ----------------------------------------------------------------------------------------------------------


def test_malformed_manifest_yaml_names_the_line_and_the_parser_problem(tmp_path):
    text = "name: t\ndescription: fine\ndelivery: [a\ncheckers: []\n"
    with pytest.raises(yaml.YAMLError) as parsed:
        yaml.safe_load(text)
    root = make(tmp_path, {}, manifest=text)
    [(file, field, message)] = problems(root)
    assert (file, message) == ("manifest.yaml", f"malformed YAML: {parsed.value.problem}")
    assert field == f"line {parsed.value.problem_mark.line + 1}"
    assert field in ("line 4", "line 5")  # the parser notices the unclosed list of line 3 at the next key


def test_a_manifest_that_is_not_a_mapping_and_its_cards_are_both_reported(tmp_path):
    # a bad manifest does not hide the cards' problems, and no binding is guessed for a card to be unreachable by
    root = make(
        tmp_path, {"em/procedure/a.md": card("a", event=None), "em/procedure/b.md": card("c")}, manifest="- name: t\n"
    )
    assert problems(root) == [
        ("manifest.yaml", "-", "must be a mapping"),
        ("em/procedure/b.md", "id", "card id 'c' does not match its file name 'b'"),
    ]


def test_manifest_schema_errors_name_the_field(tmp_path):
    root = make(tmp_path, {}, manifest="name: ''\ncolour: red\ndelivery:\n  - at: turn_start\n")
    assert problems(root) == [
        ("manifest.yaml", "name", "String should have at least 1 character"),
        ("manifest.yaml", "delivery[0].use", "Field required"),
        ("manifest.yaml", "colour", "unknown option"),
    ]


def test_unknown_checker_and_bad_options_name_the_binding(tmp_path):
    manifest = (
        "name: t\n" + EVENT_CARDS + "checkers:\n  - use: done_check\n    at: agent_declares_done\n"
        "  - use: completion_requires_receipts\n    at: agent_declares_done\n"
        "    cfg:\n      allow_blokced: true\n"
        "  - use: confirm_before_write\n    at: agent_declares_done\n"
    )
    root = make(tmp_path, {"em/procedure/a.md": card("a")}, manifest)
    assert problems(root) == [
        (
            "manifest.yaml",
            "checkers[0].use",
            "unknown checker 'done_check' (one of completion_requires_receipts, confirm_before_write)",
        ),
        ("manifest.yaml", "checkers[1].cfg.allow_blokced", "unknown option"),
        (
            "manifest.yaml",
            "checkers[2].at",
            "'confirm_before_write' cannot run at 'agent_declares_done' (only pre_write)",
        ),
    ]


# -- cards -------------------------------------------------------------------------------------------------------------


def test_misplaced_card_files_are_each_reported(tmp_path):
    root = make(
        tmp_path,
        {
            "em/a.md": card("a"),
            "em/procedure/deep/b.md": card("b"),
            "em/procedure/c.txt": card("c"),
            "em/skills/d.md": card("d"),
            "em/skills/e.md": card("e"),
            "em/procedure/ok.md": card("ok"),
        },
    )
    unknown = f"(one of {TYPES})"
    assert problems(root) == [
        ("em/a.md", "-", LAYOUT),
        ("em/procedure/c.txt", "-", LAYOUT),
        ("em/procedure/deep/b.md", "-", LAYOUT),
        ("em/skills/d.md", "type", f"unknown card type directory 'skills' {unknown}"),
        ("em/skills/e.md", "type", f"unknown card type directory 'skills' {unknown}"),
    ]


def test_malformed_front_matter_is_one_line_with_the_parser_problem(tmp_path):
    text = "---\nid: [a\ntype: procedure\n---\nbody\n"
    with pytest.raises(yaml.YAMLError) as parsed:
        frontmatter.loads(text)  # the parser's own words for the problem
    root = make(
        tmp_path,
        {
            "em/procedure/a.md": text,
            "em/procedure/b.md": "---\nid: [b\n---\nx\n",
            "em/procedure/c.md": card("c", extra="colour: red\n"),
            "em/procedure/d.md": card("e"),
        },
    )
    got = problems(root)
    assert got[0] == ("em/procedure/a.md", "front matter", f"malformed YAML: {parsed.value.problem}")
    assert [g[:2] for g in got[1:3]] == [("em/procedure/b.md", "front matter"), ("em/procedure/c.md", "colour")]
    assert got[2:] == [
        ("em/procedure/c.md", "colour", "unknown option"),
        ("em/procedure/d.md", "id", "card id 'e' does not match its file name 'd'"),
    ]


def test_each_inconsistent_card_names_its_field_and_both_values(tmp_path):
    root = make(
        tmp_path,
        {
            "em/procedure/a.md": card("b"),
            "em/procedure/c.md": card("c", "knowledge"),
            "em/knowledge/d.md": card("d", "knowledge"),
            "em/procedure/d.md": card("d"),
            "em/procedure/e.md": card("e", event="on_refund"),
            "em/procedure/f.md": card("f", body="  \n\n"),
            "em/procedure/g.md": card("g", extra="trigger:\n  tool: x\n").replace(
                "trigger:\n  event: intent_recorded\n", ""
            ),
            "em/procedure/ok.md": card("ok"),
        },
    )
    assert problems(root) == [
        ("em/procedure/a.md", "id", "card id 'b' does not match its file name 'a'"),
        ("em/procedure/c.md", "type", "card type 'knowledge' does not match its directory 'procedure'"),
        ("em/procedure/d.md", "id", "duplicate card id 'd' (also em/knowledge/d.md)"),
        ("em/procedure/e.md", "trigger.event", f"unknown event 'on_refund' (one of {EVENTS})"),
        ("em/procedure/f.md", "body", "empty card body"),
        ("em/procedure/g.md", "trigger.event", "Field required"),
    ]


# -- reachability ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("delivery", "unreachable"),
    [
        # event_cards delivers by trigger, within its types; a trigger-less card needs all_cards
        ("  - use: event_cards\n    at: intent_recorded\n", {"k": "trigger", "n": "trigger", "t": "trigger.event"}),
        (
            "  - use: event_cards\n    at: turn_start\n    cfg: {types: [knowledge]}\n",
            {"k": "trigger", "n": "trigger", "i": "trigger.event", "t": "trigger.event"},
        ),
        (
            "  - use: event_cards\n    at: turn_start\n    cfg: {types: [procedure]}\n",
            {"k": "trigger", "n": "trigger", "i": "trigger.event"},
        ),
        # all_cards delivers every card of its types whatever the trigger; other cards still need a trigger's binding
        ("  - use: all_cards\n    at: pre_write\n", {}),
        (
            "  - use: all_cards\n    at: pre_write\n    cfg: {types: [knowledge]}\n",
            {"n": "trigger", "i": "trigger.event", "t": "trigger.event"},
        ),
        (
            "  - use: all_cards\n    at: turn_start\n    cfg: {types: [knowledge]}\n"
            "  - use: event_cards\n    at: turn_start\n",
            {"n": "trigger", "i": "trigger.event"},
        ),
        # state_reminder delivers no cards at all
        (
            "  - use: state_reminder\n    at: turn_start\n",
            {"k": "trigger", "n": "trigger", "i": "trigger.event", "t": "trigger.event"},
        ),
    ],
)
def test_a_card_no_binding_can_deliver_is_refused(tmp_path, delivery, unreachable):
    cards = {
        "k": ("knowledge", None),
        "i": ("procedure", "intent_recorded"),
        "n": ("procedure", None),
        "t": ("procedure", "turn_start"),
    }
    files = {f"em/{ctype}/{cid}.md": card(cid, ctype, event=event) for cid, (ctype, event) in cards.items()}
    root = make(tmp_path, files, manifest=f"name: t\ndelivery:\n{delivery}")
    expected = []
    for cid in ("k", "i", "n", "t"):  # in file order: em/knowledge/ sorts before em/procedure/
        ctype, event = cards[cid]
        if unreachable.get(cid) == "trigger":
            expected.append(
                (f"em/{ctype}/{cid}.md", "trigger", "card has no trigger and no all_cards binding delivers it")
            )
        elif unreachable.get(cid) == "trigger.event":
            expected.append(
                (f"em/{ctype}/{cid}.md", "trigger.event", f"no delivery binding delivers {ctype} cards at {event!r}")
            )
    if expected:
        assert problems(root) == expected
    else:
        assert sorted(load_package(root).cards) == ["i", "k", "n", "t"]


# -- digest ------------------------------------------------------------------------------------------------------------


def test_digest_hashes_a_symlink_as_a_link_and_keeps_going(tmp_path):
    root = make(tmp_path, {"em/procedure/a.md": card("a"), "z.md": "after the link\n"})
    os.symlink("em/procedure/a.md", root / "link")
    first = digest(root)
    (root / "z.md").write_text("after the link, changed\n")  # a file sorted after the link still counts
    second = digest(root)
    assert second != first
    os.remove(root / "link")
    os.symlink("manifest.yaml", root / "link")  # where the link points counts
    third = digest(root)
    assert third not in (first, second)
    os.remove(root / "link")
    (root / "link").write_text("manifest.yaml")  # a file holding the target's name is not the link
    assert digest(root) not in (first, second, third)


def test_digest_does_not_follow_a_symlink(tmp_path):
    root = make(tmp_path, {"em/procedure/a.md": card("a")})
    outside = tmp_path / "outside.txt"
    outside.write_text("one\n")
    os.symlink(outside, root / "link")
    before = digest(root)
    outside.write_text("two\n")  # the bytes behind the link are not the package's
    assert digest(root) == before
    assert before != hashlib.sha256().hexdigest()


# -- a bug found on the way: a control character made a two-line problem ---------------------------------------------


def test_a_control_character_is_one_problem_line_naming_the_character(tmp_path):
    root = make(
        tmp_path,
        {"em/procedure/a.md": card("a").replace("id: a\n", "id: a\x07\n")},
        manifest="name: t\x07\n" + EVENT_CARDS,
    )
    got = problems(root)  # asserts one line per problem
    assert [g[:2] for g in got] == [("manifest.yaml", "-"), ("em/procedure/a.md", "front matter")]
    for _, _, message in got:
        assert message.startswith("malformed YAML: unacceptable character #x0007"), message


def test_a_duplicate_manifest_key_names_its_line_and_the_key(tmp_path):
    root = make(tmp_path, {}, manifest="name: t\ndescription: d\nname: u\n")
    assert problems(root) == [("manifest.yaml", "line 3", "malformed YAML: duplicate key 'name'")]


# -- YAML a reader cannot take (the CLI's lines in tests/test_misuse.py, here in-process) ---------------------------


def test_a_manifest_nested_too_deeply_is_named_not_taken_for_deep_directories(tmp_path):
    deep = "[" * 700 + "]" * 700
    root = make(tmp_path, {}, manifest=f"name: x\ndescription: {deep}\n")
    assert problems(root) == [("manifest.yaml", "-", "malformed YAML: nested too deeply to read")]


@pytest.mark.parametrize(
    "text,message",
    [
        ("---\n- a\n- b\n---\nbody\n", "malformed YAML: must be a mapping of fields (id, type, ...), not a list"),
        ("---\nid: x\ntype: procedure\nbody\n", "malformed YAML: no closing '---' line"),
    ],
)
def test_front_matter_that_is_no_mapping_or_never_closes_is_one_line(tmp_path, text, message):
    root = make(tmp_path, {"em/procedure/x.md": text})
    assert problems(root) == [("em/procedure/x.md", "front matter", message)]


def test_empty_front_matter_is_read_as_no_fields(tmp_path):
    """`---` twice with nothing between: no fields, so each required one is missing (not a mapping problem)."""
    root = make(tmp_path, {"em/procedure/x.md": "---\n---\nbody\n"})
    got = problems(root)
    assert got and all(f == "em/procedure/x.md" and "must be a mapping" not in m for f, _, m in got)


@pytest.mark.parametrize(
    "text,bom", [("just a body\n", False), ("\ufeff---\nid: x\ntype: procedure\n---\nbody\n", True)]
)
def test_a_card_without_front_matter_says_how_one_starts(tmp_path, text, bom):
    root = make(tmp_path, {"em/procedure/x.md": text})
    said = "missing: a card starts with a '---' line, YAML, and '---'"
    said += " (the file starts with a byte-order mark: save it as UTF-8 without one)" if bom else ""
    assert problems(root) == [("em/procedure/x.md", "front matter", said)]


def test_every_card_without_front_matter_is_named_not_only_the_first(tmp_path):
    root = make(tmp_path, {"em/procedure/a.md": "just a body\n", "em/procedure/b.md": "another body\n"})
    assert [(f, field) for f, field, _ in problems(root)] == [
        ("em/procedure/a.md", "front matter"),
        ("em/procedure/b.md", "front matter"),
    ]


def test_a_card_nested_too_deeply_is_one_line_where_yaml_has_no_c_loader(tmp_path, monkeypatch):
    """libyaml stops deep nesting itself (a malformed-YAML line); PyYAML's pure-Python loader, which it falls back to
    where libyaml is not installed, recurses until Python stops it. That too is one line naming the card, and the
    cards after it are still read."""
    import components.memory.package as package

    monkeypatch.setattr(package, "unique_keys_yaml", lambda text: yaml.load(text, Loader=yaml.SafeLoader))
    deep = "[" * 5000 + "]" * 5000
    root = make(
        tmp_path, {"em/procedure/a.md": card("a", extra=f"note: {deep}\n"), "em/procedure/b.md": card("b", body="\n")}
    )
    assert problems(root) == [
        ("em/procedure/a.md", "front matter", "malformed YAML: nested too deeply to read"),
        ("em/procedure/b.md", "body", "empty card body"),
    ]


def test_a_package_error_crosses_processes_as_its_lines():
    """A package error raised in a worker (Dask's, a process pool's) is pickled to the caller: it must arrive with its
    problems, one line each, not rebuilt from its message (which made one line of every character)."""
    import pickle

    from components.memory.errors import PackageError, Problem

    e = PackageError([Problem("data/packages/x", "-", "not a package directory"), Problem("m.yaml", "wm", "bad")])
    back = pickle.loads(pickle.dumps(e))
    assert back.problems == e.problems and str(back).splitlines() == [
        "data/packages/x: -: not a package directory",
        "m.yaml: wm: bad",
    ]
