"""SimCSE at the speed of the hardware: three measurements side by side in one run.

    python -m benchmarks run train-step --tokenizer .dev/prepared/tokenizer   # GPU: bert-base (random weights), batch 64, length 32, bf16
    python -m benchmarks run train-step --model minilm --precision fp32 --steps 30 --warmup 5 --eager-only   # this CPU

(a) ``platform``: ``train_loop_per_worker`` in the process runtime (no Ray, no MLflow), STS-B dev every
    ``--eval-steps`` steps as a run does, timed inside one run between two synchronised steps (after
    ``--warmup`` steps, to the last); once eager, once with ``static_shapes`` + ``compile``; each also
    without evaluations (what (b) does).
(b) ``sentence-transformers``: the same objective in its own trainer (``MultipleNegativesRankingLoss`` on
    (s, s) pairs: in-batch negatives, scale 20 = 1/0.05, dropout views), its defaults, bf16 on a GPU,
    same backbone, batch and length, no evaluation. Needs ``datasets`` and ``accelerate`` (not in the lock:
    ``pip install datasets accelerate``); skipped with one line without them.
(c) ``device``: the loop's own step (its fused optimiser, precision, clipping and compile mode) on batches
    already on the device at the fixed width, nothing read back: the ceiling. Every ratio that misses
    its target is flagged on the results page.

Reports ms/step, sentences/s, minutes per 1M sentences, MFU (dense bf16 peak, ``--peak-tflops``) and the
ratios. Without ``$PLATFORM_DATA_DIR`` (the GPU machine has no data) the corpus is made of random words of
the tokenizer's vocabulary and STS-B dev of 1,500 random pairs: an evaluation costs what STS-B dev costs;
its score means nothing. MFU counts 3 x (2 x non-embedding parameters + 4 x layers x length x hidden)
FLOPs per token, two dropout views per sentence. The GPU machine lacks the packaged MiniLM, whose tokenizer
(bert-base-uncased's vocabulary) the random models take: the paper-precision case's ``--prepare-to`` saves it
beside the data, and ``--tokenizer`` names that folder (carry it to the machine).
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time
from pathlib import Path


import torch

from methods.encoder import load_tokenizer
from platform.config import TrainConfig
from platform.data.columns import prepare_corpus
from platform.run.loop import WorkerContext, compile_backbone, make_optimizer, train_loop_per_worker
from benchmarks.common import dev_pairs, random_bert, sentences
from benchmarks.harness import Bench, Case


def random_backbone(kind: str, folder: Path, tokenizer: str | None = None) -> str:
    """bert-base (BertConfig()'s 12 x 768) or the tests' tiny BERT, random weights, with ``tokenizer``
    (``benchmarks.common.random_bert``); or the packaged MiniLM itself (``minilm``)."""
    if kind == "minilm":
        from methods.encoder import pretrained_source

        return str(pretrained_source("minilm")[0])
    return random_bert(folder, kind, tokenizer)


@contextlib.contextmanager
def step_clock(warmup: int, total: int):
    """Times the loop from inside one run: the device synchronised after step ``warmup`` and after
    step ``total`` (``loop.apply_step`` wrapped), nothing else waited for; yields the list that
    receives the seconds between."""
    from platform.run import loop

    original, count, marks, out = loop.apply_step, [0], [], []

    def timed(*args):
        original(*args)
        count[0] += 1
        if count[0] in (warmup, total):
            Bench.sync()
            marks.append(time.perf_counter())
            if len(marks) == 2:
                out.append(marks[1] - marks[0])

    loop.apply_step = timed
    try:
        yield out
    finally:
        loop.apply_step = original


_WARM: set = set()


def platform_step(cfg: TrainConfig, corpus, dev, steps: int, warmup: int) -> float:
    """Seconds per step of a run's loop, evaluations included: ``steps`` steps timed inside one run
    after ``warmup`` (start-up, compiling and the first batches' making are before the clock)."""
    def run(n: int) -> list[float]:
        flat = TrainConfig.from_flat({**cfg.flat(), "max_steps": n})
        with step_clock(warmup, n) as seconds:
            train_loop_per_worker(WorkerContext(cfg=flat, corpus=corpus, run_dir=tempfile.mkdtemp(), dev=dev))
        return seconds

    if (cfg.static_shapes, cfg.compile) not in _WARM:  # one-time costs (CUDA context, kernels, compiling)
        run(warmup + 1)
        _WARM.add((cfg.static_shapes, cfg.compile))
    return run(warmup + steps)[0] / steps


def device_step(cfg: TrainConfig, corpus, steps: int, warmup: int) -> float:
    """The ceiling: the loop's own step (``forward_backward``, clipping, the fused optimiser's
    ``apply_step``, its precision and compile mode) on batches already on the device at the run's
    fixed width, cycled; nothing made on the host, nothing read back."""
    from methods.encoder import Encoder
    from platform.data.pipeline import StepInputs
    from platform.run.loop import apply_step, clip_gradients, forward_backward, local_batches, mixed_precision

    torch.manual_seed(0)
    recipe = cfg.build_recipe()
    encoder = Encoder.from_pretrained(cfg.model, dropout=cfg.dropout)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = compile_backbone(recipe.build(encoder, cfg.max_len, cfg.batch_size), cfg.compile).to(device)
    optimizer, schedule = make_optimizer(cfg, recipe, model, steps + warmup)
    autocast, scaler = mixed_precision(cfg.precision, device)
    inputs = StepInputs(recipe, cfg.model, cfg.max_len, static=True)
    batches = [inputs.nest(inputs.collate(inputs.arrays(rows)), device)
               for rows, _ in zip(local_batches(corpus.columns, cfg, 0, 1, 0), range(8))]
    model.train()

    def step(i):
        forward_backward(recipe, model, batches[i % len(batches)], i, 0, autocast, scaler, 1)
        scaler.unscale_(optimizer)
        clip_gradients(model, cfg.max_grad_norm)
        apply_step(optimizer, schedule, scaler)
        optimizer.zero_grad(set_to_none=True)

    for i in range(warmup):
        step(i)
    Bench.sync()
    t0 = time.perf_counter()
    for i in range(steps):
        step(i)
    Bench.sync()
    return (time.perf_counter() - t0) / steps


def st_step(model_path: str, corpus: list[str], batch: int, max_len: int, steps: int, warmup: int, bf16: bool) -> float | None:
    """sentence-transformers' trainer on (s, s) pairs, MultipleNegativesRankingLoss: seconds per step
    (its train_runtime over steps, the warm-up run subtracted)."""
    try:
        import accelerate  # noqa: F401
        import datasets
        from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer, SentenceTransformerTrainingArguments, losses, models
    except ImportError as exc:
        print(f"(b) skipped: sentence-transformers' trainer needs {exc.name} (pip install datasets accelerate)")
        return None

    def run(n: int) -> float:
        word = models.Transformer(model_path, max_seq_length=max_len)
        model = SentenceTransformer(modules=[word, models.Pooling(word.get_word_embedding_dimension(), "cls")])
        data = datasets.Dataset.from_dict({"anchor": corpus[: n * batch], "positive": corpus[: n * batch]})
        args = SentenceTransformerTrainingArguments(
            output_dir=tempfile.mkdtemp(), per_device_train_batch_size=batch, max_steps=n, bf16=bf16,
            learning_rate=3e-5, save_strategy="no", report_to=[], logging_steps=10**6, disable_tqdm=True)
        trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=data,
                                             loss=losses.MultipleNegativesRankingLoss(model, scale=20.0))
        return trainer.train().metrics["train_runtime"]

    run(warmup)
    return (run(warmup + steps) - run(warmup)) / steps


def precision_context(precision: str, device: torch.device):
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    return torch.autocast(device.type, dtype=dtype) if dtype and device.type == "cuda" else contextlib.nullcontext()


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="bert-base", help="bert-base | tiny (random weights) | minilm (packaged)")
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--max-len", type=int, default=32)
    p.add_argument("--eval-steps", type=int, default=125)
    p.add_argument("--precision", default="bf16", help="fp32 | fp16 | bf16 (GPU only)")
    p.add_argument("--compile-mode", default="reduce-overhead", help="torch.compile mode of the static variant")
    p.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak (H100 SXM: 989)")
    p.add_argument("--tokenizer", default=None, help="the random models' tokenizer: a folder (the paper-precision case's "
                   "--prepare-to saves one in .dev/prepared/tokenizer) or a name; default the packaged MiniLM's")
    p.add_argument("--eager-only", action="store_true", help="skip the static+compile variant (minutes of compiling on a CPU)")


def run(args: argparse.Namespace, bench: Bench) -> None:
    gpu = torch.cuda.is_available()
    torch.backends.cuda.matmul.allow_tf32 = True
    out = Path(tempfile.mkdtemp())
    model = random_backbone(args.model, out / "model", args.tokenizer)
    tokenizer = load_tokenizer(model)
    n = (args.warmup * 3 + args.steps) * args.batch_size
    text = sentences(n, tokenizer)
    corpus_file = out / "corpus.txt"
    corpus_file.write_text("\n".join(text) + "\n")
    base = {"model": model, "corpus": str(corpus_file), "batch_size": args.batch_size, "max_len": args.max_len,
            "eval_steps": args.eval_steps, "output_dir": str(out / "runs"), "final_eval": False, "use_gpu": gpu,
            "precision": args.precision, "runtime": "process", "checkpoint_minutes": 10**6}
    dev = dev_pairs(tokenizer)

    from transformers import AutoConfig, AutoModel

    config = AutoConfig.from_pretrained(model)
    non_embedding = sum(q.numel() for k, q in AutoModel.from_config(config).named_parameters() if "embeddings" not in k)
    per_token = 3 * (2 * non_embedding + 4 * config.num_hidden_layers * args.max_len * config.hidden_size)
    step_flops = per_token * 2 * args.batch_size * args.max_len
    device = torch.cuda.get_device_name() if gpu else f"cpu ({torch.get_num_threads()} threads)"
    print(f"device={device} torch={torch.__version__} model={args.model} batch={args.batch_size} max_len={args.max_len} "
          f"precision={args.precision if gpu else 'fp32'} steps={args.steps} eval every {args.eval_steps} (in (a) only)")
    print("| path | ms/step | sentences/s | min per 1M sentences | MFU |")
    print("|---|---|---|---|---|", flush=True)
    rows: dict[str, float] = {}

    def row(name: str, seconds: float | None) -> None:
        """Printed as soon as measured: a run cut short by its time limit keeps what it measured."""
        if seconds is None:
            return
        rows[name] = seconds
        mfu = f"{100 * step_flops / seconds / (args.peak_tflops * 1e12):.1f}%" if gpu else "n/a (CPU)"
        print(f"| {name} | {seconds * 1e3:.1f} | {args.batch_size / seconds:,.0f} | "
              f"{1e6 / args.batch_size * seconds / 60:.2f} | {mfu} |", flush=True)

    def variant(name: str, extra: dict) -> None:
        cfg = TrainConfig.build("simcse", "paper", {**base, **extra})
        corpus = prepare_corpus(cfg.build_recipe(), text, use_ray=False)
        row(f"(a) platform, {name}", platform_step(cfg, corpus, dev, args.steps, args.warmup))
        # The same loop evaluating only at its end, which the subtraction takes out: (b)'s work.
        quiet = TrainConfig.from_flat({**cfg.flat(), "eval_steps": 10**9})
        row(f"(a) platform, {name}, no evaluation", platform_step(quiet, corpus, dev, args.steps, args.warmup))
        row(f"(c) device step, {name}", device_step(cfg, corpus, args.steps, args.warmup))

    # Eager first, then (b), then the compiled variant (minutes of compiling): a run cut short
    # still has the comparison that needs no compiler.
    variant("eager", {})
    try:
        row("(b) sentence-transformers trainer",
            st_step(model, text, args.batch_size, args.max_len, args.steps, args.warmup, gpu and args.precision == "bf16"))
    except Exception as exc:  # a benchmark of someone else's trainer: its failure is a line, not our run's end
        print(f"(b) failed: {type(exc).__name__}: {exc}", flush=True)
    if not args.eager_only:
        variant("static+compile", {"static_shapes": True, "compile": args.compile_mode})
    st = rows.get("(b) sentence-transformers trainer")
    for name in ("eager", "static+compile"):
        if st is not None and f"(a) platform, {name}, no evaluation" in rows:
            target = ">= 2 on a GPU" if gpu else ">= 1 on a CPU"
            bench.ratio(f"throughput (a) {name} / (b), with evaluations", st / rows[f"(a) platform, {name}"], target)
            bench.ratio(f"throughput (a) {name} / (b), no evaluation", st / rows[f"(a) platform, {name}, no evaluation"],
                        target)
    for name in ("eager", "static+compile"):
        loop, quiet, ceiling = (rows.get(f"(a) platform, {name}"), rows.get(f"(a) platform, {name}, no evaluation"),
                                rows.get(f"(c) device step, {name}"))
        if loop and quiet:
            bench.ratio(f"(a) {name}, with evaluations / without", loop / quiet, "<= 1.10")
        if quiet and ceiling:
            # Under 1 the "ceiling" is not one: the bare step is slower than the loop around it.
            bench.ratio(f"(a) {name}, no evaluation / (c) device step", quiet / ceiling, ">= 1")
            bench.ratio(f"(a) {name}, no evaluation / (c) device step, within 10 %", quiet / ceiling, "<= 1.10")
        if gpu and quiet:
            bench.ratio(f"MFU (a) {name}, no evaluation", step_flops / quiet / (args.peak_tflops * 1e12), ">= 0.25")
    if gpu and "(a) platform, static+compile" in rows:
        bench.ratio("ms/step (a) static+compile, with evaluations", 1e3 * rows["(a) platform, static+compile"], "<= 11.5")


CASE = Case("train-step", "SimCSE's training step at hardware speed: the platform's loop (eager, compiled), "
            "sentence-transformers' trainer and the bare device step, side by side; MFU on a GPU", arguments, run,
            smoke=["--model", "tiny", "--steps", "3", "--warmup", "1", "--batch-size", "8", "--eval-steps", "2",
                   "--precision", "fp32", "--eager-only"],
            meaning="The loop against the bare device step says what the platform adds per step; against "
                    "sentence-transformers' trainer, whether its throughput leads; MFU, how close to the GPU's peak.", gpu=True)
