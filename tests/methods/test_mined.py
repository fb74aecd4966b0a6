"""Mined hard negatives (``negatives=mined``): what the mining keeps, checked against
sentence-transformers' ``mine_hard_negatives`` and the teacher's similarities directly (the positive-aware margin, the rank range, best
first); the epoch's draw among them; a recipe with a teacher labelled teacher-assisted."""

from __future__ import annotations

import numpy as np
import pytest

from methods.ingredients import Draws, InvalidParams
from methods.mined import MinedNegatives, MinedParams, load_mined, mine, save_mined
from methods.recipe import NAMED, Recipe, RecipeSpec


@pytest.fixture(scope="module")
def corpus(small_corpus) -> list[str]:
    sentences = [s for s in small_corpus.read_text(encoding="utf-8").splitlines() if s.strip()][:90]
    # Copies of a few sentences in capitals (the same text to an uncased teacher): the likeliest
    # false negatives, which the margin drops and no margin keeps first; and two exact repeats.
    return sentences + [s.upper() for s in sentences[:6]] + sentences[:2]


@pytest.fixture(scope="module")
def similarities(corpus):
    from sentence_transformers import SentenceTransformer

    from methods.encoder import resolve_backbone

    distinct = list(dict.fromkeys(corpus))
    # As the teacher encodes (its batch size: padding moves a cosine in its sixth decimal).
    e = SentenceTransformer(resolve_backbone("minilm")).encode(distinct, batch_size=128, normalize_embeddings=True)
    return distinct, e @ e.T


@pytest.mark.parametrize("margin, low, high", [(0.05, 0, 20), (0.2, 2, 30), (0.0, 0, 10)])
def test_what_is_kept_is_the_best_of_the_range_that_the_margin_lets_through(corpus, similarities, margin, low, high):
    """For each sentence: its ``high`` nearest other sentences by the teacher's cosine, best first;
    those above ``(1 - margin) x`` the positive's (the sentence itself: 1) dropped; of the rest, from
    rank ``low`` on (0: the nearest left), the first ``mine_negatives`` are kept. A copy is the
    first one kept without a margin, and never kept with one."""
    distinct, sim = similarities
    params = MinedParams(mine_range_min=low, mine_range_max=high, mine_margin=margin, mine_negatives=3)
    kept = mine(corpus, params)
    index = {s: i for i, s in enumerate(distinct)}
    checked = 0
    for i, sentence in enumerate(distinct):
        order = [j for j in np.argsort(-sim[i], kind="stable") if j != i]
        allowed = [j for j in order[:high] if not margin or sim[i, j] <= (1 - margin) * sim[i, i] + 1e-6][low:]
        got = [index[t] for t in kept.get(sentence, [])]
        # The same candidates, best first, up to ties (a capitalised copy and its original; two
        # neighbours within round-off of each other at the range's edge).
        assert len(got) == len(allowed[:3]) and i not in got, (sentence, got, allowed[:3])
        np.testing.assert_allclose(sim[i, got], sim[i, allowed[:3]], atol=1e-4)
        assert all(not margin or sim[i, j] <= (1 - margin) * sim[i, i] + 1e-6 for j in got)
        checked += bool(got)
    assert checked > len(distinct) // 2
    copies = [kept.get(s, [None])[0] == s.upper() for s in corpus[:6]]
    assert all(copies) if not margin else not any(copies), copies


def test_what_is_kept_is_what_sentence_transformers_mine_hard_negatives_keeps(corpus, similarities):
    """The rule applied to the teacher's embeddings keeps, for every sentence, the candidates that
    sentence-transformers' ``mine_hard_negatives`` keeps when it encodes the corpus itself (the
    same similarities, up to ties within round-off)."""
    from datasets import Dataset
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.util import mine_hard_negatives

    from methods.encoder import resolve_backbone

    distinct, sim = similarities
    index = {s: i for i, s in enumerate(distinct)}
    params = MinedParams(mine_range_min=1, mine_range_max=15, mine_margin=0.1, mine_negatives=4)
    theirs = mine_hard_negatives(
        Dataset.from_dict({"anchor": distinct, "positive": distinct}), SentenceTransformer(resolve_backbone("minilm")),
        corpus=distinct, range_min=1, range_max=15, relative_margin=0.1, num_negatives=4, sampling_strategy="top",
        output_format="labeled-list", batch_size=128, verbose=False)
    want = {row["anchor"]: [t for t, label in zip(row["positive"], row["labels"]) if label == 0] for row in theirs}
    got = mine(corpus, params)
    assert set(got) == {s for s, kept in want.items() if kept}
    for sentence, kept in got.items():
        i = index[sentence]
        assert len(kept) == len(want[sentence])
        np.testing.assert_allclose(sim[i, [index[t] for t in kept]], sim[i, [index[t] for t in want[sentence]]],
                                   atol=1e-4)


def test_each_epoch_draws_one_kept_candidate_by_row_from_the_seed(tmp_path):
    state = {"a": ["x", "y", "z"], "b": ["w"]}
    save_mined(state, tmp_path)
    assert load_mined(tmp_path) == state
    ingredient = MinedNegatives()
    batch = {"sentence": np.array(["a", "b", "c", "a"], dtype=object), "row": np.array([0, 1, 2, 3])}
    draws = [ingredient.augment(batch, state, Draws(seed, epoch))["mined_negative"].tolist()
             for seed, epoch in ((0, 0), (0, 0), (0, 1), (1, 0))]
    assert draws[0] == draws[1]  # a function of the seed and the epoch
    for drawn in draws:
        assert drawn[0] in state["a"] and drawn[1] == "w" and drawn[2] == "" and drawn[3] in state["a"]
    many = [ingredient.augment(batch, state, Draws(0, e))["mined_negative"][0] for e in range(60)]
    assert set(many) == set(state["a"])


def test_a_recipe_with_a_teacher_is_teacher_assisted_and_the_papers_are_unsupervised():
    assert {Recipe.named(name).supervision for name in NAMED} == {"unsupervised"}
    recipe = Recipe(RecipeSpec(negatives=("mined", "una")), {"mined": MinedParams(teacher="minilm")})
    assert recipe.supervision == "teacher-assisted (minilm)"


def test_bad_mining_settings_are_one_line():
    for values, needle in (({"mine_margin": 1.0}, "mine_margin must be in [0, 1)"),
                           ({"mine_range_min": 5, "mine_range_max": 5}, "below mine_range_max"),
                           ({"mine_negatives": 0}, "mine_negatives must be >= 1")):
        with pytest.raises(InvalidParams, match=needle.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
            MinedParams(**values).validate()
