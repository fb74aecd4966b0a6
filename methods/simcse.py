"""SimCSE, unsupervised (Gao et al., 2021): the positive of a sentence is the sentence itself.

The two views differ only by dropout: the batch is encoded twice in one forward pass of 2N rows,
so every row gets an independent dropout mask, and InfoNCE (Eq. 4) contrasts each first view
with all second views of the (all-gathered) batch. Training pooler: [CLS] + MLP (Linear + Tanh),
the MLP used in training only; evaluation pools with ``cls_before_pooler`` (Sec. 6.3, Table 6).
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from methods.base import InvalidParams, Method, MethodParams
from methods.encoder import POOLERS, Encoder
from methods.losses import gather_with_grad, info_nce


@dataclasses.dataclass
class SimCSEParams(MethodParams):
    # Training pooler; 'cls' is [CLS] followed by the MLP (SimCSE's unsupervised setting).
    pooler: str = "cls"
    # Use the MLP in training only and evaluate [CLS] before it (SimCSE, Sec. 6.3).
    mlp_only_train: bool = True

    def validate(self) -> None:
        super().validate()
        if self.pooler not in POOLERS:
            raise InvalidParams(f"unknown pooler {self.pooler!r}; choose one of {', '.join(POOLERS)}")


class ProjectionMLP(nn.Module):
    """SimCSE's ``MLPLayer``: Linear(d, d) + Tanh on the [CLS] vector, BERT-style init."""

    def __init__(self, hidden: int, init_std: float = 0.02):
        super().__init__()
        self.dense = nn.Linear(hidden, hidden)
        self.activation = nn.Tanh()
        nn.init.normal_(self.dense.weight, std=init_std)
        nn.init.zeros_(self.dense.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.activation(self.dense(x))


class SimCSEModel(nn.Module):
    def __init__(self, encoder: Encoder, pooler: str):
        super().__init__()
        self.encoder = encoder
        self.pooler = pooler
        std = getattr(encoder.backbone.config, "initializer_range", 0.02)
        self.mlp = ProjectionMLP(encoder.hidden_size, std) if pooler == "cls" else None
        backbone_pooler = getattr(encoder.backbone, "pooler", None)
        if backbone_pooler is not None:
            # Never used in training (the MLP replaces it and is folded in on export); frozen so
            # DDP sees no trainable parameter without a gradient.
            backbone_pooler.requires_grad_(False)

    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        if self.mlp is None:
            return self.encoder(inputs, pooler=self.pooler)
        return self.mlp(self.encoder(inputs, pooler="cls_before_pooler"))


def two_views(model: nn.Module, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Encode the batch twice in one forward pass (2N rows, independent dropout masks)."""
    doubled = {k: torch.cat([v, v], dim=0) for k, v in inputs.items()}
    z = model(doubled)
    n = inputs["input_ids"].shape[0]
    return z[:n], z[n:]


class SimCSE(Method):
    name = "simcse"
    Params = SimCSEParams

    def build(self, encoder: Encoder) -> nn.Module:
        return SimCSEModel(encoder, self.params.pooler)

    def loss(self, model, batch, step):
        z1, z2 = two_views(model, batch["sentence"])
        loss = info_nce(gather_with_grad(z1), gather_with_grad(z2), self.params.temperature)
        return loss, {}

    def eval_pooler(self) -> str:
        if self.params.pooler == "cls" and self.params.mlp_only_train:
            return "cls_before_pooler"
        return self.params.pooler

    def export_encoder(self, model) -> Encoder:
        """Fold the trained MLP into the backbone's pooler layer (SimCSE's simcse_to_huggingface),
        so pooler 'cls' of the exported model is [CLS] + the trained MLP."""
        model = getattr(model, "module", model)
        encoder = model.encoder
        pooler = getattr(encoder.backbone, "pooler", None)
        if model.mlp is not None and pooler is not None and hasattr(pooler, "dense"):
            with torch.no_grad():
                pooler.dense.weight.copy_(model.mlp.dense.weight)
                pooler.dense.bias.copy_(model.mlp.dense.bias)
        return encoder
