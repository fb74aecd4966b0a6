"""The Model Registry, against a real MLflow server process: a run's best checkpoint becomes a
version of ``<recipe>-encoder`` (sentence_transformers flavor), the ``champion`` alias moves only
when STS-B dev improves, and the champion loads and embeds as the project's encoder does."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers import run_main

pytestmark = pytest.mark.e2e


def test_run_registers_its_encoder_and_champion_moves_only_on_improvement(mlflow_server, tiny_model, small_corpus,
                                                                           tmp_path):
    import mlflow
    from mlflow.tracking import MlflowClient

    from methods.encoder import Encoder
    from platform.run import checkpoint
    from platform.tracking import registry

    proc = run_main("train", "simcse", *[a for kv in (
        f"model={tiny_model}", f"corpus={small_corpus}", "batch_size=8", "max_steps=4", "eval_steps=2",
        "runtime=process", "num_workers=1", f"output_dir={tmp_path / 'runs'}") for a in ("--set", kv)],
        env={"MLFLOW_TRACKING_URI": mlflow_server})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "registered simcse-encoder version 1" in proc.stdout and "now the champion" in proc.stdout

    c = MlflowClient(mlflow_server)
    champion = c.get_model_version_by_alias("simcse-encoder", "champion")
    assert champion.version == "1"
    run = c.get_run(champion.run_id)
    assert run.data.tags["registered_model"] == "simcse-encoder/1"
    dev = float(champion.tags["stsb_dev_spearman"])
    assert dev == pytest.approx(run.data.metrics["best_stsb_dev_spearman"], abs=1e-4)
    assert champion.tags["git_commit"] == run.data.tags["git_commit"] != "unknown"
    assert champion.tags["recipe"].startswith("positives=dropout")
    assert {f"sts_{t}" for t in ("STS12", "STSBenchmark", "SICKRelatedness", "avg")} <= set(champion.tags)

    # The champion embeds as the project's encoder does (the evaluator's embeddings).
    mlflow.set_tracking_uri(mlflow_server)
    model = mlflow.sentence_transformers.load_model("models:/simcse-encoder@champion")
    sentences = ["A man is playing a guitar.", "Two dogs run through a field of grass."]
    best = run.data.tags["best_checkpoint"]
    pooler = checkpoint.read_state(best)["eval_pooler"]
    ours = Encoder.from_pretrained(str(checkpoint.model_dir(best)), pooler=pooler).encode(sentences)
    np.testing.assert_allclose(model.encode(sentences), ours.numpy(), rtol=1e-4, atol=1e-5)

    # What it needs to be served elsewhere: the flavor's packages, pinned, and MLflow.
    reqs = mlflow.artifacts.download_artifacts("models:/simcse-encoder@champion/requirements.txt",
                                               dst_path=str(tmp_path / "reqs"))
    names = {line.split("==")[0] for line in open(reqs).read().split()}
    assert names == {"mlflow", "sentence-transformers", "transformers", "torch"}, names

    # A worse version does not take the alias; a better one does.
    model_uri = f"runs:/{champion.run_id}/model"
    worse, promoted = registry.register_encoder(mlflow_server, "simcse-encoder", model_uri, champion.run_id, dev - 1, {})
    assert not promoted and c.get_model_version_by_alias("simcse-encoder", "champion").version == "1"
    better, promoted = registry.register_encoder(mlflow_server, "simcse-encoder", model_uri, champion.run_id, dev + 1, {})
    assert promoted and c.get_model_version_by_alias("simcse-encoder", "champion").version == str(better)
    assert str(worse) == "2" and str(better) == "3"


def test_registered_names():
    from platform.tracking.registry import registered_name

    assert registered_name("una", "positives=dropout negatives=una loss=infonce aux=none") == "una-encoder"
    assert registered_name("recipe", "positives=dropout negatives=una,san loss=hince aux=vascl") == \
        "recipe-negatives-una-san-loss-hince-aux-vascl-encoder"
