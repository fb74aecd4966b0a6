"""Experiment files and conventional CLI flags: --config (what --print-config prints loads back
and resolves to the same configuration), --experiment, --run-name, --tag, and --help texts."""

from __future__ import annotations

import pytest
import yaml

from tests.helpers import assert_user_error, sets


def _values(text: str) -> dict:
    return yaml.safe_load(text)


@pytest.mark.parametrize("method,extra", [
    ("augcse", {"augmentations": "contraction_expansion,number_to_word", "lr": "1e-5", "lambda_disc": "0.3"}),
    ("recipe", {"negatives": "una,san", "loss": "hince", "aux": "vascl", "alpha": "3", "max_len": "40"}),
])
def test_print_config_loads_back_and_resolves_to_the_same_configuration(cli, tmp_path, method, extra):
    first = cli("train", method, "--profile", "paper", *sets(**extra), "--print-config")
    assert first.returncode == 0, first.stderr
    path = tmp_path / "experiment.yaml"
    path.write_text(first.stdout)
    again = cli("train", method, "--config", str(path), "--print-config")
    assert again.returncode == 0, again.stderr
    assert _values(again.stdout) == _values(first.stdout)
    assert _values(again.stdout)["profile"] == "paper" and f"--config {path}" in again.stdout
    # --set wins over the file, and says so
    over = cli("train", method, "--config", str(path), "--set", "seed=7", "--print-config")
    assert _values(over.stdout)["seed"] == 7 and "seed: 7  # --set" in over.stdout
    changed = dict(_values(first.stdout), seed=7)
    assert _values(over.stdout) == changed


def test_bad_experiment_files_are_one_line(cli, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("lr: [1, 2\n")
    assert_user_error(cli("train", "una", "--config", str(bad)), "--config", "not YAML")
    bad.write_text("- lr\n")
    assert_user_error(cli("train", "una", "--config", str(bad)), "expected a mapping")
    bad.write_text("method: simcse\n")
    assert_user_error(cli("train", "una", "--config", str(bad)), "is for method 'simcse'")
    bad.write_text("profile: paper\n")
    assert_user_error(cli("train", "una", "--config", str(bad), "--profile", "local"), "names profile 'paper'")
    bad.write_text("alpah: 3\n")
    assert_user_error(cli("train", "una", "--config", str(bad)), "alpah")
    assert_user_error(cli("train", "una", "--config", str(tmp_path / "missing.yaml")), "cannot read it")
    assert_user_error(cli("train", "una", "--tag", "novalue"), "--tag 'novalue'")
    assert_user_error(cli("train", "una", "--tag", "mlflow.user=x"), "MLflow's own")
    assert_user_error(cli("train", "una", "--run-name", "../elsewhere"), "--run-name")


@pytest.mark.parametrize("module", ["train", "tune", "evaluate", "augment", "report"])
def test_help_is_plain_text_with_an_example(cli, module):
    proc = cli(module, "--help")
    assert proc.returncode == 0
    assert "``" not in proc.stdout and "example:" in proc.stdout and "python -m platform." in proc.stdout


@pytest.mark.e2e
def test_experiment_run_name_and_tags(cli, tiny_model, small_corpus, tmp_path, mlflow_uri):
    from mlflow.tracking import MlflowClient

    args = ["simcse", *sets(model=tiny_model, corpus=small_corpus, batch_size=8, max_steps=2, eval_steps=2,
                            runtime="process", num_workers=1, output_dir=tmp_path / "runs", final_eval="false"),
            "--experiment", "ablation-study", "--run-name", "simcse-short", "--tag", "purpose=smoke check",
            "--tag", "owner=me"]
    proc = cli("train", *args, env={"MLFLOW_TRACKING_URI": mlflow_uri})
    assert proc.returncode == 0, proc.stderr[-3000:]
    c = MlflowClient(mlflow_uri)
    (run,) = c.search_runs([c.get_experiment_by_name("ablation-study").experiment_id])
    assert run.info.run_name == "simcse-short" and run.info.status == "FINISHED"
    assert run.data.tags["purpose"] == "smoke check" and run.data.tags["owner"] == "me"
    # FINISHED: only the best checkpoint stays, without optimizer state
    (kept,) = [p for p in (tmp_path / "runs" / "simcse-short").iterdir() if p.is_dir()]
    assert (kept / "model").is_dir() and run.data.tags["best_checkpoint"] == str(kept)
    assert not list((tmp_path / "runs").rglob("train_state.pt"))
    assert_user_error(cli("train", *args, env={"MLFLOW_TRACKING_URI": mlflow_uri}), "simcse-short", "exists")
