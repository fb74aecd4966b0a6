"""SentEval loaders (exact pair counts) and the corpus reader's handling of bad files."""

from __future__ import annotations

import gzip

import pytest

from platform.data import DataError, data_dir, load_sts, read_corpus, resolve_corpus

COUNTS = {"STS12": 3108, "STS13": 1500, "STS14": 3750, "STS15": 3000, "STS16": 1186, "STSBenchmark": 1379, "SICKRelatedness": 4927}


@pytest.mark.parametrize("task,count", COUNTS.items())
def test_sts_test_pair_counts(data_root, task, count):
    pairs = load_sts(task, data_root)
    assert len(pairs) == count == len(pairs.sent1) == len(pairs.sent2)
    assert pairs.scores.min() >= 0 and pairs.scores.max() <= 5


def test_stsb_dev_and_train_counts(data_root):
    assert len(load_sts("STSBenchmark", data_root, split="dev")) == 1500
    assert len(load_sts("STSBenchmark", data_root, split="train")) == 5749


def test_sts_gold_filtering_drops_unscored_pairs(tmp_path, data_root):
    base = tmp_path / "downstream" / "STS" / "STS16-en-test"
    base.mkdir(parents=True)
    for name in ["answer-answer", "headlines", "plagiarism", "postediting", "question-question"]:
        (base / f"STS.input.{name}.txt").write_text("a b\tc d\ne f\tg h\ni\tj\n")
        (base / f"STS.gs.{name}.txt").write_text("1.5\n\n4\n")
    pairs = load_sts("STS16", tmp_path)
    assert len(pairs) == 10 and pairs.sent1[:2] == ["a b", "i"]


def test_missing_file_names_it(tmp_path):
    (tmp_path / "downstream").mkdir()
    with pytest.raises(DataError, match="sts-dev.csv.*expected SentEval layout"):
        load_sts("STSBenchmark", tmp_path, split="dev")


def test_data_dir_unset_or_missing(monkeypatch, tmp_path):
    monkeypatch.delenv("PLATFORM_DATA_DIR")
    with pytest.raises(DataError, match="PLATFORM_DATA_DIR"):
        data_dir()
    with pytest.raises(DataError, match="does not exist"):
        data_dir(tmp_path / "nope")


def test_corpus_strips_and_skips_blank_lines(tmp_path):
    path = tmp_path / "c.txt"
    path.write_bytes(b"  first sentence \n\n\t\nsecond one\r\n")
    assert read_corpus(path) == ["first sentence", "second one"]


def test_corpus_gzip_and_limit(tmp_path):
    path = tmp_path / "c.txt.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write("a\nb\nc\n")
    assert read_corpus(path) == ["a", "b", "c"]
    assert read_corpus(path, limit=2) == ["a", "b"]


def test_corpus_undecodable_bytes_name_the_line(tmp_path):
    path = tmp_path / "c.txt"
    path.write_bytes(b"fine\nalso fine\nbad \xff byte\n")
    with pytest.raises(DataError, match="line 3"):
        read_corpus(path)


@pytest.mark.parametrize(
    "content,message", [(b"", "no sentences"), (b"\n \n\n", "no sentences"), (b"\x00\x01\x02binary", "binary")]
)
def test_corpus_rejects_empty_and_binary(tmp_path, content, message):
    path = tmp_path / "c.txt"
    path.write_bytes(content)
    with pytest.raises(DataError, match=message):
        read_corpus(path)


def test_corpus_missing_and_truncated_gzip(tmp_path):
    with pytest.raises(DataError, match="not found"):
        read_corpus(tmp_path / "missing.txt")
    path = tmp_path / "t.txt.gz"
    whole = gzip.compress("".join(f"sentence number {i}\n" for i in range(5000)).encode())
    path.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(DataError, match="cannot be read"):
        read_corpus(path)


def test_resolve_corpus_by_name_under_data_dir(data_root):
    assert resolve_corpus("brown_sentences.txt.gz") == data_root / "corpus" / "brown_sentences.txt.gz"
    with pytest.raises(DataError, match="not found"):
        resolve_corpus("no_such_corpus.txt")


def test_corpus_rejects_huge_lines(tmp_path, monkeypatch):
    import platform.data as data

    monkeypatch.setattr(data, "MAX_LINE_BYTES", 64)
    path = tmp_path / "c.txt"
    path.write_bytes(b"fine\n" + b"x" * 65 + b"\nafter\n")
    with pytest.raises(DataError, match="line 2 is longer than 64 bytes"):
        read_corpus(path)
    path.write_bytes(b"fine\n" + b"x" * 64 + b"\n")  # exactly at the limit is accepted
    assert read_corpus(path) == ["fine", "x" * 64]


def test_the_steps_tensors_own_their_memory_when_ray_hands_read_only_arrays(tiny_model):
    """Ray Data's batches arrive as read-only views of its object store: every tensor the step gets
    is its own, writable without a warning, and a write to it leaves the batch's arrays as they were."""
    import warnings

    import numpy as np

    from methods.recipe import Recipe
    from platform.data.pipeline import StepInputs

    for static in (False, True):
        inputs = StepInputs(Recipe.named("simcse"), str(tiny_model), 16, static=static)
        arrays = inputs.arrays({"sentence": np.array(["a cat sat", "a dog sat on the mat"], dtype=object)})
        arrays["rank_teacher_0"] = np.arange(6, dtype=np.float32).reshape(2, 3)  # a tensor column, as RankCSE's
        before = {k: v.copy() for k, v in arrays.items()}
        for a in arrays.values():
            a.setflags(write=False)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            tensors = inputs.collate(arrays)
        assert set(tensors) >= {"sentence/input_ids", "sentence/attention_mask", "rank_teacher_0"}
        for t in tensors.values():
            t.add_(1)
        for key, value in arrays.items():
            assert np.array_equal(value, before[key]), (static, key)
