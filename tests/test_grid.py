"""``--grid PARAM``: the papers' one-parameter sensitivity tables, regenerated. Every grid value
runs to the end and gets the 7 STS tasks on its best checkpoint; the parent run holds the table
(rows = values, columns = tasks + avg) and its plot. Against a real MLflow server."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import run_cli
from tests.test_cli import _runs

TASKS = ["STS12", "STS13", "STS14", "STS15", "STS16", "STS-B", "SICK-R", "Avg."]


def test_grid_sweep_evaluates_every_value(tiny_model, small_corpus, tmp_path, mlflow_server):
    mlflow_uri = mlflow_server  # a real server process: artifacts go through its proxy
    space = tmp_path / "una-grid.yaml"
    space.write_text((Path(__file__).resolve().parent.parent / "tune_spaces" / "una.yaml").read_text().replace(
        "  alpha: [1, 3, 5, 7, 9]                    # Table C4", "  alpha: [1, 9]"))
    sets = {"model": tiny_model, "corpus": small_corpus, "batch_size": 16, "max_steps": 2, "eval_steps": 2,
            "output_dir": tmp_path / "runs", "num_workers": 1, "data_pipeline": "local",
            "r": 500}  # 256 sentences: a vocabulary of ~1500 terms
    args = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    proc = run_cli("tune", "una", "--space", str(space), "--grid", "alpha", *args,
                   env={"MLFLOW_TRACKING_URI": mlflow_uri})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "alpha grid (best checkpoint of each value)" in proc.stdout
    assert proc.stdout.count("|    avg\n") == 2  # one 7-task table per value; the best one is not evaluated again
    c, runs = _runs(mlflow_uri, "una")
    children = [r for r in runs if r.data.tags.get("trial_id")]
    parent = next(r for r in runs if r.data.tags.get("sweep") == "true")
    assert sorted(int(r.data.params["alpha"]) for r in children) == [1, 9]
    folder = Path(c.download_artifacts(parent.info.run_id, "", str(tmp_path / "artifacts")))
    table = pd.read_csv(folder / "grid_alpha.csv")
    assert table["alpha"].tolist() == [1, 9] and list(table.columns) == ["alpha", *TASKS]
    for row, child in zip(table.itertuples(index=False), sorted(children, key=lambda r: int(r.data.params["alpha"]))):
        assert row[-1] == pytest.approx(child.data.metrics["sts_avg"], abs=1e-6)
        assert row[1] == pytest.approx(child.data.metrics["sts_STS12"], abs=1e-6)
    best = next(r for r in children if r.info.run_id == parent.data.tags["best_run_id"])
    assert parent.data.metrics["sts_avg"] == pytest.approx(best.data.metrics["sts_avg"], abs=1e-9)
    assert c.get_model_version_by_alias("una-encoder", "champion").run_id == best.info.run_id
    assert (folder / "grid_alpha.md").read_text().startswith("| alpha | STS12")
    from PIL import Image

    with Image.open(folder / "plots" / "grid_alpha.png") as image:
        assert image.format == "PNG" and image.size[0] > 300
