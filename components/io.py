"""Atomic writes: a reader sees the old bytes or the new ones, never half of either. And owned outputs: a command
writes only into a directory that is new, empty, or Ratchet's own output of the same kind."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from components.errors import InputError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _owner() -> str:
    """Who makes a temporary name: `<pid>@<host>`, so that what a killed writer left is known for its own."""
    import socket

    return f"{os.getpid()}@{socket.gethostname()}"


def _gone(owner: str) -> bool:
    """Whether the writer `<pid>@<host>` of a temporary name is dead (on another host: unknown, so no)."""
    import socket

    pid, _, host = owner.partition("@")
    if not pid.isdigit() or host != socket.gethostname():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False


def sweep_leftovers(path: Path) -> None:
    """Remove the temporary siblings of `path` (`.<name>.tmp-<pid>@<host>-*`, `.<name>.old-...`, `.<name>.w<pid>@...`)
    that a writer killed before its cleanup left (SIGKILL, or a signal's `os._exit`): the next write of `path`
    removes them, never another live writer's."""
    prefixes = tuple(f".{path.name}.{kind}" for kind in ("tmp-", "old-", "w"))
    try:
        entries = list(os.scandir(path.parent))
    except OSError:
        return
    for e in entries:
        for pre in prefixes:
            if e.name.startswith(pre) and _gone(e.name[len(pre) :].rsplit("-", 1)[0]):
                if e.is_dir(follow_symlinks=False):
                    shutil.rmtree(e.path, ignore_errors=True)
                else:
                    with contextlib.suppress(OSError):
                        os.unlink(e.path)
                break


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        sweep_leftovers(path)  # a temporary file a killed write of this path left
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.w{_owner()}-", dir=path.parent)
    except OSError as e:
        raise _named(e, path) from None
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp's 0600 is for the temp file, not the result
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(e, OSError):
            raise _named(e, path) from None
        raise


def _named(e: OSError, path: Path) -> OSError:
    """A write the system refused, naming the file being written: a full disk's write(2) names no file, and the
    temp file's name would send the user looking for a file that is gone. The same kind of OSError (callers tell
    a missing directory from a refusal by it)."""
    if e.errno is None or (e.filename is not None and not Path(e.filename).name.startswith(f".{path.name}.")):
        return e
    return type(e)(e.errno, e.strerror or str(e), str(path))


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def dumps(obj: Any) -> str:
    """Canonical JSON: sorted keys, no spaces to vary, a trailing newline."""
    return json.dumps(obj, sort_keys=True, indent=1, ensure_ascii=False) + "\n"


def atomic_write_json(path: str | Path, obj: Any) -> None:
    atomic_write_text(path, dumps(obj))


def read_json_object(path: str | Path) -> dict:
    """A JSON object from a file a user may have damaged or swapped: any problem is one line naming the file."""
    path = Path(path)
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: -: not UTF-8 text (byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise InputError(f"{path}: line {e.lineno}: not valid JSON ({e.msg})") from None
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        raise InputError(f"{path}: -: no such file") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: -: must be a JSON object, not {type(data).__name__}")
    return data


@contextlib.contextmanager
def atomic_dir(path: str | Path, *, replace: bool = True, mark: str | None = None) -> Iterator[Path]:
    """Build a directory in a temp sibling and move it into place when the block succeeds.

    With replace=False an existing target is refused (FileExistsError) both before and at the final rename.
    With `mark`, the directory is marked as Ratchet's output of that kind (see `claim_output`) before it moves in."""
    path = Path(path)
    if path.exists() and not replace:
        raise FileExistsError(f"{path} already exists")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        sweep_leftovers(path)  # what a killed build of this output left
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-{_owner()}-", dir=path.parent))
    except OSError as e:  # a read-only or vanished place: named as the output, not as the temp name it refused
        raise type(e)(e.errno, e.strerror or str(e), str(path)) from None
    try:
        os.chmod(tmp, 0o777 & ~_umask())
        yield tmp
        if mark:
            (tmp / MARK).write_text(mark + "\n")
        if not path.exists():
            os.rename(tmp, path)  # rename(2) refuses a non-empty target, so a racing writer cannot be clobbered
            return
        if not replace:
            raise FileExistsError(f"{path} already exists")
        old = Path(tempfile.mkdtemp(prefix=f".{path.name}.old-{_owner()}-", dir=path.parent))
        os.rename(path, old / "x")
        os.rename(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OSError) and e.errno is not None and (e.filename is None or str(tmp) in str(e.filename)):
            # a full disk names no file (or one in the temp directory, now gone): name the output being written
            raise type(e)(e.errno, e.strerror or str(e), str(path)) from None
        raise


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys instead of silently keeping the last one, and aliases
    (`*name`): a few hundred bytes of nested aliases expand to billions of nodes when the data is serialized."""

    def compose_node(self, parent, index):  # type: ignore[override]
        if self.check_event(yaml.events.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None, None, f"alias *{event.anchor} is not allowed (write the value out)", event.start_mark
            )
        return super().compose_node(parent, index)


def _no_duplicates(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: set = set()
    for key_node, _value in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if isinstance(key, (dict, list)):
            raise yaml.constructor.ConstructorError(
                None, None, "a mapping key must be a plain value", key_node.start_mark
            )
        if key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _no_duplicates)


if TYPE_CHECKING:
    _SafeLoader = yaml.SafeLoader
else:  # libyaml's when PyYAML was built with it
    _SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _UniqueKeysLoader(_SafeLoader):  # python-frontmatter's loader, and words
    """SafeLoader that refuses duplicate mapping keys only: for a card's front matter, which pydantic checks field by
    field (nothing of it is serialized whole), and which Ratchet's own writer may emit with an alias."""


_UniqueKeysLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _no_duplicates)


def unique_keys_yaml(text: str) -> Any:
    return yaml.load(text, Loader=_UniqueKeysLoader)  # noqa: S506 - a SafeLoader subclass


def yaml_problem(e: yaml.YAMLError) -> str:
    """A YAML error as one line: a ReaderError (a control character) has no `problem`, and its str() adds a second
    line (the position)."""
    return str(getattr(e, "problem", None) or e).splitlines()[0]


def strict_yaml(text: str) -> Any:
    return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass


# -- owned outputs ------------------------------------------------------------------------------------------------------

MARK = ".ratchet-output"  # one line: the kind of output (eval, campaign, ...) of the directory it sits in

# What each kind of output holds, to recognise one written before marks existed (or one that carries no mark because
# every byte of it is digested: a benchmark): (every name it may hold, the names it must hold).
KINDS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "eval": (frozenset({"scores.csv", "traces.parquet", "_hidden", "meta.json"}), frozenset({"scores.csv"})),
    "benchmark": (
        frozenset(
            {
                "meta.json",
                "policy.md",
                "tools.json",
                "db.json",
                "tasks.jsonl",
                "splits.json",
                "tasks.csv",
                "gold_train.jsonl",
            }
        ),
        frozenset({"meta.json", "tasks.jsonl", "splits.json"}),
    ),
    "campaign": (frozenset({"lineage", "rounds", "summary.json", "test_evals.json", ".state"}), frozenset({"lineage"})),
    "report": (
        frozenset(
            {
                "metrics.json",
                "rounds.csv",
                "campaign.md",
                "rounds.png",
                "champion.png",
                "causes.png",
                "families.png",
                "plots",
            }
        ),
        frozenset(),
    ),
    "outer": (frozenset({"export", "model.json", "models", "prune", "inner"}), frozenset({"export"})),
}


class OutputRefused(InputError):
    """A command was pointed at a place it does not own."""


def output_kind(path: str | Path) -> str | None:
    """The kind of Ratchet output a directory holds: its mark, else what its entries say, else None."""
    path = Path(path)
    if not path.is_dir() or path.is_symlink():
        return None
    mark = path / MARK
    if mark.is_file():
        return mark.read_text(encoding="utf-8", errors="replace").strip() or None
    names = {e.name for e in path.iterdir()}
    for kind, (may, must) in KINDS.items():
        if names and names <= may | {MARK} and must <= names:
            return kind
    return None


def claim_output(
    path: str | Path,
    kind: str,
    *,
    option: str = "--out",
    inputs: dict[str, str | Path] | None = None,
    force: bool | None = None,
) -> Path:
    """Check that a command may write its `kind` output at `path`, or refuse with one line (OutputRefused).

    Allowed: nothing there yet; an empty directory; Ratchet's own output of this kind (a rerun replaces it);
    with `force` (offered where replacing Ratchet's own output is meant), Ratchet's output of another kind.
    Refused: a file or a symlink; an input of the command (`inputs`: label -> path), a directory holding one, or a
    place inside one; any other non-empty directory (it is not Ratchet's to replace)."""
    path = Path(path)
    above = next((a for a in path.absolute().parents if a.exists() or a.is_symlink()), None)
    if above is not None and not above.is_dir():  # mkdir would fail half-way with a FileExistsError
        raise OutputRefused(f"{path}: {option}: {above} is not a directory (a file is in the way)")
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        raise OutputRefused(
            f"{path}: {option}: is a {'symbolic link' if path.is_symlink() else 'file'}, "
            f"not an output directory; refusing to replace it"
        )
    _not_an_input(path, option, inputs or {})
    if not path.is_dir() or not any(path.iterdir()):
        return path
    return _replaceable(path, kind, option, force)


def _not_an_input(path: Path, option: str, inputs: dict[str, str | Path]) -> None:
    """Refuse an output that is an input of the command, holds one, or lies inside one."""
    here = path.resolve()
    for label, src in inputs.items():
        there = Path(src).resolve()
        if here == there:
            raise OutputRefused(f"{path}: {option}: is the input {label}; refusing to write over it")
        if there.is_relative_to(here):
            raise OutputRefused(f"{path}: {option}: holds the input {label} ({src}); refusing to replace it")
        if here.is_relative_to(there):
            raise OutputRefused(f"{path}: {option}: is inside the input {label} ({src}); refusing to write into it")


def _replaceable(path: Path, kind: str, option: str, force: bool | None) -> Path:
    """A non-empty directory may be replaced when it is Ratchet's output of this kind (of another kind: with
    `force`); anything else is refused."""
    found = output_kind(path)
    if found == kind:
        return path
    if found is not None:
        if force:
            return path
        hint = "; pass --force to replace it" if force is not None else ""
        raise OutputRefused(f"{path}: {option}: holds Ratchet's {found} output, not {kind} output{hint}")
    raise OutputRefused(
        f"{path}: {option}: is a non-empty directory that Ratchet did not write (no {MARK}); "
        f"refusing to replace it: choose a new or empty directory"
    )


def confined(root: str | Path, rel: str, where: str) -> Path:
    """`root / rel` for a `rel` taken from a record or a model's output (a version name, a round directory, a manifest
    entry, a model's name), refused (InputError naming `where`, `<file>: <field>`) unless it stays inside `root`: no
    absolute path, no `..`, no symlink out of it. Nothing outside is read or written on a record's say-so."""
    p = Path(str(rel))
    if not str(rel) or p.is_absolute() or ".." in p.parts or "\x00" in str(rel):
        raise InputError(f"{where}: {str(rel)[:120]!r}: must name a place inside {root} (no absolute path, no '..')")
    full = Path(root) / p
    base = Path(root).resolve()
    if not full.resolve().is_relative_to(base):  # a symlink on the way out
        raise InputError(f"{where}: {str(rel)[:120]!r}: leads outside {root} (through a symbolic link)")
    return full


def recorded_path(path: str) -> str:
    """A path as records show it: relative to the working directory when inside it, else absolute."""
    full = os.path.abspath(path)
    here = os.getcwd()
    return os.path.relpath(full, here) if full == here or full.startswith(here.rstrip(os.sep) + os.sep) else full


def mark_output(path: str | Path, kind: str) -> None:
    atomic_write_text(Path(path) / MARK, kind + "\n")


def remove_output(path: str | Path, kind: str) -> None:
    """Delete Ratchet's own output (moved aside atomically first, so a crash leaves it whole or gone)."""
    path = Path(path)
    if output_kind(path) is None:
        raise OutputRefused(f"{path}: refusing to delete a directory that is not Ratchet's {kind} output")
    old = Path(tempfile.mkdtemp(prefix=f".{path.name}.old-{_owner()}-", dir=path.parent))
    os.rename(path, old / "x")
    shutil.rmtree(old, ignore_errors=True)


def tree_stats(root: Path) -> tuple[tuple, int]:
    """Every file's (relative path, size, mtime, ctime, inode), and the newest ctime. Writing any byte of a file moves
    its ctime, which no user call can set back (unlike mtime), so an in-place edit changes this key."""
    out, newest = [], 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]):
            full = os.path.join(dirpath, name)
            st = os.lstat(full)
            out.append((os.path.relpath(full, root), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino))
            newest = max(newest, st.st_ctime_ns)
    return tuple(out), newest
