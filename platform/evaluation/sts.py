"""STS evaluation with the SentEval protocol used by SimCSE and the methods built on it.

Cosine similarity of the two sentence embeddings, Spearman correlation with the gold scores, x100.
STS12-16 in the "all" setting (one correlation over the concatenation of a year's subsets), STS-B
and SICK-R on their test splits, no truncation. STS-B dev is the checkpoint-selection metric.

The geometry of the embedding space beside it: Wang and Isola's (2020) alignment and uniformity,
as SimCSE (Gao et al., 2021, Sec. 3, footnote 3, and Fig. 2) defines them, on L2-normalised
embeddings f(x). SimCSE measures them on the whole STS-B; the platform measures them on STS-B dev,
from the embeddings STS-B dev is scored with at every evaluation (no second encoding pass, and the
test split stays out of anything read during training): the values are not SimCSE's to the digit.

- alignment (Wang & Isola, 2020, Eq. 2 with alpha = 2; SimCSE Eq. 2): the mean over positive
  pairs of ``||f(x) - f(y)||^2``; SimCSE's positives are the STS-B dev pairs with a gold score above
  4.0. Lower: positives closer.
- uniformity (Wang & Isola, 2020, Eq. 3 with t = 2; SimCSE Eq. 3): the log of the mean over all
  pairs i < j of ``exp(-2 ||f(x_i) - f(x_j)||^2)``, over the distinct STS-B dev sentences. Lower:
  embeddings spread more evenly over the sphere.

Plain PyTorch + SciPy: no Ray or MLflow, so it runs in-process during training and anywhere else.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from methods.encoder import Encoder, TokenBatches
from methods.prompt import PromptPooling
from platform.console import pyplot
from platform.data import SHORT_NAMES, STS_TASKS, STSPairs, load_sts

POSITIVE_ABOVE = 4.0  # SimCSE Sec. 3, footnote 3: STS-B pairs with scores higher than 4 are positives
GEOMETRY = ("alignment", "uniformity")  # in the final table beside the tasks


def alignment(a: torch.Tensor, b: torch.Tensor) -> float:
    """Wang & Isola (2020), Eq. 2 (alpha 2): mean ``||f(x) - f(y)||^2`` over the rows of ``a`` and ``b``
    (positive pairs), after L2 normalisation."""
    a, b = F.normalize(a.double(), dim=-1), F.normalize(b.double(), dim=-1)
    return float((a - b).pow(2).sum(-1).mean())


def uniformity(x: torch.Tensor, t: float = 2.0) -> float:
    """Wang & Isola (2020), Eq. 3 (t 2): ``log mean_{i<j} exp(-t ||f(x_i) - f(x_j)||^2)``, after L2
    normalisation. On unit vectors ``||a - b||^2 = 2 - 2 a.b``: one Gram matrix, whose diagonal
    (each sentence with itself, exp(0) = 1) is left out and whose pairs count twice."""
    x = F.normalize(x.double(), dim=-1)
    n = x.shape[0]
    gram = (x.float() @ x.float().T).double()  # float32 products (1e-7 of 1), summed in float64
    total = torch.exp(-t * (2 - 2 * gram).clamp(min=0)).sum() - n
    return float(torch.log(total / (n * (n - 1))))


def geometry(emb: torch.Tensor, first: torch.Tensor, second: torch.Tensor, gold: np.ndarray) -> dict[str, float]:
    """Both measures for the pairs ``(emb[first[k]], emb[second[k]])`` scored ``gold[k]``: alignment
    over the pairs above ``POSITIVE_ABOVE``, uniformity over the distinct sentences of all pairs."""
    positive = torch.from_numpy(np.asarray(gold) > POSITIVE_ABOVE)
    distinct = torch.unique(torch.cat([first, second]))
    return {"alignment": alignment(emb[first[positive]], emb[second[positive]]), "uniformity": uniformity(emb[distinct])}


def spearman_x100(emb1: torch.Tensor, emb2: torch.Tensor, gold: np.ndarray) -> float:
    # Imported here: scipy.stats costs every Ray process that loads the loop, most never score.
    from scipy.stats import spearmanr

    sims = F.cosine_similarity(emb1.double(), emb2.double(), dim=-1).numpy()
    return float(spearmanr(sims, gold).statistic * 100.0)


class STSEvaluator:
    """Loads the chosen tasks once; calling it on an encoder returns ``{task: spearman x100}``.
    The sentences are tokenised once per tokenizer: a run's STS-B dev evaluations reuse them."""

    def __init__(self, tasks=STS_TASKS, root: Path | None = None, split: str = "test", batch_size: int = 128,
                 pairs: list[STSPairs] | None = None):
        self.pairs: list[STSPairs] = pairs if pairs is not None else [load_sts(t, root, split=split) for t in tasks]
        self.tasks = list(tasks)
        self.batch_size = batch_size
        # Encode every distinct sentence once across all tasks (STS reuses many sentences).
        unique: dict[str, int] = {}
        for p in self.pairs:
            for s in p.sent1 + p.sent2:
                unique.setdefault(s, len(unique))
        self.sentences = list(unique)
        self.index = [
            (torch.tensor([unique[s] for s in p.sent1]), torch.tensor([unique[s] for s in p.sent2])) for p in self.pairs
        ]
        self._batches: TokenBatches | None = None

    @classmethod
    def stsb_dev(cls, root: Path | None = None, batch_size: int = 128) -> "STSEvaluator":
        return cls(("STSBenchmark",), root, split="dev", batch_size=batch_size)

    @classmethod
    def from_pairs(cls, tasks: dict[str, dict[str, list]], batch_size: int = 128) -> "STSEvaluator":
        """From pairs already read (``{task: {"sent1", "sent2", "scores"}}``), e.g. sent by a driver."""
        pairs = [STSPairs(t, list(p["sent1"]), list(p["sent2"]), np.asarray(p["scores"], dtype=float))
                 for t, p in tasks.items()]
        return cls(tuple(tasks), batch_size=batch_size, pairs=pairs)

    def __call__(self, encoder: Encoder, pooler: str | None = None, progress: str | None = None,
                 prompt: PromptPooling | None = None) -> dict[str, float]:
        return self.score(self.encode(encoder, pooler, progress, prompt))

    def encode(self, encoder: Encoder, pooler: str | None = None, progress: str | None = None,
               prompt: PromptPooling | None = None) -> torch.Tensor:
        """The embeddings of ``self.sentences``, from the tokens kept for ``encoder``'s tokenizer.
        ``prompt``: the rules of another stage than the encoder's own (the loop's STS-B dev)."""
        prompt = prompt or encoder.prompt
        batches = self._batches
        if batches is None or batches.tokenizer is not encoder.tokenizer or batches.prompt != prompt:
            batches = self._batches = encoder.batches(self.sentences, self.batch_size, prompt=prompt)
        return encoder.encode_batches(batches, pooler=pooler, progress=progress)

    def geometry(self, emb: torch.Tensor) -> dict[str, float]:
        """Alignment and uniformity (``platform.evaluation.geometry``) of the first task's pairs, from
        the embeddings of ``self.sentences``: STS-B dev's (SimCSE's footnote 3 uses the whole STS-B)."""
        first, second = self.index[0]
        return geometry(emb, first, second, self.pairs[0].scores)

    def similarities(self, emb: torch.Tensor) -> dict[str, np.ndarray]:
        """Each task's cosine similarity of every pair (float64), from the embeddings of
        ``self.sentences``: what ``score`` ranks, kept for the evidence over seeds and pairs."""
        return {task: F.cosine_similarity(emb[i1].double(), emb[i2].double(), dim=-1).numpy()
                for task, (i1, i2) in zip(self.tasks, self.index)}

    def score(self, emb: torch.Tensor) -> dict[str, float]:
        """The tasks' scores from the embeddings of ``self.sentences`` (in that order)."""
        return {
            task: spearman_x100(emb[i1], emb[i2], p.scores)
            for task, p, (i1, i2) in zip(self.tasks, self.pairs, self.index)
        }


def with_mean(scores: dict[str, float]) -> dict[str, float]:
    out = dict(scores)
    if set(STS_TASKS) <= set(scores):
        out["avg"] = float(np.mean([scores[t] for t in STS_TASKS]))
    return out


def format_table(scores: dict[str, float]) -> str:
    names = [SHORT_NAMES.get(t, t) for t in scores]
    widths = [max(len(n), 6) for n in names]
    head = " | ".join(n.rjust(w) for n, w in zip(names, widths))
    vals = " | ".join(f"{v:.2f}".rjust(w) for v, w in zip(scores.values(), widths))
    return f"{head}\n{'-' * len(head)}\n{vals}"


def geometry_figure(trajectories: dict[str, list[tuple[int, float, float]]], path: Path, title: str = "") -> Path:
    """SimCSE's Fig. 2: uniformity (x) against alignment (y), lower is better on both; each
    trajectory ``label -> [(step, alignment, uniformity), ...]`` drawn in step order with an arrow
    to its last evaluation, its first and last steps labelled."""
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(6.4, 4.8), dpi=120)
    for label, points in trajectories.items():
        points = sorted(points)
        if not points:
            continue
        steps, align, unif = zip(*points)
        line, = ax.plot(unif, align, marker="o", markersize=3, linewidth=1.2, label=label)
        if len(points) > 1:
            ax.annotate("", xy=(unif[-1], align[-1]), xytext=(unif[-2], align[-2]),
                        arrowprops={"arrowstyle": "->", "color": line.get_color(), "lw": 1.5})
        for i in {0, len(points) - 1}:
            ax.annotate(f"{steps[i]}", (unif[i], align[i]), textcoords="offset points", xytext=(4, 4), fontsize=7,
                        color=line.get_color())
    ax.set_xlabel("uniformity  (lower: more uniform)")
    ax.set_ylabel("alignment  (lower: positives closer)")
    ax.set_title(title or "Alignment and uniformity on STS-B dev (numbers: steps)", fontsize=10)
    ax.grid(alpha=0.3)
    if trajectories:
        ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
