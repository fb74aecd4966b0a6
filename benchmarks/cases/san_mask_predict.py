"""SAN's mask-predict on a GPU: the masked LM's share of generating 1M negatives (target: 1M
sentences x 4 rounds in <= 10 min on one H100).

    PLATFORM_DATA_DIR=../shared/data python -m benchmarks run san-mask-predict [--tokenizer DIR] [--n 20000] [--batch 64 256]

A bert-base-sized ``BertForMaskedLM`` with random weights (BertConfig(): 12 x 768, the paper
profile's MLM size; ``--size tiny`` for a check) in float32 as SAN generates (the authors'
precision), ``mask_predict`` with 4 greedy rounds and each row's own draws (``RowDraws``), on the
first ``--n`` corpus sentences. The POS probabilities are random in [0, 0.2] instead of spaCy's tags
(the GPU machine has no spaCy; static tagging is a vocabulary look-up, measured by the san case), so
this is the MLM's part, which is what needs the GPU. Runs without Ray or MLflow.
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import BertConfig, BertForMaskedLM

from benchmarks.harness import Bench, Case
from methods.encoder import load_tokenizer
from methods.san import RowDraws, mask_predict
from platform.data import data_dir, read_corpus
from platform.data.columns import TINY_BERT


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tokenizer", default="minilm", help="an uncased BERT tokenizer folder (default: the packaged MiniLM's)")
    p.add_argument("--n", type=int, default=20000)
    p.add_argument("--batch", type=int, nargs="+", default=[64, 256])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--size", default="bert-base", choices=["bert-base", "tiny"])


def run(args: argparse.Namespace, bench: Bench) -> None:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tokenizer = load_tokenizer(args.tokenizer)
    torch.manual_seed(0)
    config = BertConfig(**TINY_BERT) if args.size == "tiny" else BertConfig(vocab_size=tokenizer.vocab_size)
    mlm = BertForMaskedLM(config).eval().to(device).float()
    sents = read_corpus(data_dir() / "corpus" / "wiki1m_for_simcse.first11914.txt.gz")
    sents = (sents * (args.n // len(sents) + 1))[: args.n]
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    print(f"device={name} n={args.n} rounds={args.rounds} MLM {args.size}-sized fp32")
    print("| batch | sentences/s | minutes per 1M sentences |\n|---|---|---|")
    for bs in args.batch:
        gen = torch.Generator().manual_seed(0)
        start = time.perf_counter()
        for i in range(0, len(sents), bs):
            enc = tokenizer(sents[i : i + bs], padding=True, truncation=True, max_length=512, return_tensors="pt")
            probs = torch.rand(enc["input_ids"].shape, generator=gen) * 0.2
            ids = mask_predict(mlm, tokenizer, enc["input_ids"].to(device), enc["attention_mask"].to(device),
                               probs.to(device), args.rounds, RowDraws(0, range(i, i + len(enc["input_ids"]))))
            tokenizer.batch_decode(ids.cpu(), skip_special_tokens=True)
        Bench.sync()
        rate = bench.figure(f"sentences_per_s_batch_{bs}", len(sents) / (time.perf_counter() - start))
        print(f"| {bs} | {rate:,.0f} | {1e6 / rate / 60:.1f} |", flush=True)


CASE = Case("san-mask-predict", "SAN's mask-predict with a bert-base-sized MLM: sentences/s and minutes per 1M "
            "negatives (the GPU's share of SAN's generation)", arguments, run,
            smoke=["--size", "tiny", "--n", "64", "--batch", "32"],
            meaning="Generating SAN's negatives for a 1M-sentence corpus must fit in minutes on one GPU.", gpu=True)
