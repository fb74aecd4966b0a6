"""``python -m platform.cluster slurm [--nodes N] [--gpus-per-node G] ... [--print] -- COMMAND...``:
one platform command (a sweep, a run) across a Slurm allocation.

The verb renders ``.cluster/slurm-<name>.sbatch`` from ``cluster.env`` (``CLUSTER_NAME``, Slurm's
own ``SBATCH_PARTITION``, ``SBATCH_ACCOUNT``, ``SBATCH_QOS``, ``SBATCH_TIMELIMIT``,
``PLATFORM_DATA_DIR``, ``MLFLOW_TRACKING_URI``) and its options, and submits it with ``sbatch``
(``--print`` renders only). Nothing is installed on the compute nodes: the job runs the venv the
render ran in (the README's install, on the shared filesystem). In the job:

- ``slurm-job``, the batch script's one process on the allocation's first node, starts one Ray
  node per allocated node with ``srun`` (``slurm-node``: the head on the first node, the others
  join it), each offering what Slurm gave that node, on ports and a temp folder of this job, with
  a token of this job (``RAY_AUTH_MODE=token``); it waits until every node has joined;
- MLflow is the user's server when ``MLFLOW_TRACKING_URI`` names one, else a server on the first
  node whose SQLite store sits on that node's local disk (SQLite on NFS is unsafe under concurrent
  writers) and is copied to the shared output folder whenever it changed (at most every
  ``SNAPSHOT_S``) and at the end; a requeued job starts from that copy;
- COMMAND runs as the driver, with checkpoints and sweep state under ``<output>/runs``;
- walltime: Slurm sends SIGUSR1 ``--signal-seconds`` before the end (``--signal=B:USR1@S``); the
  command is stopped as Ctrl-C stops it (its state saved, its runs KILLED), then MLflow's copy
  is made and the job requeues itself. A preemption or ``scontrol requeue`` ends the job with
  SIGTERM, and Slurm requeues it (``--requeue``). Either way the next start runs COMMAND again
  with ``--resume`` where it had begun a sweep (or ``--resume RUN`` for ``train``'s run), so no
  finished trial is redone and the runs left open are closed truthfully;
- at the end Ray and MLflow stop; the job's exit status is the command's.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from platform.errors import ConfigError, UserError

ROOT = Path(__file__).resolve().parent.parent
COMMANDS = ("train", "tune", "evaluate", "augment", "compare", "report")  # what a job may run: python -m platform.X
NAME = re.compile(r"[a-z][a-z0-9-]{0,39}")
# Slurm's --time: minutes, minutes:seconds, hours:minutes:seconds, days-hours, days-hours:minutes,
# days-hours:minutes:seconds.
TIME = re.compile(r"(?:(?P<days>\d+)-(?P<dh>\d+)(?::(?P<dm>\d+)(?::(?P<ds>\d+))?)?"
                  r"|(?P<a>\d+)(?::(?P<b>\d+)(?::(?P<c>\d+))?)?)")
MEMORY = re.compile(r"\d+[KMGT]?")
SIGNAL_S = 300  # the walltime warning: time for a sweep to save its state and MLflow's copy to be made
SNAPSHOT_S = 30  # the most MLflow's shared copy lags behind the store
JOIN_TIMEOUT_S = 600  # how long the nodes get to join the head
# Each job's Ray workers take ports from a window of Ray's default range, chosen by the job's id
# (two jobs of one user on one node must not share one).
WORKER_PORTS, WINDOWS = (10002, 19999), 24
SETTINGS = {"SBATCH_PARTITION": "partition", "SBATCH_ACCOUNT": "account", "SBATCH_QOS": "qos",
            "SBATCH_TIMELIMIT": "time"}
# The lowest Linux driver each CUDA major release runs on (NVIDIA's CUDA toolkit release notes,
# "CUDA Toolkit and Minimum Required Driver Version", minor-version compatibility).
MIN_DRIVER = {11: 450, 12: 525, 13: 580}


@dataclass
class SlurmJob:
    """What a rendered job asks Slurm for and runs."""
    name: str
    command: list[str]
    out: Path
    venv: Path
    nodes: int = 1
    gpus_per_node: int = 0
    cpus_per_task: int | None = None
    mem: str | None = None
    time: str | None = None
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    signal_s: int = SIGNAL_S
    env: dict[str, str] = field(default_factory=dict)  # exported before the job runs

    @property
    def script(self) -> Path:
        return ROOT / ".cluster" / f"slurm-{self.name}.sbatch"


def seconds(limit: str) -> int:
    """Slurm's ``--time`` in seconds; a malformed one is a ConfigError."""
    m = TIME.fullmatch(limit.strip())
    if not m:
        raise ConfigError(f"--time {limit!r} is not one of Slurm's formats (minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, "
                          "D-HH:MM:SS)")
    g = {k: int(v) for k, v in m.groupdict().items() if v is not None}
    if "days" in g:
        return ((g["days"] * 24 + g["dh"]) * 60 + g.get("dm", 0)) * 60 + g.get("ds", 0)
    parts = [g[k] for k in ("a", "b", "c") if k in g]
    return {1: lambda a: a * 60, 2: lambda a, b: a * 60 + b, 3: lambda a, b, c: (a * 60 + b) * 60 + c}[len(parts)](*parts)


def platform_command(command: list[str]) -> str:
    """The platform command COMMAND runs (``tune``, ``train``, ...); anything else is refused."""
    if len(command) >= 3 and Path(command[0]).name.startswith("python") and command[1] == "-m" \
            and command[2].removeprefix("platform.") in COMMANDS and command[2].startswith("platform."):
        return command[2].removeprefix("platform.")
    shown = shlex.join(command) if command else "nothing"
    raise ConfigError(f"COMMAND must be a platform command after --, such as python -m platform.tune una ... "
                      f"({', '.join(COMMANDS)}); got {shown[:120]}")


def check(job: SlurmJob) -> SlurmJob:
    """Each mistake one line, before anything is written or submitted."""
    platform_command(job.command)
    if not NAME.fullmatch(job.name):
        raise ConfigError(f"the job's name {job.name!r} (--name or CLUSTER_NAME) must be 1-40 lowercase letters, "
                          "digits and hyphens, starting with a letter")
    if job.nodes < 1:
        raise ConfigError(f"--nodes must be at least 1, got {job.nodes}")
    if job.gpus_per_node < 0 or (job.cpus_per_task is not None and job.cpus_per_task < 1):
        raise ConfigError("--gpus-per-node must be 0 or more and --cpus-per-task at least 1")
    if job.mem is not None and not MEMORY.fullmatch(job.mem):
        raise ConfigError(f"--mem {job.mem!r} must be a number with an optional unit K, M, G or T (Slurm's --mem)")
    if job.signal_s < 60:
        raise ConfigError(f"--signal-seconds must be at least 60 (Slurm sends its signals up to a minute late), "
                          f"got {job.signal_s}")
    if job.time is not None and seconds(job.time) <= job.signal_s:
        raise ConfigError(f"--time {job.time} leaves no time before the walltime warning "
                          f"({job.signal_s} s before the end): ask for more, or lower --signal-seconds")
    if not (job.venv / "bin" / "python").is_file():
        raise ConfigError(f"no Python environment at {job.venv}: run this from the README's venv (. .venv/bin/activate)")
    uri = job.env.get("MLFLOW_TRACKING_URI")
    if uri and not uri.startswith(("http://", "https://")):
        raise ConfigError(f"MLFLOW_TRACKING_URI={uri} is not a tracking server: unset it (the job starts one) or "
                          "name your server (http://...); a file store on a shared filesystem is unsafe")
    if job.gpus_per_node and "+cpu" in installed_torch(job.venv):
        raise ConfigError(f"--gpus-per-node {job.gpus_per_node}, but {job.venv} holds torch's CPU build "
                          f"({installed_torch(job.venv)}): install the CUDA lock there (pip install --require-hashes "
                          "-r requirements/cuda.txt; docs/cluster.md, 'On a Slurm cluster')")
    return job


def installed_torch(venv: Path) -> str:
    """The torch release in ``venv`` (``2.13.0+cpu`` for the CPU build), from its metadata."""
    for meta in (venv / "lib").glob("python3*/site-packages/torch-*.dist-info/METADATA"):
        for line in meta.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
    return "none"


def render(job: SlurmJob) -> str:
    """The batch script: what Slurm is asked for, then the job's one process."""
    lines = ["#!/bin/bash",
             f"# Rendered by python -m platform.cluster slurm for {shlex.join(job.command)}; render it again rather "
             "than editing it.",
             f"#SBATCH --job-name={job.name}", f"#SBATCH --nodes={job.nodes}", "#SBATCH --ntasks-per-node=1"]
    asked = {"cpus-per-task": job.cpus_per_task, "gpus-per-node": job.gpus_per_node or None, "mem": job.mem,
             "time": job.time, "partition": job.partition, "account": job.account, "qos": job.qos}
    lines += [f"#SBATCH --{key}={value}" for key, value in asked.items() if value is not None]
    lines += [f"#SBATCH --output={job.out}/slurm-%j.out", "#SBATCH --open-mode=append",  # a requeued start appends
              "#SBATCH --requeue", f"#SBATCH --signal=B:USR1@{job.signal_s}",
              "set -eu", f"cd {shlex.quote(str(ROOT))}", f". {shlex.quote(str(job.venv / 'bin' / 'activate'))}"]
    lines += [f"export {key}={shlex.quote(value)}" for key, value in job.env.items()]
    lines.append(f"exec python -m platform.cluster slurm-job --out {shlex.quote(str(job.out))} --name {job.name} -- "
                 + shlex.join(job.command))
    return "\n".join(lines) + "\n"


def submit(job: SlurmJob, dry: bool) -> int:
    """Write the script; unless ``dry``, ``sbatch`` it and say where its log and MLflow will be."""
    script = job.script
    if not dry and shutil.which("sbatch") is None:
        raise ConfigError("sbatch is not on PATH: run this on the cluster's login node (or --print to render only)")
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(render(job), encoding="utf-8")
    if dry:
        sys.stdout.write(script.read_text(encoding="utf-8"))
        print(f"# written to {script}; submit it with: sbatch {script}", file=sys.stderr)
        return 0
    job.out.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise UserError(f"sbatch refused {script}: {' '.join(proc.stderr.split())[:300]}")
    job_id = proc.stdout.strip().split(";")[0]
    print(f"submitted job {job_id} ({script})")
    print(f"log: {job.out}/slurm-{job_id}.out")
    if job.env.get("MLFLOW_TRACKING_URI"):
        print(f"MLflow: {job.env['MLFLOW_TRACKING_URI']}")
    else:
        print(f"MLflow: on the job's first node once it runs; its address and the tunnel line are in the log and in "
              f"{job.out}/job-{job_id}/mlflow.json")
    return 0


def parse(argv: list[str], values: dict[str, str]) -> SlurmJob:
    """The verb's options (``cluster.env``'s ``values`` as defaults) and COMMAND after ``--``."""
    if "--" in argv:
        at = argv.index("--")
        argv, command = argv[:at], argv[at + 1:]
    else:
        command = []
    p = argparse.ArgumentParser(prog="python -m platform.cluster slurm",
                                description="Run a platform command across a Slurm allocation (docs/cluster.md).",
                                usage="%(prog)s [options] -- python -m platform.tune METHOD ...")
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--gpus-per-node", type=int, default=0)
    p.add_argument("--cpus-per-task", type=int, default=None, help="CPUs of each node's one task (Slurm's default if unset)")
    p.add_argument("--mem", default=None, help="memory per node (Slurm's --mem, e.g. 64G)")
    for option, key in (("--time", "SBATCH_TIMELIMIT"), ("--partition", "SBATCH_PARTITION"),
                        ("--account", "SBATCH_ACCOUNT"), ("--qos", "SBATCH_QOS")):
        p.add_argument(option, default=values.get(key) or None, help=f"Slurm's {option} (default: {key} in cluster.env)")
    p.add_argument("--signal-seconds", type=int, default=SIGNAL_S,
                   help=f"the walltime warning: seconds before the end (default {SIGNAL_S})")
    p.add_argument("--name", default=values.get("CLUSTER_NAME") or "platform", help="the job's name (default CLUSTER_NAME)")
    p.add_argument("--output", type=Path, default=None,
                   help="the shared folder of the job's logs, runs and MLflow copy (default .cluster/slurm-NAME)")
    p.add_argument("--print", action="store_true", help="render the script and print it; submit nothing")
    p.add_argument("--env-file", type=Path, default=None, help="the settings' file (default cluster.env)")
    args = p.parse_args(argv)
    env = {key: value for key in ("PLATFORM_DATA_DIR", "MLFLOW_TRACKING_URI", "HF_HOME", "HF_HUB_OFFLINE")
           if (value := os.environ.get(key) or values.get(key))}
    for key in ("PLATFORM_DATA_DIR", "HF_HOME"):  # the job runs elsewhere: folders named as the shared filesystem has them
        if key in env:
            env[key] = str(Path(env[key]).expanduser().resolve())
    out = (args.output or ROOT / ".cluster" / f"slurm-{args.name}").expanduser().resolve()
    return SlurmJob(args.name, command, out, Path(sys.prefix), args.nodes, args.gpus_per_node, args.cpus_per_task,
                    args.mem, args.time, args.partition, args.account, args.qos, args.signal_seconds, env)


def main(argv: list[str], env_file: Path) -> int:
    from platform.cluster import read_env

    options = argv[: argv.index("--")] if "--" in argv else argv
    named = [options[i + 1] for i, a in enumerate(options[:-1]) if a == "--env-file"]
    env_file = Path(named[-1]) if named else env_file
    values = read_env(env_file) if named or env_file.is_file() else {}
    return submit(check(parse(argv, values)), "--print" in options)


# ------------------------------------------------------------------------------------------------
# In the job: the batch script's process (slurm-job) and one task per node (slurm-node)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def node_ip() -> str:
    import ray.util

    return ray.util.get_node_ip_address()


def write_json(path: Path, value: dict) -> None:
    """``value`` at ``path`` in one step (a reader on another node never sees half of it)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(value), encoding="utf-8")
    os.replace(tmp, path)


def wait_for(path: Path, timeout: float, alive) -> dict:
    deadline = time.monotonic() + timeout
    while not path.is_file():
        if not alive() or time.monotonic() > deadline:
            return {}
        time.sleep(0.5)
    return json.loads(path.read_text(encoding="utf-8"))


def gpu_check() -> str | None:
    """Why this node's torch cannot use its GPUs (the driver and the CUDA build it would need), or None."""
    import torch

    if torch.cuda.is_available() or torch.version.cuda is None:
        return None
    proc = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                          text=True)
    driver = (proc.stdout.split() or ["unknown"])[0]
    return driver_refusal(driver, torch.version.cuda, torch.__version__)


def driver_refusal(driver: str, cuda: str, torch_version: str) -> str:
    """One line: this NVIDIA driver does not run torch built for ``cuda``, what would."""
    major = int(cuda.split(".")[0])
    try:
        runs = [m for m, least in MIN_DRIVER.items() if int(driver.split(".")[0]) >= least]
    except ValueError:
        runs = []
    fits = f"a lock for CUDA {max(runs)} (docs/cluster.md, 'Older NVIDIA drivers')" if runs else "a newer driver"
    return (f"NVIDIA driver {driver} does not run torch {torch_version} (built for CUDA {cuda}, which needs driver "
            f"{MIN_DRIVER.get(major, '?')} or newer): use {fits}")


def node_task(attempt: Path) -> int:
    """One Ray node of the job on this node (``srun``'s task): the head on the allocation's first
    node, else a node joining it; until Ray ends or the job stops it."""
    rank = int(os.environ.get("SLURM_NODEID", "0"))
    job_id = int(os.environ.get("SLURM_JOB_ID", "0"))
    cpus = int(os.environ.get("SLURM_CPUS_ON_NODE") or os.cpu_count() or 1)
    gpus = len([d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()])
    if gpus:
        refusal = gpu_check()
        if refusal:
            write_json(attempt / f"refused-{rank}.json", {"node": socket.gethostname(), "why": refusal})
            print(f"error: {socket.gethostname()}: {refusal}", file=sys.stderr)
            return 3
    ip = node_ip()
    # Ray's AF_UNIX sockets live under the temp folder: its path must stay short (107 bytes).
    temp = Path(tempfile.gettempdir()) / f"pr-{job_id}.{os.environ.get('SLURM_RESTART_COUNT', '0')}"
    low = WORKER_PORTS[0] + (job_id % WINDOWS) * ((WORKER_PORTS[1] - WORKER_PORTS[0]) // WINDOWS)
    args = ["ray", "start", "--block", "--disable-usage-stats", f"--node-ip-address={ip}", f"--num-cpus={cpus}",
            f"--num-gpus={gpus}", f"--temp-dir={temp}", f"--min-worker-port={low}",
            f"--max-worker-port={low + (WORKER_PORTS[1] - WORKER_PORTS[0]) // WINDOWS - 1}"]
    args += [f"--{name}={free_port()}" for name in ("node-manager-port", "object-manager-port", "metrics-export-port",
                                                     "dashboard-agent-listen-port", "dashboard-agent-grpc-port",
                                                     "runtime-env-agent-port")]
    head_file = attempt / "head.json"
    if rank == 0:
        port = free_port()
        args += ["--head", f"--port={port}", f"--ray-client-server-port={free_port()}", "--dashboard-host=127.0.0.1",
                 f"--dashboard-port={free_port()}"]
    else:
        head = wait_for(head_file, JOIN_TIMEOUT_S, lambda: True)
        if not head:
            print(f"error: {socket.gethostname()}: the head did not start within {JOIN_TIMEOUT_S} s", file=sys.stderr)
            return 3
        args.append(f"--address={head['address']}")
    log = open(attempt / f"ray-node-{rank}.log", "ab")
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    for sig in (signal.SIGTERM, signal.SIGINT):  # ray start --block ends its processes on these
        signal.signal(sig, lambda signum, frame: proc.send_signal(signum))
    if rank == 0:
        while proc.poll() is None:
            try:
                socket.create_connection((ip, port), timeout=2).close()
                break
            except OSError:
                time.sleep(0.5)
        write_json(head_file, {"address": f"{ip}:{port}", "node": socket.gethostname()})
    print(f"{socket.gethostname()}: Ray node {rank} ({ip}, {cpus} CPUs, {gpus} GPUs)", flush=True)
    code = proc.wait()
    shutil.rmtree(temp, ignore_errors=True)
    return code


class MlflowServer:
    """The job's own MLflow server on this node: its SQLite store on local disk, restored from the
    shared copy and copied back (``snapshot``); basic authentication with an account of the output folder."""

    def __init__(self, out: Path, local: Path):
        self.copy, self.store = out / "mlflow" / "mlflow.db", local / "mlflow.db"
        self.artifacts = out / "mlflow" / "artifacts"
        self.proc: subprocess.Popen | None = None
        self.copied = 0.0

    def start(self, log: Path) -> dict[str, str]:
        from platform.cluster import write_mlflow_auth, write_private

        self.store.parent.mkdir(parents=True, exist_ok=True)
        self.artifacts.mkdir(parents=True, exist_ok=True)
        if self.copy.is_file():
            copy_database(self.copy, self.store)
        password_file = self.copy.parent / "admin-password"
        if not password_file.is_file():
            write_private(password_file, secrets.token_urlsafe(24))
        account = {"MLFLOW_TRACKING_USERNAME": "platform",
                   "MLFLOW_TRACKING_PASSWORD": password_file.read_text(encoding="utf-8").strip()}
        auth = write_mlflow_auth(self.store.parent / "basic_auth.ini", account["MLFLOW_TRACKING_USERNAME"],
                                 account["MLFLOW_TRACKING_PASSWORD"])
        ip, port = node_ip(), free_port()
        env = {**os.environ, "MLFLOW_AUTH_CONFIG_PATH": str(auth), "MLFLOW_FLASK_SERVER_SECRET_KEY": secrets.token_hex(16),
               "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        self.proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "mlflow"), "server", "--app-name", "basic-auth", "--host", ip, "--port",
             str(port), "--workers", "2", "--backend-store-uri", f"sqlite:///{self.store}",
             "--artifacts-destination", self.artifacts.as_uri()],
            stdout=open(log, "ab"), stderr=subprocess.STDOUT, env=env, start_new_session=True)
        uri = f"http://{ip}:{port}"
        deadline = time.monotonic() + 180
        import urllib.request

        while True:
            try:
                with urllib.request.urlopen(uri + "/health", timeout=2):
                    break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise UserError(f"the job's MLflow server did not start (its log: {log})") from None
                time.sleep(0.5)
        return {"MLFLOW_TRACKING_URI": uri, **account}

    def snapshot(self, force: bool = False) -> None:
        """The shared copy made again when the store changed since the last one."""
        changed = max((p.stat().st_mtime for p in (self.store, self.store.with_name("mlflow.db-wal")) if p.exists()),
                      default=0.0)
        if self.store.exists() and (force or changed > self.copied):
            self.copied = time.time()
            try:
                copy_database(self.store, self.copy)
            except (sqlite3.Error, OSError) as exc:  # the previous copy stays; the next try may succeed
                print(f"slurm: MLflow's copy not made this time ({exc}); {self.copy} is the previous one", flush=True)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)


def copy_database(source: Path, target: Path) -> None:
    """SQLite's online backup of ``source`` (consistent while MLflow writes), put at ``target`` in one step."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}")
    try:
        with sqlite3.connect(f"file:{source}?mode=ro", uri=True) as src, sqlite3.connect(tmp) as dst:
            src.backup(dst)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def resume_arguments(command: list[str], first_start: float, job_id: str) -> list[str]:
    """What a requeued start adds to COMMAND: ``--resume`` where the job had begun a sweep (the
    newest of its method under its output_dir, begun after the job first started), ``--resume RUN``
    where it had begun ``train``'s run; nothing otherwise (the command starts again)."""
    from platform.config import build_config

    kind = platform_command(command)
    if kind == "tune":
        from platform.sweep_runs import latest_sweep
        from platform.tune import parse_args

        args = parse_args(command[3:])
        if args.resume:
            return []
        base = build_config(args)
        found = latest_sweep(base.output_dir, base.method)
        if found and time.mktime(time.strptime(found[0].rstrip("/").rsplit("-sweep-", 1)[1], "%Y%m%d-%H%M%S")) \
                >= int(first_start):
            return ["--resume"]
    if kind == "train":
        from platform import storage
        from platform.train import parse_args

        args = parse_args(command[3:])
        if args.run_name and not args.resume and storage.exists(storage.join(build_config(args).output_dir,
                                                                              args.run_name)):
            return ["--resume", args.run_name]
    return []


def named_run(command: list[str], name: str, job_id: str) -> list[str]:
    """``train``'s run named after the job (unless COMMAND names it), so that a requeued start finds it."""
    if platform_command(command) == "train" and not any(a == "--run-name" or a.startswith("--run-name=")
                                                          for a in command):
        return [*command, "--run-name", f"{name}-{job_id}"]
    return command


class Stop:
    """What ended the job's command: Slurm's walltime warning (SIGUSR1), or its SIGTERM."""

    def __init__(self):
        self.walltime = self.terminated = False
        self.command: subprocess.Popen | None = None

    def on_usr1(self, signum, frame) -> None:
        self.walltime = True
        print("slurm: the walltime is near; the command stops and the job requeues itself", flush=True)
        self._forward()

    def on_term(self, signum, frame) -> None:
        self.terminated = self.terminated or time.monotonic()  # when: SIGKILL follows KillWait later
        print("slurm: the job is ending (preemption, scontrol requeue or scancel); the command stops", flush=True)
        self._forward()

    def _forward(self) -> None:
        # The command takes SIGTERM as Ctrl-C (platform.errors), once however often it is sent:
        # Slurm signals the whole job too.
        if self.command is not None and self.command.poll() is None:
            self.command.send_signal(signal.SIGTERM)


def job_main(out: Path, name: str, command: list[str]) -> int:
    """The job's one process on its first node: Ray on every node, MLflow, the command, the end."""
    job_id = os.environ["SLURM_JOB_ID"]
    nodes = int(os.environ.get("SLURM_JOB_NUM_NODES") or os.environ.get("SLURM_NNODES") or 1)
    restart = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
    folder = out / f"job-{job_id}"
    attempt = folder / f"attempt-{restart}"
    attempt.mkdir(parents=True, exist_ok=True)
    started = folder / "first-start"
    if not started.exists():
        started.write_text(str(time.time()), encoding="utf-8")
    first_start = float(started.read_text(encoding="utf-8"))
    stop = Stop()
    signal.signal(signal.SIGUSR1, stop.on_usr1)
    signal.signal(signal.SIGTERM, stop.on_term)
    from platform.cluster import write_private

    token = write_private(attempt / "ray_token", secrets.token_hex(32) + "\n")
    # output_dir's default in the job, for the command and for finding what a requeued start resumes.
    os.environ["PLATFORM_OUTPUT_DIR"] = os.environ.get("PLATFORM_OUTPUT_DIR") or str(out / "runs")
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token), "PLATFORM_CLUSTER": name}
    print(f"slurm: job {job_id}{f' (start {restart + 1}, requeued)' if restart else ''}: {nodes} node(s) "
          f"{os.environ.get('SLURM_JOB_NODELIST', '')}", flush=True)
    step = subprocess.Popen(["srun", f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1", "--overlap",
                             "--kill-on-bad-exit=1", sys.executable, "-m", "platform.cluster", "slurm-node",
                             str(attempt)], env=env)
    local = Path(tempfile.gettempdir()) / f"platform-mlflow-{job_id}"
    server = None
    code = 1
    try:
        head = wait_for(attempt / "head.json", JOIN_TIMEOUT_S, lambda: step.poll() is None and not stop.terminated)
        if not head:
            return fail_start(attempt, f"the Ray head did not start (its log: {attempt}/ray-node-0.log)")
        env["RAY_ADDRESS"] = head["address"]
        if not joined(head["address"], nodes, env, step, stop):
            return fail_start(attempt, f"{nodes} node(s) did not all join the head within {JOIN_TIMEOUT_S} s "
                                       f"(their logs: {attempt}/ray-node-*.log)")
        if not os.environ.get("MLFLOW_TRACKING_URI"):
            server = MlflowServer(out, local)
            env.update(server.start(attempt / "mlflow-server.log"))
            address = env["MLFLOW_TRACKING_URI"]
            write_json(folder / "mlflow.json", {"uri": address, "user": "platform",
                                                "password_file": str(server.copy.parent / "admin-password")})
            host, port = address.removeprefix("http://").split(":")
            print(f"slurm: MLflow at {address} (user platform, password in {server.copy.parent / 'admin-password'}); "
                  f"from your machine: ssh -N -L 5000:{host}:{port} LOGIN-NODE, then http://127.0.0.1:5000", flush=True)
        command = named_run(command, name, job_id)
        if restart:
            command = [*command, *resume_arguments(command, first_start, job_id)]
        print(f"slurm: running {shlex.join(command)}", flush=True)
        # A session of its own: what is left of it when Slurm ends the job is ended here (with
        # proctrack/linuxproc, a process whose parent was killed first escapes the job and would
        # still drive the sweep that the next start resumes).
        stop.command = subprocess.Popen(command, env=env, start_new_session=True)
        copied_at_stop, grace = False, kill_wait() - 5
        while stop.command.poll() is None:
            time.sleep(1)
            if server is not None and stop.terminated and not copied_at_stop:
                # Ended by Slurm: the server goes with the job and SIGKILL follows within KillWait,
                # so the copy is made now, not after the command.
                server.snapshot(force=True)
                copied_at_stop = True
            elif server is not None and time.time() - server.copied > SNAPSHOT_S:
                server.snapshot()
            if stop.terminated and time.monotonic() - stop.terminated > grace:
                print(f"slurm: the command did not end within {grace:.0f} s of Slurm's SIGTERM; ended", flush=True)
                os.killpg(stop.command.pid, signal.SIGKILL)
                stop.command.wait()
        code = stop.command.returncode
    finally:
        if server is not None:
            server.snapshot(force=True)
            server.stop()
            shutil.rmtree(local, ignore_errors=True)
        end_step(step)
    if stop.walltime and not stop.terminated:
        requeue = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True)
        print(f"slurm: job {job_id} requeued" if requeue.returncode == 0 else
              f"slurm: could not requeue job {job_id}: {requeue.stderr.strip()}", flush=True)
    print(f"slurm: the command exited {code}", flush=True)
    return code


def kill_wait() -> float:
    """Slurm's KillWait: the seconds between the SIGTERM that ends a job and its SIGKILL (30 unless
    the site says otherwise)."""
    proc = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True)
    found = re.search(r"^KillWait\s*=\s*(\d+)", proc.stdout, re.M)
    return float(found.group(1)) if found else 30.0


def fail_start(attempt: Path, why: str) -> int:
    refused = [json.loads(p.read_text(encoding="utf-8")) for p in attempt.glob("refused-*.json")]
    print(f"error: {'; '.join(r['node'] + ': ' + r['why'] for r in refused) or why}", file=sys.stderr, flush=True)
    return 3


def joined(address: str, nodes: int, env: dict[str, str], step: subprocess.Popen, stop: Stop) -> bool:
    """Whether all ``nodes`` Ray nodes are alive, waited for (the command sizes its work by them)."""
    probe = ("import ray, sys, time\n"
             "ray.init(address=sys.argv[1], logging_level='ERROR', log_to_driver=False)\n"
             "while sum(n['Alive'] for n in ray.nodes()) < int(sys.argv[2]): time.sleep(1)\n")
    proc = subprocess.Popen([sys.executable, "-c", probe, address, str(nodes)], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    while proc.poll() is None:
        if step.poll() is not None or stop.terminated or time.monotonic() > deadline:
            proc.kill()
            return False
        time.sleep(0.5)
    if proc.returncode == 0:
        print(f"slurm: all {nodes} node(s) joined Ray at {address}", flush=True)
    return proc.returncode == 0


def end_step(step: subprocess.Popen) -> None:
    """The job's Ray nodes stopped: srun passes SIGTERM on to each ``ray start --block``."""
    if step.poll() is None:
        step.send_signal(signal.SIGTERM)
        try:
            step.wait(timeout=60)
        except subprocess.TimeoutExpired:
            step.kill()
