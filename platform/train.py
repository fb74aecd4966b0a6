"""``python -m platform.train METHOD [--profile P] [--set key=value ...] [--print-config]``: one
tracked run of a recipe (a paper's name, or ``recipe --set negatives=... loss=... aux=...``).

Preflight before Ray starts, the corpus prepared once, one fit (Ray Train, or this process with
``--set runtime=process``), the best checkpoint (by STS-B dev) evaluated on the 7 STS tasks, and
everything logged to one MLflow run (``platform.run.job``). ``--seeds N`` fits N seeds, each in a
run nested under that one, which gets every score's mean and standard deviation.
"""

from __future__ import annotations

import argparse
import time

from platform import tracking
from platform.config import METHODS, TrainConfig, available_profiles, parse_sets
from platform.errors import UserError, cli_main
from platform.run import job
from platform.run.loop import DEV_METRIC


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m platform.train", description=__doc__.splitlines()[0])
    p.add_argument("method", help=f"one of {', '.join(METHODS)}")
    p.add_argument("--profile", default="local", help=f"one of {', '.join(available_profiles())}")
    p.add_argument("--set", dest="sets", action="append", metavar="KEY=VALUE", help="override a config value")
    p.add_argument("--seeds", type=int, default=1, metavar="N",
                   help="train N times (seeds seed, seed+1, ...) and report every score's mean +- std")
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
    seeds = job.seed_values(cfg, args.seeds)
    sentences = job.preflight(cfg)
    uri = tracking.tracking_uri()
    job.start(cfg)
    corpus = job.prepare(cfg, sentences)
    name = f"{cfg.method}-{time.strftime('%Y%m%d-%H%M%S')}"
    tags = {**job.run_tags(cfg), **({"seeds": str(len(seeds))} if len(seeds) > 1 else {})}
    run_id = tracking.start_run(uri, cfg.method, name, tags)
    status = "FAILED"
    try:
        tracking.log_params(uri, run_id, {**cfg.flat(), **({"seeds": len(seeds)} if len(seeds) > 1 else {})})
        tracking.log_corpus(uri, run_id, cfg.corpus, corpus.digest, corpus.num_sentences)
        if len(seeds) > 1:  # one nested run per seed; this run gets the means and stds
            runs = job.fit_seeds(cfg, corpus, len(seeds), uri=uri, parent=run_id, experiment=cfg.method,
                                 storage_path=cfg.output_dir, name=name)
            if cfg.final_eval:
                job.finalize_seeds(uri, run_id, runs)
            best = job.best_seed(runs)
            dev = job.seed_dev(runs)
            status = "FINISHED"
            print(f"run {run_id}: best {DEV_METRIC}={dev['best_' + DEV_METRIC]:.2f} +- "
                  f"{dev['best_' + DEV_METRIC + '_std']:.2f} over seeds "
                  f"{', '.join(str(r.seed) for r in runs)}; best seed {best.seed}, checkpoint {best.fit.checkpoint}")
            print(f"MLflow: {tracking.redact(uri)} (experiment {cfg.method!r}, run {run_id})")
            return 0
        out = job.fit(cfg, corpus, uri=uri, run_id=run_id, storage_path=cfg.output_dir, name=name)
        if out.checkpoint is None:
            raise UserError("training finished without a checkpoint (no STS-B dev evaluation ran)")
        tracking.set_tags(uri, run_id, {"best_checkpoint": out.checkpoint})
        if cfg.final_eval:
            job.finalize(uri, run_id, out.checkpoint)
        status = "FINISHED"
        print(f"run {run_id}: best {DEV_METRIC}={out.best_dev:.2f}, checkpoint {out.checkpoint}")
        print(f"MLflow: {tracking.redact(uri)} (experiment {cfg.method!r}, run {run_id})")
        return 0
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    finally:
        tracking.end_run(uri, run_id, status)


if __name__ == "__main__":
    raise SystemExit(main())
