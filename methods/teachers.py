"""A teacher's embeddings of texts: what mined negatives (``negatives=mined``) and ranking
distillation (``aux=rank_distill``) are made from, once per corpus.

``Teacher`` loads the model once and embeds batches; instances are also callables over
``{"sentence": [...], "index": [...]}`` batches, so the platform runs a pool of them as Ray Data
actors across the cluster's CPUs or GPUs, as it runs the column generators. A teacher is a
sentence-transformers model (a name, ``name@revision``, a packaged alias or a path) or a
training checkpoint of this platform, which the platform resolves to its model folder and the
pooler it is evaluated with before a teacher is built (``Teacher(model, pooler=...)``).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch

from methods.encoder import Encoder, pretrained_source

Embed = Callable[[list[str], str], np.ndarray]  # (texts, teacher) -> one float32 row per text


class Teacher:
    """One teacher, loaded once on ``device`` (None: a GPU where there is one, else the CPU, as
    sentence-transformers chooses for either kind of teacher). ``pooler``: the
    model is a checkpoint's folder of this platform, embedded by ``Encoder`` with that pooler; None:
    a sentence-transformers model (its own pooling and normalisation)."""

    def __init__(self, teacher: str, pooler: str | None = None, device: str | None = None, batch_size: int | None = None):
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # a bar per actor of the pool, on the run's console
        if pooler is not None:
            self.encoder = Encoder.from_pretrained(teacher, pooler=pooler)
            self.encoder.to(device or ("cuda" if torch.cuda.is_available() else "cpu"))
            self.model = None
        else:
            from sentence_transformers import SentenceTransformer

            source, kwargs = pretrained_source(teacher)
            self.model, self.encoder = SentenceTransformer(source, device=device, **kwargs), None
        # On a CPU, batches of 32: a pool actor's peak memory and its time both grow with the batch
        # (at 128, over the wiki1m file, it went above what the actor asks Ray for, and took longer;
        # `python -m benchmarks run actor-memory` measures the pool). A GPU takes 128.
        self.batch_size = batch_size or (128 if self.device.type == "cuda" else 32)

    @property
    def device(self) -> torch.device:
        return self.model.device if self.model is not None else next(self.encoder.parameters()).device

    def encode(self, texts: list[str]) -> np.ndarray:
        """Each text's embedding, float32, in input order."""
        if self.encoder is not None:
            return self.encoder.encode(texts, batch_size=self.batch_size).numpy().astype(np.float32)
        return self.model.encode(texts, batch_size=self.batch_size, convert_to_numpy=True,
                                 show_progress_bar=False).astype(np.float32)

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        return {"index": np.asarray(batch["index"]), "vector": self.encode([str(t) for t in batch["sentence"]])}


def embed_here(texts: list[str], teacher: str) -> np.ndarray:
    """``Embed`` in this process: the teacher as named (a sentence-transformers model)."""
    return Teacher(teacher).encode(texts)


def distinct_rows(texts: list[str]) -> tuple[list[str], np.ndarray]:
    """The distinct texts in order of first appearance, and each row's index among them."""
    index: dict[str, int] = {}
    rows = np.fromiter((index.setdefault(t, len(index)) for t in texts), dtype=np.int64, count=len(texts))
    return list(index), rows
