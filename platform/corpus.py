"""The columns a method trains on, built once per corpus: ``sentence`` plus any column the
method generates once (UNA's ``paraphrase``, SAN's ``negative``, AugCSE's ``aug_<name>``), with Ray Data actors (a GPU each
where the cluster has GPUs), cached by content.

A cache file given by the user (e.g. ``paraphrase_cache``: Parquet with ``sentence`` and the
column) must hold exactly the corpus' sentences in order, or the run stops with a clear error
instead of pairing sentences with someone else's outputs.
"""

from __future__ import annotations

import importlib
import json
import tempfile
from pathlib import Path

from methods.base import Method
from platform.cache import cache_entry, cached, sentences_digest
from platform.data import DataError


def corpus_columns(
    method: Method, sentences: list[str], use_ray: bool = True, use_gpu: bool = False, cpus: float = 1.0
) -> dict[str, list[str]]:
    columns = {"sentence": sentences}
    digest = sentences_digest(sentences)
    specs = method.generated_columns()
    missing: dict[str, list[str]] = {}  # one generation pass per generator (+ group)
    for column, spec in specs.items():
        if spec.get("file"):
            columns[column] = read_generated(Path(spec["file"]), sentences, column)
            continue
        folder = cache_entry(f"gen-{column}", digest, _key(spec))
        if (folder / "COMPLETE").is_file():
            columns[column] = read_generated(folder / f"{column}.parquet", sentences, column)
            continue
        group = json.dumps([spec["generator"], spec.get("group")], sort_keys=True) if "group" in spec else column
        missing.setdefault(group, []).append(column)

    for names in missing.values():
        spec = specs[names[0]]
        with tempfile.TemporaryDirectory(prefix="generated-") as tmp:
            path = Path(tmp) / "generated.parquet"
            if "group" in spec:
                generator_kwargs = {"columns": names, **spec["group"]}
            else:
                generator_kwargs = spec["kwargs"]
            generate_columns(sentences, names, spec["generator"], generator_kwargs, path, use_ray, use_gpu, cpus,
                             cpu_bound=bool(spec.get("cpu_bound")))
            table = _read_parquet(path)
            for column in names:
                part = table.select(["sentence", column])
                folder = cached(
                    f"gen-{column}", digest, _key(specs[column]),
                    lambda tmp_dir, part=part, column=column: _write_parquet(part, tmp_dir / f"{column}.parquet"),
                )
                columns[column] = read_generated(folder / f"{column}.parquet", sentences, column)
    return columns


def _key(spec: dict) -> dict:
    return {"generator": spec["generator"], **spec["kwargs"]}


def _read_parquet(path: Path):
    import pyarrow.parquet as pq

    return pq.read_table(path)


def _write_parquet(table, path: Path) -> None:
    import pyarrow.parquet as pq

    pq.write_table(table, path)


def statistics_input(columns: dict[str, list[str]]) -> list[str]:
    """What corpus statistics are fitted on: the sentences plus their paraphrases (UNA, Sec. 3)."""
    return columns["sentence"] + columns.get("paraphrase", [])


def _generator_class(path: str):
    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)


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

    cls = _generator_class(generator)
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


def read_generated(path: Path, sentences: list[str], column: str) -> list[str]:
    import pyarrow.parquet as pq

    if not path.is_file():
        raise DataError(f"{column} cache {path} not found")
    try:
        table = pq.read_table(path, columns=["sentence", column])
    except Exception as exc:  # not Parquet, or missing columns
        raise DataError(f"{column} cache {path} is not a Parquet file with columns sentence, {column} ({exc})") from None
    cached_sentences = table.column("sentence").to_pylist()
    if len(cached_sentences) != len(sentences):
        raise DataError(
            f"{column} cache {path} does not match the corpus: {len(cached_sentences)} rows for {len(sentences)} sentences"
        )
    for i, (a, b) in enumerate(zip(cached_sentences, sentences)):
        if a != b:
            raise DataError(f"{column} cache {path} does not match the corpus: row {i + 1} is {a[:40]!r}, corpus has {b[:40]!r}")
    return [str(p) for p in table.column(column).to_pylist()]
