"""VaSCL cost: step time vs SimCSE at the same batch, and peak memory at batch 1024.

    PLATFORM_DATA_DIR=../shared/data python -m benchmarks run vascl [--batch 64] [--steps 6] [--memory-batch 1024]

Step time: packaged MiniLM, length 32, interleaved SimCSE / VaSCL steps (forward, backward,
AdamW), median after one warm-up step. Target ratio <= 1.3 (the extra work is the head, the
virtual-augmentation gradient through it and one more backward through it).
Memory: one training step in a fresh process per method; peak resident memory (ru_maxrss) minus
the resident memory before the step.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

import torch

from methods.encoder import Encoder
from methods.recipe import Recipe
from platform.data import data_dir, read_corpus
from benchmarks.harness import ROOT, Bench, Case


def sentences(n: int) -> list[str]:
    return read_corpus(data_dir() / "corpus" / "wiki1m_for_simcse.first11914.txt.gz", limit=n)


def one_step(method, model, enc, opt, chunk, step):
    loss, _ = method.loss(model, {"sentence": enc.tokenize(chunk, max_len=32)}, step)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def bench_steps(batch: int, steps: int, bench: Bench):
    sents = sentences(batch * (steps + 1))
    torch.manual_seed(0)
    enc = Encoder.from_pretrained("minilm")
    methods = {"simcse": Recipe.named("simcse"), "vascl": Recipe.named("vascl", pooler="cls_before_pooler")}
    models = {k: m.build(enc) for k, m in methods.items()}
    opts = {k: torch.optim.AdamW(m.param_groups(models[k], 1e-5)) for k, m in methods.items()}
    times = {k: [] for k in methods}
    for s in range(steps + 1):
        chunk = sents[s * batch : (s + 1) * batch]
        for k in methods:
            t = time.perf_counter()
            one_step(methods[k], models[k], enc, opts[k], chunk, s)
            if s:
                times[k].append(time.perf_counter() - t)
    a, b = statistics.median(times["simcse"]), statistics.median(times["vascl"])
    print(f"step (minilm, batch {batch}, len 32, CPU, same pooler): SimCSE {a * 1e3:.0f} ms, VaSCL {b * 1e3:.0f} ms, "
          f"ratio {b / a:.2f}", flush=True)
    bench.ratio("step VaSCL / SimCSE", b / a, "<= 1.3")


def memory_child(name: str, batch: int) -> None:
    torch.manual_seed(0)
    enc = Encoder.from_pretrained("minilm")
    method = Recipe.named("simcse") if name == "simcse" else Recipe.named("vascl", pooler="cls_before_pooler", k=16)
    model = method.build(enc)
    opt = torch.optim.AdamW(method.param_groups(model, 1e-5))
    chunk = sentences(batch)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t = time.perf_counter()
    one_step(method, model, enc, opt, chunk, 0)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"name": name, "step_mb": (peak - before) / 1024, "peak_mb": peak / 1024, "s": time.perf_counter() - t}))


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--memory-batch", type=int, default=1024)



def run(args: argparse.Namespace, bench: Bench) -> None:
    bench_steps(args.batch, args.steps, bench)
    for name in ("simcse", "vascl"):  # each in a fresh process: its own peak
        child = ("import sys; sys.modules.pop('platform', None); from benchmarks.cases.vascl import memory_child; "
                 f"memory_child({name!r}, {args.memory_batch})")
        out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, cwd=ROOT)
        line = [x for x in out.stdout.splitlines() if x.startswith("{")]
        if not line:
            raise SystemExit(out.stderr[-2000:])
        r = json.loads(line[0])
        print(f"memory, batch {args.memory_batch} ({name}): step adds {r['step_mb']:.0f} MB, peak RSS {r['peak_mb']:.0f} MB, "
              f"step {r['s']:.1f} s", flush=True)
        bench.figure(f"memory_step_mb_{name}", r["step_mb"])


CASE = Case("vascl", "VaSCL's cost: the training step beside SimCSE's at the same batch, and the memory one step "
            "adds at the paper's batch of 1024", arguments, run,
            smoke=["--batch", "24", "--steps", "2", "--memory-batch", "24"],
            meaning="The extra work is the head, the virtual augmentation's gradient through it and one more "
                    "backward; the memory is what the K-nearest neighbourhood adds at the paper's batch.")
