"""Folders the platform writes, and the rule that keeps it from deleting what a user made.

A folder the platform writes whole (``augment --out``, an export, SentEval's ``downstream/``, a
report folder) carries a marker file naming the command that wrote it. Such a folder is replaced
only when it is absent, empty, or carries the marker: a re-run replaces its own earlier output,
never a folder of the user's (``--out .`` in a repository, a thesis folder, a typo). The new
content is written beside the target under a name no user picks, then swapped in by renames, so
the target is complete or absent whatever stops the writer; leftovers of a killed writer are
removed by the next writer of the same target.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
from pathlib import Path

from platform.errors import UserError

MARKER = ".platform-output.json"
_STAGING = ".platform-staging-"  # prefix of the folders new content is written into
_ASIDE = ".platform-aside-"  # prefix of the replaced content, removed once the new one is in place


# Ray unpacks a job's working_dir (``ray job submit --working-dir``) into a folder of this prefix
# in its session's temp folder, and deletes it once no job uses it.
RAY_PACKAGE_PREFIX = "_ray_pkg_"


def in_ray_job_copy(path) -> bool:
    """Whether ``path`` lies in a copy of the repository Ray unpacked for a job: nothing that must
    outlast the job (runs, the MLflow store, caches) is written there."""
    return any(part.startswith(RAY_PACKAGE_PREFIX) for part in Path(path).expanduser().resolve().parts)


def is_ours(folder: Path) -> bool:
    return (folder / MARKER).is_file()


def check_replaceable(target: Path, advice: str) -> None:
    """``target`` may be replaced: absent, an empty folder, or one this platform wrote. Else one
    line ending with ``advice`` (what the user can do)."""
    target = Path(target)
    if not target.exists():
        return
    if not target.is_dir():
        raise UserError(f"{target} is a file, not a folder: nothing was changed; {advice}")
    if is_ours(target) or not any(target.iterdir()):
        return
    raise UserError(f"{target} is not empty and was not written by this platform: nothing was changed; {advice}")


def staging(target: Path) -> Path:
    """A new empty folder beside ``target`` to write its content into (same file system: the swap
    is a rename); earlier writers' leftovers for the same target are removed first."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_leftovers(target)
    return Path(tempfile.mkdtemp(prefix=f"{_STAGING}{target.name}-{writer_id()}-", dir=target.parent))


def install(new: Path, target: Path, command: str, advice: str) -> Path:
    """Put the finished folder ``new`` at ``target`` (checked replaceable again: it may have
    appeared meanwhile), marked as written by ``command``; an earlier folder of ours is removed
    only after the new one took its place."""
    target = Path(target)
    try:
        check_replaceable(target, advice)
    except UserError:
        shutil.rmtree(new, ignore_errors=True)
        raise
    (new / MARKER).write_text(json.dumps({"written_by": command}) + "\n")
    aside = None
    if target.exists():
        aside = Path(tempfile.mkdtemp(prefix=f"{_ASIDE}{target.name}-{writer_id()}-", dir=target.parent))
        os.replace(target, aside / "old")
    os.replace(new, target)
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)
    return target


def discard(new: Path) -> None:
    shutil.rmtree(new, ignore_errors=True)


def writer_id() -> str:
    """``<host>-<pid>``: what a temporary name carries so that a later writer can tell a dead
    writer's leftovers from a live one's."""
    return f"{socket.gethostname()}-{os.getpid()}"


def _remove_leftovers(target: Path) -> None:
    for prefix in (_STAGING, _ASIDE):
        remove_leftovers(target.parent, f"{prefix}{target.name}-")


def remove_leftovers(folder: Path, prefix: str) -> None:
    """Remove the folders or files ``<prefix><host>-<pid>-<random>`` in ``folder`` whose writer ran
    on this host and is gone (killed mid-write); another host's, or a live writer's, are left alone."""
    for leftover in folder.glob(f"{prefix}*"):
        tail = leftover.name[len(prefix):]
        host, _, pid = tail.rpartition("-")[0].rpartition("-")
        if host != socket.gethostname() or not pid.isdigit() or _alive(int(pid)):
            continue
        if leftover.is_dir():
            shutil.rmtree(leftover, ignore_errors=True)
        else:
            leftover.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
