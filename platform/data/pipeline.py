"""Everything that runs on Ray Data: the per-epoch augmentation stage that feeds the training
workers, the once-per-corpus generation of columns by actors, and cutting a corpus into blocks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from methods.ingredients import import_by_name
from methods.recipe import Recipe


class BoundAugment:
    """``recipe.augment`` with the corpus statistics, for ``map_batches``.

    The statistics travel as one object-store reference and each worker process fetches and unpickles
    it once (``_fetch``), instead of with every task; the method's per-process caches (UNA's word
    look-up) then last across tasks. Passing the state itself in ``fn_kwargs`` also made Ray Data
    convert the whole table (a dataclass) into its topology metadata on the driver at every
    execution: 0.5 s per epoch for the 70k-term UNA table (benchmarks/RESULTS.md).
    """

    def __init__(self, recipe: Recipe, states: dict[str, Any]):
        import ray

        self.recipe = recipe
        self.state_ref = ray.put(states)

    def __call__(self, batch):
        return self.recipe.augment(batch, _fetch(self.state_ref))

    def __repr__(self) -> str:
        return f"BoundAugment({self.recipe.spec.describe()})"


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


def augment_dataset(recipe: Recipe, columns: dict[str, list[str]], states: dict[str, Any], batch_size: int = 4096,
                    num_cpus: float | None = None):
    """The Ray Data pipeline: corpus rows -> the recipe's per-epoch columns, one task per block
    across the CPUs (just the corpus rows when nothing is made per epoch)."""
    import pyarrow as pa
    import ray.data

    # Ray Data reserves part of the CPUs for each operator so that long pipelines cannot starve
    # one another; with this single map operator that reservation only idles CPUs (measured on
    # 2 CPUs: 1.2 tasks in flight with it, 1.85 without; benchmarks/RESULTS.md).
    ray.data.DataContext.get_current().op_resource_reservation_enabled = False
    table = pa.table(columns)
    ds = arrow_blocks(table, min(table.num_rows // batch_size, 64))
    if not recipe.augments_per_epoch:
        return ds
    return ds.map_batches(
        BoundAugment(recipe, states), batch_format="numpy", batch_size=batch_size, num_cpus=num_cpus
    )


BLOCK_SENTENCES = 512
MAX_BLOCKS = 4096  # a corpus of millions of sentences stays at thousands of tasks, not tens of thousands


def generate_columns(
    sentences: list[str], columns: list[str], generator: str, kwargs: dict, path: Path, use_ray: bool,
    use_gpu: bool, cpus: float = 1.0, cpu_bound: bool = False,
) -> None:
    """Run ``generator(**kwargs)`` over the sentences (in process, or as Ray Data actors) and
    write ``sentence`` plus ``columns`` to ``path`` in corpus order."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    cls = import_by_name(generator)
    if not use_ray:
        out = cls(**kwargs)({"sentence": sentences})
        pq.write_table(pa.table({"sentence": sentences, **{c: list(out[c]) for c in columns}}), path)
        return
    import ray
    import ray.data

    gpus = ray.cluster_resources().get("GPU", 0) if use_gpu and not cpu_bound else 0
    cluster_cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
    if gpus:
        actors = max(1, int(gpus))
    else:  # model-based generators use a few threads each; pure-Python ones one CPU each
        actors = cluster_cpus if cpu_bound else max(1, cluster_cpus // 2)
    table = pa.table({"index": list(range(len(sentences))), "sentence": sentences})
    # Blocks made here, not by a repartition task: with one actor per CPU holding every CPU, a
    # task would wait forever for a CPU. Small blocks (about a second of 8-aug work on one core)
    # so the actors finish together: each actor has up to two blocks queued, and with 64 blocks
    # of the 163k corpus one actor went on alone for 4 s at the end.
    ds = arrow_blocks(table, max(actors, min(-(-len(sentences) // BLOCK_SENTENCES), MAX_BLOCKS)))
    ds = ds.map_batches(
        cls,
        fn_constructor_kwargs=kwargs,
        batch_size=64 if not cpu_bound else 256,
        batch_format="numpy",
        compute=ray.data.ActorPoolStrategy(size=actors),
        num_gpus=1 if gpus else 0,
        num_cpus=cpus,  # fractional inside sweeps, where trials' Train workers may hold every CPU
    )
    # Collected and reordered as Arrow (C++), not as Python strings: on a small machine the
    # driver shares the CPUs with the actors.
    table = pa.concat_tables(ray.get(ds.to_arrow_refs())).sort_by("index")
    pq.write_table(table.select(["sentence", *columns]), path)


def arrow_blocks(table, blocks: int):
    """A Ray Dataset of ``table`` in ``blocks`` nearly equal blocks, cut here on the driver rather
    than by a repartition task: no extra pass over the data, and no task left waiting for a CPU
    while actors or augmentation tasks hold them all."""
    import ray.data

    size = max(1, -(-table.num_rows // max(1, blocks)))
    return ray.data.from_arrow([table.slice(i, size) for i in range(0, table.num_rows, size)])
