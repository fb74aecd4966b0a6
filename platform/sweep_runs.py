"""A sweep's MLflow runs and its state in storage: the parent run (started, or found again by
``--resume`` with the same identity), each trial's run, opened and ended by one Tune callback from
Tune's trial events (``TrialRuns``, the ``MLflowLoggerCallback`` pattern), and the winner recorded
on the parent at the end."""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from typing import Any

from platform import checkpoint, cluster_aws, settings, storage, sweep_summary
from platform.config import TrainConfig
from platform.console import short
from platform.errors import UserError, one_line
from platform.run import final_evaluation, ray_env, unit
from platform.checkpoint import exists as checkpoint_exists
from platform.run.fit import FitResult, release
from platform.run.loop import total_steps
from platform.space import SearchSpace
from platform.tracking import recorder, store
from platform.data import STS_TASKS
from platform.tracking.names import (BEST, BEST_CHECKPOINT_TAG, BEST_PREFIX, BEST_RUN_ID_TAG, DEV_METRIC, NOTE_TAG,
                                     PARENT_TAG, REGISTERED_MODEL_TAG, SEARCHED_TAG, SEEDS_TAG, SENDER_TAG, STEP,
                                     STOPPED_BY_SCHEDULER_TAG, STORAGE_TAG, SWEEP_TAG, TRAIN_LOSS, TRIAL_ID_TAG, WINNER,
                                     WORK_DONE_TAG, sts, vs_backbone)
from platform.tracking.recorder import Run, TrackingUnavailable, winner_key

SWEEP_STATE = "platform_sweep.json"
POINTS_WAIT_S = 60.0  # how long closing a trial Tune ended waits for its points to reach MLflow
SENDER_WAIT_S = 60.0  # how long a trial Tune ended waits for the process sending its points to end
SENDER_CHECK_S = 0.5  # how often the sweep's driver asks Ray about those processes


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


def latest_sweep(root: str, method: str) -> tuple[str, dict] | None:
    """The newest sweep of ``method`` under ``output_dir`` (local or object storage) and its state."""
    for name in reversed(storage.list_dirs(root)):
        if name.startswith(f"{method}-sweep-"):
            text = storage.read_text(storage.join(root, name, SWEEP_STATE))
            if text is not None:
                return storage.join(root, name), json.loads(text)
    return None


def sweep_state(base: TrainConfig, spec: SearchSpace, seeds: int, grid: str | None) -> dict[str, Any]:
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
# The trials' runs: opened and ended by the driver, from Tune's trial events


def trial_runs(uri: str, parent: str, trial_id: str, where: str = "") -> list:
    """A trial's MLflow runs under the sweep's parent, newest first."""
    return store.child_runs(uri, parent, f"tags.{TRIAL_ID_TAG} = '{trial_id}'" + where, order_by=["attributes.start_time DESC"])


class TrialRuns:
    """Every trial's MLflow run, from Tune's own events (the ``MLflowLoggerCallback`` pattern):
    opened when Tune starts the trial (reopened when a resumed sweep runs it again), ended when
    Tune ends it: FINISHED when its work completed or the scheduler stopped it after a report with
    its best checkpoint in storage, FAILED on an error, KILLED when the sweep was interrupted.
    Before a run ends, the recorder completes its step metrics and names its best checkpoint from
    storage (``recorder.finish_fit``); a FINISHED trial keeps its best checkpoint, without
    optimizer state, and nothing else.

    A trial Tune ended is closed once the process that sends its points has ended (``ended``,
    then ``settle``): Tune calls its callbacks before it stops the trial's actor, and the
    scheduler's decision reaches a trial while it trains on, so its rank 0 may still evaluate,
    print and send points, and write a state, until Ray has stopped its workers. Its run's
    description, best checkpoint and kept checkpoints are decided after the last of them."""

    def __init__(self, sweep: Sweep):
        self.sweep = sweep
        # Each trial's evaluations as Tune received them ({trial_id: [(step, metrics)]}): what the
        # recorder completes its run with when the trial ends before its next state.
        self.evaluations: dict[str, list[tuple[int, dict[str, float]]]] = {}
        # The trials Tune ended whose runs are not closed yet, each with when it stops waiting for
        # its points' sender (a monotonic time: a restored sweep's entries close at its first check).
        self.ending: dict[str, float] = {}
        self._checked = 0.0

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Restored (Tune unpickles a resumed sweep's callbacks in the new driver): MLflow is reached
        where this driver reaches it, which may have moved since (a Slurm job requeued onto other
        nodes starts its server elsewhere; a replaced head)."""
        self.__dict__.update(state)
        self.sweep = dataclasses.replace(self.sweep, uri=store.tracking_uri())

    def received(self, trial_id: str, result: dict[str, Any]) -> None:
        if DEV_METRIC in result and STEP in result:
            numbers = {k: float(result[k]) for k in (DEV_METRIC, BEST, TRAIN_LOSS) if k in result}
            self.evaluations.setdefault(trial_id, []).append((int(result[STEP]), numbers))

    def open(self, trial_id: str, config: dict[str, Any]) -> None:
        sweep = self.sweep
        found = trial_runs(sweep.uri, sweep.parent, trial_id)
        if found and found[0].info.status == "FINISHED" and checkpoint_exists(found[0].data.tags.get(BEST_CHECKPOINT_TAG)):
            return  # the trial reports its result again
        if found:
            Run.reopen(sweep.uri, found[0].info.run_id, in_trial=True)
            return
        cfg = sweep.base.with_values(config, source="search space")
        Run.create(sweep.uri, sweep.experiment or cfg.method, f"trial-{trial_id}", {**unit.run_tags(cfg), TRIAL_ID_TAG: trial_id},
                   parent=Run(sweep.uri, sweep.parent), in_trial=True)

    def ended(self, trial_id: str) -> None:
        """Tune ended the trial (its work done, or the scheduler stopped it): its run is closed by
        ``settle`` once the process sending its points has ended."""
        self.ending[trial_id] = time.monotonic() + SENDER_WAIT_S

    def settle(self, wait: bool = False) -> None:
        """Close (and print) each trial Tune ended whose points' sender has ended, or has had
        ``SENDER_WAIT_S``; at most every ``SENDER_CHECK_S`` (Tune calls this between its steps).
        With ``wait``: every such trial, waiting for each (the sweep's end, its actors stopped)."""
        if not self.ending or (not wait and time.monotonic() < self._checked + SENDER_CHECK_S):
            return
        for trial_id, until in list(self.ending.items()):
            quiet = self.senders_ended(trial_id) or time.monotonic() >= until
            while wait and not quiet:
                time.sleep(SENDER_CHECK_S)
                quiet = self.senders_ended(trial_id) or time.monotonic() >= until
            if quiet:
                del self.ending[trial_id]
                if self.close(trial_id, "stopped"):
                    print(trial_line(self.sweep.uri, self.sweep.parent, trial_id), flush=True)
        self._checked = time.monotonic()

    def senders_ended(self, trial_id: str) -> bool:
        """Whether every Ray actor that sends points to the trial's open runs (its seeds' too) has
        ended; True when the runs cannot be read (closing then does what it can, as it would)."""
        try:
            runs = [r for found, seeds in self.open_runs(trial_id) for r in (found, *seeds)]
        except Exception:  # noqa: BLE001 - the tracking server away
            return True
        return ray_env.actors_ended([r.data.tags[SENDER_TAG] for r in runs if r.data.tags.get(SENDER_TAG)])

    def open_runs(self, trial_id: str) -> list[tuple[Any, list]]:
        """The trial's runs still RUNNING, each with its seeds' runs still RUNNING."""
        uri, parent = self.sweep.uri, self.sweep.parent
        return [(found, store.child_runs(uri, found.info.run_id, "attributes.status = 'RUNNING'"))
                for found in trial_runs(uri, parent, trial_id, " and attributes.status = 'RUNNING'")]

    def close(self, trial_id: str, outcome: str) -> bool:
        """End the still-open runs of a trial (and of its seeds): ``completed`` where the work
        marked itself done, else ``outcome`` (``stopped`` by the scheduler, ``failed``,
        ``interrupted``). Whether it had an open run."""
        sweep = self.sweep
        runs = self.open_runs(trial_id)
        for found, seeds in runs:
            for r in [*seeds, found]:
                done = r.data.tags.get(WORK_DONE_TAG) == "true"
                fit_folder = storage.join(sweep.folder, "trials", trial_id if r is found else r.info.run_name)
                if done or (r is found and sweep.seeds > 1):  # named by the fit's end (a configuration's: its seeds' best)
                    best = r.data.tags.get(BEST_CHECKPOINT_TAG)
                else:  # Tune ended the fit: the recorder completes it from storage and Tune's reports
                    try:
                        if r is found and sweep.seeds == 1:
                            recorder.complete_evaluations(sweep.uri, r.info.run_id, self.evaluations.get(trial_id, []),
                                                          POINTS_WAIT_S)
                        best = recorder.finish_fit(sweep.uri, r.info.run_id, fit_folder, POINTS_WAIT_S)
                    except TrackingUnavailable as exc:  # the run's end is told; its points stay in its checkpoints
                        print(f"note: {exc}", file=sys.stderr, flush=True)
                        best = checkpoint.best_under(fit_folder)
                    best = best.checkpoint if best else None
                reason = "completed" if done else outcome
                extra = {STOPPED_BY_SCHEDULER_TAG: "true"} if reason == "stopped" else None
                status = Run(sweep.uri, r.info.run_id).end(reason, best, only_if_running=True, tags=extra)
                if r is found:
                    self.describe(r.info.run_id)
                if status == "FINISHED" and best and not (r is found and sweep.seeds > 1):  # a fit: never trained again
                    release_fit(fit_folder, best)
        return bool(runs)

    def describe(self, run_id: str) -> None:
        """The trial's description, from what its run holds now (a tracking outage: left without)."""
        sweep = self.sweep
        try:
            searched = (store.client(sweep.uri).get_run(sweep.parent).data.tags.get(SEARCHED_TAG) or "").split(",")
            run = store.client(sweep.uri).get_run(run_id)
            Run(sweep.uri, run_id).set_tags({NOTE_TAG: sweep_summary.trial_note(sweep.uri, run, [k for k in searched if k])})
        except Exception as exc:  # noqa: BLE001 - a description never fails the sweep it describes
            print(f"note: trial run {run_id} was not described ({one_line(exc, 160)})", flush=True)

    def close_open(self, states: dict[str, str]) -> None:
        """After the driver stopped (Ctrl-C, SIGTERM) or died (closed by ``--resume``): each trial
        run still open ends as Tune's saved state has its trial: stopped (TERMINATED), failed
        (ERROR), else interrupted (KILLED; ``--resume`` runs the trial again in the same run)."""
        for found in store.child_runs(self.sweep.uri, self.sweep.parent, "attributes.status = 'RUNNING'"):
            trial_id = found.data.tags.get(TRIAL_ID_TAG, "")
            self.close(trial_id, {"TERMINATED": "stopped", "ERROR": "failed"}.get(states.get(trial_id, ""), "interrupted"))

    def callback(self):
        """The Tune callback that calls ``open`` and ``close`` on the trials' events."""
        from ray import tune

        runs = self

        class Callback(tune.Callback):
            def on_trial_start(self, iteration, trials, trial, **info):
                runs.open(trial.trial_id, trial.config or {})
                values = ", ".join(f"{k}={short(v)}" for k, v in (trial.config or {}).items())
                print(f"[trial {trial.trial_id}] started: {values}", flush=True)

            def on_trial_result(self, iteration, trials, trial, result, **info):
                runs.received(trial.trial_id, result)

            def on_trial_complete(self, iteration, trials, trial, **info):
                runs.ended(trial.trial_id)

            def on_step_begin(self, iteration, trials, **info):
                runs.settle()

            def on_experiment_end(self, trials, **info):  # after Tune has stopped every trial's actor
                runs.settle(wait=True)

            def on_trial_error(self, iteration, trials, trial, **info):
                runs.close(trial.trial_id, "failed")
                print(trial_line(runs.sweep.uri, runs.sweep.parent, trial.trial_id), flush=True)

        return Callback()


def release_fit(fit_folder: str, best: str) -> None:
    """A finished trial's fit keeps its best checkpoint, without optimizer state, and nothing else."""
    keep = storage.resolve(best)
    for name in storage.list_dirs(fit_folder):
        if name.startswith(checkpoint.PREFIX) and storage.resolve(storage.join(fit_folder, name)) != keep:
            storage.remove(storage.join(fit_folder, name))
    release(FitResult(None, best))


def trial_line(uri: str, parent: str, trial_id: str) -> str:
    """A trial's end in the words its MLflow run has (FINISHED, FINISHED stopped early by the
    scheduler, FAILED, KILLED), with its best STS-B dev."""
    found = trial_runs(uri, parent, trial_id)
    if not found:
        return f"[trial {trial_id}] ended"
    run = found[0]
    early = " (stopped early by the scheduler)" if run.data.tags.get(STOPPED_BY_SCHEDULER_TAG) == "true" else ""
    best = run.data.metrics.get(BEST)
    return f"[trial {trial_id}] {run.info.status}{early}" + (f", best {DEV_METRIC} {best:.2f}" if best is not None else "")


# ------------------------------------------------------------------------------------------------
# The winner


def ranked_trials(uri: str, parent: str, metric: str, mode: str) -> list:
    """FINISHED trial runs with a score and a best checkpoint that exists in storage, best first."""
    order = "DESC" if mode == "max" else "ASC"
    runs = store.child_runs(uri, parent, "attributes.status = 'FINISHED'", order_by=[f"metrics.{BEST_PREFIX}{metric} {order}"])
    return [r for r in runs if BEST_PREFIX + metric in r.data.metrics and checkpoint_exists(r.data.tags.get(BEST_CHECKPOINT_TAG))]


def finish_sweep(sweep: Sweep, parent: Run, spec: SearchSpace, results) -> str:
    """The trials' table and plots, the grid's table, and the best trial: its numbers on the
    parent (``best.*`` keys, never the trials' own), its checkpoint evaluated beside the backbone,
    exported and registered. Returns that checkpoint."""
    notes = sweep_summary.summarise(parent, results, spec, total_steps(sweep.base, len(sweep.sentences)))
    if sweep.grid and sweep.base.final_eval:
        sweep_summary.grid_table(parent, sweep.grid, sweep.base.param_key(sweep.grid))
    ranked = ranked_trials(sweep.uri, sweep.parent, spec.metric, spec.mode)
    if not ranked:
        raise UserError("no trial produced a checkpoint; see the trials' errors above")
    best = Run(sweep.uri, ranked[0].info.run_id, ranked[0].info.run_name)
    result = unit.read_result(best)
    step = checkpoint.read_state_at(result.checkpoint)["step"]
    won = {k: ranked[0].data.params.get(sweep.base.param_key(k)) for k in spec.space}
    recorder.name_best(parent, result.checkpoint, {BEST_RUN_ID_TAG: best.id, **{WINNER + k: v for k, v in won.items()}})
    wall, cpu = time.perf_counter(), time.process_time()
    unit.finalize(best, result, "full" if sweep.base.final_eval else "none", searched=won)
    baseline = result.baseline
    if sweep.base.final_eval:  # the weights were loaded on the run's device, not here
        print(f"the end of the sweep (7 STS tasks, baseline, export, registry): {time.perf_counter() - wall:.1f} s, "
              f"{time.process_time() - cpu:.1f} s of it the driver's CPU", flush=True)
    # At the best checkpoint's step, each once: the winner's numbers, and the comparison with the backbone.
    numbers = {winner_key(k): v for k, v in {**result.dev, **{sts(k): v for k, v in (result.scores or {}).items()}}.items()}
    if baseline:
        tasks = [t for t in (*STS_TASKS, "avg") if t in baseline and t in result.scores]
        numbers.update({vs_backbone(t, "baseline"): baseline[t] for t in tasks})
        numbers.update({vs_backbone(t, "delta"): result.scores[t] - baseline[t] for t in tasks})
        parent.log_text(final_evaluation.beside_block(sweep_summary.best_backbone(result.checkpoint), baseline, result.scores),
                        "sts_vs_backbone.md")
    recorder.log_results(parent, numbers, step)
    # What the sweep's nodes cost (the report sets it beside the trials' training GPU-hours).
    try:
        since = parent.info().info.start_time / 1000
        recorder.log_results(parent, ray_env.node_hours(since))
        if settings.get(settings.CLUSTER):  # on a cluster up made: what AWS bills its instances
            recorder.log_results(parent, cluster_aws.billed_hours(settings.get(settings.CLUSTER), since))
    except Exception as exc:  # noqa: BLE001 - an account of costs never fails the sweep that it accounts
        print(f"note: the sweep's node-hours were not recorded ({one_line(exc, 160)})", flush=True)
    registered = best.info().data.tags.get(REGISTERED_MODEL_TAG, "")
    parent.set_tags({REGISTERED_MODEL_TAG: registered,
                     NOTE_TAG: sweep_summary.sweep_note(sweep.uri, parent, best, won, registered, result, baseline, notes)})
    best.set_tags({NOTE_TAG: sweep_summary.winner_note(sweep.uri, parent, best, registered, result, baseline, list(spec.space))})
    sweep_summary.closing_block(sweep.uri, sweep.experiment, parent, best, result, won, registered, spec.metric)
    return result.checkpoint
