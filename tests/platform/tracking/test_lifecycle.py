"""A run's MLflow life against a real store: the status each ending earns, the sweep's closing of
the runs Tune ended or a dead driver left open, the ranking of trials, the one writer of a run's
points, and ``--resume`` refusing what it cannot continue. (The same, end to end with
real signals and real Ray: tests/platform/run/test_interrupts.py and tests/platform/cluster/test_multinode.py.)"""

from __future__ import annotations

import json

import pytest

from platform.tracking.names import BEST
from platform.tracking.recorder import Run, closing_status
from tests.helpers import assert_user_error, sets


def _checkpoint(folder, dev: float | None = None, step: int = 1):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "state.json").write_text(json.dumps({} if dev is None else {"step": step, "stsb_dev_spearman": dev}))
    return str(folder)


def _sweep(uri: str, parent: Run, folder, seeds: int = 1):
    from platform.sweep_runs import Sweep, TrialRuns

    return TrialRuns(Sweep(base=None, sentences=[], uri=uri, parent=parent.id, folder=str(folder), seeds=seeds))


def _status(run: Run) -> str:
    return run.info().info.status


@pytest.mark.parametrize("outcome,exists,status", [
    ("completed", True, "FINISHED"), ("completed", False, "FAILED"), ("stopped", True, "FINISHED"),
    ("stopped", False, "KILLED"), ("interrupted", True, "KILLED"), ("failed", True, "FAILED")])
def test_each_ending_earns_its_status(outcome, exists, status, tmp_path):
    checkpoint = _checkpoint(tmp_path / "ckpt") if exists else str(tmp_path / "never-written")
    assert closing_status(outcome, checkpoint)[0] == status


def test_a_run_ends_with_what_happened_inside_it(mlflow_uri, tmp_path):
    done = Run.create(mlflow_uri, "simcse", "done", {})
    with done.closing():
        done.complete(_checkpoint(tmp_path / "a"))
    assert _status(done) == "FINISHED"

    lost = Run.create(mlflow_uri, "simcse", "lost", {})
    with lost.closing():  # completed, but names a checkpoint that is not in storage
        lost.complete(str(tmp_path / "gone"))
    assert _status(lost) == "FAILED" and "not in storage" in lost.info().data.tags["platform.end_reason"]

    never = Run.create(mlflow_uri, "simcse", "never", {})
    with never.closing():  # returned without completing
        pass
    assert _status(never) == "FAILED"

    for exc, status in ((KeyboardInterrupt(), "KILLED"), (RuntimeError("boom"), "FAILED")):
        run = Run.create(mlflow_uri, "simcse", status, {})
        with pytest.raises(type(exc)), run.closing():
            raise exc
        assert _status(run) == status

    report = Run.create(mlflow_uri, "reports", "report", {})
    with report.closing():
        report.complete(None, needs_checkpoint=False)
    assert _status(report) == "FINISHED"


def test_the_sweep_closes_what_tune_ended_and_what_a_dead_driver_left_open(mlflow_uri, tmp_path):
    """Each open trial run ends as Tune's saved state has its trial (terminated at its last step,
    stopped before it, errored, still running), its seeds' runs with it, its best checkpoint
    decided from storage; runs already ended are left as they are. Only FINISHED trials whose
    best checkpoint exists in storage are ranked."""
    from platform.tracking import recorder
    from platform.sweep_summary import ranked_trials

    parent = Run.create(mlflow_uri, "una", "sweep", {"sweep": "true"})
    trials = _sweep(mlflow_uri, parent, tmp_path / "sweep")
    states = {"stopped": "STOPPED", "no-ckpt": "STOPPED", "errored": "ERROR", "cut": "RUNNING",
              "done": "TERMINATED", "lost": "TERMINATED"}
    devs = {"stopped": 80.0, "no-ckpt": 95.0, "errored": 90.0, "cut": 99.0, "done": 70.0, "lost": 97.0}
    runs = {}
    for trial, dev in devs.items():
        run = runs[trial] = Run.create(mlflow_uri, "una", trial, {"trial_id": trial}, parent=parent, in_trial=True)
        recorder.log_results(run, {BEST: dev})
        if trial != "no-ckpt":
            _checkpoint(tmp_path / "sweep" / "trials" / trial / "checkpoint_000001", dev)
    lost = str(tmp_path / "sweep" / "trials" / "lost" / "checkpoint_000001")
    runs["lost"].end("completed", lost)
    (tmp_path / "sweep" / "trials" / "lost" / "checkpoint_000001" / "state.json").unlink()  # finished; gone since

    trials.close_open(states)
    status = {t: _status(r) for t, r in runs.items()}
    assert status == {"stopped": "FINISHED", "no-ckpt": "KILLED", "errored": "FAILED", "cut": "KILLED",
                      "done": "FINISHED", "lost": "FINISHED"}
    assert runs["stopped"].info().data.tags["stopped_by_scheduler"] == "true"
    done = runs["done"].info().data.tags
    assert "stopped_by_scheduler" not in done and done["best_checkpoint"].endswith("done/checkpoint_000001")
    ranked = ranked_trials(mlflow_uri, parent.id, "stsb_dev_spearman", "max")
    assert [r.info.run_name for r in ranked] == ["stopped", "done"]

    seeded = Run.create(mlflow_uri, "una", "sweep-seeds", {"sweep": "true"})  # a sweep of 2 seeds a trial
    cut = Run.create(mlflow_uri, "una", "cut", {"trial_id": "cut"}, parent=seeded, in_trial=True)
    seed = Run.create(mlflow_uri, "una", "cut-seed42", {"seed": "42"}, parent=cut)
    _sweep(mlflow_uri, seeded, tmp_path / "seeded", seeds=2).close_open({"cut": "RUNNING"})
    assert (_status(cut), _status(seed)) == ("KILLED", "KILLED")


@pytest.mark.parametrize("stopping", [False, True], ids=["lost", "stopping"])
def test_what_the_ray_clusters_loss_ends_is_failed_unless_the_command_was_stopping(stopping, mlflow_uri, tmp_path,
                                                                                    monkeypatch):
    """The cluster gone under a command (``ray_env.cluster_lost``): its runs, their open children
    and a run an error ended before end FAILED. A command that was told to stop (SIGTERM) as the
    cluster went (Slurm's preemption takes both down) ends them KILLED, to be resumed; so does a
    trial that fails meanwhile in a sweep."""
    from platform import errors
    from platform.tracking import recorder

    monkeypatch.setattr(errors, "_terminating", [15] if stopping else [])
    monkeypatch.setattr(recorder, "OPEN", {})
    monkeypatch.setattr(recorder, "FAILED_HERE", {})
    expected = "KILLED" if stopping else "FAILED"
    parent = Run.create(mlflow_uri, "una", "sweep", {"sweep": "true"})
    child = Run.create(mlflow_uri, "una", "trial", {"trial_id": "t"}, parent=parent, in_trial=True)
    erred = Run.create(mlflow_uri, "una", "erred", {})
    with pytest.raises(RuntimeError), erred.closing():
        raise RuntimeError("the GCS stopped answering")
    recorder.OPEN[parent.id] = parent
    ended = recorder.abandon_open_runs("the Ray cluster went away", "interrupted" if errors.stopping() else "failed")
    assert sorted(ended) == ["erred", "sweep", "trial"]
    assert {_status(r) for r in (parent, child, erred)} == {expected}

    trials = _sweep(mlflow_uri, parent, tmp_path / "sweep")
    failing = Run.create(mlflow_uri, "una", "failing", {"trial_id": "f"}, parent=parent, in_trial=True)
    trials.ended("f", "failed")
    assert trials.flush(30) and _status(failing) == expected


def test_an_interrupted_sweep_stays_open_until_its_trials_end_for_the_lost_clusters_watch(mlflow_uri, tmp_path,
                                                                                             monkeypatch):
    """Slurm's preemption stops the command and takes Ray down with it: the lost cluster's watch may
    end the process while the interrupted sweep closes its trials' runs. The sweep's run is still
    among those the process works in then, so the watch ends its open trials KILLED, not leaving
    them RUNNING."""
    from platform import errors, sweep_runs
    from platform.tracking import recorder

    monkeypatch.setattr(errors, "_terminating", [15])
    monkeypatch.setattr(recorder, "OPEN", {})
    monkeypatch.setattr(recorder, "FAILED_HERE", {})
    parent = Run.create(mlflow_uri, "una", "sweep", {"sweep": "true"})
    trials = _sweep(mlflow_uri, parent, tmp_path / "sweep")
    cut = Run.create(mlflow_uri, "una", "trial-cut", {"trial_id": "cut"}, parent=parent, in_trial=True)
    watched = []

    def cluster_lost_meanwhile(seconds):  # as ray_env.cluster_lost does, before its os._exit(130)
        watched.extend(recorder.abandon_open_runs("the Ray cluster went away", "interrupted"))
        raise SystemExit(130)

    monkeypatch.setattr(trials, "flush", cluster_lost_meanwhile)
    with pytest.raises(SystemExit), sweep_runs.sweep_closing(parent, trials.sweep, lambda: {"cut": "RUNNING"}):
        raise KeyboardInterrupt
    assert sorted(watched) == ["sweep", "trial-cut"]
    assert (_status(parent), _status(cut)) == ("KILLED", "KILLED")


def test_a_trial_that_opens_its_run_after_the_interrupted_sweep_closed_them_ends_killed(mlflow_uri, tmp_path,
                                                                                         monkeypatch):
    """Stopped by SIGTERM, the sweep closes its open trials' runs; a trial process the preemption
    has not ended yet opens its run after that. The sweep waits, still among the runs the process
    works in, for the lost cluster's watch, which ends that run KILLED too."""
    from platform import errors, sweep_runs
    from platform.run import ray_env
    from platform.tracking import recorder

    monkeypatch.setattr(errors, "_terminating", [15])
    monkeypatch.setattr(recorder, "OPEN", {})
    monkeypatch.setattr(recorder, "FAILED_HERE", {})
    parent = Run.create(mlflow_uri, "una", "sweep", {"sweep": "true"})
    trials = _sweep(mlflow_uri, parent, tmp_path / "sweep")
    closed = trials.close_open
    late = []

    def then_a_trial_opens_its_run(states):
        closed(states)
        late.append(Run.create(mlflow_uri, "una", "trial-late", {"trial_id": "late"}, parent=parent, in_trial=True))

    def the_watch_fires(seconds=None, gcs_address=None):  # as ray_env.cluster_lost does, before its os._exit(130)
        recorder.abandon_open_runs("the Ray cluster went away", "interrupted")
        raise SystemExit(130)

    monkeypatch.setattr(trials, "close_open", then_a_trial_opens_its_run)
    monkeypatch.setattr(ray_env, "await_loss", the_watch_fires)
    with pytest.raises(SystemExit), sweep_runs.sweep_closing(parent, trials.sweep, lambda: {}):
        raise KeyboardInterrupt
    assert (_status(parent), _status(late[0])) == ("KILLED", "KILLED")


def test_a_stopping_command_waits_for_its_cluster_only_while_it_is_going_away():
    """``await_loss`` returns at once while the GCS answers (a Ctrl-C that leaves the cluster up)
    and waits out its bound while it does not (the watch ends the process meanwhile)."""
    import socket
    import time

    from platform.run import ray_env

    with socket.socket() as up:
        up.bind(("127.0.0.1", 0))
        up.listen()
        started = time.monotonic()
        assert ray_env.await_loss(5.0, f"127.0.0.1:{up.getsockname()[1]}") is True
        assert time.monotonic() - started < 1.0
        gone = up.getsockname()[1]
    started = time.monotonic()
    assert ray_env.await_loss(1.0, f"127.0.0.1:{gone}") is False
    assert time.monotonic() - started >= 1.0
    assert ray_env.await_loss(1.0, "") is True  # no cluster: nothing to wait for


def test_a_stopped_trial_ends_from_the_best_checkpoint_in_storage_when_its_tag_is_stale(mlflow_uri, tmp_path):
    """ASHA stopped the trial just after its step-16 checkpoint, a new best, was persisted: the tag
    naming it had not reached MLflow, and Ray had removed the step-8 checkpoint the tag still named
    (seen on the main job: the run ended KILLED). It ends FINISHED from the checkpoint in storage,
    kept without optimizer state; a checkpoint after the last step Tune received (its upload cut
    short as Ray stopped the trial) is not named."""
    parent = Run.create(mlflow_uri, "una", "sweep", {"sweep": "true"})
    trial = Run.create(mlflow_uri, "una", "trial-t1", {"trial_id": "t1"}, parent=parent, in_trial=True)
    fit = tmp_path / "sweep" / "trials" / "t1"
    trial.set_tags({"best_checkpoint": str(fit / "checkpoint_step8")})  # removed by Ray since
    newest = fit / "checkpoint_step16"
    _checkpoint(newest, 83.53, 16)
    (newest / "metrics.json").write_text(json.dumps([["stsb_dev_spearman", 83.53, 1, 16]]))
    (newest / "train_state.pt").write_bytes(b"optimizer state")
    _checkpoint(fit / "checkpoint_step24", 90.0, 24)  # still uploading: Tune never received step 24

    _sweep(mlflow_uri, parent, tmp_path / "sweep").close("t1", "stopped", up_to=16)
    info = trial.info()
    assert info.info.status == "FINISHED" and info.data.tags["best_checkpoint"] == str(newest)
    assert info.data.tags["stopped_by_scheduler"] == "true"
    assert not (newest / "train_state.pt").exists() and (newest / "state.json").is_file()
    assert not (fit / "checkpoint_step24").exists()  # a finished trial keeps its best checkpoint only


def test_a_writer_sends_each_step_once_and_in_order_whatever_is_sent_again(mlflow_uri):
    """The run's writer sends what a report carries, in order, from its own thread. A restart
    (Ray Train's, in this process) reports the points of its state checkpoint again, then re-runs
    step 3, which the lost attempt had reported; ``--resume`` (a new writer, another process)
    replays them once more: each (key, step) reaches the run once, with the value sent first, and
    an end queued behind the points finds them all."""
    from platform.tracking.writer import RunWriter
    from platform.tracking.store import client

    run = Run.create(mlflow_uri, "simcse", "metrics", {})
    history = lambda: sorted((m.step, m.value) for m in client(mlflow_uri).get_metric_history(run.id, "train_loss"))  # noqa: E731
    writer = RunWriter(mlflow_uri)
    first = [("train_loss", float(step), 1000 + step, step) for step in (1, 2, 3)]
    writer.log(run.id, first)
    restarted = first[:2] + [("train_loss", 13.0, 2003, 3), ("train_loss", 14.0, 2004, 4)]  # (a real re-run repeats 3.0)
    writer.log(run.id, restarted)
    seen = []
    writer.call(lambda: seen.append(history()), "reading the run")
    assert writer.flush(60)
    assert seen == [[(1, 1.0), (2, 2.0), (3, 3.0), (4, 14.0)]]
    resumed = RunWriter(mlflow_uri)
    resumed.log(run.id, restarted + [("train_loss", 5.0, 3005, 5)])
    assert resumed.flush(60)
    assert history() == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 14.0), (5, 5.0)]


def test_a_report_waits_on_no_tracking_server(tmp_path):
    """A server that takes seconds to answer (or none) costs the report nothing: the writer takes
    the points at once and holds them."""
    import socket
    import time

    from platform.tracking.writer import RunWriter

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)  # accepts, never answers
    try:
        writer = RunWriter(f"http://127.0.0.1:{silent.getsockname()[1]}")
        started = time.perf_counter()
        for step in range(1, 51):
            writer.log("0" * 32, [("train_loss", 1.0, 0, step), ("lr", 1e-5, 0, step)])
        assert time.perf_counter() - started < 0.5
        assert not writer.close(0.5)  # what it held dropped (the checkpoints keep it), its thread ended
    finally:
        silent.close()


def test_the_best_checkpoint_is_the_first_to_reach_the_best_score(tmp_path):
    """Decided from storage, directly against the checkpoints' states: the highest STS-B dev, the
    earliest step on a tie; a folder without a state is not a checkpoint."""
    from platform.checkpoint import best_under

    for name, dev, step in (("checkpoint_a", 70.0, 8), ("checkpoint_b", 81.5, 16), ("checkpoint_c", 81.5, 24),
                            ("checkpoint_d", 60.0, 32)):
        _checkpoint(tmp_path / name, dev, step)
    (tmp_path / "checkpoint_e").mkdir()  # an upload cut short: no state
    assert best_under(str(tmp_path)) == (str(tmp_path / "checkpoint_b"), 81.5)
    assert best_under(str(tmp_path / "nothing-here")) is None


def _saved_run(uri: str, output_dir, config: dict, status: str = "KILLED") -> Run:
    from platform.run import unit
    from platform.tracking.names import STORAGE_TAG

    run = Run.create(uri, "simcse", "simcse-20260101-000000", {STORAGE_TAG: str(output_dir / "simcse-20260101-000000")})
    unit.save_state(str(output_dir / "simcse-20260101-000000"), {"run_id": run.id, "config": config, "seeds": 1})
    run.end({"KILLED": "interrupted", "FINISHED": "completed"}[status], _checkpoint(output_dir / "ckpt"))
    return run


def _resolved(tiny_model, small_corpus, output_dir, **extra):
    from platform.config import TrainConfig
    from platform import storage

    cfg = TrainConfig.build("simcse", "local", {"model": str(tiny_model), "corpus": str(small_corpus),
                                                "output_dir": str(output_dir), **extra})
    cfg.output_dir = storage.check_writable(cfg.output_dir)
    return cfg


def test_train_resume_refuses_a_changed_configuration_naming_the_keys(tiny_model, small_corpus, tmp_path, mlflow_uri,
                                                                      cli):
    out = tmp_path / "runs"
    cfg = _resolved(tiny_model, small_corpus, out)
    run = _saved_run(mlflow_uri, out, cfg.flat())
    env = {"MLFLOW_TRACKING_URI": mlflow_uri}
    base = sets(model=tiny_model, corpus=small_corpus, output_dir=out)
    proc = cli("train", "simcse", *base, "--set", "lr=1e-4", "--set", "temperature=0.1", "--resume", run.info().info.run_name,
               env=env)
    assert_user_error(proc, "was started with another configuration", "lr (3e-05 -> 0.0001)", "temperature (0.05 -> 0.1)")
    assert_user_error(cli("train", "simcse", *base, "--seeds", "2", "--resume", run.id, env=env), "seeds (1 -> 2)")
    assert_user_error(cli("train", "simcse", *base, "--resume", "nosuchrun", env=env), "no run named or numbered 'nosuchrun'")
    assert _status(run) == "KILLED"  # nothing was reopened

    finished = _saved_run(mlflow_uri, tmp_path / "other", cfg.flat(), status="FINISHED")
    assert_user_error(cli("train", "simcse", *base, "--resume", finished.id, env=env), "finished; there is nothing to resume")


def test_tune_resume_refuses_a_changed_configuration_and_a_live_driver(tiny_model, small_corpus, tmp_path, mlflow_uri,
                                                                       cli):
    from platform.space import load_space
    from platform.sweep_runs import SWEEP_STATE, sweep_identity

    out = tmp_path / "runs"
    cfg = _resolved(tiny_model, small_corpus, out)
    identity = sweep_identity(cfg, load_space(cfg), 1, None)
    parent = Run.create(mlflow_uri, "simcse", "simcse-sweep-20260101-000000", {"sweep": "true"})
    folder = out / "simcse-sweep-20260101-000000"
    folder.mkdir(parents=True)
    (folder / SWEEP_STATE).write_text(json.dumps({"parent_run_id": parent.id, "expected_trials": 4, **identity}))
    env = {"MLFLOW_TRACKING_URI": mlflow_uri}
    base = sets(model=tiny_model, corpus=small_corpus, output_dir=out)
    assert_user_error(cli("tune", "simcse", *base, "--set", "batch_size=16", "--resume", env=env),
                      "was started with another configuration", "batch_size (32 -> 16)")
    assert_user_error(cli("tune", "simcse", *base, "--num-samples", "7", "--resume", env=env), "num_samples (4 -> 7)")
    # The parent run is RUNNING and names this (live) process as its driver.
    assert_user_error(cli("tune", "simcse", *base, "--resume", env=env), "is still running", "stop it first")


def test_a_trial_the_scheduler_stops_between_states_keeps_every_evaluation_it_reported(mlflow_uri, tmp_path):
    """The paper profile's 15 minutes between resumable states: ASHA stops the trial on its
    evaluation of step 24 (Tune marks that result done); its last state is step 8's. Every result
    Tune handed over carried its points, which the driver's writer sends: the run holds every
    evaluation once, and is ended and described behind them, at once for Tune."""
    import time

    from platform.tracking.names import DEV_METRIC
    from platform.tracking.store import client

    parent = Run.create(mlflow_uri, "una", "sweep", {"sweep": "true"})
    trial = Run.create(mlflow_uri, "una", "trial-t1", {"trial_id": "t1"}, parent=parent, in_trial=True)
    fit = tmp_path / "sweep" / "trials" / "t1"
    _checkpoint(fit / "checkpoint_step8", 80.0, 8)
    _checkpoint(fit / "checkpoint_step16", 82.0, 16)
    runs = _sweep(mlflow_uri, parent, tmp_path / "sweep")
    for step, dev, best in ((8, 80.0, 80.0), (16, 82.0, 82.0), (24, 81.0, 82.0)):
        points = [[DEV_METRIC, dev, 1000 * step, step], [BEST, best, 1000 * step, step],
                  ["train_loss_avg", 1.0 / step, 1000 * step, step]]
        runs.received("t1", {"step": step, DEV_METRIC: dev, BEST: best, "points": json.dumps(points),
                             "points_run": trial.id, "done": step == 24})
    started = time.perf_counter()
    runs.ended("t1")
    assert time.perf_counter() - started < 0.1  # Tune's driver loop goes on
    assert runs.flush(60)
    c = client(mlflow_uri)
    history = {k: [(m.step, m.value) for m in sorted(c.get_metric_history(trial.id, k), key=lambda m: m.step)]
               for k in (DEV_METRIC, BEST, "train_loss_avg")}
    assert history[DEV_METRIC] == [(8, 80.0), (16, 82.0), (24, 81.0)]
    assert history[BEST] == [(8, 80.0), (16, 82.0), (24, 82.0)]
    assert [s for s, _ in history["train_loss_avg"]] == [8, 16, 24]
    info = trial.info()
    assert info.info.status == "FINISHED" and info.data.tags["best_checkpoint"] == str(fit / "checkpoint_step16")
    # The run describes itself in MLflow's UI: its values, best score and step, its end.
    note = info.data.tags["mlflow.note.content"]
    assert "**Best STS-B dev** (Spearman x100): 82.00 at step 16, 3 evaluation(s)." in note
    assert "stopped early by the scheduler (ASHA)" in note


def test_a_stopped_trial_is_named_once_ray_has_ended_its_actor_and_the_rank_0_that_prunes_it(mlflow_uri, tmp_path):
    """ASHA stops a trial on its step-2 report; its actor and the fit's workers train on until Ray
    ends them, and rank 0 (the actor its fit's PRUNER names) may commit two better evaluations and
    empty the step-2 checkpoint. The driver ends the run only once Ray has ended both actors (real
    ones here, killed by the test), from what is then in storage: never FINISHED with a checkpoint
    emptied after it was named. A wait has a bound."""
    import time

    import ray

    from platform.checkpoint import name_pruner, prune
    from platform.run import ray_env

    @ray.remote(num_cpus=0)
    class Worker:
        def prune(self, folder: str, keep: list[str], up_to: int) -> None:  # rank 0's commit of a step
            prune(folder, set(keep), up_to=up_to)

        def id(self) -> str:
            return ray.get_runtime_context().get_actor_id()

    parent = Run.create(mlflow_uri, "una", "sweep", {"sweep": "true"})
    trial = Run.create(mlflow_uri, "una", "trial-t1", {"trial_id": "t1"}, parent=parent, in_trial=True)
    fit = tmp_path / "sweep" / "trials" / "t1"
    _checkpoint(fit / "checkpoint_00000002", 40.0, 2)
    ray_env.init_ray(num_cpus=2)
    try:
        trial_actor, rank0 = Worker.remote(), Worker.remote()
        name_pruner(str(fit), ray.get(rank0.id.remote()))
        started = time.monotonic()
        assert ray_env.await_actor_end(ray.get(trial_actor.id.remote()), 1.0) is False
        assert time.monotonic() - started >= 1.0 and ray_env.await_actor_end("", 1.0) is True
        runs = _sweep(mlflow_uri, parent, tmp_path / "sweep")
        runs.received("t1", {"step": 2, "done": True})
        runs.ended("t1", actor=ray_env.actor_id(trial_actor))
        time.sleep(3)
        assert _status(trial) == "RUNNING"  # its actors train on: nothing named yet
        for step in (4, 6):  # two better evaluations, each committed and pruned by rank 0
            _checkpoint(fit / f"checkpoint_{step:08d}", 40.0 + step, step)
            ray.get(rank0.prune.remote(str(fit), [f"checkpoint_{step:08d}"], step))
        ray.kill(trial_actor)
        time.sleep(2)
        assert _status(trial) == "RUNNING"  # rank 0 still trains on
        ray.kill(rank0)
        assert runs.flush(60)
    finally:
        ray.shutdown()
    info = trial.info()
    assert info.info.status == "KILLED" and "not in storage" in info.data.tags["platform.end_reason"], info.data.tags
    assert not (fit / "checkpoint_00000002" / "state.json").exists()
