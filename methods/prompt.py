"""Prompt-based sentence representations: a sentence placed in a template, embedded as the last
layer's state at the template's [MASK], with the template's own bias removed in training.

- PromptBERT (Jiang et al., 2022): the representation of Sec. 4 (``h = h_[MASK]`` of a template
  such as "This sentence : "[X]" means [MASK]."), and Sec. 5's template positives (the second
  view is the sentence in another template) and template denoising (``h_i - h~_i``, with ``h~_i``
  the [MASK] state of the template alone, its positions after the sentence shifted by the
  sentence's length; the authors' ``get_delta``, with gradient).
- SNCSE (Wang et al., 2022): the same representation with its own templates, the sentence ended by
  " ." when it has no final punctuation, and a length limit that counts the template.
- CoT-BERT (Zhang et al., 2023, Sec. 3): a two-stage template with two masks, the last one the
  embedding, and denoising with the template around [PAD] tokens in place of the sentence, attended
  (the authors' ``denoising``).

Templates are written with ``{sentence}`` and ``{mask}`` (the tokenizer's mask token): the text
before ``{sentence}`` is tokenised as the prefix and the text after it as the suffix, each without
special tokens, exactly as the authors' code does; the sentence's own tokens go between them, and
[CLS]/[SEP] (``<s>``/``</s>``) around all of it. ``wrap`` does this on the device, on batches the
data pipeline tokenised as plain sentences.
"""

from __future__ import annotations

import dataclasses
import functools
import string
from typing import Any

import torch

from methods.ingredients import EncoderIngredient, InvalidParams, Params, check, cited

SENTENCE, MASK = "{sentence}", "{mask}"
DENOISE = ("none", "shift", "pad")
TRUNCATION = ("sentence", "with_template")

# PromptBERT's BERT templates (kongds/Prompt-BERT ``run.sh``, unsup-bert).
PROMPTBERT_ANCHOR = 'This sentence of "{sentence}" means{mask}.'
PROMPTBERT_POSITIVE = 'This sentence : "{sentence}" means{mask}.'
# SNCSE's (train_SNCSE.py, s1 / ss1 + s2; the anchor's is also bert_evaluation.py's).
SNCSE_ANCHOR = 'This sentence : " {sentence} " means {mask} .'
SNCSE_POSITIVE = 'This sentence of " {sentence} " means {mask} .'
# CoT-BERT's BERT templates (code-for-BERT/train.py's args_list).
COTBERT_ANCHOR = 'The sentence of "{sentence}" means {mask} , so it can be summarized as {mask} . '
COTBERT_POSITIVE = 'The sentence : "{sentence}" means {mask} , so it can be summarized as {mask} . '
COTBERT_NEGATIVE = 'The sentence : "{sentence}" does not mean {mask} , so it cannot be summarized as {mask} . '


def check_template(template: str, name: str = "template") -> None:
    """One ``{sentence}``, then at least one ``{mask}`` after it (every author's templates have
    their masks after the sentence, which ``wrap`` relies on)."""
    check([
        (template.count(SENTENCE) == 1, f"{name} must contain {SENTENCE} once, got {template!r}"),
        (MASK in template.partition(SENTENCE)[2] and MASK not in template.partition(SENTENCE)[0],
         f"{name} must have its {MASK} after {SENTENCE}, got {template!r}"),
    ])


@dataclasses.dataclass(frozen=True)
class TemplateTokens:
    """A template tokenised: ``prefix`` and ``suffix`` ids, and the index in ``suffix`` of the
    mask whose state is the embedding (the last one: CoT-BERT's second)."""

    prefix: tuple[int, ...]
    suffix: tuple[int, ...]
    mask_offset: int

    @property
    def length(self) -> int:
        """Tokens of the template around an empty sentence, [CLS] and [SEP] included."""
        return len(self.prefix) + len(self.suffix) + 2


def template_tokens(tokenizer, template: str) -> TemplateTokens:
    check_template(template)
    before, _, after = template.partition(SENTENCE)
    mask = tokenizer.mask_token
    prefix = tokenizer(before.replace(MASK, mask), add_special_tokens=False)["input_ids"]
    suffix = tokenizer(after.replace(MASK, mask), add_special_tokens=False)["input_ids"]
    masks = [i for i, t in enumerate(suffix) if t == tokenizer.mask_token_id]
    if len(masks) != after.count(MASK):
        raise InvalidParams(f"template {template!r}: the tokenizer does not keep its {MASK} tokens whole")
    return TemplateTokens(tuple(prefix), tuple(suffix), masks[-1])


def end_with_punctuation(sentence: str) -> str:
    """SNCSE's " ." after a sentence whose last character is not ASCII punctuation
    (``train_SNCSE.py``, ``bert_evaluation.py``)."""
    stripped = sentence.strip()
    return sentence + " ." if not stripped or stripped[-1] not in string.punctuation else sentence


@functools.lru_cache(maxsize=64)
def _on(ids: tuple[int, ...], device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """A template's ids as a tensor on ``device``, made once: every step reads them (read-only)."""
    return torch.tensor(ids, dtype=dtype, device=device)


def wrap(inputs: dict[str, torch.Tensor], tokens: TemplateTokens, pad_id: int, budget: int | None = None,
         template: int = 0) -> dict[str, torch.Tensor]:
    """Rows tokenised as plain sentences (``[CLS] s [SEP]``, right-padded) rewritten as
    ``[CLS] prefix s[:budget] suffix [SEP]``, right-padded with ``pad_id``: the authors' ``bs + s +
    es`` (PromptBERT's ``sentemb_forward`` does the same to evaluation batches). Adds
    ``prompt_mask`` (the embedding mask's position), ``prompt_length`` (the sentence's tokens) and
    ``prompt_template`` (``template``, for denoising) per row. Shapes stay static: no host read."""
    ids, attention = inputs["input_ids"], inputs["attention_mask"]
    rows, width = ids.shape
    p, s = len(tokens.prefix), len(tokens.suffix)
    lengths = attention.sum(1)
    n = (lengths - 2).clamp(min=0)
    if budget is not None:
        n = n.clamp(max=budget)
    out_width = width + p + s
    j = torch.arange(out_width, device=ids.device).unsqueeze(0)
    out = torch.full((rows, out_width), pad_id, dtype=ids.dtype, device=ids.device)
    out[:, 0] = ids[:, 0]
    if p:
        prefix = _on(tokens.prefix, ids.device, ids.dtype)
        out = torch.where((j >= 1) & (j < 1 + p), prefix[(j - 1).clamp(0, p - 1)], out)
    sentence = (j >= 1 + p) & (j < 1 + p + n[:, None])
    out = torch.where(sentence, ids.gather(1, (j - p).clamp(0, width - 1).expand(rows, -1)), out)
    k = j - 1 - p - n[:, None]
    if s:
        suffix = _on(tokens.suffix, ids.device, ids.dtype)
        out = torch.where((k >= 0) & (k < s), suffix[k.clamp(0, s - 1)], out)
    last = ids.gather(1, (lengths - 1).clamp(min=0)[:, None])  # [SEP] / </s>
    out = torch.where(k == s, last.expand(-1, out_width), out)
    wrapped = {"input_ids": out, "attention_mask": (j < (n + p + s + 2)[:, None]).to(attention.dtype)}
    if "token_type_ids" in inputs:
        wrapped["token_type_ids"] = torch.zeros_like(out)
    wrapped["prompt_mask"] = 1 + p + n + tokens.mask_offset
    wrapped["prompt_length"] = n
    wrapped["prompt_template"] = torch.full_like(n, template)
    return wrapped


PROMPT_KEYS = ("prompt_mask", "prompt_length", "prompt_template")


def mask_states(last_hidden: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """PromptBERT's representation (Sec. 4): each row's last-layer state at its mask."""
    return last_hidden[torch.arange(last_hidden.shape[0], device=last_hidden.device), positions]


def template_bias(backbone, tokens: TemplateTokens, longest: int, method: str, cls_id: int, sep_id: int,
                  pad_id: int) -> torch.Tensor:
    """``(longest + 1, d)``: row ``n`` is the [MASK] state of the template alone for a sentence of
    ``n`` tokens, which the representation of such a sentence has subtracted (denoising).

    - ``shift`` (PromptBERT, Sec. 5, template denoising; ``get_delta``): ``[CLS] prefix suffix [SEP]``, the
      position ids from the suffix on shifted by ``n``;
    - ``pad`` (CoT-BERT, Sec. 3; ``denoising``): ``[CLS] prefix [PAD]*n suffix [SEP]``, all of it
      attended, default positions.

    Computed with gradient, in the caller's mode (dropout in training), as the authors do."""
    device = next(backbone.parameters()).device
    lengths = torch.arange(longest + 1, device=device)
    p = len(tokens.prefix)
    if method == "shift":
        ids = _on((cls_id, *tokens.prefix, *tokens.suffix, sep_id), device, torch.long).unsqueeze(0).repeat(longest + 1, 1)
        j = torch.arange(ids.shape[1], device=device)
        positions = j.unsqueeze(0) + (j >= p + 1) * lengths[:, None]
        out = backbone(input_ids=ids, position_ids=positions, return_dict=True)
        return out.last_hidden_state[:, 1 + p + tokens.mask_offset]
    if method == "pad":
        # wrap() over rows of n [PAD] "sentence" tokens builds exactly these rows.
        plain = torch.full((longest + 1, longest + 2), pad_id, device=device)
        plain[:, 0] = cls_id
        plain[lengths, lengths + 1] = sep_id
        attention = (torch.arange(longest + 2, device=device)[None] <= lengths[:, None] + 1).long()
        rows = wrap({"input_ids": plain, "attention_mask": attention}, tokens, pad_id)
        out = backbone(input_ids=rows["input_ids"], attention_mask=rows["attention_mask"], return_dict=True)
        return mask_states(out.last_hidden_state, rows["prompt_mask"])
    raise ValueError(f"unknown denoising {method!r}; choose one of {', '.join(DENOISE)}")


@dataclasses.dataclass(frozen=True)
class PromptPooling:
    """What an encoder needs to embed a sentence by its prompt at evaluation: the anchor template
    (no denoising: the authors evaluate without it) and SNCSE's final punctuation. Saved beside
    the weights (``prompt.json``)."""

    template: str
    end_punctuation: bool = False

    def prepare(self, sentence: str) -> str:
        return end_with_punctuation(sentence) if self.end_punctuation else sentence


# ------------------------------------------------------------------------------------------------
# The prompt encoder (``methods.ingredients.EncoderIngredient``'s other kind)


@dataclasses.dataclass
class PromptParams(Params):
    template: str = cited(PROMPTBERT_ANCHOR, (
        "The anchor's template, also the one evaluation embeds with: PromptBERT's BERT anchor (kongds/Prompt-BERT "
        "run.sh, unsup-bert: *cls*_This_sentence_of_\"*sent_0*\"_means*mask*.*sep+*)."))
    positive_template: str = cited(PROMPTBERT_POSITIVE, (
        "The positives' template (and every other view's: negatives, aux rows), PromptBERT's template positives "
        "(Sec. 5; run.sh's --mask_embedding_sentence_different_template). Equal to template: no template positives."))
    negative_template: str = cited(COTBERT_NEGATIVE, (
        "The template of negatives=template_negative, and only of it: CoT-BERT's (code-for-BERT/train.py), the one "
        "negative template the authors wrote."))
    denoise: str = cited("shift", (
        "Template denoising in training: 'shift' (PromptBERT Sec. 5: the template alone, positions shifted), "
        "'pad' (CoT-BERT: [PAD]s in place of the sentence), 'none' (SNCSE). Never at evaluation, as the authors."))
    truncation: str = cited("sentence", (
        "How max_len counts: 'sentence' its own tokens (PromptBERT, CoT-BERT: [:max_seq_length]), 'with_template' "
        "all of them (SNCSE: max_seq_length - len(prefix) - len(suffix) - 2)."))
    end_punctuation: bool = cited(False, "SNCSE's ' .' after a sentence without final punctuation (train and eval)")

    def validate(self) -> None:
        check_template(self.template, "template")
        check_template(self.positive_template, "positive_template")
        check_template(self.negative_template, "negative_template")
        check([(self.denoise in DENOISE, f"denoise must be one of {', '.join(DENOISE)}, got {self.denoise!r}"),
               (self.truncation in TRUNCATION,
                f"truncation must be one of {', '.join(TRUNCATION)}, got {self.truncation!r}")])


class PromptEncoder(EncoderIngredient):
    """``encoder=prompt``: the sentence in a template, embedded as the last layer's state at its
    (last) [MASK]; the positives in their own template; the template's bias subtracted in training.

    Inputs: the sentence (every text column goes through a template).
    Requires: pooler=mask, mlp_only_train. Combines with: every positives, negatives source, loss and aux term.
    Paper: PromptBERT (Jiang et al., 2022), Sec. 4-5; SNCSE's and CoT-BERT's templates by recipe.
    Example: --set encoder=prompt --set negatives=una --set denoise=shift"""

    name = "prompt"
    Params = PromptParams
    cites = "Jiang et al. (2022), PromptBERT, Sec. 4-5"
    space = "promptbert"
    pooler = "mask"

    def templates(self, negatives: bool = True) -> list[str]:
        """Anchor, positive and (with ``negatives``: a source in the negative template) negative template, by index."""
        p = self.params
        return [p.template, p.positive_template] + ([p.negative_template] if negatives and p.negative_template else [])

    def template_of(self, view: str) -> int:
        if view == "anchor":
            return 0
        return 2 if view == "negative" and self.params.negative_template else 1

    def prepare(self, sentence: str) -> str:
        return end_with_punctuation(sentence) if self.params.end_punctuation else sentence

    def token_width(self, max_len: int) -> int:
        # [CLS] + max_len of the sentence's own tokens + [SEP]: wrap() cuts to each template's budget.
        return max_len + 2

    def budget(self, tokens: TemplateTokens, max_len: int) -> int:
        return max_len if self.params.truncation == "sentence" else max(0, max_len - tokens.length)

    def pooling(self) -> PromptPooling:
        return PromptPooling(self.params.template, self.params.end_punctuation)


@dataclasses.dataclass
class PromptState:
    """A built recipe's prompt, tokenised for its backbone: what ``RecipeModel`` wraps and denoises with."""

    tokens: list[TemplateTokens]
    budgets: list[int]
    denoise: str
    ids: dict[str, int]  # cls, sep, pad

    @classmethod
    def build(cls, encoder: PromptEncoder, tokenizer: Any, max_len: int, negatives: bool = False) -> "PromptState":
        tokens = [template_tokens(tokenizer, t) for t in encoder.templates(negatives)]
        return cls(tokens, [encoder.budget(t, max_len) for t in tokens], encoder.params.denoise,
                   {"cls": tokenizer.cls_token_id, "sep": tokenizer.sep_token_id, "pad": tokenizer.pad_token_id})

    def wrap(self, inputs: dict[str, torch.Tensor], template: int) -> dict[str, torch.Tensor]:
        return wrap(inputs, self.tokens[template], self.ids["pad"], self.budgets[template], template)

    def denoised(self, backbone, e: torch.Tensor, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """``e`` minus each row's template bias at its sentence's length (``template_bias``)."""
        if self.denoise == "none":
            return e
        out = e
        for index, tokens in enumerate(self.tokens):
            bias = template_bias(backbone, tokens, self.budgets[index], self.denoise, self.ids["cls"], self.ids["sep"],
                                 self.ids["pad"]).to(e.dtype)
            rows = (inputs["prompt_template"] == index).unsqueeze(1)
            out = out - torch.where(rows, bias[inputs["prompt_length"].clamp(max=self.budgets[index])], 0)
        return out
