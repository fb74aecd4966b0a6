"""On-disk caches keyed by content, written atomically (write to a temp name, then rename).

A cache entry is a folder under ``$PLATFORM_CACHE_DIR`` (default ``<repo>/.cache/platform``)
named by a hash of everything the content depends on: the sentences themselves (not the file
name), the method, the parameters that matter, and a code version. A crash mid-write leaves at
most a ``*.tmp-*`` folder, never a half-written entry; readers only see complete ones.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator

from platform import settings
from platform.outputs import in_ray_job_copy, remove_leftovers, writer_id

REPO_ROOT = Path(__file__).resolve().parents[2]


def cache_root() -> Path:
    """``$PLATFORM_CACHE_DIR``, else the repository's ``.cache/platform``; in a job's temporary copy
    of the repository, the user's cache folder (``~/.cache/contrastive-platform``) instead."""
    if settings.get(settings.CACHE_DIR):
        return Path(settings.get(settings.CACHE_DIR)).expanduser().resolve()
    if in_ray_job_copy(REPO_ROOT):
        return (Path.home() / ".cache" / "contrastive-platform").resolve()
    return (REPO_ROOT / ".cache" / "platform").resolve()


def sentences_digest(sentences: list[str]) -> str:
    h = hashlib.sha256()
    for s in sentences:
        h.update(s.encode("utf-8"))
        h.update(b"\n")
    return h.hexdigest()


def encoder_key(encoder, pooler: str) -> str:
    """A digest of the weights, the tokenizer, the pooler and the device type."""
    import torch

    h = hashlib.blake2b(digest_size=16)
    for name, tensor in sorted(encoder.backbone.state_dict().items()):
        h.update(name.encode())
        h.update(str(tuple(tensor.shape)).encode() + str(tensor.dtype).encode())
        h.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    tok = encoder.tokenizer
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is not None:  # its padding and truncation settings change with each call: not part of it
        spec = {k: v for k, v in json.loads(backend.to_str()).items() if k not in ("padding", "truncation")}
        h.update(json.dumps(spec, sort_keys=True).encode())
    else:
        h.update(repr(sorted(tok.get_vocab().items())).encode())
    h.update(f"|{pooler}|{next(encoder.parameters()).device.type}".encode())
    return h.hexdigest()


def entry_key(kind: str, digest: str, params: dict[str, Any]) -> str:
    blob = json.dumps({"kind": kind, "corpus": digest, "params": params}, sort_keys=True, default=str)
    return f"{kind}-{hashlib.sha256(blob.encode()).hexdigest()[:20]}"


def cache_entry(kind: str, digest: str, params: dict[str, Any]) -> Path:
    """Where the entry lives (complete once it holds ``COMPLETE``)."""
    return cache_root() / entry_key(kind, digest, params)


def cached(kind: str, digest: str, params: dict[str, Any], build: Callable[[Path], None]) -> Path:
    """The folder of a complete entry; ``build(tmp_dir)`` fills a new one on a miss."""
    final = cache_entry(kind, digest, params)
    if not (final / "COMPLETE").is_file():
        with building(kind, digest, params) as tmp:
            build(tmp)
    return final


@contextlib.contextmanager
def building(kind: str, digest: str, params: dict[str, Any]) -> Iterator[Path]:
    """A new entry's temporary folder, to fill inside the block: complete and in place when the
    block ends without an error (several can be open at once, as one pass fills several
    entries), removed otherwise."""
    root = cache_root()
    final = cache_entry(kind, digest, params)
    root.mkdir(parents=True, exist_ok=True)
    remove_leftovers(root, final.name + ".tmp-")
    tmp = Path(tempfile.mkdtemp(prefix=f"{final.name}.tmp-{writer_id()}-", dir=root))
    try:
        yield tmp
        (tmp / "COMPLETE").write_text(json.dumps({"kind": kind, "corpus": digest, "params": params}, default=str))
        try:
            os.replace(tmp, final)
        except OSError:  # another process finished the same entry first
            if not (final / "COMPLETE").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
