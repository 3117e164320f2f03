"""Patch: apply a plan to a disposable copy of the working base.

Every path is checked before anything is written: a card path must be package-relative (no absolute path, no `..`,
enforced by the plan schema) and no component of it may be a symlink in the base. The candidate is built in a temp
directory and moved into place whole, so a failed patch leaves nothing behind."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import frontmatter
import yaml

from components.errors import InputError
from components.evolution.plan import AddBinding, AddCard, Operation, Plan, RemoveBinding, RemoveCard, SetTrigger, SetWM
from components.io import atomic_dir
from components.memory.package import MANIFEST


class PatchError(InputError):
    pass


def check_paths(plan: Plan, base: Path) -> None:
    base = Path(base)
    root = base.resolve()
    for i, op in enumerate(plan.operations):
        path = getattr(op, "path", None)
        if path is None:
            continue
        cur = base
        for part in Path(path).parts:
            cur = cur / part
            if cur.is_symlink():
                raise PatchError(
                    f"plan: operations.{i}.path: {path!r} goes through a symlink ({cur.relative_to(base)})"
                )
        if not (base / path).resolve().is_relative_to(root):
            raise PatchError(f"plan: operations.{i}.path: {path!r} escapes the candidate")


def apply_plan(plan: Plan, base: str | Path, out: str | Path) -> Path:
    base, out = Path(base), Path(out)
    check_paths(plan, base)  # refuse before any write
    with atomic_dir(out) as tmp:
        shutil.copytree(base, tmp, symlinks=True, dirs_exist_ok=True)
        manifest = yaml.safe_load((tmp / MANIFEST).read_text(encoding="utf-8")) or {}
        for i, op in enumerate(plan.operations):
            _apply(i, op, tmp, manifest)
        (tmp / MANIFEST).write_text(yaml.safe_dump(manifest, sort_keys=False, allow_unicode=True), encoding="utf-8")
    return out


def _apply(i: int, op: Operation, root: Path, manifest: dict[str, Any]) -> None:
    where = f"plan: operations.{i}"
    if isinstance(op, AddCard):
        target = root / op.path
        if target.exists():
            raise PatchError(f"{where}.path: {op.path} already exists (use set_trigger to change a card)")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(
            frontmatter.dumps(frontmatter.Post(op.body.strip() + "\n", **op.meta), sort_keys=False) + "\n",
            encoding="utf-8",
        )
    elif isinstance(op, RemoveCard):
        target = root / op.path
        if not target.is_file():
            raise PatchError(f"{where}.path: {op.path} does not exist")
        target.unlink()
    elif isinstance(op, SetTrigger):
        target = root / op.path
        if not target.is_file():
            raise PatchError(f"{where}.path: {op.path} does not exist")
        post = frontmatter.loads(target.read_text(encoding="utf-8"))
        post.metadata["trigger"] = {"event": op.event, **({"tool": op.tool} if op.tool else {})}
        target.write_text(frontmatter.dumps(post, sort_keys=False) + "\n", encoding="utf-8")
    elif isinstance(op, SetWM):
        manifest.setdefault("wm", {})[op.field] = op.value
    elif isinstance(op, AddBinding):
        section = manifest.setdefault(op.section, [])
        if any(b.get("use") == op.use and b.get("at") == op.at for b in section):
            raise PatchError(f"{where}: {op.section} already binds {op.use} at {op.at}")
        section.append({"use": op.use, "at": op.at, **({"cfg": dict(op.cfg)} if op.cfg else {})})
    elif isinstance(op, RemoveBinding):
        section = manifest.get(op.section, [])
        keep = [b for b in section if not (b.get("use") == op.use and b.get("at") == op.at)]
        if len(keep) == len(section):
            raise PatchError(f"{where}: {op.section} has no {op.use} at {op.at}")
        manifest[op.section] = keep
