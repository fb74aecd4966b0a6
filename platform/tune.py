"""``python -m platform.tune METHOD [--profile P] [--num-samples N] [--set k=v ...] [--seeds N] [--resume]``.

A Ray Tune sweep of a recipe (a paper's name, or ``recipe --set negatives=... loss=... aux=...``)
over its search space (``platform.space``): Optuna (or a grid) proposes configurations, ASHA stops
poor ones on STS-B dev, and each trial is one configuration run (``platform.run.unit``). MLflow gets
one parent run for the sweep and one child run per trial, written and ended by the driver from
Tune's trial events (``platform.sweep_runs``); at the end the best trial's checkpoint is evaluated
on the 7 STS tasks, exported and registered.

The sweep's state (its configuration, its parent run, Tune's own state) lives in ``output_dir``;
``--resume`` continues the newest sweep of the method, refuses a changed configuration, and closes
truthfully the runs a driver that died (SIGKILL, a lost head) left open.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from methods.recipe import NAMED
from platform import settings, storage
from platform.config import TrainConfig, add_run_arguments, build_config, parse_tags
from platform.console import command_parser
from platform.errors import ConfigError, UserError, cli_main
from platform.run import ray_env, unit
from platform.run.loop import quiet_when_killed, total_steps
from platform.space import MAX_SAMPLES, SearchSpace, load_space
from platform.sweep_runs import (Sweep, TrialRuns, new_sweep, open_trial_run, resumable_sweep, sweep_closing,
                                 sweep_identity)
from platform.sweep_summary import finish_sweep
from platform.tracking import hub, store
from platform.tracking.names import BEST, WINNER_RUN_ID_TAG, CORPUS_SHA256_TAG, DEV_METRIC, RESUMED_FINISHED, STEP
from platform.tracking.recorder import Run

HEAD_NODE = "node:__internal_head__"  # a resource only the Ray head node has


# ------------------------------------------------------------------------------------------------
# A trial


def trial(config: dict[str, Any], sweep: Sweep) -> None:
    """One Tune trial: a configuration run of the base configuration with the searched values, in
    a run of its own under the sweep's, which the driver writes from its reports and ends
    (``TrialRuns``); the trial logs its configuration and, for several seeds, their mean."""
    import ray.data
    import ray.tune

    # One line per evaluation: no Ray Data progress bars from inside trials (this context
    # travels with the datasets the trial makes).
    ray.data.DataContext.get_current().enable_progress_bars = False
    quiet_when_killed()
    cfg = sweep.base.with_values(config, source="search space")
    run, found = open_trial_run(sweep, ray.tune.get_context().get_trial_id(), cfg)
    if run is None:  # it finished just before the sweep stopped: reported again, not trained twice
        metrics = found.data.metrics
        ray.tune.report({DEV_METRIC: metrics[BEST], **{k: v for k, v in metrics.items() if k.startswith(BEST)},
                         RESUMED_FINISHED: 1})
        return
    # Its columns were generated before the trials (searched SAN scales, AugCSE sets): read here.
    corpus = unit.prepare(cfg, sweep.sentences, generate=False)
    # Whether this run has them, not whether it was resumed: a start stopped before it logged
    # them (a Slurm requeue mid-preparation) leaves a reopened run without them.
    if found is None or CORPUS_SHA256_TAG not in found.data.tags:
        run.log_config(cfg)
        run.log_corpus(cfg.corpus, corpus.digest, corpus.num_sentences)
    trial_id = ray.tune.get_context().get_trial_id()
    result = unit.run_configuration(
        cfg, corpus, run, storage_path=storage.join(sweep.folder, "trials"), name=trial_id, seeds=sweep.seeds,
        final="evaluate" if sweep.grid and cfg.final_eval else "none", tune_reports=True, label=f"trial {trial_id}")
    if sweep.seeds > 1:  # the mean over seeds, reported once the work is done: the scheduler may end the trial on it
        ray.tune.report({DEV_METRIC: result.dev[BEST], **result.dev, "seeds": sweep.seeds,
                         STEP: result.fits[0].result.metrics.get(STEP)})


# ------------------------------------------------------------------------------------------------
# The sweep


def sweep_tuner(sweep: Sweep, spec: SearchSpace, resume: bool):
    """The sweep's Tune ``Tuner``: the trials' search (Optuna or a grid) and ASHA on its space, the
    driver's ``TrialRuns`` callback; restored from the sweep's folder on ``resume``."""
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
    return tuner


def saved_trial_states(folder: str, total: int) -> dict[str, str]:
    """Each trial's status in the state Tune saved (``TERMINATED``, ``ERROR``, ``PENDING``, ...), a
    terminated trial whose last result is before the fit's ``total`` steps ``STOPPED`` (by the
    scheduler); empty when Tune saved none yet."""
    from ray.tune import ExperimentAnalysis

    try:
        trials = ExperimentAnalysis(storage.join(folder, "tune")).trials
    except Exception:  # no experiment state written yet: every trial runs (again)
        return {}

    def finished(result: dict) -> bool:
        return bool(result.get(RESUMED_FINISHED)) or (result.get(STEP) or 0) >= total

    return {t.trial_id: "STOPPED" if t.status == "TERMINATED" and not finished(t.last_result or {}) else t.status
            for t in trials}


def interrupted(states: dict[str, str], expected: int) -> bool:
    """Tune returns (instead of raising) after Ctrl-C, having saved its state; in memory it then
    marks the pending trials terminated, so the saved state is what tells: trials neither
    terminated nor errored, or fewer trials than the sweep asked for."""
    return len(states) < expected or any(s not in ("TERMINATED", "STOPPED", "ERROR") for s in states.values())


HELP = f"""Search a recipe's hyperparameters with Ray Tune and track the sweep in MLflow.

METHOD is a paper's recipe ({', '.join(NAMED)}), or 'recipe' put together with
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
    add_run_arguments(p, sweep=True)
    p.add_argument("--num-samples", type=int, default=None,
                   help="trials to run (default: the space file's num_samples for this profile)")
    p.add_argument("--resume", nargs="?", const=True, default=False, metavar="SWEEP_FOLDER",
                   help="resume this method's most recent sweep, or the sweep in SWEEP_FOLDER (same arguments)")
    p.add_argument("--space", type=Path, default=None, help="a search-space YAML instead of tune_spaces/METHOD.yaml")
    p.add_argument("--grid", default=None, metavar="PARAM", help="run the space file's one-parameter grid for PARAM")
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
    varying = spec.generation_values(base)  # refused here, before Ray starts, when one is a range
    extra_tags = parse_tags(args.tags)
    if args.push_to_hub:
        hub.check_access(args.push_to_hub, base.final_eval)
    sentences = unit.preflight(base)
    uri = store.tracking_uri()
    identity = sweep_identity(base, spec, seeds, args.grid)
    # checked before Ray starts
    found = resumable_sweep(uri, base, identity, args.resume if isinstance(args.resume, str) else None) \
        if args.resume else None
    if found is not None and args.experiment is not None:
        parent_run = store.client(uri).get_run(found[1]["parent_run_id"])
        if store.client(uri).get_experiment(parent_run.info.experiment_id).name != args.experiment:
            raise UserError(f"--resume: the sweep's runs are in another experiment than --experiment {args.experiment}; "
                            "give the same arguments")
    unit.start(base)
    unit.generate_all(base, spec.generation_configs(base, varying), sentences,
                      ", ".join(f"{k}={'|'.join(map(str, v))}" for k, v in varying.items()), seeds=seeds)
    corpus = unit.prepare(base, sentences, check=False)
    # Searched parameters are checked against the corpus per trial, after clipping the space.
    spec.clip(base.build_recipe().space_limits(corpus.statistics))
    if found is not None:  # Tune restores the sweep as it was started
        folder, state = found
        parent = Run.reopen(uri, state["parent_run_id"])
    else:
        parent, folder = new_sweep(uri, base, spec, corpus, identity, args.experiment, extra_tags)
        state = {"expected_trials": spec.expected_trials()}
        if settings.get(settings.SWEEP_RECORD):  # a Slurm job resumes exactly this sweep at its next start
            storage.write_text(settings.get(settings.SWEEP_RECORD), folder)
    experiment = store.client(uri).get_experiment(parent.experiment_id).name
    sweep = Sweep(base, sentences, uri, parent.id, folder, seeds, args.grid, experiment, parent.experiment_id,
                  tuple(spec.space))
    total = total_steps(base, len(sentences))
    if found is not None:
        TrialRuns(sweep).close_open(saved_trial_states(folder, total))  # left open by a driver that died
    try:
        with sweep_closing(parent, sweep, lambda: saved_trial_states(folder, total)):
            try:
                results = sweep_tuner(sweep, spec, resume=found is not None).fit()
            finally:
                ray_env.free_reservations(say=True)
            if interrupted(saved_trial_states(folder, total), state["expected_trials"]):
                raise KeyboardInterrupt
            parent.complete(finish_sweep(sweep, parent, spec, results))
    except KeyboardInterrupt:
        print(f"sweep interrupted; continue it with: python -m platform.tune {args.method} --resume "
              "(and the same arguments)", flush=True)
        raise
    if args.push_to_hub:
        hub.push(uri, parent.info().data.tags[WINNER_RUN_ID_TAG], args.push_to_hub)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
