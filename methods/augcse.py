"""AugCSE (Tang et al., 2022) as ``aux=augcse``: diverse augmentations and an antagonistic
discriminator on top of the recipe's contrastive loss.

Augmentations (``methods.augmentations``) are generated once per corpus; at train time each
sentence gets one of the set's augmentations, sampled uniformly, and the label of the pair is
that augmentation's name, or "no augmentation" when the text came back unchanged.

The augmented rows join the anchors' and positives' forward pass ([x; x; x_aug], 3B rows,
independent dropout masks), every row pooled with [CLS] before BERT's pooler and projected by the
batch-normalised MLP g (d -> 2d -> d, DiffCSE's projector, training only), which this term brings
as the recipe's projection. Then

- Eq. 2, contrastive: SimCSE's InfoNCE between the two views g(h), g(h+) of the original
  sentence (augmentations are never positives);
- Eq. 3, discriminator: D(GRL([g(h); g(h_aug)])) predicts the augmentation type, binary cross
  entropy against the one-hot type (incl. "no augmentation"); L = L_contrastive + lambda * L_disc.

The gradient-reversal layer is the identity forward and multiplies the gradient by
``grl_multiplier`` backward: -1 (default) makes the encoder work against the discriminator while
the discriminator itself still learns to classify (antagonistic; Table 7 sweeps -100 ... 100;
App. A.4). The authors' code spells this ``gradient_reverse_multiplier = m`` with gradient x (-m),
i.e. ``grl_multiplier = -m`` here. The discriminator (App. A.5) has dropout 0.2 before each Linear,
Tanh between them and a Tanh on its output logits, as the paper's listing and the authors' code
both end it.

Sampling (footnote 6, fixed sampling): each sentence's augmentation is drawn once, from a hash of
the sentence and the run's seed, so every epoch pairs a sentence with the same augmentation. The
augmentations' own choices derive from the run's seed too (and the sentence): another seed,
other augmented columns, generated and cached apart.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from methods.augmentations import (
    AUGMENTATIONS,
    NO_AUGMENTATION,
    load_spacy_parser,
    require_wordnet,
    resolve_set,
    sentence_seed,
    substitutes,
)
from methods.ingredients import AuxTerm, Draws, GeneratedColumn, InvalidParams, Params, StepOutputs, check, cited
from methods.losses import global_mean, world_size

# Bump when an augmentation's output changes, so cached generations are not reused.
AUGMENTATION_VERSION = 2  # 2: RandomSwap as Tang et al. build it (10% of the words, at most 30)


@dataclasses.dataclass
class AugCSEParams(Params):
    augmentations: str = cited("8-aug", "a set (4-aug, 8-aug, 12-aug) or comma-separated names")
    lambda_disc: float = cited(5e-3, "lambda, Tang et al. App. A.7 (BERT-base, STS); grid 1e-5 ... 1e-2")
    grl_multiplier: float = cited(-1.0, "gradient x this through the GRL; -1 antagonistic (Table 7)")
    disc_dropout: float = cited(0.2, "dropout before each of the discriminator's Linear layers (App. A.5)")
    disc_layers: int = cited(2, "Linear(2d, 4d) + Tanh, ..., Linear(4d, types)")
    spacy_model: str = cited("en_core_web_sm", "the parser of the rule-based augmentations (NL-Augmenter's)")
    nltk_data: str = cited("", "a folder with corpora/wordnet.zip; empty: NLTK's search path ($NLTK_DATA)")

    def validate(self) -> None:
        resolve_set(self.augmentations)
        check([
            (self.lambda_disc >= 0, f"lambda_disc must be >= 0, got {self.lambda_disc}"),
            (0 <= self.disc_dropout < 1, f"disc_dropout must be in [0, 1), got {self.disc_dropout}"),
            (self.disc_layers >= 2, f"disc_layers must be >= 2, got {self.disc_layers}"),
        ])

    def validate_batch(self, batch_size: int) -> None:
        check([(batch_size >= 2, "AugCSE's batch-normalised projector needs a batch of at least 2")])


class GradientReversal(torch.autograd.Function):
    """Identity forward; backward multiplies the gradient by ``multiplier`` (Ganin & Lempitsky,
    2015; AugCSE Eq. 3 with multiplier -1)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, multiplier: float) -> torch.Tensor:
        ctx.multiplier = multiplier
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad * ctx.multiplier, None


def grad_reverse(x: torch.Tensor, multiplier: float) -> torch.Tensor:
    return GradientReversal.apply(x, multiplier)


class BatchNormProjector(nn.Module):
    """g: Linear(d, 2d) + BN + ReLU + Linear(2d, d) + BN without affine (DiffCSE's projector,
    used by AugCSE in training only).

    ``forward(x, reference)``: in training, the batch statistics of the rows ``reference`` marks
    (the step's own batch) normalise every row, and only they update the running statistics: a
    recipe's negatives are projected with their anchors' statistics, not their own. Under DDP the
    statistics are the whole batch's, over every worker (``GlobalMoments``): two GPUs train as one
    (the authors trained on one)."""

    uses_batch_statistics = True

    def __init__(self, hidden: int):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(hidden, 2 * hidden, bias=False), nn.BatchNorm1d(2 * hidden), nn.ReLU(),
            nn.Linear(2 * hidden, hidden, bias=False), nn.BatchNorm1d(hidden, affine=False),
        )

    def forward(self, x: torch.Tensor, reference: torch.Tensor | None = None) -> torch.Tensor:
        if not self.training or (reference is None and world_size() == 1):
            return self.net(x)
        if reference is None:  # DDP: every row is the batch's, normalised with the whole batch's moments
            reference = torch.ones(len(x), dtype=torch.bool, device=x.device)
        for layer in self.net:
            x = batch_norm_from(layer, x, reference) if isinstance(layer, nn.BatchNorm1d) else layer(x)
        return x


def batch_norm_from(bn: nn.BatchNorm1d, x: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """``bn`` in training mode with the mean and (biased) variance of the rows ``reference``
    marks applied to every row of ``x``; the running statistics move with those rows alone, as
    ``nn.BatchNorm1d`` moves them (momentum, unbiased variance). The statistics and the
    normalisation in float32 whatever the autocast, the output in ``x``'s dtype, as
    ``nn.BatchNorm1d``'s kernels do: fp16 sums of squared rows overflow, and bf16's would make two
    workers' statistics differ from one process's."""
    dtype, x = x.dtype, x.float()
    ref = x[reference]
    if world_size() > 1:  # the whole batch's moments across DDP workers, as one process computes them
        mean, var, n = GlobalMoments.apply(ref)
    else:
        mean, var, n = ref.mean(0), ref.var(0, unbiased=False), ref.shape[0]
    with torch.no_grad():
        bn.running_mean.mul_(1 - bn.momentum).add_(bn.momentum * mean)
        bn.running_var.mul_(1 - bn.momentum).add_(bn.momentum * var * n / max(n - 1, 1))
        bn.num_batches_tracked += 1
    y = (x - mean) / torch.sqrt(var + bn.eps)
    return (y * bn.weight + bn.bias if bn.affine else y).to(dtype)


class GlobalMoments(torch.autograd.Function):
    """Mean and biased variance over the rows of every DDP worker (and their number), as
    ``nn.SyncBatchNorm`` computes them: summed across workers in the forward, and the gradients
    of the moments summed across workers in the backward, since every worker's loss depends on
    every worker's rows through them. With the loop's x W and DDP's averaging, the applied gradient
    is one process's on the whole batch (tested with two gloo workers)."""

    @staticmethod
    def forward(ctx, rows: torch.Tensor):
        import torch.distributed as dist

        rows = rows.float()  # the moments in float32 (batch_norm_from passes float32 already)
        sums = torch.cat([rows.sum(0), rows.new_tensor([rows.shape[0]])])
        dist.all_reduce(sums)
        n = int(sums[-1])
        mean = sums[:-1] / n
        squares = ((rows - mean) ** 2).sum(0)  # about the global mean: as exact as one process's var
        dist.all_reduce(squares)
        var = squares / n
        ctx.save_for_backward(rows, mean)
        ctx.n = n
        return mean, var, n

    @staticmethod
    def backward(ctx, grad_mean: torch.Tensor, grad_var: torch.Tensor, _grad_n):
        import torch.distributed as dist

        rows, mean = ctx.saved_tensors
        grads = torch.cat([grad_mean, grad_var])
        dist.all_reduce(grads)
        d = rows.shape[1]
        return grads[:d] / ctx.n + grads[d:] * 2 * (rows - mean) / ctx.n


class AugmentationDiscriminator(nn.Module):
    """MLP over [g(h); g(h_aug)] (2d) predicting the augmentation type: dropout before every
    Linear, Tanh between them (the authors' ``AugmentationDiscriminator``)."""

    def __init__(self, in_dim: int, num_types: int, layers: int = 2, dropout: float = 0.2, tanh_logits: bool = True):
        super().__init__()
        dims = [in_dim] + [2 * in_dim] * (layers - 1) + [num_types]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.dropout = nn.Dropout(dropout)
        self.tanh_logits = tanh_logits

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(self.dropout(x))
            if i < len(self.layers) - 1 or self.tanh_logits:
                x = torch.tanh(x)
        return x


def discriminator_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """BCE between sigmoid(logits) and the one-hot augmentation type, averaged over rows and
    types (AugCSE Eq. 3)."""
    target = F.one_hot(labels, logits.shape[1]).to(logits.dtype)
    return F.binary_cross_entropy_with_logits(logits.float(), target.float())


class AugCSE(AuxTerm):
    """``aux=augcse``: brings the batch-normalised projector g, adds the augmented rows to the shared
    forward pass and lambda x BCE of a discriminator behind gradient reversal.

    Inputs: each epoch's augmented sentences and their labels, from the ``augmentations`` set.
    Requires: spaCy's English model and WordNet (``nltk_data``). Combines with: every positives, negatives source and loss; not ``vascl``.
    Paper: AugCSE (Tang et al., 2022), Sec. 3, Eq. 2-3, App. A.
    Example: --set aux=augcse --set lambda_disc=0.01 --set augmentations=4-aug"""

    name = "augcse"
    Params = AugCSEParams
    cites = "Tang et al. (2022), AugCSE, Sec. 3, Eq. 2-3, App. A"
    space = "augcse"
    # Encoder pooling under the projector: [CLS] of the last layer (the authors' 'cls'); evaluation
    # uses the same pooling without the projector.
    default_pooler = "cls_before_pooler"
    brings_projection = True
    augments_per_epoch = True
    config_defaults = {"precision": ("fp32", "Tang et al.'s STS-B script (run_train_exp.py) passes no --fp16 to the "
                                             "HF Trainer: fp32")}

    @property
    def names(self) -> list[str]:
        return resolve_set(self.params.augmentations)

    @property
    def labels(self) -> list[str]:
        """Discriminator classes: "no augmentation", then the set's augmentations in order."""
        return [NO_AUGMENTATION] + self.names

    def preflight(self) -> None:
        augs = [AUGMENTATIONS[n] for n in self.names]
        if any(a.uses_wordnet for a in augs):
            require_wordnet(self.params.nltk_data)
        if any(a.uses_spacy for a in augs):
            load_spacy_parser(self.params.spacy_model)

    def generated_columns(self, seed: int = 0) -> list[GeneratedColumn]:
        p = self.params
        group = {"seed": seed, "spacy_model": p.spacy_model, "nltk_data": p.nltk_data}
        columns = []
        for name in self.names:
            key = {"augmentation": name, "seed": seed, "version": AUGMENTATION_VERSION}
            if AUGMENTATIONS[name].uses_spacy:
                key["spacy_model"] = p.spacy_model  # the parse decides the output
            columns.append(GeneratedColumn(f"aug_{name}", generator="methods.augmentations:AugmentationGenerator",
                                           kwargs=key, group=group, cpu_bound=True))
        return columns

    def run_tags(self) -> dict[str, str]:
        found = substitutes(self.params.augmentations)
        return {"augcse_substitutes": ", ".join(found)} if found else {}

    def augment(self, batch: dict[str, Any], state: Any, draws: Draws) -> dict[str, Any]:
        """One augmentation per sentence, uniformly from the set and fixed across epochs (footnote
        6: a hash of the sentence and the run's seed); unchanged text is labelled "no
        augmentation". The generated ``aug_*`` columns are dropped: the step needs only these."""
        names = np.asarray(self.names, dtype=object)
        sentences = np.asarray(batch["sentence"], dtype=object)
        table = np.stack([np.asarray(batch[f"aug_{n}"], dtype=object) for n in names], axis=1)
        pick = np.fromiter((sentence_seed(draws.seed, "augcse-pick", str(s)) % len(names)
                            for s in sentences), dtype=np.int64, count=len(sentences))
        augmented = table[np.arange(len(sentences)), pick]
        labels = np.where(augmented == sentences, NO_AUGMENTATION, names[pick]).astype(object)
        kept = {k: v for k, v in batch.items() if not k.startswith("aug_")}
        return {**kept, "sentence": sentences, "augmented": augmented, "aug_label": labels}

    def text_columns(self) -> tuple[str, ...]:
        return ("augmented",)

    def tensor_columns(self, batch: dict[str, Any], device) -> dict[str, torch.Tensor]:
        index = {label: i for i, label in enumerate(self.labels)}
        try:
            ids = [index[str(label)] for label in batch["aug_label"]]
        except KeyError as exc:
            raise InvalidParams(f"aug_label {exc.args[0]!r} is not one of this run's augmentations") from None
        return {"aug_label": torch.tensor(ids, dtype=torch.long, device=device)}

    def projection(self, hidden: int) -> nn.Module:
        return BatchNormProjector(hidden)

    def heads(self, hidden: int) -> nn.Module:
        return AugmentationDiscriminator(2 * hidden, len(self.labels), self.params.disc_layers, self.params.disc_dropout)

    def extra_rows(self, batch: dict[str, Any]) -> list:
        return [batch["augmented"]]

    def forward(self, out: StepOutputs) -> tuple[torch.Tensor, dict[str, Any]]:
        p = self.params
        labels = out.batch["aug_label"]
        features = grad_reverse(torch.cat([out.z["anchor"], out.z["augcse"]], dim=1), p.grl_multiplier)
        logits = out.model.heads["augcse"](features)
        disc = global_mean(discriminator_loss(logits, labels))
        accuracy = global_mean((logits.detach().argmax(1) == labels).float().mean())
        return p.lambda_disc * disc, {"disc_loss": disc.detach(), "disc_accuracy": accuracy}
