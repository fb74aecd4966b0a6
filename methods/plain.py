"""The plain encoder: a sentence is embedded as it is, by the recipe's pooler (``encoder=plain``,
every recipe's default but the prompt-based ones')."""

from __future__ import annotations

from methods.ingredients import EncoderIngredient


class PlainEncoder(EncoderIngredient):
    """``encoder=plain``: the sentence as it is, pooled by ``pooler`` (SimCSE's [CLS] + MLP, or an
    aux term's pooling).

    Inputs: the sentence.
    Requires: nothing. Combines with: every positives, negatives source, loss and aux term.
    Paper: SimCSE (Gao et al., 2021), Sec. 3 and its poolers.
    Example: --set encoder=plain --set pooler=avg"""

    name = "plain"
    cites = "Gao et al. (2021), SimCSE, Sec. 3"
