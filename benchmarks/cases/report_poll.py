"""Wall time of a short ``python -m platform.train`` on Ray with Ray Train's report poll at Ray's
default (2 s) and at the platform's (0.5 s), side by side.

A Train worker holds one report (metrics + checkpoint) at a time and the controller collects it
when it polls the workers (``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S``): with evaluations a few steps
apart, every report after the first waits for the next poll. Same command, alternating runs
(2 s, 0.5 s, 2 s, ...) so machine noise hits both; the tiny random BERT of the tests, one worker,
no final evaluation. Each run starts its own local Ray, as a user's command does.

    PLATFORM_DATA_DIR=../shared/data python -m benchmarks run report-poll [--steps 8] [--eval-steps 2] [--repeats 3]
"""

from __future__ import annotations

import argparse
import gzip
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from platform.settings import TRAIN_POLL as TRAIN_POLL_ENV
from platform.data.columns import build_tiny_bert
from benchmarks.harness import ROOT, Bench, Case


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--eval-steps", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)


def run(args: argparse.Namespace, bench: Bench) -> None:
    work = Path(tempfile.mkdtemp(prefix="poll-bench-"))
    model = build_tiny_bert(work / "tiny-bert")
    corpus = work / "corpus.txt"
    with gzip.open(Path(os.environ["PLATFORM_DATA_DIR"]) / "corpus" / "wiki1m_for_simcse.first11914.txt.gz", "rt") as f:
        corpus.write_text("".join(next(f) for _ in range(300)))
    times: dict[str, list[float]] = {"2": [], "0.5": []}
    for r in range(args.repeats):
        for poll in times:
            sets = {"model": model, "corpus": corpus, "batch_size": 8, "max_steps": args.steps,
                    "eval_steps": args.eval_steps, "num_workers": 1, "final_eval": "false",
                    "data_pipeline": "local", "output_dir": work / f"runs-{r}-{poll}"}
            cmd = [sys.executable, "-m", "platform.train", "simcse", *[a for k, v in sets.items() for a in ("--set", f"{k}={v}")]]
            env = {**os.environ, TRAIN_POLL_ENV: poll, "HF_HUB_OFFLINE": "1", "MLFLOW_TRACKING_URI": f"sqlite:///{work}/mlflow.db"}
            t0 = time.perf_counter()
            subprocess.run(cmd, cwd=ROOT, env=env, check=True, capture_output=True)
            times[poll].append(time.perf_counter() - t0)
            print(f"repeat {r}: poll {poll:>3} s  {times[poll][-1]:.1f} s", flush=True)
    slow, fast = statistics.median(times["2"]), statistics.median(times["0.5"])
    print(f"steps={args.steps} eval_steps={args.eval_steps} ({args.steps // args.eval_steps} reports)  "
          f"median wall time: poll 2 s {slow:.1f} s, poll 0.5 s {fast:.1f} s  ({slow - fast:.1f} s saved, "
          f"ratio {slow / fast:.2f})")
    bench.ratio("wall time, poll 2 s / poll 0.5 s", slow / fast, "> 1")


CASE = Case("report-poll", "a short run's wall time with Ray Train's report poll at Ray's default (2 s) and at "
            "the platform's (0.5 s)", arguments, run, smoke=["--steps", "2", "--eval-steps", "2", "--repeats", "1"],
            meaning="Each report waits for the controller's next poll: with evaluations a few steps apart the "
                    "poll interval is paid at every one.")
