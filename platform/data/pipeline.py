"""What a training batch holds (``StepInputs``: the contract between the pipeline and the step)
and everything that runs on Ray Data: the epochs that feed the training workers (a fresh uniform
permutation of the corpus each, with the recipe's per-epoch columns made on the CPUs), the
augmentation of a corpus in order (``platform.augment``), the once-per-corpus generation of
columns and teachers' embeddings by actors, and cutting a table into blocks.
"""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch

from methods.ingredients import epoch_permutation, import_by_name
from methods.encoder import batch_tokens, pretrained_source, shared_tokenizer, token_arrays
from methods.recipe import Recipe
from methods.teachers import Teacher
from platform import checkpoint, settings


class StepInputs:
    """What ``Recipe.loss`` takes, made on the host away from the step, in two halves:

    - ``arrays`` (in the data pipeline, per epoch): each text column tokenised to fixed-width ids
      and lengths, the recipe's other step columns as numbers;
    - ``collate`` (per batch, in a prefetching thread): flat CPU tensors, each text column cut to
      its longest row, which is exactly what ``Encoder.tokenize`` (``padding=True``) gives, or
      padded to ``max_len`` when ``static`` (every step the same shapes, for a compiled step);

    then ``nest`` on the step's device. Only names travel: each process loads the tokenizer once.
    """

    SEP = "/"  # a text column's arrays and tensors are ``<column>/<key>``

    def __init__(self, recipe: Recipe, tokenizer: str, max_len: int, static: bool = False):
        self.recipe, self.tokenizer, self.max_len, self.static = recipe, tokenizer, max_len, static

    def arrays(self, batch: dict[str, Any]) -> dict[str, np.ndarray]:
        tokenizer = shared_tokenizer(self.tokenizer)
        encoder = self.recipe.encoder
        out = {}
        for column in self.recipe.text_columns:
            ids, lengths = token_arrays(tokenizer, [encoder.prepare(str(s)) for s in batch[column]],
                                        encoder.token_width(self.max_len))
            out[f"{column}{self.SEP}input_ids"], out[f"{column}{self.SEP}length"] = ids, lengths
        out.update({name: t.numpy() for name, t in self.recipe.tensor_columns(batch, None).items()})
        return out

    def collate(self, arrays: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        types = "token_type_ids" in shared_tokenizer(self.tokenizer).model_input_names
        # Ray hands a batch's arrays zero-copy from its object store, read-only: a tensor made on
        # one would share that memory, and a step's in-place write would land in Ray's block.
        arrays = {k: v if v.flags.writeable else v.copy() for k, v in arrays.items()}
        out: dict[str, torch.Tensor] = {}
        for column in self.recipe.text_columns:
            made = batch_tokens(arrays[f"{column}{self.SEP}input_ids"], arrays[f"{column}{self.SEP}length"], types,
                                width=self.recipe.encoder.token_width(self.max_len) if self.static else None)
            out.update({f"{column}{self.SEP}{key}": t for key, t in made.items()})
        tokenised = {f"{c}{self.SEP}{k}" for c in self.recipe.text_columns for k in ("input_ids", "length")}
        out.update({k: torch.as_tensor(v) for k, v in arrays.items() if k not in tokenised})
        return out

    @classmethod
    def nest(cls, flat: dict[str, torch.Tensor], device=None) -> dict[str, Any]:
        """``{column: {input_ids, ...}, tensor column: tensor}`` on ``device`` (None: where they are)."""
        out: dict[str, Any] = {}
        for key, t in flat.items():
            t = t.to(device, non_blocking=True) if device is not None else t
            column, sep, part = key.partition(cls.SEP)
            if sep:
                out.setdefault(column, {})[part] = t
            else:
                out[key] = t
        return out


class BoundAugment:
    """``recipe.augment`` of epoch ``epoch`` with the corpus statistics, for ``map_batches``; with
    ``corpus`` (an object-store reference to the corpus table) its input is a batch of row numbers,
    and the rows are gathered from the table first. Batches keep their ``row`` column: the epoch's
    draws are keyed by corpus row. With ``inputs`` (a training epoch) the output is the step's
    arrays instead (``StepInputs.arrays``: the text columns tokenised here, on the CPUs).

    The statistics (and the table) travel as object-store references that each worker process
    fetches once (``_fetch``): per-process caches (UNA's word look-up) last across tasks, and
    Ray Data does not copy the statistics into its plan at every execution (benchmarks/RESULTS.md).
    """

    def __init__(self, recipe: Recipe, statistics_ref, corpus_ref=None, epoch: int = 0, inputs: StepInputs | None = None):
        self.recipe, self.statistics_ref, self.corpus_ref, self.epoch = recipe, statistics_ref, corpus_ref, epoch
        self.inputs = inputs

    def __call__(self, batch):
        if self.corpus_ref is not None:
            rows = _fetch(self.corpus_ref).take(np.asarray(batch["row"]))
            batch = {"row": np.asarray(batch["row"]),
                     **{name: rows.column(name).to_numpy(zero_copy_only=False) for name in rows.column_names}}
        if self.recipe.augments_per_epoch:
            batch = self.recipe.augment(batch, _fetch(self.statistics_ref), self.epoch)
        return self.inputs.arrays(batch) if self.inputs is not None else batch

    def __repr__(self) -> str:
        return f"BoundAugment({self.recipe.spec.describe()})"


_FETCHED: dict[str, Any] = {}
_KEEP = 8  # concurrent trials of a sweep share worker processes; each has its own references


def _fetch(ref):
    key = ref.hex()
    if key not in _FETCHED:
        import ray

        while len(_FETCHED) >= _KEEP:
            _FETCHED.pop(next(iter(_FETCHED)))  # the oldest: a finished run's
        _FETCHED[key] = ray.get(ref)
    return _FETCHED[key]


def augment_dataset(recipe: Recipe, columns: dict[str, list[str]], statistics: dict[str, Any], batch_size: int = 4096,
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
        ds = ds.map_batches(BoundAugment(recipe, ray.put(statistics)), batch_format="numpy", batch_size=batch_size,
                            num_cpus=num_cpus)
    return ds.drop_columns(["row"])


def epoch_datasets(recipe: Recipe, columns: dict[str, list[str]], statistics: dict[str, Any], epochs: int, seed: int,
                   batch_size: int = 1024, num_cpus: float | None = None,
                   inputs: StepInputs | None = None) -> dict[str, Any]:
    """``{"train_<epoch>": Dataset}``: each epoch a uniform permutation of the whole corpus,
    ``epoch_permutation(seed, epoch)`` as the local pipeline's (SimCSE samples batches uniformly from the whole
    corpus, reshuffled every epoch; wiki1m is stored in article order). The permutation's row
    numbers are cut into blocks on the driver; each block's task gathers its rows from the corpus
    table (one object-store reference, fetched once per worker process) and adds the recipe's
    per-epoch columns, so the epoch still streams to the training workers while the CPUs augment;
    with ``inputs``, rows leave as the training step's arrays (tokenised on the CPUs)."""
    import pyarrow as pa
    import ray
    import ray.data

    _one_operator_context()
    # Training prints one line per evaluation; an epoch's stream is not a task the user waits on.
    ray.data.DataContext.get_current().enable_progress_bars = False
    corpus_ref, statistics_ref = ray.put(pa.table(columns)), ray.put(statistics)
    n = len(columns["sentence"])
    blocks = max(1, min(n // batch_size, 64))
    out = {}
    for epoch in range(epochs):
        rows = pa.table({"row": epoch_permutation(seed, epoch, n)})
        out[f"train_{epoch}"] = arrow_blocks(rows, blocks).map_batches(
            BoundAugment(recipe, statistics_ref, corpus_ref, epoch, inputs), batch_format="numpy", batch_size=batch_size,
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
BOOTSTRAP_CONFIG = settings.READ_DEFAULTS[settings.AUTOSCALING_CONFIG]


@dataclasses.dataclass(frozen=True)
class Generation:
    """One generator's pass over the corpus: ``generator(**kwargs)`` (a ``"module:Class"`` whose
    instances map ``{"sentence": [...]}`` batches) adds ``columns``. ``cpu_bound``: pure Python, one
    CPU each; otherwise a model (a GPU where the run has them, else a few threads). ``models``: the
    pretrained models it loads."""

    generator: str
    kwargs: dict
    columns: tuple[str, ...]
    cpu_bound: bool = False
    models: tuple[str, ...] = ()


class Generators:
    """Every generation of one corpus pass, in one actor: each generator built once, on the device
    the actor reserved (``cpu`` when it holds no GPU: a node's GPU is never used unreserved); the
    output column ``c`` of job ``i`` is ``"i:c"``."""

    def __init__(self, jobs: list[Generation], device: str | None = None):
        self.jobs = [(job, _build(job, device)) for job in jobs]

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        out = {"index": batch["index"]}
        for i, (job, make) in enumerate(self.jobs):
            made = make({"sentence": batch["sentence"], "index": batch["index"]})  # rows: what draws are keyed by
            out.update({f"{i}:{c}": np.asarray(made[c], dtype=object) for c in job.columns})
        return out


def _build(job: Generation, device: str | None):
    import inspect

    cls = import_by_name(job.generator)
    takes_device = device is not None and "device" in inspect.signature(cls).parameters
    return cls(**job.kwargs, **({"device": device} if takes_device else {}))


def generate_columns(sentences: list[str], jobs: list[Generation], use_ray: bool, use_gpu: bool,
                     cpus: float = 1.0) -> list[dict[str, Any]]:
    """Every job over the sentences in one pass: for each job, its columns in corpus order (Arrow
    arrays). ``generated_blocks`` is the same pass a block at a time."""
    import pyarrow as pa

    table = pa.concat_tables(list(generated_blocks(sentences, jobs, use_ray, use_gpu, cpus)))
    return [{c: table.column(f"{i}:{c}") for c in job.columns} for i, job in enumerate(jobs)]


def generated_blocks(sentences: list[str], jobs: list[Generation], use_ray: bool, use_gpu: bool,
                     cpus: float = 1.0) -> Iterator[Any]:
    """Every job over the sentences in one pass (in process, or by a pool of Ray Data actors that
    grows with the cluster), as Arrow tables of consecutive rows in corpus order: ``index`` and the
    output column ``c`` of job ``i`` as ``"i:c"``. Streamed: the caller holds a block at a time."""
    import pyarrow as pa
    import ray

    if not use_ray:
        yield pa.table(Generators(jobs)({"index": np.arange(len(sentences)), "sentence": sentences}))
        return
    # The actors' outputs stay in the object store (on the nodes that made them); the driver fetches
    # them one block at a time, in corpus order. A streaming consumer in the driver would
    # backpressure the pool, and Ray Data's autoscaler would then retire and restart actors (each
    # restart reloading spaCy and WordNet): AugCSE's 8 augmentations ran at ~260 sentences/s, not ~390.
    done, refs = 0, _generate_on_ray(sentences, jobs, use_gpu, cpus)
    refs.reverse()
    while refs:
        block = ray.get(refs.pop())  # a block's reference goes once it is fetched: the store may free it
        if block.num_rows == 0:
            continue
        if block.column("index")[0].as_py() != done:
            raise RuntimeError(f"generation returned rows out of order: row {block.column('index')[0]} after {done}")
        done += block.num_rows
        yield block
        del block
    if done != len(sentences):
        raise RuntimeError(f"generation returned {done} rows for {len(sentences)} sentences")


def _generate_on_ray(sentences: list[str], jobs: list[Generation], use_gpu: bool, cpus: float):
    import pyarrow as pa
    import ray
    import ray.data

    _one_operator_context()  # preserve_order: the blocks' references come back in corpus order
    cpu_bound = all(job.cpu_bound for job in jobs)
    most = cluster_most()
    gpu = use_gpu and not cpu_bound and most.get("GPU", 0) > 0
    lo, hi = actor_bounds(gpu, cpu_bound, most)
    table = pa.table({"index": np.arange(len(sentences)), "sentence": sentences})
    # Blocks cut here: a repartition task would wait forever for a CPU the actors hold. Small ones
    # (about a second of work each) so the actors finish together, and enough for the largest pool.
    ds = arrow_blocks(table, max(hi, min(-(-len(sentences) // BLOCK_SENTENCES), MAX_BLOCKS)))
    ds = ds.map_batches(
        Generators,
        fn_constructor_kwargs={"jobs": jobs, "device": "cuda" if gpu else "cpu"},
        batch_size=256 if cpu_bound else 64,
        batch_format="numpy",
        compute=ray.data.ActorPoolStrategy(min_size=lo, max_size=hi),
        num_gpus=1 if gpu else 0,
        num_cpus=cpus,  # fractional inside sweeps, where trials' Train workers may hold every CPU
        memory=actor_memory(*dict.fromkeys(m for job in jobs for m in job.models)),
    )
    # Arrow (C++) blocks, never all in the driver at once: on a 1M-sentence corpus it holds one
    # block of outputs, not every column of every row.
    return ds.to_arrow_refs()


def embed(texts: list[str], teacher: str, use_ray: bool, use_gpu: bool = False, cpus: float = 1.0) -> np.ndarray:
    """``teacher``'s embedding of each text (float32, in order): in this process, or by a pool of
    Ray Data actors that grows with the cluster, each loading the teacher once (a GPU each where the
    run has them), as the column generators run. A training checkpoint of this platform as
    teacher is its model folder with the pooler it is evaluated with."""
    kwargs = {"teacher": teacher}
    if (Path(teacher) / checkpoint.STATE).is_file():
        kwargs = {"teacher": str(checkpoint.model_dir(teacher)), "pooler": checkpoint.read_state(teacher)["eval_pooler"]}
    if not use_ray or not texts:
        return Teacher(**kwargs).encode(texts)
    import pyarrow as pa
    import ray
    import ray.data

    _one_operator_context()  # preserve_order: the blocks come back in the texts' order
    most = cluster_most()
    gpu = use_gpu and most.get("GPU", 0) > 0
    # On CPUs an actor per CPU: Ray gives each one thread (OMP_NUM_THREADS), and a small teacher
    # keeps one busy; on GPUs one per GPU.
    lo, hi = actor_bounds(gpu, not gpu, most)
    blocks = min(-(-len(texts) // BLOCK_SENTENCES), MAX_BLOCKS)
    hi = min(hi, blocks)  # no more actors (each loading the teacher) than blocks to embed
    table = pa.table({"index": np.arange(len(texts)), "sentence": pa.array(texts, pa.string())})
    ds = arrow_blocks(table, blocks).map_batches(
        Teacher, fn_constructor_kwargs={**kwargs, "device": "cuda" if gpu else "cpu"}, batch_size=256,
        batch_format="numpy", compute=ray.data.ActorPoolStrategy(min_size=min(lo, hi), max_size=hi),
        num_gpus=1 if gpu else 0, num_cpus=cpus, memory=actor_memory(kwargs["teacher"]))
    blocks = [ray.get(ref) for ref in ds.to_numpy_refs()]
    index = np.concatenate([b["index"] for b in blocks if len(b["index"])])
    if not np.array_equal(index, np.arange(len(texts))):
        raise RuntimeError(f"the teacher's embeddings came back out of order or incomplete ({len(index)} of {len(texts)})")
    return np.concatenate([b["vector"] for b in blocks if len(b["index"])]).astype(np.float32)


# An actor's peak memory (USS) is a process of at most about 900 MiB plus its models' weights: each
# pool's actors against their requests in `python -m benchmarks run actor-memory` (the teacher's, and
# the generators' of AugCSE, SNCSE, SAN and paraphrases). Rounded up for the Ray worker's own share.
PROCESS_BYTES = 900 * 2**20
WEIGHT_FILES = (".safetensors", ".bin")


def actor_memory(*models: str) -> int:
    """The memory one actor of a pool that loads ``models`` asks Ray for: its peak (``PROCESS_BYTES``
    and the weights' files) with Ray Data's own 25 % headroom, so that Ray places no more of them
    on a node than its memory holds (a fractional ``augment_cpus`` would otherwise put
    1/augment_cpus of them on each CPU); at most the largest node's memory, so that the pool is
    never unschedulable."""
    import ray

    request = int(1.25 * (PROCESS_BYTES + sum(weight_bytes(m) for m in models)))
    largest = max((n["Resources"].get("memory", 0) for n in ray.nodes() if n["Alive"]), default=0)
    return int(min(request, largest)) if largest else request


def weight_bytes(model: str) -> int:
    """The size of a model's weight files (safetensors, else PyTorch's; a sentence-transformers
    model's modules included, its ONNX and OpenVINO exports not): a local folder, a packaged alias
    or a Hugging Face model in the local cache; a BERT-base's where the weights are not here yet."""
    path, pinned = pretrained_source(model)
    folder = Path(path)
    if not folder.is_dir():
        with contextlib.suppress(Exception):
            from huggingface_hub import snapshot_download

            folder = Path(snapshot_download(path, revision=pinned.get("revision"), local_files_only=True))
    files = [p for p in (*folder.glob("*"), *folder.glob("[0-9]*_*/*")) if p.is_file()] if folder.is_dir() else []
    for suffix in WEIGHT_FILES:
        found = sum(p.stat().st_size for p in files if p.suffix == suffix)
        if found:
            return found
    return 440 * 10**6


def actor_bounds(gpu: bool, cpu_bound: bool, most: dict[str, float] | None = None) -> tuple[int, int]:
    """A generation pool's smallest and largest size: one actor to start, as many as the cluster
    can grow to (``most``, default ``cluster_most()``): a GPU each for GPU generators, one CPU each
    for pure-Python ones, two for models on CPUs (they use a few threads each)."""
    most = cluster_most() if most is None else most
    if gpu:
        return 1, max(1, int(most.get("GPU", 0)))
    cpus = int(most.get("CPU", 1))
    return 1, max(1, cpus if cpu_bound else cpus // 2)


def cluster_most() -> dict[str, float]:
    """CPUs and GPUs at the cluster's largest: ``most_resources``, or what it has now if more."""
    import ray

    now, most = ray.cluster_resources(), most_resources()
    return {k: max(float(now.get(k, 0)), most.get(k, 0.0)) for k in ("CPU", "GPU")}


def most_resources() -> dict[str, float]:
    """The most CPUs and GPUs the cluster can grow to: Ray's own reading of the autoscaler's
    configuration where the autoscaler reports it (what Ray Train checks a worker group against),
    else the launcher configuration the head runs (``settings.AUTOSCALING_CONFIG``), else {}."""
    from ray._private.state import state

    with contextlib.suppress(Exception):
        found = state.get_max_resources_from_cluster_config()
        if found:
            return {k: float(v) for k, v in found.items() if k in ("CPU", "GPU")}
    path = Path(settings.get(settings.AUTOSCALING_CONFIG, BOOTSTRAP_CONFIG)).expanduser()
    return launcher_maximum(path) if path.is_file() else {}


def launcher_maximum(path: Path) -> dict[str, float]:
    """CPUs and GPUs of a cluster launcher configuration at its largest: the head, plus each worker
    type at its ``max_workers`` (the cluster's ``max_workers`` caps the workers of all types).
    Types without ``resources`` (the AWS provider fills them from the instance type when it
    bootstraps) count nothing."""
    import yaml

    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError):
        return {}
    cap = int(config.get("max_workers", 10**6))
    total = {"CPU": 0.0, "GPU": 0.0}
    for name, node_type in (config.get("available_node_types") or {}).items():
        count = 1 if name == config.get("head_node_type") else min(int(node_type.get("max_workers", 0)), cap)
        for key in total:
            total[key] += count * float((node_type.get("resources") or {}).get(key, 0))
    return total


def arrow_blocks(table, blocks: int):
    """A Ray Dataset of ``table`` in ``blocks`` nearly equal blocks, cut here on the driver rather
    than by a repartition task: no extra pass over the data, and no task left waiting for a CPU
    while actors or augmentation tasks hold them all."""
    import ray.data

    size = max(1, -(-table.num_rows // max(1, blocks)))
    return ray.data.from_arrow([table.slice(i, size) for i in range(0, table.num_rows, size)])
