"""MTEB (Muennighoff et al., 2023) through the ``mteb`` package, with the platform's encoder.

- ``tasks_of``: a benchmark (``MTEB(eng, v2)``, ``NanoBEIR``, ...) or task names to mteb's task
  objects. The STS tasks whose data the platform has (STS12-16, STS-B, SICK-R in SentEval's layout)
  are mteb's own task classes with ``load_data`` reading the local files (mteb's documented way to
  run a task on local data); every other task loads from the Hugging Face hub at run time, and is
  refused in one line where the hub cannot be reached.
- ``mteb_model``: the encoder with its recipe's pooling (a prompt's [MASK] included), given to
  mteb with its model metadata and named by its lineage (the weights, tokenizer, pooler and
  prompt digested), so mteb's results cache never serves one checkpoint's scores for another.
- ``evaluate``: every task's main score (x100) and the mean, each task's result JSON in a folder.

What differs from SentEval's protocol (``platform.evaluation.sts``), stated in docs/evaluation.md:
mteb's SICK-R is all 9,927 pairs (SentEval's test split is 4,927); MTEB(eng, v2) has no STS16;
its clustering tasks embed a sample of each set.
"""

from __future__ import annotations

import difflib
import json
import re
import socket
from pathlib import Path
from typing import Any

import numpy as np

from methods.encoder import Encoder
from platform.data import DataError, data_dir, load_sts
from platform import settings
from platform.errors import UserError
from platform.storage import encoder_key

# mteb's task name -> the platform's STS task (its loader and SentEval files).
LOCAL_STS = {"STS12": "STS12", "STS13": "STS13", "STS14": "STS14", "STS15": "STS15", "STS16": "STS16",
             "STSBenchmark": "STSBenchmark", "SICK-R": "SICKRelatedness"}
HUB = ("huggingface.co", 443)


def local_pairs(name: str, root: Path) -> dict[str, list]:
    """The pairs mteb's task ``name`` holds, from the SentEval files: the test split, and for SICK-R
    all three of its files (mteb's SICK-R is the whole 9,927-pair set)."""
    task = LOCAL_STS[name]
    parts = [load_sts(task, root, split) for split in (("train", "dev", "test") if task == "SICKRelatedness" else ("test",))]
    return {"sentence1": [s for p in parts for s in p.sent1], "sentence2": [s for p in parts for s in p.sent2],
            "score": [float(x) for p in parts for x in p.scores]}


def local_task(name: str, root: Path):
    """mteb's task ``name`` with its data read from ``root`` (SentEval's layout) instead of the hub."""
    import mteb
    from datasets import Dataset, DatasetDict

    base = type(mteb.get_task(name))

    def load_data(self, num_proc: int | None = None, **kwargs: Any) -> None:
        if self.data_loaded:
            return
        self.dataset = DatasetDict({"test": Dataset.from_dict(local_pairs(name, root))})
        self.data_transform_done = True
        self.data_loaded = True

    return type(base.__name__, (base,), {"load_data": load_data, "__module__": __name__})()


def hub_reachable(timeout: float = 3.0) -> bool:
    """False when Hugging Face's offline mode is set or its hub cannot be connected to."""
    if any((settings.get(name) or "").lower() in ("1", "true", "yes", "on") for name in settings.HF_OFFLINE):
        return False
    try:
        with socket.create_connection(HUB, timeout=timeout):
            return True
    except OSError:
        return False


def tasks_of(benchmark: str | None, names: list[str], root: Path | None = None, online: bool | None = None) -> list:
    """mteb's tasks of ``benchmark`` and ``names`` (in that order, each once): local where the
    platform has the data, else from the hub. Refuses an unknown benchmark or task, and a task the
    hub must serve when it cannot be reached, in one line each."""
    import mteb

    wanted: list[str] = []
    if benchmark:
        try:
            wanted += [t.metadata.name for t in mteb.get_benchmark(benchmark).tasks]
        except (KeyError, ValueError):
            known = sorted(b.name for b in mteb.get_benchmarks())
            close = difflib.get_close_matches(benchmark, known, n=3, cutoff=0.5)
            raise UserError(f"unknown MTEB benchmark {benchmark!r}" + (f"; did you mean {', '.join(close)}?" if close else
                                                                     f"; e.g. {', '.join(known[:5])}")) from None
    for name in names:
        try:
            wanted.append(mteb.get_task(name).metadata.name)
        except (KeyError, ValueError):
            raise UserError(f"unknown MTEB task {name!r} (mteb {mteb.__version__}'s names: mteb.get_tasks())") from None
    wanted = list(dict.fromkeys(wanted))
    local = {}
    if any(n in LOCAL_STS for n in wanted):
        try:
            root = root if root is not None else data_dir()
            local = {n: local_pairs(n, root) for n in wanted if n in LOCAL_STS}
        except DataError:
            local = {}
    remote = [n for n in wanted if n not in local]
    if remote and not (hub_reachable() if online is None else online):
        raise UserError(f"MTEB task(s) {', '.join(remote[:5])}{' ...' if len(remote) > 5 else ''} read their data from "
                        "the Hugging Face hub, which cannot be reached from here; offline, the tasks with local data: "
                        f"{', '.join(LOCAL_STS)}")
    return [local_task(n, root) if n in local else mteb.get_task(n) for n in wanted]


def mteb_model(encoder: Encoder, pooler: str, label: str, batch_size: int = 128):
    """The platform's encoder as an mteb model (an ``AbsEncoder``; mteb imported only here):
    ``encode`` embeds every text of mteb's batches with the recipe's pooling; its metadata names it
    ``platform/<label>`` at revision ``encoder_key`` (its weights, tokenizer, pooler and prompt)."""
    from mteb.models import ModelMeta
    from mteb.models.abs_encoder import AbsEncoder
    from mteb.models.model_meta import ScoringFunction

    class PlatformModel(AbsEncoder):
        def __init__(self):
            self.model = encoder
            self.mteb_model_meta = ModelMeta.create_empty({
                "name": f"platform/{label}", "revision": encoder_key(encoder, pooler), "embed_dim": encoder.embedding_size,
                "n_parameters": sum(p.numel() for p in encoder.parameters()), "similarity_fn_name": ScoringFunction.COSINE,
                "framework": ["PyTorch"], "languages": ["eng-Latn"], "open_weights": True, "use_instructions": False})

        def encode(self, inputs, *, task_metadata, hf_split, hf_subset, prompt_type=None, **kwargs):
            texts = [str(t) for batch in inputs for t in batch["text"]]
            return encoder.encode(texts, batch_size=batch_size, pooler=pooler).numpy().astype(np.float32)

    return PlatformModel()


def metric(task: str) -> str:
    """A score's MLflow metric name, ``mteb_<task>`` (characters MLflow does not take become ``_``)."""
    return "mteb_" + re.sub(r"[^A-Za-z0-9_.\-/ ]", "_", task)


def evaluate(model, tasks: list, folder: Path) -> dict[str, float]:
    """Each task's main score x100 (cosine Spearman for STS) and their ``mean``; each task's result
    as ``<task>.json`` in ``folder``. mteb's cache lives in ``folder`` too: results are the model's
    lineage's, nothing is read from a shared cache."""
    import mteb

    folder.mkdir(parents=True, exist_ok=True)
    result = mteb.evaluate(model, tasks, cache=mteb.ResultCache(folder / "cache"), overwrite_strategy="always",
                           show_progress_bar=False, raise_error=True)
    scores = {}
    for task_result in result.task_results:
        scores[task_result.task_name] = 100 * float(task_result.get_score())
        (folder / f"{task_result.task_name}.json").write_text(json.dumps(task_result.to_dict(), indent=1, default=str))
    if scores:
        scores["mean"] = float(np.mean([scores[t] for t in scores]))
    return scores
