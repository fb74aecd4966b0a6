"""The columns a method trains on, built once per corpus: ``sentence`` and, for methods with
paraphrase positives, ``paraphrase`` (generated with Ray Data actors, cached by content).

A cache given by the user (``paraphrase_cache``: a Parquet file with ``sentence`` and
``paraphrase``) must hold exactly the corpus' sentences in order, or the run stops with a clear
error instead of pairing sentences with someone else's paraphrases.
"""

from __future__ import annotations

from pathlib import Path

from methods.base import Method
from platform.cache import cached, sentences_digest
from platform.data import DataError

PARAPHRASE_FILE = "paraphrases.parquet"


def corpus_columns(method: Method, sentences: list[str], use_ray: bool = True, use_gpu: bool = False) -> dict[str, list[str]]:
    spec = method.paraphrase_spec()
    if spec is None:
        return {"sentence": sentences}
    if spec.get("cache"):
        return {"sentence": sentences, "paraphrase": read_paraphrases(Path(spec["cache"]), sentences)}
    params = {k: spec[k] for k in ("model", "num_beams", "max_length")}
    folder = cached(
        "paraphrase", sentences_digest(sentences), params,
        lambda tmp: generate_paraphrases(sentences, params, tmp / PARAPHRASE_FILE, use_ray, use_gpu),
    )
    return {"sentence": sentences, "paraphrase": read_paraphrases(folder / PARAPHRASE_FILE, sentences)}


def statistics_input(columns: dict[str, list[str]]) -> list[str]:
    """What corpus statistics are fitted on: the sentences plus their paraphrases (UNA, Sec. 3)."""
    return columns["sentence"] + columns.get("paraphrase", [])


def generate_paraphrases(sentences: list[str], params: dict, path: Path, use_ray: bool, use_gpu: bool) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from methods.paraphrase import Paraphraser

    table = pa.table({"index": list(range(len(sentences))), "sentence": sentences})
    if not use_ray:
        out = Paraphraser(params["model"], params["num_beams"], params["max_length"])(
            {"sentence": sentences, "index": list(range(len(sentences)))}
        )
        pq.write_table(pa.table({"sentence": sentences, "paraphrase": list(out["paraphrase"])}), path)
        return
    import ray
    import ray.data

    gpus = ray.cluster_resources().get("GPU", 0) if use_gpu else 0
    actors = max(1, int(gpus)) if gpus else max(1, int(ray.cluster_resources().get("CPU", 1)) // 2)
    ds = ray.data.from_arrow(table).repartition(max(actors, min(len(sentences) // 256, 64)) or 1)
    ds = ds.map_batches(
        Paraphraser,
        fn_constructor_kwargs={"model": params["model"], "num_beams": params["num_beams"], "max_length": params["max_length"]},
        batch_size=64,
        batch_format="numpy",
        compute=ray.data.ActorPoolStrategy(size=actors),
        num_gpus=1 if gpus else 0,
    )
    df = ds.to_pandas().sort_values("index")
    pq.write_table(pa.table({"sentence": list(df["sentence"]), "paraphrase": list(df["paraphrase"])}), path)


def read_paraphrases(path: Path, sentences: list[str]) -> list[str]:
    import pyarrow.parquet as pq

    if not path.is_file():
        raise DataError(f"paraphrase cache {path} not found")
    try:
        table = pq.read_table(path, columns=["sentence", "paraphrase"])
    except Exception as exc:  # not Parquet, or missing columns
        raise DataError(f"paraphrase cache {path} is not a Parquet file with columns sentence, paraphrase ({exc})") from None
    cached_sentences = table.column("sentence").to_pylist()
    if len(cached_sentences) != len(sentences):
        raise DataError(
            f"paraphrase cache {path} does not match the corpus: {len(cached_sentences)} rows for {len(sentences)} sentences"
        )
    for i, (a, b) in enumerate(zip(cached_sentences, sentences)):
        if a != b:
            raise DataError(f"paraphrase cache {path} does not match the corpus: row {i + 1} is {a[:40]!r}, corpus has {b[:40]!r}")
    return [str(p) for p in table.column("paraphrase").to_pylist()]
