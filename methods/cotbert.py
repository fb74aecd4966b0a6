"""CoT-BERT (Zhang et al., 2023): a negative that is the sentence itself in a negating template,
and the contrastive loss whose denominator extends over it (Eq. 3).

The two-stage templates, the embedding at the last of their two masks and the denoising with
[PAD] tokens are the prompt encoder's (``methods.prompt``, set by the ``cotbert`` recipe); this
module holds what is CoT-BERT's own. The authors' code: ``models.py`` (``cl_forward``).
"""

from __future__ import annotations

import dataclasses
import torch
import torch.nn.functional as F

from methods.ingredients import NegativesSource, Params, cited
from methods.losses import Loss, Views, cosine_matrix, full_precision, info_nce


def cot_info_nce(z1: torch.Tensor, z2: torch.Tensor, z3: torch.Tensor, temperature: float,
                 positive_negatives: bool = True, valid: torch.Tensor | None = None) -> torch.Tensor:
    """CoT-BERT's extended InfoNCE (Zhang et al., 2023, Eq. 3), mean over i of
    ``-log a_ii+ / sum_j (a_ij+ + a_ij- + a_i+j-)``, ``a_xy = exp(cos(x, y) / tau)``: anchor i
    against every positive and every negative, and positive i against every negative. The
    authors' ``cl_forward`` concatenates ``[z1 z2^T, z1 z3^T, z2 z3^T]`` with target i.
    ``positive_negatives=False``: without ``a_i+j-`` (the paper's ablation). ``valid`` (one bool
    per row of z3) drops negatives that do not exist. In float32 under any autocast."""
    keep = valid if valid is not None else torch.ones(z3.shape[0], dtype=torch.bool, device=z3.device)
    blocks = [cosine_matrix(z1, z2), cosine_matrix(z1, z3)]
    if positive_negatives:
        blocks.append(cosine_matrix(z2, z3))
    with full_precision(z1.device):
        logits = torch.cat([blocks[0]] + [b.masked_fill(~keep[None, :], float("-inf")) for b in blocks[1:]], 1)
        labels = torch.arange(z1.shape[0], device=z1.device)
        return F.cross_entropy(logits / temperature, labels)


class TemplateNegatives(NegativesSource):
    """``negatives=template_negative``: each sentence in the prompt's negative template (CoT-BERT's
    "does not mean ..., so it cannot be summarized as ..."), encoded in the anchors' pass.

    Inputs: the sentence, in ``negative_template``.
    Requires: encoder=prompt with a negative_template. Combines with: ``cot``, ``infonce``, ``hince``, ``ntxent``; not ``symmetric``.
    Paper: CoT-BERT (Zhang et al., 2023), Sec. 3 (the negative template).
    Example: --set encoder=prompt --set negatives=template_negative --set loss=cot"""

    name = "template_negative"
    cites = "Zhang et al. (2023), CoT-BERT, Sec. 3"
    column = "sentence"
    view = "negative"


@dataclasses.dataclass
class CoTParams(Params):
    positive_negatives: bool = cited(True, (
        "The a_i+j- terms (positive i against every negative) in Eq. 3's denominator; false: the paper's ablation "
        "(79.11 / 80.30 without them)."))


class CoTLoss(Loss):
    """CoT-BERT's extended InfoNCE (Zhang et al., 2023, Eq. 3): the anchor against every positive
    and every negative, and the positive against every negative, in one denominator.

    Views: anchors h_i, positives h_i+ and the active sources' negatives h_j- (all-gathered, invalid
    ones dropped). Loss, mean over i: ``-log a_ii+ / sum_j (a_ij+ + a_ij- + a_i+j-)`` with
    ``a_xy = exp(cos(x, y) / tau)``. A step without active negatives is InfoNCE.

    Inputs: anchors, positives and each active source's negatives.
    Requires: a negatives source. Combines with: ``template_negative``, ``una``, ``san``, every positives and aux term.
    Paper: CoT-BERT (Zhang et al., 2023), Eq. 3.
    Example: --set encoder=prompt --set negatives=template_negative --set loss=cot --set positive_negatives=false"""

    name = "cot"
    Params = CoTParams
    cites = "Zhang et al. (2023), CoT-BERT, Eq. 3"
    space = "cotbert"
    needs_negatives = True

    def forward(self, v: Views) -> torch.Tensor:
        if not v.negatives:
            return info_nce(v.anchor, v.positive, self.shared.temperature)
        return cot_info_nce(v.anchor, v.positive, torch.cat([n.z for n in v.negatives]), self.shared.temperature,
                            self.params.positive_negatives, torch.cat([n.valid for n in v.negatives]))
