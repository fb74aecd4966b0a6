"""SimCSE training-step throughput on one GPU: bert-base-sized random BERT, batch 64, length 32, bf16.

No Ray or MLflow needed (the GPU machine has neither). Reports tokens/s, sentences/s and
model-FLOPs utilisation (MFU) against the GPU's dense bf16 peak, and the projected time for one
epoch of 1M sentences. Target: MFU >= 40%, i.e. 1M sentences in <= 5 minutes with STS-B dev evals.

    python benchmarks/gpu_step.py [--steps 50] [--compile] [--peak-tflops 989]

MFU counts the model FLOPs of a training step (forward + backward = 3x forward) per token as
2 x (non-embedding parameters) + 4 x layers x seq x hidden (attention scores and values).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
if "platform" in sys.modules and not hasattr(sys.modules["platform"], "__path__"):
    del sys.modules["platform"]

import torch  # noqa: E402
from transformers import BertConfig, BertModel  # noqa: E402

from methods.encoder import Encoder  # noqa: E402
from methods.recipe import Recipe  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--compile", action="store_true")
    p.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak (H100 SXM: 989)")
    args = p.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = True

    config = BertConfig()  # bert-base: 12 layers, 768 hidden, 30522 vocab
    backbone = BertModel(config)
    method = Recipe.named("simcse")
    model = method.build(Encoder(backbone, tokenizer=None)).to(device)
    if args.compile:
        model = torch.compile(model)
    opt = torch.optim.AdamW([q for q in model.parameters() if q.requires_grad], lr=3e-5, fused=device.type == "cuda")
    ids = torch.randint(1000, config.vocab_size, (args.batch_size, args.seq), device=device)
    batch = {"sentence": {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)}}

    def step():
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            loss, _ = method.loss(model, batch, 0)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(args.warmup):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / args.steps

    non_embedding = sum(q.numel() for n, q in backbone.named_parameters() if "embeddings" not in n)
    tokens = 2 * args.batch_size * args.seq  # two dropout views per sentence
    flops_per_token = 2 * non_embedding + 4 * config.num_hidden_layers * args.seq * config.hidden_size
    step_flops = 3 * flops_per_token * tokens
    mfu = step_flops / dt / (args.peak_tflops * 1e12)
    sents = args.batch_size / dt
    print(f"device={torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'} compile={args.compile}")
    print(f"step {dt * 1e3:.2f} ms; {tokens / dt:,.0f} tokens/s; {sents:,.0f} sentences/s; MFU {100 * mfu:.1f}%")
    print(f"1M sentences: {1e6 / sents / 60:.2f} min of training steps (plus STS-B dev every 125 steps)")


if __name__ == "__main__":
    main()
