"""SNCSE (Wang et al., 2022): soft negatives (each sentence negated by rules) and the bidirectional
margin loss (BML) that keeps a sentence's negation less similar to it than its positive, but not
by much, added to InfoNCE with the soft negatives outside InfoNCE's denominator.

The negation follows the authors' ``generate_soft_negative_samples.py`` (``convert_to_negation``)
over spaCy's parse; the loss their ``SNCSE/simcse/models.py`` (``cl_forward``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from methods.ingredients import AuxTerm, GeneratedColumn, Params, StepOutputs, check, cited
from methods.losses import global_mean
from methods.prompt import end_with_punctuation
from methods.augmentations import load_spacy_parser

# The authors' words negated by a following "not" when they are the ROOT.
SPECIAL_WORDS = ("am", "is", "was", "are", "were", "can", "could", "will", "would", "shall", "should", "may",
                 "must", "might")


def negation(doc) -> str:
    """A parsed sentence negated by SNCSE's rules, in their order (``convert_to_negation``):

    1. a token "not" exists: delete the first;
    2. else, scanning the dependency labels in order, an ``aux``/``auxpass`` before the ROOT:
       "not" after the first of them;
    3. else the ROOT: a special word (a modal or a form of "be") gets "not" after it; a VBP, VBZ or
       VBD verb becomes "do/does/did not" + its lemma; anything else, "Not" before the sentence;
    4. no aux and no ROOT: "Not" before the sentence.

    Tokens are joined by single spaces, as the authors write them."""
    tokens = [t.text for t in doc]
    deps = [t.dep_ for t in doc]
    if "not" in tokens:
        del tokens[tokens.index("not")]
        return " ".join(tokens)
    first = next((d for d in deps if d in ("aux", "auxpass", "ROOT")), None)
    if first in ("aux", "auxpass"):
        i = next(i for i, d in enumerate(deps) if d in ("aux", "auxpass"))
        tokens[i] += " not"
    elif first == "ROOT":
        i = deps.index("ROOT")
        tag, lemma = doc[i].tag_, doc[i].lemma_
        if tokens[i].lower() in SPECIAL_WORDS:
            tokens[i] += " not"
        elif tag in ("VBP", "VBZ", "VBD"):
            tokens[i] = {"VBP": "do", "VBZ": "does", "VBD": "did"}[tag] + " not " + lemma
        else:
            tokens.insert(0, "Not")
    else:
        tokens.insert(0, "Not")
    return " ".join(tokens)


class SoftNegatives:
    """Ray Data callable over ``{"sentence": [...]}`` batches: adds ``soft_negative``.
    ``fidelity="authors_code"``: a sentence without final punctuation gets "Not " + the sentence,
    as the authors' training script does (it looks the negation up by the sentence with " ."
    appended, which their negation file never holds)."""

    def __init__(self, spacy_model: str = "en_core_web_sm", fidelity: str = "paper"):
        self.nlp = load_spacy_parser(spacy_model)  # the parser, tagger and lemmatizer the rules read
        self.fidelity = fidelity

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        sentences = [str(s).strip() for s in batch["sentence"]]
        out = [negation(doc) for doc in self.nlp.pipe(sentences, batch_size=256)]
        if self.fidelity == "authors_code":
            out = [f"Not {s}" if end_with_punctuation(s) != s else n for s, n in zip(sentences, out)]
        return {**batch, "soft_negative": np.asarray(out, dtype=object)}


def bidirectional_margin_loss(z1: torch.Tensor, z2: torch.Tensor, z3: torch.Tensor, alpha: float,
                              beta: float) -> torch.Tensor:
    """SNCSE's bidirectional margin loss (Wang et al., 2022; the authors' ``cl_forward``): with ``D_i = cos(z1_i, z3_i) - cos(z1_i, z2_i)``
    (soft negative minus positive similarity), ``mean_i relu(D_i + alpha) + relu(-D_i - beta)``:
    zero when ``-beta <= D_i <= -alpha``. In float32 under any autocast."""
    with torch.autocast(device_type=z1.device.type, enabled=False):
        delta = F.cosine_similarity(z1.float(), z3.float(), dim=-1) - F.cosine_similarity(z1.float(), z2.float(), dim=-1)
        return (torch.relu(delta + alpha) + torch.relu(-delta - beta)).mean()


@dataclasses.dataclass
class BMLParams(Params):
    bml_alpha: float = cited(0.1, "SNCSE's BML lower margin alpha (train_SNCSE.py: alpha = 0.1)")
    bml_beta: float = cited(0.3, "SNCSE's BML upper margin beta (train_SNCSE.py: beta = 0.3)")
    lambda_bml: float = cited(1e-3, (
        "BML's weight (train_SNCSE.py: 1e-3 for BERT, 5e-4 for RoBERTa: the paper-roberta profile)"))
    spacy_model: str = cited("en_core_web_sm", "the parser of the negation rules (the authors' en_core_web_sm)")

    def validate(self) -> None:
        check([(0 <= self.bml_alpha <= self.bml_beta,
                f"BML needs 0 <= bml_alpha <= bml_beta, got {self.bml_alpha} and {self.bml_beta}"),
               (self.lambda_bml >= 0, f"lambda_bml must be >= 0, got {self.lambda_bml}")])


class BML(AuxTerm):
    """``aux=bml``: each sentence's negation (its soft negative) encoded beside the batch, and
    lambda x SNCSE's bidirectional margin loss on it; the soft negatives stay out of the
    contrastive loss.

    Inputs: the ``soft_negative`` column, made once per corpus by SNCSE's negation rules on spaCy's parse.
    Requires: spaCy's English model. Combines with: every encoder, positives, negatives source and loss.
    Paper: SNCSE (Wang et al., 2022), the bidirectional margin loss; the authors' negation rules and cl_forward.
    Example: --set encoder=prompt --set aux=bml --set lambda_bml=0.001"""

    name = "bml"
    Params = BMLParams
    cites = "Wang et al. (2022), SNCSE: soft negatives and the bidirectional margin loss"
    space = "sncse"
    config_defaults = {"precision": ("fp32", "SNCSE's train_SNCSE.sh passes no --fp16: fp32")}

    def preflight(self) -> None:
        load_spacy_parser(self.params.spacy_model)

    def generated_columns(self, seed: int = 0) -> list[GeneratedColumn]:
        # Rules, no random draws: the seed does not key the cache.
        kwargs: dict[str, Any] = {"spacy_model": self.params.spacy_model}
        if self.shared is not None and self.shared.fidelity == "authors_code":
            kwargs["fidelity"] = "authors_code"
        return [GeneratedColumn("soft_negative", generator="methods.sncse:SoftNegatives", kwargs=kwargs,
                                cpu_bound=True)]

    def text_columns(self) -> tuple[str, ...]:
        return ("soft_negative",)

    def extra_rows(self, batch: dict[str, Any]) -> list:
        return [batch["soft_negative"]]

    def forward(self, out: StepOutputs) -> tuple[torch.Tensor, dict[str, Any]]:
        p = self.params
        bml = global_mean(bidirectional_margin_loss(out.z["anchor"], out.z["positive"], out.z["bml"], p.bml_alpha,
                                                   p.bml_beta))
        return p.lambda_bml * bml, {"bml_loss": bml.detach()}
