"""ESimCSE (Wu et al., COLING 2022, "ESimCSE: Enhanced Sample Building Method for Contrastive
Learning of Unsupervised Sentence Embedding"): its two ingredients.

- ``positives=repetition`` (Sec. 3.1): the positive is the sentence's sub-word sequence with some
  sub-words repeated, so that a positive pair no longer shares its length. ``dup_len`` is drawn
  uniformly from ``[0, max(2, int(dup_rate * N))]`` (N: the sentence's sub-words), then
  ``dup_len`` of the sub-words, drawn uniformly without replacement, each appear twice. The
  authors' code (``dup_type=bpe``, ``fidelity: authors_code``) draws ``dup_len`` with
  ``randrange(min(10, int(dup_rate * n)))`` where n counts [CLS] and [SEP] too (nothing when that
  is 0). Either way the repetition acts on the token ids after truncation to ``max_len``, as the
  authors' code does, so the positive is up to that many sub-words longer than its anchor.
- ``negatives=momentum_queue`` (Sec. 3.2): a momentum copy of the encoder,
  ``theta_m <- lambda * theta_m + (1 - lambda) * theta_e``, embeds each step's sentences without
  dropout (the authors' code: ``model.eval()``, through the trained projection); the last
  ``queue_size`` of those embeddings, from earlier steps, are extra negatives of every anchor:
  ``l_i = -log e^{sim(h_i, h_i+)/tau} / (sum_j e^{sim(h_i, h_j+)/tau} + sum_m e^{sim(h_i, h_m)/tau})``,
  m over the queue (``methods.losses.InfoNCE`` with ``Views.columns``).

The queue and the momentum copy are the recipe's state across steps (``MomentumState``): made
with the model, updated after each optimiser step (``after_step``: this step's embeddings
queued, then the momentum update from the stepped encoder, which is the authors' update at the
start of the next step), saved in every state checkpoint with the model (``--resume`` restores
them) and left out of what is exported (only the encoder is). Under DDP the queue holds the
all-gathered embeddings in rank order, the same on every worker, and every worker makes the same
momentum update from the same averaged weights.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import numpy as np
import torch
from torch import nn

from methods.ingredients import (Ingredient, NegativesSource, Params, Positives, check, cited, counter_uniforms,
                                 derive_seed)
from methods.losses import gather_with_grad, rank

MAX_REPEATS = 10  # the authors' cap on dup_len (min(10, ...))


def repetition_count(lengths: torch.Tensor, dup_rate: float, u: torch.Tensor, fidelity: str) -> torch.Tensor:
    """``dup_len`` of each row from its token count ``lengths`` ([CLS] and [SEP] included) and a
    uniform ``u`` in [0, 1): Sec. 3.1's ``uniform[0, max(2, int(dup_rate * N))]`` over N = the
    sentence's sub-words (at most N), or the authors' ``randrange(min(10, int(dup_rate * n)))``."""
    if fidelity == "authors_code":
        k = torch.clamp((dup_rate * lengths).floor().long(), max=MAX_REPEATS)
        return torch.where(k > 0, (u * k).floor().long(), torch.zeros_like(k))
    words = (lengths - 2).clamp(min=0)
    top = torch.clamp((dup_rate * words).floor().long(), min=2)
    return torch.minimum((u * (top + 1)).floor().long(), words)


def most_repeats(width: int, dup_rate: float, fidelity: str) -> int:
    """The most sub-words ``repetition_count`` adds to a row of ``width`` tokens (the positive's
    extra width, known without reading the lengths back from the device)."""
    if fidelity == "authors_code":
        return max(min(MAX_REPEATS, int(dup_rate * width)) - 1, 0)
    words = max(width - 2, 0)
    return min(max(2, int(dup_rate * words)), words)


def repeat_tokens(inputs: dict[str, torch.Tensor], counts: torch.Tensor, keys: torch.Tensor,
                  extra: int) -> dict[str, torch.Tensor]:
    """``inputs`` (padded rows, ``attention_mask`` 1 on each row's n tokens) with, in row i, the
    ``counts[i]`` sub-words of positions 1..n-2 (not [CLS], not the closing [SEP]) whose ``keys``
    are smallest each repeated in place: a uniform draw without replacement when the keys are iid
    uniform. The rows get ``extra`` more columns (``most_repeats``), padded with 0 as ``pad_cat`` pads."""
    mask = inputs["attention_mask"]
    b, width = mask.shape
    n = mask.sum(1, keepdim=True)
    position = torch.arange(width, device=mask.device).unsqueeze(0)
    eligible = (position >= 1) & (position <= n - 2)
    order = keys.masked_fill(~eligible, float("inf")).argsort(dim=1).argsort(dim=1)
    twice = (eligible & (order < counts.unsqueeze(1))).long()
    copies = mask.long() * (1 + twice)
    start = copies.cumsum(1) - copies  # where each token's first copy goes; padding lands past the row's end
    out = {}
    for key, x in inputs.items():
        if x.dim() != 2:
            out[key] = x
            continue
        made = x.new_zeros(b, width + extra + 1)  # one spare column for the padding's writes
        values = x * mask.to(x.dtype)
        made.scatter_(1, start, values)
        made.scatter_(1, start + twice, values)
        out[key] = made[:, : width + extra]
    out["attention_mask"] = (torch.arange(width + extra, device=mask.device).unsqueeze(0)
                             < copies.sum(1, keepdim=True)).to(mask.dtype)
    return out


@dataclasses.dataclass
class RepetitionParams(Params):
    dup_rate: float = cited(0.32, (
        "The share of sub-words that may repeat (Wu et al., 2022, Sec. 3.1 and 5.2: 0.32 for BERT-base; the authors' "
        "run.sh: 0.32 for BERT, 0.3 for RoBERTa-base, 0.28 for RoBERTa-large)."))

    def validate(self) -> None:
        check([(0.0 <= self.dup_rate <= 1.0, f"dup_rate must be in [0, 1], got {self.dup_rate}")])


def plain_encoder_only(cls: type[Ingredient], spec) -> str | None:
    """The refusal of an ingredient that works on plain sentences' token ids, under a prompt."""
    if spec.encoder != "plain":
        return (f"invalid recipe: {cls.kind}={cls.name} works on the sentence's own sub-words and a plain encoder's "
                f"pooling; encoder={spec.encoder} puts them in a template: use encoder=plain")
    return None


class RepetitionPositives(Positives):
    """``positives=repetition``: the sentence with some of its sub-words repeated (ESimCSE's word
    repetition), so that a positive pair no longer shares its length; drawn afresh at every step,
    a function of the seed, the step and the row.

    Inputs: the corpus's sentences, tokenised; nothing generated.
    Requires: encoder=plain. Combines with: every negatives source, loss and aux term.
    Paper: ESimCSE (Wu et al., 2022), Sec. 3.1.
    Example: --set positives=repetition --set dup_rate=0.32"""

    name = "repetition"
    Params = RepetitionParams
    cites = "Wu et al. (2022), ESimCSE, Sec. 3.1"
    space = "esimcse"
    column = "sentence"

    @classmethod
    def refusal(cls, spec) -> str | None:
        return plain_encoder_only(cls, spec)

    def rows(self, batch: dict[str, Any], step: int, seed: int) -> dict[str, torch.Tensor]:
        """The step's positives. The draws are a function of the seed, the step and each row's place
        in the global batch (this worker's rows follow the lower ranks'), drawn on the host and
        copied over: the same positives whatever the workers, the padding or GradCache's chunks."""
        anchors = batch[self.column]
        mask = anchors["attention_mask"]
        n, width = mask.shape
        rows = rank() * n + np.arange(n)
        u = counter_uniforms(derive_seed(seed, "repetition-count", step), rows)
        keys = counter_uniforms(derive_seed(seed, "repetition-positions", step), rows[:, None], np.arange(width)[None, :])
        u, keys = (torch.from_numpy(x).float().to(mask.device, non_blocking=True) for x in (u, keys))
        fidelity = self.shared.fidelity if self.shared is not None else "paper"
        counts = repetition_count(mask.sum(1), self.params.dup_rate, u, fidelity)
        return repeat_tokens(anchors, counts, keys, most_repeats(mask.shape[1], self.params.dup_rate, fidelity))


@dataclasses.dataclass
class MomentumQueueParams(Params):
    queue_size: int = cited(160, (
        "Embeddings in the queue (the authors' run.sh --neg_size: 160 for BERT-base, BERT-large and RoBERTa-base, 2.5 "
        "times their batch of 64; 128 for RoBERTa-large)."))
    momentum: float = cited(0.995, "lambda of the momentum update (Wu et al., 2022, Sec. 3.2 and 5.3; run.sh)")

    def validate(self) -> None:
        check([(self.queue_size >= 1, f"queue_size must be >= 1, got {self.queue_size}"),
               (0.0 <= self.momentum < 1.0, f"momentum must be in [0, 1), got {self.momentum}")])


class MomentumState(nn.Module):
    """The momentum queue's state: a frozen copy of the encoder (``encoder``), the queue of its
    embeddings (``queue``, oldest first, ``filled`` of its rows in use) and this step's embeddings
    waiting for ``after_step`` (not saved: a checkpoint is taken between steps)."""

    def __init__(self, encoder: nn.Module, size: int, dim: int):
        super().__init__()
        tokenizer = getattr(encoder, "tokenizer", None)  # shared, not copied
        self.encoder = copy.deepcopy(encoder, memo={id(tokenizer): tokenizer}).requires_grad_(False)
        self.register_buffer("queue", torch.zeros(size, dim))
        self.filled = 0  # a number of steps' doing, kept on the host: reading it never waits for the device
        self.pending: torch.Tensor | None = None

    def get_extra_state(self) -> dict:
        return {"filled": self.filled}

    def set_extra_state(self, state: dict) -> None:
        self.filled = int(state["filled"])

    def columns(self) -> torch.Tensor:
        """The queued embeddings, oldest first."""
        return self.queue[self.queue.shape[0] - self.filled:]

    @torch.no_grad()
    def push(self, z: torch.Tensor) -> None:
        """``z`` queued behind the others; the oldest leave once ``queue_size`` is reached (the authors'
        ``torch.cat((queue, z))[-neg_size:]``)."""
        size = self.queue.shape[0]
        joined = torch.cat([self.queue, z.to(self.queue.dtype)])[-size:]
        self.queue.copy_(joined)
        self.filled = min(self.filled + z.shape[0], size)

    @torch.no_grad()
    def follow(self, encoder: nn.Module, momentum: float) -> None:
        """Sec. 3.2's update, ``theta_m <- lambda theta_m + (1 - lambda) theta_e``, parameter by parameter."""
        for mine, theirs in zip(self.encoder.parameters(), encoder.parameters()):
            mine.mul_(momentum).add_(theirs.detach().to(mine.dtype), alpha=1.0 - momentum)


class MomentumQueue(NegativesSource):
    """``negatives=momentum_queue``: a momentum copy of the encoder embeds each step's sentences; the
    embeddings of the last ``queue_size`` sentences of earlier steps are extra negatives in every
    anchor's denominator (ESimCSE's momentum contrast).

    Inputs: no column: the queue is the recipe's state across steps, saved in state checkpoints.
    Requires: loss=infonce, encoder=plain, replicas=1. Combines with: every positives, the other negatives sources and aux terms.
    Paper: ESimCSE (Wu et al., 2022), Sec. 3.2.
    Example: --set negatives=momentum_queue --set queue_size=160 --set momentum=0.995"""

    name = "momentum_queue"
    Params = MomentumQueueParams
    cites = "Wu et al. (2022), ESimCSE, Sec. 3.2"
    space = "esimcse"
    embedded = True

    @classmethod
    def refusal(cls, spec) -> str | None:
        loss = next(c for c in spec.classes() if c.kind == "loss")
        if not loss.takes_columns:
            return (f"invalid recipe: negatives={cls.name} adds the queue's embeddings to InfoNCE's denominator "
                    f"(ESimCSE, Sec. 3.2); loss={spec.loss} has no place for them: use loss=infonce")
        return plain_encoder_only(cls, spec)

    def text_columns(self) -> tuple[str, ...]:
        return ()

    def state(self, encoder: nn.Module, dim: int) -> MomentumState:
        return MomentumState(encoder, self.params.queue_size, dim)

    @torch.no_grad()
    def observe(self, state: MomentumState, model: nn.Module, batch: dict[str, Any]) -> None:
        """This step's sentences embedded by the momentum copy without dropout, through the model's
        projection (the authors' ``cls.mlp``), all-gathered: queued by ``after_step``."""
        was = state.encoder.training
        state.encoder.eval()
        try:
            e = state.encoder(batch["sentence"], pooler=model.pool_with)
        finally:
            state.encoder.train(was)
        state.pending = gather_with_grad(model.project({"anchor": e}, reference=["anchor"])["anchor"].float())

    def negatives(self, state: MomentumState) -> torch.Tensor:
        return state.columns()

    def after_step(self, state: MomentumState, model: nn.Module) -> None:
        if state.pending is not None:
            state.push(state.pending)
            state.pending = None
        state.follow(model.encoder, self.params.momentum)
