"""``python -m platform.tune METHOD [--profile P] [--num-samples N] [--set k=v ...] [--seeds N] [--resume]``.

A Ray Tune sweep of a recipe (a paper's name, or ``recipe --set negatives=... loss=... aux=...``)
over its search space (``platform.space``): Optuna (or a grid) proposes configurations, ASHA stops
poor ones on STS-B dev, and each trial is one configuration run (``platform.run.unit``). MLflow gets
one parent run for the sweep and one child run per trial, opened and ended by the driver from
Tune's trial events (``TrialRuns``); at the end the best trial's checkpoint is evaluated on the 7
STS tasks, exported and registered.

The sweep's state (its configuration, its parent run, Tune's own state) lives in ``output_dir``;
``--resume`` continues the newest sweep of the method, refuses a changed configuration, and closes
truthfully the runs a driver that died (SIGKILL, a lost head) left open.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

from platform import sweep_summary
from platform.config import METHODS, TrainConfig, available_profiles, build_config, parse_tags
from platform.console import command_parser
from platform.errors import ConfigError, UserError, cli_main
from platform.run import finalize as final_steps
from platform.run import storage, unit
from platform.run.fit import FitResult, release
from platform.run.loop import total_steps
from platform.space import MAX_SAMPLES, SearchSpace, load_space
from platform.tracking import hub, recorder, store
from platform.tracking.runs import BEST, DEV_METRIC, STORAGE_TAG, WORK_DONE_TAG, Run, TrackingUnavailable, checkpoint_exists

SWEEP_STATE = "platform_sweep.json"
HEAD_NODE = "node:__internal_head__"  # a resource only the Ray head node has
POINTS_WAIT_S = 60.0  # how long closing a trial Tune ended waits for its points to reach MLflow


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


# ------------------------------------------------------------------------------------------------
# A trial


def trial(config: dict[str, Any], sweep: Sweep) -> None:
    """One Tune trial: a configuration run of the base configuration with the searched values, in
    the MLflow run the sweep's callback opened for it (``TrialRuns``), which also ends it."""
    import ray.data
    import ray.tune

    # One line per evaluation: no Ray Data progress bars from inside trials (this context
    # travels with the datasets the trial makes).
    ray.data.DataContext.get_current().enable_progress_bars = False
    cfg = sweep.base.with_values(config, source="search space")
    trial_id = ray.tune.get_context().get_trial_id()
    found = trial_runs(sweep.uri, sweep.parent, trial_id)[0]  # opened before Tune started this trial
    if found.info.status == "FINISHED":  # it finished just before the sweep stopped: reported again, not trained twice
        metrics = found.data.metrics
        ray.tune.report({DEV_METRIC: metrics[BEST], **{k: v for k, v in metrics.items() if k.startswith(BEST)},
                         "resumed_finished_trial": 1})
        return
    run = Run(sweep.uri, found.info.run_id, found.info.run_name, resumed="platform.resumed" in found.data.tags,
              in_trial=True, experiment_id=found.info.experiment_id)
    with run.closing():
        # A trial may search parameters that change generated columns (SAN's scale): its own corpus
        # data, from the content-keyed cache when they match the sweep's base.
        corpus = unit.prepare(cfg, sweep.sentences)
        if not run.resumed:
            run.log_params(cfg.flat())
            run.log_corpus(cfg.corpus, corpus.digest, corpus.num_sentences)
        result = unit.run_configuration(
            cfg, corpus, run, storage_path=storage.join(sweep.folder, "trials"), name=trial_id, seeds=sweep.seeds,
            final="evaluate" if sweep.grid and cfg.final_eval else "none", tune_reports=True, label=f"trial {trial_id}")
        run.complete(result.checkpoint)
    if sweep.seeds > 1:  # the mean over seeds, reported once the work is done: the scheduler may end the trial on it
        ray.tune.report({DEV_METRIC: result.dev[BEST], **result.dev, "seeds": sweep.seeds,
                         "step": result.fits[0].result.metrics.get("step")})


def trial_runs(uri: str, parent: str, trial_id: str, where: str = "") -> list:
    """A trial's MLflow runs under the sweep's parent, newest first."""
    return store.child_runs(uri, parent, f"tags.trial_id = '{trial_id}'" + where, order_by=["attributes.start_time DESC"])


# ------------------------------------------------------------------------------------------------
# The trials' runs: opened and ended by the driver, from Tune's trial events


class TrialRuns:
    """Every trial's MLflow run, from Tune's own events (the ``MLflowLoggerCallback`` pattern):
    opened when Tune starts the trial (reopened when a resumed sweep runs it again), ended when
    Tune ends it: FINISHED when its work completed or the scheduler stopped it after a report with
    its best checkpoint in storage, FAILED on an error, KILLED when the sweep was interrupted.
    Before a run ends, the recorder completes its step metrics and names its best checkpoint from
    storage (``recorder.finish_fit``); a FINISHED trial keeps its best checkpoint, without
    optimizer state, and nothing else."""

    def __init__(self, sweep: Sweep):
        self.sweep = sweep

    def open(self, trial_id: str, config: dict[str, Any]) -> None:
        sweep = self.sweep
        found = trial_runs(sweep.uri, sweep.parent, trial_id)
        if found and found[0].info.status == "FINISHED" and checkpoint_exists(found[0].data.tags.get("best_checkpoint")):
            return  # the trial reports its result again
        if found:
            Run.reopen(sweep.uri, found[0].info.run_id, in_trial=True)
            return
        cfg = sweep.base.with_values(config, source="search space")
        Run.create(sweep.uri, sweep.experiment or cfg.method, f"trial-{trial_id}", {**unit.run_tags(cfg), "trial_id": trial_id},
                   parent=Run(sweep.uri, sweep.parent), in_trial=True)

    def close(self, trial_id: str, outcome: str) -> None:
        """End the still-open runs of a trial (and of its seeds): ``completed`` where the work
        marked itself done, else ``outcome`` (``stopped`` by the scheduler, ``failed``,
        ``interrupted``)."""
        sweep = self.sweep
        for found in trial_runs(sweep.uri, sweep.parent, trial_id, " and attributes.status = 'RUNNING'"):
            for r in [*store.child_runs(sweep.uri, found.info.run_id, "attributes.status = 'RUNNING'"), found]:
                done = r.data.tags.get(WORK_DONE_TAG) == "true"
                fit_folder = storage.join(sweep.folder, "trials", trial_id if r is found else r.info.run_name)
                if done or (r is found and sweep.seeds > 1):  # named by the fit's end (a configuration's: its seeds' best)
                    best = r.data.tags.get("best_checkpoint")
                else:  # Tune ended the fit: the recorder completes it from storage
                    try:
                        best = recorder.finish_fit(sweep.uri, r.info.run_id, fit_folder, POINTS_WAIT_S)
                    except TrackingUnavailable as exc:  # the run's end is told; its points stay in its checkpoints
                        print(f"note: {exc}", file=sys.stderr, flush=True)
                        best = recorder.best_under(fit_folder)
                    best = best[0] if best else None
                reason = "completed" if done else outcome
                extra = {"stopped_by_scheduler": "true"} if reason == "stopped" else None
                status = Run(sweep.uri, r.info.run_id).end(reason, best, only_if_running=True, tags=extra)
                if status == "FINISHED" and best and not (r is found and sweep.seeds > 1):  # a fit: never trained again
                    release_fit(fit_folder, best)

    def close_open(self, states: dict[str, str]) -> None:
        """After the driver stopped (Ctrl-C, SIGTERM) or died (closed by ``--resume``): each trial
        run still open ends as Tune's saved state has its trial: stopped (TERMINATED), failed
        (ERROR), else interrupted (KILLED; ``--resume`` runs the trial again in the same run)."""
        for found in store.child_runs(self.sweep.uri, self.sweep.parent, "attributes.status = 'RUNNING'"):
            trial_id = found.data.tags.get("trial_id", "")
            self.close(trial_id, {"TERMINATED": "stopped", "ERROR": "failed"}.get(states.get(trial_id, ""), "interrupted"))

    def callback(self):
        """The Tune callback that calls ``open`` and ``close`` on the trials' events."""
        from ray import tune

        runs = self

        class Callback(tune.Callback):
            def on_trial_start(self, iteration, trials, trial, **info):
                runs.open(trial.trial_id, trial.config or {})
                values = ", ".join(f"{k}={_short(v)}" for k, v in (trial.config or {}).items())
                print(f"[trial {trial.trial_id}] started: {values}", flush=True)

            def on_trial_complete(self, iteration, trials, trial, **info):
                runs.close(trial.trial_id, "stopped")
                print(trial_line(runs.sweep.uri, runs.sweep.parent, trial.trial_id), flush=True)

            def on_trial_error(self, iteration, trials, trial, **info):
                runs.close(trial.trial_id, "failed")
                print(trial_line(runs.sweep.uri, runs.sweep.parent, trial.trial_id), flush=True)

        return Callback()


def release_fit(fit_folder: str, best: str) -> None:
    """A finished trial's fit keeps its best checkpoint, without optimizer state, and nothing else."""
    keep = storage.resolve(best)
    for name in storage.list_dirs(fit_folder):
        if name.startswith("checkpoint_") and storage.resolve(storage.join(fit_folder, name)) != keep:
            storage.remove(storage.join(fit_folder, name))
    release(FitResult(None, best))


def trial_line(uri: str, parent: str, trial_id: str) -> str:
    """A trial's end in the words its MLflow run has (FINISHED, FINISHED stopped early by the
    scheduler, FAILED, KILLED), with its best STS-B dev."""
    found = trial_runs(uri, parent, trial_id)
    if not found:
        return f"[trial {trial_id}] ended"
    run = found[0]
    early = " (stopped early by the scheduler)" if run.data.tags.get("stopped_by_scheduler") == "true" else ""
    best = run.data.metrics.get(BEST)
    return f"[trial {trial_id}] {run.info.status}{early}" + (f", best {DEV_METRIC} {best:.2f}" if best is not None else "")


def _short(value) -> str:
    """A searched value as the console shows it: floats to 3 significant digits (a value read back
    from a run's params is text)."""
    value = sweep_summary.as_number(value) if isinstance(value, str) else value
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def ranked_trials(uri: str, parent: str, metric: str, mode: str) -> list:
    """FINISHED trial runs with a score and a best checkpoint that exists in storage, best first."""
    order = "DESC" if mode == "max" else "ASC"
    runs = store.child_runs(uri, parent, "attributes.status = 'FINISHED'", order_by=[f"metrics.best_{metric} {order}"])
    return [r for r in runs if f"best_{metric}" in r.data.metrics and checkpoint_exists(r.data.tags.get("best_checkpoint"))]


# ------------------------------------------------------------------------------------------------
# The sweep


def run_sweep(sweep: Sweep, spec: SearchSpace, resume: bool):
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    base = sweep.base
    scheduler = None
    if spec.scheduler.get("type", "asha") == "asha":
        evals_per_trial = math.ceil(total_steps(base, len(sweep.sentences)) / base.eval_steps)
        scheduler = ASHAScheduler(
            time_attr="training_iteration",
            max_t=evals_per_trial + 1,  # past the last evaluation (and a seeded trial's mean): finished trials are not "stopped"
            grace_period=int(spec.scheduler.get("grace_period", 1)),
            reduction_factor=float(spec.scheduler.get("reduction_factor", 2)),
        )
    search_alg = None
    if spec.search == "optuna":
        from ray.tune.search import ConcurrencyLimiter
        import optuna
        from ray.tune.search.optuna import OptunaSearch

        optuna.logging.set_verbosity(optuna.logging.WARNING)  # "a new study created in memory"

        search_alg = ConcurrencyLimiter(OptunaSearch(seed=spec.seed), max_concurrent=spec.max_concurrent_trials)
    # A trial only waits on its Train workers: no CPU of its own. It runs on the head, where the
    # cache of the corpus' columns and statistics is; its workers get them through the object store.
    trainable = tune.with_resources(tune.with_parameters(trial, sweep=sweep),
                                    {"cpu": 0, "memory": 256 * 2**20, HEAD_NODE: 0.001})
    experiment = storage.join(sweep.folder, "tune")
    callbacks = [TrialRuns(sweep).callback()]
    if resume and tune.Tuner.can_restore(experiment):
        # The restored Tuner brings the callbacks it was started with (the same sweep and run).
        tuner = tune.Tuner.restore(experiment, trainable=trainable, resume_errored=True, restart_errored=False,
                                   param_space=spec.to_ray())
    else:
        tuner = tune.Tuner(
            trainable,
            param_space=spec.to_ray(),
            tune_config=tune.TuneConfig(
                metric=spec.metric, mode=spec.mode, search_alg=search_alg, scheduler=scheduler,
                num_samples=spec.num_samples,
                # The Optuna limiter already caps concurrency; a grid needs the cap here.
                max_concurrent_trials=None if search_alg is not None else spec.max_concurrent_trials,
            ),
            # verbose=0: no Tune status boxes (150+ columns, every few seconds); a trial prints a line
            # when it starts, one per evaluation, and one when it ends, in its MLflow run's words.
            run_config=tune.RunConfig(name="tune", storage_path=sweep.folder, callbacks=callbacks, verbose=0),
        )
    return tuner.fit()


def saved_trial_states(folder: str) -> dict[str, str]:
    """Each trial's status in the state Tune saved (``TERMINATED``, ``ERROR``, ``PENDING``, ...);
    empty when Tune saved none yet."""
    from ray.tune import ExperimentAnalysis

    try:
        return {t.trial_id: t.status for t in ExperimentAnalysis(storage.join(folder, "tune")).trials}
    except Exception:  # no experiment state written yet: every trial runs (again)
        return {}


def interrupted(states: dict[str, str], expected: int) -> bool:
    """Tune returns (instead of raising) after Ctrl-C, having saved its state; in memory it then
    marks the pending trials terminated, so the saved state is what tells: trials neither
    terminated nor errored, or fewer trials than the sweep asked for."""
    return len(states) < expected or any(s not in ("TERMINATED", "ERROR") for s in states.values())


def finish_sweep(sweep: Sweep, parent: Run, spec: SearchSpace, results) -> str:
    """The trials' table and plots, the grid's table, and the best trial: its numbers on the
    parent, its checkpoint evaluated, exported and registered. Returns that checkpoint."""
    sweep_summary.summarise(parent, results, spec, total_steps(sweep.base, len(sweep.sentences)))
    if sweep.grid and sweep.base.final_eval:
        sweep_summary.grid_table(parent, sweep.grid)
    ranked = ranked_trials(sweep.uri, sweep.parent, spec.metric, spec.mode)
    if not ranked:
        raise UserError("no trial produced a checkpoint; see the trials' errors above")
    best = Run(sweep.uri, ranked[0].info.run_id, ranked[0].info.run_name)
    result = unit.read_result(best)
    step = final_steps.read_state_at(result.checkpoint)["step"]
    won = {k: ranked[0].data.params.get(k) for k in spec.space}
    recorder.name_best(parent, result.checkpoint, {"best_run_id": best.id, **{f"best.{k}": v for k, v in won.items()}})
    logged = parent.info().data.params
    parent.log_params({k: v for k, v in won.items() if k not in logged})  # the winner's values (searched: tag)
    recorder.log_results(parent, result.dev, step)
    unit.finalize(best, result, "full" if sweep.base.final_eval else "none", log_to=(parent,), step=step)
    registered = best.info().data.tags.get("registered_model", "")
    parent.set_tags({"registered_model": registered, "mlflow.note.content": _note(sweep, best, won, registered)})
    closing_block(sweep, parent, best, result, won, registered, spec.metric)
    return result.checkpoint


def _note(sweep: Sweep, best: Run, won: dict, registered: str) -> str:
    """The parent run's description (Markdown in MLflow's UI): the winner, with links."""
    experiment = best.info().info.experiment_id
    lines = [f"**Best trial:** [{best.name}](#/experiments/{experiment}/runs/{best.id}) with "
             + ", ".join(f"`{k}={v}`" for k, v in won.items()) + "."]
    if "/" in registered:
        name, version = registered.split("/", 1)
        lines.append(f"**Registered:** [{name} version {version}](#/models/{name}/versions/{version}).")
    lines.append("Trials: `sweep_summary.csv` and `plots/` in this run's artifacts.")
    return "\n\n".join(lines)


def closing_block(sweep: Sweep, parent: Run, best: Run, result, won: dict, registered: str, metric: str) -> None:
    """What the user needs after a sweep, in one place."""
    dev, n = result.dev, len(result.fits)
    spread = f" +- {dev[BEST + '_std']:.2f} over {n} seeds" if n > 1 else ""
    values = textwrap.wrap(", ".join(f"{k}={_short(v)}" for k, v in won.items()), width=100 - 16,
                           break_long_words=False, break_on_hyphens=False) or ["(none searched)"]
    lines = ["", "=" * 72, "sweep finished", f"  best trial:   {best.name}",
             *(f"  {'values:' if i == 0 else '':<14}{chunk}" for i, chunk in enumerate(values)),
             f"  {metric}: {dev[BEST]:.2f}{spread}"]
    if result.scores:
        std = f" +- {result.scores['avg_std']:.2f}" if "avg_std" in result.scores else ""
        lines.append(f"  STS avg:      {result.scores.get('avg', float('nan')):.2f}{std} (table above, against the backbone)")
    lines += [f"  checkpoint:   {result.checkpoint}",
              f"  model:        {('models:/' + registered) if '/' in registered else 'not registered'}",
              f"  trials:       sweep_summary.csv and plots/ in MLflow run {parent.id} (artifacts)",
              f"  MLflow:       {store.redact(sweep.uri)}, experiment {sweep.experiment!r}, run {parent.name}",
              f"  browse it:    {ui_command(sweep.uri)}", "=" * 72]
    print("\n".join(lines), flush=True)


def ui_command(uri: str) -> str:
    """How to open this store's MLflow UI."""
    if uri.startswith(("http://", "https://")):
        return f"open {store.redact(uri)} in a browser"
    return f"mlflow ui --backend-store-uri {store.redact(uri)} (then http://127.0.0.1:5000)"


# ------------------------------------------------------------------------------------------------
# Starting and resuming


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


def resumable_sweep(uri: str, base: TrainConfig, identity: dict[str, Any]) -> tuple[str, dict]:
    """The sweep ``--resume`` continues, once it is known to have this identity and no live driver."""
    found = latest_sweep(base.output_dir, base.method)
    if found is None:
        raise UserError(f"--resume: no earlier {base.method} sweep under {base.output_dir}")
    folder, state = found
    if "config" not in state:
        raise UserError(f"--resume: {folder} was started by an older version (no saved configuration); start a new sweep")
    changed = base.differences(state["config"])
    changed += [f"{key} ({state.get(key)} -> {value})" for key, value in identity.items()
                if key != "config" and json.dumps(state.get(key)) != json.dumps(value)]
    if changed:
        raise ConfigError(f"--resume: the sweep in {folder} was started with another configuration: "
                          f"{', '.join(changed)}; give the same --profile, --set, --space, --grid, --num-samples and "
                          "--seeds, or start a new sweep without --resume")
    parent = store.client(uri).get_run(state["parent_run_id"])
    if parent.info.status == "FINISHED":
        raise UserError(f"--resume: the sweep in {folder} finished (best run {parent.data.tags.get('best_run_id')}); "
                        "there is nothing to resume")
    if parent.info.status == "RUNNING" and store.driver_alive(parent.data.tags.get(store.DRIVER_TAG)):
        raise UserError(f"--resume: the sweep in {folder} is still running (process "
                        f"{parent.data.tags[store.DRIVER_TAG].split(':')[1]}); stop it first (Ctrl-C or kill)")
    return folder, state


def new_sweep(uri: str, base: TrainConfig, spec: SearchSpace, corpus, identity: dict[str, Any],
              experiment: str | None = None, extra_tags: dict[str, str] | None = None) -> tuple[Run, str]:
    """The sweep's parent run, and its state in output_dir's storage, beside Tune's own: --resume
    finds both there, also when the driver ran in a `ray job submit` working copy that is gone."""
    name = f"{base.method}-sweep-{time.strftime('%Y%m%d-%H%M%S')}"
    folder = storage.join(base.output_dir, name)
    seeds = identity["seeds"]
    tags = {**(extra_tags or {}), **unit.run_tags(base), "sweep": "true", STORAGE_TAG: folder,
            **({"seeds": str(seeds)} if seeds > 1 else {})}
    parent = Run.create(uri, experiment or base.method, name, tags)
    # The searched keys are logged at the end with the winning values (a parameter is written once):
    # the parent shows what won, never the unsearched defaults beside the space.
    parent.log_params({**{k: v for k, v in base.flat().items() if k not in spec.space}, **spec.as_params(),
                       **({"seeds": seeds} if seeds > 1 else {})})
    parent.set_tags({"searched": ",".join(spec.space)})
    parent.log_corpus(base.corpus, corpus.digest, corpus.num_sentences)
    state = {"parent_run_id": parent.id, "method": base.method, "expected_trials": spec.expected_trials(), **identity}
    storage.write_text(storage.join(folder, SWEEP_STATE), json.dumps(state, default=str))
    return parent, folder


HELP = """Search a recipe's hyperparameters with Ray Tune and track the sweep in MLflow.

METHOD is a paper's recipe (simcse, una, san, augcse, vascl), or 'recipe' put together with
--set positives=... negatives=... loss=... aux=... . The base configuration is built as train
builds it (recipe defaults, profile, --config file, --set); the search space comes from
tune_spaces/METHOD.yaml (or --space). Optuna proposes configurations (or --grid PARAM runs the
file's one-parameter grid), ASHA stops poor ones on STS-B dev, and each trial is one tracked
configuration run nested under the sweep's parent run. At the end the best trial is evaluated on
the 7 STS tasks beside the untouched backbone, logged as a model and registered; the sweep's table,
CSV and plots are logged on the parent run. --resume continues the newest sweep of METHOD after a
stop or a crash, with the same arguments."""


def parse_args(argv=None) -> argparse.Namespace:
    p = command_parser("python -m platform.tune", HELP, "python -m platform.tune una --num-samples 8 --tag purpose=alpha-study")
    p.add_argument("method", help=f"one of {', '.join(METHODS)}")
    p.add_argument("--profile", default=None, help=f"one of {', '.join(available_profiles())} (default: the --config "
                                                   "file's, else local)")
    p.add_argument("--config", type=Path, default=None, metavar="FILE.yaml",
                   help="the base configuration as an experiment file (the keys of --set; what train's "
                        "--print-config prints); --set values override it")
    p.add_argument("--num-samples", type=int, default=None,
                   help="trials to run (default: the space file's num_samples for this profile)")
    p.add_argument("--set", dest="sets", action="append", metavar="KEY=VALUE", help="override a base config value")
    p.add_argument("--experiment", default=None, help="the MLflow experiment (default: the method's name)")
    p.add_argument("--tag", dest="tags", action="append", metavar="KEY=VALUE", help="an MLflow tag on the sweep's run")
    p.add_argument("--push-to-hub", metavar="REPO", default=None,
                   help="once the sweep has finished, upload the best trial's model (with its card) to this Hugging "
                        "Face Hub repository (NAMESPACE/NAME; needs a token: `hf auth login` or HF_TOKEN)")
    p.add_argument("--resume", action="store_true", help="resume this method's most recent sweep (same arguments)")
    p.add_argument("--space", type=Path, default=None, help="a search-space YAML instead of tune_spaces/METHOD.yaml")
    p.add_argument("--grid", default=None, metavar="PARAM", help="run the space file's one-parameter grid for PARAM")
    p.add_argument("--seeds", type=int, default=1, metavar="N",
                   help="fit every configuration with N seeds (seed, seed+1, ...); trials are ranked on the mean")
    return p.parse_args(argv)


def configure(args: argparse.Namespace) -> tuple[TrainConfig, SearchSpace, int]:
    """The base configuration, the search space and the number of seeds, checked."""
    base = build_config(args)
    if base.runtime != "ray":
        raise ConfigError("a sweep runs its trials on Ray: runtime must be ray")
    spec = load_space(base, args.space, grid=args.grid)
    if args.num_samples is not None:
        if not 1 <= args.num_samples <= MAX_SAMPLES:
            raise ConfigError(f"--num-samples must be between 1 and {MAX_SAMPLES}, got {args.num_samples}")
        spec.num_samples = args.num_samples
    return base, spec, len(unit.seed_values(base, args.seeds))


@cli_main
def main(argv=None) -> int:
    args = parse_args(argv)
    base, spec, seeds = configure(args)
    extra_tags = parse_tags(args.tags)
    if args.push_to_hub:
        hub.check_access(args.push_to_hub, base.final_eval)
    sentences = unit.preflight(base)
    uri = store.tracking_uri()
    identity = sweep_state(base, spec, seeds, args.grid)
    found = resumable_sweep(uri, base, identity) if args.resume else None  # checked before Ray starts
    if found is not None and args.experiment is not None:
        parent_run = store.client(uri).get_run(found[1]["parent_run_id"])
        if store.client(uri).get_experiment(parent_run.info.experiment_id).name != args.experiment:
            raise UserError(f"--resume: the sweep's runs are in another experiment than --experiment {args.experiment}; "
                            "give the same arguments")
    unit.start(base)
    corpus = unit.prepare(base, sentences, check=False)
    # Searched parameters are checked against the corpus per trial, after clipping the space.
    spec.clip(base.build_recipe().space_limits(corpus.states))
    if found is not None:  # Tune restores the sweep as it was started
        folder, state = found
        parent = Run.reopen(uri, state["parent_run_id"])
    else:
        parent, folder = new_sweep(uri, base, spec, corpus, identity, args.experiment, extra_tags)
        state = {"expected_trials": spec.expected_trials()}
    experiment = store.client(uri).get_experiment(parent.info().info.experiment_id).name
    sweep = Sweep(base, sentences, uri, parent.id, folder, seeds, args.grid, experiment)
    if found is not None:
        TrialRuns(sweep).close_open(saved_trial_states(folder))  # left open by a driver that died
    try:
        with parent.closing():
            results = run_sweep(sweep, spec, resume=found is not None)
            if interrupted(saved_trial_states(folder), state["expected_trials"]):
                raise KeyboardInterrupt
            parent.complete(finish_sweep(sweep, parent, spec, results))
    except KeyboardInterrupt:
        TrialRuns(sweep).close_open(saved_trial_states(folder))
        print(f"sweep interrupted; continue it with: python -m platform.tune {args.method} --resume "
              "(and the same arguments)", flush=True)
        raise
    if args.push_to_hub:
        hub.push(uri, parent.info().data.tags["best_run_id"], args.push_to_hub)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
