"""On-disk caches keyed by content, written atomically (write to a temp name, then rename).

A cache entry is a folder under ``$PLATFORM_CACHE_DIR`` (default ``<repo>/.cache/platform``)
named by a hash of everything the content depends on: the sentences themselves (not the file
name), the method, the parameters that matter, and a code version. A crash mid-write leaves at
most a ``*.tmp-*`` folder, never a half-written entry; readers only see complete ones.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

REPO_ROOT = Path(__file__).resolve().parents[2]


def replace_dir(src: Path, dst: Path) -> None:
    """Move the finished folder ``src`` to ``dst`` so that ``dst`` is never half-written: the old
    ``dst`` is renamed aside first and removed only after ``src`` took its place."""
    old = dst.with_name(dst.name + ".old")
    if old.exists():
        shutil.rmtree(old)
    if dst.exists():
        os.replace(dst, old)
    os.replace(src, dst)
    if old.exists():
        shutil.rmtree(old)


def cache_root() -> Path:
    return Path(os.environ.get("PLATFORM_CACHE_DIR") or REPO_ROOT / ".cache" / "platform").resolve()


def sentences_digest(sentences: list[str]) -> str:
    h = hashlib.sha256()
    for s in sentences:
        h.update(s.encode("utf-8"))
        h.update(b"\n")
    return h.hexdigest()


def entry_key(kind: str, digest: str, params: dict[str, Any]) -> str:
    blob = json.dumps({"kind": kind, "corpus": digest, "params": params}, sort_keys=True, default=str)
    return f"{kind}-{hashlib.sha256(blob.encode()).hexdigest()[:20]}"


def cache_entry(kind: str, digest: str, params: dict[str, Any]) -> Path:
    """Where the entry lives (complete once it holds ``COMPLETE``)."""
    return cache_root() / entry_key(kind, digest, params)


def cached(kind: str, digest: str, params: dict[str, Any], build: Callable[[Path], None]) -> Path:
    """The folder of a complete entry; ``build(tmp_dir)`` fills a new one on a miss."""
    root = cache_root()
    final = cache_entry(kind, digest, params)
    if (final / "COMPLETE").is_file():
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=final.name + ".tmp-", dir=root))
    try:
        build(tmp)
        (tmp / "COMPLETE").write_text(json.dumps({"kind": kind, "corpus": digest, "params": params}, default=str))
        try:
            os.replace(tmp, final)
        except OSError:  # another process finished the same entry first
            if not (final / "COMPLETE").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final
