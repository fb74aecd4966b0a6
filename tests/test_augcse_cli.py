"""AugCSE through the platform: augment to Parquet (cached per augmentation), a 2-trial sweep from
that cache with lambda and discriminator accuracy in MLflow, the GRL grid, bad input."""

from __future__ import annotations

import pandas as pd
import pytest

from methods.augmentations import AUGMENTATION_SETS, NO_AUGMENTATION
from platform.config import TrainConfig
from platform.space import load_space
from tests.conftest import assert_user_error, run_cli
from tests.test_cli import ONE_WORKER, _runs, _train_args


@pytest.fixture()
def few_sentences(small_corpus, tmp_path):
    path = tmp_path / "few.txt"
    path.write_text("\n".join(open(small_corpus).read().split("\n")[:96]) + "\n")
    return path


def test_augment_then_tune_augcse_from_the_cache(tiny_model, few_sentences, tmp_path, mlflow_uri):
    env = {"PLATFORM_CACHE_DIR": str(tmp_path / "cache")}
    out = tmp_path / "augcse"
    proc = run_cli("augment", "augcse", "--corpus", str(few_sentences), "--out", str(out), "--num-cpus", "2", env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    df = pd.read_parquet(out)
    assert list(df.columns) == ["sentence", "augmented", "aug_label"] and len(df) == 96
    assert set(df["aug_label"]) <= {NO_AUGMENTATION, *AUGMENTATION_SETS["8-aug"]}
    assert ((df["aug_label"] == NO_AUGMENTATION) == (df["augmented"] == df["sentence"])).all()
    assert df["aug_label"].nunique() >= 4
    entries = sorted(p.name.split("-")[1] for p in (tmp_path / "cache").glob("gen-aug_*") if (p / "COMPLETE").is_file())
    assert entries == sorted(f"aug_{n}" for n in AUGMENTATION_SETS["8-aug"])

    # A set sharing seven augmentations generates only the missing one.
    out12 = tmp_path / "augcse12"
    proc = run_cli("augment", "augcse", "--corpus", str(few_sentences), "--out", str(out12), "--num-cpus", "2",
                   "--set", "augmentations=contraction_expansion,number_to_word", env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    entries = sorted((tmp_path / "cache").glob("gen-aug_*"))
    assert len(entries) == 9
    assert set(pd.read_parquet(out12)["aug_label"]) <= {NO_AUGMENTATION, "contraction_expansion", "number_to_word"}

    # A sweep on the same corpus and cache regenerates nothing: the augmentations the augment
    # command made come from its cache (two trials, lambda and discriminator metrics in MLflow).
    # Batches read locally: the Ray Data pipeline under Tune is exercised by the recipe sweep.
    before = {p.name: (p / "COMPLETE").stat().st_mtime_ns for p in (tmp_path / "cache").glob("gen-*")}
    proc = run_cli("tune", "augcse", "--num-samples", "2", *_train_args(tiny_model, few_sentences, tmp_path, *ONE_WORKER,
                                                                         "--set", "data_pipeline=local"),
                   env={"MLFLOW_TRACKING_URI": mlflow_uri, **env})
    assert proc.returncode == 0, proc.stderr[-3000:]
    after = {p.name: (p / "COMPLETE").stat().st_mtime_ns for p in (tmp_path / "cache").glob("gen-*")}
    assert {k: after.get(k) for k in before} == before  # a trial drawing 4-aug or 12-aug adds only what is missing
    c, runs = _runs(mlflow_uri, "augcse")
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId")]
    assert len(children) == 2 and all(r.info.status == "FINISHED" for r in runs)
    for child in children:
        assert {"lambda_disc", "lr", "augmentations", "grl_multiplier"} <= set(child.data.params)
        history = c.get_metric_history(child.info.run_id, "disc_accuracy")
        assert len(history) >= 2 and all(0 <= m.value <= 1 for m in history)
        assert c.get_metric_history(child.info.run_id, "disc_loss")


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


def test_missing_wordnet_is_one_clear_line(few_sentences, tmp_path):
    """A subprocess: NLTK reads $NLTK_DATA when it is first imported."""
    empty = tmp_path / "no_nltk"
    empty.mkdir()
    proc = run_cli("augment", "augcse", "--corpus", str(few_sentences), "--out", str(tmp_path / "o"),
                   env={"PLATFORM_CACHE_DIR": str(tmp_path / "cache"), "NLTK_DATA": str(empty)})
    assert_user_error(proc, "WordNet data was not found", "nltk.download('wordnet')")
