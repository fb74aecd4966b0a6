"""The columns a recipe trains on and the corpus statistics it needs, built once per corpus and
cached by content: ``sentence`` plus every column an ingredient generates once (paraphrases, SAN's
negatives, AugCSE's ``aug_<name>``; Ray Data actors, a GPU each where the cluster has GPUs), and
each ingredient's statistics (UNA's TF-IDF table, fitted on the sentences and their paraphrases);
and the local stand-ins for what the ingredients name (NLTK's data, a tiny random MLM).

A cache file given by the user (e.g. ``paraphrase_cache``: Parquet with ``sentence`` and the
column) must hold exactly the corpus' sentences in order, or the run stops with a clear error
instead of pairing sentences with someone else's outputs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
from pathlib import Path
from typing import Any

import torch

from methods.encoder import load_tokenizer
from methods.ingredients import CorpusStatistics, GeneratedColumn
from methods.recipe import Recipe
from platform import settings
from platform.data.pipeline import Generation, embed, generated_blocks
from platform.storage import building, cache_entry, cache_root, cached, sentences_digest
from platform.errors import DataError


@dataclasses.dataclass
class CorpusData:
    """What every worker of a run needs from the corpus: the columns (Arrow arrays: a million
    sentences of eight augmentations are ~1 GB as Arrow, several as Python strings) and the
    corpus statistics (by ingredient name: UNA's TF-IDF table)."""

    columns: dict[str, Any]
    statistics: dict[str, Any]
    digest: str = ""  # sha256 of the sentences: the key of their cached columns (MLflow's dataset digest)

    @property
    def num_sentences(self) -> int:
        return len(self.columns["sentence"])


def prepare_corpus(recipe: Recipe, sentences: list[str], use_ray: bool, use_gpu: bool = False,
                   cpus: float = 1.0, generate: bool = True) -> CorpusData:
    digest = sentences_digest(sentences)
    columns = corpus_columns(recipe, sentences, use_ray=use_ray, use_gpu=use_gpu, cpus=cpus, digest=digest,
                             generate=generate)
    return CorpusData(columns, corpus_statistics(recipe, columns, use_ray, use_gpu, cpus), digest)


def corpus_statistics(recipe: Recipe, columns: dict[str, Any], use_ray: bool = False, use_gpu: bool = False,
                      cpus: float = 1.0) -> dict[str, Any]:
    """Each ingredient's corpus statistics, through the cache (fitted once per corpus); a teacher's
    embeddings they need made on Ray Data's actors when ``use_ray``, once for all of them (mined
    negatives and ranking distillation with one teacher encode the corpus once)."""
    statistics: dict[str, Any] = {}
    if not recipe.with_statistics():
        return statistics
    text = statistics_input(columns)
    made: dict[tuple[str, str], Any] = {}

    def embedded(texts: list[str], teacher: str):
        key = (teacher, sentences_digest(texts))
        if key not in made:
            made[key] = embed(texts, teacher, use_ray, use_gpu, cpus)
        return made[key]

    def fitted(spec: CorpusStatistics):
        return spec.fit(text, embedded) if spec.encodes else spec.fit(text)

    for ingredient in recipe.with_statistics():
        spec = ingredient.statistics()
        folder = cached(spec.kind, sentences_digest(text), {"version": spec.version},
                        lambda tmp, spec=spec: spec.save(fitted(spec), tmp))
        statistics[ingredient.name] = spec.load(folder)
    return statistics


def corpus_columns(
    recipe: Recipe, sentences: list[str], use_ray: bool = True, use_gpu: bool = False, cpus: float = 1.0,
    digest: str | None = None, generate: bool = True,
) -> dict[str, Any]:
    """``sentence`` and every generated column of ``recipe`` as Arrow arrays, from the user's files
    or the cache; what the cache lacks is generated first (``generate=False``: a ``DataError``)."""
    import pyarrow as pa

    digest = digest or sentences_digest(sentences)
    specs = recipe.generated_columns()
    missing = missing_generations([recipe], digest)
    if missing and not generate:
        names = ", ".join(c for job, _ in missing for c in job.columns)
        raise DataError(f"generated column(s) {names} are not in the cache {cache_root()}: they are made before "
                        "the trials (was the cache removed during the sweep?)")
    generate_missing(missing, sentences, digest, use_ray=use_ray, use_gpu=use_gpu, cpus=cpus)
    columns = {"sentence": pa.chunked_array([pa.array(sentences, pa.string())])}
    for spec in specs:
        path = Path(spec.file) if spec.file else cache_entry(f"gen-{spec.column}", digest, _key(spec)) / f"{spec.column}.parquet"
        columns[spec.column] = read_generated(path, columns["sentence"], spec.column)
    return columns


def check_given_columns(recipe: Recipe, sentences: list[str]) -> None:
    """The columns a user gives as files (``paraphrase_cache``, ...) match the corpus row for row:
    checked before Ray starts, as every other input."""
    import pyarrow as pa

    given = [spec for spec in recipe.generated_columns() if spec.file]
    if given:
        text = pa.array(sentences, pa.string())
        for spec in given:
            read_generated(Path(spec.file), text, spec.column)


Pending = tuple[Generation, dict[str, GeneratedColumn]]  # a generator pass, and the column specs it makes


def missing_generations(recipes: list[Recipe], digest: str) -> list[Pending]:
    """The generator passes that would make every generated column of ``recipes`` the cache lacks:
    one per generator and settings (a group's columns in one pass, as one spaCy parse for many
    augmentations)."""
    jobs: dict[str, Pending] = {}
    for spec in [s for recipe in recipes for s in recipe.generated_columns() if not s.file]:
        if (cache_entry(f"gen-{spec.column}", digest, _key(spec)) / "COMPLETE").is_file():
            continue
        if spec.group is None:
            key = json.dumps(_key(spec), sort_keys=True, default=str)
            jobs.setdefault(key, (Generation(spec.generator, spec.kwargs, (spec.column,), spec.cpu_bound, spec.models),
                                  {spec.column: spec}))
            continue
        key = json.dumps([spec.generator, spec.group], sort_keys=True, default=str)
        made = {**(jobs[key][1] if key in jobs else {}), spec.column: spec}
        models = tuple(dict.fromkeys(m for s in made.values() for m in s.models))
        jobs[key] = (Generation(spec.generator, {"columns": list(made), **spec.group}, tuple(made), spec.cpu_bound,
                                models), made)
    return list(jobs.values())


def generate_missing(pending: list[Pending], sentences: list[str], digest: str, use_ray: bool,
                     use_gpu: bool = False, cpus: float = 1.0) -> None:
    """Every pass in one go over the corpus, streamed into each column's cache entry (Parquet, with
    its sentences) a block at a time; the entries are complete once the whole pass is."""
    if not pending:
        return
    import pyarrow as pa
    import pyarrow.parquet as pq

    text = pa.array(sentences, pa.string())
    with contextlib.ExitStack() as stack:
        writers = {}
        for i, (job, specs) in enumerate(pending):
            for column in job.columns:
                folder = stack.enter_context(building(f"gen-{column}", digest, _key(specs[column])))
                schema = pa.schema([("sentence", pa.string()), (column, pa.string())])
                writers[f"{i}:{column}"] = stack.enter_context(pq.ParquetWriter(folder / f"{column}.parquet", schema))
        for block in generated_blocks(sentences, [job for job, _ in pending], use_ray, use_gpu, cpus):
            rows = text.slice(block.column("index")[0].as_py(), block.num_rows)
            for name, writer in writers.items():
                column = name.split(":", 1)[1]
                writer.write_table(pa.table({"sentence": rows, column: block.column(name).cast(pa.string())}))


def _key(spec: GeneratedColumn) -> dict:
    """What made the column: its generator, the generator's code (a digest of its module's source:
    a changed generator makes new columns), and its settings (model names carry their pinned
    revision)."""
    return {"generator": spec.generator, "code": source_digest(spec.generator.split(":")[0]), **spec.kwargs}


@functools.lru_cache(maxsize=None)
def source_digest(module: str) -> str:
    import importlib.util

    found = importlib.util.find_spec(module)
    origin = Path(found.origin) if found and found.origin else None
    return hashlib.sha256(origin.read_bytes()).hexdigest()[:16] if origin and origin.is_file() else "unknown"


def statistics_input(columns: dict[str, Any]) -> "TextRows":
    """What corpus statistics are fitted on: the sentences plus their paraphrases (UNA, Sec. 3)."""
    return TextRows([columns["sentence"], columns.get("paraphrase", [])])


@dataclasses.dataclass
class TextRows:
    """The strings of columns one after another, made Python strings a slice at a time: a million
    rows are read twice (digest, fit) without ever being a list."""

    columns: list
    SLICE = 65_536

    def __len__(self) -> int:
        return sum(len(c) for c in self.columns)

    def __iter__(self):
        for column in self.columns:
            if not hasattr(column, "slice"):
                yield from column
                continue
            for start in range(0, len(column), self.SLICE):
                yield from column.slice(start, self.SLICE).to_pylist()


def read_generated(path: Path, sentences, column: str):
    """The column of a generated-column file (Arrow), checked row by row against the corpus'
    ``sentences`` (an Arrow array) in Arrow's compute kernels, not as Python strings."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    if not path.is_file():
        raise DataError(f"{column} cache {path} not found")
    try:
        table = pq.read_table(path, columns=["sentence", column])
        stored, values = table.column("sentence").cast(pa.string()), table.column(column).cast(pa.string())
    except Exception as exc:  # not Parquet, missing columns, or not text
        raise DataError(f"{column} cache {path} is not a Parquet file with text columns sentence, {column} ({exc})") from None
    if len(stored) != len(sentences):
        raise DataError(f"{column} cache {path} does not match the corpus: {len(stored)} rows for {len(sentences)} sentences")
    same = pc.fill_null(pc.equal(stored, sentences), False)
    if not pc.all(same).as_py():
        i = pc.index(same, False).as_py()
        a, b = stored[i].as_py() or "", sentences[i].as_py()
        raise DataError(f"{column} cache {path} does not match the corpus: row {i + 1} is {a[:40]!r}, corpus has {b[:40]!r}")
    return pc.fill_null(values, "")


# ---------------------------------------------------------------------------------------------
# Stand-ins for weights that do not exist offline. ``tiny-random-mlm``: a 2-layer BERT masked LM
# with random weights and the packaged MiniLM (uncased BERT) tokenizer, saved once into the cache.
# The local profile's SAN uses it so that the whole pipeline (tagging, mask-predict, guard, HiNCE)
# runs offline; its negatives are noise, and every run using it is tagged
# ``mlm_random_weights=true``. The paper profile names ``bert-base-uncased``, which users download.

TINY_MLM = "tiny-random-mlm"
# The tests' and benchmarks' encoder: 2 layers, 32-d, random weights (seed 0), the MiniLM tokenizer.
TINY_BERT = dict(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                 max_position_embeddings=512)


def build_tiny_bert(path: Path) -> Path:
    """A randomly initialised 2-layer 32-d BERT (seed 0) with the packaged MiniLM (uncased)
    tokenizer, saved at ``path``: the encoder of the tests and the benchmarks."""
    from transformers import BertConfig, BertModel

    with torch.random.fork_rng(devices=[]):  # the caller's random state stays as it was
        torch.manual_seed(0)
        BertModel(BertConfig(**TINY_BERT)).save_pretrained(path)
    load_tokenizer("minilm").save_pretrained(path)
    return path


def build_tiny_bart(path: Path) -> Path:
    """A randomly initialised 1-layer 16-d BART (seed 0) with the packaged MiniLM tokenizer, saved
    at ``path``: the tests' and benchmarks' paraphraser (real generation, noise text)."""
    from transformers import BartConfig, BartForConditionalGeneration

    tok = load_tokenizer("minilm")
    config = BartConfig(
        vocab_size=tok.vocab_size, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=64,
        pad_token_id=tok.pad_token_id, bos_token_id=tok.cls_token_id, eos_token_id=tok.sep_token_id,
        decoder_start_token_id=tok.cls_token_id, forced_bos_token_id=None, forced_eos_token_id=None)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        BartForConditionalGeneration(config).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def ensure_tiny_mlm() -> Path:
    def build(tmp: Path) -> None:
        from transformers import BertConfig, BertForMaskedLM
        from transformers.utils import logging as hf_logging

        tok = load_tokenizer("minilm")
        config = BertConfig(vocab_size=tok.vocab_size, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                            intermediate_size=128, max_position_embeddings=512)
        hf_logging.disable_progress_bar()
        # Built once and cached: the run that builds it draws the rest of its numbers as one that finds it.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            BertForMaskedLM(config).save_pretrained(tmp)
        tok.save_pretrained(tmp)

    return cached(TINY_MLM, "v1", {"hidden": 64, "layers": 2, "seed": 0}, build)


def resolve_local_models(ingredient_params) -> None:
    """Replace the ``tiny-random-mlm`` name in the ingredients' params by its saved folder; point
    an empty ``nltk_data`` at ``$PLATFORM_DATA_DIR/nltk_data`` when that exists and ``$NLTK_DATA``
    is not set (the data directory is the one variable tests and CI set)."""
    for params in ingredient_params:
        if getattr(params, "mlm", None) == TINY_MLM:
            params.mlm = str(ensure_tiny_mlm())
        if getattr(params, "nltk_data", None) == "" and not settings.get(settings.NLTK_DATA):
            folder = Path(settings.get(settings.DATA_DIR) or "nonexistent") / "nltk_data"
            if folder.is_dir():
                params.nltk_data = str(folder.resolve())


def uses_random_mlm(ingredient_params) -> bool:
    return any(Path(getattr(p, "mlm", "") or "x").name.startswith(TINY_MLM) for p in ingredient_params)
