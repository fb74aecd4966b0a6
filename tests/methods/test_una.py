"""UNA (Shu et al.): TF-IDF, Steps 2-3, reconstruction, ablations, schedule and both losses."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from methods.ingredients import Draws, InvalidParams
from methods.losses import nt_xent
from methods.recipe import Recipe
from methods.una import (
    UNA,
    UNAParams,
    cached_replacements,
    fit_tfidf,
    make_negatives,
    replacement_probabilities,
    sample_in_windows,
)
from tests.reference import slow_info_nce, slow_nt_xent


def negatives(sentences, table, params, seed=0, fidelity="paper", epoch=0, rows=None):
    """UNA's negatives of a batch whose sentences are the corpus rows ``rows`` (default 0..n-1)."""
    rows = np.arange(len(sentences)) if rows is None else np.asarray(rows)
    return make_negatives(sentences, table, params, Draws(seed, epoch), rows, fidelity)

DOCS = [
    "The cat sat on the mat.",
    "A dog chased the cat!",
    "Stocks fell sharply on Monday, traders said.",
    "The meeting was postponed again.",
    "She reads a book in the quiet garden.",
    "Rain is expected tomorrow afternoon in Paris.",
]


@pytest.fixture(scope="module")
def corpus(data_root):
    from platform.data import read_corpus

    return read_corpus(data_root / "corpus" / "brown_sentences.txt.gz", limit=3000)


def test_tfidf_matches_the_paper_formula_term_by_term():
    table = fit_tfidf(DOCS)
    docs = [[w.lower() for w in __import__("re").findall(r"\b\w*[^\W\d_]\w*\b", d)] for d in DOCS]
    N = len(docs)
    for term, j in table.index.items():
        n_t = sum(term in d for d in docs)
        idf = -math.log(n_t / N)
        assert table.idf[j] == pytest.approx(idf)
        s = max(math.log(1 + d.count(term) / len(d)) * idf for d in docs)  # Eq. 2, column max
        assert table.s[j] == pytest.approx(s)
    assert table.cum[-1] == pytest.approx(table.s.sum())


def test_step2_probabilities_reference_and_mean_beta():
    z = np.array([0.1, 0.4, 0.25, 0.3, 0.2])
    p = replacement_probabilities(z, 0.5)
    c = np.mean(z - z.min())
    expected = [min(0.5 * (zi - z.min()) / c, 1.0) for zi in z]
    expected[int(np.argmax(z))] = 1.0
    np.testing.assert_allclose(p, expected)
    # Where nothing is clipped, mean p = beta (Eq. 4): beta * mean(z - min z) / C = beta. Here the
    # top term's formula value is exactly 1, so forcing it changes nothing and the mean is beta.
    z = np.array([0.2, 0.3, 0.4, 0.5, 0.6])
    p = replacement_probabilities(z, 0.5)
    assert p.max() == pytest.approx(1.0) and np.mean(p) == pytest.approx(0.5)
    p = replacement_probabilities(z, 0.25)  # no clipping; the top term is still forced to 1
    np.testing.assert_allclose(p[:4], 0.25 * (z[:4] - 0.2) / 0.2)
    assert p[4] == 1.0


def test_top_term_always_replaced_and_negatives_differ(corpus):
    table = fit_tfidf(corpus)
    params = UNAParams(r=50, beta=0.01)
    sents = corpus[:300]
    negs = negatives(sents, table, params)
    for s, n in zip(sents, negs):
        assert n != s
        words = [w.lower() for w in __import__("re").findall(r"\b\w*[^\W\d_]\w*\b", s) if w.lower() in table.index]
        ids = np.unique([table.index[w] for w in words])
        counts = np.array([words.count(table.vocab[i]) for i in ids])
        top = table.vocab[ids[np.argmax(np.log1p(counts / counts.sum()) * table.idf[ids])]]
        assert top not in [w.lower() for w in __import__("re").findall(r"\w+", n)] or words.count(top) == 0


def test_replacements_come_from_the_window(corpus):
    table = fit_tfidf(corpus)
    rng = np.random.default_rng(1)
    terms = rng.integers(table.size, size=5000)
    r = 30
    repl = sample_in_windows(table, terms, r, rng.random(len(terms)))
    dist = np.abs(table.rank[repl] - table.rank[terms])
    assert (dist >= 1).all() and (dist <= r).all()


def test_window_sampling_frequencies_follow_s(corpus):
    table = fit_tfidf(corpus)
    term = int(table.order[table.size // 2])
    r = 5
    draws = sample_in_windows(table, np.full(20000, term), r, np.random.default_rng(7).random(20000))
    k = table.rank[term]
    window = [int(table.order[j]) for j in range(k - r, k + r + 1) if j != k]
    counts = Counter(draws.tolist())
    observed = np.array([counts[w] for w in window])
    expected = table.s[window] / table.s[window].sum() * len(draws)
    assert set(counts) <= set(window)
    assert chisquare(observed, expected).pvalue > 0.01


def test_casing_and_spacing_preserved_and_authors_mode_lowercases():
    table = fit_tfidf(DOCS * 3 + [f"word{i} filler{i} text" for i in range(40)])
    sent = "The  Cat sat, on the MAT."
    neg = negatives([sent], table, UNAParams(r=2), seed=3)[0]
    # Non-word characters and untouched words are kept verbatim.
    assert [c for c in neg if not c.isalnum()] == [c for c in sent if not c.isalnum()]
    assert neg != sent
    authors_table = fit_tfidf(DOCS * 3 + [f"word{i} filler{i} text" for i in range(40)], tokenizer="nltk")
    authors = negatives([sent], authors_table, UNAParams(r=2), seed=3, fidelity="authors_code")[0]
    assert authors == authors.lower() and "  " not in authors and len(authors.split(" ")) == 8


def test_authors_tfidf_on_nltk_tokens_matches_their_formula_term_by_term(corpus):
    """fidelity=authors_code: every NLTK token of the lowercased text (punctuation, numbers,
    clitics) is a term and counts in n; checked against a dict-by-dict computation as the
    authors' statistics script does it."""
    from nltk.tokenize import NLTKWordTokenizer

    docs = [NLTKWordTokenizer().tokenize(d.lower()) for d in corpus[:400]]
    table = fit_tfidf(corpus[:400], tokenizer="nltk")
    df = Counter(w for d in docs for w in set(d))
    assert set(table.index) == set(df) and {",", ".", "n't"} <= set(df)
    assert any(w.isdigit() for w in df)
    for term, j in table.index.items():
        idf = math.log(len(docs) / df[term])
        s = max(math.log(1 + d.count(term) / len(d)) * idf for d in docs if term in d)
        assert table.idf[j] == pytest.approx(idf) and table.s[j] == pytest.approx(s)
    # The paper's tokenisation gives another table (no punctuation or digit-only terms).
    assert "," not in fit_tfidf(corpus[:400]).index


def test_authors_negatives_are_their_tokens_space_joined(corpus):
    from nltk.tokenize import NLTKWordTokenizer

    table = fit_tfidf(corpus, tokenizer="nltk")
    batch = corpus[:300]
    negs = negatives(batch, table, UNAParams(r=20), seed=1, fidelity="authors_code")
    replaced = Counter()
    for sent, neg in zip(batch, negs):
        tokens = NLTKWordTokenizer().tokenize(sent.lower())
        out = neg.split(" ")
        if neg == " ".join(tokens) == sent:  # unchanged: their code's one random word instead
            continue
        assert len(out) == len(tokens)
        for o, r in zip(tokens, out):
            if o != r:
                assert r in table.index
                replaced["word" if o.isalpha() else "other"] += 1
    assert replaced["other"] > 0  # punctuation and numbers are terms and get replaced too


def test_tfidf_cache_is_keyed_by_the_tokenizer(corpus, tmp_path, monkeypatch):
    from platform.data.columns import corpus_statistics

    monkeypatch.setenv("PLATFORM_CACHE_DIR", str(tmp_path))
    columns = {"sentence": corpus[:300]}
    paper = corpus_statistics(Recipe.named("una", r=20), columns)["una"]
    authors = corpus_statistics(Recipe.named("una", r=20, fidelity="authors_code"), columns)["una"]
    assert "," in authors.index and "," not in paper.index
    assert sorted(p.name.split("-")[2] for p in tmp_path.glob("una-tfidf-*")) == ["nltk", "words"]


def test_sentence_without_terms_gets_empty_negative():
    table = fit_tfidf(DOCS * 10)
    out = negatives(["123 , 456 !", "...", "The cat sat."], table, UNAParams(r=2))
    assert out[:2] == ["", ""] and out[2] not in ("", "The cat sat.")


def test_batch_split_keeps_sentence_boundaries_and_gaps(corpus):
    """The batch is split in one pass over the joined text: sentences holding the separator
    candidates, newlines, no words or only edge punctuation must come back aligned and verbatim
    outside the replaced words; every occurrence of a term gets the same replacement."""
    import pickle
    import re

    table = fit_tfidf(corpus)
    batch = ["", "\x00The cat\x00 sat.", "...", "Line one\nline two, the END", "\x01The \ufdd0dog",
             "!Stocks fell!", "the The THE the"] + corpus[:50]
    negs = negatives(batch, table, UNAParams(r=20), seed=4)
    assert len(negs) == len(batch)
    for s, n in zip(batch, negs):
        words = re.findall(r"\w+", s)
        if not any(w.lower() in table.index for w in words):
            assert n == ""
            continue
        assert re.split(r"\w+", n) == re.split(r"\w+", s)  # gaps verbatim, same number of words
        mapping = {}
        for o, r in zip(words, re.findall(r"\w+", n)):
            if r != o:
                assert o.lower() in table.index and mapping.setdefault(o.lower(), r.lower()) == r.lower()
                assert r == (r.upper() if o.isupper() and len(o) > 1 else r[:1].upper() + r[1:] if o[0].isupper() else r)
        assert mapping and all(o not in mapping for o in map(str.lower, words) if o not in table.index)
    # The per-process word cache does not travel with the table.
    assert "_word_ids" in table.__dict__ and "_word_ids" not in pickle.loads(pickle.dumps(table)).__dict__


@pytest.mark.parametrize("which", ["step2", "step3"])
def test_each_ablation_changes_only_its_step(corpus, which):
    table = fit_tfidf(corpus)
    sents = corpus[:200]
    base = UNAParams(r=20, beta=0.5)
    ablated = UNAParams(r=20, beta=0.5, **{which: "random"})

    def chosen_and_windows(params):
        negs = negatives(sents, table, params, seed=5)
        picked, in_window = [], []
        for s, n in zip(sents, negs):
            a, b = __import__("re").findall(r"\w+", s.lower()), __import__("re").findall(r"\w+", n.lower())
            for x, y in zip(a, b):
                if x != y:
                    picked.append(x)
                    if x in table.index and y in table.index:
                        in_window.append(abs(table.rank[table.index[x]] - table.rank[table.index[y]]) <= 20)
        return picked, np.mean(in_window)

    p_base, w_base = chosen_and_windows(base)
    p_abl, w_abl = chosen_and_windows(ablated)
    if which == "step3":
        assert p_base == p_abl  # same terms chosen (Step 2's draws are their own stream)
        assert w_base == 1.0 and w_abl < 0.2  # only the replacement distribution changed
    else:
        assert p_base != p_abl
        assert w_base == 1.0 and w_abl == 1.0  # replacements still from the window


def test_alpha_schedule():
    """The authors' phase (``step % 5 == 0``): the first batch carries negatives, then every alpha-th."""
    assert [UNA(UNAParams(alpha=3)).active(s) for s in range(6)] == [True, False, False, True, False, False]
    assert [s for s in range(12) if UNA(UNAParams(alpha=5)).active(s)] == [0, 5, 10]
    assert all(UNA(UNAParams(alpha=1)).active(s) for s in range(4))
    assert not any(UNA(UNAParams(alpha=0)).active(s) for s in range(10))


@pytest.mark.parametrize("bad,message", [({"beta": 0}, "beta"), ({"r": 0}, "r must"), ({"alpha": -1}, "alpha"), ({"step2": "x"}, "step2")])
def test_bad_params(bad, message):
    with pytest.raises(InvalidParams, match=message):
        UNA(UNAParams(**bad))


def test_tiny_corpus_and_small_vocabulary_are_rejected():
    with pytest.raises(InvalidParams, match="at least 2"):
        fit_tfidf(["only one"])
    with pytest.raises(InvalidParams, match="vocabulary larger than 2r"):
        UNA(UNAParams(r=4000)).check_statistics(fit_tfidf(DOCS))


def test_authors_loss_matches_reference():
    g = torch.Generator().manual_seed(0)
    a, p, n1, n2 = (torch.randn(3, 6, generator=g) for _ in range(4))
    rows = list(torch.cat([a, p, n1, n2]))
    partner = [3, 4, 5, 0, 1, 2, 9, 10, 11, 6, 7, 8]
    assert float(nt_xent([(a, p), (n1, n2)], 0.05)) == pytest.approx(slow_nt_xent(rows, partner, 0.05), rel=1e-5)
    assert float(nt_xent([(a, p)], 0.1)) == pytest.approx(slow_nt_xent(list(torch.cat([a, p])), [3, 4, 5, 0, 1, 2], 0.1), rel=1e-5)


def test_paper_loss_uses_negatives_as_extra_columns(tiny_model):
    from methods.encoder import Encoder

    torch.manual_seed(0)
    method = Recipe.named("una", alpha=1, r=2)
    enc = Encoder.from_pretrained(str(tiny_model), dropout=0.0)
    model = method.build(enc).eval()
    sents = ["a man plays guitar", "the cat sleeps", "rain falls"]
    negs = ["a man plays piano", "", "snow falls"]
    batch = {"sentence": enc.tokenize(sents), "una_negative": enc.tokenize(negs)}
    loss, metrics = method.loss(model, batch, 0)
    with torch.no_grad():
        z1 = model.projection(model(enc.tokenize(sents)))
        zn = model.projection(model(enc.tokenize([negs[0], negs[2]])))
    assert metrics["una_negatives"] == 1.0
    assert float(loss.detach()) == pytest.approx(slow_info_nce(z1, z1, 0.05, zn), rel=1e-4)


def test_negatives_are_a_function_of_the_seed_epoch_and_row(corpus):
    """The same seed gives the same negatives however the epoch is cut into batches (and so on
    any worker); another seed, or another epoch, gives others. Both fidelities."""
    sents, rows = corpus[:240], np.arange(1000, 1240)
    for fidelity in ("paper", "authors_code"):
        table = fit_tfidf(corpus, tokenizer="nltk" if fidelity == "authors_code" else "words")
        params = UNAParams(r=20)
        whole = negatives(sents, table, params, seed=7, fidelity=fidelity, rows=rows)
        halves = [negatives(sents[a:b], table, params, seed=7, fidelity=fidelity, rows=rows[a:b])
                  for a, b in ((0, 97), (97, 240))]
        assert whole == halves[0] + halves[1]
        assert whole != negatives(sents, table, params, seed=8, fidelity=fidelity, rows=rows)
        assert whole != negatives(sents, table, params, seed=7, fidelity=fidelity, rows=rows, epoch=1)


def _authors_reference(sentence, table, params, draws, row):
    """The authors' ThresholdRep for one sentence, written as their code reads (dicts, a loop
    over positions), with this project's draws: the slow reference of ``authors_negatives``."""
    from nltk.tokenize import NLTKWordTokenizer

    from methods.una import _ENTRY, _PICK, _RANDOM_TOKEN

    words = NLTKWordTokenizer().tokenize(sentence.lower())
    counts = Counter(words)
    # A word the table has not seen (not in the corpus the table was fit on) scores 0 and stays.
    idf = {w: table.idf[table.index[w]] if w in table.index else 0.0 for w in words}
    z = np.array([math.log(1 + counts[w] / len(words)) * idf[w] for w in words])
    p = z - z.min()
    p = p / p.sum() * params.beta * len(words) if p.sum() > 0 else np.zeros(len(words))
    if p.sum() > 0 and p.max() < 1:
        p[p.argmax()] = 1
    out = list(words)
    for i, w in enumerate(words):
        if w in table.index and draws.uniform(np.array([row]), np.array([i]), stream=_PICK)[0] < p[i]:
            entry = int(draws.uniform(np.array([row]), np.array([i]), stream=_ENTRY)[0] * (2 * params.r + 1))
            term = cached_replacements(table, np.array([table.index[w]]), np.array([entry]), params.r, draws.seed)[0]
            out[i] = table.vocab[term]
    negative = " ".join(out)
    if negative == sentence:
        weights = table.s - table.s.min()
        u = draws.uniform(np.array([row]), stream=_RANDOM_TOKEN)[0] * weights.sum()
        negative = table.vocab[int(np.searchsorted(np.cumsum(weights), u, side="right"))]
    return negative


def test_authors_negatives_equal_their_algorithm_position_by_position(corpus):
    """fidelity=authors_code against a per-sentence reference of their algorithm: C over token
    positions, each position on its own draw, no cap, the top forced only when every p < 1, an
    unchanged sentence replaced by one random word."""
    table = fit_tfidf(corpus, tokenizer="nltk")
    sents = corpus[:150] + ["the cat the cat sat .", "a b c", "the the the"]
    params, draws = UNAParams(r=15, beta=0.5), Draws(11, 2)
    rows = np.arange(500, 500 + len(sents))
    fast = make_negatives(sents, table, params, draws, rows, "authors_code")
    assert fast == [_authors_reference(s, table, params, draws, r) for s, r in zip(sents, rows)]


def test_authors_lists_are_window_draws_with_the_word_itself(corpus):
    """Entries of each word's cached list are draws from its +-r window including itself, with
    probability proportional to s (chi-square over many entries), fixed by the seed."""
    table = fit_tfidf(corpus)
    term, r = int(table.order[table.size // 2]), 5
    entries = np.arange(20000)
    draws = cached_replacements(table, np.full(len(entries), term), entries, r, seed=3)
    np.testing.assert_array_equal(draws, cached_replacements(table, np.full(len(entries), term), entries, r, seed=3))
    k = table.rank[term]
    window = [int(table.order[j]) for j in range(k - r, k + r + 1)]
    counts = Counter(draws.tolist())
    assert set(counts) <= set(window) and counts[term] > 0
    expected = table.s[window] / table.s[window].sum() * len(draws)
    assert chisquare(np.array([counts[w] for w in window]), expected).pvalue > 0.01


def test_batched_step2_equals_per_sentence_reference():
    from methods.una import grouped_probabilities

    rng = np.random.default_rng(0)
    z = rng.random(40)
    z[10:14] = 0.3  # a sentence whose terms all tie: C = 0, only its first term forced
    starts = np.array([0, 3, 4, 10, 14, 30])
    ends = np.r_[starts[1:], len(z)]
    group = np.repeat(np.arange(len(starts)), ends - starts)
    reference = np.concatenate([replacement_probabilities(z[a:b], 0.4) for a, b in zip(starts, ends)])
    np.testing.assert_allclose(grouped_probabilities(z, starts, group, 0.4), reference)
    assert list(reference[10:14]) == [1.0, 0.0, 0.0, 0.0]


@pytest.mark.parametrize("tokenizer", ["words", "nltk"])
def test_tfidf_read_in_chunks_is_the_table_of_the_whole_corpus(corpus, tokenizer):
    """Chunks add document frequencies and each term's largest tf; s = idf * max tf (Eq. 2) is then
    the column max of Z over the whole corpus, bit for bit, as scipy computes it in one piece."""
    from sklearn.feature_extraction.text import CountVectorizer

    from methods.una import TERM, nltk_tokens, term_frequencies

    docs = corpus[:700] + ["", "1999 ...", "--"]  # rows without a term count in N
    whole = (CountVectorizer(lowercase=False, tokenizer=nltk_tokens, token_pattern=None) if tokenizer == "nltk"
             else CountVectorizer(lowercase=True, token_pattern=TERM))
    counts = whole.fit_transform(docs)
    idf = -np.log(np.bincount(counts.indices, minlength=counts.shape[1]) / len(docs))
    s = np.asarray(term_frequencies(counts).multiply(idf).tocsc().max(axis=0).todense()).ravel()
    for chunk in (1, 37, 10_000):
        table = fit_tfidf(docs, tokenizer, chunk=chunk)
        assert list(table.vocab) == list(whole.get_feature_names_out())
        np.testing.assert_array_equal(table.idf, idf)
        np.testing.assert_array_equal(table.s, s)
    with pytest.raises(InvalidParams, match="no terms"):
        fit_tfidf(["1999", "--", "..."])
