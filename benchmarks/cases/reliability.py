"""Reliability costs: checkpoint save/restore, time to resume after a killed worker, Tune's
per-trial overhead.

    PLATFORM_DATA_DIR=../shared/data python -m benchmarks run reliability [--skip-resume]

- checkpoint: the packaged backbone (MiniLM, 22M parameters) in SimCSE's model after one AdamW
  step: writing a resumable checkpoint (HF export + model/heads + optimizer + scheduler + RNG) and
  loading it back into a fresh model and optimizer; median of 5, sizes on disk.
- resume: ``platform.train simcse`` (local profile: MiniLM, 2 gloo workers) in a fresh local Ray;
  one training worker is SIGKILLed 3 s after the first checkpoint; the time from the kill to the
  first new step the restarted group logs to MLflow (its timestamp; steps between the checkpoint
  and the kill run again but are not logged twice), and the run's end status.
- tune: trials per minute for a trainable that returns at once (Ray Tune's own overhead), 2 CPUs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from benchmarks.harness import ROOT, Bench, Case


def folder_mb(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 2**20


def checkpoint_costs(bench: Bench) -> None:
    from transformers import get_linear_schedule_with_warmup

    from methods.encoder import Encoder
    from methods.recipe import Recipe
    from platform import checkpoint
    from platform.checkpoint import Position

    method = Recipe.named("simcse")
    model = method.build(Encoder.from_pretrained("minilm"))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-5)
    sched = get_linear_schedule_with_warmup(opt, 0, 100)
    batch = {"sentence": model.encoder.tokenize(["a first sentence .", "another one here ."] * 8, max_len=32)}
    method.loss(model, batch, 0)[0].backward()
    opt.step()
    sched.step()
    saves, loads = [], []
    for _ in range(5):
        d = Path(tempfile.mkdtemp())
        t0 = time.perf_counter()
        checkpoint.save(d, method.export_encoder(model), {"step": 1})
        checkpoint.save_train_state(d, model, opt, sched, Position(step=1))
        checkpoint.save_rng(d, 0)
        saves.append(time.perf_counter() - t0)
        fresh = method.build(Encoder.from_pretrained("minilm"))
        fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=3e-5)
        fresh_sched = get_linear_schedule_with_warmup(fresh_opt, 0, 100)
        t0 = time.perf_counter()
        checkpoint.load_train_state(d, 0, fresh, fresh_opt, fresh_sched)
        loads.append(time.perf_counter() - t0)
        size = folder_mb(d)
        shutil.rmtree(d)
    bench.figure("checkpoint_mib", size)
    bench.figure("checkpoint_save_s", statistics.median(saves))
    bench.figure("checkpoint_restore_s", statistics.median(loads))
    print(f"checkpoint (MiniLM + SimCSE head + AdamW): {size:.0f} MiB; save median {statistics.median(saves):.2f}s, "
          f"restore median {statistics.median(loads):.2f}s (5 repeats)")


def resume_time(bench: Bench) -> None:
    from mlflow.tracking import MlflowClient
    from ray.cluster_utils import Cluster

    tmp = Path(tempfile.mkdtemp())
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    cluster = Cluster(initialize_head=True, connect=False, head_node_args={"num_cpus": 2})
    eval_steps = 8
    sets = {"max_steps": 40, "eval_steps": eval_steps, "log_steps": 1, "batch_size": 16, "final_eval": "false",
            "output_dir": tmp / "runs", "max_sentences": 1024}
    args = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    proc = subprocess.Popen([sys.executable, "-m", "platform.train", "simcse", *args], cwd=ROOT,
                            env={**os.environ, "RAY_ADDRESS": cluster.address, "MLFLOW_TRACKING_URI": uri},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    import psutil

    c = MlflowClient(uri)
    kill_time, killed_step = None, None
    while proc.poll() is None and kill_time is None:
        time.sleep(0.2)
        exp = c.get_experiment_by_name("simcse")
        runs = c.search_runs([exp.experiment_id]) if exp else []
        if not runs:
            continue
        steps = [m.step for m in c.get_metric_history(runs[0].info.run_id, "train_loss")]
        dev = c.get_metric_history(runs[0].info.run_id, "stsb_dev_spearman")
        # Past the first checkpoint, with time for Ray Train's controller to register it.
        if dev and time.time() - dev[0].timestamp / 1000 > 3:
            workers = [p for p in psutil.process_iter(["cmdline"]) if "RayTrainWorker" in " ".join(p.info["cmdline"] or [])]
            if workers:
                killed_step = max(steps)
                kill_time = time.time()
                workers[-1].send_signal(signal.SIGKILL)
    out, _ = proc.communicate()
    run = c.search_runs([c.get_experiment_by_name("simcse").experiment_id])[0]
    after = [m for m in c.get_metric_history(run.info.run_id, "train_loss") if m.timestamp / 1000 > kill_time]
    first = min(after, key=lambda m: m.timestamp)
    resumed = next((line.split("resumed at step")[1].split()[0] for line in out.splitlines() if "resumed at step" in line), "?")
    bench.figure("resume_s", first.timestamp / 1000 - kill_time)
    print(f"resume: worker killed at step {killed_step}, group restarted from the checkpoint of step {resumed}; "
          f"next new step logged (step {first.step}) "
          f"{first.timestamp / 1000 - kill_time:.1f}s after the kill; run {run.info.status}, exit {proc.returncode}")
    cluster.shutdown()
    shutil.rmtree(tmp, ignore_errors=True)


def tune_overhead(bench: Bench, n: int = 40) -> None:
    import ray
    from ray import tune

    ray.init(num_cpus=2, include_dashboard=True, dashboard_host="127.0.0.1")

    def trainable(config):
        return {"score": config["x"]}

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        tune.Tuner(
            trainable, param_space={"x": tune.uniform(0, 1)},
            tune_config=tune.TuneConfig(num_samples=n, metric="score", mode="max"),
            run_config=tune.RunConfig(storage_path=tmp, name="overhead", verbose=0),
        ).fit()
        sec = time.perf_counter() - t0
    ray.shutdown()
    bench.figure("tune_s_per_trial", sec / n)
    print(f"tune: {n} instant trials in {sec:.1f}s = {n / sec * 60:.0f} trials/min ({sec / n:.2f}s per trial)")


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--skip-resume", action="store_true")
    p.add_argument("--only-resume", action="store_true")
    p.add_argument("--trials", type=int, default=40, help="Tune's instant trials")


def run(args: argparse.Namespace, bench: Bench) -> None:
    if not args.only_resume:
        checkpoint_costs(bench)
        tune_overhead(bench, args.trials)
    if not args.skip_resume:
        resume_time(bench)


CASE = Case("reliability", "what reliability costs: a resumable checkpoint's save and restore, the time from a "
            "killed worker to its group's next step, Tune's overhead per trial", arguments, run,
            smoke=["--skip-resume", "--trials", "4"],
            meaning="Checkpoints and restarts are paid in every run that survives a failure; Tune's per-trial "
                    "overhead bounds how short a trial can usefully be.")
