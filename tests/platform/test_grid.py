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
from methods.recipe import NAMED
from platform.config import TrainConfig
from platform.space import load_space
from platform.tracking.names import winner_key
from tests.helpers import ROOT, check_seed_means, corpus_head, run_cli, runs_of


TASKS = ["STS12", "STS13", "STS14", "STS15", "STS16", "STS-B", "SICK-R", "Avg."]
SPACES = ROOT / "tune_spaces"


def test_una_grids_are_tables_c4_to_c6():  # the fast tier
    cfg = TrainConfig.build("una", "local")
    assert load_space(cfg, grid="alpha").space == {"alpha": ("grid", [1, 3, 5, 7, 9])}
    assert load_space(cfg, grid="beta").space == {"beta": ("grid", [0.3, 0.4, 0.5, 0.6, 0.7, 0.8])}
    assert load_space(cfg, grid="r").space == {"r": ("grid", [1000, 2000, 3000, 4000, 5000, 6000])}


def test_the_paper_profiles_first_rung_is_an_eighth_of_a_trial_or_more():  # the fast tier
    """ASHA under the paper profile stops a trial no earlier than after 1/8 of its evaluations on
    wiki1m's 10^6 sentences (the local profile keeps 1: its trials are a few evaluations long)."""
    from platform.run.loop import total_steps

    for method in NAMED:  # every named recipe: a new one's profile and space are held to the same rungs
        for profile in ("paper", "paper-roberta"):
            cfg = TrainConfig.build(method, profile)
            evaluations = total_steps(cfg, 1_000_000) // cfg.eval_steps
            grace = load_space(cfg).scheduler["grace_period"]
            assert evaluations / 8 <= grace < evaluations / 2, (method, profile, grace, evaluations)
            assert load_space(cfg).num_samples == 16  # paper-roberta takes the paper's sweep size, its rungs its own
        assert load_space(TrainConfig.build(method, "local")).scheduler["grace_period"] == 1


def _augment(corpus: Path, out: Path, env: dict, *sets: str) -> pd.DataFrame:
    proc = run_cli("augment", "augcse", "--corpus", str(corpus), "--out", str(out), "--num-cpus", "2",
                   *[a for s in sets for a in ("--set", s)], env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return pd.read_parquet(out)


@pytest.fixture(scope="module")
def grid(tiny_model, small_corpus, tmp_path_factory, mlflow_server):
    """``augment augcse`` twice (the 8-aug set, then a set sharing seven of its augmentations), then
    ``tune augcse --grid grl_multiplier --seeds 2`` on that cache, against a real MLflow server
    (artifacts through its proxy)."""
    tmp = tmp_path_factory.mktemp("grid")
    corpus = corpus_head(small_corpus, 96, tmp)
    cache = tmp / "cache"
    env = {"PLATFORM_CACHE_DIR": str(cache)}
    out = {"eight": _augment(corpus, tmp / "augcse", env), "cache": cache}
    out["entries_after_8"] = sorted(p.name.split("-")[1] for p in cache.glob("gen-aug_*") if (p / "COMPLETE").is_file())
    out["two"] = _augment(corpus, tmp / "augcse12", env, "augmentations=contraction_expansion,adjective_antonym_switch")
    out["entries_after_2"] = len(sorted(cache.glob("gen-aug_*")))
    out["before"] = {p.name: (p / "COMPLETE").stat().st_mtime_ns for p in cache.glob("gen-*")}
    space = tmp / "augcse-grid.yaml"
    space.write_text((SPACES / "augcse.yaml").read_text().replace(
        "  grl_multiplier: [-100, -10, -1, 0, 1, 10, 100]", "  grl_multiplier: [-1, 1]"))
    sets = {"model": tiny_model, "corpus": corpus, "batch_size": 16, "max_steps": 2, "eval_steps": 1,
            "log_steps": 1, "output_dir": tmp / "runs", "num_workers": 1, "data_pipeline": "local"}
    args = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    # Four Ray Train runs: minutes alone, twice that beside test_multinode; past 600 s once in CI.
    out["proc"] = run_cli("tune", "augcse", "--space", str(space), "--grid", "grl_multiplier", "--seeds", "2", *args,
                          env={"MLFLOW_TRACKING_URI": mlflow_server, **env}, timeout=1200)
    assert out["proc"].returncode == 0, out["proc"].stderr[-3000:]
    out["after"] = {p.name: (p / "COMPLETE").stat().st_mtime_ns for p in cache.glob("gen-*")}
    c, runs = runs_of(mlflow_server, "augcse")
    out.update(client=c, uri=mlflow_server, children=[r for r in runs if r.data.tags.get("trial_id")],
               parent=next(r for r in runs if r.data.tags.get("sweep") == "true"))
    out["folder"] = Path(c.download_artifacts(out["parent"].info.run_id, "", str(tmp / "artifacts")))
    return out


def _seed_runs(c, run):
    return c.search_runs([run.info.experiment_id], f"tags.`mlflow.parentRunId` = '{run.info.run_id}'")


@pytest.mark.scenario
def test_augment_caches_each_augmentation_on_its_own(grid):
    """One cache entry per augmentation: a set sharing seven of them generates only the missing one."""
    df = grid["eight"]
    assert list(df.columns) == ["sentence", "augmented", "aug_label"] and len(df) == 96
    assert set(df["aug_label"]) <= {NO_AUGMENTATION, *AUGMENTATION_SETS["8-aug"]}
    assert ((df["aug_label"] == NO_AUGMENTATION) == (df["augmented"] == df["sentence"])).all()
    assert df["aug_label"].nunique() >= 4
    assert grid["entries_after_8"] == sorted(f"aug_{n}" for n in AUGMENTATION_SETS["8-aug"])
    assert grid["entries_after_2"] == 9
    assert set(grid["two"]["aug_label"]) <= {NO_AUGMENTATION, "contraction_expansion", "adjective_antonym_switch"}


@pytest.mark.scenario
def test_a_sweep_regenerates_nothing_the_cache_holds(grid):
    assert {k: grid["after"].get(k) for k in grid["before"]} == grid["before"]


@pytest.mark.scenario
def test_every_grid_value_trains_each_seed_in_a_run_of_its_own(grid):
    """Each value's run nests one run per seed, holds every score's mean and std over them, and
    the seeds' metrics are those of the value (AugCSE's discriminator logged every step)."""
    c = grid["client"]
    parent, children = grid["parent"], grid["children"]
    assert parent.info.status == "FINISHED" and parent.data.tags["seeds"] == "2"
    assert sorted(float(r.data.params["augcse.grl_multiplier"]) for r in children) == [-1, 1]
    for child in children:
        assert {"augcse.lambda_disc", "lr", "augcse.augmentations", "augcse.grl_multiplier"} <= set(child.data.params)
        seed_runs = _seed_runs(c, child)
        assert sorted(r.data.tags["seed"] for r in seed_runs) == ["42", "43"]
        assert child.info.status == "FINISHED" and all(r.info.status == "FINISHED" for r in seed_runs)
        for run in seed_runs:
            assert run.data.params["augcse.grl_multiplier"] == child.data.params["augcse.grl_multiplier"]
            history = c.get_metric_history(run.info.run_id, "disc_accuracy")
            assert len(history) == 2 and all(0 <= m.value <= 1 for m in history)
            assert c.get_metric_history(run.info.run_id, "disc_loss")
        check_seed_means(child, seed_runs)


@pytest.mark.scenario
def test_the_grid_table_is_the_papers_with_the_spread_over_seeds(grid):
    """Rows = values, columns = the 7 tasks and their mean, and the mean's std; the seeds' 7-task
    tables are printed once per value (the best value is not evaluated again)."""
    proc = grid["proc"]
    assert "grl_multiplier grid (best checkpoint of each value)" in proc.stdout
    assert (proc.stdout + proc.stderr).count("mean +- std |") == 2
    assert "View run" not in proc.stdout + proc.stderr  # MLflow's own lines at each seed's and trial's end
    table = pd.read_csv(grid["folder"] / "grid_grl_multiplier.csv")
    assert table["grl_multiplier"].tolist() == [-1, 1]
    assert list(table.columns) == ["grl_multiplier", *TASKS, "Avg. std"]
    by_value = sorted(grid["children"], key=lambda r: float(r.data.params["augcse.grl_multiplier"]))
    for row, child in zip(table.itertuples(index=False), by_value):
        assert row[-2] == pytest.approx(child.data.metrics["sts_avg"], abs=1e-6)
        assert row[-1] == pytest.approx(child.data.metrics["sts_avg_std"], abs=1e-6)
        assert row[1] == pytest.approx(child.data.metrics["sts_STS12"], abs=1e-6)
    assert (grid["folder"] / "grid_grl_multiplier.md").read_text().startswith("| grl_multiplier | STS12")
    from PIL import Image

    with Image.open(grid["folder"] / "plots" / "grid_grl_multiplier.png") as image:
        assert image.format == "PNG" and image.size[0] > 300


@pytest.mark.scenario
def test_the_best_value_by_mean_dev_is_the_sweeps_result(grid):
    """Trials ranked on the mean over seeds: the best value's means on the parent, its best seed
    registered (the champion), the sweep summary sorted by the mean."""
    c, parent, children = grid["client"], grid["parent"], grid["children"]
    proc = grid["proc"]
    assert "over 2 seeds" in proc.stdout and "best_stsb_dev_spearman_std" in proc.stdout
    best = next(r for r in children if r.info.run_id == parent.data.tags["best_run_id"])
    assert best.data.metrics["best_stsb_dev_spearman"] == max(r.data.metrics["best_stsb_dev_spearman"] for r in children)
    for key in ("sts_avg", "sts_avg_std", "best_stsb_dev_spearman", "best_stsb_dev_spearman_std"):
        assert parent.data.metrics[winner_key(key)] == pytest.approx(best.data.metrics[key], abs=1e-9)
        assert key not in parent.data.metrics  # the parent never sits among the trials in a sort
    version = c.get_model_version_by_alias("augcse-encoder", "champion")
    assert version.run_id == best.info.run_id and version.tags["seeds"] == "2"
    summary = pd.read_csv(grid["folder"] / "sweep_summary.csv")
    assert summary["best_stsb_dev_spearman"].iloc[0] == pytest.approx(best.data.metrics["best_stsb_dev_spearman"])
    assert summary["seeds"].tolist() == [2, 2]


def test_the_rung_benchmark_correlates_each_rungs_best_with_the_final_best():  # the fast tier
    from platform.sweep_summary import rung_table

    histories = {"a": [1, 2, 3, 9, 9, 9, 9, 9], "b": [2, 3, 4, 8, 8, 8, 8, 8], "c": [3, 4, 5, 7, 7, 7, 7, 7]}
    rows = rung_table(histories, grace=1, factor=2)
    assert [(r, n) for r, n, _, _ in rows] == [(1, 3), (2, 3), (4, 3)]  # rungs below the 8 evaluations
    assert [round(rho, 6) for _, _, rho, _ in rows] == [-1.0, -1.0, 1.0]  # reversed until evaluation 4
    assert [leads for *_, leads in rows] == [False, False, True]


def hidden_by_html(markdown: str) -> list[str]:
    """What a Markdown renderer would take for HTML tags outside code (and so not show): ``<word``
    outside fenced blocks and code spans. A description is read in MLflow's UI rendered."""
    import re

    text = re.sub(r"```.*?```", "", markdown, flags=re.S)
    text = re.sub(r"`[^`]*`", "", text)
    return re.findall(r"<[A-Za-z/][^>]*>?", text)


def test_the_hidden_by_html_check_can_fail():  # the fast tier
    assert hidden_by_html("'best-<profile>-<backbone>'") == ["<profile>", "<backbone>"]
    assert hidden_by_html("`best-<profile>` and\n```\n<b>\n```") == []


@pytest.mark.scenario
def test_mlflows_ui_tells_which_trial_won_and_how_to_load_it(grid):
    """What MLflow's web UI reads, through its own REST endpoints: a training experiment (not GenAI)
    with a description and a saved view of the sweep's trials; a sort by the dev score that lists
    trials only; a registered version that says what won, by how much against the backbone, the
    smoke caveat and its load line, with the searched values as tags and the corpus by content;
    the logged model named for the recipe, listing its version, its card as description;
    descriptions with no text lost to HTML."""
    import json

    import requests

    base, parent = grid["uri"] + "/api/2.0/mlflow", grid["parent"]

    def get(path, **params):
        response = requests.get(f"{base}/{path}", params=params, timeout=30)
        assert response.ok, (path, response.text[:300])
        return response.json()

    experiment = get("experiments/get", experiment_id=parent.info.experiment_id)["experiment"]
    tags = {t["key"]: t["value"] for t in experiment.get("tags", [])}
    assert tags["mlflow.experimentKind"] == "custom_model_development"
    assert "**augcse** recipe" in tags["mlflow.note.content"]
    view = json.loads(tags[f"mlflow.sharedViewState.sweep-{parent.info.run_id}"])
    state = json.loads(view["state"])
    assert state["orderByKey"] == "metrics.`best_stsb_dev_spearman`" and state["orderByAsc"] is False
    assert {"params.`augcse.grl_multiplier`", "metrics.`best_stsb_dev_spearman`"} <= set(state["selectedColumns"])
    listed = requests.post(f"{base}/runs/search", json={"experiment_ids": [parent.info.experiment_id],
                                                         "filter": state["searchFilter"]}, timeout=30).json()["runs"]
    assert {r["info"]["run_id"] for r in listed} == {r.info.run_id for r in grid["children"]}

    ranked = requests.post(f"{base}/runs/search", json={
        "experiment_ids": [parent.info.experiment_id], "order_by": ["metrics.`best_stsb_dev_spearman` DESC"],
        "filter": "metrics.`best_stsb_dev_spearman` > -1000"}, timeout=30).json()["runs"]
    assert parent.info.run_id not in {r["info"]["run_id"] for r in ranked} and ranked
    parent_metrics = {m["key"] for m in get("runs/get", run_id=parent.info.run_id)["run"]["data"]["metrics"]}
    assert {"best.stsb_dev_spearman", "best.sts_avg", "vs_backbone/baseline_sts_avg", "vs_backbone/delta_sts_avg"} <= parent_metrics

    version = get("registered-models/alias", name="augcse-encoder", alias="champion")["model_version"]
    description, vtags = version["description"], {t["key"]: t["value"] for t in version.get("tags", [])}
    for needle in ("`grl_multiplier=", "**STS-B dev**", "against the untouched backbone", "Smoke test, not a result",
                   'mlflow.sentence_transformers.load_model("models:/augcse-encoder@champion")'):
        assert needle in description, needle
    assert "searched.grl_multiplier" in vtags
    assert "sha256:" in vtags["corpus"] and "/" not in vtags["corpus"]
    model_id = version.get("model_id") or version["source"].rsplit("/", 1)[1]  # registered from models:/<id>
    model = get(f"logged-models/{model_id}")["model"]
    mtags = {t["key"]: t["value"] for t in model["info"].get("tags", [])}
    assert model["info"]["name"] == "augcse-encoder"
    assert {"name": "augcse-encoder", "version": version["version"]} in json.loads(mtags["mlflow.modelVersions"])
    assert mtags["mlflow.note.content"].startswith("# augcse-encoder")
    linked = {m["key"]: m["value"] for m in model.get("data", {}).get("metrics", [])}
    assert {"sts_avg", "best_stsb_dev_spearman"} <= set(linked), linked
    history = get("metrics/get-history", run_id=model["info"]["source_run_id"], metric_key="sts_avg")["metrics"]
    assert [p["value"] for p in history] == [linked["sts_avg"]]  # linked, not logged a second time

    registered = get("registered-models/get", name="augcse-encoder")["registered_model"]["description"]
    for text in (registered, description, tags["mlflow.note.content"], grid["parent"].data.tags["mlflow.note.content"]):
        assert hidden_by_html(text) == [], text
