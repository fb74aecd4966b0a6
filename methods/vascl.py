"""VaSCL: Virtual augmentation Supported Contrastive Learning (Zhang et al., 2021).

Embeddings e (the pooled sentence vectors, two dropout views) go through a head
h: d -> d -> 128 (no bias, ReLU, L2-normalised), z = h(e). With K in-batch neighbours N(i) of
each instance (top-K by raw dot product of e, self excluded, over the all-gathered batch):

- Neighbourhood loss (Eq. 2): for a query q, its positive p and negatives {n_j},
  ``l(q, p; {n_j}) = -log exp(q.p/tau) / (exp(q.p/tau) + sum_j exp(q.n_j/tau))``, with
  ``l_N(i)(z_i^delta, z_i) = l(z_i^delta, z_i; {z_j : j in N(i)})`` and
  ``z_i^delta = h(e_i + delta_i)``.
- Virtual augmentation (Eq. 3): ``delta_i* = argmax_{||delta_i|| <= Delta} l_N(i)(z_i^delta, z_i)``,
  approximated as in virtual adversarial training: start from random noise of small norm, take
  the gradient of sum_i l_N(i) with respect to delta (embeddings held fixed), normalise it per
  instance (``power_iterations`` times), and place it on the sphere of radius Delta.
- Loss (Eq. 4-5): the instance loss of SimCSE in both directions, ``l_I = InfoNCE(z, z') +
  InfoNCE(z', z)``, plus the neighbourhood discrimination in both directions:
  ``l(z_i^delta, z_i; {z_j}_{N(i)}) + l(z_i, z_i^delta; {z_j^delta}_{N(i)})`` (the instance against its
  virtual augmentation, each against the other's neighbourhood: the augmented one for the
  original query). Means over the batch; L = l_I + l_VA.

``fidelity: paper`` lets l_VA reach the encoder (z^delta = h(e + delta) with e attached).
``fidelity: authors_code`` builds it on detached embeddings as the authors' code does, so only
the head learns from it.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from methods.base import InvalidParams, Method
from methods.encoder import Encoder
from methods.losses import gather_with_grad, info_nce
from methods.simcse import SimCSEParams, two_views


@dataclasses.dataclass
class VaSCLParams(SimCSEParams):
    # VaSCL pools the mean of the last layer (no SimCSE MLP; the head below replaces it).
    pooler: str = "avg"
    k: int = 16  # neighbourhood size (Zhang et al., Sec. 4 / Appendix A)
    delta: float = 15.0  # radius of the virtual augmentation (15 for base models, 30 for large)
    power_iterations: int = 1
    xi: float = 1e-3  # norm of the initial random perturbation
    head_dim: int = 128
    head_lr_scale: float = 100.0  # head learning rate = 100 x backbone (Appendix A)
    fidelity: str = "paper"  # paper | authors_code

    def validate(self) -> None:
        super().validate()
        if self.k < 1:
            raise InvalidParams(f"k must be >= 1, got {self.k}")
        if not self.delta > 0:
            raise InvalidParams(f"delta must be > 0, got {self.delta}")
        if self.power_iterations < 1:
            raise InvalidParams(f"power_iterations must be >= 1, got {self.power_iterations}")
        if self.head_lr_scale <= 0 or self.xi <= 0 or self.head_dim < 1:
            raise InvalidParams("head_lr_scale and xi must be > 0, head_dim >= 1")
        if self.fidelity not in ("paper", "authors_code"):
            raise InvalidParams(f"fidelity must be 'paper' or 'authors_code', got {self.fidelity!r}")

    def validate_batch(self, batch_size: int) -> None:
        if self.k >= batch_size:
            raise InvalidParams(f"k={self.k} must be smaller than the batch size {batch_size} (neighbours are in-batch)")


class Head(nn.Module):
    """d -> d -> head_dim, no bias, ReLU, L2-normalised output."""

    def __init__(self, hidden: int, out: int):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(hidden, hidden, bias=False), nn.ReLU(), nn.Linear(hidden, out, bias=False))

    def forward(self, e: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.net(e), dim=-1)


class VaSCLModel(nn.Module):
    def __init__(self, encoder: Encoder, pooler: str, head_dim: int):
        super().__init__()
        self.encoder = encoder
        self.pooler = pooler
        self.head = Head(encoder.hidden_size, head_dim)
        if getattr(encoder.backbone, "pooler", None) is not None and pooler != "cls":
            encoder.backbone.pooler.requires_grad_(False)  # unused: no trainable without a gradient

    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.encoder(inputs, pooler=self.pooler)


def neighbours(e: torch.Tensor, k: int) -> torch.Tensor:
    """Indices (N x K) of each row's top-K rows by raw dot product, itself excluded."""
    with torch.no_grad():
        scores = e.float() @ e.float().T
        scores.fill_diagonal_(float("-inf"))
        return scores.topk(k, dim=1).indices


def neighbourhood_loss(q: torch.Tensor, p: torch.Tensor, negatives: torch.Tensor, temperature: float) -> torch.Tensor:
    """Mean over i of -log exp(q_i.p_i/tau) / (exp(q_i.p_i/tau) + sum_j exp(q_i.n_ij/tau)) (Eq. 2);
    rows are unit vectors, ``negatives`` is N x K x d."""
    pos = (q * p).sum(-1, keepdim=True)
    neg = torch.einsum("nd,nkd->nk", q, negatives)
    logits = torch.cat([pos, neg], dim=1) / temperature
    return F.cross_entropy(logits, torch.zeros(len(q), dtype=torch.long, device=q.device))


def virtual_perturbation(
    head: nn.Module, e: torch.Tensor, nbrs: torch.Tensor, params: VaSCLParams, generator: torch.Generator | None = None
) -> torch.Tensor:
    """delta on the sphere of radius Delta that (approximately) maximises l_N (Eq. 3)."""
    e = e.detach().float().clone()
    noise = torch.randn(e.shape, generator=generator, device="cpu").to(e.device)
    d = params.xi * F.normalize(noise, dim=-1)
    with torch.enable_grad():  # a gradient w.r.t. delta only, also when called under no_grad
        z = head(e).detach()
        for _ in range(params.power_iterations):
            d.requires_grad_(True)
            loss = neighbourhood_loss(head(e + d), z, z[nbrs], params.temperature) * len(e)  # sum over i
            (grad,) = torch.autograd.grad(loss, d)
            d = params.xi * F.normalize(grad.detach(), dim=-1)
    return params.delta * F.normalize(d, dim=-1)


def virtual_augmentation_loss(
    head: nn.Module, e: torch.Tensor, nbrs: torch.Tensor, delta: torch.Tensor, temperature: float, attach: bool
) -> torch.Tensor:
    """l_VA (Eq. 4): each instance vs its virtual augmentation, both directions, each against the
    other side's neighbourhood. ``attach=False`` is the authors' code (embeddings detached)."""
    base = e if attach else e.detach()
    z = head(base)
    z_aug = head(base + delta)
    return neighbourhood_loss(z_aug, z, z[nbrs], temperature) + neighbourhood_loss(z, z_aug, z_aug[nbrs], temperature)


class VaSCL(Method):
    name = "vascl"
    Params = VaSCLParams

    def build(self, encoder: Encoder) -> nn.Module:
        return VaSCLModel(encoder, self.params.pooler, self.params.head_dim)

    def param_groups(self, model: nn.Module, lr: float) -> list[dict]:
        model = getattr(model, "module", model)
        head = [p for p in model.head.parameters() if p.requires_grad]
        ids = {id(p) for p in head}
        rest = [p for p in model.parameters() if p.requires_grad and id(p) not in ids]
        return [{"params": rest, "lr": lr}, {"params": head, "lr": lr * self.params.head_lr_scale}]

    def loss(self, model, batch, step):
        p = self.params
        inner = getattr(model, "module", model)
        e1, e2 = two_views(model, batch["sentence"])
        e1, e2 = gather_with_grad(e1.float()), gather_with_grad(e2.float())
        z1, z2 = inner.head(e1), inner.head(e2)
        instance = info_nce(z1, z2, p.temperature) + info_nce(z2, z1, p.temperature)

        nbrs = neighbours(e1, p.k)
        # Same noise on every worker (seeded by step): each computes the same global loss.
        gen = torch.Generator().manual_seed(1_000_003 * (step + 1))
        delta = virtual_perturbation(inner.head, e1, nbrs, p, gen)
        va = virtual_augmentation_loss(inner.head, e1, nbrs, delta, p.temperature, attach=p.fidelity == "paper")
        return instance + va, {"vascl_instance": float(instance.detach()), "vascl_neighbourhood": float(va.detach())}

    def eval_pooler(self) -> str:
        return self.params.pooler
