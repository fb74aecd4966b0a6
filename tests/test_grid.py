"""``--grid PARAM``: the papers' one-parameter sensitivity tables, regenerated. Every grid value
runs to the end and gets the 7 STS tasks on its best checkpoint; the parent run holds the table
(rows = values, columns = tasks + avg) and its plot. With ``--seeds``, also a sweep ranked on the
mean over seeds. Against a real MLflow server."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import run_cli
from tests.test_cli import _runs
from tests.test_report import check_seed_means

TASKS = ["STS12", "STS13", "STS14", "STS15", "STS16", "STS-B", "SICK-R", "Avg."]


def test_grid_sweep_with_seeds_evaluates_every_value_and_ranks_on_the_mean(tiny_model, small_corpus, tmp_path,
                                                                            mlflow_server):
    """``tune una --grid alpha --seeds 2``: every value trained with two seeds, each seed's run
    nested under its value's run, which holds every score's mean and std over the seeds; trials
    ranked on the mean; the table has the means and the spread of the average."""
    mlflow_uri = mlflow_server  # a real server process: artifacts go through its proxy
    space = tmp_path / "una-grid.yaml"
    space.write_text((Path(__file__).resolve().parent.parent / "tune_spaces" / "una.yaml").read_text().replace(
        "  alpha: [1, 3, 5, 7, 9]                    # Table C4", "  alpha: [1, 9]"))
    sets = {"model": tiny_model, "corpus": small_corpus, "batch_size": 16, "max_steps": 2, "eval_steps": 2,
            "output_dir": tmp_path / "runs", "num_workers": 1, "data_pipeline": "local",
            "r": 500}  # 256 sentences: a vocabulary of ~1500 terms
    args = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    proc = run_cli("tune", "una", "--space", str(space), "--grid", "alpha", "--seeds", "2", *args,
                   env={"MLFLOW_TRACKING_URI": mlflow_uri})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "alpha grid (best checkpoint of each value)" in proc.stdout
    assert "over 2 seeds" in proc.stdout and "best_stsb_dev_spearman_std" in proc.stdout
    # One table of the seeds' 7 tasks per value; the best value's seeds are not evaluated again.
    assert (proc.stdout + proc.stderr).count("mean +- std |") == 2
    c, runs = _runs(mlflow_uri, "una")
    children = [r for r in runs if r.data.tags.get("trial_id")]
    parent = next(r for r in runs if r.data.tags.get("sweep") == "true")
    assert parent.info.status == "FINISHED" and parent.data.tags["seeds"] == "2"
    assert sorted(int(r.data.params["alpha"]) for r in children) == [1, 9]
    for child in children:
        seed_runs = c.search_runs([child.info.experiment_id], f"tags.`mlflow.parentRunId` = '{child.info.run_id}'")
        assert sorted(r.data.tags["seed"] for r in seed_runs) == ["42", "43"]
        assert child.info.status == "FINISHED" and all(r.info.status == "FINISHED" for r in seed_runs)
        assert all(r.data.params["alpha"] == child.data.params["alpha"] for r in seed_runs)
        check_seed_means(child, seed_runs)

    folder = Path(c.download_artifacts(parent.info.run_id, "", str(tmp_path / "artifacts")))
    table = pd.read_csv(folder / "grid_alpha.csv")
    assert table["alpha"].tolist() == [1, 9] and list(table.columns) == ["alpha", *TASKS, "Avg. std"]
    for row, child in zip(table.itertuples(index=False), sorted(children, key=lambda r: int(r.data.params["alpha"]))):
        assert row[-2] == pytest.approx(child.data.metrics["sts_avg"], abs=1e-6)
        assert row[-1] == pytest.approx(child.data.metrics["sts_avg_std"], abs=1e-6)
        assert row[1] == pytest.approx(child.data.metrics["sts_STS12"], abs=1e-6)

    # The best value by mean STS-B dev: its means on the parent, its best seed registered.
    best = next(r for r in children if r.info.run_id == parent.data.tags["best_run_id"])
    assert best.data.metrics["best_stsb_dev_spearman"] == max(r.data.metrics["best_stsb_dev_spearman"] for r in children)
    for key in ("sts_avg", "sts_avg_std", "best_stsb_dev_spearman", "best_stsb_dev_spearman_std"):
        assert parent.data.metrics[key] == pytest.approx(best.data.metrics[key], abs=1e-9)
    version = c.get_model_version_by_alias("una-encoder", "champion")
    assert version.run_id == best.info.run_id and version.tags["seeds"] == "2"
    summary = pd.read_csv(folder / "sweep_summary.csv")
    assert summary["best_stsb_dev_spearman"].iloc[0] == pytest.approx(best.data.metrics["best_stsb_dev_spearman"])
    assert summary["seeds"].tolist() == [2, 2]
    assert (folder / "grid_alpha.md").read_text().startswith("| alpha | STS12")
    from PIL import Image

    with Image.open(folder / "plots" / "grid_alpha.png") as image:
        assert image.format == "PNG" and image.size[0] > 300
