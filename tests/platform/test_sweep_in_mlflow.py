"""What a researcher finds in MLflow after a sweep at the paper profile's checkpoint interval
(``checkpoint_minutes=15``) in which ASHA stops a trial between two resumable states:
the stopped trial's run holds every evaluation it made and every step it trained, its best dev
score and a description that says how it ended; the link the sweep prints opens MLflow's UI on
the trials with their searched values and dev score; the registered version's 7-task table is
aligned. Against a real ``mlflow server``; the UI in headless Chromium where it is installed.

The two trials run one after the other (a grid, one at a time): the first (lr 1e-3) climbs to
~44 on STS-B dev, the second (lr 1e-2, far too large for the tiny BERT) falls to ~30 by its second
evaluation, where ASHA's rung (grace period 2) compares it with the first and stops it. Its one
resumable state was written at its first evaluation; what came after reached MLflow live."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers import ASHA_GRID_SPACE, run_cli, runs_of, sets, steps_of

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def sweep(tiny_model, small_corpus, tmp_path_factory, mlflow_server):
    tmp = tmp_path_factory.mktemp("asha")
    space = tmp / "space.yaml"
    space.write_text(ASHA_GRID_SPACE)
    # 256 sentences at batch 16: 8 steps inside the first epoch, STS-B dev every 2. No Ray Data: the
    # pipeline is not what this module is about (tests/platform/data/test_shuffle.py and the sweeps elsewhere run it).
    args = sets(model=tiny_model, corpus=small_corpus, batch_size=16, max_steps=8, eval_steps=2, log_steps=1,
                seed=42, num_workers=1, checkpoint_minutes=15, data_pipeline="local", output_dir=tmp / "runs")
    proc = run_cli("tune", "simcse", "--space", str(space), *args, env={"MLFLOW_TRACKING_URI": mlflow_server})
    assert proc.returncode == 0, proc.stderr[-3000:]
    c, runs = runs_of(mlflow_server, "simcse")
    trials = {float(r.data.params["lr"]): r for r in runs if r.data.tags.get("trial_id")}
    assert sorted(trials) == [1e-3, 1e-2]
    return {"proc": proc, "client": c, "uri": mlflow_server, "finished": trials[1e-3], "stopped": trials[1e-2],
            "parent": next(r for r in runs if r.data.tags.get("sweep") == "true"), "tmp": tmp}


def test_every_evaluation_holds_its_geometry_and_the_sweep_its_figure(sweep):
    """Alignment and uniformity reach MLflow with each STS-B dev score, the trial ASHA stopped
    included; the sweep's parent holds SimCSE's Fig. 2 of its trials."""
    c = sweep["client"]
    for trial in (sweep["finished"], sweep["stopped"]):
        evaluated = steps_of(c, trial.info.run_id, "stsb_dev_spearman")
        for key in ("stsb_dev_alignment", "stsb_dev_uniformity"):
            assert steps_of(c, trial.info.run_id, key) == evaluated, (key, trial.data.tags.get("trial_id"))
        assert trial.data.metrics["stsb_dev_alignment"] >= 0 and trial.data.metrics["stsb_dev_uniformity"] <= 0
    artifacts = {a.path for a in c.list_artifacts(sweep["parent"].info.run_id, "plots")}
    assert "plots/geometry.png" in artifacts, artifacts


def test_a_trial_asha_stops_between_states_holds_every_evaluation(sweep):
    c, finished, stopped = sweep["client"], sweep["finished"], sweep["stopped"]
    assert stopped.data.tags.get("stopped_by_scheduler") == "true", (stopped.data.tags, sweep["proc"].stdout[-3000:])
    assert finished.data.tags.get("stopped_by_scheduler") != "true"

    # Each evaluation once, each trained step once, whether or not a state followed it. ASHA's
    # decision (at the second evaluation) reaches the trial while it trains on, and its workers
    # are killed wherever they are: every evaluation Tune received is in MLflow (the driver prints
    # a trial's lines as it receives them).
    assert steps_of(c, finished.info.run_id, "stsb_dev_spearman") == [2, 4, 6, 8]
    evaluated = steps_of(c, stopped.info.run_id, "stsb_dev_spearman")
    trained = steps_of(c, stopped.info.run_id, "train_loss")
    assert evaluated == list(range(2, 2 * len(evaluated) + 1, 2)) and len(evaluated) >= 2, evaluated
    assert trained == list(range(1, len(trained) + 1)) and evaluated[-1] <= len(trained), trained
    tid = stopped.data.tags["trial_id"]
    printed = [int(s) for s in re.findall(rf"\[trial {tid}\] step (\d+)/8 .*stsb_dev_spearman", sweep["proc"].stdout)]
    assert printed and set(printed) <= set(evaluated), (printed, evaluated)
    # Its one resumable state is its first evaluation's (the next was due 15 minutes later): the
    # second evaluation reached MLflow without a state behind it.
    assert "/checkpoint_00000002_" in stopped.data.tags["best_checkpoint"], stopped.data.tags
    # Named once Ray had ended the trial's rank 0, which said it prunes the fit's checkpoints: still in storage.
    fit = Path(stopped.data.tags["best_checkpoint"]).parent
    assert re.fullmatch(r"[0-9a-f]{32}", (fit / "PRUNER").read_text()) and (fit.parent / stopped.data.tags["trial_id"]) == fit
    assert (Path(stopped.data.tags["best_checkpoint"]) / "state.json").is_file()
    for run in (finished, stopped):
        dev = [m.value for m in c.get_metric_history(run.info.run_id, "stsb_dev_spearman")]
        assert run.data.metrics["best_stsb_dev_spearman"] == pytest.approx(max(dev))
        assert run.info.status == "FINISHED"
    assert stopped.data.metrics["stsb_dev_spearman"] < finished.data.metrics["best_stsb_dev_spearman"] - 5

    note = stopped.data.tags["mlflow.note.content"]
    assert "stopped early by the scheduler (ASHA)" in note and f", {len(evaluated)} evaluation(s)." in note, note
    # Described after its points were written, by the same writer: what the run holds is what its
    # description counts.
    assert f"**Trained:** {len(trained)} steps." in note, (note, trained)
    assert "**Ended:** finished." in finished.data.tags["mlflow.note.content"]


def test_the_registered_versions_table_is_aligned_text(sweep):
    """The registry page renders Markdown tables with no cell spacing: the 7 tasks are an aligned
    text table in a code block (the console's: the backbone, the version, their difference)."""
    version = sweep["client"].get_model_version("simcse-encoder", "1")
    block = re.search(r"```text\n(.+?)\n```", version.description, re.S)
    assert block, version.description
    rows = block.group(1).splitlines()
    assert [r.split("|")[0].strip() for r in rows[2:]] == [Path(version.tags["backbone"]).name, "trained", "difference"]
    assert set(rows[1]) == {"-"}, rows
    bars = [[m.start() for m in re.finditer(r"\|", r)] for r in (rows[0], *rows[2:])]
    assert all(b == bars[0] for b in bars) and len(bars[0]) == 8, rows  # every row's columns where the header's are
    assert "STS12" in rows[0] and "SICK-R" in rows[0] and "avg" in rows[0]


def _render(url: str, profile) -> str:
    """The page's DOM once MLflow's UI has loaded its data, in headless Chromium with a fresh
    profile (MLflow keeps a user's table settings in the browser: a new user has none)."""
    proc = subprocess.run([shutil.which("chromium"), "--headless=new", "--no-sandbox", "--disable-gpu",
                           f"--user-data-dir={profile}", "--window-size=1600,1000", "--virtual-time-budget=20000",
                           "--dump-dom", url], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs Chromium (Debian: apt install chromium)")
def test_mlflows_ui_opens_on_the_trials_and_each_trial_says_how_it_ended(sweep):
    """The sweep's `browse it:` link, in a browser that has never opened MLflow: the trials' rows
    with their searched value and dev score (the experiment's default page shows one collapsed
    row, the sweep's parent, and neither); the stopped trial's page says ASHA stopped it."""
    (link,) = re.findall(r"browse it: +open (\S+) in a browser", sweep["proc"].stdout)
    assert "viewStateShareKey=" in link and "workflowType=machine_learning" in link
    finished, stopped = sweep["finished"], sweep["stopped"]
    page = _render(link, sweep["tmp"] / "chromium-1")
    for run in (finished, stopped):
        assert run.info.run_name in page, run.info.run_name
        assert f">{run.data.params['lr']}<" in page  # the searched value's column
        assert f">{run.data.metrics['best_stsb_dev_spearman']}<" in page  # the dev score's column
    assert page.index(finished.info.run_name) < page.index(stopped.info.run_name)  # best first
    default = _render(link.split("/runs?")[0] + "?workflowType=machine_learning", sweep["tmp"] / "chromium-2")
    assert sweep["parent"].info.run_name[:12] in default and stopped.info.run_name not in default
    run_page = _render(f"{sweep['uri']}/#/experiments/{stopped.info.experiment_id}/runs/{stopped.info.run_id}"
                       "?workflowType=machine_learning", sweep["tmp"] / "chromium-3")
    assert "stopped early by the scheduler (ASHA)" in run_page


def test_the_sweeps_description_links_its_trials_before_mlflow_folds_it(sweep):
    """MLflow's UI shows a run's description folded after its first lines: the parent's second
    paragraph is the link to the trials' view, which the closing block's link opens too."""
    parent = sweep["parent"]
    paragraphs = parent.data.tags["mlflow.note.content"].split("\n\n")
    assert paragraphs[0].startswith("**Best trial:**") and sweep["finished"].info.run_id in paragraphs[0]
    link = f"#/experiments/{parent.info.experiment_id}/runs?viewStateShareKey=sweep-{parent.info.run_id}"
    assert paragraphs[1].startswith("**Trials:**") and link in paragraphs[1], paragraphs[:3]
    assert link in sweep["proc"].stdout.split("sweep finished", 1)[1]
