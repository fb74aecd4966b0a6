"""VaSCL: Virtual augmentation Supported Contrastive Learning (Zhang et al., 2021), as ``aux=vascl``.

Embeddings e (the pooled sentence vectors, two dropout views) go through a head
h: d -> d -> 128 (no bias, ReLU, L2-normalised), z = h(e); the head is the recipe's projection, so
the contrastive loss sees z too: the named recipe ``vascl`` uses ``loss=ntxent``, Eq. 1's instance
loss, where each of the 2M views is classified among all 2M-1 others. With K in-batch neighbours
N(i) of each instance (top-K by cosine similarity of e, Eq. 1's sim; the authors' code ranks by
the raw dot product), self excluded, over the all-gathered batch:

- Neighbourhood loss (Eq. 2): for a query q, its positive p and negatives {n_j},
  ``l(q, p; {n_j}) = -log exp(q.p/tau) / (exp(q.p/tau) + sum_j exp(q.n_j/tau))``, with
  ``l_N(i)(z_i^delta, z_i) = l(z_i^delta, z_i; {z_j : j in N(i)})`` and
  ``z_i^delta = h(e_i + delta_i)``.
- Virtual augmentation (Eq. 3): ``delta_i* = argmax_{||delta_i|| <= Delta} l_N(i)(z_i^delta, z_i)``,
  approximated as in virtual adversarial training: start from random noise of norm ``xi`` (the
  paper: isotropic Gaussian; the authors' code: uniform in [-0.5, 0.5)), take the gradient of
  sum_i l_N(i) with respect to delta at e + delta (embeddings held fixed), normalise it per
  instance (``power_iterations`` times), and place it on the sphere of radius Delta. The paper
  gives no scale for the noise; the authors' ``vat_utils.py`` evaluates the gradient at
  e + Delta u (xi = Delta, ``xi=0``, the default); ``--set xi=1e-3`` is VAT's small-xi variant.
- The term (Eq. 4): the instance and its virtual augmentation discriminated in both directions
  against the augmented neighbourhood N_A(i) = {k, k*}: the K neighbours and their virtual
  augmentations, 2K negatives, ``l(z_i^delta, z_i; N_A(i)) + l(z_i, z_i^delta; N_A(i))``. Both
  terms of Eq. 5 are averaged over the 2M views (its 1/2M): L = l_I + (mean of the two directions).

``fidelity: paper`` lets l_VA reach the encoder (z^delta = h(e + delta) with e attached).
``fidelity: authors_code`` builds it on detached embeddings as the authors' code does, so only
the head learns from it.

Under DDP the head runs on this worker's rows and its outputs are all-gathered, so that the
head's gradient, like the encoder's, counts every row once across workers.
"""

from __future__ import annotations

import contextlib

import dataclasses
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from methods.ingredients import AuxTerm, Params, StepOutputs, check, cited, derive_seed
from methods.losses import full_precision, gather_with_grad, rank


@dataclasses.dataclass
class VaSCLParams(Params):
    k: int = cited(16, "neighbourhood size: the authors' --topk (amazon-research/sentence-representations, VaSCL)")
    delta: float = cited(15.0, "radius of the virtual augmentation (15 for base models, 30 for large)")
    power_iterations: int = cited(1, "VAT's power iterations; the authors' code takes one step")
    xi: float = cited(0.0, (
        "Norm of the initial random perturbation; 0: delta, as the authors' vat_utils.py (the paper gives none)."))
    head_dim: int = cited(128, "the head's output size, 128 (Zhang et al., App. A)")
    head_lr_scale: float = cited(100.0, "head learning rate = 100 x backbone (Appendix A)")

    def validate(self) -> None:
        check([
            (self.k >= 1, f"k must be >= 1, got {self.k}"),
            (self.delta > 0, f"delta must be > 0, got {self.delta}"),
            (self.power_iterations >= 1, f"power_iterations must be >= 1, got {self.power_iterations}"),
            (self.head_lr_scale > 0 and self.xi >= 0 and self.head_dim >= 1,
             "head_lr_scale must be > 0, xi >= 0 and head_dim >= 1"),
        ])

    def validate_batch(self, batch_size: int) -> None:
        check([(self.k < batch_size,
                f"k={self.k} must be smaller than the batch size {batch_size} (neighbours are in-batch)")])


class Head(nn.Module):
    """d -> d -> head_dim, no bias, ReLU, L2-normalised output."""

    def __init__(self, hidden: int, out: int):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(hidden, hidden, bias=False), nn.ReLU(), nn.Linear(hidden, out, bias=False))

    def forward(self, e: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.net(e), dim=-1)


def neighbours(e: torch.Tensor, k: int, cosine: bool = True) -> torch.Tensor:
    """Indices (N x K) of each row's top-K rows by cosine similarity (Eq. 1's sim; ``cosine=False``:
    the raw dot product of the authors' code), itself excluded; ranked in float32."""
    with torch.no_grad(), full_precision(e.device):
        x = F.normalize(e.float(), dim=-1) if cosine else e.float()
        scores = x @ x.T
        scores.fill_diagonal_(float("-inf"))
        return scores.topk(k, dim=1).indices


def neighbourhood_loss(q: torch.Tensor, p: torch.Tensor, negatives: torch.Tensor, temperature: float) -> torch.Tensor:
    """Mean over i of -log exp(q_i.p_i/tau) / (exp(q_i.p_i/tau) + sum_j exp(q_i.n_ij/tau)) (Eq. 2);
    rows are unit vectors, ``negatives`` is N x K x d (K or 2K per row). In float32 under any autocast."""
    with full_precision(q.device):
        q, p, negatives = q.float(), p.float(), negatives.float()
        pos = (q * p).sum(-1, keepdim=True)
        neg = torch.einsum("nd,nkd->nk", q, negatives)
        logits = torch.cat([pos, neg], dim=1) / temperature
        return F.cross_entropy(logits, torch.zeros(len(q), dtype=torch.long, device=q.device))


def virtual_perturbation(
    head: nn.Module, e: torch.Tensor, nbrs: torch.Tensor, params: VaSCLParams, temperature: float,
    generator: torch.Generator | None = None, authors: bool = False,
) -> torch.Tensor:
    """delta on the sphere of radius Delta that (approximately) maximises l_N (Eq. 3), for every
    row of the (all-gathered) batch ``e``; no parameter receives a gradient from it. The initial
    noise: isotropic Gaussian (the paper), or uniform in [-0.5, 0.5) (``authors``, their code),
    at norm ``xi`` (0: Delta, the authors' code)."""
    e = e.detach().float().clone()
    if authors:
        noise = torch.rand(e.shape, generator=generator, device="cpu").sub(0.5).to(e.device)
    else:
        noise = torch.randn(e.shape, generator=generator, device="cpu").to(e.device)
    xi = params.xi or params.delta
    d = xi * F.normalize(noise, dim=-1)
    # A gradient w.r.t. delta only, also when called under no_grad; in float32 whatever the caller's
    # autocast: fp16's unscaled gradient of a loss over 2K+1 cosines underflows to zero, and the
    # normalised zero vector would silently take the perturbation away.
    with torch.enable_grad(), full_precision(e.device):
        z = head(e).detach()
        for _ in range(params.power_iterations):
            d.requires_grad_(True)
            loss = neighbourhood_loss(head(e + d), z, z[nbrs], temperature) * len(e)  # sum over i
            (grad,) = torch.autograd.grad(loss, d)
            d = xi * F.normalize(grad.detach(), dim=-1)
    return params.delta * F.normalize(d, dim=-1)


def virtual_augmentation_loss(
    head: nn.Module, e: torch.Tensor, nbrs: torch.Tensor, delta: torch.Tensor, temperature: float, attach: bool
) -> torch.Tensor:
    """l_VA (Eq. 4): each instance vs its virtual augmentation, both directions, against the
    augmented neighbourhood {z_k, z_k^delta : k in N(i)} (2K negatives); the mean of the two
    directions, i.e. averaged over the 2M views (Eq. 5). ``e`` holds this worker's rows, ``nbrs``
    and ``delta`` the global batch's; ``attach=False`` is the authors' code (``vat_utils.py``): the
    embeddings detached and the clean projections ``z`` computed under ``no_grad``, so only the
    augmented ones ``z^delta`` train the head."""
    base = e if attach else e.detach()
    n = len(base)
    own = delta[rank() * n : (rank() + 1) * n]
    with contextlib.nullcontext() if attach else torch.no_grad():
        z = gather_with_grad(head(base))
    z_aug = gather_with_grad(head(base + own))
    augmented = torch.cat([z[nbrs], z_aug[nbrs]], dim=1)  # N x 2K x d
    return 0.5 * (neighbourhood_loss(z_aug, z, augmented, temperature)
                  + neighbourhood_loss(z, z_aug, augmented, temperature))


class VaSCL(AuxTerm):
    """``aux=vascl``: brings the head h (the recipe's projection, at ``head_lr_scale`` x the
    learning rate) and adds l_VA: the virtual augmentation of each anchor against its K nearest
    in-batch neighbours (cosine) and their augmentations (2K).

    Inputs: the anchors' embeddings and their projections through h.
    Requires: ``k`` smaller than the global batch. Combines with: every positives, negatives source and loss; not ``augcse``.
    Paper: VaSCL (Zhang et al., 2021), Sec. 3, Eq. 1-5.
    Example: --set aux=vascl --set k=16 --set delta=15"""

    name = "vascl"
    Params = VaSCLParams
    cites = "Zhang et al. (2021), VaSCL, Sec. 3, Eq. 1-5"
    space = "vascl"
    default_pooler = "avg"  # VaSCL pools the mean of the last layer; the head replaces SimCSE's MLP
    brings_projection = True
    config_defaults = {"max_grad_norm": (0.0, "Zhang et al.'s code (training.py) steps its optimizer without clipping gradients"),
                       "precision": ("fp32", "Zhang et al.'s code (training.py) trains in fp32 (no autocast)")}

    def notes(self, batch_size: int) -> list[str]:
        k = self.params.k
        return [f"aux=vascl: each instance's neighbourhood is its {k} nearest of the {batch_size - 1} others in the "
                f"global batch ({k / (batch_size - 1):.1%}; the paper's: 16 of 1023, 1.6%)"]

    def projection(self, hidden: int) -> nn.Module:
        return Head(hidden, self.params.head_dim)

    @property
    def projection_lr_scale(self) -> float:
        return self.params.head_lr_scale

    def forward(self, out: StepOutputs) -> tuple[torch.Tensor, dict[str, Any]]:
        p, tau = self.params, self.shared.temperature
        head = out.model.projection
        local = out.e["anchor"].float()
        e = gather_with_grad(local)
        paper = self.shared.fidelity == "paper"
        nbrs = neighbours(e, p.k, cosine=paper)
        # The same noise on every worker (it computes the same global loss), from the run's seed and the step.
        gen = torch.Generator().manual_seed(derive_seed(out.seed, "vascl-noise", out.step))
        delta = virtual_perturbation(head, e, nbrs, p, tau, gen, authors=not paper)
        va = virtual_augmentation_loss(head, local, nbrs, delta, tau, attach=paper)
        return va, {"vascl_neighbourhood": va.detach()}
