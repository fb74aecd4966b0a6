"""``python -m platform.cluster slurm [--nodes N] [--gpus-per-node G] ... [--print] -- COMMAND...``:
one platform command (a sweep, a run) across a Slurm allocation.

The verb renders ``.cluster/slurm-<name>.sbatch`` from ``cluster.env`` (``CLUSTER_NAME``, Slurm's
own ``SBATCH_PARTITION``, ``SBATCH_ACCOUNT``, ``SBATCH_QOS``, ``SBATCH_TIMELIMIT``,
``PLATFORM_DATA_DIR``, ``MLFLOW_TRACKING_URI``) and its options, and submits it with ``sbatch``
(``--print`` renders only). Nothing is installed on the compute nodes: the job runs the venv the
render ran in (the README's install, on the shared filesystem). In the job (``platform/slurm_job.py``):

- the batch script's one process on the allocation's first node, starts one Ray
  node per allocated node with ``srun`` (the head on the first node, the others
  join it), each offering what Slurm gave that node, on ports and a temp folder of this job, with
  a token of this job (``RAY_AUTH_MODE=token``); it waits until every node has joined;
- MLflow is the user's server when ``MLFLOW_TRACKING_URI`` names one, else a server on the first
  node whose SQLite store sits on that node's local disk (SQLite on NFS is unsafe under concurrent
  writers) and is copied to the shared output folder whenever it changed (at most every
  ``SNAPSHOT_S``) and at the end; a requeued job starts from that copy;
- COMMAND runs as the driver, with checkpoints and sweep state under ``<output>/runs``;
- walltime: Slurm sends SIGUSR1 ``--signal-seconds`` before the end (``--signal=B:USR1@S``); the
  command is stopped as Ctrl-C stops it (its state saved, its runs KILLED), then MLflow's copy
  is made and the job requeues itself; so on a preemption's grace-time SIGTERM to the tasks
  alone, which a node's task relays to the job. ``scontrol requeue``, ``scancel`` or a preemption
  without a grace time end the job with SIGTERM, and Slurm requeues it (``--requeue``) or ends
  it. Either way the next start runs COMMAND again with ``--resume`` where it had begun a sweep
  (or ``--resume RUN`` for ``train``'s run), so no finished trial is redone and the runs left open
  are closed truthfully;
- at the end Ray and MLflow stop; the job's exit status is the command's.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from methods.encoder import pretrained_source
from platform.cluster_files import read_env
from platform.data import data_dir
from platform.errors import ConfigError, DataError, UserError
from platform.slurm_sizing import gres_gpus, partition_offer, platform_command, run_needs, size
from platform.slurm_status import main as verb_main

ROOT = Path(__file__).resolve().parent.parent
NAME = re.compile(r"[a-z][a-z0-9-]{0,39}")
# Slurm's --time: minutes, minutes:seconds, hours:minutes:seconds, days-hours, days-hours:minutes,
# days-hours:minutes:seconds.
TIME = re.compile(r"(?:(?P<days>\d+)-(?P<dh>\d+)(?::(?P<dm>\d+)(?::(?P<ds>\d+))?)?"
                  r"|(?P<a>\d+)(?::(?P<b>\d+)(?::(?P<c>\d+))?)?)")
MEMORY = re.compile(r"\d+[KMGT]?")
SIGNAL_S = 300  # the walltime warning: time for a sweep to save its state and MLflow's copy to be made
SNAPSHOT_S = 30  # the most MLflow's shared copy lags behind the store
JOIN_TIMEOUT_S = 600  # how long the nodes get to join the head
# Each job's Ray workers take ports from a window of Ray's default range, and its services (Ray's
# GCS, raylets and agents, MLflow) from a window below Linux's ephemeral range, both chosen by the
# job's id (two jobs of one user on one node must not share one).
WORKER_PORTS, SERVICE_PORTS, WINDOWS = (10002, 19999), (20000, 32767), 24
SETTINGS = {"SBATCH_PARTITION": "partition", "SBATCH_ACCOUNT": "account", "SBATCH_QOS": "qos",
            "SBATCH_TIMELIMIT": "time"}
# The lowest Linux driver each CUDA major release runs on (NVIDIA's CUDA toolkit release notes,
# "CUDA Toolkit and Minimum Required Driver Version", minor-version compatibility).
MIN_DRIVER = {11: 450, 12: 525, 13: 580}
VERBS = ("status", "logs", "tunnel", "cancel")  # python -m platform.cluster slurm VERB JOBID
MAX_REQUEUES = 3  # requeues of one job (walltime, preemption) before it ends as it is
GPUS = re.compile(r"(?:[A-Za-z0-9_.-]+:)?\d+")  # Slurm's --gpus-per-node: N or TYPE:N
LAUNCHERS = {"pyxis": "container-image", "apptainer": "apptainer"}  # a container's kind: its option, here and in the job


def launcher(options) -> tuple[str, str] | None:
    """The container named by parsed options (``container_image``, ``apptainer``): (kind, image), or None."""
    named = [(kind, image) for kind, option in LAUNCHERS.items() if (image := getattr(options, option.replace("-", "_")))]
    if len(named) > 1:
        raise ConfigError("--container-image (pyxis) and --apptainer name two launchers: give one")
    return named[0] if named else None


@dataclass
class SlurmJob:
    """What a rendered job asks Slurm for and runs."""
    name: str
    command: list[str]
    out: Path
    venv: Path
    nodes: int = 1
    gpus_per_node: str | None = None  # N, or TYPE:N (Slurm's --gpus-per-node)
    cpus_per_task: int | None = None
    mem: str | None = None
    time: str | None = None
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    signal_s: int = SIGNAL_S
    env: dict[str, str] = field(default_factory=dict)  # exported before the job runs
    gres: str | None = None
    constraint: str | None = None
    exclusive: bool = False
    sbatch_args: list[str] = field(default_factory=list)  # passed through as #SBATCH lines
    setup: list[str] = field(default_factory=list)  # shell lines before the venv (module load, conda)
    max_requeues: int = MAX_REQUEUES
    node_interface: str | None = None
    container: tuple[str, str] | None = None  # ("pyxis", IMAGE) or ("apptainer", IMAGE): where the nodes and command run
    sized: str = ""  # how --cpus-per-task and --mem were chosen, when the render chose them

    @property
    def gpus(self) -> int:
        """GPUs per node: --gpus-per-node's N (or TYPE:N), else a GPU --gres's (gpu[:TYPE]:N)."""
        return gres_gpus(f"gpu:{self.gpus_per_node}") if self.gpus_per_node else gres_gpus(self.gres or "")

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


def check(job: SlurmJob, offer=None) -> SlurmJob:
    """Each mistake one line, before anything is written or submitted; ``--cpus-per-task`` and
    ``--mem`` sized from the run where the user named neither (``offer``: the partition's largest node)."""
    platform_command(job.command)
    if not NAME.fullmatch(job.name):
        raise ConfigError(f"the job's name {job.name!r} (--name or CLUSTER_NAME) must be 1-40 lowercase letters, "
                          "digits and hyphens, starting with a letter")
    if job.nodes < 1:
        raise ConfigError(f"--nodes must be at least 1, got {job.nodes}")
    if job.gpus_per_node is not None and not GPUS.fullmatch(job.gpus_per_node):
        raise ConfigError(f"--gpus-per-node {job.gpus_per_node!r} must be N or TYPE:N (e.g. 2 or a100:2)")
    if job.cpus_per_task is not None and job.cpus_per_task < 1:
        raise ConfigError("--cpus-per-task must be at least 1")
    if job.max_requeues < 0:
        raise ConfigError(f"--max-requeues must be 0 or more, got {job.max_requeues}")
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
    if job.gpus and "+cpu" in installed_torch(job.venv):
        raise ConfigError(f"--gpus-per-node {job.gpus_per_node or job.gres}, but {job.venv} holds torch's CPU build "
                          f"({installed_torch(job.venv)}): install the CUDA lock there (pip install --require-hashes "
                          "-r requirements/cuda.txt; docs/cluster.md, 'On a Slurm cluster')")
    if job.container is not None:
        kind, image = job.container
        local = (kind == "apptainer" and "://" not in image) or image.startswith(("/", "./", "../", "~"))
        if local and not Path(image).expanduser().is_file():
            raise ConfigError(f"the {kind} image {image} is not a file here (the nodes read it from the shared "
                              "filesystem): give its path, or a registry URI")
        if local:
            job.container = (kind, os.path.abspath(os.path.expanduser(image)))  # the job runs from the repository
    cfg, needs = run_needs(job.command)
    if needs is not None:
        cpus, mem_mb, why = size(needs, job.nodes, job.gpus, job.cpus_per_task, offer)
        if job.cpus_per_task is None or job.mem is None:
            job.sized = why
        job.cpus_per_task = job.cpus_per_task if job.cpus_per_task is not None else cpus
        job.mem = job.mem if job.mem is not None else f"{mem_mb}M"
        job.env.update(preflight(cfg, job.env))
    return job


def preflight(cfg, env: dict[str, str]) -> dict[str, str]:
    """On the login node, before anything is submitted: the data folder is there, and each backbone
    the run loads is in the Hugging Face cache the nodes read (fetched into it here when the login
    node can reach the hub); the job then runs with ``HF_HUB_OFFLINE=1`` (compute nodes often have no
    internet). What the job exports for it."""
    try:
        data_dir(env.get("PLATFORM_DATA_DIR"))
    except DataError as exc:
        raise ConfigError(f"{exc}: fetch the data on the login node first (python -m platform.data fetch all "
                          "--data-dir DIR, docs/data.md)") from None
    hf_home = Path(env.get("HF_HOME") or os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface").resolve()
    names = dict.fromkeys(v for v in (cfg.model, cfg.flat().get("mlm")) if isinstance(v, str) and v)
    for name in names:
        source, pinned = pretrained_source(name)
        if Path(source).exists():
            continue
        cached(source, pinned.get("revision"), hf_home, env.get("HF_HUB_OFFLINE") or os.environ.get("HF_HUB_OFFLINE"))
    return {"HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1"}


def cached(repo: str, revision: str | None, hf_home: Path, offline: str | None) -> None:
    """``repo`` at ``revision`` in the cache under ``hf_home``, downloaded there when missing and the hub
    answers; one line of ConfigError when it is neither."""
    from huggingface_hub import snapshot_download

    patterns = ["*.json", "*.txt", "*.safetensors", "*.model", "*.py"]
    cache = hf_home / "hub"
    try:
        snapshot_download(repo, revision=revision, cache_dir=cache, allow_patterns=patterns, local_files_only=True)
        return
    except Exception:  # not cached (huggingface_hub raises several kinds): fetched below where allowed
        pass
    if offline and offline.lower() in ("1", "true", "yes", "on"):
        why = "HF_HUB_OFFLINE is set"
    else:
        try:
            print(f"fetching {repo} into {cache} (the job's nodes read it there, offline)", file=sys.stderr, flush=True)
            snapshot_download(repo, revision=revision, cache_dir=cache, allow_patterns=patterns)
            return
        except Exception as exc:
            why = " ".join(str(exc).split())[:160]
    raise ConfigError(f"the backbone {repo}{'@' + revision if revision else ''} is not in the Hugging Face cache at "
                      f"{cache} and could not be fetched ({why}): fetch it on the login node (HF_HOME on the shared "
                      "filesystem) or give a local path (--set model=DIR)")


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
             "than editing it."]
    if job.sized:
        lines.append(f"# --cpus-per-task and --mem sized from the run: {job.sized}.")
    lines += [f"#SBATCH --job-name={job.name}", f"#SBATCH --nodes={job.nodes}", "#SBATCH --ntasks-per-node=1"]
    asked = {"cpus-per-task": job.cpus_per_task, "gpus-per-node": job.gpus_per_node if job.gpus else None,
             "gres": job.gres, "mem": job.mem, "time": job.time, "partition": job.partition, "account": job.account,
             "qos": job.qos, "constraint": job.constraint}
    lines += [f"#SBATCH --{key}={value}" for key, value in asked.items() if value is not None]
    lines += ["#SBATCH --exclusive"] * job.exclusive + [f"#SBATCH {arg}" for arg in job.sbatch_args]
    lines += [f"#SBATCH --output={job.out}/slurm-%j.out", "#SBATCH --open-mode=append",  # a requeued start appends
              "#SBATCH --requeue", f"#SBATCH --signal=B:USR1@{job.signal_s}", "set -e", f"cd {shlex.quote(str(ROOT))}"]
    lines += job.setup  # module load, conda activate: before `set -u`, which some of their scripts break under
    lines += ["set -u", f". {shlex.quote(str(job.venv / 'bin' / 'activate'))}"]
    lines += [f"export {key}={shlex.quote(value)}" for key, value in job.env.items()]
    options = [f"--max-requeues={job.max_requeues}", f"--signal-seconds={job.signal_s}", f"--script={job.script}"]
    options += [f"--node-interface={job.node_interface}"] * bool(job.node_interface)
    if job.container is not None:
        kind, image = job.container
        options += [f"--{LAUNCHERS[kind]}={image}", *["--gpus"] * bool(job.gpus)]
    lines.append(f"exec {shlex.quote(str(job.venv / 'bin' / 'python'))} -m platform.slurm_job --out "
                 f"{shlex.quote(str(job.out))} --name {job.name} {shlex.join(options)} -- " + shlex.join(job.command))
    return "\n".join(lines) + "\n"


def submit(job: SlurmJob, dry: bool) -> int:
    """Write the script; unless ``dry``, ``sbatch`` it and say where its log and MLflow will be."""
    script = job.script
    if not dry and shutil.which("sbatch") is None:
        raise ConfigError("sbatch is not on PATH: run this on the cluster's login node (or --print to render only)")
    if not dry and job.container is not None and job.container[0] == "pyxis" and not pyxis_loaded():
        raise ConfigError("--container-image needs pyxis, and this cluster's srun has no --container-image (srun "
                          "--help): ask the site, or use --apptainer IMAGE")
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
        print(f"MLflow: on the job's first node once it runs; its address and the tunnel lines: python -m "
              f"platform.cluster slurm status {job_id} (also in the log and {job.out}/job-{job_id}/where.json)")
    return 0


def pyxis_loaded() -> bool:
    """Whether this cluster's ``srun`` takes pyxis's options (its SPANK plugin adds them to ``--help``)."""
    try:
        proc = subprocess.run(["srun", "--help"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "--container-image" in proc.stdout


def parse(argv: list[str], values: dict[str, str]) -> SlurmJob:
    """The verb's options (``cluster.env``'s ``values`` as defaults) and COMMAND after ``--``."""
    if "--" in argv:
        at = argv.index("--")
        argv, command = argv[:at], argv[at + 1:]
    else:
        command = []
    p = argparse.ArgumentParser(prog="python -m platform.cluster slurm",
                                description="Run a platform command across a Slurm allocation (docs/slurm.md). "
                                            "status|logs|tunnel|cancel JOBID: see and reach a job.",
                                usage="%(prog)s [options] -- python -m platform.tune METHOD ...")
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--gpus-per-node", default=None, metavar="[TYPE:]N", help="GPUs of each node (Slurm's --gpus-per-node)")
    p.add_argument("--gres", default=None, help="Slurm's --gres (e.g. gpu:a100:2), for sites that ask GPUs this way")
    p.add_argument("--cpus-per-task", type=int, default=None, help="CPUs of each node's one task (default: sized from the run)")
    p.add_argument("--mem", default=None, help="memory per node (Slurm's --mem, e.g. 64G; default: sized from the run)")
    for option, key in (("--time", "SBATCH_TIMELIMIT"), ("--partition", "SBATCH_PARTITION"),
                        ("--account", "SBATCH_ACCOUNT"), ("--qos", "SBATCH_QOS")):
        p.add_argument(option, default=values.get(key) or None, help=f"Slurm's {option} (default: {key} in cluster.env)")
    p.add_argument("--constraint", default=None, help="Slurm's --constraint (node features, e.g. a100|h100)")
    p.add_argument("--exclusive", action="store_true", help="Slurm's --exclusive: whole nodes")
    p.add_argument("--sbatch-arg", dest="sbatch_args", action="append", default=[], metavar="ARG",
                   help="any other sbatch option, as one #SBATCH line (repeatable), e.g. --sbatch-arg=--reservation=lab")
    p.add_argument("--setup", action="append", default=[], metavar="LINE",
                   help="a shell line run before the venv is activated (repeatable): module load ..., conda activate ...")
    p.add_argument("--container-image", default=None, metavar="IMAGE",
                   help="run every Ray node and the command in this image with pyxis (srun --container-image)")
    p.add_argument("--apptainer", default=None, metavar="IMAGE",
                   help="run every Ray node and the command in this image with apptainer exec (--nv with GPUs)")
    p.add_argument("--max-requeues", type=int, default=MAX_REQUEUES,
                   help=f"how often the job requeues itself at the walltime or on preemption (default {MAX_REQUEUES})")
    p.add_argument("--node-interface", default=None, metavar="IFACE",
                   help="the network interface Ray and NCCL use on each node (default: the one of the default route)")
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
                    args.mem, args.time, args.partition, args.account, args.qos, args.signal_seconds, env, args.gres,
                    args.constraint, args.exclusive, args.sbatch_args, args.setup, args.max_requeues, args.node_interface,
                    launcher(args))


def main(argv: list[str], env_file: Path) -> int:
    if argv[:1] and argv[0] in VERBS:
        return verb_main(argv)
    options = argv[: argv.index("--")] if "--" in argv else argv
    named = [options[i + 1] for i, a in enumerate(options[:-1]) if a == "--env-file"]
    env_file = Path(named[-1]) if named else env_file
    values = read_env(env_file) if named or env_file.is_file() else {}
    job = parse(argv, values)
    return submit(check(job, partition_offer(job.partition)), "--print" in options)


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
