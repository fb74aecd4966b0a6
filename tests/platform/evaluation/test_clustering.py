"""Clustering evaluation: Hungarian-matched K-means accuracy on synthetic and real labelled sets."""

from __future__ import annotations

import json

import numpy as np
import pytest

from platform.evaluation.clustering import cluster_accuracy, kmeans_accuracy, load_labelled
from tests.helpers import assert_user_error, run_main


def test_matching_is_invariant_to_cluster_names():
    labels = np.array([0, 0, 1, 1, 2, 2])
    assert cluster_accuracy(np.array([2, 2, 0, 0, 1, 1]), labels) == 1.0
    assert cluster_accuracy(np.array([1, 1, 1, 0, 0, 2]), labels) == pytest.approx(4 / 6)


def test_well_separated_synthetic_clusters_are_recovered():
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(4, 16)) * 10
    labels = np.repeat(np.arange(4), 50)
    x = centres[labels] + rng.normal(size=(200, 16))
    assert kmeans_accuracy(x, labels)["accuracy"] == pytest.approx(100.0)
    noise = rng.normal(size=(200, 16))  # no structure: far from perfect
    assert kmeans_accuracy(noise, labels)["accuracy"] < 50


def test_kmeans_keeps_the_best_of_ten_restarts():
    """The authors' protocol: each seed's K-means keeps the lowest-inertia of 10 initialisations
    (scikit-learn's default of their time); with one initialisation the result differs here."""
    from sklearn.cluster import KMeans

    rng = np.random.default_rng(3)
    labels = np.repeat(np.arange(6), 40)
    x = rng.normal(size=(6, 8))[labels] * 1.2 + rng.normal(size=(240, 8))
    direct = [cluster_accuracy(KMeans(6, n_init=10, random_state=s).fit_predict(x), labels) for s in range(10)]
    assert kmeans_accuracy(x, labels)["accuracy"] == pytest.approx(100 * np.mean(direct))
    assert kmeans_accuracy(x, labels)["accuracy"] != pytest.approx(kmeans_accuracy(x, labels, n_init=1)["accuracy"])


def test_trec_loader(data_root):
    texts, labels = load_labelled("TREC", data_root)
    assert len(texts) == 5952 and labels.max() == 5
    texts, labels = load_labelled("SUBJ", data_root)
    assert len(texts) == 10000 and set(labels.tolist()) == {0, 1}


def test_evaluate_cli_clustering(tiny_model, tmp_path):
    proc = run_main("evaluate", str(tiny_model), "--pooler", "avg", "--tasks", "clustering", "--json", str(tmp_path / "c.json"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "clustering TREC (5952 sentences, 6 classes)" in proc.stdout
    acc = json.loads((tmp_path / "c.json").read_text())["scores"]["cluster:TREC"]
    assert 100 / 6 <= acc <= 100


def test_unknown_clustering_set(cli):
    assert_user_error(cli("evaluate", "minilm", "--tasks", "cluster:AGNEWS"), "unknown task 'cluster:AGNEWS'")


def _write_set(root, name, rows):
    folder = root / "clustering"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.tsv").write_text("".join(f"{label}\t{text}\r\n" for label, text in rows), encoding="utf-8")


def test_paper_sets_are_embedded_as_the_authors_code_does(tiny_model, tmp_path):
    """VaSCL's sets: the masked mean of the last layer over at most 64 tokens, whatever the model's
    pooler; against a direct transformers computation (their clustering_eval.py's steps). The
    SentEval stand-ins keep the model's pooler and no truncation."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    from methods.encoder import Encoder
    from platform.evaluation.clustering import embed

    texts = ["a short one", "word " * 150, "the cat sat on the mat"]
    encoder = Encoder.from_pretrained(str(tiny_model), pooler="cls_before_pooler")
    got = embed(encoder, texts, "AgNews")
    tok, model = AutoTokenizer.from_pretrained(str(tiny_model)), AutoModel.from_pretrained(str(tiny_model)).eval()
    with torch.no_grad():
        f = tok(texts, max_length=64, padding="max_length", truncation=True, return_tensors="pt")
        last = model(**f)[0]
        mask = f["attention_mask"].unsqueeze(-1)
        want = ((last * mask).sum(1) / mask.sum(1)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    untruncated = embed(encoder, texts, "TREC")
    np.testing.assert_allclose(untruncated, encoder.encode(texts).numpy(), rtol=1e-5, atol=1e-6)
    assert not np.allclose(untruncated[1], got[1], atol=1e-3)


def test_paper_set_files_read_as_the_public_copy_writes_them(tmp_path):
    _write_set(tmp_path, "StackOverflow", [(18, "How do I fill a DataSet ?\t"), (3, "Best clients"), (18, ""), (7, "x")])
    texts, labels = load_labelled("StackOverflow", tmp_path)
    assert texts == ["How do I fill a DataSet ?", "Best clients", ".", "x"]
    assert labels.tolist() == [2, 0, 2, 1]  # classes in label order, 0..K-1
    (tmp_path / "clustering" / "Tweet.tsv").write_text("37 no tab here\n", encoding="utf-8")
    from platform.errors import DataError

    with pytest.raises(DataError, match=r"Tweet.tsv:1: expected 'label<TAB>text'"):
        load_labelled("Tweet", tmp_path)
    with pytest.raises(DataError, match="python -m platform.data fetch clustering"):
        load_labelled("Biomedical", tmp_path)


def test_evaluate_cli_on_a_paper_set(tiny_model, tmp_path):
    rows = [(label, f"topic {label} sentence {k} " + "filler " * k) for label in (1, 2, 3) for k in range(12)]
    _write_set(tmp_path, "AgNews", rows)
    proc = run_main("evaluate", str(tiny_model), "--tasks", "cluster:AgNews", "--json", str(tmp_path / "c.json"),
                    env={"PLATFORM_DATA_DIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "clustering AgNews (36 sentences, 3 classes)" in proc.stdout
    assert "VaSCL authors' protocol: mean pooling, 64 tokens" in proc.stdout
    acc = json.loads((tmp_path / "c.json").read_text())["scores"]["cluster:AgNews"]
    assert 100 / 3 <= acc <= 100


def test_the_paper_group_without_the_data_is_one_line(cli, tmp_path):
    proc = cli("evaluate", "minilm", "--tasks", "clustering-paper", env={"PLATFORM_DATA_DIR": str(tmp_path)})
    assert_user_error(proc, "python -m platform.data fetch clustering")
