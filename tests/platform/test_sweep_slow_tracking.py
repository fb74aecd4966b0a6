"""A sweep never waits on its tracking server. Behind a proxy that holds every MLflow request 2 s,
a sweep in which ASHA stops one trial while the other reports its last step runs 20 times in one
Ray session: every time, both trials' runs end (the stopped one FINISHED, marked stopped by the
scheduler), every point of every result Tune received is in MLflow, once, and the sweep ends in
bounded time.

The sweep is the product's: ``platform.tune.sweep_tuner``'s pieces (Tune, ASHA, the driver's
``TrialRuns`` callback), each trial opening its run with ``sweep_runs.open_trial_run`` and
reporting as the training loop's rank 0 does (its points, its line, a checkpoint in storage per
evaluation); the training itself is left out, so that the 20 sweeps fit in minutes."""

from __future__ import annotations

import json
import os
import time

import pytest

from tests.helpers import runs_of

pytestmark = pytest.mark.scenario

REPEATS, DELAY_S = int(os.environ.get("SLOW_TRACKING_REPEATS", 20)), 2.0
# Each trial's STS-B dev at its four evaluations (steps 2, 4, 6, 8), and the pause before each.
GOOD, BAD = (50.0, 60.0, 70.0, 80.0), (10.0, 12.0, 14.0, 16.0)
PAUSES = {GOOD: 0.7, BAD: 1.0}
# ASHA keeps whatever reaches a rung first. Its first rung is a trial's second result (grace period
# 2, in Tune's training iterations): the bad trial reports its second evaluation only once the
# driver has taken the good one's (a bad trial that started early, beside other tests, once reached
# the rung first and was not stopped).
RUNG, RUNG_TAKEN = 2, "good-at-the-first-rung"
BOUND_S = 150.0  # one sweep: the trials' runs opened and ended through the slow server, ~30 requests


def reporting_trial():
    """The trial, made here so that Ray takes it by value (this module is not importable in its workers)."""

    def trial(config, sweep):
        import ray.tune

        from platform.sweep_runs import open_trial_run
        from platform.tracking.names import BEST, DEV_METRIC, POINTS, POINTS_RUN, PROGRESS_LINE, STEP
        from pathlib import Path

        trial_id = ray.tune.get_context().get_trial_id()
        run, _ = open_trial_run(sweep, trial_id, sweep.base.with_values(config, source="search space"))
        devs = GOOD if config["lr"] == 1e-3 else BAD
        best = float("-inf")
        for i, dev in enumerate(devs, 1):
            time.sleep(PAUSES[devs])
            waited = time.monotonic()
            while devs == BAD and i == RUNG and not (Path(sweep.folder) / RUNG_TAKEN).exists():
                assert time.monotonic() - waited < BOUND_S, "the good trial never reached ASHA's first rung"
                time.sleep(0.05)
            step, now, best = 2 * i, int(time.time() * 1000), max(best, dev)
            folder = Path(sweep.folder) / "trials" / trial_id / f"checkpoint_{step:06d}"
            folder.mkdir(parents=True)
            (folder / "state.json").write_text(json.dumps({"step": step, DEV_METRIC: dev}))
            points = [["train_loss", 1.0 / s, now, s] for s in (step - 1, step)] + [[DEV_METRIC, dev, now, step],
                                                                                  [BEST, best, now, step]]
            ray.tune.report({STEP: step, DEV_METRIC: dev, BEST: best, POINTS: json.dumps(points), POINTS_RUN: run.id,
                             PROGRESS_LINE: f"[trial {trial_id}] step {step}/8"})

    return trial


def rung_taken(folder):
    """A driver callback (after the scheduler's decision): marks that ASHA holds the good trial's score at its first rung."""
    from ray import tune

    from platform.tracking.names import DEV_METRIC

    class Taken(tune.Callback):
        def on_trial_result(self, iteration, trials, trial, result, **info):
            if result.get(DEV_METRIC) == GOOD[RUNG - 1]:
                folder.mkdir(parents=True, exist_ok=True)
                (folder / RUNG_TAKEN).touch()

    return Taken()


def one_sweep(uri: str, direct: str, base, folder) -> tuple[float, list]:
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    from platform.sweep_runs import Sweep, TrialRuns
    from platform.tracking.names import DEV_METRIC
    from platform.tracking.recorder import Run
    from platform.tune import HEAD_NODE

    parent = Run.create(direct, "slow-tracking", folder.name, {"sweep": "true"})  # the test's own, not through the proxy
    sweep = Sweep(base, [], uri, parent.id, str(folder), experiment="slow-tracking", experiment_id=parent.experiment_id)
    started = time.monotonic()
    tuner = tune.Tuner(
        tune.with_resources(tune.with_parameters(reporting_trial(), sweep=sweep), {"cpu": 0, "memory": 2**28, HEAD_NODE: 0.001}),
        param_space={"lr": tune.grid_search([1e-3, 2e-3])},  # a searched key; the trial's scores are GOOD or BAD
        tune_config=tune.TuneConfig(metric=DEV_METRIC, mode="max", max_concurrent_trials=2,
                                    scheduler=ASHAScheduler(max_t=5, grace_period=2, reduction_factor=2)),
        run_config=tune.RunConfig(name="tune", storage_path=str(folder), callbacks=[TrialRuns(sweep).callback(), rung_taken(folder)],
                                  verbose=0))
    results = tuner.fit()
    return time.monotonic() - started, [r.metrics_dataframe for r in results]


def test_twenty_sweeps_with_an_asha_stop_end_whole_behind_a_slow_tracking_server(tmp_path, mlflow_server, tiny_model):
    import ray

    from platform.config import TrainConfig
    from platform.run.ray_env import init_ray
    from platform.tracking.names import POINTS, STEP
    from tests.services import SlowProxy

    proxy = SlowProxy(mlflow_server, DELAY_S)
    base = TrainConfig.build("simcse", "local", {"model": str(tiny_model)})
    init_ray(num_cpus=2)
    took = []
    try:
        for i in range(REPEATS):
            seconds, frames = one_sweep(proxy.uri, mlflow_server, base, tmp_path / f"sweep-{i:02d}")
            took.append(seconds)
            print(f"sweep {i}: {seconds:.1f} s, {proxy.requests} requests so far", flush=True)
            assert seconds < BOUND_S, (i, took)
            c, runs = runs_of(mlflow_server, "slow-tracking")
            parent = next(r for r in runs if r.info.run_name == f"sweep-{i:02d}")
            trials = {r.data.tags["trial_id"]: r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id}
            assert len(trials) == 2, (i, [(r.info.run_name, r.info.status, r.data.tags) for r in runs[:4]])
            ended = sorted((r.info.status, r.data.tags.get("stopped_by_scheduler", "")) for r in trials.values())
            assert ended == [("FINISHED", ""), ("FINISHED", "true")], (i, ended)
            for frame in frames:  # every result Tune received: its points in the trial's run, once
                run = trials[frame["trial_id"].iloc[0]]
                sent = [tuple(p) for raw in frame[POINTS] for p in json.loads(raw)]
                for key in {p[0] for p in sent}:
                    held = sorted((m.step, m.value) for m in c.get_metric_history(run.info.run_id, key))
                    assert held == sorted((p[3], p[1]) for p in sent if p[0] == key), (i, key, held)
                assert int(frame[STEP].max()) == max(p[3] for p in sent)
    finally:
        ray.shutdown()
        proxy.stop()
    print(f"{REPEATS} sweeps behind a {DELAY_S:g} s proxy: {min(took):.0f}-{max(took):.0f} s each, "
          f"{sum(took):.0f} s in all")
