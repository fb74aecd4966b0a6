"""``python -m platform.tune METHOD [--profile P] [--num-samples N] [--set k=v ...] [--resume]``.

A Ray Tune sweep over ``tune_spaces/<method>.yaml``: Optuna (or a grid) proposes trials, ASHA stops
poor ones on STS-B dev, each trial fits a Ray Train ``TorchTrainer``. MLflow gets one parent run
for the sweep and one child run per trial; at the end the best trial's checkpoint is evaluated on
the 7 STS tasks, exported (Hugging Face + sentence-transformers) into its child run, and printed.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

import yaml

from platform import tracking
from platform.config import ConfigError, TrainConfig, available_profiles, parse_sets
from platform.errors import UserError, cli_main
from methods.base import method_class
from platform.cache import prepared_state
from platform.corpus import corpus_columns, statistics_input
from platform.loop import DEV_METRIC, total_steps

SPACES_DIR = Path(__file__).resolve().parent.parent / "tune_spaces"
SWEEP_STATE = "platform_sweep.json"
_DISTRIBUTIONS = ("loguniform", "uniform", "choice", "randint", "grid")
_TOP_KEYS = {"metric", "mode", "search", "num_samples", "max_concurrent_trials", "seed", "scheduler", "space", "profiles", "grids"}


# ------------------------------------------------------------------------------------------------
# Search-space files


def load_space(method: str, profile: str, path: Path | None = None, grid: str | None = None) -> dict[str, Any]:
    path = path or SPACES_DIR / f"{method}.yaml"
    if not path.is_file():
        raise ConfigError(f"no search space for method {method!r} ({path} missing)")
    try:
        spec = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: invalid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(spec, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    unknown = set(spec) - _TOP_KEYS
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) {', '.join(sorted(unknown))}; allowed: {', '.join(sorted(_TOP_KEYS))}")
    overrides = (spec.get("profiles") or {}).get(profile) or {}
    spec = {**spec, **overrides}
    if grid is not None:
        grids = spec.get("grids") or {}
        if grid not in grids:
            raise ConfigError(f"{path}: no grid {grid!r}; grids: {', '.join(grids) or 'none'}")
        # One parameter at a time over its listed values; each run goes to the end.
        spec.update(space={grid: {"grid": grids[grid]}}, search="grid", num_samples=1, scheduler={"type": "none"})
    spec.setdefault("metric", DEV_METRIC)
    spec.setdefault("mode", "max")
    spec.setdefault("search", "optuna")
    spec.setdefault("num_samples", 4)
    spec.setdefault("max_concurrent_trials", 1)
    spec.setdefault("seed", 0)
    if spec["mode"] not in ("max", "min"):
        raise ConfigError(f"{path}: mode must be max or min")
    scheduler = spec.get("scheduler") or {}
    if not isinstance(scheduler, dict) or scheduler.get("type", "asha") not in ("asha", "none"):
        raise ConfigError(f"{path}: scheduler must be a mapping with type asha or none, got {scheduler!r}")
    if spec["search"] not in ("optuna", "grid"):
        raise ConfigError(f"{path}: search must be optuna or grid, got {spec['search']!r}")
    for key in ("num_samples", "max_concurrent_trials"):
        if not isinstance(spec[key], int) or spec[key] < 1:
            raise ConfigError(f"{path}: {key} must be a positive integer")
    space = spec.get("space")
    if not isinstance(space, dict) or not space:
        raise ConfigError(f"{path}: 'space' must map parameter names to distributions")
    for name, dist in space.items():
        if not isinstance(dist, dict) or len(dist) != 1 or next(iter(dist)) not in _DISTRIBUTIONS:
            raise ConfigError(f"{path}: {name}: expected one of {{{', '.join(_DISTRIBUTIONS)}: ...}}, got {dist!r}")
        kind, args = next(iter(dist.items()))
        if kind in ("loguniform", "uniform", "randint"):
            if not (isinstance(args, list) and len(args) == 2 and all(isinstance(a, (int, float)) for a in args)):
                raise ConfigError(f"{path}: {name}: {kind} takes [low, high]")
            if not args[0] < args[1] or (kind == "loguniform" and args[0] <= 0):
                raise ConfigError(f"{path}: {name}: {kind} needs 0 < low < high" if kind == "loguniform" else f"{path}: {name}: needs low < high")
        elif not (isinstance(args, list) and args):
            raise ConfigError(f"{path}: {name}: {kind} takes a non-empty list")
    return spec


def clip_space(space: dict[str, dict], limits: dict[str, tuple[float, float]]) -> None:
    """Clip ranges and values to what the corpus allows (UNA: r below half the vocabulary)."""
    for name, (lo, hi) in limits.items():
        if name not in space:
            continue
        kind, args = next(iter(space[name].items()))
        if kind in ("choice", "grid"):
            clipped = list(dict.fromkeys(min(max(v, lo), hi) for v in args))
        else:
            clipped = [max(args[0], lo), min(args[1], hi)]
            if clipped[0] >= clipped[1]:
                clipped = [min(clipped[0], hi) - 1, hi] if kind == "randint" else [hi * 0.5, hi]
        if clipped != args:
            print(f"note: {name} {kind} {args} clipped to {clipped} for this corpus", flush=True)
            space[name] = {kind: clipped}


def to_ray_space(space: dict[str, dict]) -> dict[str, Any]:
    from ray import tune

    out = {}
    for name, dist in space.items():
        kind, args = next(iter(dist.items()))
        out[name] = {
            "loguniform": lambda a: tune.loguniform(*a),
            "uniform": lambda a: tune.uniform(*a),
            "randint": lambda a: tune.randint(a[0], a[1] + 1),
            "choice": tune.choice,
            "grid": tune.grid_search,
        }[kind](args)
    return out


def check_space_against_config(base: TrainConfig, space: dict[str, dict]) -> None:
    """Every searched key must be a config key, and each distribution's end points valid values."""
    for name, dist in space.items():
        kind, args = next(iter(dist.items()))
        for value in args if kind in ("choice", "grid") else args[:2]:
            probe = TrainConfig.from_flat(base.flat())
            probe.update({name: value}, source=f"tune space {name}")
            probe.validate()


# ------------------------------------------------------------------------------------------------
# The trial


def trial_fn(config: dict[str, Any], sweep: dict[str, Any]) -> None:
    """One Tune trial: its MLflow child run around one Ray Train fit."""
    import ray.tune

    from platform.train import fit, run_tags

    ctx = ray.tune.get_context()
    flat = {**sweep["base"], **config}
    cfg = TrainConfig.from_flat(flat)
    uri = sweep["uri"]
    trial_id = ctx.get_trial_id()
    done = _finished_child_run(uri, sweep["parent"], trial_id)
    if done is not None:
        # A resumed sweep: this trial finished (its MLflow run says so) just before Tune could
        # record it. Report its result again instead of training it twice.
        best = done.data.metrics.get("best_" + DEV_METRIC)
        if best is not None:
            ray.tune.report({DEV_METRIC: best, "best_" + DEV_METRIC: best, "resumed_finished_trial": 1})
            return
    run_id = tracking.start_run(
        uri, sweep["experiment"], f"trial-{trial_id}", {**run_tags(cfg), "trial_id": trial_id}, parent_run_id=sweep["parent"]
    )
    # Only success is recorded here: a trial that ASHA stops is interrupted like one that fails,
    # so the driver, which knows which trials errored, ends the runs still RUNNING afterwards.
    tracking.log_params(uri, run_id, cfg.flat())
    # A trial may search parameters that change generated columns (SAN's scale): resolve its own,
    # from the content-keyed cache when they match the sweep's base.
    method = method_class(cfg.method)(cfg.params)
    columns = corpus_columns(method, sweep["columns"]["sentence"], use_ray=True, use_gpu=cfg.use_gpu, cpus=cfg.augment_cpus)
    fit(
        cfg,
        columns,
        uri=uri,
        run_id=run_id,
        storage=Path(sweep["storage"]) / "trials",
        name=trial_id,
        tune_callback=True,
    )
    tracking.end_run(uri, run_id, "FINISHED")


def _finished_child_run(uri: str, parent: str, trial_id: str):
    c = tracking.client(uri)
    exp = c.get_run(parent).info.experiment_id
    runs = c.search_runs(
        [exp], filter_string=f"tags.`mlflow.parentRunId` = '{parent}' and tags.trial_id = '{trial_id}' and attributes.status = 'FINISHED'"
    )
    return runs[0] if runs else None


# ------------------------------------------------------------------------------------------------
# Driver



def latest_sweep(storage: Path, method: str) -> Path | None:
    sweeps = sorted(p for p in storage.glob(f"{method}-sweep-*") if (p / SWEEP_STATE).is_file())
    return sweeps[-1] if sweeps else None


def _outcomes_callback():
    from ray import tune

    class TrialOutcomes(tune.Callback):
        """Remembers which trials errored (as opposed to being stopped by the scheduler)."""

        def __init__(self):
            self.errored: set[str] = set()

        def on_trial_error(self, iteration, trials, trial, **info):
            self.errored.add(trial.trial_id)

    return TrialOutcomes()


def expected_trials(spec: dict) -> int:
    expected = spec["num_samples"]
    for dist in spec["space"].values():
        kind, args = next(iter(dist.items()))
        if kind == "grid":
            expected *= len(args)
    return expected


def _interrupted(experiment_dir: Path, expected: int) -> bool:
    """Tune returns (instead of raising) after Ctrl-C, having saved its state; in memory it then
    marks the pending trials terminated, so the saved state is what tells: trials neither
    terminated nor errored, or fewer trials than the sweep asked for."""
    from ray.tune import ExperimentAnalysis

    trials = ExperimentAnalysis(str(experiment_dir)).trials
    return len(trials) < expected or any(t.status not in ("TERMINATED", "ERROR") for t in trials)


def finish_child_runs(uri: str, parent: str, errored: set[str], interrupted: bool = False) -> None:
    """No child run stays RUNNING: ASHA-stopped trials end FINISHED (tagged), errored ones FAILED,
    and after Ctrl-C the trials still running end KILLED (``--resume`` runs them again)."""
    c = tracking.client(uri)
    exp = c.get_run(parent).info.experiment_id
    for run in c.search_runs([exp], filter_string=f"tags.`mlflow.parentRunId` = '{parent}'"):
        if run.info.status == "RUNNING":
            tid = run.data.tags.get("trial_id")
            if interrupted:
                c.set_terminated(run.info.run_id, "KILLED")
            elif tid in errored:
                c.set_terminated(run.info.run_id, "FAILED")
            else:
                c.set_tag(run.info.run_id, "stopped_by_scheduler", "true")
                c.set_terminated(run.info.run_id, "FINISHED")


def trial_checkpoint(sweep_dir: Path, trial_id: str) -> str | None:
    """The trial's best kept checkpoint. Ray Train keeps the best by STS-B dev and the latest,
    also for a trial that the scheduler stopped mid-fit; the best is read from ``state.json``."""
    found = [p for p in (sweep_dir / "trials" / trial_id).glob("checkpoint_*") if (p / "state.json").is_file()]
    if not found:
        return None
    return str(max(found, key=lambda p: json.loads((p / "state.json").read_text(encoding="utf-8")).get(DEV_METRIC, -math.inf)))


def best_trial(uri: str, parent: str, metric: str, mode: str, sweep_dir: Path) -> dict[str, Any] | None:
    """The child run with the best ``best_<metric>``, and its checkpoint."""
    c = tracking.client(uri)
    exp = c.get_run(parent).info.experiment_id
    order = "DESC" if mode == "max" else "ASC"
    runs = c.search_runs(
        [exp],
        filter_string=f"tags.`mlflow.parentRunId` = '{parent}'",
        order_by=[f"metrics.best_{metric} {order}"],
    )
    for run in runs:
        checkpoint = trial_checkpoint(sweep_dir, run.data.tags.get("trial_id", ""))
        if f"best_{metric}" in run.data.metrics and checkpoint:
            c.set_tag(run.info.run_id, "best_checkpoint", checkpoint)
            return {"run": run, "checkpoint": checkpoint}
    return None


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m platform.tune", description=__doc__.splitlines()[0])
    p.add_argument("method")
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
    spec = load_space(args.method, args.profile, args.space, grid=args.grid)
    if args.num_samples is not None:
        if args.num_samples < 1:
            raise ConfigError(f"--num-samples must be >= 1, got {args.num_samples}")
        spec["num_samples"] = args.num_samples
    check_space_against_config(base, spec["space"])

    from platform.ray_env import init_ray
    from platform.train import preflight, prepare_corpus, resolve_storage, run_tags

    sentences = preflight(base, final_eval=base.final_eval)
    storage = resolve_storage(base)
    uri = tracking.tracking_uri()
    tracking.check_reachable(uri)
    init_ray()
    # Searched parameters are checked against the corpus per trial, after clipping the space.
    columns = prepare_corpus(base, sentences, check_state=False)
    method = method_class(base.method)(base.params)
    clip_space(spec["space"], method.space_limits(prepared_state(method, statistics_input(columns))))

    sweep_dir = latest_sweep(storage, args.method) if args.resume else None
    if args.resume and sweep_dir is None:
        raise UserError(f"--resume: no earlier {args.method} sweep under {storage}")
    if sweep_dir is not None:  # Tune restores the sweep as it was started (its num_samples)
        state = json.loads((sweep_dir / SWEEP_STATE).read_text())
        parent = state["parent_run_id"]
        tracking.client(uri).update_run(parent, status="RUNNING")
    else:
        sweep_dir = storage / f"{args.method}-sweep-{time.strftime('%Y%m%d-%H%M%S')}"
        sweep_dir.mkdir(parents=True)
        parent = tracking.start_run(uri, args.method, sweep_dir.name, {**run_tags(base), "sweep": "true"})
        tracking.log_params(uri, parent, {**base.flat(), **{f"space.{k}": v for k, v in spec["space"].items()}})
        state = {"parent_run_id": parent, "method": args.method, "expected_trials": expected_trials(spec)}
        (sweep_dir / SWEEP_STATE).write_text(json.dumps(state))

    status = "FAILED"
    outcomes = _outcomes_callback()
    try:
        results = run_sweep(base, spec, columns, uri, parent, sweep_dir, resume=args.resume, callbacks=[outcomes])
        # A restored Tuner brings its own copy of the callback: errors are read from the results too.
        outcomes.errored |= {r.metrics.get("trial_id") for r in results if r.error is not None and r.metrics}
        if _interrupted(sweep_dir / "tune", state.get("expected_trials", expected_trials(spec))):
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
            finish_child_runs(uri, parent, outcomes.errored, interrupted=status == "KILLED")
        finally:
            tracking.end_run(uri, parent, status)


def run_sweep(
    base: TrainConfig, spec: dict, columns: dict[str, list[str]], uri: str, parent: str, sweep_dir: Path, resume: bool,
    callbacks,
):
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    metric, mode = spec["metric"], spec["mode"]
    evals_per_trial = math.ceil(total_steps(base, len(columns["sentence"])) / base.eval_steps)
    sched = spec.get("scheduler") or {}
    scheduler = None
    if sched.get("type", "asha") == "asha":
        scheduler = ASHAScheduler(
            time_attr="training_iteration",
            max_t=evals_per_trial + 1,  # past the last evaluation: finished trials are not "stopped"
            grace_period=int(sched.get("grace_period", 1)),
            reduction_factor=float(sched.get("reduction_factor", 2)),
        )
    search_alg = None
    if spec["search"] == "optuna":
        from ray.tune.search import ConcurrencyLimiter
        from ray.tune.search.optuna import OptunaSearch

        search_alg = ConcurrencyLimiter(OptunaSearch(seed=spec["seed"]), max_concurrent=spec["max_concurrent_trials"])
    sweep = {
        "base": base.flat(),
        "uri": uri,
        "parent": parent,
        "experiment": base.method,
        "storage": str(sweep_dir),
        "columns": columns,
    }
    # The trial itself only waits on its Train workers: no CPU of its own (STACK-NOTES).
    # with_parameters puts the corpus in the object store once for all trials.
    trainable = tune.with_resources(tune.with_parameters(trial_fn, sweep=sweep), {"cpu": 0, "memory": 256 * 2**20})
    if resume and tune.Tuner.can_restore(str(sweep_dir / "tune")):
        tuner = tune.Tuner.restore(
            str(sweep_dir / "tune"), trainable=trainable, resume_errored=True, restart_errored=False,
            param_space=to_ray_space(spec["space"]),
        )
    else:
        tuner = tune.Tuner(
            trainable,
            param_space=to_ray_space(spec["space"]),
            tune_config=tune.TuneConfig(
                metric=metric,
                mode=mode,
                search_alg=search_alg,
                scheduler=scheduler,
                num_samples=spec["num_samples"],
                # The Optuna limiter already caps concurrency; a grid needs the cap here.
                max_concurrent_trials=None if search_alg is not None else spec["max_concurrent_trials"],
            ),
            run_config=tune.RunConfig(name="tune", storage_path=str(sweep_dir), callbacks=callbacks),
        )
    return tuner.fit()


def report_best(uri: str, parent: str, spec: dict, base: TrainConfig, sweep_dir: Path) -> None:
    from platform.train import finalize

    best = best_trial(uri, parent, spec["metric"], spec["mode"], sweep_dir)
    if best is None:
        raise UserError("no trial produced a checkpoint; see the trials' errors above")
    run = best["run"]
    c = tracking.client(uri)
    c.set_tag(parent, "best_run_id", run.info.run_id)
    c.set_tag(parent, "best_checkpoint", best["checkpoint"])
    scores = finalize(uri, run.info.run_id, best["checkpoint"], log_to=[parent]) if base.final_eval else {}
    searched = {k: run.data.params.get(k) for k in spec["space"]}
    print("\nbest trial")
    print(f"  parameters:   {searched}")
    metric = spec["metric"]
    print(f"  {metric}: {run.data.metrics['best_' + metric]:.2f}")
    if scores:
        print(f"  STS avg:      {scores.get('avg', float('nan')):.2f}")
    print(f"  checkpoint:   {best['checkpoint']}")
    print(f"  MLflow run:   {run.info.run_id} (parent {parent}, {tracking.redact(uri)})")


if __name__ == "__main__":
    raise SystemExit(main())
