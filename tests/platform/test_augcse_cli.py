"""AugCSE through the platform: the GRL grid, bad input. (Augment to Parquet, cached per
augmentation, and a sweep from that cache: tests/platform/test_grid.py.)"""

from __future__ import annotations

import pytest

from platform.config import TrainConfig
from platform.space import load_space
from tests.helpers import assert_user_error, corpus_head, run_cli


@pytest.fixture()
def few_sentences(small_corpus, tmp_path):
    return corpus_head(small_corpus, 96, tmp_path)


def test_grl_grid_is_the_table7_ablation():
    spec = load_space(TrainConfig.build("augcse", "local"), grid="grl_multiplier")
    assert spec.space == {"grl_multiplier": ("grid", [-100, -10, -1, 0, 1, 10, 100])}
    assert spec.search == "grid"


@pytest.mark.parametrize(
    "sets,needle",
    [
        (["augmentations=random_swap,back_translation"], "unknown augmentation 'back_translation'"),
        (["augmentations=,"], "augmentations is empty"),
        (["lambda_disc=-0.1"], "lambda_disc must be >= 0"),
        (["spacy_model=en_core_web_lg"], "pip install en-core-web-lg"),
    ],
)
def test_augcse_bad_input(sets, needle, few_sentences, tmp_path, cli):
    args = [a for s in sets for a in ("--set", s)]
    proc = cli("augment", "augcse", "--corpus", str(few_sentences), "--out", str(tmp_path / "o"), *args,
                   env={"PLATFORM_CACHE_DIR": str(tmp_path / "cache")})
    assert_user_error(proc, needle)
    assert not (tmp_path / "o").exists()


@pytest.mark.e2e
def test_missing_wordnet_is_one_clear_line(few_sentences, tmp_path):
    """A subprocess: NLTK reads $NLTK_DATA when it is first imported."""
    empty = tmp_path / "no_nltk"
    empty.mkdir()
    proc = run_cli("augment", "augcse", "--corpus", str(few_sentences), "--out", str(tmp_path / "o"),
                   env={"PLATFORM_CACHE_DIR": str(tmp_path / "cache"), "NLTK_DATA": str(empty)})
    assert_user_error(proc, "WordNet data was not found", "nltk.download('wordnet')")
