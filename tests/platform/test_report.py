"""Seeds and the side-by-side report, through the CLIs against a real MLflow server process:
``--seeds 2`` (train; tune in tests/platform/test_grid.py) nests one run per seed and gives the configuration's run every
score's mean and std, the registry compares means, ``platform.evaluate --log-to`` adds clustering,
and ``platform.report`` renders two recipes with two seeds each as Markdown, CSV and PNG, logged
to MLflow too."""

from __future__ import annotations

import statistics

import pandas as pd
import pytest

from platform.report import seed_scores
from tests.helpers import assert_user_error, check_seed_means, run_main, sets

pytestmark = pytest.mark.e2e

STS = ["STS12", "STS13", "STS14", "STS15", "STS16", "STSBenchmark", "SICKRelatedness", "avg"]


def _top_run(c, experiment: str, **tags):
    exp = c.get_experiment_by_name(experiment)
    runs = [r for r in c.search_runs([exp.experiment_id]) if "mlflow.parentRunId" not in r.data.tags]
    return next(r for r in runs if all(r.data.tags.get(k) == v for k, v in tags.items()))


def _nested(c, run):
    return c.search_runs([run.info.experiment_id], f"tags.`mlflow.parentRunId` = '{run.info.run_id}'")


@pytest.fixture(scope="module")
def seeded_runs(mlflow_server, tiny_model, small_corpus, tmp_path_factory):
    """SimCSE and UNA, two seeds each, in this process' runtime (no Ray); clustering on SimCSE."""
    from mlflow.tracking import MlflowClient

    out = tmp_path_factory.mktemp("seeded")
    common = dict(model=tiny_model, corpus=small_corpus, batch_size=8, max_steps=4, eval_steps=2, runtime="process",
                  num_workers=1, output_dir=out / "runs", lr=1e-3)
    env = {"MLFLOW_TRACKING_URI": mlflow_server, "MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL": "0.2"}
    simcse = run_main("train", "simcse", "--seeds", "2", *sets(**common), env=env)
    assert simcse.returncode == 0, simcse.stderr[-3000:]
    una = run_main("train", "una", "--seeds", "2", *sets(**common, r=500), env=env)  # 256 sentences: ~1500 terms
    assert una.returncode == 0, una.stderr[-3000:]
    c = MlflowClient(mlflow_server)
    parent = _top_run(c, "simcse", seeds="2")
    best = parent.data.tags["best_checkpoint"]
    evaluated = run_main("evaluate", best, "--tasks", "clustering", "sts", "--log-to", parent.info.run_id, env=env)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    return {"simcse": simcse, "una": una, "client": c, "out": out, "uri": mlflow_server, "evaluated": evaluated}


def test_evaluate_prints_the_backbone_beside_a_checkpoint(seeded_runs):
    """The run cached its backbone's scores at its end: ``evaluate`` on its
    checkpoint prints them beside its own, the same numbers the run logged as its baseline."""
    out = seeded_runs["evaluated"].stdout
    assert "against the untouched backbone (pooler cls_before_pooler, from the cache):" in out, out
    parent = _top_run(seeded_runs["client"], "simcse", seeds="2")
    baseline_line = out.split("from the cache):", 1)[1].strip().splitlines()[2]
    assert f"{parent.data.metrics['vs_backbone/baseline_sts_avg']:.2f}" in baseline_line


def test_train_with_seeds_nests_a_run_per_seed_and_logs_mean_and_std(seeded_runs, small_corpus):
    import hashlib

    from platform.data import read_corpus

    c = seeded_runs["client"]
    digest = hashlib.sha256()  # the corpus' sentences, each followed by a newline, hashed here directly
    for sentence in read_corpus(small_corpus):
        digest.update(sentence.encode("utf-8") + b"\n")
    digest = digest.hexdigest()
    assert "mean +- std" in seeded_runs["simcse"].stdout and "over seeds 42, 43" in seeded_runs["simcse"].stdout
    for method in ("simcse", "una"):
        parent = _top_run(c, method, seeds="2")
        assert parent.info.status == "FINISHED" and parent.data.params["seeds"] == "2"
        seed_runs = _nested(c, parent)
        assert sorted(r.data.tags["seed"] for r in seed_runs) == ["42", "43"]
        assert sorted(r.data.params["seed"] for r in seed_runs) == ["42", "43"]
        assert all(r.info.status == "FINISHED" and r.data.tags["best_checkpoint"] for r in seed_runs)
        assert len({r.data.tags["best_checkpoint"] for r in seed_runs}) == 2
        check_seed_means(parent, seed_runs)
        # Every training run: MLflow's system metrics of its node; the corpus as dataset input,
        # with the digest the caches are keyed by.
        for run in seed_runs:
            assert c.get_metric_history(run.info.run_id, "system/cpu_utilization_percentage")
            assert "system/system_memory_usage_megabytes" in run.data.metrics
        for run in (parent, *seed_runs):
            (dataset,) = [d.dataset for d in run.inputs.dataset_inputs]
            assert dataset.digest == digest[:32] and run.data.tags["corpus_sha256"] == digest
        # Different seeds train differently (initialisation of the head, batch order, dropout).
        assert len({r.data.metrics["sts_avg"] for r in seed_runs}) == 2
        assert sorted(seed_scores(seeded_runs["uri"], parent).values()) == sorted(r.data.metrics["sts_avg"] for r in seed_runs)
        # Registered: the best seed's checkpoint, compared and tagged with the mean.
        version = c.get_model_version_by_alias(f"{method}-encoder", "champion")
        assert version.run_id == parent.info.run_id and version.tags["seeds"] == "2"
        assert float(version.tags["stsb_dev_spearman"]) == pytest.approx(
            parent.data.metrics["best_stsb_dev_spearman"], abs=1e-4)
        best = max(seed_runs, key=lambda r: r.data.metrics["best_stsb_dev_spearman"])
        assert version.tags["best_seed"] == best.data.tags["seed"] == parent.data.tags["best_seed"]
    assert "cluster_TREC" in _top_run(c, "simcse", seeds="2").data.metrics


def test_report_puts_two_recipes_with_seeds_side_by_side(seeded_runs, mlflow_server, tmp_path):
    from PIL import Image

    c = seeded_runs["client"]
    proc = run_main("report", "--experiment", "simcse", "--experiment", "una", "--out", str(tmp_path / "rep"),
                   "--latex", env={"MLFLOW_TRACKING_URI": mlflow_server})
    assert proc.returncode == 0, proc.stderr[-3000:]
    md = (tmp_path / "rep" / "report.md").read_text()
    rows = {line.split(" | ")[0].strip("| "): line for line in md.splitlines() if line.startswith("| ")}
    assert {"simcse", "una"} <= set(rows)
    frame = pd.read_csv(tmp_path / "rep" / "report.csv")
    for method in ("simcse", "una"):
        parent = _top_run(c, method, seeds="2")
        row = frame[frame["recipe"] == method].iloc[0]
        assert row["run_id"] == parent.info.run_id and row["seeds"] == 2
        assert row["Avg."] == pytest.approx(parent.data.metrics["sts_avg"], abs=1e-6)
        assert row["Avg. std"] == pytest.approx(parent.data.metrics["sts_avg_std"], abs=1e-6)
        assert f"{parent.data.metrics['sts_avg']:.2f} ± {parent.data.metrics['sts_avg_std']:.2f}" in rows[method]
    assert frame.loc[frame["recipe"] == "simcse", "cluster_TREC"].notna().all()
    tex = (tmp_path / "rep" / "report.tex").read_text()
    parent = _top_run(c, "una", seeds="2")
    assert "\\begin{tabular}{lcccccccc}" in tex and "\\toprule" in tex and "\\bottomrule" in tex
    assert f"{parent.data.metrics['sts_avg']:.2f} $\\pm$ {parent.data.metrics['sts_avg_std']:.2f}" in tex
    assert "No published reference rows" in md  # a tiny random BERT is not the papers' backbone
    untouched = rows["untouched backbone"].split(" | ")
    simcse = _top_run(c, "simcse", seeds="2")
    assert untouched[1] == frame.loc[frame["recipe"] == "simcse", "backbone"].iloc[0]
    assert f"{simcse.data.metrics['vs_backbone/baseline_sts_avg']:.2f}" in rows["untouched backbone"]
    assert "**Smoke tests, not results**" in md  # the local profile
    with Image.open(tmp_path / "rep" / "report.png") as image:
        assert image.format == "PNG" and image.size[0] >= 600 and len(set(image.convert("L").getdata())) > 10
    report = _top_run(c, "reports")
    assert report.info.status == "FINISHED" and report.data.tags["experiments"] == "simcse,una"
    logged = {f.path for f in c.list_artifacts(report.info.run_id)}
    assert {"report.md", "report.csv", "report.png", "report.json"} <= logged


def test_report_errors(cli, mlflow_server, tmp_path):
    proc = cli("report", "--experiment", "nope", "--out", str(tmp_path / "rep"), env={"MLFLOW_TRACKING_URI": mlflow_server})
    assert_user_error(proc, "no MLflow experiment named 'nope'")
    assert_user_error(cli("train", "simcse", "--seeds", "0"), "--seeds must be between 1 and 100, got 0")
    assert_user_error(cli("train", "simcse", "--seeds", "1000000000"), "--seeds must be between 1 and 100")


def test_reference_rows_follow_the_backbones_and_methods_present():
    from platform.report import reference_rows

    frame = pd.DataFrame([{"recipe": "una", "backbone": "bert-base-uncased"}, {"recipe": "vascl", "backbone": "minilm"}])
    labels = [r["recipe"] for r in reference_rows(frame)]
    assert labels[0].startswith("SimCSE") and any(label.startswith("UNA (Shu") for label in labels)
    assert not any("VaSCL" in label or "AugCSE" in label for label in labels)
    simcse = reference_rows(frame)[0]
    assert simcse["Avg."] == pytest.approx(statistics.mean([simcse[k] for k in simcse if k not in
                                                            ("recipe", "backbone", "Avg.")]), abs=0.01)


def test_a_paper_reporting_its_best_seed_is_compared_with_the_best_seed():
    """AugCSE's 77.98 is the best of 5 seeds (App. A.6): the row shows the best seed's average beside
    the mean, the published row says what it is, and the note says how many seeds each maximum is of."""
    from platform.report import markdown, reference_rows

    frame = pd.DataFrame([{"recipe": "augcse", "backbone": "bert-base-uncased", "seeds": 3, "Avg.": 75.0,
                           "Avg. std": 1.0, "Avg. max": 76.2, "max of seeds": 3, "run_id": "r1"},
                          {"recipe": "simcse", "backbone": "bert-base-uncased", "seeds": 1, "Avg.": 74.0,
                           "Avg. max": None, "run_id": "r2"}])
    refs = reference_rows(frame)
    assert any(r["recipe"].startswith("AugCSE") and "best of 5 seeds" in r["recipe"] for r in refs)
    md = markdown(frame, refs, ["augcse"])
    header = next(line for line in md.splitlines() if line.startswith("| recipe"))
    assert header.split(" | ").index("Avg. max") == header.split(" | ").index("Avg.") + 1
    assert "| 75.00 ± 1.00 | 76.20 |" in md and "augcse: the best of 3 seed(s), the paper's of 5." in md
    assert "Avg. max" not in markdown(frame.drop(columns=["Avg. max"]), refs, ["augcse"])


def test_mean_std_against_direct_computation():
    from platform.run.unit import mean_std

    rows = [{"a": 1.0, "b": 2.0}, {"a": 4.0, "b": 2.0}, {"a": 7.5}]
    out = mean_std(rows)
    assert out == {"a": pytest.approx(statistics.mean([1, 4, 7.5])), "a_std": pytest.approx(statistics.stdev([1, 4, 7.5]))}
    assert mean_std([{"a": 2.0}]) == {"a": 2.0}  # one seed: no spread to report


def test_progress_line():
    from platform.checkpoint import Position
    from platform.run.loop import progress_line

    pos = Position(step=8, train_time_s=20.0, best=78.123)
    line = progress_line("trial ab12", pos, 24, 1.23456, 77.5, improved=False)
    assert line == "[trial ab12] step 8/24  loss 1.2346  stsb_dev_spearman 77.50 (best 78.12)  ETA 0m40s"
    assert progress_line(None, pos, 8, 1.0, 78.123, improved=True).endswith("(best 78.12, new)  ETA 0m00s")


def test_a_sweeps_row_sets_its_nodes_hours_beside_its_training(mlflow_uri):
    """The sweep's node-hours (recorded from Ray's node table at its end) and the share of the GPU
    time its nodes offered that no trial trained in, against a direct computation."""
    from mlflow.tracking import MlflowClient

    from platform.report import markdown, row_of

    c = MlflowClient(mlflow_uri)
    exp = c.create_experiment("una")
    t0 = 1_700_000_000_000  # ms
    parent = c.create_run(exp, start_time=t0, tags={"sweep": "true", "mlflow.runName": "sweep"}).info.run_id
    for key, value in {"node_hours": 5.0, "gpu_node_hours": 4.0, "gpu_hours_offered": 4.0, "nodes_seen": 5}.items():
        c.log_metric(parent, key, value)
    for i, hours in enumerate((1.5, 0.5)):  # two trials of one GPU worker each
        trial = c.create_run(exp, start_time=t0, tags={"mlflow.parentRunId": parent, "run.use_gpu": "true",
                                                      "run.num_workers": "1", "mlflow.runName": f"t{i}"}).info.run_id
        c.set_terminated(trial, end_time=t0 + int(hours * 3.6e6))
    c.set_terminated(parent, end_time=t0 + int(2 * 3.6e6))
    row = row_of(mlflow_uri, c.get_run(parent))
    assert row["GPU-hours"] == pytest.approx(2.0) and row["node-hours"] == 5.0
    assert row["GPU idle share"] == pytest.approx(1 - 2.0 / 4.0)
    md = markdown(pd.DataFrame([{**row, "recipe": "una", "backbone": "minilm"}]), [], ["una"])
    assert "| GPU-hours | node-hours | GPU idle share |" in md and "| 2.00 | 5.00 | 0.50 |" in md
    c.log_metric(parent, "billed_node_hours", 5.5)  # on a cluster up made: what AWS bills, boot included
    assert row_of(mlflow_uri, c.get_run(parent))["node-hours"] == 5.5


def test_the_report_shows_the_untouched_backbone_and_says_smoke(mlflow_uri):
    """The backbone's row (its 7 tasks with the run's pooler, as the final
    evaluation scored it) sits under the rows trained from it, once per backbone; a smoke run (the
    local profile, a sentence-tuned backbone) is named as one, a paper-profile run is not."""
    from mlflow.tracking import MlflowClient

    from platform.data import STS_TASKS
    from platform.report import markdown, row_of

    c = MlflowClient(mlflow_uri)
    exp = c.create_experiment("simcse")
    rows = []
    for profile, model, base in (("local", "minilm", 70.0), ("paper", "bert-base-uncased@86b5e09", 50.0)):
        run = c.create_run(exp, tags={"profile": profile, "model": model, "mlflow.runName": profile}).info.run_id
        for i, task in enumerate([*STS_TASKS, "avg"]):
            c.log_metric(run, f"sts_{task}", base + 10 + i)
            c.log_metric(run, f"vs_backbone/baseline_sts_{task}", base + i)
        c.set_terminated(run)
        rows.append({**row_of(mlflow_uri, c.get_run(run)), "recipe": "simcse"})
    md = markdown(pd.DataFrame(rows), [], ["simcse"])
    table = [line for line in md.splitlines() if line.startswith("| untouched backbone")]
    assert len(table) == 2
    assert table[0].startswith("| untouched backbone | minilm |  | 70.00 | 71.00 |")
    assert "| bert-base-uncased |" in table[1] and f"| {50 + 7:.2f} |" in table[1]
    smoke = next(line for line in md.splitlines() if line.startswith("**Smoke tests, not results**"))
    assert "simcse (minilm): the local profile's short schedule" in smoke and "bert-base-uncased" not in smoke


def test_every_published_row_with_its_tasks_averages_to_its_avg_and_the_new_recipes_have_theirs():
    """Per-task published rows (SimCSE's, AugCSE's Table 4) average to their published average; the
    prompt-based recipes and AugCSE-RoBERTa-base have reference rows on their backbones."""
    from methods.published import PUBLISHED
    from platform.report import reference_rows

    for *_, label, scores in (entry[:4] for entry in PUBLISHED):
        tasks = [v for k, v in scores.items() if k != "Avg."]
        if tasks:
            assert len(tasks) == 7 and statistics.mean(tasks) == pytest.approx(scores["Avg."], abs=0.01), label
    pairs = [(m, b) for m in ("promptbert", "sncse", "cotbert", "augcse") for b in ("bert-base-uncased", "roberta-base")]
    frame = pd.DataFrame([{"recipe": m, "backbone": b, "seeds": 1, "Avg.": 70.0, "run_id": f"{m}-{b}"} for m, b in pairs])
    averages = {(r["backbone"], r["recipe"].split(" (")[0]): r["Avg."] for r in reference_rows(frame)}
    assert {averages[("bert-base-uncased", name)] for name in ("PromptBERT", "SNCSE", "CoT-BERT")} == {78.54, 78.97, 79.40}
    assert {averages[("roberta-base", name)] for name in ("PromptBERT", "SNCSE", "CoT-BERT", "AugCSE")} == {
        79.15, 79.23, 80.62, 76.83}


def test_mteb_scores_get_a_section_of_their_own():
    """Runs evaluated with MTEB (``platform.evaluate --benchmark ... --log-to``) show their tasks and
    mean under the STS table; runs without are not listed there, and the STS table keeps its columns."""
    from platform.report import markdown

    frame = pd.DataFrame([{"recipe": "simcse", "backbone": "b", "seeds": 1, "Avg.": 70.0, "run_id": "r1",
                           "mteb_STS12": 71.5, "mteb_SICK-R": 66.25, "mteb_mean": 68.875},
                          {"recipe": "una", "backbone": "b", "seeds": 1, "Avg.": 71.0, "run_id": "r2",
                           "mteb_STS12": float("nan"), "mteb_SICK-R": float("nan"), "mteb_mean": float("nan")}])
    md = markdown(frame, [], ["x"])
    section = md[md.index("MTEB (the `mteb` package"):]
    assert "| recipe | backbone | SICK-R | STS12 | mean |" in section and "| simcse | b | 66.25 | 71.50 | 68.88 |" in section
    assert "| una |" not in section.split("Runs:")[0]
    assert "mteb_" not in md.split("MTEB (")[0]
    assert "MTEB (" not in markdown(frame.drop(columns=["mteb_STS12", "mteb_SICK-R", "mteb_mean"]), [], ["x"])


def test_the_published_columns_are_the_evaluated_tasks_in_order():
    from methods.published import TASK_COLUMNS
    from platform.data import SHORT_NAMES, STS_TASKS

    assert TASK_COLUMNS == [SHORT_NAMES[t] for t in STS_TASKS] + ["Avg."]
