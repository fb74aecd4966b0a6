"""Sentence embeddings kept on disk by content, so a second evaluation of a checkpoint encodes nothing.

A store is a folder ``$PLATFORM_CACHE_DIR/embeddings/<key>`` where the key digests what an
embedding depends on: the encoder's weights and tokenizer (their bytes, not a path or a name), the
pooler, and the device type (a GPU's kernels round differently). It holds ``part-*.npz`` files,
each a batch of (sentence digest, float32 embedding) rows written atomically (temporary name,
then rename): a killed writer leaves at most a ``tmp-*`` file, which readers ignore and the next
store opened on this host removes. Parts only ever add rows, so concurrent evaluations of one checkpoint at worst
encode a sentence twice.

``embed`` encodes each distinct missing sentence once, in the encoder's length-sorted batches.

Every evaluated checkpoint gets a store of its own (tens of MB for the 7 STS tasks and the transfer
sets), so the stores together are held under ``PLATFORM_EMBEDDING_CACHE_GB`` (default 4): after a
write, the least recently used stores go first, never the one being written.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import numpy as np

from platform import settings
from platform.storage import cache_root, encoder_key, remove_leftovers, writer_id

DIGEST_BYTES = 16


def _digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8"), digest_size=DIGEST_BYTES).digest()


class EmbeddingStore:
    """The embeddings of one encoder and pooler; ``embed(sentences)`` -> float32 array in order."""

    def __init__(self, encoder, pooler: str, batch_size: int = 128, root: Path | None = None):
        self.encoder, self.pooler, self.batch_size = encoder, pooler, batch_size
        self.root = root or cache_root() / "embeddings"
        self.folder = self.root / encoder_key(encoder, pooler)
        self.rows: dict[bytes, np.ndarray] = {}
        self.encoded = 0  # sentences this store had to encode (the rest came from disk)
        if self.folder.is_dir():
            os.utime(self.folder)  # used now: the last a size limit removes
            remove_leftovers(self.folder, "tmp-")
            for part in sorted(self.folder.glob("part-*.npz")):
                try:
                    data = np.load(part)
                except FileNotFoundError:  # another process pruned this store meanwhile: encoded again
                    continue
                with data:
                    raw = data["keys"].tobytes()  # uint8 rows: NumPy's bytes type would drop trailing zeros
                    keys = [raw[i:i + DIGEST_BYTES] for i in range(0, len(raw), DIGEST_BYTES)]
                    self.rows.update(zip(keys, data["emb"]))

    def embed(self, sentences: list[str], progress: str | None = None) -> np.ndarray:
        keys = [_digest(s) for s in sentences]
        missing: dict[bytes, str] = {}
        for k, s in zip(keys, sentences):
            if k not in self.rows:
                missing.setdefault(k, s)
        if missing:
            emb = self.encoder.encode(list(missing.values()), batch_size=self.batch_size, pooler=self.pooler,
                                      progress=progress)
            emb = emb.numpy().astype(np.float32, copy=False)
            self._write(list(missing), emb)
            self.rows.update(zip(missing, emb))
            self.encoded += len(missing)
        if not keys:
            return np.empty((0, self.encoder.embedding_size), dtype=np.float32)
        return np.stack([self.rows[k] for k in keys])

    def _write(self, keys: list[bytes], emb: np.ndarray) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        name = f"part-{writer_id()}-{time.time_ns()}"
        tmp = self.folder / f"tmp-{writer_id()}-{len(keys)}"
        with open(tmp, "wb") as f:
            np.savez(f, keys=np.frombuffer(b"".join(keys), dtype=np.uint8).reshape(-1, DIGEST_BYTES), emb=emb)
        os.replace(tmp, self.folder / f"{name}.npz")
        os.utime(self.folder)
        prune(self.root, keep=self.folder)


def limit_bytes() -> int:
    return int(max(settings.number(settings.EMBEDDING_CACHE_GB), 0.0) * 2**30)


def prune(root: Path, keep: Path, limit: int | None = None) -> list[Path]:
    """Remove the least recently used stores under ``root`` (by their folder's modification time,
    touched on each open and write) until the stores total at most ``limit`` bytes (default
    ``PLATFORM_EMBEDDING_CACHE_GB``); ``keep`` stays whatever its size. Returns what was removed."""
    import shutil

    limit = limit_bytes() if limit is None else limit
    stores = []
    for folder in root.iterdir() if root.is_dir() else []:
        try:
            size = sum(f.stat().st_size for f in folder.iterdir())
            stores.append((folder.stat().st_mtime, folder, size))
        except OSError:  # removed meanwhile
            continue
    total = sum(size for _, _, size in stores)
    removed = []
    for _, folder, size in sorted(stores, key=lambda s: s[0]):
        if total <= limit:
            break
        if folder == keep:
            continue
        shutil.rmtree(folder, ignore_errors=True)
        total -= size
        removed.append(folder)
    return removed
