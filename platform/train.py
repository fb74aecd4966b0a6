"""``python -m platform.train METHOD [--profile P] [--set key=value ...] [--seeds N] [--resume RUN]``:
one tracked configuration run of a recipe (a paper's name, or ``recipe --set negatives=... loss=...
aux=...``).

Preflight before Ray starts, the corpus prepared once, the configuration run (``platform.run.unit``:
each seed fitted by Ray Train, or in this process with ``--set runtime=process``; the best
checkpoint evaluated on the 7 STS tasks, exported and registered), all in one MLflow run (one run
nested under it per seed with ``--seeds N``). ``--resume RUN`` (its name or id) continues a run that
was stopped or killed, from its latest checkpoint, in the same MLflow run.
"""

from __future__ import annotations

import argparse
import time

from platform.config import METHODS, TrainConfig, available_profiles, parse_sets
from platform.errors import ConfigError, UserError, cli_main
from platform.run import storage, unit
from platform.tracking import store
from platform.tracking.runs import BEST, DEV_METRIC, STORAGE_TAG, Run


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m platform.train", description=__doc__.splitlines()[0])
    p.add_argument("method", help=f"one of {', '.join(METHODS)}")
    p.add_argument("--profile", default="local", help=f"one of {', '.join(available_profiles())}")
    p.add_argument("--set", dest="sets", action="append", metavar="KEY=VALUE", help="override a config value")
    p.add_argument("--seeds", type=int, default=1, metavar="N",
                   help="train N times (seeds seed, seed+1, ...) and report every score's mean +- std")
    p.add_argument("--resume", metavar="RUN", default=None,
                   help="continue this run (its MLflow run name or id) from its latest checkpoint; give the same "
                        "--profile, --set and --seeds")
    p.add_argument("--print-config", action="store_true", help="print the resolved configuration and exit")
    return p.parse_args(argv)


@cli_main
def main(argv=None) -> int:
    args = parse_args(argv)
    cfg = TrainConfig.build(args.method, args.profile, parse_sets(args.sets))
    if args.print_config:
        print(f"# {args.method}: {cfg.recipe.describe()}, profile {cfg.profile!r}; each value with where it comes from")
        for key, value, source in cfg.recipe_card():
            print(f"{key}: {value}  # {source}")
        return 0
    seeds = len(unit.seed_values(cfg, args.seeds))
    sentences = unit.preflight(cfg)
    uri = store.tracking_uri()
    resumed = resumable_run(uri, cfg, seeds, args.resume) if args.resume else None  # checked before Ray starts
    unit.start(cfg)
    corpus = unit.prepare(cfg, sentences)
    run = Run.reopen(uri, resumed) if resumed else new_run(uri, cfg, corpus, seeds)
    with run.closing():
        result = unit.run_configuration(cfg, corpus, run, storage_path=cfg.output_dir, name=run.name, seeds=seeds,
                                        final="full" if cfg.final_eval else "none")
        run.complete(result.checkpoint)
    dev = result.dev
    if seeds > 1:
        print(f"run {run.id}: best {DEV_METRIC}={dev[BEST]:.2f} +- {dev[BEST + '_std']:.2f} over seeds "
              f"{', '.join(str(f.seed) for f in result.fits)}; best seed {result.best.seed}, checkpoint {result.checkpoint}")
    else:
        print(f"run {run.id}: best {DEV_METRIC}={dev[BEST]:.2f}, checkpoint {result.checkpoint}")
    print(f"MLflow: {store.redact(uri)} (experiment {cfg.method!r}, run {run.id}, name {run.name})")
    return 0


def new_run(uri: str, cfg: TrainConfig, corpus, seeds: int) -> Run:
    """The configuration's MLflow run, and beside its checkpoints the state ``--resume`` reads."""
    name = f"{cfg.method}-{time.strftime('%Y%m%d-%H%M%S')}"
    location = storage.join(cfg.output_dir, name)
    tags = {**unit.run_tags(cfg), STORAGE_TAG: location, **({"seeds": str(seeds)} if seeds > 1 else {})}
    run = Run.create(uri, cfg.method, name, tags)
    run.log_params({**cfg.flat(), **({"seeds": seeds} if seeds > 1 else {})})
    run.log_corpus(cfg.corpus, corpus.digest, corpus.num_sentences)
    unit.save_state(location, {"run_id": run.id, "config": cfg.flat(), "seeds": seeds})
    return run


def resumable_run(uri: str, cfg: TrainConfig, seeds: int, name_or_id: str) -> str:
    """The id of the run ``--resume`` names, once it is known to be resumable with ``cfg``."""
    found = store.find_run(uri, cfg.method, name_or_id)
    name = found.info.run_name
    if store.PARENT_TAG in found.data.tags:
        raise UserError(f"--resume {name_or_id}: run {name} is part of another run (a seed or a trial); resume that one")
    if found.info.status == "FINISHED":
        raise UserError(f"--resume {name_or_id}: run {name} finished; there is nothing to resume")
    if found.info.status == "RUNNING" and store.driver_alive(found.data.tags.get(store.DRIVER_TAG)):
        raise UserError(f"--resume {name_or_id}: run {name} is still running (process "
                        f"{found.data.tags[store.DRIVER_TAG].split(':')[1]}); stop it first (Ctrl-C or kill)")
    if STORAGE_TAG not in found.data.tags:
        raise UserError(f"--resume {name_or_id}: run {name} does not say where its checkpoints are; it cannot be resumed")
    state = unit.load_state(found.data.tags[STORAGE_TAG])
    changed = cfg.differences(state["config"])
    if state.get("seeds", 1) != seeds:
        changed.append(f"seeds ({state.get('seeds', 1)} -> {seeds})")
    if changed:
        raise ConfigError(f"--resume {name_or_id}: run {name} was started with another configuration: "
                          f"{', '.join(changed)}; give the same --profile, --set and --seeds, or start a new run")
    return found.info.run_id


if __name__ == "__main__":
    raise SystemExit(main())
