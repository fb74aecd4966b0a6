"""Whatever stops a run, its recorded status is true and ``--resume`` continues it, with real
signals, a real local Ray and a real MLflow store. Each command runs from a copy of the repository
with the test ingredient ``aux=barrier`` (``tests/barrier.py``), which holds training at a chosen
step while a file says so: the signal always lands mid-fit, with checkpoints before it.
(SIGTERM to a sweep on the multi-node topology: tests/platform/cluster/test_multinode.py.)"""

from __future__ import annotations

import contextlib
import signal
from pathlib import Path

import pytest

from tests.helpers import commits_step, kill_group, release_barrier, repo_with_barrier, runs_of, sets, start_cli, steps_of, wait_for


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    return repo_with_barrier(tmp_path_factory.mktemp("repo"))


def _held(tmp_path, step: int) -> tuple:
    folder = tmp_path / "barrier"
    folder.mkdir()
    (folder / "armed").touch()
    return folder, {"aux": "barrier", "barrier_dir": folder, "barrier_step": step}


def _committed(root: Path, step: int, count: int = 1) -> bool:
    """Whether Ray Train's controller has committed the checkpoint of ``step`` of ``count`` fits under ``root``."""
    found = 0
    for snapshot in Path(root).rglob("checkpoint_manager_snapshot.json"):
        with contextlib.suppress(OSError):
            found += commits_step(snapshot.read_bytes(), step)
    return found >= count


def _stop(proc, sig) -> tuple[str, str]:
    proc.send_signal(sig)
    try:
        return proc.communicate(timeout=120)
    finally:
        kill_group(proc)


@pytest.mark.scenario
def test_a_sweep_whose_driver_is_killed_resumes_truthfully(repo, tiny_model, small_corpus, tmp_path, mlflow_uri):
    """SIGKILL to a sweep's driver while both its trials are held mid-fit leaves the sweep's and
    the trials' runs RUNNING (nothing can run after SIGKILL). ``--resume`` closes them truthfully
    and continues each trial in its own run from its checkpoint: no run stays RUNNING, every
    FINISHED trial names a checkpoint that exists, and the best run is the best of them."""
    from platform.checkpoint import exists as checkpoint_exists

    space = tmp_path / "simcse.yaml"  # both trials at once, no early stopping: both reach the barrier
    space.write_text("search: optuna\nnum_samples: 2\nmax_concurrent_trials: 2\nscheduler: {type: none}\n"
                     "space:\n  lr: {loguniform: [1.0e-5, 1.0e-4]}\n")
    barrier, held = _held(tmp_path, step=5)
    # The paper profile's checkpoint policy: 2 epochs of 3 steps, so step 2 writes the model only
    # (it improves the first score), step 4 the full state (the second epoch's first evaluation).
    args = ["simcse", "--space", str(space), *sets(
        model=tiny_model, corpus=small_corpus, max_sentences=24, epochs=2, checkpoint_minutes=60, batch_size=8,
        max_steps=6, eval_steps=2, log_steps=1, num_workers=1, cpus_per_worker=0.4, data_pipeline="local",
        final_eval="false", output_dir=tmp_path / "runs", **held)]
    env = {"MLFLOW_TRACKING_URI": mlflow_uri}
    proc = start_cli("tune", *args, env=env, cwd=repo)
    wait_for("both trials to reach step 5", lambda: len((barrier / "blocked").read_text().split()) == 2
             if (barrier / "blocked").exists() else False, proc=proc)
    wait_for("their states of step 4", lambda: _committed(tmp_path / "runs", 4, count=2), proc=proc)
    _stop(proc, signal.SIGKILL)
    for fit in (tmp_path / "runs").glob("*/trials/*"):  # a state at 4; the model of step 2 at most besides
        kept = {int(p.name.split("_")[1]): p for p in fit.glob("checkpoint_0*") if (p / "state.json").is_file()}
        assert [s for s, p in kept.items() if (p / "train_state.pt").is_file()] == [4], kept
        assert set(kept) <= {2, 4} and all((p / "model").is_dir() for s, p in kept.items() if s == 2), kept
    c, runs = runs_of(mlflow_uri)
    assert sorted(r.info.status for r in runs) == ["RUNNING"] * 3  # the driver could not close them
    release_barrier(barrier)

    proc = start_cli("tune", *args, "--resume", env=env, cwd=repo)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    c, runs = runs_of(mlflow_uri)
    trials = [r for r in runs if r.data.tags.get("trial_id")]
    parent = next(r for r in runs if r.data.tags.get("sweep") == "true")
    assert len(trials) == 2 and all(r.info.status == "FINISHED" for r in runs)
    assert all(checkpoint_exists(r.data.tags["best_checkpoint"]) for r in trials)
    best = max(trials, key=lambda r: r.data.metrics["best_stsb_dev_spearman"])
    assert parent.data.tags["best_run_id"] == best.info.run_id
    # Each trial continued in its own run from its checkpoint of step 4: every step once.
    for trial in trials:
        assert trial.data.tags["platform.resumed"] == "1"
        assert steps_of(c, trial.info.run_id, "resumed_at_step") == [4]
        assert steps_of(c, trial.info.run_id, "train_loss") == [1, 2, 3, 4, 5, 6]
        assert steps_of(c, trial.info.run_id, "stsb_dev_spearman") == [2, 4, 6]


@pytest.mark.scenario
def test_sigterm_stops_a_train_run_on_ray_as_ctrl_c(repo, tiny_model, small_corpus, tmp_path, mlflow_uri):
    """SIGTERM (``ray job stop``, a batch scheduler) to ``train`` on Ray while it is held at step
    5: the run ends KILLED with exit 130, with its metrics up to its last checkpoint, and the best
    checkpoint the recorder decides from storage at the interrupted fit's end. (Ray Train
    continuing a run from storage: the sweeps' resumes.)"""
    from platform.checkpoint import exists as checkpoint_exists

    barrier, held = _held(tmp_path, step=5)
    args = ["simcse", *sets(model=tiny_model, corpus=small_corpus, batch_size=8, max_steps=8, eval_steps=2,
                            log_steps=1, num_workers=1, data_pipeline="local", final_eval="false",
                            output_dir=tmp_path / "runs", **held)]
    proc = start_cli("train", *args, env={"MLFLOW_TRACKING_URI": mlflow_uri}, cwd=repo)
    wait_for("the run to reach step 5", (barrier / "blocked").exists, proc=proc)
    wait_for("its checkpoint of step 4", lambda: _committed(tmp_path / "runs", 4), proc=proc)
    out, err = _stop(proc, signal.SIGTERM)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "interrupted" in err
    c, (run,) = runs_of(mlflow_uri)
    assert run.info.status == "KILLED" and run.data.tags["platform.end_reason"] == "interrupted"
    assert steps_of(c, run.info.run_id, "train_loss") == [1, 2, 3, 4]  # delivered with the checkpoint of step 4
    assert steps_of(c, run.info.run_id, "best_stsb_dev_spearman") == [2, 4]
    assert checkpoint_exists(run.data.tags["best_checkpoint"])


@pytest.mark.scenario
@pytest.mark.parametrize("minutes, resumed_at, line", [(0, 6, "resumed at step 6 "), (60, 0, "restarted at step 0: ")],
                         ids=["state-each-evaluation", "no-state-yet"])
def test_a_killed_train_run_resumes_from_its_latest_checkpoint(repo, tiny_model, small_corpus, tmp_path, mlflow_uri,
                                                               minutes, resumed_at, line):
    """SIGKILL to ``train`` in the process runtime while it is held at step 7: its run stays
    RUNNING (its driver is dead); ``--resume RUN`` (by name) continues it from the state of step 6
    (``latest``), or, with no state written yet (``checkpoint_minutes=60``: models
    only), from step 0, saying so, the dead attempt's checkpoints gone; either way no step is
    missing or twice, and the run ends FINISHED."""
    barrier, held = _held(tmp_path, step=7)
    args = ["simcse", *sets(model=tiny_model, corpus=small_corpus, batch_size=8, max_steps=10, eval_steps=3,
                            log_steps=1, runtime="process", num_workers=1, final_eval="false", checkpoint_minutes=minutes,
                            output_dir=tmp_path / "runs", **held)]
    env = {"MLFLOW_TRACKING_URI": mlflow_uri}
    proc = start_cli("train", *args, env=env, cwd=repo)
    wait_for("the run to reach step 7", (barrier / "blocked").exists, proc=proc)
    _stop(proc, signal.SIGKILL)
    c, (run,) = runs_of(mlflow_uri)
    assert run.info.status == "RUNNING"
    dead = {p.name: (p / "train_state.pt").is_file() for p in (tmp_path / "runs").rglob("checkpoint_0*")}
    assert dead and any(dead.values()) == (minutes == 0), dead
    release_barrier(barrier)

    proc = start_cli("train", *args, "--resume", run.info.run_name, env=env, cwd=repo)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    assert line in out, out
    c, runs = runs_of(mlflow_uri)
    assert [r.info.run_id for r in runs] == [run.info.run_id] and runs[0].info.status == "FINISHED"
    assert steps_of(c, run.info.run_id, "train_loss") == list(range(1, 11))
    assert steps_of(c, run.info.run_id, "stsb_dev_spearman") == [3, 6, 9, 10]
    assert steps_of(c, run.info.run_id, "resumed_at_step") == [resumed_at]
    left = {p.name for p in (tmp_path / "runs").rglob("checkpoint_0*")}
    assert runs[0].data.tags["best_checkpoint"].rsplit("/", 1)[1] in left
    if minutes:
        assert not left & set(dead), (left, dead)


@pytest.mark.e2e
def test_an_evaluation_is_in_mlflow_before_the_next_one_whatever_the_checkpoint_interval(tiny_model, small_corpus,
                                                                                        tmp_path, mlflow_uri):
    """The paper profile's 15 minutes between resumable states: a run's first STS-B dev point is in
    MLflow, alone, while the run trains towards its next evaluation (before: nothing until the
    first state, 15 minutes in, or the fit's end)."""
    args = ["simcse", *sets(model=tiny_model, corpus=small_corpus, batch_size=8, max_steps=100000, eval_steps=40,
                            log_steps=5, runtime="process", num_workers=1, checkpoint_minutes=15, final_eval="false",
                            output_dir=tmp_path / "runs")]
    proc = start_cli("train", *args, env={"MLFLOW_TRACKING_URI": mlflow_uri})
    try:
        def first_point():
            c, runs = runs_of(mlflow_uri)
            return runs and steps_of(c, runs[0].info.run_id, "stsb_dev_spearman")

        seen = wait_for("the first evaluation's point", first_point, timeout=240, proc=proc)
        assert len(seen) == 1 and proc.poll() is None, seen  # (the first: at eval_steps, or an epoch's end)
        c, (run,) = runs_of(mlflow_uri)
        assert steps_of(c, run.info.run_id, "train_loss")[:2] == [5, 10]  # the steps' points too
    finally:
        _stop(proc, signal.SIGTERM)


@pytest.mark.scenario
def test_a_killed_run_resumes_with_its_ingredients_state_and_the_same_losses(repo, tiny_model, small_corpus, tmp_path,
                                                                            mlflow_uri):
    """ESimCSE's queue and momentum copy are state across steps, saved with the model: a run
    SIGKILLed at step 7 and resumed from step 6's state trains steps 7-10 with the losses of a run
    never stopped (a queue restored empty, or a momentum copy restarted from the backbone, would
    change them: the queue's 24 rows are in every loss from step 2 on)."""
    barrier, held = _held(tmp_path, step=7)
    quiet = tmp_path / "quiet"  # a barrier never armed: the run that is not stopped
    quiet.mkdir()
    common = dict(model=tiny_model, corpus=small_corpus, batch_size=8, max_steps=10, eval_steps=3, log_steps=1,
                  runtime="process", num_workers=1, final_eval="false", checkpoint_minutes=0, queue_size=24,
                  aux="barrier", barrier_step=7)
    env = {"MLFLOW_TRACKING_URI": mlflow_uri}
    straight = start_cli("train", "esimcse", *sets(**common, barrier_dir=quiet, output_dir=tmp_path / "straight"),
                         env=env, cwd=repo)
    _, err = straight.communicate(timeout=600)
    assert straight.returncode == 0, err[-3000:]
    args = ["esimcse", *sets(**common, barrier_dir=barrier, output_dir=tmp_path / "runs")]
    proc = start_cli("train", *args, env=env, cwd=repo)
    wait_for("the run to reach step 7", (barrier / "blocked").exists, proc=proc)
    _stop(proc, signal.SIGKILL)
    release_barrier(barrier)
    c, runs = runs_of(mlflow_uri, "esimcse")
    (cut,) = [r for r in runs if r.info.status == "RUNNING"]
    proc = start_cli("train", *args, "--resume", cut.info.run_name, env=env, cwd=repo)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0 and "resumed at step 6 " in out, err[-3000:]
    c, runs = runs_of(mlflow_uri, "esimcse")
    (first,) = [r for r in runs if r.info.run_id != cut.info.run_id]

    def losses(run_id: str) -> dict[int, float]:
        return {m.step: m.value for m in c.get_metric_history(run_id, "train_loss")}

    want, got = losses(first.info.run_id), losses(cut.info.run_id)
    assert sorted(got) == sorted(want) == list(range(1, 11))
    assert [m.value for m in sorted(c.get_metric_history(cut.info.run_id, "momentum_queue_negatives"),
                                    key=lambda m: m.step)][:4] == [0.0, 8.0, 16.0, 24.0]
    for step in range(7, 11):
        assert got[step] == pytest.approx(want[step], rel=1e-5), (step, got, want)
