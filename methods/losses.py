"""The contrastive losses of the recipes (``loss=infonce | hince | ntxent``) and the DDP all-gather
they rely on. Each loss is one small module over ``Views`` (the all-gathered anchors, positives and
negatives of a step), its math in ``forward`` and its paper in the docstring; the functions below
it compute the equations and are tested against slow references.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from methods.ingredients import Ingredient, Params, check, cited


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def gather_with_grad(x: torch.Tensor) -> torch.Tensor:
    """All-gather ``x`` along dim 0 in rank order, keeping the gradient of the local shard.

    ``dist.all_gather`` returns tensors detached from the graph; putting the local tensor back in
    its slot lets gradient flow to this worker's embeddings. Rank r's rows sit at
    ``[r * n, (r + 1) * n)``, so labels built as ``arange(W * n)`` stay aligned on every worker.
    Every worker computes the same global loss; the training loop multiplies it by the world size
    before ``backward`` so that DDP's gradient averaging yields the gradient of the global loss
    (each worker's backward only covers its own shard's contribution).
    """
    n = world_size()
    if n == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(n)]
    dist.all_gather(parts, x.contiguous())
    parts[dist.get_rank()] = x
    return torch.cat(parts, dim=0)


def global_mean(local_mean: torch.Tensor) -> torch.Tensor:
    """The global-batch mean of a per-row loss computed on this worker's rows only.

    The value is the mean over workers (equal shard sizes): the same on every worker, like the
    losses built on ``gather_with_grad``. The gradient is this worker's share, ``local / W``:
    after the loop's x W and DDP's averaging, the applied gradient is that of the global mean
    -- also for parameters that only see local rows, such as a discriminator head.
    """
    n = world_size()
    if n == 1:
        return local_mean
    total = local_mean.detach().clone()
    dist.all_reduce(total)
    share = local_mean / n
    return total / n + (share - share.detach())


def full_precision(device: torch.device):
    """Autocast off on ``device``: the similarities and softmax of every loss run in float32
    whatever the caller's autocast (a bf16 cosine near 1 is off by ~0.004, ~0.08 in a logit at
    tau 0.05). The authors' code does the same (autocast keeps ``cosine_similarity`` in fp32)."""
    return torch.autocast(device_type=device.type, enabled=False)


def cosine_matrix(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``[sim(a_i, b_j)]_{ij}`` with cosine similarity, in float32 under any autocast."""
    with full_precision(a.device):
        return F.normalize(a.float(), dim=-1) @ F.normalize(b.float(), dim=-1).T


def info_nce(
    z1: torch.Tensor, z2: torch.Tensor, temperature: float, negatives: torch.Tensor | None = None
) -> torch.Tensor:
    """InfoNCE of SimCSE (Gao et al., 2021, Eq. 1; unsupervised form Eq. 4).

    ``l_i = -log exp(sim(z1_i, z2_i)/tau) / sum_j exp(sim(z1_i, z2_j)/tau)`` over the N x N
    in-batch matrix, averaged over the batch. ``negatives`` (M x d), when given, add M columns
    ``sim(z1_i, n_k)/tau`` to every row's denominator (SimCSE's hard-negative form, Eq. 5, with
    weight 1; UNA uses its generated negatives this way). In float32 under any autocast.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    logits = cosine_matrix(z1, z2)
    if negatives is not None:
        logits = torch.cat([logits, cosine_matrix(z1, negatives)], dim=1)
    labels = torch.arange(z1.shape[0], device=z1.device)
    with full_precision(z1.device):
        return F.cross_entropy(logits / temperature, labels)


def hince(
    z1: torch.Tensor,
    z2: torch.Tensor,
    z3: torch.Tensor,
    tau1: float,
    tau2: float,
    own_negative_weight: float = 1.0,
    valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """HiNCE (Cai et al., Eq. 2): ``logits_i = [sim(z1_i, z2_j)/tau1]_j ++ [sim(z1_i, z3_j)/tau2]_j``,
    target i, mean over the batch; all N aligned negatives of the batch sit in every denominator
    at their own temperature, as the authors code it. ``own_negative_weight`` w multiplies the
    anchor's own negative's term in the denominator (log w added to that logit, SimCSE's
    hard-negative weight). ``valid`` (one bool per row of z3) drops negatives that do not exist
    (their columns get -inf). With tau1 = tau2 and w = 1 this is InfoNCE with the negatives as
    extra columns. ``z3`` may stack several sources' aligned negatives (k*N rows, source after
    source): each block's row i is anchor i's own negative. In float32 under any autocast."""
    if tau1 <= 0 or tau2 <= 0:
        raise ValueError(f"temperatures must be > 0, got tau1={tau1}, tau2={tau2}")
    pos = cosine_matrix(z1, z2) / tau1
    neg = cosine_matrix(z1, z3) / tau2
    n = z1.shape[0]
    with full_precision(z1.device):
        if own_negative_weight != 1.0:
            own = torch.eye(n, device=neg.device).repeat(1, z3.shape[0] // n)
            neg = neg + own * torch.log(torch.tensor(own_negative_weight, device=neg.device))
        if valid is not None:
            neg = neg.masked_fill(~valid.bool().unsqueeze(0), float("-inf"))
        labels = torch.arange(n, device=z1.device)
        return F.cross_entropy(torch.cat([pos, neg], dim=1), labels)


def symmetric_info_nce(z1: torch.Tensor, z2: torch.Tensor, temperature: float) -> torch.Tensor:
    """AugCSE's contrastive term, symmetric "similar to CLIP" (Tang et al., 2022, App. A.14 and
    Table 14; the authors' code with ``diff_cse_mode``): ``S = [sim(z1_i, z2_j)/tau]_{ij}`` over the
    N x N in-batch matrix, loss ``(CE(S, I) + CE(S^T, I)) / 2``: each anchor classified among the
    positives and each positive among the anchors. In float32 under any autocast."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    logits = cosine_matrix(z1, z2) / temperature
    labels = torch.arange(z1.shape[0], device=z1.device)
    with full_precision(z1.device):
        return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2


def nt_xent(pairs: list[tuple[torch.Tensor, torch.Tensor]], temperature: float) -> torch.Tensor:
    """Symmetric NT-Xent (SimCLR, Chen et al., 2020, Eq. 1) over all rows of the given positive
    pairs, as the UNA authors' code trains: every row's positive is its partner, every other row is
    a negative, itself excluded; mean over all rows. With [(anchor, positive), (negative,
    negative')] this is their 4N x 4N loss; with the first pair alone, the 2N x 2N loss of the
    steps without negatives. Pairs may have different lengths (the rows of the negatives that
    exist). In float32 under any autocast."""
    z = torch.cat([t for pair in pairs for t in pair])
    sim = cosine_matrix(z, z) / temperature
    targets, start = [], 0
    for a, _ in pairs:
        n = a.shape[0]
        idx = torch.arange(start, start + n, device=z.device)
        targets += [idx + n, idx]
        start += 2 * n
    with full_precision(z.device):
        sim = sim.masked_fill(torch.eye(z.shape[0], dtype=torch.bool, device=z.device), float("-inf"))
        return F.cross_entropy(sim, torch.cat(targets))


# ------------------------------------------------------------------------------------------------
# The loss ingredients


@dataclasses.dataclass
class Negative:
    """One source's negatives of a step, all-gathered: row i belongs to anchor i. ``valid`` marks
    the rows that exist (an empty negative has none); ``second`` is a second dropout view of the
    same negatives, for losses that pair them (NT-Xent)."""

    z: torch.Tensor
    valid: torch.Tensor
    second: torch.Tensor | None = None


@dataclasses.dataclass
class Views:
    """What a contrastive loss sees: all-gathered anchors, positives and the active negatives;
    ``columns``: embeddings that are every anchor's negatives, kept across steps (a momentum
    queue), for losses that ``takes_columns``."""

    anchor: torch.Tensor
    positive: torch.Tensor
    negatives: list[Negative]
    columns: torch.Tensor | None = None

    def split(self, parts: int) -> list["Views"]:
        """The views of ``parts`` consecutive, equal groups of rows (the replicas of a step), each
        with its own rows' negatives only."""
        def cut(x: torch.Tensor | None) -> list:
            return list(x.chunk(parts)) if x is not None else [None] * parts

        negatives = [[Negative(z, v, s) for z, v, s in zip(cut(n.z), cut(n.valid), cut(n.second))] for n in self.negatives]
        return [Views(a, p, [n[i] for n in negatives])
                for i, (a, p) in enumerate(zip(cut(self.anchor), cut(self.positive)))]

    def prefix(self, dims: int) -> "Views":
        """The same views with every vector cut to its first ``dims`` coordinates (a Matryoshka
        prefix, ``methods.matryoshka``); each loss's cosine renormalises what is left."""
        def cut(x: torch.Tensor | None) -> torch.Tensor | None:
            return x[..., :dims] if x is not None else None

        return Views(self.anchor[..., :dims], self.positive[..., :dims],
                     [Negative(n.z[..., :dims], n.valid, cut(n.second)) for n in self.negatives], cut(self.columns))


class Loss(Ingredient, nn.Module):
    """``loss``: the one contrastive loss of a recipe, ``forward(views) -> scalar`` over the
    all-gathered ``Views`` of a step (the same value on every worker)."""

    kind = "loss"
    needs_negatives: ClassVar[bool] = False  # refused in a recipe without a source of negatives
    takes_negatives: ClassVar[bool] = True  # False: refused in a recipe with a source of negatives
    # NT-Xent treats each negative as a pair of dropout views: the step encodes it twice.
    pairs_negatives: ClassVar[bool] = False
    # Extra columns of every anchor's denominator (``Views.columns``: an embedded negatives source).
    takes_columns: ClassVar[bool] = False

    def __init__(self, params: Params | None = None, shared=None):
        nn.Module.__init__(self)
        Ingredient.__init__(self, params, shared)


class InfoNCE(Loss):
    """SimCSE's InfoNCE (Gao et al., 2021, Eq. 1 and 4; hard-negative form Eq. 5 with weight 1).

    Views: anchors h_i and positives h_i+ (N x d each, all-gathered), and each active source's
    negatives n_k (N x d, row i anchor i's; ``valid`` marks those that exist). Loss, mean over i:
    ``-log e^{sim(h_i, h_i+)/tau} / (sum_j e^{sim(h_i, h_j+)/tau} + sum_k e^{sim(h_i, n_k)/tau})``,
    sim = cosine, tau = ``temperature``; every valid negative of every source is a column, and so
    is every embedding of ``Views.columns`` (ESimCSE's queue, Wu et al., 2022, Sec. 3.2).

    Inputs: anchors and positives; every valid negative of every active source, and a queue's embeddings, as extra columns.
    Requires: nothing. Combines with: every positives, negatives source and aux term.
    Paper: SimCSE (Gao et al., 2021), Eq. 1, 4 and 5.
    Example: --set loss=infonce --set temperature=0.05
    """

    name = "infonce"
    cites = "Gao et al. (2021), SimCSE, Eq. 1, 4 and 5"
    takes_columns = True

    def forward(self, v: Views) -> torch.Tensor:
        parts = [n.z[n.valid] for n in v.negatives] + ([v.columns] if v.columns is not None else [])
        columns = torch.cat([p.to(v.anchor.dtype) for p in parts]) if parts else None
        return info_nce(v.anchor, v.positive, self.shared.temperature, negatives=columns)


class SymmetricInfoNCE(Loss):
    """AugCSE's symmetric InfoNCE (Tang et al., 2022, App. A.14; the authors' code with
    ``diff_cse_mode``): CLIP's two directions over the in-batch matrix of anchors and positives
    (N x N, all-gathered), ``(CE(S) + CE(S^T)) / 2`` with ``S_ij = sim(h_i, h_j+)/tau``, sim =
    cosine, tau = ``temperature``. It has no place for negatives: a recipe with them is refused.

    Inputs: anchors and positives only.
    Requires: no negatives source. Combines with: every positives and aux term.
    Paper: AugCSE (Tang et al., 2022), App. A.14 (CLIP's symmetric loss), and the authors' code.
    Example: --set aux=augcse --set loss=symmetric
    """

    name = "symmetric"
    cites = "Tang et al. (2022), AugCSE, App. A.14 (CLIP's symmetric loss) and the authors' code"
    takes_negatives = False

    def forward(self, v: Views) -> torch.Tensor:
        return symmetric_info_nce(v.anchor, v.positive, self.shared.temperature)


@dataclasses.dataclass
class HiNCEParams(Params):
    tau2: float = cited(0.08, (
        "Temperature of the negatives' columns; tau1 is the shared ``temperature`` (Cai et al.: tau1 0.05, tau2 0.08 "
        "for SimCSE-BERT-base, grid 0.05-0.1)."))
    own_negative_weight: float = cited(1.0, "SimCSE's hard-negative weight on the anchor's own negative (1: none)")

    def validate(self) -> None:
        check([(self.tau2 > 0, f"tau2 must be > 0, got {self.tau2}"),
               (self.own_negative_weight > 0, f"own_negative_weight must be > 0, got {self.own_negative_weight}")])


class HiNCE(Loss):
    """HiNCE (Cai et al., Eq. 2): positives at tau1, the batch's aligned negatives at tau2.

    Views: anchors h_i, positives h_i+ (N x d), and each active source's negatives h_i- (N x d,
    row i anchor i's own; invalid ones masked). Logits of row i:
    ``[sim(h_i, h_j+)/tau1]_j ++ [sim(h_i, h_k-)/tau2]_k``, target i, cross-entropy, mean over i.
    A step on which no source is active (UNA uses its negatives every alpha-th step) has the
    positive part alone: InfoNCE at tau1.

    Inputs: anchors, positives and each active source's negatives, row i anchor i's own.
    Requires: a negatives source. Combines with: ``una``, ``san``, every positives and aux term.
    Paper: SAN + HiNCE (Cai et al.), Eq. 2.
    Example: --set negatives=san --set loss=hince --set tau2=0.06
    """

    name = "hince"
    Params = HiNCEParams
    cites = "Cai et al., SAN + HiNCE, Eq. 2"
    space = "san"
    needs_negatives = True

    def forward(self, v: Views) -> torch.Tensor:
        p = self.params
        if not v.negatives:
            return info_nce(v.anchor, v.positive, self.shared.temperature)
        return hince(v.anchor, v.positive, torch.cat([n.z for n in v.negatives]), self.shared.temperature, p.tau2,
                     p.own_negative_weight, torch.cat([n.valid for n in v.negatives]))


class NTXent(Loss):
    """Symmetric NT-Xent over the views: VaSCL's instance loss (Zhang et al., Eq. 1: each of the 2M
    views against the 2M-1 others) and the UNA authors' 4N x 4N loss.

    Views: anchors and positives (N x d each), and each active source's negatives with a second
    dropout view of them. Positive pairs: (h_i, h_i+) and, for a negative that exists, its two
    views; every other row is a negative. Row r's loss
    ``-log e^{sim(z_r, z_r')/tau} / sum_{s != r} e^{sim(z_r, z_s)/tau}`` (r' its partner), mean over rows.

    Inputs: anchors, positives, and each active source's negatives with a second dropout view.
    Requires: nothing. Combines with: every positives, negatives source and aux term.
    Paper: VaSCL (Zhang et al., 2021), Eq. 1; the UNA authors' code (SimCLR's NT-Xent).
    Example: --set loss=ntxent
    """

    name = "ntxent"
    cites = "Zhang et al. (2021), VaSCL, Eq. 1; Shu et al., UNA, authors' code (SimCLR's NT-Xent)"
    pairs_negatives = True

    def forward(self, v: Views) -> torch.Tensor:
        pairs = [(v.anchor, v.positive)] + [(n.z[n.valid], n.second[n.valid]) for n in v.negatives]
        return nt_xent(pairs, self.shared.temperature)
