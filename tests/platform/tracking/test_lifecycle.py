"""A run's MLflow life against a real store: the status each ending earns, the sweep's closing of
the runs Tune ended or a dead driver left open, the ranking of trials, metrics delivered with
their checkpoint, and ``--resume`` refusing what it cannot continue. (The same, end to end with
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


def _sweep(uri: str, parent: Run, folder):
    from platform.sweep_runs import Sweep, TrialRuns

    return TrialRuns(Sweep(base=None, sentences=[], uri=uri, parent=parent.id, folder=str(folder)))


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

    trial = Run.create(mlflow_uri, "simcse", "trial", {}, in_trial=True)
    with pytest.raises(RuntimeError), trial.closing():  # a trial's error is the sweep's callback to judge
        raise RuntimeError("stopped by Tune")
    assert _status(trial) == "RUNNING" and "platform.work_done" not in trial.info().data.tags
    with trial.closing():  # its work done: marked so, ended by the sweep's callback
        trial.complete(_checkpoint(tmp_path / "t"))
    assert _status(trial) == "RUNNING" and trial.info().data.tags["platform.work_done"] == "true"

    report = Run.create(mlflow_uri, "reports", "report", {})
    with report.closing():
        report.complete(None, needs_checkpoint=False)
    assert _status(report) == "FINISHED"


def test_the_sweep_closes_what_tune_ended_and_what_a_dead_driver_left_open(mlflow_uri, tmp_path):
    """Each open trial run ends as Tune's saved state has its trial (or FINISHED where its work
    marked itself done), its seeds' runs with it, its best checkpoint decided from storage; runs
    already ended are left as they are. Only FINISHED trials whose best checkpoint exists in
    storage are ranked."""
    from platform.tracking import recorder
    from platform.sweep_runs import ranked_trials

    parent = Run.create(mlflow_uri, "una", "sweep", {"sweep": "true"})
    trials = _sweep(mlflow_uri, parent, tmp_path / "sweep")
    states = {"stopped": "TERMINATED", "no-ckpt": "TERMINATED", "errored": "ERROR", "cut": "RUNNING",
              "done": "TERMINATED", "lost": "TERMINATED"}
    devs = {"stopped": 80.0, "no-ckpt": 95.0, "errored": 90.0, "cut": 99.0, "done": 70.0, "lost": 97.0}
    runs = {}
    for trial, dev in devs.items():
        run = runs[trial] = Run.create(mlflow_uri, "una", trial, {"trial_id": trial}, parent=parent, in_trial=True)
        recorder.log_results(run, {BEST: dev})
        if trial != "no-ckpt":
            _checkpoint(tmp_path / "sweep" / "trials" / trial / "checkpoint_000001", dev)
    seed = Run.create(mlflow_uri, "una", "cut-seed42", {"seed": "42"}, parent=runs["cut"], in_trial=True)
    with runs["done"].closing():
        runs["done"].complete(str(tmp_path / "sweep" / "trials" / "done" / "checkpoint_000001"))
    runs["done"].set_tags({"best_checkpoint": str(tmp_path / "sweep" / "trials" / "done" / "checkpoint_000001")})
    lost = str(tmp_path / "sweep" / "trials" / "lost" / "checkpoint_000001")
    runs["lost"].end("completed", lost)
    (tmp_path / "sweep" / "trials" / "lost" / "checkpoint_000001" / "state.json").unlink()  # finished; gone since

    trials.close_open(states)
    status = {t: _status(r) for t, r in runs.items()}
    assert status == {"stopped": "FINISHED", "no-ckpt": "KILLED", "errored": "FAILED", "cut": "KILLED",
                      "done": "FINISHED", "lost": "FINISHED"}
    assert _status(seed) == "KILLED"
    assert runs["stopped"].info().data.tags["stopped_by_scheduler"] == "true"
    assert "stopped_by_scheduler" not in runs["done"].info().data.tags
    ranked = ranked_trials(mlflow_uri, parent.id, "stsb_dev_spearman", "max")
    assert [r.info.run_name for r in ranked] == ["stopped", "done"]


def test_a_stopped_trial_ends_from_the_best_checkpoint_in_storage_when_its_tag_is_stale(mlflow_uri, tmp_path):
    """ASHA stopped the trial just after its step-16 checkpoint, a new best, was persisted: the tag
    naming it had not reached MLflow, and Ray had removed the step-8 checkpoint the tag still named
    (seen on the main job: the run ended KILLED). It ends FINISHED from the checkpoint in storage,
    kept without optimizer state, with the points kept in that checkpoint."""
    from platform.tracking.store import client

    parent = Run.create(mlflow_uri, "una", "sweep", {"sweep": "true"})
    trial = Run.create(mlflow_uri, "una", "trial-t1", {"trial_id": "t1"}, parent=parent, in_trial=True)
    fit = tmp_path / "sweep" / "trials" / "t1"
    trial.set_tags({"best_checkpoint": str(fit / "checkpoint_step8")})  # removed by Ray since
    newest = fit / "checkpoint_step16"
    _checkpoint(newest, 83.53, 16)
    (newest / "metrics.json").write_text(json.dumps([["stsb_dev_spearman", 83.53, 1, 16]]))
    (newest / "train_state.pt").write_bytes(b"optimizer state")

    _sweep(mlflow_uri, parent, tmp_path / "sweep").close("t1", "stopped")
    info = trial.info()
    assert info.info.status == "FINISHED" and info.data.tags["best_checkpoint"] == str(newest)
    assert info.data.tags["stopped_by_scheduler"] == "true"
    assert not (newest / "train_state.pt").exists() and (newest / "state.json").is_file()
    assert [(m.step, m.value) for m in client(mlflow_uri).get_metric_history(trial.id, "stsb_dev_spearman")] == [(16, 83.53)]


def test_points_go_out_as_they_are_logged_and_a_restart_keeps_each_step_once(mlflow_uri, tmp_path):
    """Each logged step reaches MLflow at once, from the background sender, not with the next
    persisted checkpoint (which a scheduler-stopped trial may never write). A
    worker restarted from the checkpoint of step 2 re-runs step 3, whose point the dead attempt
    had sent: the restart adopts that point from MLflow and drops the re-run's copy, and the fit's
    end replays its latest checkpoint's points: each step once, whatever was sent twice."""
    from platform.tracking.recorder import finish_fit
    from platform.tracking import recorder
    from platform.tracking.store import client

    run = Run.create(mlflow_uri, "simcse", "metrics", {})
    history = lambda: sorted((m.step, m.value) for m in client(mlflow_uri).get_metric_history(run.id, "train_loss"))  # noqa: E731
    log = recorder.StepLog(mlflow_uri, run.id)
    for step in (1, 2):
        log({"train_loss": float(step)}, step)
    at_step_2 = log.points()  # what the checkpoint of step 2 keeps
    log.persisted()
    log({"train_loss": 3.0}, 3)  # the attempt dies before its next checkpoint
    log._sender.shutdown(wait=True)
    assert history() == [(1, 1.0), (2, 2.0), (3, 3.0)]  # live: no checkpoint needed

    restarted = recorder.StepLog(mlflow_uri, run.id)
    restarted.restore(at_step_2 + [("train_loss", 3.0, 1, 3)], step=2)  # points after the checkpoint's step are not its
    for step in (3, 4):
        restarted({"train_loss": 10.0 + step}, step)  # (seeded, a real re-run repeats 3.0; the copy is told apart here)
    latest = tmp_path / "fit" / "checkpoint_000004"
    _checkpoint(latest, 50.0, 4)
    (latest / "metrics.json").write_text(json.dumps(restarted.points()))
    restarted.persisted()
    restarted._sender.shutdown(wait=True)
    # The fit's end: every point of its latest checkpoint again, the best named from storage.
    assert finish_fit(mlflow_uri, run.id, str(tmp_path / "fit"), 30) == (str(latest), 50.0)
    assert history() == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 14.0)]
    assert run.info().data.tags["best_checkpoint"] == str(latest)


def test_a_step_waits_on_no_tracking_server(tmp_path):
    """A server that takes seconds to answer (or none) costs the step nothing: logging returns at
    once, the points wait in the sender."""
    import socket
    import time

    from platform.tracking import recorder

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)  # accepts, never answers
    try:
        log = recorder.StepLog(f"http://127.0.0.1:{silent.getsockname()[1]}", "0" * 32)
        started = time.perf_counter()
        for step in range(1, 51):
            log({"train_loss": 1.0, "lr": 1e-5}, step)
        assert time.perf_counter() - started < 0.5
        assert len(log.points()) == 100 and not log.sent
    finally:
        # The listener closed, its waiting request is reset; the sender is waited for, so that no
        # import of its error path runs while the next test starts (pytest's warnings capture
        # iterates sys.modules: "dictionary changed size during iteration", seen on CI).
        silent.close()
        log._sender.shutdown(wait=True, cancel_futures=True)


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
    from platform.sweep_runs import SWEEP_STATE, sweep_state

    out = tmp_path / "runs"
    cfg = _resolved(tiny_model, small_corpus, out)
    identity = sweep_state(cfg, load_space(cfg), 1, None)
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


def test_a_trial_the_scheduler_stops_between_states_keeps_every_evaluation(mlflow_uri, tmp_path):
    """The paper profile's 15 minutes between resumable states: ASHA stops the
    trial after its evaluations of steps 8, 16 and 24, its last state is step 8's, and its worker
    was killed while step 24's points were queued. Tune's reports (the sweep callback's
    ``on_trial_result``) complete the run: every evaluation once, the values the worker sent kept."""
    from platform.tracking import recorder
    from platform.tracking.names import DEV_METRIC
    from platform.tracking.store import client

    parent = Run.create(mlflow_uri, "una", "sweep", {"sweep": "true"})
    trial = Run.create(mlflow_uri, "una", "trial-t1", {"trial_id": "t1"}, parent=parent, in_trial=True)
    fit = tmp_path / "sweep" / "trials" / "t1"
    state = fit / "checkpoint_step8"
    _checkpoint(state, 80.0, 8)
    kept = [[DEV_METRIC, 80.0, 1000, 8], [BEST, 80.0, 1000, 8]]  # the state holds what the worker sent
    (state / "metrics.json").write_text(json.dumps(kept))
    live = [tuple(p) for p in kept] + [(DEV_METRIC, 82.0, 2000, 16), (BEST, 82.0, 2000, 16)]
    recorder.replay(mlflow_uri, trial.id, live)  # sent live by the worker, step 24's never
    runs = _sweep(mlflow_uri, parent, tmp_path / "sweep")
    for step, dev, best in ((8, 80.0, 80.0), (16, 82.0, 82.0), (24, 81.0, 82.0)):
        runs.received("t1", {"step": step, DEV_METRIC: dev, BEST: best, "train_loss_avg": 1.0 / step, "epoch": 0})
    runs.received("t1", {"step": 30, "done": True})  # a report without an evaluation adds nothing
    runs.close("t1", "stopped")
    c = client(mlflow_uri)
    history = {k: [(m.step, m.value) for m in sorted(c.get_metric_history(trial.id, k), key=lambda m: m.step)]
               for k in (DEV_METRIC, BEST, "train_loss_avg")}
    assert history[DEV_METRIC] == [(8, 80.0), (16, 82.0), (24, 81.0)]
    assert history[BEST] == [(8, 80.0), (16, 82.0), (24, 82.0)]
    assert [s for s, _ in history["train_loss_avg"]] == [8, 16, 24]
    info = trial.info()
    assert info.info.status == "FINISHED"
    # (Item 7.) The run describes itself in MLflow's UI: its values, best score and step, its end.
    note = info.data.tags["mlflow.note.content"]
    assert "**Best STS-B dev** (Spearman x100): 82.00 at step 16, 3 evaluation(s)." in note
    assert "stopped early by the scheduler (ASHA)" in note


@pytest.mark.e2e
def test_a_trial_tune_ended_closes_once_the_process_sending_its_points_has_ended(mlflow_uri, tmp_path, monkeypatch):
    """Tune calls ``on_trial_complete`` before it stops the trial's actor, and ASHA's decision
    reaches the trial while it trains on: its rank 0 may evaluate and send once more (seen on CI:
    the description counted 2 evaluations, MLflow held 3). A Ray actor sends the run's points as
    rank 0 does, naming itself with its first points; the run stays open while the actor lives,
    and is closed, described with every evaluation, once Ray says it has ended. A sender that
    outlives ``SENDER_WAIT_S`` does not hold its run open."""
    import ray

    from platform import sweep_runs
    from platform.run.ray_env import init_ray
    from platform.tracking.names import DEV_METRIC, SENDER_TAG

    parent = Run.create(mlflow_uri, "una", "sweep", {"sweep": "true"})
    trials = {t: Run.create(mlflow_uri, "una", f"trial-{t}", {"trial_id": t}, parent=parent, in_trial=True)
              for t in ("t1", "t2")}
    for t in trials:
        _checkpoint(tmp_path / "sweep" / "trials" / t / "checkpoint_000001", 80.0, 2)

    init_ray(num_cpus=1)
    try:
        @ray.remote(num_cpus=0)
        class Rank0:
            def __init__(self, uri, run_id):
                import ray as ray_here

                from platform.tracking.names import SENDER_TAG as TAG
                from platform.tracking.recorder import StepLog

                self.log = StepLog(uri, run_id, tags={TAG: ray_here.get_runtime_context().get_actor_id()})

            def evaluate(self, step, dev):
                self.log({"stsb_dev_spearman": dev}, step)
                # The test's own synchronisation: a fresh actor's first send opens the SQLite store
                # (its schema check), which took over FLUSH_S on a loaded CI machine.
                return self.log.flush(timeout=60.0)

        senders = {t: Rank0.remote(mlflow_uri, run.id) for t, run in trials.items()}
        assert ray.get([senders[t].evaluate.remote(s, v) for t in trials for s, v in ((2, 80.0), (4, 82.0))]) == [True] * 4
        assert trials["t1"].info().data.tags[SENDER_TAG] == senders["t1"]._actor_id.hex()

        runs = _sweep(mlflow_uri, parent, tmp_path / "sweep")
        for t in trials:
            runs.ended(t)
        runs.settle()
        assert {t: _status(r) for t, r in trials.items()} == {"t1": "RUNNING", "t2": "RUNNING"}
        assert ray.get(senders["t1"].evaluate.remote(6, 83.0))  # after the scheduler's decision
        ray.kill(senders["t1"])
        monkeypatch.setattr(sweep_runs, "SENDER_WAIT_S", 3.0)
        runs.ended("t2")  # its sender never ends: closed after the wait
        runs.settle(wait=True)
        assert runs.ending == {}
        assert {t: _status(r) for t, r in trials.items()} == {"t1": "FINISHED", "t2": "FINISHED"}
        note = trials["t1"].info().data.tags["mlflow.note.content"]
        assert "83.00 at step 6, 3 evaluation(s)." in note and "stopped early by the scheduler" in note, note
        from platform.tracking.store import client

        assert [m.step for m in client(mlflow_uri).get_metric_history(trials["t1"].id, DEV_METRIC)] == [2, 4, 6]
    finally:
        ray.shutdown()
