"""Everything that runs on Ray Data: the epochs that feed the training workers (a fresh uniform
permutation of the corpus each, with the recipe's per-epoch columns made on the CPUs), the
augmentation of a corpus in order (``platform.augment``), the once-per-corpus generation of
columns by actors, and cutting a table into blocks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from methods.ingredients import import_by_name
from methods.recipe import Recipe


class BoundAugment:
    """``recipe.augment`` of epoch ``epoch`` with the corpus statistics, for ``map_batches``; with
    ``corpus`` (an object-store reference to the corpus table) its input is a batch of row numbers,
    and the rows are gathered from the table first. Batches keep their ``row`` column: the epoch's
    draws are keyed by corpus row.

    The statistics (and the table) travel as object-store references that each worker process
    fetches once (``_fetch``): per-process caches (UNA's word look-up) last across tasks, and
    Ray Data does not copy the state into its plan at every execution (benchmarks/RESULTS.md).
    """

    def __init__(self, recipe: Recipe, states_ref, corpus_ref=None, epoch: int = 0):
        self.recipe, self.state_ref, self.corpus_ref, self.epoch = recipe, states_ref, corpus_ref, epoch

    def __call__(self, batch):
        if self.corpus_ref is not None:
            rows = _fetch(self.corpus_ref).take(np.asarray(batch["row"]))
            batch = {"row": np.asarray(batch["row"]),
                     **{name: rows.column(name).to_numpy(zero_copy_only=False) for name in rows.column_names}}
        if not self.recipe.augments_per_epoch:
            return batch
        return self.recipe.augment(batch, _fetch(self.state_ref), self.epoch)

    def __repr__(self) -> str:
        return f"BoundAugment({self.recipe.spec.describe()})"


_STATES: dict[str, Any] = {}
_KEEP = 8  # concurrent trials of a sweep share worker processes; each has its own references


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
    """The corpus in order -> the recipe's per-epoch columns, one task per block across the CPUs
    (just the corpus rows when nothing is made per epoch): ``platform.augment``'s pipeline."""
    import pyarrow as pa
    import ray
    import ray.data

    _one_operator_context()
    table = pa.table({"row": np.arange(len(columns["sentence"])), **columns})
    ds = arrow_blocks(table, min(table.num_rows // batch_size, 64))
    if recipe.augments_per_epoch:
        ds = ds.map_batches(BoundAugment(recipe, ray.put(states)), batch_format="numpy", batch_size=batch_size,
                            num_cpus=num_cpus)
    return ds.drop_columns(["row"])


def epoch_datasets(recipe: Recipe, columns: dict[str, list[str]], states: dict[str, Any], epochs: int, seed: int,
                   batch_size: int = 1024, num_cpus: float | None = None) -> dict[str, Any]:
    """``{"train_<epoch>": Dataset}``: each epoch a uniform permutation of the whole corpus, seeded
    with ``seed + epoch`` as the local pipeline's (SimCSE samples batches uniformly from the whole
    corpus, reshuffled every epoch; wiki1m is stored in article order). The permutation's row
    numbers are cut into blocks on the driver; each block's task gathers its rows from the corpus
    table (one object-store reference, fetched once per worker process) and adds the recipe's
    per-epoch columns, so the epoch still streams to the training workers while the CPUs augment."""
    import pyarrow as pa
    import ray
    import ray.data

    _one_operator_context()
    # Training prints one line per evaluation; an epoch's stream is not a task the user waits on.
    ray.data.DataContext.get_current().enable_progress_bars = False
    corpus_ref, states_ref = ray.put(pa.table(columns)), ray.put(states)
    n = len(columns["sentence"])
    blocks = max(1, min(n // batch_size, 64))
    out = {}
    for epoch in range(epochs):
        rows = pa.table({"row": np.random.default_rng(seed + epoch).permutation(n)})
        out[f"train_{epoch}"] = arrow_blocks(rows, blocks).map_batches(
            BoundAugment(recipe, states_ref, corpus_ref, epoch), batch_format="numpy", batch_size=batch_size,
            num_cpus=num_cpus,
        )
    return out


def _one_operator_context() -> None:
    import ray.data

    # Ray Data's per-operator CPU reservation only idles CPUs with one map operator (RESULTS.md).
    context = ray.data.DataContext.get_current()
    context.op_resource_reservation_enabled = False
    # Batches in the epoch's order: a run is a function of its seed, not of which task ended first.
    context.execution_options.preserve_order = True
    # One progress bar per dataset, not one per operator besides it (a trial turns them all off).
    context.enable_operator_progress_bars = False


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
    # Blocks cut here: a repartition task would wait forever for a CPU the actors hold. Small ones
    # (about a second of work each) so the actors finish together.
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
