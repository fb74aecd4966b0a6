"""The columns a method trains on, built once per corpus: ``sentence`` plus any column the
method generates once (UNA's ``paraphrase``, SAN's ``negative``), with Ray Data actors (a GPU each
where the cluster has GPUs), cached by content.

A cache file given by the user (e.g. ``paraphrase_cache``: Parquet with ``sentence`` and the
column) must hold exactly the corpus' sentences in order, or the run stops with a clear error
instead of pairing sentences with someone else's outputs.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from methods.base import Method
from platform.cache import cached, sentences_digest
from platform.data import DataError


def corpus_columns(
    method: Method, sentences: list[str], use_ray: bool = True, use_gpu: bool = False, cpus: float = 1.0
) -> dict[str, list[str]]:
    columns = {"sentence": sentences}
    for column, spec in method.generated_columns().items():
        if spec.get("file"):
            columns[column] = read_generated(Path(spec["file"]), sentences, column)
            continue
        key = {"generator": spec["generator"], **spec["kwargs"]}
        folder = cached(
            f"gen-{column}", sentences_digest(sentences), key,
            lambda tmp, column=column, spec=spec: generate_column(
                sentences, column, spec, tmp / f"{column}.parquet", use_ray, use_gpu, cpus
            ),
        )
        columns[column] = read_generated(folder / f"{column}.parquet", sentences, column)
    return columns


def statistics_input(columns: dict[str, list[str]]) -> list[str]:
    """What corpus statistics are fitted on: the sentences plus their paraphrases (UNA, Sec. 3)."""
    return columns["sentence"] + columns.get("paraphrase", [])


def _generator_class(path: str):
    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)


def generate_column(
    sentences: list[str], column: str, spec: dict, path: Path, use_ray: bool, use_gpu: bool, cpus: float = 1.0
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    cls = _generator_class(spec["generator"])
    if not use_ray:
        out = cls(**spec["kwargs"])({"sentence": sentences})
        pq.write_table(pa.table({"sentence": sentences, column: list(out[column])}), path)
        return
    import ray
    import ray.data

    gpus = ray.cluster_resources().get("GPU", 0) if use_gpu else 0
    actors = max(1, int(gpus)) if gpus else max(1, int(ray.cluster_resources().get("CPU", 1)) // 2)
    table = pa.table({"index": list(range(len(sentences))), "sentence": sentences})
    ds = ray.data.from_arrow(table).repartition(max(actors, min(len(sentences) // 256, 64)))
    ds = ds.map_batches(
        cls,
        fn_constructor_kwargs=spec["kwargs"],
        batch_size=64,
        batch_format="numpy",
        compute=ray.data.ActorPoolStrategy(size=actors),
        num_gpus=1 if gpus else 0,
        num_cpus=cpus,  # fractional inside sweeps, where trials' Train workers may hold every CPU
    )
    df = ds.to_pandas().sort_values("index")
    pq.write_table(pa.table({"sentence": list(df["sentence"]), column: list(df[column])}), path)


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
