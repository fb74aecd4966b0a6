"""How well ASHA's rungs judge a sweep: over a sweep's trials that ran to their last evaluation,
the rank correlation (Spearman) between each trial's best STS-B dev at a rung and its final best,
rung by rung, and whether the rung's leader is the final winner.

A rung at ``grace_period * reduction_factor**k`` evaluations is where ASHA keeps the top
``1/reduction_factor`` of the trials that reached it; a correlation near 1 there means stopping
at that rung loses little. Run the sweep with ``scheduler: {type: none}`` (every trial to its end)
to measure, then read it::

    MLFLOW_TRACKING_URI=... python -m benchmarks run asha-rungs --experiment simcse [--sweep RUN_ID]
        [--grace 16] [--reduction-factor 2]

Without ``--experiment`` the case first runs such a sweep itself: ``--trials`` learning rates of
SimCSE on the tests' tiny random BERT, ``--steps`` steps each, STS-B dev every 2, in a local MLflow
store (the numbers then say how the case reads a sweep, not how ASHA judges a real one).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.common import model_source
from benchmarks.harness import ROOT, Bench, Case
from platform.data import read_corpus, resolve_corpus
from platform.sweep_summary import rung_table

DEV = "stsb_dev_spearman"


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--experiment", default=None, help="the sweep's experiment (default: run a small sweep first)")
    p.add_argument("--sweep", default=None, help="the sweep's parent run id (default: the newest sweep)")
    p.add_argument("--grace", type=int, default=1, help="the first rung, in evaluations")
    p.add_argument("--reduction-factor", type=float, default=2.0)
    p.add_argument("--trials", type=int, default=6, help="the small sweep's trials")
    p.add_argument("--steps", type=int, default=16, help="the small sweep's steps per trial")


def small_sweep(trials: int, steps: int) -> str:
    """A sweep of ``trials`` learning rates run to their end; returns its tracking URI."""
    work = Path(tempfile.mkdtemp(prefix="asha-rungs-"))
    lrs = ", ".join(f"{1e-4 * 2 ** i:.2e}" for i in range(trials))
    (work / "space.yaml").write_text(f"metric: {DEV}\nmode: max\nsearch: grid\nnum_samples: 1\nmax_concurrent_trials: 1\n"
                                     f"seed: 0\nscheduler: {{type: none}}\nspace:\n  lr: {{grid: [{lrs}]}}\n")
    corpus = work / "corpus.txt"
    corpus.write_text("\n".join(read_corpus(resolve_corpus("wiki1m_for_simcse.first11914.txt.gz"), limit=512)) + "\n")
    sets = {"model": model_source("tiny"), "corpus": corpus, "batch_size": 16, "max_steps": steps, "eval_steps": 2,
            "num_workers": 1, "data_pipeline": "local", "final_eval": "false", "output_dir": work / "runs"}
    uri = f"sqlite:///{work / 'mlflow.db'}"
    subprocess.run([sys.executable, "-m", "platform.tune", "simcse", "--space", str(work / "space.yaml"),
                    *[a for k, v in sets.items() for a in ("--set", f"{k}={v}")]], cwd=ROOT, check=True,
                   env={**os.environ, "MLFLOW_TRACKING_URI": uri}, stdout=subprocess.DEVNULL)
    return uri


def run(args: argparse.Namespace, bench: Bench) -> None:
    from mlflow.tracking import MlflowClient

    uri = None if args.experiment else small_sweep(args.trials, args.steps)
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(args.experiment or "simcse")
    if experiment is None:
        raise SystemExit(f"error: no experiment {args.experiment!r}")
    ids = [experiment.experiment_id]
    sweep = args.sweep or client.search_runs(ids, "tags.sweep = 'true'", order_by=["attributes.start_time DESC"],
                                             max_results=1)[0].info.run_id
    trials = client.search_runs(ids, f"tags.`mlflow.parentRunId` = '{sweep}' and attributes.status = 'FINISHED'")
    histories = {}
    for trial in trials:
        if trial.data.tags.get("stopped_by_scheduler") == "true":
            continue  # no final score to compare with
        points = sorted(client.get_metric_history(trial.info.run_id, DEV), key=lambda m: m.step)
        histories[trial.data.tags.get("trial_id", trial.info.run_id)] = [m.value for m in points]
    if len(histories) < 3:
        raise SystemExit(f"error: sweep {sweep} has {len(histories)} trials run to their end; 3 or more are needed")
    print(f"sweep {sweep}: {len(histories)} trials run to the end, {min(map(len, histories.values()))} evaluations each")
    print("| rung (evaluations) | trials | Spearman vs final best | leader wins |\n|---|---|---|---|")
    for rung, n, rho, leads in rung_table(histories, args.grace, args.reduction_factor):
        print(f"| {rung} | {n} | {rho:.2f} | {'yes' if leads else 'no'} |")
        bench.figure(f"spearman_at_rung_{rung}", rho)


CASE = Case("asha-rungs", "how well ASHA's rungs judge a sweep: each rung's rank correlation with the trials' final "
            "best STS-B dev, and whether its leader wins", arguments, run, smoke=["--trials", "3", "--steps", "4"],
            meaning="A correlation near 1 at a rung means ASHA loses little by stopping trials there; the "
                    "tune_spaces' grace periods follow from it.")
