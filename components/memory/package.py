"""Loading a memory package: a directory of data, compiled once into runtime objects.

    <package>/manifest.yaml              name, wm (W), delivery (rho) and checkers (C) bindings
    <package>/em/<type>/<id>.md          E: one card per file, YAML front matter + Markdown body
    <package>/README.md                  optional, free text

Anything that would make a mechanism silently inert is a load error naming the file and the field: an unknown
strategy, event or option, an ill-typed option, malformed YAML or front matter, a duplicate card id, a card id that
differs from its file name, an unknown card type, a card no binding can deliver, a symlink or a non-UTF-8 file.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import frontmatter
import yaml
from pydantic import ValidationError

from components.io import strict_yaml, unique_keys_yaml, yaml_problem
from components.memory.cards import CARD_TYPES, Card, CardMeta
from components.memory.errors import PackageError, Problem
from components.memory.events import EVENTS
from components.memory.ledger import WMOptions
from components.memory.manifest import BindingSpec, Manifest
from components.memory.strategies import CHECKERS, DELIVERERS, Check, Deliver
from components.registry import Registry, Strategy

MANIFEST = "manifest.yaml"
FREE_FILES = {"README.md", ".gitkeep"}


R = TypeVar("R", bound=Callable[..., Any])


@dataclass(frozen=True)
class Bound(Generic[R]):
    """A strategy bound to an event, compiled: `run` is what its factory built (a `Deliver` or a `Check`)."""

    spec: BindingSpec
    strategy: Strategy
    run: R
    index: int

    @property
    def label(self) -> str:
        return f"{self.spec.use}@{self.spec.at}"


@dataclass(frozen=True)
class MemoryPackage:
    root: Path
    manifest: Manifest
    cards: dict[str, Card]
    delivery: tuple[Bound[Deliver], ...]
    checkers: tuple[Bound[Check], ...]
    digest: str

    @property
    def name(self) -> str:
        return self.manifest.name

    @property
    def wm(self) -> WMOptions:
        return self.manifest.wm


def digest(root: str | Path) -> str:
    """SHA-256 over the sorted (relative POSIX path, bytes) of every file: same bytes, same digest, anywhere."""
    root = Path(root)
    h = hashlib.sha256()
    for rel, path in _files(root):
        if path.is_symlink():  # hashed as a link, never followed (a package with one does not load anyway)
            h.update(f"{rel}\0link\0{os.readlink(path)}\0".encode())
            continue
        if _special(path):  # a FIFO, socket or device: never opened (a FIFO's read blocks); it does not load either
            h.update(f"{rel}\0special\0{_special(path)}\0".encode())
            continue
        data = path.read_bytes()
        h.update(f"{rel}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


def _files(root: Path) -> list[tuple[str, Path]]:
    """Every entry that is not a directory: files, symlinks, and FIFOs, sockets and devices (which load refuses)."""
    out = []
    for path in root.rglob("*"):
        if path.is_symlink() or not path.is_dir():
            out.append((path.relative_to(root).as_posix(), path))
    return sorted(out)


def _special(path: Path) -> str | None:
    """What a directory entry is when it is neither a regular file, a directory nor a symlink (else None)."""
    import stat

    mode = path.lstat().st_mode
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode):
        return None
    return {
        stat.S_IFIFO: "a FIFO",
        stat.S_IFSOCK: "a socket",
        stat.S_IFCHR: "a character device",
        stat.S_IFBLK: "a block device",
    }.get(stat.S_IFMT(mode), "not a regular file")


def lint(root: str | Path) -> list[Problem]:
    """Every problem in the package, one per line; empty when it loads."""
    try:
        load_package(root)
    except PackageError as e:
        return e.problems
    return []


def load_package(root: str | Path) -> MemoryPackage:
    root = Path(root)
    problems: list[Problem] = []
    if not root.is_dir():
        raise PackageError([Problem(str(root), "-", "not a package directory")])
    if not (root / MANIFEST).is_file():
        raise PackageError([Problem(str(root / MANIFEST), "-", "missing manifest.yaml")])

    texts: dict[str, str] = {}
    for rel, path in _files(root):
        if path.is_symlink():
            problems.append(Problem(rel, "-", "symlinks are not allowed in a package"))
            continue
        if (kind := _special(path)) is not None:  # a FIFO would hang whoever reads or copies the package
            problems.append(Problem(rel, "-", f"{kind}, not a regular file: a package holds files only"))
            continue
        try:
            texts[rel] = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError as e:
            problems.append(Problem(rel, "-", f"not UTF-8 (byte {e.start})"))
    for rel in texts:
        if rel != MANIFEST and rel not in FREE_FILES and not rel.startswith("em/") and Path(rel).name not in FREE_FILES:
            problems.append(Problem(rel, "-", "unexpected file (a package holds manifest.yaml and em/<type>/<id>.md)"))

    manifest = _manifest(texts.get(MANIFEST), problems)
    cards = _cards(texts, problems)
    delivery: tuple[Bound[Deliver], ...] = _bindings(manifest, "delivery", DELIVERERS, problems) if manifest else ()
    checkers: tuple[Bound[Check], ...] = _bindings(manifest, "checkers", CHECKERS, problems) if manifest else ()
    if manifest:
        _reachability(cards, delivery, problems)
    if problems:
        raise PackageError([Problem((root / p.file).as_posix(), p.field, p.message) for p in problems])
    assert manifest is not None  # a manifest that did not load is a problem (`_manifest`)
    return MemoryPackage(root, manifest, cards, delivery, checkers, digest(root))


def _manifest(text: str | None, problems: list[Problem]) -> Manifest | None:
    if text is None:
        return None
    try:
        raw = strict_yaml(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else "-"
        problems.append(Problem(MANIFEST, where, f"malformed YAML: {yaml_problem(e)}"))
        return None
    except RecursionError:  # not a directory thousands deep (what the CLI would otherwise say): the document
        problems.append(Problem(MANIFEST, "-", "malformed YAML: nested too deeply to read"))
        return None
    if not isinstance(raw, dict):
        problems.append(Problem(MANIFEST, "-", "must be a mapping"))
        return None
    try:
        return Manifest.model_validate(raw)
    except ValidationError as e:
        problems.extend(_pydantic(MANIFEST, e))
        return None


def _cards(texts: dict[str, str], problems: list[Problem]) -> dict[str, Card]:
    cards: dict[str, Card] = {}
    for rel, text in sorted(texts.items()):
        if not rel.startswith("em/") or Path(rel).name in FREE_FILES:
            continue
        parts = rel.split("/")
        if len(parts) != 3 or not rel.endswith(".md"):
            problems.append(Problem(rel, "-", "cards live at em/<type>/<id>.md"))
            continue
        if parts[1] not in CARD_TYPES:
            problems.append(
                Problem(rel, "type", f"unknown card type directory {parts[1]!r} (one of {', '.join(CARD_TYPES)})")
            )
            continue
        if not _FRONT_MATTER.detect(text):
            bom = (
                " (the file starts with a byte-order mark: save it as UTF-8 without one)"
                if text.startswith("\ufeff")
                else ""
            )
            problems.append(
                Problem(rel, "front matter", f"missing: a card starts with a '---' line, YAML, and '---'{bom}")
            )
            continue
        try:
            post = frontmatter.loads(text, handler=_FRONT_MATTER)
        except yaml.YAMLError as e:
            problems.append(Problem(rel, "front matter", f"malformed YAML: {yaml_problem(e)}"))
            continue
        except RecursionError:
            problems.append(Problem(rel, "front matter", "malformed YAML: nested too deeply to read"))
            continue
        try:
            meta = CardMeta.model_validate(dict(post.metadata))
        except ValidationError as e:
            problems.extend(_pydantic(rel, e))
            continue
        stem = Path(rel).stem
        if meta.id != stem:
            problems.append(Problem(rel, "id", f"card id {meta.id!r} does not match its file name {stem!r}"))
        elif meta.type != parts[1]:
            problems.append(Problem(rel, "type", f"card type {meta.type!r} does not match its directory {parts[1]!r}"))
        elif meta.id in cards:
            problems.append(Problem(rel, "id", f"duplicate card id {meta.id!r} (also {cards[meta.id].path})"))
        elif meta.trigger is not None and meta.trigger.event not in EVENTS:
            problems.append(
                Problem(rel, "trigger.event", f"unknown event {meta.trigger.event!r} (one of {', '.join(EVENTS)})")
            )
        elif not post.content.strip():
            problems.append(Problem(rel, "body", "empty card body"))
        else:
            cards[meta.id] = Card(meta=meta, body=post.content, path=rel)
    return cards


class _UniqueKeysFrontMatter(frontmatter.YAMLHandler):
    """python-frontmatter's YAML handler, refusing a key given twice (SafeLoader keeps the last one silently)."""

    def load(self, fm: str, **kwargs: object) -> Any:
        meta = unique_keys_yaml(fm)
        if meta is not None and not isinstance(meta, dict):  # python-frontmatter would drop it without a word
            raise yaml.YAMLError(f"must be a mapping of fields (id, type, ...), not a {type(meta).__name__}")
        return meta

    def split(self, text: str) -> tuple[str, str]:
        try:
            return super().split(text)
        except ValueError:  # python-frontmatter would read the whole file as a body without front matter
            raise yaml.YAMLError("no closing '---' line") from None


_FRONT_MATTER = _UniqueKeysFrontMatter()


def _bindings(manifest: Manifest, section: str, registry: Registry, problems: list[Problem]) -> tuple[Bound[Any], ...]:
    out: list[Bound[Any]] = []
    for i, spec in enumerate(getattr(manifest, section)):
        where = f"{section}[{i}]"
        strategy = registry.get(spec.use)
        if strategy is None:
            problems.append(
                Problem(
                    MANIFEST,
                    f"{where}.use",
                    f"unknown {registry.kind} {spec.use!r} (one of {', '.join(registry.names())})",
                )
            )
            continue
        if spec.at not in EVENTS:
            problems.append(Problem(MANIFEST, f"{where}.at", f"unknown event {spec.at!r} (one of {', '.join(EVENTS)})"))
            continue
        if spec.at not in strategy.events:
            problems.append(
                Problem(
                    MANIFEST,
                    f"{where}.at",
                    f"{spec.use!r} cannot run at {spec.at!r} (only {', '.join(sorted(strategy.events))})",
                )
            )
            continue
        try:
            run = strategy.build(spec.cfg)
        except ValidationError as e:
            problems.extend(_pydantic(MANIFEST, e, prefix=f"{where}.cfg"))
            continue
        out.append(Bound(spec, strategy, run, i))
    return tuple(out)


def _reachability(cards: dict[str, Card], delivery: tuple[Bound[Deliver], ...], problems: list[Problem]) -> None:
    """A card no binding can ever deliver is dead weight that looks like a mechanism: refuse it."""

    def takes(b: Bound[Deliver], card: Card) -> bool:
        types = b.spec.cfg.get("types")
        return b.strategy.delivers_cards and (types is None or card.meta.type in types)

    for card in cards.values():
        if any(b.strategy.ignores_triggers and takes(b, card) for b in delivery):
            continue
        t = card.meta.trigger
        if t is None:
            problems.append(Problem(card.path, "trigger", "card has no trigger and no all_cards binding delivers it"))
        elif not any(b.spec.at == t.event and not b.strategy.ignores_triggers and takes(b, card) for b in delivery):
            problems.append(
                Problem(
                    card.path, "trigger.event", f"no delivery binding delivers {card.meta.type} cards at {t.event!r}"
                )
            )


def _pydantic(file: str, err: ValidationError, prefix: str = "") -> list[Problem]:
    out = []
    for e in err.errors():
        loc = ".".join(f"[{p}]" if isinstance(p, int) else str(p) for p in e["loc"]).replace(".[", "[")
        field = ".".join(x for x in (prefix, loc) if x) or "-"
        msg = "unknown option" if e["type"] == "extra_forbidden" else e["msg"]
        out.append(Problem(file, field, msg))
    return out
