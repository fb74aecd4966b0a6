"""UNA through the platform: the augment CLI, a 2-trial sweep, the TF-IDF cache, bad input."""

from __future__ import annotations

import pandas as pd
import pytest

from tests.conftest import assert_user_error, run_cli
from tests.test_cli import ONE_WORKER, _runs, _train_args


def test_augment_una_writes_parquet(small_corpus, tmp_path):
    out = tmp_path / "aug"
    proc = run_cli("augment", "una", "--corpus", str(small_corpus), "--out", str(out), "--set", "r=50",
                   env={"PLATFORM_CACHE_DIR": str(tmp_path / "cache")})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "sentences/s" in proc.stdout
    df = pd.read_parquet(out)
    assert list(df.columns) == ["sentence", "una_negative"] and len(df) == 256
    assert (df["sentence"] != df["una_negative"]).all()
    assert sorted(df["sentence"]) == sorted(open(small_corpus).read().split("\n")[:-1])
    entries = list((tmp_path / "cache").iterdir())
    assert len(entries) == 1 and (entries[0] / "COMPLETE").is_file() and (entries[0] / "tfidf.npz").is_file()


def test_tune_una_two_trials(tiny_model, small_corpus, tmp_path, mlflow_uri):
    proc = run_cli(
        "tune", "una", "--num-samples", "2", *_train_args(tiny_model, small_corpus, tmp_path, *ONE_WORKER), "--set", "alpha=1",
        env={"MLFLOW_TRACKING_URI": mlflow_uri, "PLATFORM_CACHE_DIR": str(tmp_path / "cache")},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "r randint [1000, 6000] clipped to" in proc.stdout  # 256 sentences: a small vocabulary
    c, runs = _runs(mlflow_uri, "una")
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId")]
    assert len(children) == 2 and all(r.info.status == "FINISHED" for r in runs)
    for child in children:
        assert {"alpha", "beta", "r", "lr"} <= set(child.data.params)
        assert 0.3 <= float(child.data.params["beta"]) <= 0.8
    assert any("sts_avg" in r.data.metrics for r in runs if r.data.tags.get("sweep") == "true")


@pytest.mark.parametrize(
    "sets,needle",
    [
        (["beta=0"], "beta must be > 0"),
        (["r=0"], "r must be >= 1"),
        (["alpha=-1"], "alpha must be >= 0"),
        (["r=100000"], "vocabulary larger than 2r"),
    ],
)
def test_una_bad_params(sets, needle, small_corpus, tmp_path):
    args = [a for s in sets for a in ("--set", s)]
    proc = run_cli("augment", "una", "--corpus", str(small_corpus), "--out", str(tmp_path / "o"), *args,
                   env={"PLATFORM_CACHE_DIR": str(tmp_path / "cache")})
    assert_user_error(proc, needle)
    assert not (tmp_path / "o").exists()


def test_una_corpus_of_one_sentence(tmp_path):
    one = tmp_path / "one.txt"
    one.write_text("just one sentence here\n")
    assert_user_error(run_cli("augment", "una", "--corpus", str(one), "--out", str(tmp_path / "o"),
                              env={"PLATFORM_CACHE_DIR": str(tmp_path / "cache")}), "at least 2")
    assert not any((tmp_path / "cache").glob("*")) if (tmp_path / "cache").exists() else True


def test_simcse_has_nothing_to_augment(small_corpus, tmp_path):
    assert_user_error(run_cli("augment", "simcse", "--corpus", str(small_corpus)), "no augmentation")


def test_unknown_grid(tmp_path):
    assert_user_error(run_cli("tune", "una", "--grid", "gamma"), "no grid 'gamma'")
