"""What an evaluation's checkpoint costs the step loop, with and without the checkpoint policy,
side by side in one run: bytes written and seconds the loop is blocked per evaluation, for a
bert-base-sized model (random weights, 110M parameters, AdamW state; ``--size tiny`` for a
check) on one Ray Train worker whose storage is a local S3 emulator (moto).

- before: every evaluation writes the full state (model, its exported copy, optimizer) and Ray
  Train uploads it while the loop waits (no policy);
- after: the platform's own ``RayTrainRuntime.report`` under ``checkpoint.Policy`` with the paper
  profile's 15 minutes: the model only when STS-B dev improves, nothing otherwise, the full state
  at the last evaluation; uploads in the background.

The STS-B dev sequence is fixed (8 evaluations, 4 improving), so both runs write for the same
events. ``--gap S``: S seconds of training between evaluations (a sleep; 0: evaluations back to
back, the worst case, where a report waits for the previous upload: Ray Train hands reports to
its controller in order). Usage::

    python -m benchmarks run checkpoint-cost [--evaluations 8] [--gap 0]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from benchmarks.harness import Bench, Case

DEVS = [70.0, 72.0, 71.5, 74.0, 73.0, 73.5, 75.0, 74.8]  # improving at evaluations 1, 2, 4, 7


def _du(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _model_and_optimizer(size: str):
    import torch
    from transformers import BertConfig, BertModel, get_constant_schedule

    from platform.data.columns import TINY_BERT

    torch.manual_seed(0)
    model = BertModel(BertConfig(**(TINY_BERT if size == "tiny" else {})))  # bert-base: 12 layers, 768 wide
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-5)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()  # AdamW's two moments exist, as after any real step
    return model, optimizer, get_constant_schedule(optimizer)


def worker(config: dict) -> None:
    """One Ray Train worker: the evaluations' checkpoints, timed where the loop waits."""
    import ray.train

    from platform.config import TrainConfig
    from platform import checkpoint
    from platform.run.loop import RayTrainRuntime, WorkerContext
    from platform.run.loop import Points

    model, optimizer, schedule = _model_and_optimizer(config.get("size", "bert-base"))
    rows = []
    devs = config["devs"]
    if config["mode"] == "before":
        for i, dev in enumerate(devs, 1):
            time.sleep(config["gap"])
            t0 = time.perf_counter()
            folder = Path(tempfile.mkdtemp(prefix="ckpt-"))
            checkpoint.save(folder, model, {"step": i, "stsb_dev_spearman": dev})
            checkpoint.save_train_state(folder, model, optimizer, schedule, checkpoint.Position(step=i))
            size = _du(folder)
            ray.train.report({"step": i, "stsb_dev_spearman": dev},
                             checkpoint=ray.train.Checkpoint.from_directory(str(folder)))  # uploaded on return
            shutil.rmtree(folder, ignore_errors=True)
            rows.append({"evaluation": i, "kind": "state", "bytes": size, "blocked_s": time.perf_counter() - t0})
    else:
        cfg = TrainConfig.build("simcse", "paper", {"checkpoint_minutes": 15.0})
        rt = RayTrainRuntime(WorkerContext(cfg=cfg, runtime="ray", run_dir=config["fit_folder"]), cfg)
        log = Points()
        pos = checkpoint.Position()
        for i, dev in enumerate(devs, 1):
            time.sleep(config["gap"])
            pos.step = i
            improved = pos.improve(dev)
            kind = rt.policy.kind(improved, epoch=0, last=i == len(devs))
            written = {}

            def write(folder: Path, name: str, kind=kind, improved=improved, i=i, dev=dev, written=written) -> None:
                state = {"step": i, "stsb_dev_spearman": dev}
                checkpoint.save(folder, model if improved else None,
                                state if kind == "state" else {**state, "resume_from": rt.kept.state})
                if kind == "state":
                    checkpoint.save_train_state(folder, model, optimizer, schedule, pos)
                    checkpoint.save_points(folder, log.kept)
                written["bytes"] = _du(folder)

            t0 = time.perf_counter()
            rt.report({"step": i, "epoch": 0, "stsb_dev_spearman": dev}, write, kind, improved)
            rows.append({"evaluation": i, "kind": kind or "-", "bytes": written.get("bytes", 0),
                         "blocked_s": time.perf_counter() - t0})
        t0 = time.perf_counter()
        rt.close()  # the background uploads' commits, awaited once at the loop's end
        rows.append({"evaluation": "end", "kind": "wait for uploads", "bytes": 0, "blocked_s": time.perf_counter() - t0})
    Path(config["out"]).write_text(json.dumps(rows))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--evaluations", type=int, default=len(DEVS))
    p.add_argument("--gap", type=float, default=0.0, help="seconds of training between evaluations")
    p.add_argument("--size", default="bert-base", choices=["bert-base", "tiny"])


def run(args: argparse.Namespace, bench: Bench) -> None:
    devs = (DEVS * (args.evaluations // len(DEVS) + 1))[: args.evaluations]

    port = _free_port()
    moto = subprocess.Popen([str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.environ.update({"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "testing",
                       "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1"})
    try:
        import boto3
        import ray
        import ray.train
        from ray.train.torch import TorchTrainer

        from platform.run.ray_env import init_ray

        for _ in range(50):
            try:
                boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"]).create_bucket(Bucket="bench")
                break
            except Exception:
                time.sleep(0.2)
        init_ray(num_cpus=2)
        results = {}
        with tempfile.TemporaryDirectory() as tmp:
            for mode in ("before", "after"):
                out = Path(tmp) / f"{mode}.json"
                storage = f"s3://bench/{mode}"
                TorchTrainer(
                    worker,
                    train_loop_config={"mode": mode, "devs": devs, "gap": args.gap, "out": str(out), "fit_folder": f"{storage}/{mode}",
                                       "size": args.size},
                    scaling_config=ray.train.ScalingConfig(num_workers=1, resources_per_worker={"CPU": 1}),
                    run_config=ray.train.RunConfig(
                        name=mode, storage_path=storage,
                        checkpoint_config=ray.train.CheckpointConfig(num_to_keep=1 if mode == "before" else None)),
                ).fit()
                results[mode] = json.loads(out.read_text())
        ray.shutdown()
    finally:
        moto.terminate()
        moto.wait()

    print(f"{len(devs)} evaluations {args.gap:g} s apart, {args.size}-sized model with AdamW state, "
          "storage: S3 (moto)")
    print(f"{'evaluation':>10} | {'dev':>5} | {'before: kind':>12} {'MB':>8} {'blocked s':>9} | "
          f"{'after: kind':>16} {'MB':>8} {'blocked s':>9}")
    for b, a in zip(results["before"], results["after"]):
        dev = devs[b["evaluation"] - 1]
        print(f"{b['evaluation']:>10} | {dev:5.1f} | {b['kind']:>12} {b['bytes'] / 1e6:8.1f} {b['blocked_s']:9.2f} | "
              f"{a['kind']:>16} {a['bytes'] / 1e6:8.1f} {a['blocked_s']:9.2f}")
    end = results["after"][-1]
    print(f"{'end':>10} | {'':>5} | {'':>12} {'':>8} {'':>9} | {end['kind']:>16} {'':>8} {end['blocked_s']:9.2f}")
    for mode in ("before", "after"):
        rows = [r for r in results[mode] if r["evaluation"] != "end"]
        print(f"{mode}: {sum(r['bytes'] for r in rows) / 1e9:.2f} GB written, blocked {sum(r['blocked_s'] for r in rows):.1f} s "
              f"in all, at most {max(r['blocked_s'] for r in rows):.2f} s at one evaluation")
        bench.figure(f"{mode}_blocked_s", sum(r["blocked_s"] for r in rows))
        bench.figure(f"{mode}_gb_written", sum(r["bytes"] for r in rows) / 1e9)
    if bench.figures["after_blocked_s"] > 0:
        bench.ratio("loop blocked, every state written / the policy", bench.figures["before_blocked_s"]
                    / bench.figures["after_blocked_s"], "> 1")


CASE = Case("checkpoint-cost", "what an evaluation's checkpoint costs the training loop on S3 storage: every "
            "state written (no policy) beside the platform's checkpoint policy", arguments, run,
            smoke=["--evaluations", "3", "--size", "tiny"],
            meaning="The policy writes the model only when STS-B dev improves and uploads in the background: "
                    "the loop's blocked seconds are what a run pays per evaluation.")
