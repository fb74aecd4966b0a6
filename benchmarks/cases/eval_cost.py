"""What one STS-B dev evaluation costs inside a run, piece by piece.

    python -m benchmarks run eval-cost --tokenizer .dev/prepared/tokenizer     # GPU: bert-base, bf16 training
    python -m benchmarks run eval-cost --model tiny --evals 2 --train-steps 2  # a CPU check

The loop's evaluation (``platform.run.loop.evaluate_and_report``) exports the encoder, encodes STS-B dev's
3,000 sentences (length-sorted batches of ``eval_batch_size``, fp32, no truncation; the
``STSEvaluator`` keeps them tokenised from its first evaluation), scores Spearman, and, when the score
improved, copies the weights aside (``checkpoint.ModelWriter``) for a background thread to write. Here
each piece is timed
apart, after ``--train-steps`` training steps between evaluations (as a run interleaves them), for the
backbone eager and compiled as ``static_shapes`` + ``compile`` leave it. Variants of the encoding:
``as-is``; ``width/32`` (every batch padded to a multiple of 32 tokens: a few shapes for the compiled
backbone); ``eager`` (the compiled backbone run eager for the evaluation, ``torch.compiler.set_stance``);
``bf16`` (the encoding under bf16 autocast, on a GPU); ``tokenised once`` (``STSEvaluator``'s own path:
the sentences tokenised at the first evaluation and kept, as a run's evaluator does). The model's save
in three figures, every evaluation counted as a new best (early in a run nearly every one is): the time
the training thread is blocked (``save blocked s``: waiting for the previous write, then the copy), the
background write's own time (``write in background s``, measured in its thread, training going on), and
the synchronous ``save_pretrained`` the loop paid before (``synchronous save s``, into a folder of its
own just before). ``total s``: what the training thread pays, the tokenising-alone column left out.
STS-B dev itself where ``$PLATFORM_DATA_DIR`` is set, else 1,500 random pairs of 8-40 vocabulary words
(``benchmarks.common.dev_pairs``; the GPU machine has no data): what STS-B dev costs, not its score. Random
bert-base weights (``BertConfig()``); the tokenizer (bert-base-uncased's vocabulary) from ``--tokenizer``
(the paper-precision case's ``--prepare-to`` saves one) or the packaged MiniLM.
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time
from pathlib import Path


import torch

from methods.encoder import Encoder
from platform import checkpoint
from platform.config import TrainConfig
from platform.evaluation.sts import STSEvaluator
from platform.run.loop import apply_step, compile_backbone, forward_backward, make_optimizer, mixed_precision
from benchmarks.common import dev_pairs, random_bert
from benchmarks.harness import Bench, Case


@contextlib.contextmanager
def padded_to(multiple: int):
    """``Encoder.tokenize`` padding every batch to a multiple of ``multiple`` tokens."""
    original = Encoder.tokenize

    def tokenize(self, sentences, max_len=None, device=None, prompt=None):  # a plain encoder's: no prompt
        enc = self.tokenizer(list(sentences), padding=True, pad_to_multiple_of=multiple,
                             truncation=max_len is not None, max_length=max_len, return_tensors="pt")
        return {k: v.to(device) if device is not None else v for k, v in enc.items()}

    Encoder.tokenize = tokenize
    try:
        yield
    finally:
        Encoder.tokenize = original


def variant_context(name: str):
    if name == "width/32":
        return padded_to(32)
    if name == "eager":
        return torch.compiler.set_stance("force_eager")
    if name == "bf16" and torch.cuda.is_available():
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def measure(size: str, tokenizer: str | None, compile_mode: str, evals: int, train_steps: int,
            variants: list[str]) -> dict[str, list[float]]:
    """Prints the table; returns each evaluation's save figures (blocked, background, synchronous)."""
    gpu = torch.cuda.is_available()
    device = torch.device("cuda" if gpu else "cpu")
    work = Path(tempfile.mkdtemp())
    model_dir = random_bert(work / "bert", size, tokenizer)
    cfg = TrainConfig.build("simcse", "paper", {
        "model": model_dir, "corpus": str(work / "unused.txt"), "use_gpu": gpu, "runtime": "process",
        "precision": "bf16", "output_dir": str(work / "runs"),
        **({"static_shapes": True, "compile": compile_mode} if compile_mode != "none" else {})})
    recipe = cfg.build_recipe()
    torch.manual_seed(0)
    model = compile_backbone(recipe.build(Encoder.from_pretrained(cfg.model, dropout=cfg.dropout)), cfg.compile).to(device)
    optimizer, schedule = make_optimizer(cfg, recipe, model, evals * train_steps * (len(variants) + 1))
    autocast, scaler = mixed_precision(cfg.precision, device)
    tok = model.encoder.tokenizer
    pairs = dev_pairs(tok)  # None where $PLATFORM_DATA_DIR names the data: STS-B dev itself
    evaluator = (STSEvaluator.from_pairs({"STSBenchmark": pairs}, batch_size=cfg.eval_batch_size) if pairs
                 else STSEvaluator.stsb_dev(batch_size=cfg.eval_batch_size))
    ids = torch.randint(1000, tok.vocab_size, (cfg.batch_size, cfg.max_len), device=device)
    batch = {"sentence": {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)}}
    step = 0

    def train(n: int) -> None:  # the loop's own step
        nonlocal step
        model.train()
        for _ in range(n):
            forward_backward(recipe, model, batch, step, 0, autocast, scaler, 1)
            apply_step(optimizer, schedule, scaler)
            optimizer.zero_grad(set_to_none=True)
            step += 1

    print(f"device={torch.cuda.get_device_name() if gpu else 'cpu'} torch={torch.__version__} model={size} "
          f"compile={compile_mode} eval_batch_size={cfg.eval_batch_size} sentences={len(evaluator.sentences)} "
          f"train steps between evaluations={train_steps}", flush=True)
    print("| encoding | evaluation | export s | tokenise alone s | encode s | score s | save blocked s | "
          "write in background s | synchronous save s | total s |")
    print("|---|---|---|---|---|---|---|---|---|---|", flush=True)
    writer, background = checkpoint.ModelWriter(), []
    saves: dict[str, list[float]] = {"blocked": [], "background": [], "synchronous": []}

    def write_in_background(snapshot, folder):
        t = time.perf_counter()
        writer.write(snapshot, folder)
        background.append(time.perf_counter() - t)

    train(train_steps)
    for name in variants:
        for e in range(1, evals + 1):
            Bench.sync()
            t0 = time.perf_counter()
            encoder = recipe.export_encoder(model)
            t1 = time.perf_counter()
            with variant_context(name):
                order = sorted(evaluator.sentences, key=len, reverse=True)
                for i in range(0, len(order), cfg.eval_batch_size):
                    encoder.tokenize(order[i:i + cfg.eval_batch_size])
                t2 = time.perf_counter()
                if name == "tokenised once":  # the evaluator's own path: its batches kept from the first evaluation
                    emb = evaluator.encode(encoder, pooler=recipe.eval_pooler())
                else:
                    emb = encoder.encode(evaluator.sentences, batch_size=cfg.eval_batch_size, pooler=recipe.eval_pooler())
                Bench.sync()
            t3 = time.perf_counter()
            evaluator.score(emb)
            t4 = time.perf_counter()
            folder = work / f"checkpoint-{name.replace('/', '-')}-{e}"
            encoder.save_pretrained(folder / "synchronous")  # what the loop paid before, into a new folder
            t5 = time.perf_counter()
            snapshot = writer.snapshot(encoder)  # the loop's path: copied aside, written while training goes on
            t6 = time.perf_counter()
            writer.submit(lambda s=snapshot, f=folder: write_in_background(s, f / "model"), lambda: None)
            train(train_steps)  # the steps to the next evaluation, as the write runs
            writer.collect(wait=True)
            print(f"| {name} | {e} | {t1 - t0:.3f} | {t2 - t1:.3f} | {t3 - t2:.3f} | {t4 - t3:.3f} | {t6 - t5:.3f} | "
                  f"{background[-1]:.3f} | {t5 - t4:.3f} | {t4 - t0 - (t2 - t1) + t6 - t5:.3f} |", flush=True)
            for key, value in zip(saves, (t6 - t5, background[-1], t5 - t4)):
                saves[key].append(value)
    writer.close()
    return saves


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="bert-base", choices=["bert-base", "tiny"])
    p.add_argument("--tokenizer", default=None, help="a tokenizer folder (default: the packaged MiniLM's)")
    p.add_argument("--compile", default="reduce-overhead", help="a torch.compile mode, or none")
    p.add_argument("--evals", type=int, default=4)
    p.add_argument("--train-steps", type=int, default=20)
    p.add_argument("--variants", nargs="*", default=["as-is", "tokenised once", "width/32", "eager"])


def run(args: argparse.Namespace, bench: Bench) -> None:
    import statistics

    torch.backends.cuda.matmul.allow_tf32 = True  # as gpu_speed.py
    saves = measure(args.model, args.tokenizer, args.compile, args.evals, args.train_steps, args.variants)
    median = {k: bench.figure(f"save {k} s (median)", statistics.median(v)) for k, v in saves.items()}
    bench.ratio("save: training thread blocked s (median)", median["blocked"], "<= 0.1")
    bench.ratio("save blocked / synchronous save (median)", median["blocked"] / median["synchronous"])


CASE = Case("eval-cost", "one STS-B dev evaluation inside a run, piece by piece (export, encoding variants, "
            "scoring, the improved model's write), eager and compiled", arguments, run,
            smoke=["--model", "tiny", "--evals", "1", "--train-steps", "1", "--compile", "none",
                   "--variants", "as-is", "tokenised once"],
            meaning="An evaluation every few hundred steps must cost a small share of training: the pieces "
                    "say which to make cheaper.", gpu=True)
