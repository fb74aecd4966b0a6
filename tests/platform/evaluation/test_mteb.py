"""MTEB through the platform: mteb's STS tasks on the local SentEval files score as the platform's
own evaluator does; a retrieval and a clustering task made from small local files run through
mteb's machinery and land in MLflow; unknown and unreachable tasks are refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from methods.encoder import Encoder
from platform.evaluation.mteb_tasks import LOCAL_STS, evaluate, local_pairs, mteb_model, tasks_of
from platform.evaluation.sts import STSEvaluator
from tests.helpers import assert_user_error, run_main

GENERAL = {"description": "A task made from local files for the platform's tests.", "reference": None,
           "dataset": {"path": "local/test", "revision": "1"}, "category": "t2t", "eval_splits": ["test"],
           "eval_langs": ["eng-Latn"], "date": ("2026-01-01", "2026-01-01"), "dialect": [], "domains": [],
           "task_subtypes": [], "license": "cc-by-4.0", "annotations_creators": "derived", "modalities": ["text"],
           "sample_creation": "found", "bibtex_citation": ""}


def _local_tasks(folder: Path) -> list:
    """A retrieval task (queries, documents and relevance judgements in files) and a clustering
    task (sentences and labels in a file), each an mteb task class whose ``load_data`` reads them."""
    from datasets import Dataset, DatasetDict
    from mteb.abstasks.clustering import AbsTaskClustering
    from mteb.abstasks.retrieval import AbsTaskRetrieval
    from mteb.abstasks.retrieval_dataset_loaders import RetrievalSplitData
    from mteb.abstasks.task_metadata import TaskMetadata

    docs = ["a man plays the guitar on stage", "the stock market fell sharply today", "a dog runs across the park",
            "heavy rain is expected this weekend", "the chef cooks pasta for dinner"]
    queries = ["someone playing music", "shares dropped", "weather forecast"]
    (folder / "corpus.jsonl").write_text("\n".join(json.dumps({"id": f"d{i}", "text": t}) for i, t in enumerate(docs)))
    (folder / "queries.jsonl").write_text("\n".join(json.dumps({"id": f"q{i}", "text": t}) for i, t in enumerate(queries)))
    (folder / "qrels.tsv").write_text("q0\td0\t1\nq1\td1\t1\nq2\td3\t1\n")
    topics = {"music": ["a band plays rock music", "she sings a song", "the orchestra performs tonight"],
              "finance": ["stocks rose on monday", "the bank raised rates", "investors sold their shares"],
              "sport": ["the team won the match", "he scored a goal", "the runner finished first"]}
    (folder / "clusters.tsv").write_text("\n".join(f"{s}\t{i}" for i, texts in enumerate(topics.values()) for s in texts))

    class LocalRetrieval(AbsTaskRetrieval):
        metadata = TaskMetadata(type="Retrieval", name="LocalRetrieval", main_score="ndcg_at_10", **GENERAL)

        def load_data(self, num_proc=None, **kwargs):
            read = lambda name: [json.loads(line) for line in (folder / name).read_text().splitlines()]  # noqa: E731
            qrels = {}
            for line in (folder / "qrels.tsv").read_text().splitlines():
                q, d, rel = line.split("\t")
                qrels.setdefault(q, {})[d] = int(rel)
            split = RetrievalSplitData(queries=Dataset.from_list(read("queries.jsonl")),
                                       corpus=Dataset.from_list(read("corpus.jsonl")), relevant_docs=qrels, top_ranked=None)
            self.dataset = {"default": {"test": split}}
            self.data_loaded = True

    class LocalClustering(AbsTaskClustering):
        metadata = TaskMetadata(type="Clustering", name="LocalClustering", main_score="v_measure", **GENERAL)
        max_document_to_embed = 9
        max_fraction_of_documents_to_embed = None
        n_clusters = 2
        max_documents_per_cluster = 9

        def load_data(self, num_proc=None, **kwargs):
            rows = [line.split("\t") for line in (folder / "clusters.tsv").read_text().splitlines()]
            self.dataset = DatasetDict({"test": Dataset.from_dict({"sentences": [r[0] for r in rows],
                                                                   "labels": [int(r[1]) for r in rows]})})
            self.data_loaded = True

    return [LocalRetrieval(), LocalClustering()]


def test_mtebs_sts_on_the_local_files_equals_the_platforms_evaluator(tiny_model, tmp_path):
    """The STS tasks both protocols share: mteb's main score (cosine Spearman) through the platform
    equals the platform's SentEval evaluator on the same pairs and model (to the round-off of other
    batches). SICK-R is mteb's whole set (9,927 pairs), not SentEval's test split: stated, not equal."""
    encoder = Encoder.from_pretrained(str(tiny_model), pooler="avg")
    shared = [t for t in LOCAL_STS if t != "SICK-R"]
    ours = STSEvaluator([LOCAL_STS[t] for t in shared])(encoder, pooler="avg")
    theirs = evaluate(mteb_model(encoder, "avg", "tiny"), tasks_of(None, shared, online=False),
                      tmp_path / "mteb")
    for task in shared:
        assert theirs[task] == pytest.approx(ours[LOCAL_STS[task]], abs=0.01), task
    assert theirs["mean"] == pytest.approx(sum(theirs[t] for t in shared) / len(shared))
    assert json.loads((tmp_path / "mteb" / "STS12.json").read_text())["task_name"] == "STS12"
    from platform.data import data_dir

    assert len(local_pairs("SICK-R", data_dir())["score"]) == 9927


def test_a_retrieval_and_a_clustering_task_from_local_files_land_in_mlflow(tiny_model, tmp_path, mlflow_uri, monkeypatch):
    from mlflow.tracking import MlflowClient

    from platform.evaluate import log_scores

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_uri)
    encoder = Encoder.from_pretrained(str(tiny_model), pooler="avg")
    scores = evaluate(mteb_model(encoder, "avg", "tiny"), _local_tasks(tmp_path), tmp_path / "out")
    assert set(scores) == {"LocalRetrieval", "LocalClustering", "mean"} and all(0 <= v <= 100 for v in scores.values())
    client = MlflowClient(mlflow_uri)
    run = client.create_run(client.create_experiment("mteb-test")).info.run_id
    log_scores(run, {f"mteb:{k}": v for k, v in scores.items()}, tmp_path / "out", "local")
    data = client.get_run(run).data
    assert {k: v for k, v in data.metrics.items()} == pytest.approx(
        {"mteb_LocalRetrieval": scores["LocalRetrieval"], "mteb_LocalClustering": scores["LocalClustering"],
         "mteb_mean": scores["mean"]})
    assert data.tags["mteb_benchmark"] == "local"
    assert sorted(a.path for a in client.list_artifacts(run, "mteb")) == ["mteb/LocalClustering.json",
                                                                          "mteb/LocalRetrieval.json"]


def test_the_command_runs_mteb_tasks_and_logs_them(tiny_model, tmp_path, mlflow_uri):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(mlflow_uri)
    run = client.create_run(client.create_experiment("mteb-cli")).info.run_id
    proc = run_main("evaluate", str(tiny_model), "--pooler", "avg", "--tasks", "mteb:STS12,mteb:SICK-R", "STS12",
                    "--log-to", run, "--json", str(tmp_path / "o.json"),
                    env={"MLFLOW_TRACKING_URI": mlflow_uri, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    scores = json.loads((tmp_path / "o.json").read_text())["scores"]
    assert scores["mteb:STS12"] == pytest.approx(scores["STS12"], abs=0.01)
    assert {"mteb_STS12", "mteb_SICK-R", "mteb_mean"} <= set(client.get_run(run).data.metrics)
    assert "platform/" in proc.stdout and "SICK-R" in proc.stdout


@pytest.mark.parametrize("args,needle", [
    (["--benchmark", "MTEB(eng, v9)"], "unknown MTEB benchmark 'MTEB(eng, v9)'"),
    (["--tasks", "mteb:NoSuchTask"], "unknown MTEB task 'NoSuchTask'"),
    (["--tasks", "mteb:ArguAna"], "cannot be reached from here"),
    (["--benchmark", "NanoBEIR"], "cannot be reached from here"),
])
def test_unknown_and_unreachable_mteb_tasks_are_one_line(args, needle, tiny_model, cli):
    assert_user_error(cli("evaluate", str(tiny_model), *args, env={"HF_HUB_OFFLINE": "1"}), needle)


@pytest.mark.e2e
def test_a_run_names_a_final_benchmark_for_its_best_checkpoint(tiny_model, small_corpus, tmp_path, mlflow_uri):
    """``final_benchmark``: after the 7 STS tasks, MTEB on the best checkpoint, logged on the run
    at the checkpoint's step with each task's result as an artifact; a task the hub must serve is
    refused offline before anything trains."""
    from mlflow.tracking import MlflowClient

    from tests.helpers import runs_of, sets

    base = sets(model=tiny_model, corpus=small_corpus, batch_size=8, max_steps=2, eval_steps=2, runtime="process",
                num_workers=1, output_dir=tmp_path / "runs")
    env = {"MLFLOW_TRACKING_URI": mlflow_uri, "HF_HUB_OFFLINE": "1"}
    assert_user_error(run_main("train", "simcse", *base, "--set", "final_benchmark=ArguAna", env=env),
                      "cannot be reached from here")
    assert not runs_of(mlflow_uri)[1]
    proc = run_main("train", "simcse", *base, "--set", "final_benchmark=STS12,STSBenchmark", env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "final_benchmark STS12,STSBenchmark: 2 MTEB task(s)" in proc.stdout
    (run,) = runs_of(mlflow_uri)[1]
    metrics = run.data.metrics
    # The same protocol on the same pairs; this tiny model's cosines nearly tie after two steps, so
    # the round-off of other batches moves a few ranks (measured: 0.02).
    assert metrics["mteb_STS12"] == pytest.approx(metrics["sts_STS12"], abs=0.1)
    assert metrics["mteb_mean"] == pytest.approx((metrics["mteb_STS12"] + metrics["mteb_STSBenchmark"]) / 2)
    assert run.data.tags["mteb_benchmark"] == "STS12,STSBenchmark"
    client = MlflowClient(mlflow_uri)
    assert sorted(a.path for a in client.list_artifacts(run.info.run_id, "mteb")) == ["mteb/STS12.json",
                                                                                      "mteb/STSBenchmark.json"]
    # The run by reference: its best checkpoint, and the scores logged on it; the registered model too.
    again = run_main("evaluate", f"runs:/{run.info.run_id}", "--tasks", "mteb:STS16", env=env)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "mteb_STS16" in client.get_run(run.info.run_id).data.metrics
    registered = run_main("evaluate", "models:/simcse-encoder/1", "--tasks", "STS12", env=env)
    assert registered.returncode == 0, registered.stderr[-2000:]
    assert f"{metrics['sts_STS12']:.2f}" in registered.stdout



def test_a_matryoshka_prefix_reaches_mteb_and_its_scores_are_logged_under_it(tiny_model, tmp_path, mlflow_uri,
                                                                            monkeypatch):
    """``evaluate --dim M``: the encoder cut to its first M coordinates is what mteb embeds with (its
    metadata says M), and the scores land as ``dim<M>/mteb_<task>`` with their files under ``dim<M>/mteb``."""
    from mlflow.tracking import MlflowClient

    from platform.evaluate import log_scores

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_uri)
    texts = ["A man is playing a guitar.", "Two dogs run on the beach.", "The stock market fell today."]
    whole = Encoder.from_pretrained(str(tiny_model), pooler="avg").encode(texts).numpy()
    model = mteb_model(Encoder.from_pretrained(str(tiny_model), pooler="avg").truncated(8), "avg", "tiny")
    got = model.encode([{"text": texts}], task_metadata=None, hf_split="test", hf_subset="default")
    assert model.mteb_model_meta.embed_dim == 8 and got.shape == (3, 8)
    assert np.allclose(got, whole[:, :8], atol=1e-6)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "STS12.json").write_text("{}")
    client = MlflowClient(mlflow_uri)
    run = client.create_run(client.create_experiment("mteb-dim")).info.run_id
    log_scores(run, {"mteb:STS12": 50.0, "mteb:mean": 50.0}, tmp_path / "out", "tasks", dims=8)
    assert client.get_run(run).data.metrics == {"dim8/mteb_STS12": 50.0, "dim8/mteb_mean": 50.0}
    assert [a.path for a in client.list_artifacts(run, "dim8/mteb")] == ["dim8/mteb/STS12.json"]
