"""``python -m platform.augment METHOD --corpus PATH [--out DIR] [--profile P] [--set k=v ...]``.

Runs a recipe's augmentation over a corpus with Ray Data (``map_batches`` across the CPUs) and
writes the result as Parquet: the columns the recipe trains on, e.g. for UNA ``sentence`` and
``una_negative``. The output folder appears complete or not at all (written beside it, then
renamed). ``--out`` is refused when it is a non-empty folder this platform did not write: a
re-run replaces its own earlier output and nothing else. Prints the throughput.
"""

from __future__ import annotations

import time
from pathlib import Path

from platform import storage
from platform.console import command_parser
from platform.config import METHODS, TrainConfig, available_profiles, parse_sets
from platform.data import read_corpus, resolve_corpus
from platform.data.columns import check_given_columns, resolve_local_models
from platform.data.pipeline import augment_dataset
from platform.errors import UserError, cli_main, writable_dir
from platform.run import unit

OUT_ADVICE = "choose a new or empty folder for --out"


@cli_main
def main(argv=None) -> int:
    p = command_parser("python -m platform.augment", __doc__, "python -m platform.augment una --corpus wiki1m_for_simcse.txt --out una_negatives/")
    p.add_argument("method", help=f"one of {', '.join(METHODS)}")
    p.add_argument("--corpus", required=True, help="a corpus path or a file name under $PLATFORM_DATA_DIR/corpus")
    p.add_argument("--out", default=None, help="output folder (default outputs/augment/METHOD-<corpus name>)")
    p.add_argument("--profile", default="local", help=f"one of {', '.join(available_profiles())}")
    p.add_argument("--set", dest="sets", action="append", metavar="KEY=VALUE")
    p.add_argument("--num-cpus", type=int, default=None, help="CPUs for a local Ray (default: all)")
    args = p.parse_args(argv)

    cfg = TrainConfig.build(args.method, args.profile, {**parse_sets(args.sets), "corpus": args.corpus})
    resolve_local_models(cfg.ingredient_params)
    recipe = cfg.build_recipe()
    recipe.preflight()
    if not recipe.augments_per_epoch and not recipe.generated_columns():
        raise UserError(f"method {cfg.method!r} has no augmentation to generate")
    corpus_path = resolve_corpus(cfg.corpus)
    out = Path(args.out or Path("outputs") / "augment" / f"{cfg.method}-{corpus_path.name.split('.')[0]}").resolve()
    storage.check_replaceable(out, OUT_ADVICE)
    writable_dir(out.parent)
    sentences = read_corpus(corpus_path, limit=cfg.max_sentences or None)
    check_given_columns(recipe, sentences)
    recipe.check_corpus(sentences)

    unit.start(cfg, num_cpus=args.num_cpus)

    t0 = time.perf_counter()
    corpus = unit.prepare(cfg, sentences)
    t_prepare = time.perf_counter() - t0
    tmp = storage.staging(out)
    t1 = time.perf_counter()
    try:
        augment_dataset(recipe, corpus.columns, corpus.statistics).write_parquet(str(tmp))
    except BaseException as exc:
        storage.discard(tmp)
        if isinstance(exc, OSError):
            raise UserError(f"cannot write {tmp}: {exc}") from None
        raise
    seconds = time.perf_counter() - t1
    storage.install(tmp, out, "platform.augment", OUT_ADVICE)
    print(f"{len(sentences)} sentences -> {out}")
    print(f"prepare (generated columns and corpus statistics, cached): {t_prepare:.1f}s; augmentation with Ray Data: "
          f"{seconds:.1f}s = {len(sentences) / seconds:,.0f} sentences/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
