"""Mined hard negatives (``negatives=mined``): each sentence's negatives are its nearest neighbours
in the corpus by a teacher's embeddings, with a positive-aware margin against false negatives.

The teacher is any sentence-transformers model (the packaged all-MiniLM-L6-v2 by default), so a
recipe with it is teacher-assisted, not unsupervised (``Recipe.supervision``). Mining applies
sentence-transformers' ``mine_hard_negatives`` rule to the teacher's embeddings, made on Ray
Data's actors across the cluster (``methods.teachers``), once per corpus and setting (cached as the
corpus statistics are): for each sentence, its ``mine_range_max`` nearest other sentences by
cosine similarity, without any whose similarity exceeds the positive's times ``1 - mine_margin``
(NV-Retriever's positive-aware "TopK-PercPos" filter, Moreira et al., 2024, Sec. 3.3, 95% of the
positive's score; sentence-transformers' ``relative_margin``), and of those the ones from rank
``mine_range_min`` on. The positive is the sentence itself (SimCSE's dropout positive), whose
similarity is 1, so the filter drops the corpus's near-copies of a sentence, the likeliest false
negatives. The first ``mine_negatives`` kept candidates stay; each epoch draws one of them per
sentence from the run's seed (``Draws``), and it is encoded in the anchors' pass as UNA's and SAN's
negatives are.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from methods.ingredients import CorpusStatistics, Draws, NegativesSource, Params, check, cited
from methods.teachers import Embed, embed_here

MINED_VERSION = 3  # of ``mine``: bump when what it keeps changes
DRAW_STREAM = 41  # the epoch's draw among a sentence's kept candidates


@dataclasses.dataclass
class MinedParams(Params):
    teacher: str = cited("minilm", (
        "The sentence-transformers model that mines (a name, name@revision or a path); default the packaged "
        "all-MiniLM-L6-v2 (our choice: it is offline; NV-Retriever mines with larger embedding models)."))
    mine_range_min: int = cited(0, (
        "The first rank considered among the other sentences the margin lets through, best first (0: the nearest; "
        "sentence-transformers' range_min)."))
    mine_range_max: int = cited(50, "ranks from this one on are not considered (sentence-transformers' range_max)")
    mine_margin: float = cited(0.05, (
        "A candidate scoring above (1 - margin) x the positive's score is dropped: NV-Retriever's TopK-PercPos at 95% "
        "(Moreira et al., 2024, Sec. 3.3); sentence-transformers' relative_margin."))
    mine_negatives: int = cited(3, "kept candidates per sentence; each epoch draws one of them (our choice)")

    def validate(self) -> None:
        check([
            (0 <= self.mine_range_min < self.mine_range_max,
             f"mine_range_min must be >= 0 and below mine_range_max, got {self.mine_range_min} and {self.mine_range_max}"),
            (0.0 <= self.mine_margin < 1.0, f"mine_margin must be in [0, 1), got {self.mine_margin}"),
            (self.mine_negatives >= 1, f"mine_negatives must be >= 1, got {self.mine_negatives}"),
        ])


def mine(sentences: list[str], params: MinedParams, embed: Embed = embed_here, chunk: int = 4096) -> dict[str, list[str]]:
    """Each distinct sentence's kept candidates, best first (a sentence with none kept is absent):
    sentence-transformers' ``mine_hard_negatives`` rule (``sampling_strategy="top"``,
    ``relative_margin``) on the teacher's normalised embeddings, which ``embed`` makes (on Ray
    Data's actors when the platform passes its own), so that no model is loaded here. Its
    candidates are the ``mine_range_max`` + 1 nearest (the sentence itself among them); the
    sentence itself and those scoring above ``s_pos - |s_pos| x mine_margin`` (``s_pos``: the
    positive's score, the sentence's with itself) are dropped; of the rest, best first, those from
    ``mine_range_min`` on, ``mine_negatives`` at most. The test checks it against
    ``mine_hard_negatives`` itself."""
    import torch

    distinct = list(dict.fromkeys(sentences))
    e = torch.nn.functional.normalize(torch.as_tensor(embed(distinct, params.teacher), dtype=torch.float32), dim=1)
    k = min(params.mine_range_max + 1, len(distinct))
    kept: dict[str, list[str]] = {}
    for start in range(0, len(distinct), chunk):
        sim = e[start:start + chunk] @ e.T
        rows = torch.arange(len(sim))
        positive = sim[rows, rows + start].clone()
        scores, index = sim.topk(k, dim=1)
        scores[index == (rows + start)[:, None]] = -torch.inf
        if params.mine_margin:
            scores[scores > (positive - positive.abs() * params.mine_margin)[:, None]] = -torch.inf
        scores, order = scores.sort(dim=1, descending=True, stable=True)
        index = index.gather(1, order)
        window = slice(params.mine_range_min, params.mine_range_min + params.mine_negatives)
        for i, (s, j) in enumerate(zip(scores[:, window].tolist(), index[:, window].tolist())):
            found = [distinct[c] for v, c in zip(s, j) if v != -float("inf")]
            if found:
                kept[distinct[start + i]] = found
    return kept


def save_mined(state: dict[str, list[str]], folder: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"sentence": list(state), "negatives": list(state.values())}), Path(folder) / "mined.parquet")


def load_mined(folder: Path) -> dict[str, list[str]]:
    import pyarrow.parquet as pq

    table = pq.read_table(Path(folder) / "mined.parquet").to_pydict()
    return dict(zip(table["sentence"], table["negatives"]))


class MinedNegatives(NegativesSource):
    """``negatives=mined``: each sentence's nearest corpus neighbours by a teacher model, without
    those within a margin of the positive (NV-Retriever's positive-aware filter); one drawn every
    epoch. Teacher-assisted: the recipe is labelled with its teacher.

    Inputs: the ``mined_negative`` column, drawn every epoch from candidates mined once per corpus and teacher.
    Requires: a sentence-transformers teacher (``teacher``). Combines with: every encoder, positives, loss and aux term.
    Paper: NV-Retriever (Moreira et al., 2024), Sec. 3.3; sentence-transformers' mine_hard_negatives.
    Example: --set negatives=mined --set teacher=minilm --set mine_margin=0.05"""

    name = "mined"
    Params = MinedParams
    cites = "Moreira et al. (2024), NV-Retriever, Sec. 3.3 (positive-aware mining); sentence-transformers"
    space = "mined"
    column = "mined_negative"
    augments_per_epoch = True

    def teacher(self) -> str | None:
        return self.params.teacher

    def statistics(self) -> CorpusStatistics:
        p = self.params
        settings = json.dumps([p.teacher, p.mine_range_min, p.mine_range_max, p.mine_margin, p.mine_negatives])
        key = hashlib.sha256(settings.encode()).hexdigest()[:16]  # the cache entry: one per corpus and setting
        return CorpusStatistics(f"mined-{key}", MINED_VERSION, lambda text, embed: mine(list(_strings(text)), p, embed),
                                save_mined, load_mined, encodes=True)

    def augment(self, batch: dict[str, Any], state: dict[str, list[str]], draws: Draws) -> dict[str, Any]:
        """One kept candidate per sentence, drawn from the run's seed by corpus row ("" for none)."""
        u = draws.uniform(np.asarray(batch["row"]), stream=DRAW_STREAM)
        out = []
        for sentence, x in zip(batch["sentence"], u):
            kept = state.get(str(sentence), [])
            out.append(kept[int(x * len(kept))] if kept else "")
        return {**batch, self.column: np.asarray(out, dtype=object)}


def _strings(text: Iterable[Any]) -> Iterable[str]:
    return (str(t) for t in text)
