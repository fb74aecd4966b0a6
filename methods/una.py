"""UNA: Unsupervised hard Negative Augmentation (Shu et al.), on top of SimCSE.

Step 1 (Eq. 2): TF-IDF over the training corpus, one sentence per document, lowercased, word
tokens: ``tf(t, d) = log(1 + n_t / n)``, ``idf(t) = -log(N_t / N)``, ``Z = tf * idf`` (N x m) and
``s_j = max_d Z[d, j]``. Step 2 (Eq. 3-4): for the terms of a sentence with scores z,
``p_i = min(beta * (z_i - min z) / C, 1)``, ``C = mean(z - min z)``; the top term is always
replaced. Step 3: the replacement of a term is drawn from the +-r window around its rank in the
s-sorted vocabulary (itself excluded), with probability proportional to s (Algorithm 1).

Tokenisation (the paper says only "words"). ``fidelity: paper``: terms are words with at least one
letter (digits and punctuation are never replaced); untouched text keeps its casing and spacing
and a replacement copies the casing pattern of the word it replaces. ``fidelity: authors_code``:
the authors' tokeniser, NLTK's word tokenizer on lowercased text, so punctuation, numbers and
clitics ("n't", "'s") are terms too (they count in n of tf, in the vocabulary and its s-ranks, and
can be replaced), and the negative is the lowercased tokens joined by spaces. The authors call
``word_tokenize``, which first splits the text into sentences with Punkt (a download); we call its
word tokenizer directly (``NLTKWordTokenizer``, no data), which differs only on a line holding
several sentences (a period inside the line stays attached to its word). The two tokenisations
give different TF-IDF tables, cached under different keys. A chosen term is replaced at every
occurrence by the same sampled word. A sentence without any term gets the empty negative ``""``,
which the loss masks out (it contributes no negative column).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from methods.ingredients import CorpusStatistics, InvalidParams, NegativesSource, Params, check

SPLIT = re.compile(r"(\w+)", re.UNICODE)  # split() keeps the words at odd positions
TERM = r"(?u)\b\w*[^\W\d_]\w*\b"  # a word with at least one letter
TOKENIZERS = {"paper": "words", "authors_code": "nltk"}  # by fidelity


def nltk_tokens(sentence: str) -> list[str]:
    """The authors' tokenisation: NLTK's word tokenizer on the lowercased sentence."""
    from nltk.tokenize import NLTKWordTokenizer

    return NLTKWordTokenizer().tokenize(sentence.lower())


@dataclasses.dataclass
class UNAParams(Params):
    # Every alpha-th batch carries its negatives (alpha = 5, Shu et al. Table C4); 0: never.
    alpha: int = 5
    # Expected fraction of a sentence's terms replaced (beta = 0.5, Eq. 4 and Table C5).
    beta: float = 0.5
    # Half-width of the replacement window in the s-sorted vocabulary (r = 4000, Table C6).
    r: int = 4000
    # Ablations of Table 2: how Step 2 chooses terms and Step 3 draws replacements.
    step2: str = "tfidf"  # tfidf | random
    step3: str = "tfidf"  # tfidf | random

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
    per-word look-up of a batch is one C-level ``map`` and each written form is lowered once."""

    def __init__(self, index: dict[str, int]):
        super().__init__()
        self.index = index

    def __missing__(self, word: str) -> int:
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


def fit_tfidf(sentences: list[str], tokenizer: str = "words") -> TfIdfTable:
    """Step 1 over the corpus: scikit-learn counts, the paper's formula with scipy.sparse.
    ``tokenizer``: ``words`` (letters-bearing words) or ``nltk`` (the authors'; see the module)."""
    from sklearn.feature_extraction.text import CountVectorizer

    if len(sentences) < 2:
        raise InvalidParams(f"UNA needs a corpus of at least 2 sentences for TF-IDF, got {len(sentences)}")
    if tokenizer == "nltk":
        vectorizer = CountVectorizer(lowercase=False, tokenizer=nltk_tokens, token_pattern=None, dtype=np.int64)
    else:
        vectorizer = CountVectorizer(lowercase=True, token_pattern=TERM, dtype=np.int64)
    from tqdm.auto import tqdm

    # The one long step on the driver: a progress bar on a terminal (none in logs, disable=None).
    counts = vectorizer.fit_transform(tqdm(sentences, desc="UNA TF-IDF", unit=" sentences", disable=None, leave=False))
    N = counts.shape[0]
    df = np.bincount(counts.indices, minlength=counts.shape[1])
    idf = -np.log(df / N)
    z = term_frequencies(counts).multiply(idf).tocsc()
    s = np.asarray(z.max(axis=0).todense()).ravel()
    return _table(vectorizer.get_feature_names_out().astype(object), idf, s)


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


def sample_in_windows(
    table: TfIdfTable, terms: np.ndarray, r: int, rng: np.random.Generator | None = None,
    uniforms: np.ndarray | None = None,
) -> np.ndarray:
    """For each term, a word from the +-r window of its rank (itself excluded), P proportional to s.

    Vectorised inverse-CDF sampling on the prefix sums of s in rank order: the term's own mass is
    cut out of the window by shifting draws that land at or after it. The uniforms come from
    ``rng``, or are given (one per term, in [0, 1)).
    """
    m = table.size
    k = table.rank[terms]
    lo = np.maximum(k - r, 0)
    hi = np.minimum(k + r, m - 1)  # inclusive
    own = table.s[terms]
    before_lo, before_k = table.cum[lo], table.cum[k]
    total = table.cum[hi + 1] - before_lo - own
    given = uniforms is not None
    u = (uniforms if given else rng.random(len(terms))) * total
    target = before_lo + u
    target = np.where(target >= before_k, target + own, target)
    pos = np.searchsorted(table.cum, target, side="right") - 1
    pos = np.clip(pos, lo, hi)
    # All-zero windows (terms present in every sentence have s = 0) fall back to uniform.
    flat = total <= 0
    if flat.any():
        width = hi[flat] - lo[flat]  # number of candidates without the term itself
        draw = lo[flat] + ((uniforms[flat] if given else rng.random(flat.sum())) * width).astype(np.int64)
        pos[flat] = np.where(draw >= k[flat], draw + 1, draw)
    pos = np.where(pos == k, np.where(k > lo, k - 1, k + 1), pos)  # float round-off guard
    return table.order[pos]


def counter_uniforms(seed: int, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Uniforms in [0, 1) that are a fixed function of (seed, a, b): SplitMix64 (Steele et al.,
    2014) over the three, so a list of draws can be recomputed instead of stored."""
    def mix(x):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))

    with np.errstate(over="ignore"):
        x = mix(mix(mix(np.full(len(a), seed, dtype=np.uint64)) ^ a.astype(np.uint64)) ^ b.astype(np.uint64))
    return (x >> np.uint64(11)).astype(np.float64) * 2.0**-53


class CachedWindowSampler:
    """Step 3 as the UNA authors' code does it: each word has a list of 2r+1 replacements drawn from
    its window once, handed out in order and cycling. Same marginal distribution as
    ``sample_in_windows``; successive negatives of a word are correlated through the shared list.

    The authors draw every list at start-up and keep them (2r+1 entries for each of the ~70k words);
    here entry j of word t is recomputed from counter-based uniforms of (seed, t, j), so the lists are
    the same fixed lists without being stored, and a batch is sampled without a per-word loop. One
    position counter per word is all the state."""

    def __init__(self, table: TfIdfTable, r: int, seed: int = 0):
        self.table, self.r, self.seed = table, r, seed
        self.length = 2 * r + 1
        self.next = np.zeros(table.size, dtype=np.int64)

    def cached_list(self, term: int) -> np.ndarray:
        """The 2r+1 replacements of ``term``, in the order they are handed out."""
        return self._entries(np.full(self.length, term, dtype=np.int64), np.arange(self.length))

    def _entries(self, terms: np.ndarray, j: np.ndarray) -> np.ndarray:
        return sample_in_windows(self.table, terms, self.r, uniforms=counter_uniforms(self.seed, terms, j))

    def __call__(self, terms: np.ndarray) -> np.ndarray:
        terms = np.asarray(terms, dtype=np.int64)
        order = np.argsort(terms, kind="stable")  # a word's occurrences stay in batch order
        ordered = terms[order]
        starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
        sizes = np.diff(np.r_[starts, len(terms)])
        position = np.empty(len(terms), dtype=np.int64)
        position[order] = self.next[ordered] + np.arange(len(terms)) - np.repeat(starts, sizes)
        self.next[ordered[starts]] += sizes
        return self._entries(terms, position % self.length)


_SAMPLERS: dict[tuple, CachedWindowSampler] = {}


def authors_sampler(table: TfIdfTable, r: int) -> CachedWindowSampler:
    """One sampler per (table, r) and process, like the authors' start-up cache."""
    key = (table.size, float(table.cum[-1]), r)
    if key not in _SAMPLERS:
        _SAMPLERS.clear()  # a new table or window replaces the old cache
        _SAMPLERS[key] = CachedWindowSampler(table, r)
    return _SAMPLERS[key]


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


def make_negatives(
    sentences: list[str], table: TfIdfTable, params: UNAParams, rng: np.random.Generator, fidelity: str = "paper"
) -> list[str]:
    """Steps 2-3 for a batch. The batch is split into words in one regex pass over the joined text
    and everything after that runs on flat arrays of words and (sentence, term) pairs; Python only
    touches the replaced words."""
    check_window(table, params)
    if not sentences:
        return []
    if fidelity == "authors_code":  # the authors' tokens: NLTK on lowercased text, all are terms
        tokens = [nltk_tokens(s) for s in sentences]
        words = [w for ts in tokens for w in ts]
        word_sid = np.repeat(np.arange(len(sentences)), [len(ts) for ts in tokens])
        index = table.index
        word_tid = np.fromiter((index.get(w, -1) for w in words), dtype=np.int64, count=len(words))
    else:
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
    if len(keys):
        starts = np.flatnonzero(np.r_[True, sid[1:] != sid[:-1]])
        group = np.repeat(np.arange(len(starts)), np.diff(np.r_[starts, len(keys)]))
        if params.step2 == "tfidf":
            n_terms = np.add.reduceat(counts, starts)[group]
            z = np.log1p(counts / n_terms) * table.idf[tid]  # this sentence's row of Z (Eq. 2)
            p = grouped_probabilities(z, starts, group, params.beta)
        else:  # ablation: uniform choice with the same expected fraction, one random term forced
            p = np.full(len(keys), min(params.beta, 1.0))
            sizes = np.diff(np.r_[starts, len(keys)])
            p[starts + (rng.random(len(starts)) * sizes).astype(np.int64)] = 1.0
        pick = rng.random(len(keys)) < p
    else:
        pick = np.zeros(0, dtype=bool)
    terms = tid[pick]

    if params.step3 == "tfidf" and fidelity == "authors_code":
        repl = authors_sampler(table, params.r)(terms)
    elif params.step3 == "tfidf":
        repl = sample_in_windows(table, terms, params.r, rng)
    else:  # ablation: uniform over the vocabulary, the term itself excluded
        draw = rng.integers(m - 1, size=len(terms))
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

    if fidelity == "authors_code":  # the lowercased tokens joined by spaces
        lowered = list(words)
        for i, w in zip(at.tolist(), new):
            lowered[i] = w
        bounds = np.searchsorted(word_sid, np.arange(len(sentences) + 1)).tolist()
        return [" ".join(lowered[a:b]) if has_negative[j] else ""
                for j, (a, b) in enumerate(zip(bounds[:-1], bounds[1:]))]
    for i, w in zip(at.tolist(), new):
        original = parts[2 * i + 1]
        parts[2 * i + 1] = w if original.islower() else match_case(w, original)
    out = "".join(parts).split(sep)
    return [text if keep else "" for text, keep in zip(out, has_negative.tolist())]


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
    """``negatives=una``: fresh TF-IDF negatives every epoch (Ray Data runs ``augment`` on the CPUs),
    used on every alpha-th batch, encoded in the anchors' forward pass (same dropout)."""

    name = "una"
    Params = UNAParams
    cites = "Shu et al., UNA, Sec. 3, Eq. 2-4, Algorithm 1"
    space = "una"
    column = "una_negative"  # encoded in the anchors' pass (the interface's dropout None)
    augments_per_epoch = True

    def statistics(self) -> CorpusStatistics:
        # The table depends on the corpus and the tokeniser (the formula is versioned here).
        tokenizer = TOKENIZERS[self.shared.fidelity]
        return CorpusStatistics(f"una-tfidf-{tokenizer}", TFIDF_VERSION,
                                lambda sentences: fit_tfidf(sentences, tokenizer), save_table, load_table)

    def check_statistics(self, state: TfIdfTable) -> None:
        check_window(state, self.params)

    def space_limits(self, state: TfIdfTable) -> dict[str, tuple[float, float]]:
        return {"r": (1, (state.size - 1) // 2)}

    def augment(self, batch: dict[str, Any], state: TfIdfTable) -> dict[str, Any]:
        rng = np.random.default_rng()  # fresh negatives every epoch
        sentences = [str(s) for s in batch["sentence"]]
        negatives = make_negatives(sentences, state, self.params, rng, self.shared.fidelity)
        return {**batch, self.column: np.asarray(negatives, dtype=object)}

    def active(self, step: int) -> bool:
        """Every alpha-th batch (steps are 0-based: batches alpha, 2 alpha, ...); alpha = 0: never."""
        return self.params.alpha > 0 and (step + 1) % self.params.alpha == 0
