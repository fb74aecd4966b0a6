"""ESimCSE through the platform: its bad input and the combinations it refuses, one line each
before anything runs, and a sweep of its space on Ray (the queue and the momentum copy inside Ray
Train's workers). (A killed run resumed with its queue: tests/platform/run/test_interrupts.py.)"""

from __future__ import annotations

import pytest

from tests.helpers import assert_user_error, run_cli, runs_of, sets


@pytest.mark.parametrize("values, needle", [
    (["dup_rate=1.5"], "dup_rate must be in [0, 1]"),
    (["queue_size=0"], "queue_size must be >= 1"),
    (["momentum=1"], "momentum must be in [0, 1)"),
    (["loss=ntxent"], "negatives=momentum_queue adds the queue's embeddings to InfoNCE's denominator"),
    (["encoder=prompt"], "use encoder=plain"),
    (["replicas=2"], "queues the whole batch"),
])
def test_esimcse_bad_input_is_one_line(values, needle, cli):
    assert_user_error(cli("train", "esimcse", *[a for v in values for a in ("--set", v)]), needle)


@pytest.mark.e2e
def test_a_sweep_of_esimcses_space_trains_its_queue_on_ray(tiny_model, small_corpus, tmp_path, mlflow_uri):
    """``python -m platform.tune esimcse`` (a trial on Ray Train's worker): FINISHED with its sampled
    dup_rate, queue_size and momentum, its queue filling from the second step."""
    proc = run_cli("tune", "esimcse", "--num-samples", "1",
                   *sets(model=tiny_model, corpus=small_corpus, batch_size=16, max_steps=3, eval_steps=3, log_steps=1,
                         num_workers=1, use_gpu="false", output_dir=tmp_path / "runs", final_eval="false"),
                   env={"MLFLOW_TRACKING_URI": mlflow_uri})
    assert proc.returncode == 0, proc.stderr[-3000:]
    c, runs = runs_of(mlflow_uri, "esimcse")
    (parent,) = [r for r in runs if r.data.tags.get("sweep") == "true"]
    trials = [r for r in runs if r.data.tags.get("trial_id")]
    assert len(trials) == 1 and all(r.info.status == "FINISHED" for r in trials)
    assert {k.split(".", 1)[1] for k in parent.data.params if k.startswith("space.")} >= {"dup_rate", "queue_size",
                                                                                          "momentum", "lr"}
    for trial in trials:
        size = int(trial.data.params["momentum_queue.queue_size"])
        queue = [m.value for m in sorted(c.get_metric_history(trial.info.run_id, "momentum_queue_negatives"),
                                         key=lambda m: m.step)]
        assert queue == [0.0, min(16.0, size), min(32.0, size)], (queue, size)
