"""Paraphrase positives: a tiny random seq2seq model, generated once per corpus (with and without
Ray Data actors), cached, fed to the TF-IDF corpus and the loss; a foreign cache is rejected."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from methods.recipe import Recipe
from platform.data.columns import TextRows, build_tiny_bart, corpus_columns, statistics_input
from platform.data import DataError
from tests.helpers import assert_user_error, run_cli

SENTS = ["a man plays the guitar .", "the cat sleeps on the mat .", "rain is expected tomorrow .", "stocks fell on monday ."]


@pytest.fixture(scope="module")
def tiny_seq2seq(tmp_path_factory):
    return build_tiny_bart(tmp_path_factory.mktemp("tiny-bart"))


def test_generation_in_process_is_cached_and_feeds_statistics(tiny_seq2seq, tmp_path, monkeypatch):
    monkeypatch.setenv("PLATFORM_CACHE_DIR", str(tmp_path / "cache"))
    method = Recipe.named("una", positives="paraphrase", paraphraser=str(tiny_seq2seq), paraphrase_beams=2,
                          paraphrase_max_length=12)
    with pytest.raises(DataError, match="paraphrase are not in the cache .* made before the trials"):
        corpus_columns(method, SENTS, use_ray=False, generate=False)  # a sweep's trial reads, never generates
    assert not list((tmp_path / "cache").glob("gen-*"))
    cols = corpus_columns(method, SENTS, use_ray=False)
    again = corpus_columns(method, SENTS, use_ray=False, generate=False)
    assert {k: v.to_pylist() for k, v in again.items()} == {k: v.to_pylist() for k, v in cols.items()}
    assert cols["sentence"].to_pylist() == SENTS and len(cols["paraphrase"]) == 4
    assert all(isinstance(p, str) for p in cols["paraphrase"].to_pylist())
    assert list(statistics_input(cols)) == SENTS + cols["paraphrase"].to_pylist()
    monkeypatch.setattr(TextRows, "SLICE", 3)  # slices that cut a column: the same rows, in order
    assert list(statistics_input(cols)) == SENTS + cols["paraphrase"].to_pylist() and len(statistics_input(cols)) == 8
    assert "paraphrase" in method.text_columns
    entries = list((tmp_path / "cache").glob("gen-paraphrase-*"))
    assert len(entries) == 1
    # A second call reads the cache instead of generating: with the model moved away, only the
    # cache can answer (the key holds the model name, so the same name is used).
    moved = tmp_path / "moved"
    tiny_seq2seq.rename(moved)
    try:
        method2 = Recipe.named("una", positives="paraphrase", paraphraser=str(tiny_seq2seq), paraphrase_beams=2,
                               paraphrase_max_length=12)
        assert corpus_columns(method2, SENTS, use_ray=False) == cols
    finally:
        moved.rename(tiny_seq2seq)


def test_foreign_cache_is_rejected(tmp_path):
    path = tmp_path / "p.parquet"
    pq.write_table(pa.table({"sentence": SENTS[:3] + ["something else"], "paraphrase": ["x"] * 4}), path)
    method = Recipe.named("una", positives="paraphrase", paraphrase_cache=str(path))
    with pytest.raises(DataError, match="row 4"):
        corpus_columns(method, SENTS)
    pq.write_table(pa.table({"sentence": SENTS[:2], "paraphrase": ["x"] * 2}), path)
    with pytest.raises(DataError, match="2 rows for 4 sentences"):
        corpus_columns(method, SENTS)
    pq.write_table(pa.table({"sentence": SENTS, "paraphrase": ["p"] * 4}), path)
    assert corpus_columns(method, SENTS)["paraphrase"].to_pylist() == ["p"] * 4


def test_paraphrases_are_the_positives_in_the_loss(tiny_model):
    from methods.encoder import Encoder
    from methods.losses import info_nce

    torch.manual_seed(0)
    method = Recipe.named("una", positives="paraphrase", alpha=2, paraphrase_cache="unused.parquet")
    enc = Encoder.from_pretrained(str(tiny_model), dropout=0.0)
    model = method.build(enc).eval()
    paras = ["a man is playing guitar", "a cat is sleeping", "it will rain", "markets dropped"]
    batch = {"sentence": enc.tokenize(SENTS), "paraphrase": enc.tokenize(paras), "una_negative": enc.tokenize(["x"] * 4)}
    loss, _ = method.loss(model, batch, 1)  # step 1 with alpha 2: no negatives
    with torch.no_grad():
        z = model.project({"a": model(enc.tokenize(SENTS)), "p": model(enc.tokenize(paras))}, ["a", "p"])
        expected = info_nce(z["a"], z["p"], 0.05)
    assert float(loss.detach()) == pytest.approx(float(expected), rel=1e-4)


@pytest.mark.e2e
def test_augment_cli_with_ray_actors_and_mismatch(tiny_seq2seq, small_corpus, tmp_path, cli):
    env = {"PLATFORM_CACHE_DIR": str(tmp_path / "cache")}
    few = tmp_path / "few.txt"
    few.write_text("\n".join(open(small_corpus).read().split("\n")[:64]) + "\n")
    proc = run_cli("augment", "una", "--corpus", str(few), "--out", str(tmp_path / "o"), "--num-cpus", "2",
                   "--set", "positives=paraphrase", "--set", f"paraphraser={tiny_seq2seq}", "--set", "paraphrase_beams=2",
                   "--set", "paraphrase_max_length=12", "--set", "r=20", env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    import pandas as pd

    df = pd.read_parquet(tmp_path / "o")
    assert set(df.columns) == {"sentence", "paraphrase", "una_negative"} and len(df) == 64
    cache = next((tmp_path / "cache").glob("gen-paraphrase-*")) / "paraphrase.parquet"
    proc = cli("augment", "una", "--corpus", str(small_corpus), "--out", str(tmp_path / "o2"),  # refused before Ray starts
               "--set", "positives=paraphrase", "--set", f"paraphrase_cache={cache}", "--set", "r=20", env=env)
    assert_user_error(proc, "does not match the corpus")


@pytest.mark.e2e
def test_a_generator_pool_asks_ray_for_the_memory_of_its_process_and_models(tiny_seq2seq, tmp_path, monkeypatch):
    """The paraphrase pass of a recipe on Ray Data: each actor asks Ray for its process and the
    paraphraser's weights (as a teacher's pool does), so that a fractional ``augment_cpus`` never
    puts more of them on a node than its memory holds."""
    import ray
    from ray.util.state import list_actors

    from platform.data.columns import missing_generations
    from platform.data.pipeline import PROCESS_BYTES, actor_memory, generate_columns, weight_bytes
    from platform.run.ray_env import init_ray

    monkeypatch.setenv("PLATFORM_CACHE_DIR", str(tmp_path / "cache"))
    method = Recipe.named("una", positives="paraphrase", paraphraser=str(tiny_seq2seq), paraphrase_beams=2,
                          paraphrase_max_length=12)
    jobs = [job for job, _ in missing_generations([method], "0" * 64)]
    assert [job.models for job in jobs] == [(str(tiny_seq2seq),)]
    init_ray(num_cpus=2)
    try:
        made = generate_columns(SENTS * 8, jobs, use_ray=True, use_gpu=False, cpus=0.2)
        pools = list_actors(address=ray.get_runtime_context().gcs_address, limit=100, detail=True,
                            filters=[("class_name", "=", "MapWorker(MapBatches(Generators))")])
        asked, expected = {a.required_resources.get("memory") for a in pools}, actor_memory(str(tiny_seq2seq))
    finally:
        ray.shutdown()
    assert len(made[0]["paraphrase"]) == 32
    weights = weight_bytes(str(tiny_seq2seq))
    assert weights > 0 and asked == {expected} == {int(1.25 * (PROCESS_BYTES + weights))}, asked
