"""``python -m platform.tune METHOD [--profile P] [--num-samples N] [--set k=v ...] [--resume]``.

A Ray Tune sweep of a recipe (a paper's name, or ``recipe --set negatives=... loss=... aux=...``)
over its search space (``platform.space``): Optuna (or a grid) proposes trials, ASHA stops poor
ones on STS-B dev, each trial is one job fit (``platform.run.job``; with ``--seeds N`` one fit per
seed, ranked on their mean). MLflow gets one parent run for
the sweep and one child run per trial; at the end the best trial's checkpoint is evaluated on the
7 STS tasks, exported (Hugging Face + sentence-transformers) into its child run, and printed.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

from platform import sweep_summary, tracking
from platform.config import METHODS, TrainConfig, available_profiles, parse_sets
from platform.data import STS_TASKS
from platform.errors import ConfigError, UserError, cli_main
from platform.run import job, storage
from platform.run.loop import DEV_METRIC, total_steps
from platform.space import SearchSpace, load_space

SWEEP_STATE = "platform_sweep.json"
HEAD_NODE = "node:__internal_head__"  # a resource only the Ray head node has


def trial(config: dict[str, Any], sweep: dict[str, Any]) -> None:
    """One Tune trial: its MLflow child run around one job fit."""
    import ray.tune

    import ray.data

    # The console shows Tune's status table and one line per evaluation: no Ray Data progress
    # bars from inside trials (this context travels with the datasets the trial makes).
    ray.data.DataContext.get_current().enable_progress_bars = False
    cfg = TrainConfig.from_flat({**sweep["base"], **config})
    uri, parent, trial_id = sweep["uri"], sweep["parent"], ray.tune.get_context().get_trial_id()
    done = tracking.finished_trial_run(uri, parent, trial_id)
    if done is not None and "best_" + DEV_METRIC in done.data.metrics:
        # A resumed sweep: this trial finished (its MLflow run says so) just before Tune could
        # record it. Report its result again instead of training it twice.
        best = done.data.metrics["best_" + DEV_METRIC]
        ray.tune.report({DEV_METRIC: best, "best_" + DEV_METRIC: best, "resumed_finished_trial": 1})
        return
    run_id = tracking.start_run(uri, sweep["experiment"], f"trial-{trial_id}", {**job.run_tags(cfg), "trial_id": trial_id},
                                parent_run_id=parent)
    # Only success is recorded here: a trial that ASHA stops is interrupted like one that fails,
    # so the driver, which knows which trials errored, ends the runs still RUNNING afterwards.
    tracking.log_params(uri, run_id, cfg.flat())
    # A trial may search parameters that change generated columns (SAN's scale): its own corpus
    # data, from the content-keyed cache when they match the sweep's base.
    corpus = job.prepare(cfg, sweep["sentences"])
    tracking.log_corpus(uri, run_id, cfg.corpus, corpus.digest, corpus.num_sentences)
    trials_dir = storage.join(sweep["storage"], "trials")
    if sweep.get("seeds", 1) > 1:
        _trial_seeds(cfg, corpus, sweep, run_id, trial_id, trials_dir)
        return
    out = job.fit(cfg, corpus, uri=uri, run_id=run_id, storage_path=trials_dir, name=trial_id, tune_callback=True,
                  label=f"trial {trial_id}")
    if out.checkpoint:
        tracking.set_tags(uri, run_id, {"best_checkpoint": out.checkpoint})
        if sweep.get("grid") and cfg.final_eval:  # a sensitivity grid: the 7 tasks at every point
            job.evaluate_sts(uri, run_id, out.checkpoint)
    tracking.end_run(uri, run_id, "FINISHED")


def _trial_seeds(cfg: TrainConfig, corpus, sweep: dict[str, Any], run_id: str, trial_id: str, trials_dir: str) -> None:
    """A trial of a sweep with seeds: its configuration fitted once per seed (the first seed's
    evaluations are what ASHA sees), then the mean over seeds reported to Tune as its result."""
    import ray.tune

    uri = sweep["uri"]
    runs = job.fit_seeds(cfg, corpus, sweep["seeds"], uri=uri, parent=run_id, experiment=sweep["experiment"],
                         storage_path=trials_dir, name=trial_id, tune_callback=True, label=f"trial {trial_id}")
    if sweep.get("grid") and cfg.final_eval:
        job.evaluate_seeds(uri, run_id, runs)
    dev = job.seed_dev(runs)
    # Everything is in MLflow before the last report: the scheduler may end the trial on it.
    tracking.end_run(uri, run_id, "FINISHED")
    ray.tune.report({DEV_METRIC: dev["best_" + DEV_METRIC], **dev, "seeds": len(runs),
                     "step": runs[0].fit.metrics.get("step")})


def run_sweep(base: TrainConfig, spec: SearchSpace, sentences: list[str], uri: str, parent: str, sweep_dir: str,
              resume: bool, callbacks, grid: str | None = None, seeds: int = 1):
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    scheduler = None
    if spec.scheduler.get("type", "asha") == "asha":
        evals_per_trial = math.ceil(total_steps(base, len(sentences)) / base.eval_steps)
        scheduler = ASHAScheduler(
            time_attr="training_iteration",
            # Past the last evaluation (and a seeded trial's final mean): finished trials are not "stopped".
        max_t=evals_per_trial + 1,
            grace_period=int(spec.scheduler.get("grace_period", 1)),
            reduction_factor=float(spec.scheduler.get("reduction_factor", 2)),
        )
    search_alg = None
    if spec.search == "optuna":
        from ray.tune.search import ConcurrencyLimiter
        from ray.tune.search.optuna import OptunaSearch

        search_alg = ConcurrencyLimiter(OptunaSearch(seed=spec.seed), max_concurrent=spec.max_concurrent_trials)
    sweep = {"base": base.flat(), "uri": uri, "parent": parent, "experiment": base.method, "storage": sweep_dir,
             "sentences": sentences, "grid": grid, "seeds": seeds}
    # The trial itself only waits on its Train workers: no CPU of its own, so two trials fit on
    # 2 CPUs. It runs on the head node, beside the driver: the corpus' columns and statistics a
    # trial prepares come from (or go into) the head's cache, made once per sweep, never per GPU
    # node; its Train workers get them through the object store. with_parameters puts the corpus
    # in the object store once for all trials.
    trainable = tune.with_resources(tune.with_parameters(trial, sweep=sweep),
                                    {"cpu": 0, "memory": 256 * 2**20, HEAD_NODE: 0.001})
    experiment = storage.join(sweep_dir, "tune")
    if resume and tune.Tuner.can_restore(experiment):
        tuner = tune.Tuner.restore(experiment, trainable=trainable, resume_errored=True,
                                   restart_errored=False, param_space=spec.to_ray())
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
            # verbose=1: Tune's status table only; every trial prints one line per evaluation itself.
            run_config=tune.RunConfig(name="tune", storage_path=sweep_dir, callbacks=callbacks, verbose=1),
        )
    return tuner.fit()


def _outcomes_callback():
    from ray import tune

    class TrialOutcomes(tune.Callback):
        """Remembers which trials errored (as opposed to being stopped by the scheduler)."""

        def __init__(self):
            self.errored: set[str] = set()

        def on_trial_error(self, iteration, trials, trial, **info):
            self.errored.add(trial.trial_id)

    return TrialOutcomes()


def saved_trial_states(experiment_dir: str) -> dict[str, str]:
    """Each trial's status in the state Tune saved (``TERMINATED``, ``ERROR``, ``PENDING``, ...)."""
    from ray.tune import ExperimentAnalysis

    return {t.trial_id: t.status for t in ExperimentAnalysis(experiment_dir).trials}


def interrupted(states: dict[str, str], expected: int) -> bool:
    """Tune returns (instead of raising) after Ctrl-C, having saved its state; in memory it then
    marks the pending trials terminated, so the saved state is what tells: trials neither
    terminated nor errored, or fewer trials than the sweep asked for."""
    return len(states) < expected or any(s not in ("TERMINATED", "ERROR") for s in states.values())


def latest_sweep(root: str, method: str) -> tuple[str, dict] | None:
    """The newest sweep of ``method`` under ``output_dir`` (local or object storage) and its state."""
    for name in reversed(storage.list_dirs(root)):
        if name.startswith(f"{method}-sweep-"):
            text = storage.read_text(storage.join(root, name, SWEEP_STATE))
            if text is not None:
                return storage.join(root, name), json.loads(text)
    return None


def trial_checkpoint(run, results) -> str | None:
    """A trial's best checkpoint, as Ray persisted it (a URI in object storage on a cluster):
    the trial's MLflow tag when its fit returned; for a trial the scheduler stopped mid-fit, its
    reports in Tune's results (Ray Train keeps the best by STS-B dev and the latest)."""
    if run.data.tags.get("best_checkpoint"):
        return run.data.tags["best_checkpoint"]
    from ray.tune.integration.ray_train import CHECKPOINT_PATH_KEY

    trial_id = run.data.tags.get("trial_id")
    for result in results:
        frame = result.metrics_dataframe
        if (result.metrics or {}).get("trial_id") != trial_id or frame is None or CHECKPOINT_PATH_KEY not in frame:
            continue
        frame = frame.dropna(subset=[CHECKPOINT_PATH_KEY, DEV_METRIC])
        if len(frame):
            path = frame.loc[frame[DEV_METRIC].idxmax(), CHECKPOINT_PATH_KEY]
            return storage.uri_of(result.filesystem, path)
    return None


def report_best(uri: str, parent: str, spec: SearchSpace, base: TrainConfig, results) -> None:
    best = None
    for run in tracking.ranked_child_runs(uri, parent, spec.metric, spec.mode):
        found = trial_checkpoint(run, results)
        if found and not run.data.tags.get("best_checkpoint"):  # a stopped trial's run says where it is too
            tracking.set_tags(uri, run.info.run_id, {"best_checkpoint": found})
        if found and best is None:
            best = run, found
    if best is None:
        raise UserError("no trial produced a checkpoint; see the trials' errors above")
    run, found = best
    tracking.set_tags(uri, parent, {"best_run_id": run.info.run_id, "best_checkpoint": found})
    seeds = job.seed_runs_of(uri, run.info.run_id)
    dev = "best_" + DEV_METRIC  # with seeds: the trial's mean over them, and its std
    tracking.log_metrics(uri, parent, {k: v for k, v in run.data.metrics.items() if k in (dev, dev + "_std")})
    scores = {}
    if base.final_eval:
        # A grid point's run already holds its checkpoint's 7-task table (with seeds: their
        # means and stds): not evaluated twice.
        table = {k[len("sts_"):]: v for k, v in run.data.metrics.items() if k.startswith("sts_")}
        known = table if {*STS_TASKS, "avg"} <= set(table) and (not seeds or "avg_std" in table) else None
        scores = (job.finalize_seeds(uri, run.info.run_id, seeds, log_to=[parent], scores=known) if seeds
                  else job.finalize(uri, run.info.run_id, found, log_to=[parent], scores=known))
    metric = "best_" + spec.metric
    spread = (f" +- {run.data.metrics[metric + '_std']:.2f} over {len(seeds)} seeds"
              if seeds and metric + "_std" in run.data.metrics else "")
    print("\nbest trial")
    print(f"  parameters:   { {k: run.data.params.get(k) for k in spec.space} }")
    print(f"  {spec.metric}: {run.data.metrics[metric]:.2f}{spread}")
    if scores:
        std = f" +- {scores['avg_std']:.2f}" if "avg_std" in scores else ""
        print(f"  STS avg:      {scores.get('avg', float('nan')):.2f}{std}")
    print(f"  checkpoint:   {found}")
    print(f"  MLflow run:   {run.info.run_id} (parent {parent}, {tracking.redact(uri)})")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m platform.tune", description=__doc__.splitlines()[0])
    p.add_argument("method", help=f"one of {', '.join(METHODS)}")
    p.add_argument("--profile", default="local", help=f"one of {', '.join(available_profiles())}")
    p.add_argument("--num-samples", type=int, default=None)
    p.add_argument("--set", dest="sets", action="append", metavar="KEY=VALUE", help="override a base config value")
    p.add_argument("--resume", action="store_true", help="resume this method's most recent sweep")
    p.add_argument("--space", type=Path, default=None, help="a search-space YAML instead of tune_spaces/METHOD.yaml")
    p.add_argument("--grid", default=None, metavar="PARAM", help="run the space file's one-parameter grid for PARAM")
    p.add_argument("--seeds", type=int, default=1, metavar="N",
                   help="fit every configuration with N seeds (seed, seed+1, ...); trials are ranked on the mean")
    return p.parse_args(argv)


@cli_main
def main(argv=None) -> int:
    args = parse_args(argv)
    base = TrainConfig.build(args.method, args.profile, parse_sets(args.sets))
    if base.runtime != "ray":
        raise ConfigError("a sweep runs its trials on Ray: runtime must be ray")
    spec = load_space(base, args.space, grid=args.grid)
    if args.num_samples is not None:
        if args.num_samples < 1:
            raise ConfigError(f"--num-samples must be >= 1, got {args.num_samples}")
        spec.num_samples = args.num_samples
    seeds = len(job.seed_values(base, args.seeds))
    sentences = job.preflight(base)
    root, uri = base.output_dir, tracking.tracking_uri()  # output_dir: checked and resolved by preflight
    job.start(base)
    # Searched parameters are checked against the corpus per trial, after clipping the space.
    corpus = job.prepare(base, sentences, check=False)
    spec.clip(base.build_recipe().space_limits(corpus.states))

    found = latest_sweep(root, args.method) if args.resume else None
    if args.resume and found is None:
        raise UserError(f"--resume: no earlier {args.method} sweep under {root}")
    if found is not None:  # Tune restores the sweep as it was started (its num_samples)
        sweep_dir, state = found
        parent = state["parent_run_id"]
        tracking.reopen_run(uri, parent)
    else:
        name = f"{args.method}-sweep-{time.strftime('%Y%m%d-%H%M%S')}"
        sweep_dir = storage.join(root, name)
        parent = tracking.start_run(uri, args.method, name, {**job.run_tags(base), "sweep": "true",
                                                             **({"seeds": str(seeds)} if seeds > 1 else {})})
        tracking.log_params(uri, parent, {**base.flat(), **spec.as_params(), **({"seeds": seeds} if seeds > 1 else {})})
        tracking.log_corpus(uri, parent, base.corpus, corpus.digest, corpus.num_sentences)
        state = {"parent_run_id": parent, "method": args.method, "expected_trials": spec.expected_trials(),
                 "seeds": seeds}
        # In output_dir's storage, beside Tune's own state: --resume finds both there, also when
        # the driver ran in a `ray job submit` working copy that is gone.
        storage.write_text(storage.join(sweep_dir, SWEEP_STATE), json.dumps(state))

    status = "FAILED"
    outcomes = _outcomes_callback()
    states: dict[str, str] | None = None  # the trials' statuses as Tune saved them
    try:
        results = run_sweep(base, spec, sentences, uri, parent, sweep_dir, resume=args.resume, callbacks=[outcomes],
                            grid=args.grid, seeds=state.get("seeds", seeds))
        # A restored Tuner brings its own copy of the callback: errors are read from the results too.
        outcomes.errored |= {r.metrics.get("trial_id") for r in results if r.error is not None and r.metrics}
        states = saved_trial_states(storage.join(sweep_dir, "tune"))
        if interrupted(states, state.get("expected_trials", spec.expected_trials())):
            raise KeyboardInterrupt
        sweep_summary.summarise(uri, parent, results, spec, total_steps(base, len(sentences)))
        if args.grid and base.final_eval:
            sweep_summary.grid_table(uri, parent, args.grid)
        report_best(uri, parent, spec, base, results)
        status = "FINISHED"
        return 0
    except KeyboardInterrupt:
        status = "KILLED"
        # A trial that ended (it trained to its end, or ASHA stopped it on its last report) just
        # before Ctrl-C may not have closed its run yet: Tune will not run it again, so its run
        # is closed as a finished trial's, not left KILLED for a resume that never comes.
        if states is None:
            try:
                states = saved_trial_states(storage.join(sweep_dir, "tune"))
            except Exception:  # no state saved yet: every trial runs again
                states = {}
        print(f"sweep interrupted; continue it with: python -m platform.tune {args.method} --resume", flush=True)
        raise
    finally:
        try:
            ended = {t for t, s in (states or {}).items() if s == "TERMINATED"}  # --resume does not run them again
            tracking.close_child_runs(uri, parent, outcomes.errored, interrupted=status == "KILLED", ended=ended)
        finally:
            tracking.end_run(uri, parent, status)


if __name__ == "__main__":
    raise SystemExit(main())
