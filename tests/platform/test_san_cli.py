"""SAN through the platform: augment to Parquet, bad input. Its sweep runs in the combined recipe
sweep (``tests/platform/test_recipe_cli.py``), which searches SAN's space with UNA's and VaSCL's."""

from __future__ import annotations

import pandas as pd
import pytest

from tests.helpers import assert_user_error, corpus_head, run_cli

pytestmark = pytest.mark.e2e


@pytest.fixture()
def few_sentences(small_corpus, tmp_path):
    return corpus_head(small_corpus, 64, tmp_path)


def test_augment_san_writes_parquet(few_sentences, tmp_path):
    out = tmp_path / "san"
    proc = run_cli("augment", "san", "--corpus", str(few_sentences), "--out", str(out), "--num-cpus", "2",
                   env={"PLATFORM_CACHE_DIR": str(tmp_path / "cache")})
    assert proc.returncode == 0, proc.stderr[-3000:]
    df = pd.read_parquet(out)
    assert list(df.columns) == ["sentence", "san_negative"] and len(df) == 64
    assert (df["san_negative"] != df["sentence"]).mean() > 0.9
    assert any((tmp_path / "cache").glob("gen-san_negative-*/COMPLETE"))


@pytest.mark.parametrize(
    "sets,needle",
    [
        (["tau2=0"], "tau2 must be > 0"),
        (["p2=1.0"], "p2 must be in [0, 1)"),
        (["rounds=0"], "rounds must be >= 1"),
        (["spacy_model=en_core_web_lg"], "pip install en-core-web-lg"),
    ],
)
def test_san_bad_input(sets, needle, few_sentences, tmp_path, cli):
    args = [a for s in sets for a in ("--set", s)]
    proc = cli("augment", "san", "--corpus", str(few_sentences), "--out", str(tmp_path / "o"), *args,
                   env={"PLATFORM_CACHE_DIR": str(tmp_path / "cache")})
    assert_user_error(proc, needle)


def test_san_mlm_that_is_not_masked(tiny_model, few_sentences, tmp_path):
    """A subprocess: loading the model logs through transformers' logger (bound to a stream)."""
    proc = run_cli("augment", "san", "--corpus", str(few_sentences), "--out", str(tmp_path / "o"),
                   "--set", f"mlm={tiny_model}", env={"PLATFORM_CACHE_DIR": str(tmp_path / "cache")})
    assert_user_error(proc, "not a masked language model")
