"""Inside a Slurm job that ``python -m platform.cluster slurm`` submitted (``platform/cluster_slurm.py``):
``python -m platform.slurm_job --out DIR --name NAME -- COMMAND...`` is the batch script's one process
(Ray on every node, MLflow, the command, the walltime and requeues); ``python -m platform.slurm_job
node ATTEMPT`` is one Ray node, ``srun``'s task on each allocated node."""

from __future__ import annotations

import argparse
import ipaddress
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
from dataclasses import dataclass
from pathlib import Path

from platform import settings, storage
from platform.cluster_files import write_mlflow_auth, write_private
from platform.cluster_slurm import (JOIN_TIMEOUT_S, LAUNCHERS, MAX_REQUEUES, SERVICE_PORTS, SIGNAL_S, SNAPSHOT_S, WINDOWS,
                                    WORKER_PORTS, driver_refusal, launcher)
from platform.config import build_config
from platform.errors import UserError, cli_main, one_line
from platform.mlflow_backup import copy_database
from platform.run.ray_env import answers, free_port, raylet_env
from platform.slurm_sizing import command_arguments, fits, platform_command, run_needs
from platform.slurm_status import ask
from platform.sweep_runs import SWEEP_STATE
from platform.tracking import recorder
from platform.tracking.recorder import Run

RAY_LOGS = ("raylet.out", "raylet.err", "gcs_server.out", "gcs_server.err", "monitor.log", "dashboard.log",
            "python-core-driver-*.log", "worker-*.err", "worker-*.out")  # what a node keeps of Ray's session logs
LOG_COPY_S = 120  # how often a node copies Ray's logs to the job's folder while it runs

def node_ip(interface: str | None = None) -> str:
    """This node's address for Ray and MLflow: ``interface``'s (``--node-interface``), else the one of
    the default route (Ray's guess). A loopback or link-local address is refused: the other nodes
    could not reach it."""
    if interface:
        proc = subprocess.run(["ip", "-o", "addr", "show", "dev", interface], capture_output=True, text=True)
        found = re.findall(r"\binet6? ([0-9a-fA-F.:]+)/\d+ .*?scope global", proc.stdout)
        if not found:
            raise UserError(f"--node-interface {interface}: {socket.gethostname()} has no such interface with a global "
                            f"address ({' '.join(proc.stderr.split())[:120] or 'ip addr shows none'})")
        ip = found[0]
    else:
        import ray.util

        ip = ray.util.get_node_ip_address()
    address = ipaddress.ip_address(ip)
    if address.is_loopback or address.is_link_local or address.is_unspecified:
        raise UserError(f"{socket.gethostname()}'s address for Ray is {ip}, which other nodes cannot reach: name the "
                        "interface of the cluster's network with --node-interface IFACE")
    return ip


def hostport(ip: str, port: int) -> str:
    """``ip:port``, an IPv6 address bracketed."""
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


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


@dataclass(frozen=True)
class Container:
    """The image every Ray node and the command run in; the batch's own process (``srun``, the
    requeue, MLflow's server and copy) stays on the host. pyxis takes its options on ``srun``, so the
    command is an ``srun`` step of its own on this node; Apptainer wraps the process
    (``apptainer exec``). Either way the folders the job reads and writes are mounted at their own
    paths, and the image must run the venv there (docs/slurm.md, 'Containers')."""
    kind: str  # "pyxis" or "apptainer"
    image: str
    gpus: bool
    binds: tuple[str, ...]

    @staticmethod
    def of(container: tuple[str, str] | None, gpus: bool, env: dict[str, str], out: Path,
           command: list[str]) -> "Container | None":
        """The job's container (``(kind, image)`` or None), mounting the repository, the venv, ``out``,
        the temp folder, the folders ``env`` names and those of the paths ``command`` names
        (``--set model=/lab/models/x``)."""
        if container is None:
            return None
        named = [Path(p) for arg in command for p in re.findall(r"(?:^|=)(/[^,\s]+)", arg) if Path(p).exists()]
        wanted = [os.getcwd(), sys.prefix, str(out), tempfile.gettempdir(), *(str(p if p.is_dir() else p.parent) for p in named),
                  *(env[k] for k in ("PLATFORM_DATA_DIR", "HF_HOME", "PLATFORM_CACHE_DIR", "PLATFORM_OUTPUT_DIR") if env.get(k))]
        paths = sorted({os.path.abspath(p) for p in wanted})
        binds = tuple(p for p in paths if not any(p != q and p.startswith(q.rstrip("/") + "/") for q in paths))
        return Container(*container, gpus, binds)

    def step(self, args: list[str]) -> list[str]:
        """An ``srun`` step's options and task (``args`` after ``srun``'s own)."""
        if self.kind == "pyxis":
            return [f"--container-image={self.image}", "--container-mounts=" + ",".join(f"{b}:{b}" for b in self.binds),
                    f"--container-workdir={os.getcwd()}", *args]
        return self.wrap(args)

    def wrap(self, args: list[str]) -> list[str]:
        """A process of the batch's own run in the image."""
        if self.kind == "pyxis":
            node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
            return ["srun", "--export=ALL", "--overlap", "--nodes=1", "--ntasks=1", f"--nodelist={node}", *self.step(args)]
        return ["apptainer", "exec", *["--nv"] * self.gpus, "--bind", ",".join(self.binds), "--pwd", os.getcwd(),
                self.image, *args]


def node_task(attempt: Path, interface: str | None = None) -> int:
    """One Ray node of the job on this node (``srun``'s task): the head on the allocation's first
    node, else a node joining it; until Ray ends or the job stops it (``watch``)."""
    rank = int(os.environ.get("SLURM_NODEID", "0"))
    job_id = int(os.environ.get("SLURM_JOB_ID", "0"))
    cpus = int(os.environ.get("SLURM_CPUS_ON_NODE") or os.cpu_count() or 1)
    gpus = len([d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()])
    refusal = gpu_check() if gpus else None
    try:
        ip = node_ip(interface)
    except UserError as exc:
        refusal = refusal or str(exc)
    if refusal:
        storage.write_json(attempt / f"refused-{rank}.json", {"node": socket.gethostname(), "why": refusal})
        print(f"error: {socket.gethostname()}: {refusal}", file=sys.stderr)
        return 3
    # Ray's AF_UNIX sockets live under the temp folder: its path must stay short (107 bytes).
    temp = Path(tempfile.gettempdir()) / f"pr-{job_id}.{attempt.name.rsplit('-', 1)[-1]}"
    low = WORKER_PORTS[0] + (job_id % WINDOWS) * ((WORKER_PORTS[1] - WORKER_PORTS[0]) // WINDOWS)
    ray = str(Path(sys.executable).parent / "ray")  # the venv's, whatever PATH a site's srun passes on
    args = [ray, "start", "--block", "--disable-usage-stats", f"--node-ip-address={ip}", f"--num-cpus={cpus}",
            f"--num-gpus={gpus}", f"--temp-dir={temp}", f"--min-worker-port={low}",
            f"--max-worker-port={low + (WORKER_PORTS[1] - WORKER_PORTS[0]) // WINDOWS - 1}"]
    ports = iter(service_ports(job_id, 9 if rank == 0 else 6))
    args += [f"--{name}={next(ports)}" for name in ("node-manager-port", "object-manager-port", "metrics-export-port",
                                                     "dashboard-agent-listen-port", "dashboard-agent-grpc-port",
                                                     "runtime-env-agent-port")]
    head_file = attempt / "head.json"
    if rank == 0:
        port, dashboard = next(ports), next(ports)
        args += ["--head", f"--port={port}", f"--ray-client-server-port={next(ports)}", "--dashboard-host=127.0.0.1",
                 f"--dashboard-port={dashboard}"]
    else:
        head = wait_for(head_file, JOIN_TIMEOUT_S, lambda: True)
        if not head:
            print(f"error: {socket.gethostname()}: the head did not start within {JOIN_TIMEOUT_S} s", file=sys.stderr)
            return 3
        args.append(f"--address={head['address']}")
    log = open(attempt / f"ray-node-{rank}.log", "ab")
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **raylet_env()})

    def on_signal(signum, frame) -> None:
        if signum == signal.SIGTERM and not (attempt / "stop").exists():
            # Slurm signals the tasks alone first on a preemption with a grace time, and Ray goes
            # with them: the batch (run_command) is told, so that the command stops as it would at
            # the walltime rather than failing on a lost cluster.
            storage.write_json(attempt / f"terminated-{rank}.json", {"node": socket.gethostname(), "at": time.time()})
        proc.send_signal(signum)  # ray start --block ends its processes on these

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    if rank == 0:
        while proc.poll() is None and answers(ip, port, timeout=2) is not None:
            time.sleep(0.5)
        if proc.poll() is None:
            storage.write_json(head_file, {"address": hostport(ip, port), "node": socket.gethostname(),
                                           "dashboard_port": dashboard})
    print(f"{socket.gethostname()}: Ray node {rank} ({ip}, {cpus} CPUs, {gpus} GPUs)", flush=True)
    return watch(proc, attempt, temp, rank)


def service_ports(job_id: int, count: int) -> list[int]:
    """``count`` ports for the job's services on this node: from its window of ``SERVICE_PORTS``,
    ones nothing holds now, outside the kernel's ephemeral range. A port from that range (what
    ``free_port`` gives) can be taken by any outbound connection or ``bind(0)`` on the node before
    Ray binds it, and the node's Ray then fails to start."""
    width = (SERVICE_PORTS[1] - SERVICE_PORTS[0] + 1) // WINDOWS
    low = SERVICE_PORTS[0] + (job_id % WINDOWS) * width
    try:
        first, last = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        first, last = 32768, 60999  # Linux's default
    ports = []
    for port in range(low, low + width):
        if len(ports) == count:
            break
        with socket.socket() as s:
            try:
                s.bind(("", port))
            except OSError:  # held, or closed so recently that the kernel keeps it
                continue
        if not first <= port <= last:
            ports.append(port)
    return ports + [free_port() for _ in range(count - len(ports))]  # a site whose ephemeral range takes the window


def watch(proc: subprocess.Popen, attempt: Path, temp: Path, rank: int) -> int:
    """This node's Ray until it ends: its logs copied into the attempt's folder as it runs and at its
    end; stopped at the job's stop marker (its normal end), and then the task exits 0. A Ray that
    ends unasked is recorded for the job's line (``fail_start``) if the command had not begun."""
    kept = attempt / "ray-logs" / socket.gethostname()
    copied = time.monotonic()
    stopping = False
    while proc.poll() is None:
        time.sleep(1)
        if not stopping and (attempt / "stop").exists():
            proc.send_signal(signal.SIGTERM)
            stopping = True
        if time.monotonic() - copied > LOG_COPY_S:
            keep_logs(temp, kept)
            copied = time.monotonic()
    keep_logs(temp, kept)
    shutil.rmtree(temp, ignore_errors=True)
    if not stopping:
        storage.write_json(attempt / f"refused-{rank}.json", {"node": socket.gethostname(), "why": (
            f"its Ray ended (exit {proc.returncode}; its log: {attempt}/ray-node-{rank}.log)")})
    return 0 if stopping else proc.returncode  # `ray start --block` exits 1 when stopped, asked or not


def keep_logs(temp: Path, into: Path) -> None:
    """Ray's session logs of this node (``RAY_LOGS``) copied into ``into``."""
    logs = temp / "session_latest" / "logs"
    for pattern in RAY_LOGS:
        for path in logs.glob(pattern):
            try:
                into.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, into / path.name)
            except OSError:  # a log rotated or the folder gone meanwhile: the next copy has it
                pass


class MlflowServer:
    """The job's own MLflow server on this node: its SQLite store on local disk, restored from the
    job's shared copy and copied back (``snapshot``); basic authentication with an account of the
    output folder. SQLite works on the local disk only: the shared copy is made there and then copied
    as a file (a shared filesystem mounted without locks, NFS ``nolock`` or Lustre ``noflock``, refuses
    SQLite's locks)."""

    def __init__(self, out: Path, folder: Path, local: Path, interface: str | None = None):
        self.copy, self.store = folder / "mlflow.db", local / "mlflow.db"
        self.artifacts = out / "mlflow" / "artifacts"
        self.password_file = out / "mlflow" / "admin-password"
        self.interface = interface
        self.proc: subprocess.Popen | None = None
        self.copied = 0.0

    def restore(self) -> None:
        """The shared copy, when there is one, as the local store (copied as a file, checked here)."""
        if self.copy.is_file():
            staged = self.store.with_name(".restored.db")
            shutil.copyfile(self.copy, staged)
            copy_database(staged, self.store)  # SQLite reads it on the local disk; a torn copy fails here
            staged.unlink()

    def start(self, log: Path) -> dict[str, str]:
        self.store.parent.mkdir(parents=True, exist_ok=True)
        self.artifacts.mkdir(parents=True, exist_ok=True)
        self.restore()
        if not self.password_file.is_file():
            write_private(self.password_file, secrets.token_urlsafe(24))
        account = {"MLFLOW_TRACKING_USERNAME": "platform",
                   "MLFLOW_TRACKING_PASSWORD": self.password_file.read_text(encoding="utf-8").strip()}
        auth = write_mlflow_auth(self.store.parent / "basic_auth.ini", account["MLFLOW_TRACKING_USERNAME"],
                                 account["MLFLOW_TRACKING_PASSWORD"])
        ip, port = node_ip(self.interface), service_ports(int(os.environ.get("SLURM_JOB_ID", "0")), 1)[0]
        env = {**os.environ, "MLFLOW_AUTH_CONFIG_PATH": str(auth), "MLFLOW_FLASK_SERVER_SECRET_KEY": secrets.token_hex(16),
               "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        self.proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "mlflow"), "server", "--app-name", "basic-auth", "--host", ip, "--port",
             str(port), "--workers", "2", "--backend-store-uri", f"sqlite:///{self.store}",
             "--artifacts-destination", self.artifacts.as_uri(), "--allowed-hosts", allowed_hosts(ip, port)],
            stdout=open(log, "ab"), stderr=subprocess.STDOUT, env=env, start_new_session=True)
        uri = f"http://{hostport(ip, port)}"
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
        """The shared copy made again when the store changed since the last one: SQLite's backup onto
        the local disk, then a file copy renamed into place on the shared one."""
        changed = max((p.stat().st_mtime for p in (self.store, self.store.with_name("mlflow.db-wal")) if p.exists()),
                      default=0.0)
        if self.store.exists() and (force or changed > self.copied):
            self.copied = time.time()
            staged = self.store.with_name(".snapshot.db")
            try:
                copy_database(self.store, staged)
                file_copy(staged, self.copy)
            except (sqlite3.Error, OSError) as exc:  # the previous copy stays; the next try may succeed
                print(f"slurm: MLflow's copy not made this time ({exc}); {self.copy} is the previous one", flush=True)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)


def allowed_hosts(ip: str, port: int) -> str:
    """MLflow's ``--allowed-hosts`` for the job's server: its defaults (localhost, the private ranges:
    what a tunnel's end uses) and the node's own address and names, whatever range the address is in
    (a site's nodes may have public addresses, which MLflow otherwise answers with 403)."""
    from mlflow.server.security_utils import get_default_allowed_hosts

    names = dict.fromkeys([f"[{ip}]" if ":" in ip else ip, socket.gethostname(), socket.getfqdn()])
    return ",".join([*get_default_allowed_hosts(), *names, *(f"{n}:{port}" for n in names)])


def file_copy(source: Path, target: Path) -> None:
    """``source`` copied to ``target`` as bytes, renamed into place (no reader sees half of it)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}")
    try:
        shutil.copyfile(source, tmp)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def resume_arguments(command: list[str], record: Path) -> list[str]:
    """What a later start adds to COMMAND: ``--resume FOLDER`` for the sweep this job began (the
    folder the sweep recorded in ``record``, whatever other sweeps share its output_dir), ``--resume
    RUN`` for ``train``'s run it began; nothing otherwise (the command starts again)."""
    kind = platform_command(command)
    if kind not in ("tune", "train"):
        return []
    args = command_arguments(command)
    if args.resume:
        return []
    if kind == "tune":
        return ["--resume", record.read_text(encoding="utf-8").strip()] if record.is_file() else []
    output_dir = build_config(args).output_dir
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
    """What ended the job's command: Slurm's walltime warning (SIGUSR1), its SIGTERM to the job's
    tasks alone (a preemption's grace time: relayed by a node's task), or its SIGTERM to the job."""

    def __init__(self):
        self.walltime = self.tasks = self.terminated = False
        self.command: subprocess.Popen | None = None

    def on_usr1(self, signum, frame) -> None:
        self.walltime = self.walltime or time.monotonic()
        if self.command is not None and self.command.poll() is not None:  # during the teardown: nothing to stop
            print(f"slurm: the walltime is near; the command had already exited {self.command.returncode}"
                  f"{' and the job ends as it is' if self.command.returncode == 0 else ''}", flush=True)
            return
        print("slurm: the walltime is near; the command stops and the job requeues itself", flush=True)
        self._forward()

    def on_tasks_term(self, node: str) -> None:
        self.tasks = self.tasks or time.monotonic()
        print(f"slurm: the job's tasks got SIGTERM ({node}'s first: a preemption's grace time); the command stops and "
              "the job requeues itself", flush=True)
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


class Lineage:
    """The starts of one job, requeued ones and a successor submitted where Slurm refused the requeue:
    one folder (``job-<first id>``), one attempt folder per start, one MLflow copy, one sweep."""

    def __init__(self, out: Path, job_id: str):
        first = os.environ.get(settings.SLURM_LINEAGE) or job_id
        self.folder = out / f"job-{first}"
        self.folder.mkdir(parents=True, exist_ok=True)
        before = sorted((p for p in self.folder.glob("attempt-*") if p.name.split("-")[-1].isdigit()),
                        key=lambda p: int(p.name.split("-")[-1]))
        self.starts = len(before)  # starts before this one
        self.previous = before[-1] if before else None
        self.attempt = self.folder / f"attempt-{self.starts}"
        self.attempt.mkdir()
        (self.attempt / "slurm-job-id").write_text(job_id, encoding="utf-8")
        self.sweep_record = self.folder / "sweep"
        self.began = time.time()

    def wait_previous(self, timeout: float = 60) -> None:
        """The previous start's end marker, waited for a while (its nodes may still be ending)."""
        if self.previous is None:
            return
        deadline = time.monotonic() + timeout
        while not (self.previous / "ended").exists() and time.monotonic() < deadline:
            time.sleep(1)
        if not (self.previous / "ended").exists():
            print(f"slurm: the previous start ({self.previous.name}) left no end marker (it was killed); going on",
                  flush=True)

    def end(self, code: int) -> None:
        (self.attempt / "ended").write_text(f"{code}\n", encoding="utf-8")


def made_progress(command: list[str], since: float, record: Path) -> bool:
    """Whether this start saved anything the next one would resume: a checkpoint or Tune's state
    written since it began (checked where output_dir is a local folder; object storage counts as yes)."""
    try:
        args = command_arguments(command)
        output_dir = build_config(args).output_dir
    except Exception:  # the command's own error: it said so
        return False
    if "://" in output_dir:
        return True
    if record.is_file():
        root = Path(record.read_text(encoding="utf-8").strip())
    else:
        root = Path(output_dir) / (args.run_name or "")
    if not root.is_dir():
        return False
    for path in root.rglob("*"):
        if (path.name.startswith(("checkpoint_", "experiment_state")) or path.name == "tuner.pkl") and \
                path.stat().st_mtime >= since:
            return True
    return False


def requeue_decision(code: int, stop: Stop, starts: int, max_requeues: int, progress: bool) -> bool:
    """Whether the job requeues itself (saying why not where it matters): after the walltime warning
    or the tasks' SIGTERM only (Slurm's own SIGTERM to the job: Slurm requeues or cancels it), when
    the command did not finish (exit 0 wins, whenever the signal came), the job has requeues
    left, and this start saved something to resume from."""
    if code == 0 or not (stop.walltime or stop.tasks) or stop.terminated:
        return False
    if starts >= max_requeues:
        print(f"slurm: not requeued: the job has started {starts + 1} times (--max-requeues {max_requeues})", flush=True)
        return False
    if not progress:
        print("slurm: not requeued: this start finished no trial and saved no checkpoint (a requeue would do the same "
              "again); resubmit with a longer --time", flush=True)
        return False
    return True


def requeue(job_id: str, lineage: Lineage) -> None:
    """``scontrol requeue``; where Slurm refuses it (``JobRequeue=0``, ``--no-requeue``, a site's
    plugin), a job submitted to start once this one ends (``--dependency=afterany``), which continues
    this lineage's sweep."""
    proc = ask("scontrol", "requeue", job_id)
    if proc is not None and proc.returncode == 0:
        print(f"slurm: job {job_id} requeued", flush=True)
        return
    why = " ".join(proc.stderr.split())[:200] if proc is not None else "scontrol did not answer"
    script = lineage.folder / "job.sbatch"
    first = lineage.folder.name.removeprefix("job-")
    follow = ask("sbatch", "--parsable", f"--dependency=afterany:{job_id}",
                 f"--export=ALL,{settings.SLURM_LINEAGE}={first}", str(script))
    if follow is not None and follow.returncode == 0:
        print(f"slurm: Slurm refused the requeue ({why}); job {follow.stdout.strip().split(';')[0]} submitted to "
              f"continue once this one ends", flush=True)
    else:
        print(f"slurm: could not requeue job {job_id} ({why}) nor submit its successor "
              f"({' '.join(follow.stderr.split())[:200] if follow is not None else 'sbatch did not answer'}); "
              "resubmit the same command", flush=True)


def job_main(out: Path, name: str, command: list[str], max_requeues: int = MAX_REQUEUES, script: Path | None = None,
             interface: str | None = None, signal_s: int = SIGNAL_S, container: tuple[str, str] | None = None,
             gpus: bool = False) -> int:
    """The job's one process on its first node: Ray on every node, MLflow, the command, the end."""
    job_id = os.environ["SLURM_JOB_ID"]
    nodes = int(os.environ.get("SLURM_JOB_NUM_NODES") or os.environ.get("SLURM_NNODES") or 1)
    lineage = Lineage(out, job_id)
    attempt, folder = lineage.attempt, lineage.folder
    if script is not None and script.is_file() and not (folder / "job.sbatch").exists():
        shutil.copyfile(script, folder / "job.sbatch")  # what a successor runs, whatever renders the name's script later
    stop = Stop()
    signal.signal(signal.SIGUSR1, stop.on_usr1)
    signal.signal(signal.SIGTERM, stop.on_term)
    token = write_private(attempt / "ray_token", secrets.token_hex(32) + "\n")
    env = job_environment(out, name, token, lineage, interface)
    print(f"slurm: job {job_id}{f' (start {lineage.starts + 1} of {folder.name})' if lineage.starts else ''}: {nodes} "
          f"node(s) {os.environ.get('SLURM_JOB_NODELIST', '')}", flush=True)
    if lineage.starts > max_requeues:
        print(f"error: the job has started {lineage.starts + 1} times, more than --max-requeues {max_requeues} allows; "
              "it ends here (its sweep resumes with the same command and --resume)", file=sys.stderr, flush=True)
        lineage.end(4)
        return 4
    lineage.wait_previous()
    image = Container.of(container, gpus, env, out, command)
    step = start_nodes(nodes, attempt, interface, env, image)
    local = Path(tempfile.gettempdir()) / f"platform-mlflow-{job_id}"
    server, code = None, 1
    try:
        head = ready_nodes(attempt, nodes, env, step, stop, command)
        if isinstance(head, int):
            code = head
            return code
        if not os.environ.get("MLFLOW_TRACKING_URI"):
            server = MlflowServer(out, folder, local, interface)
            env.update(server.start(attempt / "mlflow-server.log"))
            say_where(env["MLFLOW_TRACKING_URI"], server, folder, head, token)
        command = named_run(command, name, folder.name.removeprefix("job-"))
        if lineage.starts:
            command = [*command, *resume_arguments(command, lineage.sweep_record)]
        print(f"slurm: running {shlex.join(command)}{f' in {image.kind} image {image.image}' if image else ''}",
              flush=True)
        code = run_command(image.wrap(command) if image else command, env, stop, server,
                           walltime_stop_s=signal_s / 2, attempt=attempt)
        print(f"slurm: the command ended ({code}); stopping MLflow and Ray", flush=True)
        if code not in (0, 130) and (stop.tasks or stop.terminated):
            end_left_open(env, lineage.sweep_record, code)
        if server is not None:
            server.snapshot(force=True)  # before a requeue: Slurm's SIGTERM and SIGKILL follow it
        if requeue_decision(code, stop, lineage.starts, max_requeues,
                            made_progress(command, lineage.began, lineage.sweep_record)):
            requeue(job_id, lineage)
    finally:
        if server is not None:
            server.snapshot(force=True)
            server.stop()
            shutil.rmtree(local, ignore_errors=True)
        end_step(step, attempt)
        lineage.end(code)
        print(f"slurm: the command exited {code}", flush=True)
    return code


def start_nodes(nodes: int, attempt: Path, interface: str | None, env: dict[str, str],
                image: Container | None) -> subprocess.Popen:
    """The step of the job's Ray nodes: ``node_task`` on every node of the allocation."""
    node = [sys.executable, "-m", "platform.slurm_job", "node", str(attempt), *([interface] if interface else [])]
    # --export=ALL: a site's SBATCH_EXPORT=NONE reaches the step as SLURM_EXPORT_ENV=NONE otherwise.
    return subprocess.Popen(["srun", "--export=ALL", f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1",
                             "--overlap", "--kill-on-bad-exit=1", *(image.step(node) if image else node)], env=env)


def end_left_open(env: dict[str, str], record: Path, code: int) -> None:
    """A sweep's runs the command left RUNNING as Slurm stopped the job, ended KILLED (the sweep's
    run and its trials' still open; ``--resume`` reopens them). Slurm's SIGTERM stops the head's
    raylet at once, and Ray terminates the driver whose plasma store is gone before any of its
    Python runs: the batch, the last process of the job alive for them, ends them as the command's
    own stop would have."""
    try:
        folder = record.read_text(encoding="utf-8").strip() if record.is_file() else ""
        state = storage.read_text(storage.join(folder, SWEEP_STATE)) if folder else None
        uri = env.get("MLFLOW_TRACKING_URI")
        if not state or not uri:
            return
        os.environ.update({k: v for k, v in env.items() if k.startswith("MLFLOW_TRACKING_")})  # its account
        parent = Run(uri, json.loads(state)["parent_run_id"])
        if parent.info().info.status != "RUNNING":
            return
        ended = recorder.end_with_children(parent, "interrupted", f"the command died with Ray's processes (exit {code}) "
                                           "as Slurm stopped the job")
        print(f"slurm: the command died with Ray's processes (exit {code}); its runs left open ended KILLED: "
              f"{', '.join(ended)}", flush=True)
    except Exception as exc:  # noqa: BLE001 - the requeue goes on; the next start's --resume closes them
        print(f"slurm: the runs the command left open were not ended ({one_line(exc, 160)}); the next start's "
              "--resume closes them", flush=True)


def job_environment(out: Path, name: str, token: Path, lineage: Lineage, interface: str | None) -> dict[str, str]:
    """What the Ray nodes and the command run with: the job's Ray token, its output folder as
    output_dir's default, where the sweep records its folder, the network interface for NCCL and gloo."""
    # output_dir's default in the job, for the command and for finding what a later start resumes.
    os.environ["PLATFORM_OUTPUT_DIR"] = os.environ.get("PLATFORM_OUTPUT_DIR") or str(out / "runs")
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token), "PLATFORM_CLUSTER": name,
           settings.SWEEP_RECORD: str(lineage.sweep_record)}
    if interface:
        env.update(NCCL_SOCKET_IFNAME=interface, GLOO_SOCKET_IFNAME=interface)
    return env


def ready_nodes(attempt: Path, nodes: int, env: dict[str, str], step: subprocess.Popen, stop: Stop,
                command: list[str]) -> dict | int:
    """The head's hand-off once every node has joined and they can hold one of the command's
    trials (``RAY_ADDRESS`` set in ``env``); else the exit code, its one line said."""
    head = wait_for(attempt / "head.json", JOIN_TIMEOUT_S, lambda: step.poll() is None and not stop.terminated)
    if not head:
        return fail_start(attempt, f"the Ray head did not start (its log: {attempt}/ray-node-0.log)")
    env["RAY_ADDRESS"] = head["address"]
    table = joined(head["address"], nodes, env, step, stop)
    if table is None:
        why = (f"the job's Ray nodes ended before all {nodes} had joined the head" if step.poll() is not None
               else f"not all {nodes} node(s) joined the head within {JOIN_TIMEOUT_S} s")
        return fail_start(attempt, f"{why} (their logs: {attempt}/ray-node-*.log)")
    storage.write_json(attempt / "nodes.json", table)
    refusal = feasible(command, [n["Resources"] for n in table])
    if refusal:
        print(f"error: {refusal}", file=sys.stderr, flush=True)
        return 3
    return head


def feasible(command: list[str], resources: list[dict]) -> str | None:
    """Why the joined nodes cannot hold one of the command's trials (one line), or None."""
    try:
        _, needs = run_needs(command)
    except Exception:  # the command's own configuration error: the command says it, in its words
        return None
    return fits(needs, resources) if needs is not None else None


def say_where(address: str, server: "MlflowServer", folder: Path, head: dict, token: Path) -> None:
    """How to reach the job: MLflow's address, its account and the tunnel line, Ray's dashboard and
    its two-hop tunnel (it listens on the first node's loopback only), in the log and in ``where.json``
    (``python -m platform.cluster slurm tunnel JOBID`` prints them again)."""
    host, port = address.removeprefix("http://").rsplit(":", 1)
    node = head.get("node", host)
    where = {"mlflow": address, "user": "platform", "password_file": str(server.password_file),
             "mlflow_tunnel": f"ssh -N -L 5000:{host}:{port} LOGIN-NODE",
             "dashboard_tunnel": f"ssh -N -L 8265:127.0.0.1:{head.get('dashboard_port', 8265)} -J LOGIN-NODE {node}",
             "ray_token_file": str(token), "start": token.parent.name}
    storage.write_json(folder / "where.json", where)
    print(f"slurm: MLflow at {address} (user platform, password in {server.password_file}); from your machine: "
          f"{where['mlflow_tunnel']}, then http://127.0.0.1:5000", flush=True)
    print(f"slurm: Ray's dashboard: {where['dashboard_tunnel']}, then http://127.0.0.1:8265", flush=True)


def run_command(command: list[str], env: dict[str, str], stop: "Stop", server: "MlflowServer | None",
                walltime_stop_s: float, attempt: Path) -> int:
    """COMMAND until it ends, MLflow's copy kept fresh; its exit status. After the walltime warning
    it gets ``walltime_stop_s`` to save its state and stop; after Slurm's SIGTERM (to the job, or to
    its tasks: a node's task relays it into ``attempt``), KillWait."""
    # A session of its own: what is left of it when Slurm ends the job is ended here (with
    # proctrack/linuxproc, a process whose parent was killed first escapes the job and would
    # still drive the sweep that the next start resumes).
    stop.command = subprocess.Popen(command, env=env, start_new_session=True)
    copied_at_stop, grace = False, kill_wait() - 5
    while stop.command.poll() is None:
        time.sleep(0.25)  # a relayed SIGTERM reaches the command before Tune sees its trials fail
        relayed = next(attempt.glob("terminated-*.json"), None)
        if relayed is not None and not (stop.tasks or stop.terminated):
            stop.on_tasks_term(json.loads(relayed.read_text(encoding="utf-8"))["node"])
        if server is not None and (stop.terminated or stop.tasks) and not copied_at_stop:
            # Ended by Slurm: the server goes with the job and SIGKILL follows within KillWait,
            # so the copy is made now, not after the command.
            server.snapshot(force=True)
            copied_at_stop = True
        elif server is not None and time.time() - server.copied > SNAPSHOT_S:
            server.snapshot()
        late = [(when, limit, what) for when, limit, what in ((stop.terminated, grace, "Slurm's SIGTERM"),
                                                             (stop.tasks, grace, "the tasks' SIGTERM"),
                                                             (stop.walltime, walltime_stop_s, "the walltime warning"))
                if when and time.monotonic() - when > limit]
        if late:
            print(f"slurm: the command did not end within {late[0][1]:.0f} s of {late[0][2]}; ended", flush=True)
            os.killpg(stop.command.pid, signal.SIGKILL)
            stop.command.wait()
    return stop.command.returncode


def kill_wait() -> float:
    """Slurm's KillWait: the seconds between the SIGTERM that ends a job and its SIGKILL (30 unless
    the site says otherwise)."""
    proc = ask("scontrol", "show", "config")
    found = re.search(r"^KillWait\s*=\s*(\d+)", proc.stdout, re.M) if proc is not None else None
    return float(found.group(1)) if found else 30.0


def fail_start(attempt: Path, why: str) -> int:
    refused = [json.loads(p.read_text(encoding="utf-8")) for p in attempt.glob("refused-*.json")]
    print(f"error: {'; '.join(r['node'] + ': ' + r['why'] for r in refused) or why}", file=sys.stderr, flush=True)
    return 3


def joined(address: str, nodes: int, env: dict[str, str], step: subprocess.Popen, stop: Stop) -> list[dict] | None:
    """Ray's node table (address, host name, resources) once all ``nodes`` nodes are alive, waited
    for (the command sizes its work by them); None when they did not all join."""
    probe = ("import json, ray, sys, time\n"
             "ray.init(address=sys.argv[1], logging_level='ERROR', log_to_driver=False)\n"
             "while sum(n['Alive'] for n in ray.nodes()) < int(sys.argv[2]): time.sleep(1)\n"
             "keys = ('NodeManagerAddress', 'NodeManagerHostname', 'Alive', 'Resources')\n"
             "print(json.dumps([{k: n[k] for k in keys} for n in ray.nodes() if n['Alive']]))\n")
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    while True:  # a probe that fails (the head's GCS not answering yet on a loaded node) is tried again
        proc = subprocess.Popen([sys.executable, "-c", probe, address, str(nodes)], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True)
        while proc.poll() is None:
            if step.poll() is not None or stop.terminated or time.monotonic() > deadline:
                proc.kill()
                return None
            time.sleep(0.5)
        if proc.returncode == 0:
            break
        if step.poll() is not None or stop.terminated or time.monotonic() > deadline:
            return None
        time.sleep(2)
    print(f"slurm: all {nodes} node(s) joined Ray at {address}", flush=True)
    return json.loads(proc.stdout.read().strip().splitlines()[-1])


def end_step(step: subprocess.Popen, attempt: Path) -> None:
    """The job's Ray nodes stopped: each node's task sees the stop marker, stops its Ray and exits 0
    (so Slurm records the step COMPLETED); one that does not within a minute gets srun's SIGTERM."""
    (attempt / "stop").touch()
    for signum in (None, signal.SIGTERM):
        if step.poll() is not None:
            return
        if signum is not None:
            step.send_signal(signum)
        try:
            step.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pass
    step.kill()


@cli_main
def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["node"]:
        return node_task(Path(argv[1]), argv[2] if len(argv) > 2 else None)
    p = argparse.ArgumentParser(prog="python -m platform.slurm_job")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--max-requeues", type=int, default=MAX_REQUEUES)
    p.add_argument("--script", type=Path, default=None)
    p.add_argument("--node-interface", default=None)
    p.add_argument("--signal-seconds", type=int, default=SIGNAL_S)
    for option in LAUNCHERS.values():
        p.add_argument(f"--{option}", default=None)
    p.add_argument("--gpus", action="store_true")
    at = argv.index("--") if "--" in argv else len(argv)
    args = p.parse_args(argv[:at])
    return job_main(args.out, args.name, argv[at + 1:], args.max_requeues, args.script, args.node_interface,
                    args.signal_seconds, launcher(args), args.gpus)


if __name__ == "__main__":
    raise SystemExit(main())
