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
import re
import time

from methods.recipe import NAMED
from platform import storage
from platform.config import TrainConfig, add_run_arguments, build_config, parse_tags, print_config
from platform.console import command_parser
from platform.errors import UserError, cli_main
from platform.run import unit
from platform.run.fit import release
from platform.tracking import hub, store
from platform.tracking.names import BEST, DEV_METRIC, PARENT_TAG, SEEDS_TAG, STORAGE_TAG
from platform.tracking.recorder import Run

HELP = f"""Train one configuration of a recipe and track it in MLflow.

METHOD is a paper's recipe ({', '.join(NAMED)}), or 'recipe' put together with
--set positives=... negatives=... loss=... aux=... . Values come from the recipe's defaults (the
papers'), then the profile, then the --config file, then --set; --print-config shows each value
and where it comes from. The best checkpoint by STS-B dev is evaluated on the 7 STS tasks beside
the untouched backbone, logged as the run's model and registered as <recipe>-encoder. --seeds N
trains N seeds, each in a run nested under this one. --resume RUN continues a stopped or killed
run from its latest checkpoint."""

RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


def parse_args(argv=None) -> argparse.Namespace:
    p = command_parser("python -m platform.train", HELP,
                       "python -m platform.train una --set alpha=5 --tag purpose=baseline")
    add_run_arguments(p, sweep=False)
    p.add_argument("--run-name", default=None,
                   help="the MLflow run's name, also its checkpoint folder under output_dir (default: METHOD-TIMESTAMP)")
    p.add_argument("--resume", metavar="RUN", default=None,
                   help="continue this run (its MLflow run name or id) from its latest checkpoint; give the same "
                        "--profile, --set and --seeds")
    p.add_argument("--print-config", action="store_true",
                   help="print the resolved configuration (as a --config file, each value with its source) and exit")
    return p.parse_args(argv)


@cli_main
def main(argv=None) -> int:
    args = parse_args(argv)
    cfg = build_config(args)
    extra_tags = parse_tags(args.tags)
    experiment = args.experiment or cfg.method
    if args.run_name is not None and not RUN_NAME.fullmatch(args.run_name):
        raise UserError(f"--run-name {args.run_name!r}: use letters, digits, '.', '_' and '-' (it names a folder)")
    if args.print_config:
        print_config(cfg, args.method)
        return 0
    seeds = len(unit.seed_values(cfg, args.seeds))
    if args.push_to_hub:
        hub.check_access(args.push_to_hub, cfg.final_eval)
    sentences = unit.preflight(cfg)
    uri = store.tracking_uri()
    resumed = resumable_run(uri, cfg, seeds, args.resume, experiment) if args.resume else None  # before Ray starts
    if not resumed and args.run_name and storage.exists(storage.join(cfg.output_dir, args.run_name)):
        raise UserError(f"--run-name {args.run_name}: {storage.join(cfg.output_dir, args.run_name)} exists; resume it "
                        f"(--resume {args.run_name}) or choose another name")
    unit.start(cfg)
    corpus = unit.prepare(cfg, sentences)
    run = (Run.reopen(uri, resumed) if resumed
           else new_run(uri, cfg, corpus, seeds, experiment, args.run_name, extra_tags))
    with run.closing():
        result = unit.run_configuration(cfg, corpus, run, storage_path=cfg.output_dir, name=run.name, seeds=seeds,
                                        final="full" if cfg.final_eval else "none")
        run.complete(result.checkpoint)
    for f in result.fits:  # the run is FINISHED: no optimizer state or latest checkpoint is needed again
        release(f.result.checkpoint)
    dev = result.dev
    if seeds > 1:
        print(f"run {run.id}: best {DEV_METRIC}={dev[BEST]:.2f} +- {dev[BEST + '_std']:.2f} over seeds "
              f"{', '.join(str(f.seed) for f in result.fits)}; best seed {result.best_seed.seed}, checkpoint {result.checkpoint}")
    else:
        print(f"run {run.id}: best {DEV_METRIC}={dev[BEST]:.2f}, checkpoint {result.checkpoint}")
    print(f"MLflow: {store.redact(uri)} (experiment {experiment!r}, run {run.id}, name {run.name})")
    print(f"browse it: {store.ui_command(uri, run.experiment_id, run.id)}")
    if args.push_to_hub:
        hub.push(uri, run.id, args.push_to_hub)
    return 0


def new_run(uri: str, cfg: TrainConfig, corpus, seeds: int, experiment: str | None = None, name: str | None = None,
            extra_tags: dict[str, str] | None = None) -> Run:
    """The configuration's MLflow run, and beside its checkpoints the state ``--resume`` reads."""
    name = name or f"{cfg.method}-{time.strftime('%Y%m%d-%H%M%S')}"
    location = storage.join(cfg.output_dir, name)
    tags = {**(extra_tags or {}), **unit.run_tags(cfg), STORAGE_TAG: location,
            **({SEEDS_TAG: str(seeds)} if seeds > 1 else {})}
    run = Run.create(uri, experiment or cfg.method, name, tags)
    run.log_config(cfg, {"seeds": seeds} if seeds > 1 else None)
    run.log_corpus(cfg.corpus, corpus.digest, corpus.num_sentences)
    unit.save_state(location, {"run_id": run.id, "config": cfg.flat(), "seeds": seeds})
    return run


def resumable_run(uri: str, cfg: TrainConfig, seeds: int, name_or_id: str, experiment: str | None = None) -> str:
    """The id of the run ``--resume`` names, once it is known to be resumable with ``cfg``."""
    found = store.find_run(uri, experiment or cfg.method, name_or_id)
    name = found.info.run_name
    if PARENT_TAG in found.data.tags:
        raise UserError(f"--resume {name_or_id}: run {name} is part of another run (a seed or a trial); resume that one")
    unit.check_stopped(f"run {name}", found)
    if STORAGE_TAG not in found.data.tags:
        raise UserError(f"--resume {name_or_id}: run {name} does not say where its checkpoints are; it cannot be resumed")
    state = unit.load_state(found.data.tags[STORAGE_TAG])
    changed = cfg.differences(state["config"])
    if state.get("seeds", 1) != seeds:
        changed.append(f"seeds ({state.get('seeds', 1)} -> {seeds})")
    unit.check_same(f"run {name}", changed, "--profile, --set and --seeds")
    return found.info.run_id


if __name__ == "__main__":
    raise SystemExit(main())
