"""A sweep never waits forever: a running trial that reports nothing for ``PLATFORM_STALL_MINUTES``
fails the sweep with one line naming it, the driver's threads dumped beside the sweep's state,
and the sweep's runs ended FAILED (``--resume`` continues). The driver is the product's pieces
(Tune, the ``TrialRuns`` callback, a parent run in ``Run.closing``) in a process of its own, since
the sweep's end is that process's exit."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tests.helpers import ROOT, runs_of

pytestmark = pytest.mark.e2e

DRIVER = textwrap.dedent('''
    import sys, time
    from pathlib import Path
    from platform.config import TrainConfig
    from platform.run.ray_env import init_ray
    from platform.sweep_runs import Sweep, TrialRuns, open_trial_run
    from platform.tracking.recorder import Run
    from platform.tune import HEAD_NODE

    uri, folder, model = sys.argv[1], Path(sys.argv[2]), sys.argv[3]

    def trial(config, sweep):
        import ray.tune
        run, _ = open_trial_run(sweep, ray.tune.get_context().get_trial_id(), sweep.base)
        ray.tune.report({"stsb_dev_spearman": 50.0, "step": 2})
        time.sleep(600)  # a worker stuck in a collective, a hung read: nothing reported again

    init_ray(num_cpus=2)
    from ray import tune
    base = TrainConfig.build("simcse", "local", {"model": model})
    parent = Run.create(uri, "stall", "sweep", {"sweep": "true"})
    sweep = Sweep(base, [], uri, parent.id, str(folder), experiment="stall", experiment_id=parent.experiment_id)
    with parent.closing():
        tune.Tuner(tune.with_resources(tune.with_parameters(trial, sweep=sweep), {"cpu": 0, "memory": 2**28, HEAD_NODE: 0.001}),
                   tune_config=tune.TuneConfig(metric="stsb_dev_spearman", mode="max", num_samples=1),
                   run_config=tune.RunConfig(name="tune", storage_path=str(folder), callbacks=[TrialRuns(sweep).callback()],
                                             verbose=0)).fit()
''')


def test_a_trial_that_reports_nothing_for_the_stall_minutes_fails_the_sweep_in_one_line(tmp_path, mlflow_uri, tiny_model):
    folder = tmp_path / "sweep"
    proc = subprocess.run([sys.executable, "-c", DRIVER, mlflow_uri, str(folder), str(tiny_model)], cwd=ROOT,
                          env={**__import__("os").environ, "PLATFORM_STALL_MINUTES": "0.25"}, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "reported nothing for 0.25 min" in errors[0] and "--resume" in errors[0], errors
    _, runs = runs_of(mlflow_uri, "stall")
    trial = next(r for r in runs if r.data.tags.get("trial_id"))
    assert f"trial {trial.data.tags['trial_id']} reported nothing" in errors[0]
    assert {r.info.status for r in runs} == {"FAILED"} and "reported nothing" in trial.data.tags["platform.end_reason"]
    dump = (folder / "stalled-driver-threads.txt").read_text()
    assert "Thread" in dump and "File " in dump, dump[:500]
