"""Matryoshka embeddings for any recipe: its contrastive loss summed over nested prefixes of the
embedding, so that the first ``m`` coordinates of a trained vector, L2-normalised, are an
embedding of their own (Kusupati et al., 2022, "Matryoshka Representation Learning", NeurIPS).

Not an ingredient of its own kind: it changes no view and adds no term; it evaluates the recipe's
one loss at each prefix (``matryoshka_dims``, weights ``matryoshka_weights``). The aux terms see the
whole vector. What is trained must be what is evaluated: the prefixes are of the vectors the loss
sees, so a projection used in training only (SimCSE's MLP under ``mlp_only_train``, VaSCL's and
AugCSE's heads) is refused (``refusal``).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch

from methods.errors import InvalidParams
from methods.losses import Views


def parse_dims(text: str) -> tuple[int, ...]:
    """``"768,256,64"`` -> (768, 256, 64): whole numbers >= 1, each once; "" -> ()."""
    items = [x.strip() for x in str(text).split(",") if x.strip()]
    try:
        dims = tuple(int(x) for x in items)
    except ValueError:
        raise InvalidParams(f"matryoshka_dims must be whole numbers separated by commas (768,256,64), got {text!r}") from None
    if any(d < 1 for d in dims) or len(set(dims)) != len(dims):
        raise InvalidParams(f"matryoshka_dims must be distinct whole numbers >= 1, got {text!r}")
    return dims


def parse_weights(text: str, count: int) -> tuple[float, ...]:
    """``"1,1,0.5"`` -> one weight per dimension, each > 0; "" -> all 1 (the paper's c_m = 1)."""
    items = [x.strip() for x in str(text).split(",") if x.strip()]
    if not items:
        return (1.0,) * count
    try:
        weights = tuple(float(x) for x in items)
    except ValueError:
        raise InvalidParams(f"matryoshka_weights must be numbers separated by commas, got {text!r}") from None
    if len(weights) != count or any(not w > 0 for w in weights):
        raise InvalidParams(f"matryoshka_weights needs one weight > 0 for each of the {count} matryoshka_dims, got {text!r}")
    return weights


@dataclasses.dataclass(frozen=True)
class Matryoshka:
    """The nested dimensions M and their weights c_m."""

    dims: tuple[int, ...]
    weights: tuple[float, ...]

    @classmethod
    def parse(cls, dims: str, weights: str) -> "Matryoshka | None":
        """From the run's two keys; None when ``dims`` is empty (no Matryoshka)."""
        parsed = parse_dims(dims)
        if not parsed and str(weights).strip():
            raise InvalidParams("matryoshka_weights is set without matryoshka_dims")
        return cls(parsed, parse_weights(weights, len(parsed))) if parsed else None

    def check_width(self, width: int) -> None:
        """Each prefix fits the vectors the loss sees."""
        if max(self.dims) > width:
            raise InvalidParams(f"matryoshka_dims={','.join(map(str, self.dims))} goes beyond the {width} dimensions "
                                f"of the embedding; use dimensions <= {width}")

    def loss(self, loss_fn: Callable[[Views], torch.Tensor], views: Views) -> torch.Tensor:
        """Kusupati et al. (2022), Sec. 3, Eq. 1: ``sum_{m in M} c_m L(F(x)_{1:m})`` for one batch,
        with L the recipe's contrastive loss (its cosine normalises each prefix) and no per-prefix
        linear layer W^(m): a contrastive loss has none (sentence-transformers' MatryoshkaLoss
        is the same)."""
        return sum(c * loss_fn(views.prefix(m)) for m, c in zip(self.dims, self.weights))


def refusal(pooler: str, mlp_only_train: bool, projector: str | None) -> str | None:
    """Why Matryoshka cannot train this recipe's evaluated embedding, or None: its prefixes are of
    the vectors the loss sees, which must be the ones exported and evaluated."""
    if projector is not None:
        return (f"matryoshka_dims trains prefixes of what the loss sees, and aux={projector}'s projection head is "
                "used in training only: the evaluated embedding would not be the one trained; drop one of the two")
    if pooler in ("cls", "mask") and mlp_only_train:
        return (f"matryoshka_dims trains prefixes of what the loss sees, and pooler={pooler} with mlp_only_train=true "
                "evaluates the vector before the MLP the loss sees: use pooler=cls_before_pooler or avg, or "
                "mlp_only_train=false (the MLP then stays in the exported model)")
    return None
