"""UNA through the platform: the augment CLI, the TF-IDF cache, bad input. Its sweep runs in the
combined recipe sweep (``tests/platform/test_recipe_cli.py``), which searches UNA's space with SAN's and VaSCL's."""

from __future__ import annotations

import pandas as pd
import pytest

from tests.helpers import assert_user_error, run_cli

pytestmark = pytest.mark.e2e


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


@pytest.mark.parametrize(
    "sets,needle",
    [
        (["beta=0"], "beta must be > 0"),
        (["r=0"], "r must be >= 1"),
        (["alpha=-1"], "alpha must be >= 0"),
    ],
)
def test_una_bad_params(sets, needle, small_corpus, tmp_path, cli):
    args = [a for s in sets for a in ("--set", s)]
    proc = cli("augment", "una", "--corpus", str(small_corpus), "--out", str(tmp_path / "o"), *args,
               env={"PLATFORM_CACHE_DIR": str(tmp_path / "cache")})
    assert_user_error(proc, needle)
    assert not (tmp_path / "o").exists()


def test_una_window_wider_than_the_vocabulary(small_corpus, tmp_path):
    """Found once the corpus statistics exist (after Ray started): the same one line."""
    proc = run_cli("augment", "una", "--corpus", str(small_corpus), "--out", str(tmp_path / "o"), "--set", "r=100000",
                   env={"PLATFORM_CACHE_DIR": str(tmp_path / "cache")})
    assert_user_error(proc, "vocabulary larger than 2r")
    assert not (tmp_path / "o").exists()


def test_una_corpus_of_one_sentence(tmp_path, cli):
    """Found on the driver before Ray starts (IDF over one document is 0 for every term)."""
    one = tmp_path / "one.txt"
    one.write_text("just one sentence here\n")
    proc = cli("augment", "una", "--corpus", str(one), "--out", str(tmp_path / "o"),
               env={"PLATFORM_CACHE_DIR": str(tmp_path / "cache")})
    assert_user_error(proc, "at least 2")  # (run_main fails the test if the command starts Ray)
    assert not any((tmp_path / "cache").glob("*")) if (tmp_path / "cache").exists() else True


def test_simcse_has_nothing_to_augment(small_corpus, tmp_path, cli):
    assert_user_error(cli("augment", "simcse", "--corpus", str(small_corpus)), "no augmentation")


def test_unknown_grid(tmp_path, cli):
    assert_user_error(cli("tune", "una", "--grid", "gamma"), "no grid 'gamma'")
