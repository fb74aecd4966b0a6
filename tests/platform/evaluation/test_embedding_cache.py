"""The embedding store: by content, once, atomically, and keyed by what an embedding depends on."""

from __future__ import annotations

import os
import socket
import time

import numpy as np
import torch

from methods.encoder import Encoder
from platform.storage import encoder_key
from platform.evaluation.embedding_cache import DIGEST_BYTES, EmbeddingStore, _digest, prune


def _sentences(n: int) -> list[str]:
    return [f"sentence number {i} of the store test" for i in range(n)]


def test_a_second_store_encodes_nothing_and_returns_the_same_rows(tiny_model, tmp_path):
    encoder = Encoder.from_pretrained(str(tiny_model), pooler="avg")
    texts = _sentences(299)
    # and one whose digest ends in a zero byte (NumPy's bytes type would drop it on the way back)
    texts.append(next(t for t in (f"zero {i}" for i in range(10_000)) if _digest(t)[-1] == 0))
    first = EmbeddingStore(encoder, "avg", root=tmp_path)
    emb = first.embed(texts + texts[:5])  # duplicates encoded once
    assert first.encoded == 300 and emb.shape == (305, encoder.hidden_size) and emb.dtype == np.float32
    direct = encoder.encode(texts, pooler="avg").numpy()
    assert np.array_equal(emb[:300], direct) and np.array_equal(emb[300:], direct[:5])
    second = EmbeddingStore(encoder, "avg", root=tmp_path)
    assert np.array_equal(second.embed(texts), direct) and second.encoded == 0
    more = second.embed(texts[:10] + ["a new sentence"])
    assert second.encoded == 1 and np.array_equal(more[:10], direct[:10])
    assert len(list(second.folder.glob("part-*.npz"))) == 2


def test_the_key_follows_weights_pooler_and_tokenizer_not_the_path(tiny_model, tmp_path):
    a = Encoder.from_pretrained(str(tiny_model), pooler="avg")
    copy = tmp_path / "copy"
    a.save_pretrained(copy)
    b = Encoder.from_pretrained(str(copy), pooler="avg")
    assert encoder_key(a, "avg") == encoder_key(b, "avg")
    b.encode(["the tokenizer's padding state changes with a call"])
    assert encoder_key(a, "avg") == encoder_key(b, "avg")
    assert encoder_key(a, "avg") != encoder_key(a, "cls_before_pooler")
    with torch.no_grad():
        next(b.backbone.parameters()).view(-1)[0] += 1e-3
    assert encoder_key(a, "avg") != encoder_key(b, "avg")
    b = Encoder.from_pretrained(str(copy), pooler="avg")
    b.tokenizer.add_tokens(["zzyzx"])
    assert encoder_key(a, "avg") != encoder_key(b, "avg")


def test_a_killed_writers_leftover_is_ignored_and_removed(tiny_model, tmp_path):
    encoder = Encoder.from_pretrained(str(tiny_model), pooler="avg")
    store = EmbeddingStore(encoder, "avg", root=tmp_path)
    store.embed(_sentences(3))
    dead = 2**22 + 12345
    while True:  # a pid no process has
        try:
            os.kill(dead, 0)
            dead += 1
        except ProcessLookupError:
            break
    leftover = store.folder / f"tmp-{socket.gethostname()}-{dead}-7"
    leftover.write_bytes(b"half a part")
    live = store.folder / f"tmp-{socket.gethostname()}-{os.getpid()}-7"
    live.write_bytes(b"being written")
    again = EmbeddingStore(encoder, "avg", root=tmp_path)
    assert not leftover.exists() and live.exists() and len(again.rows) == 3
    assert all(len(k) == DIGEST_BYTES for k in again.rows)


def _fake_store(root, name: str, size: int, age_s: float):
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "part-x.npz").write_bytes(b"\0" * size)
    when = time.time() - age_s
    os.utime(folder, (when, when))
    return folder


def test_stores_are_held_under_the_size_limit_least_recently_used_first(tiny_model, tmp_path, monkeypatch):
    """Each evaluated checkpoint gets a store: past PLATFORM_EMBEDDING_CACHE_GB the least recently
    used go, never the one being written."""
    oldest = _fake_store(tmp_path, "a" * 32, 1000, age_s=300)
    middle = _fake_store(tmp_path, "b" * 32, 1000, age_s=200)
    newest = _fake_store(tmp_path, "c" * 32, 1000, age_s=100)
    assert prune(tmp_path, keep=newest, limit=2500) == [oldest]
    assert middle.exists() and newest.exists()
    assert prune(tmp_path, keep=middle, limit=0) == [newest] and middle.exists()  # kept whatever its size

    encoder = Encoder.from_pretrained(str(tiny_model), pooler="avg")
    store = EmbeddingStore(encoder, "avg", root=tmp_path)
    os.utime(middle, (time.time() - 50, time.time() - 50))
    monkeypatch.setenv("PLATFORM_EMBEDDING_CACHE_GB", str(1 / 2**30))  # one byte: only the store written stays
    store.embed(_sentences(3))
    assert store.folder.is_dir() and not middle.exists()
    assert len(EmbeddingStore(encoder, "avg", root=tmp_path).rows) == 3
