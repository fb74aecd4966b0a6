"""Contrastive losses shared by the methods, and the DDP all-gather they rely on."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


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


def cosine_matrix(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``[sim(a_i, b_j)]_{ij}`` with cosine similarity, computed in float32 for stable softmax."""
    return F.normalize(a.float(), dim=-1) @ F.normalize(b.float(), dim=-1).T


def info_nce(
    z1: torch.Tensor, z2: torch.Tensor, temperature: float, negatives: torch.Tensor | None = None
) -> torch.Tensor:
    """InfoNCE of SimCSE (Gao et al., 2021, Eq. 1; unsupervised form Eq. 4).

    ``l_i = -log exp(sim(z1_i, z2_i)/tau) / sum_j exp(sim(z1_i, z2_j)/tau)`` over the N x N
    in-batch matrix, averaged over the batch. ``negatives`` (M x d), when given, add M columns
    ``sim(z1_i, n_k)/tau`` to every row's denominator (SimCSE's hard-negative form, Eq. 5, with
    weight 1; UNA uses its generated negatives this way).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    logits = cosine_matrix(z1, z2)
    if negatives is not None:
        logits = torch.cat([logits, cosine_matrix(z1, negatives)], dim=1)
    labels = torch.arange(z1.shape[0], device=z1.device)
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
    hard-negative weight). ``valid`` (N bools) drops negatives that do not exist (their columns get
    -inf). With tau1 = tau2 and w = 1 this is InfoNCE with the negatives as extra columns."""
    if tau1 <= 0 or tau2 <= 0:
        raise ValueError(f"temperatures must be > 0, got tau1={tau1}, tau2={tau2}")
    pos = cosine_matrix(z1, z2) / tau1
    neg = cosine_matrix(z1, z3) / tau2
    n = z1.shape[0]
    if own_negative_weight != 1.0:
        neg = neg + torch.eye(n, device=neg.device) * torch.log(torch.tensor(own_negative_weight, device=neg.device))
    if valid is not None:
        neg = neg.masked_fill(~valid.bool().unsqueeze(0), float("-inf"))
    labels = torch.arange(n, device=z1.device)
    return F.cross_entropy(torch.cat([pos, neg], dim=1), labels)
