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

Evaluation follows each author's evaluation code, which differs from their training in three ways
(``PromptPooling``): PromptBERT's and CoT-BERT's test scripts end a sentence with "." before the
template is filled; every author's test script tokenises the filled template as one string (the
same ids as the spliced form on BERT's WordPiece; on a byte-level BPE such as RoBERTa's the
sentence's first word gets its leading-space token); and PromptBERT scores STS-B dev, which
selects the checkpoint, on the denoised representation (the bias computed in eval mode, without
gradient), while its final test is not denoised.
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
TOKENS = ("joined", "spliced")

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


def end_with_period(sentence: str) -> str:
    """PromptBERT's and CoT-BERT's test-time rule (``evaluation.py``'s batcher): "." after a
    sentence whose last character is not one of ``.?"'``, no space."""
    return sentence + "." if sentence and sentence[-1] not in ".?\"'" else sentence


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


PROMPT_KEYS = ("prompt_mask", "prompt_length", "prompt_template", "prompt_group")


def mask_states(last_hidden: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """PromptBERT's representation (Sec. 4): each row's last-layer state at its mask."""
    return last_hidden[torch.arange(last_hidden.shape[0], device=last_hidden.device), positions]


def template_bias(backbone, tokens: TemplateTokens, longest: int, method: str, cls_id: int, sep_id: int,
                  pad_id: int, shift_at: int | None = None) -> torch.Tensor:
    """``(longest + 1, d)``: row ``n`` is the [MASK] state of the template alone for a sentence of
    ``n`` tokens, which the representation of such a sentence has subtracted (denoising).

    - ``shift`` (PromptBERT, Sec. 5, template denoising; ``get_delta``): ``[CLS] prefix suffix [SEP]``, the
      position ids from the suffix on shifted by ``n``;
    - ``pad`` (CoT-BERT, Sec. 3; ``denoising``): ``[CLS] prefix [PAD]*n suffix [SEP]``, all of it
      attended, default positions.

    ``shift_at``: the prefix length after which positions shift (default: this template's own;
    PromptBERT's ``get_delta`` shifts every template's after the anchor's, ``len(cls.bs)``).
    Computed with gradient, in the caller's mode (dropout in training), as the authors do."""
    device = next(backbone.parameters()).device
    lengths = torch.arange(longest + 1, device=device)
    p = len(tokens.prefix)
    if method == "shift":
        ids = _on((cls_id, *tokens.prefix, *tokens.suffix, sep_id), device, torch.long).unsqueeze(0).repeat(longest + 1, 1)
        j = torch.arange(ids.shape[1], device=device)
        positions = j.unsqueeze(0) + (j >= (p if shift_at is None else shift_at) + 1) * lengths[:, None]
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
    """How an encoder embeds a sentence by its prompt outside training: the anchor template, then
    the text and token rules of one stage of the authors' evaluation. Saved beside the weights
    (``prompt.json``) with the final test's rules; the loop scores STS-B dev with the dev rules.

    - ``end_punctuation``: SNCSE's " ." (training, dev and test);
    - ``period``: PromptBERT's and CoT-BERT's "." (``end_with_period``; their final test only);
    - ``joined``: the filled template tokenised as one string (every author's test script), not the
      sentence's own tokens spliced between the template's (training, and PromptBERT's and CoT-BERT's dev);
    - ``denoise``: the template bias (``template_bias``) subtracted, in eval mode and without gradient
      (PromptBERT's dev: ``sentemb_forward`` without ``--mask_embedding_sentence_delta_no_delta_eval``)."""

    template: str
    end_punctuation: bool = False
    period: bool = False
    joined: bool = False
    denoise: str = "none"

    def __post_init__(self):
        check_template(self.template)
        check([(self.denoise in DENOISE, f"denoise must be one of {', '.join(DENOISE)}, got {self.denoise!r}")])

    def prepare(self, sentence: str) -> str:
        sentence = end_with_punctuation(sentence) if self.end_punctuation else sentence
        return end_with_period(sentence) if self.period else sentence

    def text(self, sentence: str, mask_token: str) -> str:
        """The filled template as the authors' test scripts build it (``template.replace(...).strip()``)."""
        return self.template.replace(MASK, mask_token).replace(SENTENCE, self.prepare(sentence)).strip()


def joined_rows(enc: dict[str, torch.Tensor], tokens: TemplateTokens, mask_id: int) -> dict[str, torch.Tensor]:
    """Rows of whole filled templates (``PromptPooling.text``, tokenised with padding) with the
    keys ``wrap`` gives: the embedding mask is each row's last mask token (the template's masks
    follow the sentence), and the sentence's length is the row's tokens less the template's."""
    ids = enc["input_ids"]
    j = torch.arange(ids.shape[1], device=ids.device)
    out = dict(enc)
    out["prompt_mask"] = torch.where(ids == mask_id, j, -1).max(1).values
    out["prompt_length"] = (enc["attention_mask"].sum(1) - tokens.length).clamp(min=0)
    out["prompt_template"] = torch.zeros_like(out["prompt_length"])
    return out


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
    test_template: str = cited("", (
        "The template the final test fills, where the authors' test script writes it otherwise than training "
        "tokenises it: PromptBERT's and CoT-BERT's RoBERTa scripts strip the prefix for training (train.py) but fill "
        "the unstripped one at test (evaluation.py), a space before the sentence. Empty: template."))
    test_period: bool = cited(True, (
        "The final test's text: '.' after a test sentence whose last character is not one of .?\"' before the "
        "template is filled (PromptBERT's evaluation.py batcher; CoT-BERT's code-for-BERT/evaluation.py the same). "
        "Their dev scoring in training has no such rule."))
    test_tokens: str = cited("joined", (
        "The final test's tokens: 'joined', the filled template tokenised as one string (PromptBERT's and CoT-BERT's "
        "evaluation.py, SNCSE's *_prediction.py); 'spliced', the sentence's own tokens between the template's, as in "
        "training. Equal on BERT's WordPiece; on RoBERTa's BPE the sentence's first word gets its leading space."))
    dev_tokens: str = cited("spliced", (
        "STS-B dev's tokens (checkpoint selection): 'spliced' (PromptBERT's and CoT-BERT's sentemb_forward wraps the "
        "dev sentence's ids) or 'joined' (SNCSE selects with bert_evaluation.py / roberta_evaluation.py)."))
    dev_denoise: bool = cited(True, (
        "STS-B dev scored on the denoised representation, the bias computed in eval mode without gradient "
        "(PromptBERT's run.sh trains with --mask_embedding_sentence_delta and without ..._no_delta_eval: "
        "sentemb_forward subtracts it); the final test never denoises. No effect with denoise=none."))

    def validate(self) -> None:
        check_template(self.template, "template")
        check_template(self.positive_template, "positive_template")
        check_template(self.negative_template, "negative_template")
        if self.test_template:
            check_template(self.test_template, "test_template")
        check([(self.denoise in DENOISE, f"denoise must be one of {', '.join(DENOISE)}, got {self.denoise!r}"),
               (self.truncation in TRUNCATION,
                f"truncation must be one of {', '.join(TRUNCATION)}, got {self.truncation!r}")] +
              [(getattr(self, key) in TOKENS, f"{key} must be one of {', '.join(TOKENS)}, got {getattr(self, key)!r}")
               for key in ("test_tokens", "dev_tokens")])


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

    def pooling(self, stage: str = "test") -> PromptPooling:
        """How evaluation embeds: the final ``test``'s rules (saved with the model) or ``dev``'s
        (STS-B dev in training, which selects the checkpoint)."""
        p = self.params
        if stage == "dev":
            return PromptPooling(p.template, p.end_punctuation, joined=p.dev_tokens == "joined",
                                 denoise=p.denoise if p.dev_denoise else "none")
        return PromptPooling(p.test_template or p.template, p.end_punctuation, period=p.test_period,
                             joined=p.test_tokens == "joined")


@dataclasses.dataclass
class PromptState:
    """A built recipe's prompt, tokenised for its backbone: what ``RecipeModel`` wraps and denoises with.

    ``groups``: the replicas (``SharedParams.replicas``) this worker's rows belong to; each gets a
    template bias of its own (its own dropout), as each of the authors' DataParallel replicas
    computes its own. ``shift_at``: PromptBERT's code shifts every template's bias after the
    anchor's prefix (``fidelity=authors_code``); None: each template after its own."""

    tokens: list[TemplateTokens]
    budgets: list[int]
    denoise: str
    ids: dict[str, int]  # cls, sep, pad
    groups: tuple[int, ...] = (0,)
    shift_at: int | None = None

    @classmethod
    def build(cls, encoder: PromptEncoder, tokenizer: Any, max_len: int, negatives: bool = False,
              groups: tuple[int, ...] = (0,)) -> "PromptState":
        tokens = [template_tokens(tokenizer, t) for t in encoder.templates(negatives)]
        shift_at = len(tokens[0].prefix) if encoder.shared is not None and encoder.shared.fidelity == "authors_code" else None
        return cls(tokens, [encoder.budget(t, max_len) for t in tokens], encoder.params.denoise,
                   {"cls": tokenizer.cls_token_id, "sep": tokenizer.sep_token_id, "pad": tokenizer.pad_token_id},
                   groups, shift_at)

    def wrap(self, inputs: dict[str, torch.Tensor], template: int, groups: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """``inputs`` in template ``template``; ``groups``: each row's replica (default the first)."""
        rows = wrap(inputs, self.tokens[template], self.ids["pad"], self.budgets[template], template)
        if len(self.groups) > 1:
            rows["prompt_group"] = groups if groups is not None else torch.full_like(rows["prompt_length"], self.groups[0])
        return rows

    def denoised(self, backbone, e: torch.Tensor, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """``e`` minus each row's template bias at its sentence's length (``template_bias``), one
        bias per template and replica."""
        if self.denoise == "none":
            return e
        out = e
        for index, tokens in enumerate(self.tokens):
            for group in self.groups:
                bias = template_bias(backbone, tokens, self.budgets[index], self.denoise, self.ids["cls"],
                                     self.ids["sep"], self.ids["pad"], self.shift_at).to(e.dtype)
                rows = inputs["prompt_template"] == index
                if len(self.groups) > 1:
                    rows = rows & (inputs["prompt_group"] == group)
                out = out - torch.where(rows.unsqueeze(1), bias[inputs["prompt_length"].clamp(max=self.budgets[index])], 0)
        return out
