"""``platform.compare`` end to end: SimCSE and UNA trained with three seeds each (the process
runtime, a real MLflow store), compared by their seeds (paired by seed) and as two single
checkpoints (a paired bootstrap over the test pairs); the comparison logged as a run with its
table and forest plot; bad input in one line; the report's uncertainty sections."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient
from scipy.stats import ttest_rel

from platform.compare import CHECKPOINTS, COMPARISONS_EXPERIMENT, RECIPES, Result, check
from platform.errors import UserError
from tests.helpers import assert_user_error, run_main, sets

# Six trainings and two 7-task embeddings: beside the other end-to-end scenarios.
pytestmark = pytest.mark.scenario


@pytest.fixture(scope="module")
def three_seeds(tiny_model, small_corpus, tmp_path_factory, _empty_mlflow_db):
    from tests.helpers import new_mlflow_db

    out = tmp_path_factory.mktemp("compare")
    uri = new_mlflow_db(_empty_mlflow_db, out / "mlflow.db")
    common = dict(model=tiny_model, corpus=small_corpus, batch_size=8, max_steps=4, eval_steps=2, runtime="process",
                  num_workers=1, output_dir=out / "runs", lr=1e-3)
    env = {"MLFLOW_TRACKING_URI": uri}
    names = {}
    for method, extra in (("simcse", {}), ("una", {"r": 500})):
        proc = run_main("train", method, "--seeds", "3", "--run-name", f"{method}-3", *sets(**common, **extra), env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        names[method] = f"{method}-3"
    c = MlflowClient(uri)
    runs = {m: next(r for r in c.search_runs([c.get_experiment_by_name(m).experiment_id])
                    if r.info.run_name == names[m]) for m in names}
    return {"uri": uri, "env": env, "runs": runs, "out": out, "client": c}


def _comparison_run(c):
    exp = c.get_experiment_by_name(COMPARISONS_EXPERIMENT)
    return c.search_runs([exp.experiment_id], order_by=["attributes.start_time DESC"])[0]


def test_two_recipes_with_three_seeds_are_compared_by_seed_and_logged(three_seeds, tmp_path):
    runs, c = three_seeds["runs"], three_seeds["client"]
    proc = run_main("compare", "simcse-3", f"runs:/{runs['una'].info.run_id}", "--out", str(tmp_path),
                    env=three_seeds["env"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    frame = pd.read_csv(tmp_path / "comparison.csv")
    assert list(frame["task"]) == ["STS12", "STS13", "STS14", "STS15", "STS16", "STS-B", "SICK-R", "avg"]
    assert set(frame["n"]) == {3} and set(frame["claim"]) == {RECIPES}
    assert set(frame["method"]) == {"paired by seed (each seed fixes data order and initialisation on both sides): t-test"}
    una = {int(r.data.tags["seed"]): r.data.metrics["sts_avg"] for r in c.search_runs(
        [runs["una"].info.experiment_id], f"tags.`mlflow.parentRunId` = '{runs['una'].info.run_id}'")}
    simcse = {int(r.data.tags["seed"]): r.data.metrics["sts_avg"] for r in c.search_runs(
        [runs["simcse"].info.experiment_id], f"tags.`mlflow.parentRunId` = '{runs['simcse'].info.run_id}'")}
    assert sorted(una) == sorted(simcse) == [42, 43, 44]
    avg = frame[frame["task"] == "avg"].iloc[0]
    assert avg["delta"] == pytest.approx(sum(una[s] - simcse[s] for s in una) / 3)
    assert avg["ci_low"] <= avg["delta"] <= avg["ci_high"]
    assert avg["p"] == pytest.approx(ttest_rel([una[s] for s in sorted(una)], [simcse[s] for s in sorted(una)]).pvalue)
    assert "| avg |" in proc.stdout and "Holm" in proc.stdout and "## Claims about recipes (over seeds)" in proc.stdout
    assert "| 3 seeds against 3 seeds |" in proc.stdout and "Claims about checkpoints" not in proc.stdout
    # Each seed's final evaluation kept its per-pair similarities: the interval over seeds and pairs.
    for run_id in [r.info.run_id for side in ("una", "simcse") for r in c.search_runs(
            [runs[side].info.experiment_id], f"tags.`mlflow.parentRunId` = '{runs[side].info.run_id}'")]:
        assert "sts_pairs.npz" in {a.path for a in c.list_artifacts(run_id)}
    assert avg["sp_low"] <= avg["delta"] <= avg["sp_high"] and 0 <= avg["seed_share"] <= 1
    assert frame["sp_low"].notna().all() and frame["cohens_d"].notna().all()
    assert "over seeds and pairs" in proc.stdout and "seed share" in proc.stdout
    logged = _comparison_run(c)
    assert logged.info.status == "FINISHED"
    artifacts = {a.path for a in c.list_artifacts(logged.info.run_id)}
    assert {"comparison.md", "comparison.csv", "forest.png", "comparison.json"} <= artifacts


def test_two_checkpoints_are_compared_over_the_test_pairs(three_seeds, tmp_path):
    runs = three_seeds["runs"]
    first, second = (runs[m].data.tags["best_checkpoint"] for m in ("simcse", "una"))
    proc = run_main("compare", first, second, "--resamples", "300", "--out", str(tmp_path), "--no-log",
                    env=three_seeds["env"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    frame = pd.read_csv(tmp_path / "comparison.csv")
    assert list(frame["n"])[:7] == [3108, 1500, 3750, 3000, 1186, 1379, 4927]
    assert frame["method"].str.startswith("paired bootstrap over pairs").all() and set(frame["claim"]) == {CHECKPOINTS}
    assert "## Claims about checkpoints (over test pairs)" in proc.stdout and "nothing about the recipes" in proc.stdout
    assert (frame["ci_low"] <= frame["delta"]).all() and (frame["delta"] <= frame["ci_high"]).all()
    assert frame["p_holm"].iloc[:7].ge(frame["p"].iloc[:7]).all()
    again = run_main("compare", first, second, "--resamples", "300", "--out", str(tmp_path / "again"), "--no-log",
                     env=three_seeds["env"])
    assert again.returncode == 0, again.stderr[-3000:]
    pd.testing.assert_frame_equal(frame, pd.read_csv(tmp_path / "again" / "comparison.csv"))  # the same seed


def test_a_runs_side_is_its_logged_pairs_and_needs_no_checkpoint_here(three_seeds, tmp_path):
    """Two runs compared as checkpoints read the per-pair similarities their final evaluations
    logged: the same table as their checkpoints encoded again, and it holds where the checkpoints
    are not reachable from here (a cluster's storage, compared from a laptop)."""
    runs, c, env = three_seeds["runs"], three_seeds["client"], three_seeds["env"]
    seed_runs = {m: next(r for r in c.search_runs([runs[m].info.experiment_id],
                                                  f"tags.`mlflow.parentRunId` = '{runs[m].info.run_id}'")
                         if r.data.tags["seed"] == "43") for m in ("simcse", "una")}
    folders = [Path(seed_runs[m].data.tags["best_checkpoint"]) for m in ("simcse", "una")]
    args = ("--resamples", "300", "--seed", "0", "--no-log")
    encoded = run_main("compare", *map(str, folders), *args, "--out", str(tmp_path / "encoded"), env=env)
    assert encoded.returncode == 0, encoded.stderr[-3000:]
    for folder in folders:
        folder.rename(folder.with_name(folder.name + ".away"))
    try:
        logged = run_main("compare", *(f"runs:/{seed_runs[m].info.run_id}" for m in ("simcse", "una")), *args,
                          "--out", str(tmp_path / "logged"), env=env)
    finally:
        for folder in folders:
            folder.with_name(folder.name + ".away").rename(folder)
    assert logged.returncode == 0, logged.stderr[-3000:]
    assert "embedding the 7 STS tasks" not in logged.stdout + logged.stderr
    a, b = (pd.read_csv(tmp_path / kind / "comparison.csv") for kind in ("encoded", "logged"))
    assert set(b["claim"]) == {CHECKPOINTS} and set(b["sides"]) == {"its checkpoint against its checkpoint"}
    numbers = ["delta", "ci_low", "ci_high", "p", "p_holm", "n"]
    pd.testing.assert_frame_equal(a[numbers], b[numbers], rtol=1e-6)


def test_bad_references_get_one_line(three_seeds):
    env = three_seeds["env"]
    assert_user_error(run_main("compare", "simcse-3", env=env), "at least two references")
    assert_user_error(run_main("compare", "simcse-3", "no-such-run", env=env), "'no-such-run' is no checkpoint path")
    one = Result("a", "bert-base-uncased", {0: {t: 70.0 for t in ("STS12", "avg")}}, None)
    with pytest.raises(UserError, match="different backbones"):
        check([one, Result("b", "roberta-base", {}, "x")])
    with pytest.raises(UserError, match="same 7 tasks"):
        check([one, Result("b", "bert-base-uncased", {}, "x")])


def test_the_report_says_against_simcse_and_against_published(three_seeds, tmp_path):
    from platform.report import against_published, against_simcse

    proc = run_main("report", "--out", str(tmp_path / "report"), "--against", "published", "--no-log",
                    env=three_seeds["env"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = (tmp_path / "report" / "report.md").read_text()
    assert "- una (" in text and "against SimCSE, p = " in text and "3 and 3 seeds" in text
    assert "Published averages against our seeds" in text and (tmp_path / "report" / "geometry.png").is_file()
    proc = run_main("report", "--out", str(tmp_path / "significance"), "--significance", "--no-log", env=three_seeds["env"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = (tmp_path / "significance" / "report.md").read_text()
    assert "Significance across recipes" in text and ("una − simcse" in text or "simcse − una" in text), text[-2000:]
    frame = pd.DataFrame([{"recipe": "simcse", "backbone": "bert-base-uncased", "Avg.": 76.0,
                           "seed averages": {1: 75.8, 2: 76.3, 3: 76.1}},
                          {"recipe": "una", "backbone": "bert-base-uncased", "Avg.": 78.4,
                           "seed averages": {1: 78.5, 2: 78.2, 3: 78.6}}])
    published = "\n".join(against_published(frame))
    assert "76.25 published is inside" in published and "76.14 published is outside" in published
    assert "the 95 % prediction interval of one run from our 3 seeds" in published
    assert "paired by seed" in "\n".join(against_simcse(frame))
