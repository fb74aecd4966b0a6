"""``python -m platform.tune METHOD [--profile P] [--num-samples N] [--set k=v ...] [--resume]``.

A Ray Tune sweep of a recipe (a paper's name, or ``recipe --set negatives=... loss=... aux=...``)
over its search space (``platform.space``): Optuna (or a grid) proposes trials, ASHA stops poor
ones on STS-B dev, each trial is one job fit (``platform.run.job``). MLflow gets one parent run for
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

from platform import tracking
from platform.config import METHODS, TrainConfig, available_profiles, parse_sets
from platform.errors import ConfigError, UserError, cli_main
from platform.run import checkpoint, job
from platform.run.loop import DEV_METRIC, total_steps
from platform.space import SearchSpace, load_space

SWEEP_STATE = "platform_sweep.json"


def trial(config: dict[str, Any], sweep: dict[str, Any]) -> None:
    """One Tune trial: its MLflow child run around one job fit."""
    import ray.tune

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
    job.fit(cfg, corpus, uri=uri, run_id=run_id, storage=Path(sweep["storage"]) / "trials", name=trial_id,
            tune_callback=True)
    tracking.end_run(uri, run_id, "FINISHED")


def run_sweep(base: TrainConfig, spec: SearchSpace, sentences: list[str], uri: str, parent: str, sweep_dir: Path,
              resume: bool, callbacks):
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    scheduler = None
    if spec.scheduler.get("type", "asha") == "asha":
        evals_per_trial = math.ceil(total_steps(base, len(sentences)) / base.eval_steps)
        scheduler = ASHAScheduler(
            time_attr="training_iteration",
            max_t=evals_per_trial + 1,  # past the last evaluation: finished trials are not "stopped"
            grace_period=int(spec.scheduler.get("grace_period", 1)),
            reduction_factor=float(spec.scheduler.get("reduction_factor", 2)),
        )
    search_alg = None
    if spec.search == "optuna":
        from ray.tune.search import ConcurrencyLimiter
        from ray.tune.search.optuna import OptunaSearch

        search_alg = ConcurrencyLimiter(OptunaSearch(seed=spec.seed), max_concurrent=spec.max_concurrent_trials)
    sweep = {"base": base.flat(), "uri": uri, "parent": parent, "experiment": base.method, "storage": str(sweep_dir),
             "sentences": sentences}
    # The trial itself only waits on its Train workers: no CPU of its own, so two trials fit on
    # 2 CPUs. with_parameters puts the corpus in the object store once for all trials.
    trainable = tune.with_resources(tune.with_parameters(trial, sweep=sweep), {"cpu": 0, "memory": 256 * 2**20})
    if resume and tune.Tuner.can_restore(str(sweep_dir / "tune")):
        tuner = tune.Tuner.restore(str(sweep_dir / "tune"), trainable=trainable, resume_errored=True,
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
            run_config=tune.RunConfig(name="tune", storage_path=str(sweep_dir), callbacks=callbacks),
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


def interrupted(experiment_dir: Path, expected: int) -> bool:
    """Tune returns (instead of raising) after Ctrl-C, having saved its state; in memory it then
    marks the pending trials terminated, so the saved state is what tells: trials neither
    terminated nor errored, or fewer trials than the sweep asked for."""
    from ray.tune import ExperimentAnalysis

    trials = ExperimentAnalysis(str(experiment_dir)).trials
    return len(trials) < expected or any(t.status not in ("TERMINATED", "ERROR") for t in trials)


def latest_sweep(storage: Path, method: str) -> Path | None:
    sweeps = sorted(p for p in storage.glob(f"{method}-sweep-*") if (p / SWEEP_STATE).is_file())
    return sweeps[-1] if sweeps else None


def trial_checkpoint(sweep_dir: Path, trial_id: str) -> str | None:
    """The trial's best kept checkpoint. Ray Train keeps the best by STS-B dev and the latest,
    also for a trial that the scheduler stopped mid-fit."""
    found = [p for p in (sweep_dir / "trials" / trial_id).glob("checkpoint_*") if checkpoint.is_checkpoint(p)]
    return str(max(found, key=lambda p: checkpoint.dev_score(p, DEV_METRIC))) if found else None


def report_best(uri: str, parent: str, spec: SearchSpace, base: TrainConfig, sweep_dir: Path) -> None:
    for run in tracking.ranked_child_runs(uri, parent, spec.metric, spec.mode):
        found = trial_checkpoint(sweep_dir, run.data.tags.get("trial_id", ""))
        if found:
            break
    else:
        raise UserError("no trial produced a checkpoint; see the trials' errors above")
    tracking.set_tags(uri, run.info.run_id, {"best_checkpoint": found})
    tracking.set_tags(uri, parent, {"best_run_id": run.info.run_id, "best_checkpoint": found})
    scores = job.finalize(uri, run.info.run_id, found, log_to=[parent]) if base.final_eval else {}
    print("\nbest trial")
    print(f"  parameters:   { {k: run.data.params.get(k) for k in spec.space} }")
    print(f"  {spec.metric}: {run.data.metrics['best_' + spec.metric]:.2f}")
    if scores:
        print(f"  STS avg:      {scores.get('avg', float('nan')):.2f}")
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
    sentences = job.preflight(base)
    storage, uri = Path(base.output_dir).resolve(), tracking.tracking_uri()
    job.start(base)
    # Searched parameters are checked against the corpus per trial, after clipping the space.
    corpus = job.prepare(base, sentences, check=False)
    spec.clip(base.build_recipe().space_limits(corpus.states))

    sweep_dir = latest_sweep(storage, args.method) if args.resume else None
    if args.resume and sweep_dir is None:
        raise UserError(f"--resume: no earlier {args.method} sweep under {storage}")
    if sweep_dir is not None:  # Tune restores the sweep as it was started (its num_samples)
        state = json.loads((sweep_dir / SWEEP_STATE).read_text())
        parent = state["parent_run_id"]
        tracking.reopen_run(uri, parent)
    else:
        sweep_dir = storage / f"{args.method}-sweep-{time.strftime('%Y%m%d-%H%M%S')}"
        sweep_dir.mkdir(parents=True)
        parent = tracking.start_run(uri, args.method, sweep_dir.name, {**job.run_tags(base), "sweep": "true"})
        tracking.log_params(uri, parent, {**base.flat(), **spec.as_params()})
        state = {"parent_run_id": parent, "method": args.method, "expected_trials": spec.expected_trials()}
        (sweep_dir / SWEEP_STATE).write_text(json.dumps(state))

    status = "FAILED"
    outcomes = _outcomes_callback()
    try:
        results = run_sweep(base, spec, sentences, uri, parent, sweep_dir, resume=args.resume, callbacks=[outcomes])
        # A restored Tuner brings its own copy of the callback: errors are read from the results too.
        outcomes.errored |= {r.metrics.get("trial_id") for r in results if r.error is not None and r.metrics}
        if interrupted(sweep_dir / "tune", state.get("expected_trials", spec.expected_trials())):
            raise KeyboardInterrupt
        report_best(uri, parent, spec, base, sweep_dir)
        status = "FINISHED"
        return 0
    except KeyboardInterrupt:
        status = "KILLED"
        print(f"sweep interrupted; continue it with: python -m platform.tune {args.method} --resume", flush=True)
        raise
    finally:
        try:
            tracking.close_child_runs(uri, parent, outcomes.errored, interrupted=status == "KILLED")
        finally:
            tracking.end_run(uri, parent, status)


if __name__ == "__main__":
    raise SystemExit(main())
