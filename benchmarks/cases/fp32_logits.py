"""Cost and effect of the float32 similarity logits under bf16 autocast, per named recipe.

    PLATFORM_DATA_DIR=../shared/data python -m benchmarks run fp32-logits [--batch 64] [--steps 5]

The GPU path wraps the step in bf16 autocast; CPU autocast casts matmuls the same way, so the CPU
step shows what the losses' ``full_precision`` costs: each recipe's training step (forward,
backward, AdamW; packaged MiniLM, length 32) under CPU bf16 autocast with the similarities and
softmax in float32 (as shipped) and with them left to autocast (``full_precision`` replaced by a
no-op here), interleaved, median after one warm-up step. Also the loss
of the first batch in each mode against the same step without autocast (float32 throughout).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import torch

import methods.losses
import methods.vascl
from methods.encoder import Encoder
from methods.recipe import Recipe
from platform.data import data_dir, read_corpus
from benchmarks.common import model_source
from benchmarks.harness import Bench, Case

RECIPES = {"simcse": {}, "una": {"alpha": 1}, "san": {}, "augcse": {"augmentations": "4-aug"}, "vascl": {}}
SHIPPED = methods.losses.full_precision


@contextlib.contextmanager
def logits_in(mode: str):
    """``fp32``: as shipped; ``bf16``: the losses' autocast guard removed."""
    guard = SHIPPED if mode == "fp32" else (lambda device: contextlib.nullcontext())
    methods.losses.full_precision = methods.vascl.full_precision = guard
    try:
        yield
    finally:
        methods.losses.full_precision = methods.vascl.full_precision = SHIPPED


def columns(recipe: Recipe, sentences: list[str], encoder: Encoder) -> dict:
    """The step's batch: hard negatives and augmentations stand in as the words reversed."""
    reversed_words = [" ".join(s.split()[::-1]) for s in sentences]
    text = {"sentence": sentences, "una_negative": reversed_words, "san_negative": reversed_words,
            "augmented": reversed_words, "positive": sentences}
    raw = {**text, "aug_label": [a.labels[i % len(a.labels)] for a in recipe.aux if a.name == "augcse"
                                 for i in range(len(sentences))]}
    tokens = {c: encoder.tokenize(text[c], max_len=32) for c in recipe.text_columns}
    tokens.update(recipe.tensor_columns(raw, None))
    return tokens


def step(recipe, model, optimizer, batch, autocast: bool) -> float:
    with torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext():
        loss, _ = recipe.loss(model, batch, 0)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(loss.detach())


def first_losses(name: str, sentences: list[str], model: str) -> dict[str, float]:
    """The first batch's loss from one initialisation and one dropout draw: fp32 throughout, and
    under autocast with each kind of logits."""
    out = {}
    for mode, autocast in (("none", False), ("fp32", True), ("bf16", True)):
        torch.manual_seed(0)
        encoder = Encoder.from_pretrained(model)
        recipe = Recipe.named(name, **RECIPES[name])
        built = recipe.build(encoder).train()
        batch = columns(recipe, sentences, encoder)
        torch.manual_seed(1)
        with logits_in(mode if autocast else "fp32"):
            with torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext():
                out[mode] = float(recipe.loss(built, batch, 0)[0].detach())
    return out


def step_times(name: str, sentences: list[str], batch_size: int, steps: int, model_path: str) -> dict[str, float]:
    torch.manual_seed(0)
    encoder = Encoder.from_pretrained(model_path)
    recipe = Recipe.named(name, **RECIPES[name])
    model = recipe.build(encoder).train()
    optimizer = torch.optim.AdamW(recipe.param_groups(model, 1e-5))
    times: dict[str, list[float]] = {"fp32": [], "bf16": []}
    for s in range(steps + 1):
        batch = columns(recipe, sentences[s * batch_size : (s + 1) * batch_size], encoder)
        for mode in times:
            with logits_in(mode):
                t = time.perf_counter()
                step(recipe, model, optimizer, batch, autocast=True)
                if s:
                    times[mode].append(time.perf_counter() - t)
    return {mode: statistics.median(ts) for mode, ts in times.items()}


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--model", default="minilm", help="a model name or path; tiny: the tests' random 2-layer BERT")


def run(args: argparse.Namespace, bench: Bench) -> None:
    torch.set_num_threads(2)
    model = model_source(args.model)
    sentences = read_corpus(data_dir() / "corpus" / "wiki1m_for_simcse.first11914.txt.gz", limit=args.batch * (args.steps + 1))
    print("| recipe | step, fp32 logits | step, bf16 logits | ratio | loss, no autocast | fp32 logits | bf16 logits |")
    print("|---|---|---|---|---|---|---|")
    for name in RECIPES:
        t = step_times(name, sentences, args.batch, args.steps, model)
        loss = first_losses(name, sentences[: args.batch], model)
        print(f"| {name} | {t['fp32'] * 1e3:.0f} ms | {t['bf16'] * 1e3:.0f} ms | {t['fp32'] / t['bf16']:.3f} | "
              f"{loss['none']:.4f} | {loss['fp32']:.4f} | {loss['bf16']:.4f} |", flush=True)
        bench.ratio(f"{name}: step with fp32 logits / bf16 logits", t["fp32"] / t["bf16"], "~1")


CASE = Case("fp32-logits", "what the float32 similarity logits cost under bf16 autocast, per named recipe, and "
            "their first loss beside fp32 throughout", arguments, run, smoke=["--batch", "20", "--steps", "1", "--model", "tiny"],
            meaning="The losses compute similarities and softmax in float32 under autocast; a ratio near 1 "
                    "says that costs nothing, the losses say what bf16 logits would change.")
