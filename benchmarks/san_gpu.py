"""SAN's mask-predict on a GPU: the masked LM's share of generating 1M negatives (issue 4's target:
1M sentences x 4 rounds in <= 10 min on one H100).

    PLATFORM_DATA_DIR=../shared/data python benchmarks/san_gpu.py --tokenizer DIR [--n 20000] [--batch 64 256]

A bert-base-sized ``BertForMaskedLM`` with random weights (BertConfig(): 12 x 768, the paper
profile's MLM size) in float32 as SAN generates (the authors' precision), ``mask_predict`` with 4
greedy rounds and each row's own draws (``RowDraws``), on the first ``--n`` corpus sentences. The
POS probabilities are random in [0, 1/scale * 4] instead of spaCy's tags (the GPU machine has no
spaCy; static tagging is a vocabulary look-up, 33k sentences/s on one CPU thread, measured in
``san_speed.py``), so this is the MLM's part, which is what needs the GPU. Runs without Ray or MLflow.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.modules.pop("platform", None)

import torch  # noqa: E402
from transformers import AutoTokenizer, BertConfig, BertForMaskedLM  # noqa: E402

from methods.san import RowDraws, mask_predict  # noqa: E402
from platform.data import data_dir, read_corpus  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tokenizer", required=True, help="an uncased BERT tokenizer folder")
    p.add_argument("--n", type=int, default=20000)
    p.add_argument("--batch", type=int, nargs="+", default=[64, 256])
    p.add_argument("--rounds", type=int, default=4)
    args = p.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    torch.manual_seed(0)
    mlm = BertForMaskedLM(BertConfig(vocab_size=tokenizer.vocab_size)).eval().to(device).float()
    sents = read_corpus(data_dir() / "corpus" / "wiki1m_for_simcse.first11914.txt.gz")
    sents = (sents * (args.n // len(sents) + 1))[: args.n]
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    print(f"device={name} n={args.n} rounds={args.rounds} MLM bert-base-sized fp32")
    for bs in args.batch:
        gen = torch.Generator().manual_seed(0)
        start = time.perf_counter()
        for i in range(0, len(sents), bs):
            enc = tokenizer(sents[i : i + bs], padding=True, truncation=True, max_length=512, return_tensors="pt")
            probs = torch.rand(enc["input_ids"].shape, generator=gen) * 0.2
            ids = mask_predict(mlm, tokenizer, enc["input_ids"].to(device), enc["attention_mask"].to(device),
                               probs.to(device), args.rounds, RowDraws(0, range(i, i + len(enc["input_ids"]))))
            tokenizer.batch_decode(ids.cpu(), skip_special_tokens=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        rate = len(sents) / (time.perf_counter() - start)
        print(f"| {bs} | {rate:,.0f} sentences/s | 1M sentences: {1e6 / rate / 60:.1f} min |", flush=True)


if __name__ == "__main__":
    main()
