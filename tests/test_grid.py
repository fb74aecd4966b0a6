"""``--grid PARAM``: the papers' one-parameter sensitivity tables, regenerated. Every grid value
runs to the end and gets the 7 STS tasks on its best checkpoint; the parent run holds the table
(rows = values, columns = tasks + avg) and its plot. With ``--seeds``, also a sweep ranked on the
mean over seeds. Against a real MLflow server.

The sweep here is AugCSE's GRL ablation (paper Table 7) run on the augmentations the ``augment``
command cached: it is also the test that a sweep regenerates nothing the cache holds."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from methods.augmentations import AUGMENTATION_SETS, NO_AUGMENTATION
from platform.config import TrainConfig
from platform.space import load_space
from tests.helpers import check_seed_means, corpus_head, run_cli, runs_of

pytestmark = pytest.mark.e2e

TASKS = ["STS12", "STS13", "STS14", "STS15", "STS16", "STS-B", "SICK-R", "Avg."]
SPACES = Path(__file__).resolve().parent.parent / "tune_spaces"


def test_una_grids_are_tables_c4_to_c6():
    cfg = TrainConfig.build("una", "local")
    assert load_space(cfg, grid="alpha").space == {"alpha": ("grid", [1, 3, 5, 7, 9])}
    assert load_space(cfg, grid="beta").space == {"beta": ("grid", [0.3, 0.4, 0.5, 0.6, 0.7, 0.8])}
    assert load_space(cfg, grid="r").space == {"r": ("grid", [1000, 2000, 3000, 4000, 5000, 6000])}


def _augment(corpus: Path, out: Path, env: dict, *sets: str) -> pd.DataFrame:
    proc = run_cli("augment", "augcse", "--corpus", str(corpus), "--out", str(out), "--num-cpus", "2",
                   *[a for s in sets for a in ("--set", s)], env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return pd.read_parquet(out)


def test_augment_then_grid_with_seeds_from_the_cache(tiny_model, small_corpus, tmp_path, mlflow_server):
    """``augment augcse`` caches one entry per augmentation (a set sharing seven of them generates
    only the missing one); then ``tune augcse --grid grl_multiplier --seeds 2`` on that cache
    regenerates nothing, trains every value with two seeds, each seed's run nested under its
    value's run, which holds every score's mean and std over the seeds; trials ranked on the
    mean; the table has the means and the spread of the average."""
    mlflow_uri = mlflow_server  # a real server process: artifacts go through its proxy
    corpus = corpus_head(small_corpus, 96, tmp_path)
    cache = tmp_path / "cache"
    env = {"PLATFORM_CACHE_DIR": str(cache)}

    df = _augment(corpus, tmp_path / "augcse", env)
    assert list(df.columns) == ["sentence", "augmented", "aug_label"] and len(df) == 96
    assert set(df["aug_label"]) <= {NO_AUGMENTATION, *AUGMENTATION_SETS["8-aug"]}
    assert ((df["aug_label"] == NO_AUGMENTATION) == (df["augmented"] == df["sentence"])).all()
    assert df["aug_label"].nunique() >= 4
    entries = sorted(p.name.split("-")[1] for p in cache.glob("gen-aug_*") if (p / "COMPLETE").is_file())
    assert entries == sorted(f"aug_{n}" for n in AUGMENTATION_SETS["8-aug"])
    # A set sharing seven augmentations generates only the missing one.
    df = _augment(corpus, tmp_path / "augcse12", env, "augmentations=contraction_expansion,number_to_word")
    assert len(sorted(cache.glob("gen-aug_*"))) == 9
    assert set(df["aug_label"]) <= {NO_AUGMENTATION, "contraction_expansion", "number_to_word"}

    before = {p.name: (p / "COMPLETE").stat().st_mtime_ns for p in cache.glob("gen-*")}
    space = tmp_path / "augcse-grid.yaml"
    space.write_text((SPACES / "augcse.yaml").read_text().replace(
        "  grl_multiplier: [-100, -10, -1, 0, 1, 10, 100]", "  grl_multiplier: [-1, 1]"))
    sets = {"model": tiny_model, "corpus": corpus, "batch_size": 16, "max_steps": 2, "eval_steps": 1,
            "log_steps": 1, "output_dir": tmp_path / "runs", "num_workers": 1, "data_pipeline": "local"}
    args = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    proc = run_cli("tune", "augcse", "--space", str(space), "--grid", "grl_multiplier", "--seeds", "2", *args,
                   env={"MLFLOW_TRACKING_URI": mlflow_uri, **env})
    assert proc.returncode == 0, proc.stderr[-3000:]
    after = {p.name: (p / "COMPLETE").stat().st_mtime_ns for p in cache.glob("gen-*")}
    assert {k: after.get(k) for k in before} == before
    assert "grl_multiplier grid (best checkpoint of each value)" in proc.stdout
    assert "over 2 seeds" in proc.stdout and "best_stsb_dev_spearman_std" in proc.stdout
    # One table of the seeds' 7 tasks per value; the best value's seeds are not evaluated again.
    assert (proc.stdout + proc.stderr).count("mean +- std |") == 2
    c, runs = runs_of(mlflow_uri, "augcse")
    children = [r for r in runs if r.data.tags.get("trial_id")]
    parent = next(r for r in runs if r.data.tags.get("sweep") == "true")
    assert parent.info.status == "FINISHED" and parent.data.tags["seeds"] == "2"
    assert sorted(float(r.data.params["grl_multiplier"]) for r in children) == [-1, 1]
    for child in children:
        assert {"lambda_disc", "lr", "augmentations", "grl_multiplier"} <= set(child.data.params)
        seed_runs = c.search_runs([child.info.experiment_id], f"tags.`mlflow.parentRunId` = '{child.info.run_id}'")
        assert sorted(r.data.tags["seed"] for r in seed_runs) == ["42", "43"]
        assert child.info.status == "FINISHED" and all(r.info.status == "FINISHED" for r in seed_runs)
        for run in seed_runs:
            assert run.data.params["grl_multiplier"] == child.data.params["grl_multiplier"]
            history = c.get_metric_history(run.info.run_id, "disc_accuracy")
            assert len(history) == 2 and all(0 <= m.value <= 1 for m in history)
            assert c.get_metric_history(run.info.run_id, "disc_loss")
        check_seed_means(child, seed_runs)

    folder = Path(c.download_artifacts(parent.info.run_id, "", str(tmp_path / "artifacts")))
    table = pd.read_csv(folder / "grid_grl_multiplier.csv")
    assert table["grl_multiplier"].tolist() == [-1, 1]
    assert list(table.columns) == ["grl_multiplier", *TASKS, "Avg. std"]
    by_value = sorted(children, key=lambda r: float(r.data.params["grl_multiplier"]))
    for row, child in zip(table.itertuples(index=False), by_value):
        assert row[-2] == pytest.approx(child.data.metrics["sts_avg"], abs=1e-6)
        assert row[-1] == pytest.approx(child.data.metrics["sts_avg_std"], abs=1e-6)
        assert row[1] == pytest.approx(child.data.metrics["sts_STS12"], abs=1e-6)

    # The best value by mean STS-B dev: its means on the parent, its best seed registered.
    best = next(r for r in children if r.info.run_id == parent.data.tags["best_run_id"])
    assert best.data.metrics["best_stsb_dev_spearman"] == max(r.data.metrics["best_stsb_dev_spearman"] for r in children)
    for key in ("sts_avg", "sts_avg_std", "best_stsb_dev_spearman", "best_stsb_dev_spearman_std"):
        assert parent.data.metrics[key] == pytest.approx(best.data.metrics[key], abs=1e-9)
    version = c.get_model_version_by_alias("augcse-encoder", "champion")
    assert version.run_id == best.info.run_id and version.tags["seeds"] == "2"
    summary = pd.read_csv(folder / "sweep_summary.csv")
    assert summary["best_stsb_dev_spearman"].iloc[0] == pytest.approx(best.data.metrics["best_stsb_dev_spearman"])
    assert summary["seeds"].tolist() == [2, 2]
    assert (folder / "grid_grl_multiplier.md").read_text().startswith("| grl_multiplier | STS12")
    from PIL import Image

    with Image.open(folder / "plots" / "grid_grl_multiplier.png") as image:
        assert image.format == "PNG" and image.size[0] > 300
