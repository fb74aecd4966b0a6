"""``python -m platform.augment METHOD --corpus PATH [--out DIR] [--profile P] [--set k=v ...]``.

Runs the method's augmentation over a corpus with Ray Data (``map_batches`` across the CPUs) and
writes the result as Parquet: for UNA the columns ``sentence`` and ``negative``. The output folder
appears complete or not at all (written beside it, then renamed). Prints the throughput.
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path
from typing import Any

from methods.base import Method, method_class
from platform.cache import prepared_state, replace_dir
from platform.corpus import arrow_blocks, corpus_columns, statistics_input
from platform.config import TrainConfig, available_profiles, parse_sets
from platform.data import read_corpus, resolve_corpus
from platform.errors import UserError, cli_main, writable_dir
from platform.local_models import resolve_local_models


class BoundAugment:
    """``method.augment`` with the corpus state, for ``map_batches``.

    The state travels as one object-store reference and each worker process fetches and unpickles
    it once (``_fetch``), instead of with every task; the method's per-process caches (UNA's word
    look-up) then last across tasks. Passing the state itself in ``fn_kwargs`` also made Ray Data
    convert the whole table (a dataclass) into its topology metadata on the driver at every
    execution: 0.5 s per epoch for the 70k-term UNA table (benchmarks/RESULTS.md).
    """

    def __init__(self, method: Method, state):
        import ray

        self.method = method
        self.state_ref = ray.put(state)

    def __call__(self, batch):
        return self.method.augment(batch, _fetch(self.state_ref))

    def __repr__(self) -> str:
        return f"BoundAugment({type(self.method).__name__})"


_STATES: dict[str, Any] = {}
_KEEP = 4  # concurrent trials of a sweep share worker processes; each has its own reference


def _fetch(ref):
    key = ref.hex()
    if key not in _STATES:
        import ray

        while len(_STATES) >= _KEEP:
            _STATES.pop(next(iter(_STATES)))  # the oldest: a finished run's
        _STATES[key] = ray.get(ref)
    return _STATES[key]


def augment_dataset(
    method: Method, columns: dict[str, list[str]], state, batch_size: int = 4096, num_cpus: float | None = None
):
    """The Ray Data pipeline: corpus rows -> the method's columns, one task per block across the CPUs."""
    import pyarrow as pa
    import ray.data

    # Ray Data reserves part of the CPUs for each operator so that long pipelines cannot starve
    # one another; with this single map operator that reservation only idles CPUs (measured on
    # 2 CPUs: 1.2 tasks in flight with it, 1.85 without; benchmarks/RESULTS.md).
    ray.data.DataContext.get_current().op_resource_reservation_enabled = False
    table = pa.table(columns)
    ds = arrow_blocks(table, min(table.num_rows // batch_size, 64))
    if type(method).augment is Method.augment:  # generated once per corpus (e.g. SAN): nothing per epoch
        return ds
    return ds.map_batches(
        BoundAugment(method, state), batch_format="numpy", batch_size=batch_size, num_cpus=num_cpus
    )


@cli_main
def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m platform.augment", description=__doc__.splitlines()[0])
    p.add_argument("method")
    p.add_argument("--corpus", required=True, help="a corpus path or a file name under $PLATFORM_DATA_DIR/corpus")
    p.add_argument("--out", default=None, help="output folder (default outputs/augment/METHOD-<corpus name>)")
    p.add_argument("--profile", default="local", help=f"one of {', '.join(available_profiles())}")
    p.add_argument("--set", dest="sets", action="append", metavar="KEY=VALUE")
    p.add_argument("--num-cpus", type=int, default=None, help="CPUs for a local Ray (default: all)")
    args = p.parse_args(argv)

    cfg = TrainConfig.build(args.method, args.profile, {**parse_sets(args.sets), "corpus": args.corpus})
    resolve_local_models(cfg.params)
    method = method_class(cfg.method)(cfg.params)
    method.preflight()
    if type(method).augment is Method.augment and not method.generated_columns():
        raise UserError(f"method {cfg.method!r} has no augmentation to generate")
    corpus = resolve_corpus(cfg.corpus)
    out = Path(args.out or Path("outputs") / "augment" / f"{cfg.method}-{corpus.name.split('.')[0]}").resolve()
    writable_dir(out.parent)
    sentences = read_corpus(corpus, limit=cfg.max_sentences or None)

    from platform.ray_env import init_ray

    init_ray(num_cpus=args.num_cpus)
    t0 = time.perf_counter()
    columns = corpus_columns(method, sentences, use_ray=True, use_gpu=cfg.use_gpu, cpus=cfg.augment_cpus)
    state = prepared_state(method, statistics_input(columns))
    method.check_state(state)
    t_prepare = time.perf_counter() - t0
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    t1 = time.perf_counter()
    try:
        augment_dataset(method, columns, state).write_parquet(str(tmp))
    except Exception as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, OSError):
            raise UserError(f"cannot write {tmp}: {exc}") from None
        raise
    seconds = time.perf_counter() - t1
    replace_dir(tmp, out)
    print(f"{len(sentences)} sentences -> {out}")
    print(f"prepare (paraphrases and corpus statistics, cached): {t_prepare:.1f}s; augmentation with Ray Data: {seconds:.1f}s "
          f"= {len(sentences) / seconds:,.0f} sentences/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
