"""Ranking distillation (``aux=rank_distill``): RankCSE (Liu et al., ACL 2023, "RankCSE:
Unsupervised Sentence Representation Learning via Learning to Rank", Sec. 3).

Besides the contrastive loss, two listwise terms over the in-batch similarity lists:

- ranking consistency (weight ``rank_consistency``, the paper's beta): the Jensen-Shannon
  divergence between each anchor's softmax distribution over the positives ``cos(h_i, h_j+) / tau``
  and each positive's over the anchors ``cos(h_i+, h_j) / tau`` (tau: the recipe's ``temperature``),
  so that the two dropout views rank the batch alike;
- ranking distillation (weight ``rank_weight``, the paper's gamma): the student's list
  ``S_i = [cos(h_i, h_j+) / tau2]_j`` pulled towards a teacher's ``T_i = [cos(t_i, t_j) / tau3]_j``,
  with ListNet (Cao et al., ICML 2007, the top-one probabilities' cross-entropy: each row's
  ``-sum_j softmax(T_i)_j log softmax(S_i)_j`` over j != i) or ListMLE (Xia et al., ICML 2008, the
  Plackett-Luce likelihood of the teacher's order: ``-sum_j log exp(S_i,pi(j)) / sum_{k>=j} exp(S_i,pi(k))``,
  pi sorting T_i in decreasing order, ties in column order). Several teachers' lists are combined
  with weights (``rank_teacher_weights``; the paper's alpha for two).

Both are means over the all-gathered batch, the same value on every worker. The teachers are any
sentence-transformers model (the packaged all-MiniLM-L6-v2 by default: offline; the paper's are
SimCSE and DiffCSE checkpoints) or a training checkpoint of this platform (its folder: the model
with its recorded evaluation pooler). Their embeddings of the corpus are made once per corpus and
teacher (on Ray Data's actors across the cluster, ``methods.teachers``) and cached as corpus
statistics; each step reads its rows' vectors. A recipe with this
term is teacher-assisted (``Recipe.supervision``).

Where the paper's text was not at hand, its public reimplementation (perceptiveshawty/RankCSE,
``rankcse/models.py``: ListNet's and ListMLE's forms, the diagonal left out of ListNet's lists,
tau3 = tau2 / 2 for ListNet as its README reports of the paper) is followed; the authors released
no code of their own.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import torch
import torch.nn.functional as F

from methods.ingredients import AuxTerm, CorpusStatistics, Draws, Params, StepOutputs, check, cited
from methods.losses import cosine_matrix, full_precision, gather_with_grad
from methods.teachers import Embed, distinct_rows, embed_here

TEACHER_VERSION = 2  # of ``embed_rows``: bump when what it makes changes
RANK_LOSSES = ("listnet", "listmle")


@dataclasses.dataclass
class RankDistillParams(Params):
    rank_teachers: str = cited("minilm", (
        "The teachers, comma-separated: sentence-transformers models (a name, name@revision or a path) or training "
        "checkpoints of this platform; default the packaged all-MiniLM-L6-v2 (our choice: offline; RankCSE's are "
        "SimCSE and DiffCSE checkpoints)."))
    rank_teacher_weights: str = cited("", (
        "One weight per teacher for their similarity lists (RankCSE's alpha * T1 + (1 - alpha) * T2); empty: equal."))
    rank_loss: str = cited("listnet", "listnet | listmle: RankCSE's two variants of the distillation term (Sec. 3)")
    rank_weight: float = cited(1.0, "gamma, the distillation term's weight (RankCSE; its reimplementation's default)")
    rank_consistency: float = cited(1.0, (
        "beta, the ranking consistency term's weight (RankCSE; its reimplementation's default); 0 leaves it out"))
    rank_tau_student: float = cited(0.05, "tau2, the student's list temperature (RankCSE)")
    rank_tau_teacher: float = cited(0.025, (
        "tau3, the teachers' list temperature for ListNet: tau2 / 2 (RankCSE, as its reimplementation's README "
        "reports); ListMLE reads only the teachers' order"))

    @property
    def teachers(self) -> list[str]:
        return [t.strip() for t in self.rank_teachers.split(",") if t.strip()]

    @property
    def weights(self) -> list[float]:
        items = [w.strip() for w in self.rank_teacher_weights.split(",") if w.strip()]
        return [float(w) for w in items] if items else [1.0 / len(self.teachers)] * len(self.teachers)

    def validate(self) -> None:
        check([(bool(self.teachers), "rank_teachers names no teacher")])
        try:
            weights = self.weights
        except ValueError:
            weights = []
        check([
            (len(weights) == len(self.teachers) and all(w > 0 for w in weights),
             f"rank_teacher_weights needs one weight > 0 for each of the {len(self.teachers)} teacher(s), got "
             f"{self.rank_teacher_weights!r}"),
            (self.rank_loss in RANK_LOSSES, f"rank_loss must be {' or '.join(RANK_LOSSES)}, got {self.rank_loss!r}"),
            (self.rank_weight >= 0 and self.rank_consistency >= 0,
             f"rank_weight and rank_consistency must be >= 0, got {self.rank_weight} and {self.rank_consistency}"),
            (self.rank_tau_student > 0 and self.rank_tau_teacher > 0,
             f"rank_tau_student and rank_tau_teacher must be > 0, got {self.rank_tau_student} and {self.rank_tau_teacher}"),
        ])


# ------------------------------------------------------------------------------------------------
# The terms


def listnet(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """ListNet (Cao et al., 2007, the top-one probability's cross-entropy) between scaled lists,
    each row's diagonal left out: ``-(1/N) sum_i sum_{j != i} softmax(T_i)_j log softmax(S_i)_j``."""
    eye = torch.eye(student.shape[0], dtype=torch.bool, device=student.device)
    log_p = F.log_softmax(student.masked_fill(eye, float("-inf")), dim=-1)
    q = F.softmax(teacher.masked_fill(eye, float("-inf")), dim=-1)
    return -(q * log_p).masked_fill(eye, 0.0).sum() / student.shape[0]


def listmle(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """ListMLE (Xia et al., 2008): the mean over rows of the negative Plackett-Luce log-likelihood of
    the teacher's order of the row (decreasing, ties in column order) under the student's scores:
    ``sum_j [log sum_{k >= j} exp(S_pi(k)) - S_pi(j)]``."""
    order = torch.argsort(teacher, dim=-1, descending=True, stable=True)
    s = student.gather(1, order)
    tails = torch.logcumsumexp(s.flip(-1), dim=-1).flip(-1)
    return (tails - s).sum(-1).mean()


def consistency(forward: torch.Tensor, backward: torch.Tensor) -> torch.Tensor:
    """The mean over rows of the Jensen-Shannon divergence between ``softmax(forward_i)`` and
    ``softmax(backward_i)``: ``(KL(p || m) + KL(q || m)) / 2`` with ``m = (p + q) / 2``."""
    log_p, log_q = F.log_softmax(forward, dim=-1), F.log_softmax(backward, dim=-1)
    log_m = torch.logsumexp(torch.stack([log_p, log_q]), dim=0) - np.log(2.0)
    kl = lambda log_a: (log_a.exp() * (log_a - log_m)).sum(-1)  # noqa: E731
    return (0.5 * (kl(log_p) + kl(log_q))).mean()


def teacher_lists(teachers: list[torch.Tensor], weights: list[float], tau: float) -> torch.Tensor:
    """The teachers' combined in-batch lists ``sum_k w_k cos(t_i, t_j) / tau``."""
    return sum(w * cosine_matrix(t, t) / tau for t, w in zip(teachers, weights))


# ------------------------------------------------------------------------------------------------
# The teachers' embeddings of the corpus


def embed_rows(texts: Iterable[Any], teacher: str, embed: Embed = embed_here) -> np.ndarray:
    """The teacher's vector of every row of ``texts`` (each distinct text embedded once), float16."""
    distinct, rows = distinct_rows([str(t) for t in texts])
    return embed(distinct, teacher).astype(np.float16)[rows]


def save_rows(state: np.ndarray, folder: Path) -> None:
    np.save(Path(folder) / "teacher.npy", state)


def load_rows(folder: Path) -> np.ndarray:
    return np.load(Path(folder) / "teacher.npy", mmap_mode="r")


class RankDistillation(AuxTerm):
    """``aux=rank_distill``: RankCSE's ranking consistency and listwise distillation from teachers.

    Inputs: the anchors' and positives' projections, all-gathered; the rows' teacher vectors (``rank_teacher_<k>``).
    Requires: sentence-transformers teachers or platform checkpoints (``rank_teachers``). Combines with: every encoder, positives, negatives and loss.
    Paper: RankCSE (Liu et al., 2023), Sec. 3; ListNet (Cao et al., 2007); ListMLE (Xia et al., 2008).
    Example: --set aux=rank_distill --set rank_teachers=minilm --set rank_loss=listmle"""

    name = "rank_distill"
    Params = RankDistillParams
    cites = "Liu et al. (2023), RankCSE, Sec. 3; Cao et al. (2007), ListNet; Xia et al. (2008), ListMLE"
    space = "rank_distill"
    augments_per_epoch = True

    def teacher(self) -> str | None:
        return ", ".join(self.params.teachers)

    def columns(self) -> list[str]:
        return [f"rank_teacher_{k}" for k in range(len(self.params.teachers))]

    def statistics(self) -> CorpusStatistics:
        teachers = self.params.teachers
        key = hashlib.sha256(json.dumps(teachers).encode()).hexdigest()[:16]  # one cache entry per teacher list
        return CorpusStatistics(f"rank-teachers-{key}", TEACHER_VERSION,
                                lambda text, embed: [embed_rows(text, t, embed) for t in teachers],
                                lambda state, folder: [save_rows(s, _sub(folder, k)) for k, s in enumerate(state)],
                                lambda folder: [load_rows(_sub(folder, k)) for k in range(len(teachers))],
                                encodes=True)

    def augment(self, batch: dict[str, Any], state: list[np.ndarray], draws: Draws) -> dict[str, Any]:
        """Each row's vector by each teacher (rows of the corpus: ``batch["row"]``)."""
        rows = np.asarray(batch["row"], dtype=np.int64)
        return {**batch, **{c: np.asarray(s[rows]) for c, s in zip(self.columns(), state)}}

    def tensor_columns(self, batch: dict[str, Any], device) -> dict[str, torch.Tensor]:
        return {c: torch.as_tensor(np.asarray(batch[c]), dtype=torch.float32, device=device) for c in self.columns()}

    def forward(self, out: StepOutputs) -> tuple[torch.Tensor, dict[str, Any]]:
        p = self.params
        a, b = gather_with_grad(out.z["anchor"]), gather_with_grad(out.z["positive"])
        teachers = [gather_with_grad(out.batch[c]) for c in self.columns()]
        with full_precision(a.device):
            cos = cosine_matrix(a, b)  # cos(h_i, h_j+); its transpose is cos(h_i+, h_j)
            lists = teacher_lists(teachers, p.weights, p.rank_tau_teacher)
            rank = (listnet if p.rank_loss == "listnet" else listmle)(cos / p.rank_tau_student, lists)
            tau = self.shared.temperature
            agree = consistency(cos / tau, cos.T / tau) if p.rank_consistency else a.new_zeros(())
        term = p.rank_weight * rank + p.rank_consistency * agree
        return term, {"rank_distillation": rank.detach(), "rank_consistency": agree.detach()}


def _sub(folder: Any, k: int) -> Path:
    path = Path(folder) / f"teacher-{k}"
    path.mkdir(parents=True, exist_ok=True)
    return path
