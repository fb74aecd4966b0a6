"""UNA: Unsupervised hard Negative Augmentation (Shu et al.), on top of SimCSE.

Step 1 (Eq. 2): TF-IDF over the training corpus, one sentence per document, lowercased, word
tokens: ``tf(t, d) = log(1 + n_t / n)``, ``idf(t) = -log(N_t / N)``, ``Z = tf * idf`` (N x m) and
``s_j = max_d Z[d, j]``. Step 2 (Eq. 3-4): for the terms of a sentence with scores z,
``p_i = min(beta * (z_i - min z) / C, 1)``, ``C = mean(z - min z)``; the top term is always
replaced. Step 3: the replacement of a term is drawn from the +-r window around its rank in the
s-sorted vocabulary (itself excluded), with probability proportional to s (Algorithm 1).

Tokenisation (the paper says only "words"). ``fidelity: paper``: terms are words with at least one
letter (digits and punctuation are never replaced); untouched text keeps its casing and spacing
and a replacement copies the casing pattern of the word it replaces. A chosen term is replaced at
every occurrence by the same sampled word. A sentence without any term gets the empty negative
``""``, which the loss masks out (it contributes no negative column).

``fidelity: authors_code`` follows the authors' code (``ThresholdRep``) where it differs: NLTK's
word tokenizer on lowercased text, so punctuation, numbers and clitics ("n't", "'s") are terms too
(in n of tf, in the vocabulary and its s-ranks, and replaceable; a table of its own in the cache);
z per token position, so C counts a repeated token each time; each position replaced on its own
draw, from its word's list of 2r+1 draws from the +-r window *including the word itself*; no cap
at 1, the top position forced only when every p < 1; the negative is the lowercased tokens joined
by spaces, and one equal to its sentence becomes a single random word (``authors_negatives``).
The authors call ``word_tokenize``, which first splits the text into sentences with Punkt (a
download); we call its word tokenizer directly (``NLTKWordTokenizer``), which differs only on a
line holding several sentences. Their loss is ``loss=ntxent`` (``methods.losses``).

Every random draw is a fixed function of the run's seed, the epoch and the corpus row
(``methods.ingredients.Draws``): two runs with one seed get the same negatives, whatever the
batches or workers; the authors walk each word's cached list in processing order, which here is
a drawn entry of the same list.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from methods.ingredients import (CorpusStatistics, Draws, InvalidParams, NegativesSource, Params, check, cited,
                                 counter_uniforms, derive_seed)

SPLIT = re.compile(r"(\w+)", re.UNICODE)  # split() keeps the words at odd positions
TERM = r"(?u)\b\w*[^\W\d_]\w*\b"  # a word with at least one letter
TOKENIZERS = {"paper": "words", "authors_code": "nltk"}  # by fidelity


def nltk_tokens(sentence: str) -> list[str]:
    """The authors' tokenisation: NLTK's word tokenizer on the lowercased sentence."""
    from nltk.tokenize import NLTKWordTokenizer

    return NLTKWordTokenizer().tokenize(sentence.lower())


@dataclasses.dataclass
class UNAParams(Params):
    alpha: int = cited(5, "Every alpha-th batch carries its negatives (alpha = 5, Shu et al. Table C4); 0: never.")
    beta: float = cited(0.5, "Expected fraction of a sentence's terms replaced (beta = 0.5, Eq. 4 and Table C5).")
    r: int = cited(4000, "Half-width of the replacement window in the s-sorted vocabulary (r = 4000, Table C6).")
    step2: str = cited("tfidf", (
        "Ablations of Table 2: how Step 2 chooses terms and Step 3 draws replacements. tfidf | random"))
    step3: str = cited("tfidf", "tfidf | random")

    def validate(self) -> None:
        check([
            (self.alpha >= 0, f"alpha must be >= 0 (0 = never use negatives), got {self.alpha}"),
            (self.beta > 0, f"beta must be > 0, got {self.beta}"),
            (self.r >= 1, f"r must be >= 1, got {self.r}"),
        ] + [(getattr(self, key) in ("tfidf", "random"), f"{key} must be 'tfidf' or 'random', got {getattr(self, key)!r}")
             for key in ("step2", "step3")])


# ------------------------------------------------------------------------------------------------
# Step 1: corpus statistics


@dataclasses.dataclass
class TfIdfTable:
    """What Steps 2-3 need from the corpus; plain arrays, so it pickles cheaply for Ray."""

    vocab: np.ndarray  # term strings, column order of Z
    idf: np.ndarray  # -log(N_t / N)
    s: np.ndarray  # column max of Z
    order: np.ndarray  # vocabulary indices sorted by s (ascending)
    rank: np.ndarray  # rank[term] = position of the term in ``order``
    cum: np.ndarray  # cum[k] = sum of s over order[:k]  (length m + 1)
    index: dict[str, int]

    @property
    def size(self) -> int:
        return len(self.vocab)

    def word_ids(self) -> "WordIds":
        """Word as written -> term index (-1: not a term), filled as words are met."""
        if "_word_ids" not in self.__dict__:
            self.__dict__["_word_ids"] = WordIds(self.index)
        return self.__dict__["_word_ids"]

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k != "_word_ids"}


class WordIds(dict):
    """A dict whose misses lower-case the word once and look it up in the vocabulary, so the
    per-word look-up of a batch is one C-level ``map`` and each written form is lowered once.
    Bounded: past ``LIMIT`` written forms it starts again (a worker process lives for a sweep)."""

    LIMIT = 2_000_000

    def __init__(self, index: dict[str, int]):
        super().__init__()
        self.index = index

    def __missing__(self, word: str) -> int:
        if len(self) >= self.LIMIT:
            self.clear()
        self[word] = term = self.index.get(word.lower(), -1)
        return term


def term_frequencies(counts: sp.csr_matrix) -> sp.csr_matrix:
    """tf(t, d) = log(1 + n_t / n), n the number of terms of d (Shu et al., Eq. 2)."""
    counts = counts.tocsr().astype(np.float64)
    n = np.asarray(counts.sum(axis=1)).ravel()
    rows = np.repeat(np.arange(counts.shape[0]), np.diff(counts.indptr))
    tf = counts.copy()
    tf.data = np.log1p(counts.data / n[rows])
    return tf


def check_documents(sentences) -> None:
    """IDF (Eq. 2) over fewer than two documents is log 1 = 0 for every term: no ordering at all."""
    if len(sentences) < 2:
        raise InvalidParams(f"UNA needs a corpus of at least 2 sentences for TF-IDF, got {len(sentences)}")


def fit_tfidf(sentences: Iterable[str], tokenizer: str = "words", chunk: int = 100_000) -> TfIdfTable:
    """Step 1 over the corpus: scikit-learn counts, the paper's formula with scipy.sparse.
    ``tokenizer``: ``words`` (letters-bearing words) or ``nltk`` (the authors'; see the module).

    ``sentences`` (any sized iterable) is read ``chunk`` documents at a time: each chunk adds its
    document frequencies and its largest tf per term, and ``s_j = idf_j * max_d tf(j, d)`` since
    idf_j >= 0 (Eq. 2), so a million sentences never hold their counts at once."""
    from sklearn.feature_extraction.text import CountVectorizer
    from tqdm.auto import tqdm

    check_documents(sentences)
    if tokenizer == "nltk":
        vectorizer = CountVectorizer(lowercase=False, tokenizer=nltk_tokens, token_pattern=None, dtype=np.int64)
    else:
        vectorizer = CountVectorizer(lowercase=True, token_pattern=TERM, dtype=np.int64)
    index: dict[str, int] = {}  # term -> position in df / tf_max, in the order terms were met
    df, tf_max = np.zeros(0, np.int64), np.zeros(0)
    # The one long step on the driver: a progress bar on a terminal (none in logs, disable=None).
    documents = iter(tqdm(sentences, desc="UNA TF-IDF", unit=" sentences", disable=None, leave=False))
    N = 0
    while block := list(itertools.islice(documents, chunk)):
        N += len(block)
        try:
            counts = vectorizer.fit_transform(block).tocsr()
        except ValueError:  # no term in this chunk: its documents count in N only
            continue
        ids = np.fromiter((index.setdefault(t, len(index)) for t in vectorizer.get_feature_names_out()),
                          np.int64, counts.shape[1])
        df, tf_max = np.pad(df, (0, len(index) - len(df))), np.pad(tf_max, (0, len(index) - len(tf_max)))
        df[ids] += np.bincount(counts.indices, minlength=counts.shape[1])
        tf = term_frequencies(counts)
        np.maximum.at(tf_max, ids[tf.indices], tf.data)
    if not index:
        raise InvalidParams(f"UNA's TF-IDF found no terms in the corpus' {N} sentences")
    terms = np.array(sorted(index), dtype=object)  # scikit-learn's column order: sorted terms
    at = np.fromiter((index[t] for t in terms), np.int64, len(terms))
    idf = -np.log(df[at] / N)
    return _table(terms, idf, tf_max[at] * idf)


TFIDF_VERSION = 1


def save_table(table: TfIdfTable, directory) -> None:
    """Arrays only (``.npz`` without pickle), so loading a cache never executes code."""
    np.savez(Path(directory) / "tfidf.npz", vocab=table.vocab.astype(str), idf=table.idf, s=table.s)


def load_table(directory) -> TfIdfTable:
    with np.load(Path(directory) / "tfidf.npz", allow_pickle=False) as f:
        return _table(f["vocab"].astype(object), f["idf"], f["s"])


def _table(vocab: np.ndarray, idf: np.ndarray, s: np.ndarray) -> TfIdfTable:
    order = np.argsort(s, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    cum = np.concatenate([[0.0], np.cumsum(s[order])])
    return TfIdfTable(vocab, idf, s, order, rank, cum, {t: i for i, t in enumerate(vocab)})


# ------------------------------------------------------------------------------------------------
# Step 2: which terms to replace


def replacement_probabilities(z: np.ndarray, beta: float) -> np.ndarray:
    """p_i = min(beta (z_i - min z) / C, 1), C = mean(z - min z) (Shu et al., Eq. 3-4); the
    largest z gets p = 1. With all z equal (C = 0) only that top term is replaced."""
    shifted = z - z.min()
    c = shifted.mean()
    p = np.minimum(beta * shifted / c, 1.0) if c > 0 else np.zeros_like(z)
    p[int(np.argmax(z))] = 1.0
    return p


# ------------------------------------------------------------------------------------------------
# Step 3: replacements


def sample_in_windows(table: TfIdfTable, terms: np.ndarray, r: int, uniforms: np.ndarray,
                      include_self: bool = False) -> np.ndarray:
    """For each term, a word from the +-r window of its rank (itself excluded, unless
    ``include_self``: the authors' code), P proportional to s; ``uniforms``: one in [0, 1) per term.

    Vectorised inverse-CDF sampling on the prefix sums of s in rank order: the term's own mass is
    cut out of the window by shifting draws that land at or after it.
    """
    m = table.size
    k = table.rank[terms]
    lo = np.maximum(k - r, 0)
    hi = np.minimum(k + r, m - 1)  # inclusive
    own = np.zeros(len(terms)) if include_self else table.s[terms]
    before_lo, before_k = table.cum[lo], table.cum[k]
    total = table.cum[hi + 1] - before_lo - own
    target = before_lo + uniforms * total
    if not include_self:
        target = np.where(target >= before_k, target + own, target)
    pos = np.clip(np.searchsorted(table.cum, target, side="right") - 1, lo, hi)
    # All-zero windows (terms present in every sentence have s = 0) fall back to uniform.
    flat = total <= 0
    if flat.any():
        width = hi[flat] - lo[flat] + include_self  # the number of candidates
        draw = lo[flat] + (uniforms[flat] * width).astype(np.int64)
        pos[flat] = draw if include_self else np.where(draw >= k[flat], draw + 1, draw)
    if not include_self:
        pos = np.where(pos == k, np.where(k > lo, k - 1, k + 1), pos)  # float round-off guard
    return table.order[pos]


def cached_replacements(table: TfIdfTable, terms: np.ndarray, j: np.ndarray, r: int, seed: int) -> np.ndarray:
    """Entry ``j`` of each term's list of 2r+1 replacements, drawn once from its window (itself
    included, P proportional to s), as the UNA authors' code draws every word's list at start-up.
    The lists are a fixed function of the run's seed, recomputed rather than stored (2r+1 entries
    for each of ~70k words)."""
    uniforms = counter_uniforms(derive_seed(seed, "una-cached-lists"), terms, j)
    return sample_in_windows(table, terms, r, uniforms, include_self=True)


def check_window(table: TfIdfTable, params: UNAParams) -> None:
    if params.step3 == "tfidf" and table.size <= 2 * params.r:
        raise InvalidParams(
            f"UNA window r={params.r} needs a vocabulary larger than 2r={2 * params.r}; this corpus has "
            f"{table.size} terms (set r smaller)"
        )


def match_case(word: str, like: str) -> str:
    if like.isupper() and len(like) > 1:
        return word.upper()
    if like[:1].isupper():
        return word[:1].upper() + word[1:]
    return word


# ------------------------------------------------------------------------------------------------
# The negatives of a batch


# Streams of the run's draws (``Draws``): each purpose its own, independent of the others.
_PICK, _STEP3, _FORCED, _RANDOM_TOKEN, _ENTRY = 1, 2, 3, 4, 5


def make_negatives(sentences: list[str], table: TfIdfTable, params: UNAParams, draws: Draws, rows: np.ndarray,
                   fidelity: str = "paper") -> list[str]:
    """Steps 2-3 for a batch whose sentences are the corpus rows ``rows``: every draw is a fixed
    function of (the run's seed, the epoch, the row, the term), so the negatives do not depend on
    the batches or workers. ``fidelity="authors_code"``: ``authors_negatives``."""
    check_window(table, params)
    if not sentences:
        return []
    rows = np.asarray(rows, dtype=np.int64)
    if fidelity == "authors_code":
        return authors_negatives(sentences, table, params, draws, rows)
    joined, sep = _join(sentences)
    parts = SPLIT.split(joined)  # [gap, word, gap, ..., word, gap]; sep only in gaps
    words = parts[1::2]
    lookup = table.word_ids()
    word_tid = np.fromiter(map(lookup.__getitem__, words), dtype=np.int64, count=len(words))
    # The sentence of each word: its offset in the joined text against the sentences' offsets.
    lengths = np.fromiter(map(len, parts), dtype=np.int64, count=len(parts))
    word_start = np.cumsum(lengths)[0::2][:-1]
    sentence_start = np.cumsum([0] + [len(s) + 1 for s in sentences[:-1]])
    word_sid = np.searchsorted(sentence_start, word_start, side="right") - 1
    is_term = word_tid >= 0  # words the corpus' vocabulary holds

    m = table.size
    keys, inverse, counts = np.unique(word_sid[is_term] * m + word_tid[is_term], return_inverse=True,
                                      return_counts=True)
    sid, tid = keys // m, keys % m  # sorted by sentence: each sentence's terms are contiguous
    pick = _pick_terms(sid, tid, counts, table, params, draws, rows)
    terms, term_rows = tid[pick], rows[sid[pick]]
    if params.step3 == "tfidf":
        repl = sample_in_windows(table, terms, params.r, draws.uniform(term_rows, terms, stream=_STEP3))
    else:  # ablation: uniform over the vocabulary, the term itself excluded
        draw = (draws.uniform(term_rows, terms, stream=_STEP3) * (m - 1)).astype(np.int64)
        repl = np.where(draw >= terms, draw + 1, draw)
    # Every occurrence of a chosen term in its sentence gets the same replacement.
    key_repl = np.full(len(keys), -1, dtype=np.int64)
    key_repl[pick] = repl
    word_repl = np.full(len(words), -1, dtype=np.int64)
    word_repl[is_term] = key_repl[inverse]
    at = np.flatnonzero(word_repl >= 0)
    new = table.vocab[word_repl[at]].tolist()
    has_negative = np.zeros(len(sentences), dtype=bool)
    has_negative[sid[pick]] = True
    for i, w in zip(at.tolist(), new):
        original = parts[2 * i + 1]
        parts[2 * i + 1] = w if original.islower() else match_case(w, original)
    out = "".join(parts).split(sep)
    return [text if keep else "" for text, keep in zip(out, has_negative.tolist())]


def _pick_terms(sid: np.ndarray, tid: np.ndarray, counts: np.ndarray, table: TfIdfTable, params: UNAParams,
                draws: Draws, rows: np.ndarray) -> np.ndarray:
    """Step 2 over the batch's (sentence, term) pairs, grouped by sentence: which terms are replaced."""
    if not len(sid):
        return np.zeros(0, dtype=bool)
    starts = np.flatnonzero(np.r_[True, sid[1:] != sid[:-1]])
    group = np.repeat(np.arange(len(starts)), np.diff(np.r_[starts, len(sid)]))
    if params.step2 == "tfidf":
        n_terms = np.add.reduceat(counts, starts)[group]
        z = np.log1p(counts / n_terms) * table.idf[tid]  # this sentence's row of Z (Eq. 2)
        p = grouped_probabilities(z, starts, group, params.beta)
    else:  # ablation: uniform choice with the same expected fraction, one random term forced
        p = np.full(len(sid), min(params.beta, 1.0))
        sizes = np.diff(np.r_[starts, len(sid)])
        p[starts + (draws.uniform(rows[sid[starts]], stream=_FORCED) * sizes).astype(np.int64)] = 1.0
    return draws.uniform(rows[sid], tid, stream=_PICK) < p


def authors_negatives(sentences: list[str], table: TfIdfTable, params: UNAParams, draws: Draws,
                      rows: np.ndarray) -> list[str]:
    """Steps 2-3 as the UNA authors' code does them (their ``ThresholdRep``), where it differs from
    the paper: the tokens are NLTK's on the lowercased text; z is per token position, so C, the
    mean of (z - min z), counts a repeated token each time; each position is replaced on its own
    draw, from its word's cached list of draws from the +-r window **including the word itself**;
    p_i = beta (z_i - min z) / C without the cap at 1, and the top position forced only when every
    p < 1 (a sentence whose positions all score the same is left as it is, their 0/0); the negative
    is the tokens joined by spaces, and one equal to its sentence is replaced by a single random
    word (P proportional to s - min s). The cached list's entry for each replacement is drawn
    (their code walks the list in order, which depends on the order sentences are processed in)."""
    tokens = [nltk_tokens(s) for s in sentences]
    sizes = np.array([len(t) for t in tokens], dtype=np.int64)
    words = [w for ts in tokens for w in ts]
    word_sid = np.repeat(np.arange(len(sentences)), sizes)
    position = np.arange(len(words)) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    tid = np.fromiter((table.index.get(w, -1) for w in words), dtype=np.int64, count=len(words))
    if params.step2 == "tfidf":
        p = _authors_probabilities(_position_scores(word_sid, tid, sizes, table), sizes, params.beta)
    else:  # the ablation: each position with the same probability (their uniform replacement)
        p = np.full(len(words), min(params.beta, 1.0))
    word_rows = rows[word_sid]
    pick = (draws.uniform(word_rows, position, stream=_PICK) < p) & (tid >= 0)
    entry = (draws.uniform(word_rows[pick], position[pick], stream=_ENTRY) * (2 * params.r + 1)).astype(np.int64)
    if params.step3 == "tfidf":
        repl = cached_replacements(table, tid[pick], entry, params.r, draws.seed)
    else:
        repl = (draws.uniform(word_rows[pick], position[pick], stream=_STEP3) * table.size).astype(np.int64)
    out = list(words)
    for i, t in zip(np.flatnonzero(pick).tolist(), table.vocab[repl].tolist()):
        out[i] = t
    bounds = np.r_[0, np.cumsum(sizes)].tolist()
    negatives = [" ".join(out[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
    unchanged = [j for j, (neg, sentence) in enumerate(zip(negatives, sentences)) if neg == sentence]
    if unchanged:  # the authors' "if example == output": one random word instead
        shifted = np.concatenate([[0.0], np.cumsum(table.s - table.s.min())])
        u = draws.uniform(rows[unchanged], stream=_RANDOM_TOKEN) * shifted[-1]
        for j, term in zip(unchanged, np.searchsorted(shifted, u, side="right") - 1):
            negatives[j] = str(table.vocab[min(term, table.size - 1)])
    return negatives


def _position_scores(word_sid: np.ndarray, tid: np.ndarray, sizes: np.ndarray, table: TfIdfTable) -> np.ndarray:
    """z of each token position: log(1 + n_t / n) idf(t) of its word in its sentence (0 off the vocabulary)."""
    m = table.size + 1
    keys = word_sid * m + np.where(tid >= 0, tid, table.size)
    _, inverse, counts = np.unique(keys, return_inverse=True, return_counts=True)
    idf = np.where(tid >= 0, table.idf[np.maximum(tid, 0)], 0.0)
    return np.log1p(counts[inverse] / sizes[word_sid]) * idf


def _authors_probabilities(z: np.ndarray, sizes: np.ndarray, beta: float) -> np.ndarray:
    """Per position: beta (z - min z) / mean(z - min z) over the sentence's positions; the first
    top position 1 when all are below 1; all 0 for a sentence whose positions score the same."""
    starts = np.r_[0, np.cumsum(sizes)[:-1]]
    nonempty = sizes > 0
    group = np.repeat(np.arange(len(sizes)), sizes)
    zmin = np.zeros(len(sizes))
    zmin[nonempty] = np.minimum.reduceat(z, starts[nonempty]) if len(z) else 0.0
    shifted = z - zmin[group]
    total = np.zeros(len(sizes))
    total[nonempty] = np.add.reduceat(shifted, starts[nonempty]) if len(z) else 0.0
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.where(total[group] > 0, beta * shifted * sizes[group] / total[group], 0.0)
    for j in np.flatnonzero(nonempty & (total > 0)):
        a, b = starts[j], starts[j] + sizes[j]
        if p[a:b].max() < 1:
            p[a + int(np.argmax(p[a:b]))] = 1.0
    return p


def _join(sentences: list[str]) -> tuple[str, str]:
    """The batch as one string, joined by a non-word character that no sentence contains."""
    for sep in ("\x00", "\x01", "\x02", "\x03", "\ufdd0", "\ufdd1"):
        joined = sep.join(sentences)
        if joined.count(sep) == len(sentences) - 1:
            return joined, sep
    raise InvalidParams("UNA cannot find a separator character that no sentence of this batch contains")


def grouped_probabilities(z: np.ndarray, starts: np.ndarray, group: np.ndarray, beta: float) -> np.ndarray:
    """``replacement_probabilities`` for many sentences at once (contiguous groups of z)."""
    zmin = np.minimum.reduceat(z, starts)[group]
    shifted = z - zmin
    sizes = np.diff(np.r_[starts, len(z)])
    c = (np.add.reduceat(shifted, starts) / sizes)[group]
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.where(c > 0, np.minimum(beta * shifted / c, 1.0), 0.0)
    zmax = np.maximum.reduceat(z, starts)[group]
    first_max = np.flatnonzero(z == zmax)
    _, first = np.unique(group[first_max], return_index=True)
    p[first_max[first]] = 1.0  # the top term of every sentence (the first one on ties)
    return p


# ------------------------------------------------------------------------------------------------
# The ingredient


class UNA(NegativesSource):
    """``negatives=una``: TF-IDF term replacement, fresh every epoch (Ray Data runs ``augment`` on the
    CPUs), used on every alpha-th batch, encoded in the anchors' forward pass (same dropout).

    Inputs: the corpus's TF-IDF table (fitted once, cached) and each epoch's ``una_negative`` column.
    Requires: a corpus vocabulary wider than the 2r window. Combines with: ``infonce``, ``hince``, ``ntxent``; not ``symmetric``.
    Paper: UNA (Shu et al.), Sec. 3, Eq. 2-4, Algorithm 1.
    Example: --set negatives=una --set alpha=5 --set beta=0.5 --set r=3000"""

    name = "una"
    Params = UNAParams
    cites = "Shu et al., UNA, Sec. 3, Eq. 2-4, Algorithm 1"
    space = "una"
    column = "una_negative"  # encoded in the anchors' pass (the interface's dropout None)
    augments_per_epoch = True
    config_defaults = {"max_grad_norm": (0.0, "Shu et al.'s code (una.py) steps its optimizer without clipping gradients"),
                       "precision": ("fp32", "Shu et al.'s code trains in fp32 (no autocast)")}

    def statistics(self) -> CorpusStatistics:
        # The table depends on the corpus and the tokeniser (the formula is versioned here).
        tokenizer = TOKENIZERS[self.shared.fidelity]
        return CorpusStatistics(f"una-tfidf-{tokenizer}", TFIDF_VERSION,
                                lambda sentences: fit_tfidf(sentences, tokenizer), save_table, load_table)

    def check_corpus(self, sentences: list[str]) -> None:
        check_documents(sentences)

    def check_statistics(self, state: TfIdfTable) -> None:
        check_window(state, self.params)

    def space_limits(self, state: TfIdfTable) -> dict[str, tuple[float, float]]:
        return {"r": (1, (state.size - 1) // 2)}

    def augment(self, batch: dict[str, Any], state: TfIdfTable, draws: Draws) -> dict[str, Any]:
        """Fresh negatives every epoch, drawn from the run's seed (``draws``) by corpus row."""
        sentences = [str(s) for s in batch["sentence"]]
        negatives = make_negatives(sentences, state, self.params, draws, batch["row"], self.shared.fidelity)
        return {**batch, self.column: np.asarray(negatives, dtype=object)}

    def active(self, step: int) -> bool:
        """Every alpha-th batch, from the first: steps 0, alpha, 2 alpha, ... (0-based); alpha = 0:
        never. The paper says "once every 5 batches" and not which; the authors' code
        (``una.py``: ``step % 5 == 0``) starts with the first batch."""
        return self.params.alpha > 0 and step % self.params.alpha == 0
