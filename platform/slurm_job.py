"""Inside a Slurm job that ``python -m platform.cluster slurm`` submitted (``platform/cluster_slurm.py``):
``python -m platform.slurm_job --out DIR --name NAME -- COMMAND...`` is the batch script's one process
(Ray on every node, MLflow, the command, the walltime and requeues); ``python -m platform.slurm_job
node ATTEMPT`` is one Ray node, ``srun``'s task on each allocated node."""

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
import urllib.request
from pathlib import Path

from platform import storage
from platform.cluster_files import write_mlflow_auth, write_private
from platform.cluster_slurm import JOIN_TIMEOUT_S, SNAPSHOT_S, WINDOWS, WORKER_PORTS, driver_refusal, platform_command
from platform.config import add_run_arguments, build_config
from platform.errors import UserError, cli_main
from platform.mlflow_backup import copy_database
from platform.run.ray_env import answers, free_port
from platform.sweep_runs import latest_sweep

def node_ip() -> str:
    import ray.util

    return ray.util.get_node_ip_address()


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
            storage.write_json(attempt / f"refused-{rank}.json", {"node": socket.gethostname(), "why": refusal})
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
        while proc.poll() is None and answers(ip, port, timeout=2) is not None:
            time.sleep(0.5)
        storage.write_json(head_file, {"address": f"{ip}:{port}", "node": socket.gethostname()})
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


def command_arguments(command: list[str]) -> argparse.Namespace:
    """COMMAND's run arguments (method, profile, --set, ...), ``--run-name`` and ``--resume``, as the
    command itself reads them; its other options are left aside."""
    p = argparse.ArgumentParser(add_help=False)
    add_run_arguments(p, sweep=platform_command(command) == "tune")
    p.add_argument("--run-name")
    p.add_argument("--resume", nargs="?", const=True)
    return p.parse_known_args(command[3:])[0]


def resume_arguments(command: list[str], first_start: float) -> list[str]:
    """What a requeued start adds to COMMAND: ``--resume`` where the job had begun a sweep (the
    newest of its method under its output_dir, begun after the job first started), ``--resume RUN``
    where it had begun ``train``'s run; nothing otherwise (the command starts again)."""
    kind = platform_command(command)
    if kind not in ("tune", "train"):
        return []
    args = command_arguments(command)
    if args.resume:
        return []
    output_dir = build_config(args).output_dir
    if kind == "tune":
        found = latest_sweep(output_dir, args.method)
        begun = found and time.mktime(time.strptime(found[0].rstrip("/").rsplit("-sweep-", 1)[1], "%Y%m%d-%H%M%S"))
        return ["--resume"] if found and begun >= int(first_start) else []
    if args.run_name and storage.exists(storage.join(output_dir, args.run_name)):
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
    stop = Stop()
    signal.signal(signal.SIGUSR1, stop.on_usr1)
    signal.signal(signal.SIGTERM, stop.on_term)
    token = write_private(attempt / "ray_token", secrets.token_hex(32) + "\n")
    # output_dir's default in the job, for the command and for finding what a requeued start resumes.
    os.environ["PLATFORM_OUTPUT_DIR"] = os.environ.get("PLATFORM_OUTPUT_DIR") or str(out / "runs")
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token), "PLATFORM_CLUSTER": name}
    print(f"slurm: job {job_id}{f' (start {restart + 1}, requeued)' if restart else ''}: {nodes} node(s) "
          f"{os.environ.get('SLURM_JOB_NODELIST', '')}", flush=True)
    step = subprocess.Popen(["srun", f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1", "--overlap",
                             "--kill-on-bad-exit=1", sys.executable, "-m", "platform.slurm_job", "node", str(attempt)],
                            env=env)
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
            say_where(env["MLFLOW_TRACKING_URI"], server, folder)
        command = named_run(command, name, job_id)
        if restart:
            command = [*command, *resume_arguments(command, float(started.read_text(encoding="utf-8")))]
        print(f"slurm: running {shlex.join(command)}", flush=True)
        code = run_command(command, env, stop, server)
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


def say_where(address: str, server: "MlflowServer", folder: Path) -> None:
    """The job's MLflow address, its account and the tunnel line, in the log and in ``mlflow.json``."""
    password = server.copy.parent / "admin-password"
    storage.write_json(folder / "mlflow.json", {"uri": address, "user": "platform", "password_file": str(password)})
    host, port = address.removeprefix("http://").split(":")
    print(f"slurm: MLflow at {address} (user platform, password in {password}); from your machine: "
          f"ssh -N -L 5000:{host}:{port} LOGIN-NODE, then http://127.0.0.1:5000", flush=True)


def run_command(command: list[str], env: dict[str, str], stop: "Stop", server: "MlflowServer | None") -> int:
    """COMMAND until it ends, MLflow's copy kept fresh; its exit status."""
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
    return stop.command.returncode


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


@cli_main
def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["node"]:
        return node_task(Path(argv[1]))
    p = argparse.ArgumentParser(prog="python -m platform.slurm_job")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--name", required=True)
    at = argv.index("--") if "--" in argv else len(argv)
    args = p.parse_args(argv[:at])
    return job_main(args.out, args.name, argv[at + 1:])


if __name__ == "__main__":
    raise SystemExit(main())
