"""CPU the cluster's MLflow server spends per request under basic authentication, with the
credential cache the platform's auth configuration turns on (``auth_cache_ttl_seconds``) and
without it (MLflow's default), side by side on one machine.

Each configuration is a real ``mlflow server --app-name basic-auth`` (SQLite store, one worker,
the account written by ``platform.cluster.write_mlflow_auth``); a client signed in as that account
sends the same requests (``search_runs``, then a ``log_batch`` of 10 points: what a sweep's driver
polls and what a trial's point sender posts). The server process's own CPU time is read from
/proc before and after. Rounds alternate (cache on, off, on, ...) so machine noise hits both.

    PLATFORM_DATA_DIR=../shared/data python -m benchmarks run mlflow-auth [--requests 20] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from benchmarks.harness import Bench, Case

ACCOUNT = {"MLFLOW_TRACKING_USERNAME": "platform", "MLFLOW_TRACKING_PASSWORD": "correct-horse-battery-staple"}


def server_cpu(pid: int) -> float:
    """User + system seconds of the server process and its children (uvicorn's worker)."""
    import psutil

    proc = psutil.Process(pid)
    return sum(sum(p.cpu_times()[:2]) for p in [proc, *proc.children(recursive=True)])


def start_server(base: Path, ttl: int) -> tuple[subprocess.Popen, str]:
    """``mlflow server --app-name basic-auth`` on a free port, as cluster.yaml's head starts it,
    with the auth file ``write_mlflow_auth`` writes (its cache line set to ``ttl``)."""
    from platform import cluster
    from platform.run.ray_env import free_port

    auth = cluster.write_mlflow_auth(base / "basic_auth.ini", *ACCOUNT.values(), cache_ttl_s=ttl)
    port = free_port()
    env = {**os.environ, "MLFLOW_AUTH_CONFIG_PATH": str(auth), "MLFLOW_FLASK_SERVER_SECRET_KEY": secrets.token_hex(16),
           "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    proc = subprocess.Popen([str(Path(sys.executable).with_name("mlflow")), "server", "--app-name", "basic-auth",
                             "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
                             "--backend-store-uri", f"sqlite:///{base / 'mlflow.db'}",
                             "--artifacts-destination", (base / "artifacts").as_uri()],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            with urllib.request.urlopen(uri + "/health", timeout=2):
                return proc, uri
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("mlflow server did not start") from None
            time.sleep(0.5)


def one_round(work: Path, template: Path, cached: bool, requests: int) -> tuple[float, float]:
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    from platform.cluster import AUTH_CACHE_TTL_S

    base = Path(tempfile.mkdtemp(dir=work))
    shutil.copyfile(template, base / "mlflow.db")
    proc, uri = start_server(base, AUTH_CACHE_TTL_S if cached else 0)  # 0: MLflow's default, no cache
    try:
        os.environ.update(ACCOUNT)
        client = MlflowClient(uri)
        run = client.create_run(client.create_experiment("bench"))  # the first, uncached check: not counted
        before, t0 = server_cpu(proc.pid), time.perf_counter()
        for i in range(requests):
            client.search_runs([run.info.experiment_id])
            client.log_batch(run.info.run_id, [Metric("loss", 1.0 / (s + 1), 0, i * 10 + s) for s in range(10)])
        return (server_cpu(proc.pid) - before) / (2 * requests), (time.perf_counter() - t0) / (2 * requests)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--requests", type=int, default=20, help="search + log_batch pairs per round")
    p.add_argument("--rounds", type=int, default=2)


def run(args: argparse.Namespace, bench: Bench) -> None:
    from mlflow.tracking import MlflowClient

    work = Path(tempfile.mkdtemp(prefix="mlflow-auth-bench-"))
    template = work / "empty.db"
    MlflowClient(f"sqlite:///{template}").search_experiments()  # the schema once
    results: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    try:
        for _ in range(args.rounds):
            for cached in (True, False):
                results[cached].append(one_round(work, template, cached, args.requests))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{2 * args.requests} requests per round, {args.rounds} rounds, {os.cpu_count()} CPUs")
    for cached in (True, False):
        cpu = statistics.median(c for c, _ in results[cached]) * 1000
        wall = statistics.median(w for _, w in results[cached]) * 1000
        print(f"  credential cache {'on ' if cached else 'off'}: server CPU {cpu:7.1f} ms/request, "
              f"client wall {wall:7.1f} ms/request")
    on = statistics.median(c for c, _ in results[True])
    off = statistics.median(c for c, _ in results[False])
    bench.ratio("server CPU per request, credential cache off / on", off / on, "> 1")


CASE = Case("mlflow-auth", "the CPU the cluster's MLflow server spends per request under basic authentication, "
            "with the platform's credential cache and without it", arguments, run,
            smoke=["--requests", "2", "--rounds", "1"],
            meaning="Every trial's point sender and the sweep's driver talk to this server: its CPU per "
                    "request bounds how many trials one head serves.")
