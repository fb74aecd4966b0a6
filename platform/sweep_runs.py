"""A sweep's MLflow runs and its state in storage: the parent run (started, or found again by
``--resume`` with the same identity), each trial's run (opened by the trial, written and ended by
one Tune callback on the driver from Tune's events: ``TrialRuns``, the ``MLflowLoggerCallback``
pattern), and the winner recorded on the parent at the end."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
import threading
import time
from typing import Any, Callable, Iterator

from platform import checkpoint, settings, storage, sweep_summary
from platform.config import TrainConfig
from platform.console import short
from platform.errors import UserError, one_line, stopping
from platform.run import ray_env, unit
from platform.checkpoint import exists as checkpoint_exists
from platform.run.fit import release
from platform.space import SearchSpace
from platform.tracking import recorder, store
from platform.tracking.names import (BEST, BEST_CHECKPOINT_TAG, DEV_METRIC, NOTE_TAG,
                                     PARENT_TAG, POINTS_RUN, PROGRESS_LINE, SEARCHED_TAG,
                                     SEEDS_TAG, STEP, STOPPED_BY_SCHEDULER_TAG, STORAGE_TAG, SWEEP_TAG, TRIAL_ID_TAG)
from platform.tracking.recorder import Run
from platform.tracking.writer import RunWriter, points_in

SWEEP_STATE = "platform_sweep.json"
NOTED = (DEV_METRIC, "train_loss")  # the keys of a trial's points its description counts


@dataclasses.dataclass
class Sweep:
    """What every trial gets (through the object store, once for all trials)."""

    base: TrainConfig
    sentences: list[str]
    uri: str
    parent: str  # the sweep's MLflow run
    folder: str  # the sweep's folder in output_dir's storage
    seeds: int = 1
    grid: str | None = None
    experiment: str | None = None  # MLflow's (default: the method's name)
    experiment_id: str = ""  # that experiment's id (asked of MLflow when empty)
    searched: tuple[str, ...] = ()  # the keys the space searches (each trial's description names their values)


def latest_sweep(root: str, method: str) -> tuple[str, dict] | None:
    """The newest sweep of ``method`` under ``output_dir`` (local or object storage) and its state."""
    for name in reversed(storage.list_dirs(root)):
        if name.startswith(f"{method}-sweep-"):
            text = storage.read_text(storage.join(root, name, SWEEP_STATE))
            if text is not None:
                return storage.join(root, name), json.loads(text)
    return None


def sweep_identity(base: TrainConfig, spec: SearchSpace, seeds: int, grid: str | None) -> dict[str, Any]:
    """What identifies a sweep: saved when it starts, compared by ``--resume``."""
    return {"config": base.flat(), "space": spec.as_params(), "num_samples": spec.num_samples, "seeds": seeds,
            "grid": grid}


def resumable_sweep(uri: str, base: TrainConfig, identity: dict[str, Any], folder: str | None = None) -> tuple[str, dict]:
    """The sweep ``--resume`` continues (``folder``, else the method's newest under output_dir), once
    it is known to have this identity and no live driver."""
    if folder is not None:
        text = storage.read_text(storage.join(folder, SWEEP_STATE))
        if text is None:
            raise UserError(f"--resume {folder}: no sweep there (no {SWEEP_STATE})")
        found = folder, json.loads(text)
    else:
        found = latest_sweep(base.output_dir, base.method)
    if found is None:
        raise UserError(f"--resume: no earlier {base.method} sweep under {base.output_dir}")
    folder, state = found
    changed = base.differences(state["config"])
    changed += [f"{key} ({state.get(key)} -> {value})" for key, value in identity.items()
                if key != "config" and json.dumps(state.get(key)) != json.dumps(value)]
    unit.check_same(f"the sweep in {folder}", changed, "--profile, --set, --space, --grid, --num-samples and --seeds")
    unit.check_stopped(f"the sweep in {folder}", store.client(uri).get_run(state["parent_run_id"]))
    return folder, state


def new_sweep(uri: str, base: TrainConfig, spec: SearchSpace, corpus, identity: dict[str, Any],
              experiment: str | None = None, extra_tags: dict[str, str] | None = None) -> tuple[Run, str]:
    """The sweep's parent run, and its state in output_dir's storage, beside Tune's own: --resume
    finds both there, also when the driver ran in a `ray job submit` working copy that is gone."""
    name = f"{base.method}-sweep-{time.strftime('%Y%m%d-%H%M%S')}"
    folder = storage.join(base.output_dir, name)
    seeds = identity["seeds"]
    tags = {**(extra_tags or {}), **unit.run_tags(base), SWEEP_TAG: "true", STORAGE_TAG: folder,
            **({SEEDS_TAG: str(seeds)} if seeds > 1 else {})}
    parent = Run.create(uri, experiment or base.method, name, tags)
    # The parent is not a trial: its params are the recipe and the space searched (the base
    # configuration is an artifact), the winner goes to its tags, description and best.* metrics.
    parent.log_params({"recipe": base.recipe.describe(), "profile": base.profile, **spec.as_params(),
                       **({"seeds": seeds} if seeds > 1 else {})})
    parent.log_dict(base.flat(), "sweep_config.json")
    parent.set_tags({SEARCHED_TAG: ",".join(spec.space)})
    parent.log_corpus(base.corpus, corpus.digest, corpus.num_sentences)
    store.save_runs_view(uri, parent.experiment_id, sweep_summary.view_key(parent.id), f"{name}: trials by {DEV_METRIC}",
                         f"tags.`{PARENT_TAG}` = '{parent.id}'", [base.param_key(k) for k in spec.space], BEST)
    state = {"parent_run_id": parent.id, "method": base.method, "expected_trials": spec.expected_trials(), **identity}
    storage.write_text(storage.join(folder, SWEEP_STATE), json.dumps(state, default=str))
    return parent, folder


# ------------------------------------------------------------------------------------------------
# The trials' runs: each opened by its trial, written and ended by the driver from Tune's events


def trial_runs(uri: str, parent: str, trial_id: str, where: str = "") -> list:
    """A trial's MLflow runs under the sweep's parent, newest first."""
    return store.child_runs(uri, parent, f"tags.{TRIAL_ID_TAG} = '{trial_id}'" + where, order_by=["attributes.start_time DESC"])


def open_trial_run(sweep: Sweep, trial_id: str, cfg: TrainConfig):
    """The trial's run, made by the trial itself as it starts (reopened when a resumed sweep runs
    the trial again), and the MLflow run found, if any; None for the run when it finished with its
    best checkpoint in storage (the trial reports its result again)."""
    found = trial_runs(sweep.uri, sweep.parent, trial_id)
    if found and found[0].info.status == "FINISHED" and checkpoint_exists(found[0].data.tags.get(BEST_CHECKPOINT_TAG)):
        return None, found[0]
    if found:
        return Run.reopen(sweep.uri, found[0].info.run_id, in_trial=True), found[0]
    run = Run.create(sweep.uri, sweep.experiment or cfg.method, f"trial-{trial_id}", {**unit.run_tags(cfg), TRIAL_ID_TAG: trial_id},
                     parent=Run(sweep.uri, sweep.parent, experiment_id=sweep.experiment_id), in_trial=True)
    return run, None


ACTIVE: list = []  # the sweep's TrialRuns in this driver (Tune restores its own copy on --resume)
OUTCOMES = {"TERMINATED": "completed", "STOPPED": "stopped", "ERROR": "failed"}  # a trial's saved state: its run's end


@contextlib.contextmanager
def sweep_closing(parent: Run, sweep: Sweep, states: Callable[[], dict[str, str]]) -> Iterator[None]:
    """The sweep's run, open while Tune runs its trials. Interrupted (Ctrl-C, SIGTERM), the trials'
    runs still open end first (``TrialRuns.close_open`` with Tune's saved ``states()``), then the
    sweep's: it stays among the runs this process works in until they have, so that the lost
    cluster's watch, ending the process meanwhile (Slurm's preemption takes Ray down as the command
    stops), ends them KILLED with it instead of leaving them RUNNING. A command stopped by SIGTERM
    whose cluster is going away then waits for that watch (``ray_env.await_loss``): a trial that
    opened its run as the signal came, after the close, ends KILLED too."""
    with parent.closing():
        try:
            yield
        except KeyboardInterrupt:
            (ACTIVE[0] if ACTIVE else TrialRuns(sweep)).close_open(states())
            if stopping():  # the cluster may be going down with the command: its watch ends what is left
                ray_env.await_loss()
            raise


class TrialRuns:
    """Every trial's own MLflow run, written and ended by the sweep's driver from Tune's events
    (the ``MLflowLoggerCallback`` pattern): the points of each result Tune hands over go to the
    run, and the run ends when Tune ends the trial: FINISHED when its work completed or the
    scheduler stopped it after a report, with its best checkpoint in storage, FAILED on an
    error, KILLED when the sweep was interrupted. Each trial has a ``RunWriter`` of its own, so
    that no callback waits on MLflow and a slow server delays no other trial; its run's end is
    queued behind its points: it is decided once they are in MLflow, from the checkpoints of the
    steps Tune received (a later one may still be uploading while Ray stops the trial). A FINISHED
    trial keeps its best checkpoint, without optimizer state, and nothing else.

    A trial that reports nothing for ``$PLATFORM_STALL_MINUTES`` (default 30) fails the sweep:
    one line names it, the driver's threads are dumped beside the sweep's state, the runs end
    FAILED, and ``--resume`` continues."""

    def __init__(self, sweep: Sweep):
        self.sweep = sweep
        self.stopped: set[str] = set()  # trials the scheduler stopped (their last result says done)
        self.last_step: dict[str, int] = {}  # each trial's last step Tune received
        self.run_of: dict[str, str] = {}  # each trial's run, as its results name it
        # The points its description counts (each trial's whole history: a restarted trial reports
        # its state's points again), sent by its writer: its run is described without reading them back.
        self.noted: dict[str, list] = {}
        self._start()

    def _start(self) -> None:
        self.writers: dict[str, RunWriter] = {}
        self.progress: dict[str, float] = {}  # running trials: when each last started or reported
        self._watching = False
        ACTIVE[:] = [self]

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k in ("sweep", "stopped", "last_step", "run_of", "noted")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Restored (Tune unpickles a resumed sweep's callbacks in the new driver): MLflow is reached
        where this driver reaches it, which may have moved since (a Slurm job requeued onto other
        nodes starts its server elsewhere; a replaced head)."""
        self.__dict__.update(state)
        self.sweep = dataclasses.replace(self.sweep, uri=store.tracking_uri())
        self._start()

    def writer(self, trial_id: str) -> RunWriter:
        if trial_id not in self.writers:
            self.writers[trial_id] = RunWriter(self.sweep.uri)
        return self.writers[trial_id]

    def received(self, trial_id: str, result: dict[str, Any]) -> None:
        """A result of the trial's: its line printed, its points queued for its run."""
        self.progress[trial_id] = time.monotonic()
        if result.get(PROGRESS_LINE):
            print(result[PROGRESS_LINE], flush=True)
        if result.get(POINTS_RUN):
            self.run_of[trial_id] = result[POINTS_RUN]
            points = points_in(result)
            self.writer(trial_id).log(result[POINTS_RUN], points)
            self.noted.setdefault(trial_id, []).extend(p for p in points if p[0] in NOTED)
        if STEP in result:
            self.last_step[trial_id] = int(result[STEP])
        if result.get("done"):  # the scheduler's decision: Tune marks the result it stops a trial on
            self.stopped.add(trial_id)

    def ended(self, trial_id: str, outcome: str | None = None, actor: str = "") -> None:
        """Tune ended the trial (Ray's ``actor``): its runs end once its points are sent, without
        waiting here; a stopped trial's once Ray has also ended the actor and then its fit's rank 0
        (they train on until then, and rank 0's pruning could empty the best named before)."""
        self.progress.pop(trial_id, None)
        outcome = outcome or ("stopped" if trial_id in self.stopped else "completed")
        up_to, fit = self.last_step.get(trial_id), storage.join(self.sweep.folder, "trials", trial_id)

        def end() -> None:
            if outcome == "stopped" and ray_env.await_actor_end(actor, ray_env.ACTOR_END_WAIT_S):
                ray_env.await_actor_end(checkpoint.pruner(fit), ray_env.ACTOR_END_WAIT_S)
            # A trial that fails while the command stops (SIGTERM) went with the stop (Slurm takes Ray down with it).
            self.close(trial_id, "interrupted" if outcome == "failed" and stopping() else outcome, up_to, say=True)

        self.writer(trial_id).call(end, f"ending trial {trial_id}'s run")

    def flush(self, seconds: float) -> bool:
        """Wait, at most ``seconds`` in all, until every trial's points are sent and its end done."""
        deadline = time.monotonic() + seconds
        return all([w.flush(max(0.0, deadline - time.monotonic())) for w in list(self.writers.values())])

    def close(self, trial_id: str, outcome: str, up_to: int | None = None, say: bool = False) -> bool:
        """End the still-open runs of a trial (and of its seeds) with ``outcome`` (``completed``,
        ``stopped`` by the scheduler, ``failed``, ``interrupted``), each with its best checkpoint
        of the steps up to ``up_to`` in storage, the trial's described; ``say``: its line printed.
        Whether it had an open run."""
        sweep = self.sweep
        known = self.run_of.get(trial_id)
        found = [store.client(sweep.uri).get_run(known)] if known else trial_runs(sweep.uri, sweep.parent, trial_id)
        found = [r for r in found if r.info.status == "RUNNING"]
        for trial in found:
            seeds = store.child_runs(sweep.uri, trial.info.run_id, "attributes.status = 'RUNNING'") if sweep.seeds > 1 else []
            for r in [*seeds, trial]:
                fit_folder = storage.join(sweep.folder, "trials", trial_id if r is trial else r.info.run_name)
                tags = {STOPPED_BY_SCHEDULER_TAG: "true"} if outcome == "stopped" else {}
                if r is trial and sweep.seeds > 1:  # named by the trial: its seeds' best
                    best = r.data.tags.get(BEST_CHECKPOINT_TAG)
                else:
                    named = checkpoint.best_under(fit_folder, up_to if r is trial else None)
                    best = named.checkpoint if named else None
                    tags.update(recorder.best_tags(best))
                status = recorder.closing_status(outcome, best)[0]
                if r is trial:  # described as it ends, in one request with its end's tags
                    tags.update(self.note(r, status, outcome == "stopped", self.noted.get(trial_id) if known else None))
                Run(sweep.uri, r.info.run_id).end(outcome, best, tags=tags)
                if status == "FINISHED" and best and not (r is trial and sweep.seeds > 1):  # a fit: never trained again
                    release(best)
            if say:
                early = " (stopped early by the scheduler)" if outcome == "stopped" and status == "FINISHED" else ""
                dev = trial.data.metrics.get(BEST)
                print(f"[trial {trial_id}] {status}{early}" + (f", best {DEV_METRIC} {dev:.2f}" if dev is not None else ""),
                      flush=True)
        return bool(found)

    def note(self, run, status: str, stopped: bool, points: list | None) -> dict[str, str]:
        """The trial's description as it ends with ``status``, from ``points`` (default: what its
        run holds; a tracking outage: none)."""
        try:
            return {NOTE_TAG: sweep_summary.trial_note(self.sweep.uri, run, self.sweep.searched, status, stopped, points)}
        except Exception as exc:  # noqa: BLE001 - a description never fails the sweep it describes
            print(f"note: trial run {run.info.run_id} was not described ({one_line(exc, 160)})", flush=True)
            return {}

    def close_open(self, states: dict[str, str]) -> None:
        """After the driver stopped (Ctrl-C, SIGTERM) or died (closed by ``--resume``): each trial
        run still open ends as Tune's saved state has its trial (``OUTCOMES``), else interrupted
        (KILLED; ``--resume`` runs the trial again in the same run)."""
        self.flush(settings.number(settings.TRACKING_WAIT))
        for found in store.child_runs(self.sweep.uri, self.sweep.parent, "attributes.status = 'RUNNING'"):
            trial_id = found.data.tags.get(TRIAL_ID_TAG, "")
            self.close(trial_id, OUTCOMES.get(states.get(trial_id, ""), "interrupted"))

    def watch(self) -> None:
        """Fail the sweep when a running trial reports nothing for ``$PLATFORM_STALL_MINUTES``."""
        if self._watching:
            return
        self._watching = True
        limit = settings.number(settings.STALL_MINUTES) * 60

        def check() -> None:
            while True:
                time.sleep(min(limit / 10, 30.0))
                now = time.monotonic()
                for trial_id, since in list(self.progress.items()):
                    if now - since >= limit:
                        stalled(self.sweep, trial_id, limit / 60)

        threading.Thread(target=check, name="sweep-stall-watch", daemon=True).start()

    def callback(self):
        """The Tune callback: every call returns at once (MLflow's work is the trials' writers')."""
        from ray import tune

        runs = self

        class Callback(tune.Callback):
            def on_trial_start(self, iteration, trials, trial, **info):
                runs.progress[trial.trial_id] = time.monotonic()
                runs.watch()
                values = ", ".join(f"{k}={short(v)}" for k, v in (trial.config or {}).items())
                print(f"[trial {trial.trial_id}] started: {values}", flush=True)

            def on_trial_result(self, iteration, trials, trial, result, **info):
                runs.received(trial.trial_id, result)

            def on_trial_complete(self, iteration, trials, trial, **info):
                runs.ended(trial.trial_id, actor=ray_env.actor_id(trial.temporary_state.ray_actor))

            def on_trial_error(self, iteration, trials, trial, **info):
                runs.ended(trial.trial_id, "failed")

            def on_experiment_end(self, trials, **info):  # the trials' runs ended before the sweep's end
                if not runs.flush(settings.number(settings.TRACKING_WAIT)):
                    print(f"note: MLflow at {store.redact(runs.sweep.uri)} did not take every trial's points and end; "
                          "--resume of the sweep closes the runs left open", file=sys.stderr, flush=True)

        return Callback()


def stalled(sweep: Sweep, trial_id: str, minutes: float) -> None:
    """The end of a sweep whose trial ``trial_id`` reported nothing for ``minutes``: the driver's
    threads dumped (where it waits) beside the sweep's state, the runs ended FAILED, one line."""
    import faulthandler
    import tempfile

    where = storage.join(sweep.folder, "stalled-driver-threads.txt")
    local = where if not storage.is_uri(where) else os.path.join(tempfile.gettempdir(), "stalled-driver-threads.txt")
    with contextlib.suppress(OSError), open(local, "w", encoding="utf-8") as out:
        faulthandler.dump_traceback(out, all_threads=True)
    reason = f"trial {trial_id} reported nothing for {minutes:g} min"
    with contextlib.suppress(Exception):
        recorder.abandon_open_runs(reason)
    print(f"error: {reason} ({settings.STALL_MINUTES}; the driver's threads are in {local}); the sweep stopped: "
          f"continue it with: python -m platform.tune {sweep.base.method} --resume (and the same arguments)",
          file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(2)
