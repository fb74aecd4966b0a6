"""``python -m platform.cluster up|down|render|tunnel [ray options]``: ``cluster.yaml`` with the settings of
``cluster.env`` and the AWS resources the platform makes for it, closed by default; ``slurm ... -- COMMAND``:
a command across a Slurm allocation (``platform/cluster_slurm.py``).

``cluster.yaml`` cannot read ``cluster.env`` (Ray's launcher substitutes nothing): its security
group and instance profiles are placeholders there, so ``ray up cluster.yaml`` on its own is
refused by AWS rather than opening SSH to the internet. ``up`` and ``render`` make (or find) the
security group and the instance profiles (``platform/cluster_aws.py``) and write
``.cluster/cluster.yaml`` with them put in (and the repository's absolute path as the synced
folder); ``up`` then runs ``ray up`` on it with the remaining options.

``down`` keeps the MLflow database: when it lives on the head (SQLite, the default) it is backed
up to S3 first (``MLFLOW_DB_BACKUP``, default beside the artifacts; ``--backup-to`` another
place) and the head is not terminated when that fails; ``--discard-mlflow-db`` says losing it is
meant. The head's setup restores it (``restore-db``) before MLflow starts.

The settings are checked first, each mistake one line: an SSH range of the whole internet is
refused unless ``SSH_ALLOW_ANYWHERE=yes`` says it is meant; the MLflow server's account
(``MLFLOW_TRACKING_USERNAME`` and ``MLFLOW_TRACKING_PASSWORD``, at least 12 characters), its
artifact store (``MLFLOW_ARTIFACTS_DESTINATION``) and the run location (``RUNS_URI``) must be set.

``mlflow-auth PATH`` writes MLflow's basic-auth configuration (the admin account from those
variables, the permissions database beside PATH, readable by its owner only): the head runs it
before ``mlflow server --app-name basic-auth``.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from platform import cluster_slurm, settings
from platform.cluster_files import AUTH_CACHE_TTL_S, read_env, write_mlflow_auth, write_private  # noqa: F401 (also named as platform.cluster's)
from platform.cluster_aws import (Access, cost_tags, db_backup_uri, db_identifier, kept_after_down, mlflow_db,
                                  provision, read_password, resolve_images, s3_location, settle, terminate_instances,
                                  SSM_IMAGE)
from platform.errors import ClusterError, ConfigError, cli_main
from platform.mlflow_backup import backup, on_head, restore
from platform.tracking.store import git_commit

ROOT = Path(__file__).resolve().parent.parent
REQUIRED = {
    "CLUSTER_NAME": "this cluster's name, unique in the AWS account (e.g. platform-alice): it names Ray's cluster, "
                    "its security group and roles",
    "SSH_ALLOWED_CIDR": "the address range allowed to SSH to the head (your network, e.g. your address /32)",
    "MLFLOW_TRACKING_USERNAME": "the MLflow server's admin account",
    "MLFLOW_TRACKING_PASSWORD": "the MLflow server's admin password",
    "MLFLOW_ARTIFACTS_DESTINATION": "an s3:// location for MLflow's artifacts",
    "RUNS_URI": "the s3:// location of checkpoints and sweep state (what --set output_dir= names)",
}
# cluster.yaml's placeholders, put in by render: what provision made or cluster.env names.
PLACEHOLDERS = {"${SECURITY_GROUP_ID}": "security_group_id", "${HEAD_INSTANCE_PROFILE_ARN}": "head_profile_arn",
                "${WORKER_INSTANCE_PROFILE_ARN}": "worker_profile_arn"}
HEAD_DB = "~/mlflow/mlflow.db"  # where cluster.yaml's MLflow server keeps its SQLite database
MLFLOW_PIDFILE = "~/mlflow/server.pid"  # cluster.yaml's head start: its item that begins with reading it stops the server
MIN_PASSWORD = 12
DOCUMENTATION_RANGES = ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24")  # RFC 5737: no host is there
# What `up` learnt for the nodes, put in by the rendered commands: the commit it synced (.git is
# not synced) and MLflow's database when it made it. Node commands read it beside cluster.env.
UP_FILE = "~/platform-up.env"
DB_PASSWORD = "MLFLOW_DB_PASSWORD_PARAMETER"
NODE_PYTHON_DEFAULT = "3.11.18"  # the nodes' CPython as cluster.yaml states it; cluster.env's NODE_PYTHON replaces it
PROVIDER = "PLATFORM_CLUSTER_PROVIDER"  # in UP_FILE: local (your machines) or, absent, aws
MLFLOW_DBS = ("rds", "head")
# IAM role names take 64 characters; "-worker" and "-head" are added to the name.
# RDS's rule for the database identifier it names, within IAM's and EC2's: no hyphen at the end
# or twice in a row (checked before up makes anything).
CLUSTER_NAME = re.compile(r"(?=.{1,40}$)[a-z](?:-?[a-z0-9])*")
# What both providers run of cluster.yaml: the commands, in Ray's order, and what is synced.
FIRST_ADDRESS = "$(hostname -I | awk '{print $1}')"  # the head's own address in cluster.yaml's start commands
# On your own machines the head is often a GPU box too: it offers its GPUs (Ray finds them) and its
# CPUs but those the driver, the corpus statistics, the final evaluation and MLflow use.
HEAD_RESERVED_CPUS = 4
LOCAL_HEAD_CPUS = f"--num-cpus=$(( $(nproc) > {HEAD_RESERVED_CPUS} ? $(nproc) - {HEAD_RESERVED_CPUS} : 0 ))"
SHARED = ("initialization_commands", "setup_commands", "head_setup_commands", "worker_setup_commands",
          "head_start_ray_commands", "worker_start_ray_commands", "file_mounts", "rsync_exclude", "cluster_synced_files",
          "idle_timeout_minutes")


@dataclass
class Hosts:
    """Your own machines (``--provider local``): the head's address, the workers', and how to SSH there."""
    head: str
    workers: tuple[str, ...]
    user: str
    key: Path


def check_settings(values: dict[str, str], source: str, provider: str = "aws") -> None:
    for key, what in REQUIRED.items():
        if not values.get(key) and not (provider == "local" and key == "SSH_ALLOWED_CIDR"):
            raise ConfigError(f"{source}: set {key} ({what})")
    if provider == "local":
        if mlflow_db(values) == "rds":
            raise ConfigError(f"{source}: on your own machines MLflow's database is SQLite on the head (MLFLOW_DB=head) "
                              "or your PostgreSQL (MLFLOW_BACKEND_STORE_URI): set one")
        check_common(values, source)
        return
    try:
        network = ipaddress.ip_network(values["SSH_ALLOWED_CIDR"], strict=False)
    except ValueError:
        raise ConfigError(f"{source}: SSH_ALLOWED_CIDR={values['SSH_ALLOWED_CIDR']!r} is not an address range "
                          "(e.g. your address /32)") from None
    if network.version == 4 and any(network.subnet_of(ipaddress.ip_network(doc)) for doc in DOCUMENTATION_RANGES):
        raise ConfigError(f"{source}: SSH_ALLOWED_CIDR={network} is a documentation range (cluster.env.example's): "
                          "nobody connects from there; give your network's range (e.g. your address /32)")
    if network.prefixlen == 0 and values.get("SSH_ALLOW_ANYWHERE") != "yes":
        raise ConfigError(f"{source}: SSH_ALLOWED_CIDR={network} opens SSH to the whole internet; give your network's "
                          "range, or set SSH_ALLOW_ANYWHERE=yes if that is meant")
    check_common(values, source)


def check_common(values: dict[str, str], source: str) -> None:
    if values.get("NODE_PYTHON") and not re.fullmatch(r"3\.11\.\d+", values["NODE_PYTHON"]):
        raise ConfigError(f"{source}: NODE_PYTHON={values['NODE_PYTHON']!r} must be a CPython 3.11 release such as "
                          f"{NODE_PYTHON_DEFAULT} (the lock is resolved for 3.11)")
    if not CLUSTER_NAME.fullmatch(values["CLUSTER_NAME"]):
        raise ConfigError(f"{source}: CLUSTER_NAME={values['CLUSTER_NAME']!r} must be 1-40 lowercase letters, digits and "
                          "single hyphens, starting with a letter and not ending with a hyphen (it names IAM roles, the "
                          "security group and MLflow's RDS database)")
    if values.get("MLFLOW_DB") and values["MLFLOW_DB"] not in MLFLOW_DBS:
        raise ConfigError(f"{source}: MLFLOW_DB={values['MLFLOW_DB']!r} must be one of {', '.join(MLFLOW_DBS)} (rds: a "
                          "managed PostgreSQL that outlives the head, the default; head: SQLite on the head's disk)")
    check_account(values, source)
    if values.get("EBS_KMS_KEY_ARN") and not re.fullmatch(r"arn:aws[a-z-]*:kms:[a-z0-9-]+:\d{12}:key/[\w-]+",
                                                             values["EBS_KMS_KEY_ARN"]):
        raise ConfigError(f"{source}: EBS_KMS_KEY_ARN={values['EBS_KMS_KEY_ARN']!r} must be a KMS key's ARN "
                          "(arn:aws:kms:REGION:ACCOUNT:key/ID; EC2's settings name the account's default EBS key)")
    for key in ("MLFLOW_ARTIFACTS_DESTINATION", "RUNS_URI", "MLFLOW_DB_BACKUP"):
        if values.get(key) and not values[key].startswith("s3://"):
            raise ConfigError(f"{source}: {key} must be an s3:// location")


def check_account(values: dict[str, str], source: str) -> None:
    for key in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        if not values.get(key):
            raise ConfigError(f"{source}: set {key} ({REQUIRED[key]})")
    if len(values["MLFLOW_TRACKING_PASSWORD"]) < MIN_PASSWORD:
        raise ConfigError(f"{source}: MLFLOW_TRACKING_PASSWORD must have at least {MIN_PASSWORD} characters")
    for key in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        if values[key] != values[key].strip() or any(c in values[key] for c in "\r\n"):
            raise ConfigError(f"{source}: {key} cannot begin or end with a blank or hold a line break (MLflow's "
                              "configuration file would change it)")


def render(config: Path, env_file: Path, out: Path, access: Access) -> Path:
    """``config`` with the security group and instance profiles of ``access`` and the
    repository's absolute path, at ``out``."""
    values = read_settings(env_file)
    cfg = yaml.safe_load(config.read_text(encoding="utf-8"))
    cfg["cluster_name"] = values["CLUSTER_NAME"]

    def put_in(node):
        if isinstance(node, dict):
            return {k: put_in(v) for k, v in node.items()}
        if isinstance(node, list):
            return [put_in(v) for v in node]
        if node in PLACEHOLDERS:
            return getattr(access, PLACEHOLDERS[node])
        return (access.images or {}).get(node, node) if isinstance(node, str) else node

    cfg["available_node_types"] = put_in(own_images(cfg["available_node_types"], values))
    for node in cfg["available_node_types"].values():  # cost allocation: every instance and disk names its cluster
        node["node_config"]["TagSpecifications"] = [{"ResourceType": kind, "Tags": cost_tags(values["CLUSTER_NAME"])}
                                                    for kind in ("instance", "volume")]
    # boto3 on the nodes (the database password, the backup, the bill) reads the region from here.
    learnt = {"AWS_DEFAULT_REGION": cfg["provider"]["region"]}
    if access.database_uri:
        learnt.update({"MLFLOW_BACKEND_STORE_URI": access.database_uri, DB_PASSWORD: access.password_parameter})
    return write_rendered(cfg, config, learnt, out, values.get("NODE_PYTHON"))


def own_images(node_types: dict, values: dict[str, str]) -> dict:
    """``node_types`` with cluster.env's ``GPU_IMAGE_ID`` as the GPU workers' image and its
    ``UBUNTU_IMAGE_ID`` as the head's and the CPU workers', where they name one (a region without the
    public parameter, an image of your own)."""
    for key, types in (("GPU_IMAGE_ID", ("gpu_worker",)), ("UBUNTU_IMAGE_ID", ("head", "cpu_worker"))):
        for node_type in types if values.get(key) else ():
            node_types[node_type]["node_config"]["ImageId"] = values[key]
    return node_types


def render_local(config: Path, env_file: Path, out: Path, hosts: Hosts) -> Path:
    """``config``'s commands, file mounts and synced files, unchanged, for Ray's on-premise provider
    (``provider: type: local``): the head and workers are ``hosts``' machines, reached over SSH as
    ``hosts.user`` with ``hosts.key``. Ray's local provider has one worker type: the workers' setup
    picks the lock by their hardware (cluster.yaml), so GPU and CPU machines can be mixed. The head
    offers its GPUs and its CPUs beyond ``HEAD_RESERVED_CPUS`` (AWS's head offers none)."""
    values = read_settings(env_file, "local")
    cfg = yaml.safe_load(config.read_text(encoding="utf-8"))
    local = {key: cfg[key] for key in SHARED if key in cfg}
    local.update(cluster_name=values["CLUSTER_NAME"],
                 provider={"type": "local", "head_ip": hosts.head, "worker_ips": list(hosts.workers)},
                 auth={"ssh_user": hosts.user, "ssh_private_key": str(hosts.key)})
    # MLflow and the nodes' environment at the address the user gave the head: a machine on several
    # networks lists another one first in `hostname -I`.
    local["head_start_ray_commands"] = [c.replace(FIRST_ADDRESS, hosts.head).replace("--num-cpus=0", LOCAL_HEAD_CPUS)
                                        for c in local["head_start_ray_commands"]]
    return write_rendered(local, config, {PROVIDER: "local"}, out, values.get("NODE_PYTHON"))


def write_rendered(cfg: dict, config: Path, learnt: dict[str, str], out: Path, python: str | None = None) -> Path:
    """``cfg`` at ``out``: the repository's absolute path as the synced folder, the nodes' CPython
    release ``python`` (NODE_PYTHON) where cluster.yaml states ``NODE_PYTHON_DEFAULT``, and the
    commit synced and what ``up`` learnt (``learnt``) written to ``UP_FILE`` before setup
    (restore-db reads it) and before each start (``ray up --restart-only`` runs no setup)."""
    if python:
        cfg["setup_commands"] = [c.replace(NODE_PYTHON_DEFAULT, python) for c in cfg["setup_commands"]]
    cfg["file_mounts"] = {remote: str((config.parent / local).resolve()) for remote, local in cfg["file_mounts"].items()}
    text = "".join(f"{k}={v}\n" for k, v in {settings.GIT_COMMIT: git_commit(), **learnt}.items())
    for key in ("setup_commands", "head_start_ray_commands", "worker_start_ray_commands"):
        cfg[key] = [f"printf %s {shlex.quote(text)} > {UP_FILE}", *cfg[key]]
    # Ray prepends setup_commands to both node lists when it prepares a config, and its v2
    # autoscaler (what `ray up` starts on AWS) prepares the head's prepared copy again: every worker
    # would run them twice. Prepended here once, the list left empty, each runs once under v1 and v2.
    for key in ("head_setup_commands", "worker_setup_commands"):
        cfg[key] = [*cfg["setup_commands"], *cfg.get(key, [])]
    cfg["setup_commands"] = []
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("# Rendered by python -m platform.cluster from cluster.yaml and cluster.env; do not edit.\n"
                   + yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")
    return out


def region_of(config: Path) -> str | None:
    """The AWS region of the cluster (``provider.region`` of its launcher config)."""
    try:
        return yaml.safe_load(config.read_text(encoding="utf-8"))["provider"]["region"]
    except (OSError, KeyError, TypeError):
        return None


def stop_mlflow(cfg: dict) -> str:
    """The head start's own command that stops its MLflow server (by the pidfile's session)."""
    return next(c for c in cfg["head_start_ray_commands"] if c.startswith(f"OLD=$(cat {MLFLOW_PIDFILE}"))


def rendered_path(config: Path) -> Path:
    """Where the launcher's config of ``config`` is written: ``.cluster/`` beside it."""
    return config.resolve().parent / ".cluster" / config.name


def read_settings(env_file: Path, provider: str = "aws") -> dict[str, str]:
    values = read_env(env_file)
    check_settings(values, str(env_file), provider)
    return values


def provision_for(config: Path, values: dict[str, str], refresh_images: bool = False) -> Access:
    """The AWS resources of ``config``'s cluster, in its region, with the caller's credentials."""
    cfg = yaml.safe_load(config.read_text(encoding="utf-8"))
    region = cfg["provider"]["region"]
    access = aws_call("making the cluster's security group and instance profiles", provision, values,
                      values["CLUSTER_NAME"], region)
    access.images = pinned_images(config, values["CLUSTER_NAME"], region, refresh_images, lambda pinned: aws_call(
        "reading the image IDs AWS publishes", resolve_images, own_images(cfg["available_node_types"], values), region,
        None, pinned))
    settle(access)
    return access


def pinned_images(config: Path, cluster: str, region: str, refresh: bool, resolve) -> dict[str, str]:
    """The image IDs ``resolve(pinned)`` gives, pinned beside the rendered config from the cluster's
    first ``up``: AWS's parameters name a new image whenever it publishes one, and a changed ID
    changes a node type's launch hash (Ray replaces running workers as outdated and never reuses
    stopped ones). ``refresh`` reads AWS's newest instead."""
    path = rendered_path(config).parent / f"images-{cluster}.json"
    try:
        kept = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        kept = {}
    pinned = kept.get("images", {}) if kept.get("region") == region and not refresh else {}
    images = resolve(pinned)
    if images != pinned:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.with_suffix(".new").write_text(json.dumps({"region": region, "images": images}, indent=1) + "\n")
        os.replace(path.with_suffix(".new"), path)
        for name, image in images.items():
            print(f"image: {image} ({name[len(SSM_IMAGE):]}), pinned in {path}; up --refresh-images reads AWS's newest")
    return images


def aws_call(what: str, fn, *args):
    """``fn(*args)``, AWS's refusals (no credentials, access denied, no answer) as one line."""
    import botocore.exceptions

    try:
        return fn(*args)
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ClusterError(f"AWS refused {what}: {first}") from None


def down(rendered: Path, values: dict[str, str], ray_args: list[str], backup_to: str | None, discard: bool) -> int:
    """``ray down``, after the head's MLflow database is safe (or its loss was asked for)."""
    if mlflow_db(values) == "rds":
        print(f"MLflow's database {db_identifier(values['CLUSTER_NAME'])} (RDS) stays: runs, models and accounts "
              "for the next up")
    elif on_head(values.get("MLFLOW_BACKEND_STORE_URI")) and not discard:
        uri = backup_to or db_backup_uri(values)
        s3_location(uri, "--backup-to")
        command = f"cd ~/platform && ~/venv/bin/python -m platform.cluster backup-db {HEAD_DB} {shlex.quote(uri)}"
        code = subprocess.call(["ray", "exec", str(rendered), command])
        if code != 0:
            raise ClusterError(f"the head's MLflow database could not be backed up to {uri} (ray exec exited {code}); "
                               "the cluster is still up. Fix what the lines above say, give --backup-to s3://..., or "
                               "--discard-mlflow-db if losing every run's record is meant")
    elif discard:
        print("the head's MLflow database goes with it (--discard-mlflow-db)")
    cfg = yaml.safe_load(rendered.read_text(encoding="utf-8"))
    if cfg["provider"]["type"] == "local":  # your machines keep running: MLflow would, after Ray
        subprocess.call(["ray", "exec", str(rendered), stop_mlflow(cfg)])
    code = subprocess.call(["ray", "down", str(rendered), *ray_args])
    if code != 0:
        return code
    if cfg["provider"]["type"] == "aws":
        terminate_all(values, cfg["provider"]["region"])
    return 0


def terminate_all(values: dict[str, str], region: str) -> None:
    """Every instance of the cluster terminated (``ray down`` stops them: cache_stopped_nodes), and
    what stays billed, said."""
    ids = aws_call("terminating the cluster's instances", terminate_instances, values["CLUSTER_NAME"], region)
    print(f"terminated {len(ids)} instance(s) of {values['CLUSTER_NAME']}, their disks with them" if ids else
          f"no instance of {values['CLUSTER_NAME']} left to terminate")
    for line in kept_after_down(values):
        print(f"kept: {line}")


def tunnel(rendered: Path, port: int) -> int:
    """``ssh -N -L port:<head's private address>:5000`` to the head, with the key and account of
    Ray's bootstrapped config for this cluster, until interrupted."""
    from ray.autoscaler._private.commands import _bootstrap_config, get_head_node_ip

    cfg = _bootstrap_config(yaml.safe_load(rendered.read_text(encoding="utf-8")))
    public = get_head_node_ip(str(rendered))
    # `ray exec` runs over `ssh -tt`: its pty ends each line with \r\n.
    proc = subprocess.run(["ray", "exec", str(rendered), "hostname -I"], capture_output=True, text=True)
    lines = [line for line in proc.stdout.replace("\r", "").splitlines() if line.strip()]
    if proc.returncode != 0 or not lines:
        raise ClusterError(f"could not read the head's private address (ray exec exited {proc.returncode}): "
                           f"{(proc.stderr.strip().splitlines() or [''])[-1]}")
    private = lines[-1].split()[0]
    print(f"MLflow on the head ({private}:5000) at http://127.0.0.1:{port}: sign in with cluster.env's account; "
          "Ctrl-C ends the tunnel", flush=True)
    return subprocess.call(["ssh", "-N", "-i", cfg["auth"]["ssh_private_key"], "-o", "IdentitiesOnly=yes",
                            "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o",
                            "ExitOnForwardFailure=yes", "-L", f"127.0.0.1:{port}:{private}:5000",
                            f"{cfg['auth']['ssh_user']}@{public}"])


def node_env(values: dict[str, str], role: str, head_ip: str, home: Path) -> str:
    """The environment of a cluster node as shell ``export`` lines: cluster.env's settings, then
    what every command on the node needs. The start commands write it to ``~/platform-env-<host>.sh``
    (by host: machines that share one home directory keep each their own) and source it before
    MLflow and Ray start (so ``ray job submit`` drivers inherit it); ``~/.bashrc`` sources it first,
    above its interactive-only guard (so ``ray attach``, ``ray attach --tmux`` and ``ray exec`` see
    the same). ``OMP_NUM_THREADS`` is unset unless cluster.env sets it."""
    env = dict(values)
    commit = env.pop(settings.GIT_COMMIT, "")
    env.update({
        "PATH": f"{home}/venv/bin:$PATH", "RAY_AUTH_MODE": "token",
        settings.CACHE_DIR: values.get(settings.CACHE_DIR) or f"{home}/platform-cache",
        settings.CLUSTER: values["CLUSTER_NAME"],
    })
    if commit:
        env[settings.GIT_COMMIT] = commit
    if role == "head":
        # MLflow's server-side jobs (seven huey consumer processes, for features this platform does
        # not use) would take the head's CPU from the drivers, and from ray start when they start together.
        env.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
        env.update({
            settings.TRACKING_URI: f"http://{head_ip}:5000",
            settings.DATA_DIR: values.get(settings.DATA_DIR) or f"{home}/data",
            settings.OUTPUT_DIR: values["RUNS_URI"],
        })
    lines = ["# Written by python -m platform.cluster node-env at ray start (cluster.yaml); do not edit."]
    for key, value in env.items():
        quoted = f'"{value}"' if key == "PATH" else shlex.quote(value)  # PATH keeps the node's own
        lines.append(f"export {key}={quoted}")
    if settings.OMP_THREADS not in env:
        # Ray's launcher runs every command as `export OMP_NUM_THREADS=1 && (...)`: a raylet
        # started with it gives each of its tasks, actors and Train workers one OpenMP thread
        # whatever CPUs it holds. Unset, Ray sets each one's to its CPUs (as on a local instance).
        lines.append(f"unset {settings.OMP_THREADS}")
    return "\n".join(lines) + "\n"


def node_settings(env_file: Path, home: Path | None = None) -> dict[str, str]:
    """cluster.env with what ``up`` learnt (``UP_FILE``), as a node's commands see them."""
    learnt_file = Path(UP_FILE.replace("~", str(home or Path.home()), 1))
    learnt = read_env(learnt_file) if learnt_file.is_file() else {}
    values = read_settings(env_file, learnt.get(PROVIDER, "aws"))
    values.update(learnt)
    return values


def write_pgpass(values: dict[str, str], region: str | None, home: Path) -> str:
    """``~/.pgpass`` (owner-only) with the password of the database ``up`` made, from its SSM
    parameter: libpq (MLflow's SQLAlchemy) reads it, so no URI or environment carries it."""
    from urllib.parse import urlsplit

    uri, parameter = values.get("MLFLOW_BACKEND_STORE_URI", ""), values.get(DB_PASSWORD, "")
    if not parameter:
        return "no database password to fetch (MLflow's database is not one up made)"
    password = aws_call("reading MLflow's database password", read_password, parameter, region)
    parts = urlsplit(uri)
    line = f"{parts.hostname}:{parts.port or 5432}:{parts.path.lstrip('/')}:{parts.username}:{password}\n"
    path = write_private(home / ".pgpass", line)
    return f"{path}: the password of {parts.hostname}"


def provider_of(args) -> str:
    """``--provider``, except that ``down`` takes down what was rendered last."""
    rendered = rendered_path(args.config)
    if args.command == "down" and rendered.is_file():
        return yaml.safe_load(rendered.read_text(encoding="utf-8"))["provider"]["type"]
    return args.provider


def local_hosts(args) -> Hosts:
    if not args.head:
        raise ConfigError("--provider local needs --head ADDRESS (and --workers A,B,... for workers)")
    if not args.ssh_key.is_file():
        raise ConfigError(f"--ssh-key {args.ssh_key}: no such file (the private key whose public half is in "
                          f"~{args.ssh_user}/.ssh/authorized_keys on every machine)")
    workers = tuple(w.strip() for w in args.workers.split(",") if w.strip())
    for host in (args.head, *workers):
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9.:-]*", host):
            raise ConfigError(f"--head/--workers: {host!r} is not a host name or address")
    return Hosts(args.head, workers, args.ssh_user, args.ssh_key.resolve())


@cli_main
def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["slurm"]:
        return cluster_slurm.main(argv[1:], ROOT / "cluster.env")
    p = argparse.ArgumentParser(prog="python -m platform.cluster", description=__doc__.splitlines()[0])
    p.add_argument("command", choices=["up", "down", "render", "tunnel", "slurm", "mlflow-auth", "backup-db",
                                       "restore-db", "node-env", "pgpass"])
    p.add_argument("path", nargs="?", help="mlflow-auth: the configuration to write; backup-db: the database")
    p.add_argument("uri", nargs="?", help="backup-db: the s3:// location to write")
    p.add_argument("--config", type=Path, default=ROOT / "cluster.yaml")
    p.add_argument("--env-file", type=Path, default=ROOT / "cluster.env")
    p.add_argument("--backup-to", help="down: where the head's MLflow database goes (default MLFLOW_DB_BACKUP)")
    p.add_argument("--discard-mlflow-db", action="store_true", help="down: terminate the head with its database")
    p.add_argument("--role", choices=["head", "worker"], default="head", help="node-env: which node's environment")
    p.add_argument("--head-ip", default="127.0.0.1", help="node-env: the head's private address")
    p.add_argument("--port", type=int, default=5000, help="tunnel: the local port MLflow is forwarded to")
    p.add_argument("--provider", choices=["aws", "local"], default="aws",
                   help="up/render: AWS (default), or your own machines over SSH (Ray's on-premise provider)")
    p.add_argument("--refresh-images", action="store_true",
                   help="up/render: the image IDs AWS publishes now, not the ones pinned at the cluster's first up "
                        "(running workers of an older image are then replaced)")
    p.add_argument("--head", help="--provider local: the head machine's address")
    p.add_argument("--workers", default="", help="--provider local: the worker machines' addresses, comma-separated")
    p.add_argument("--ssh-user", default=os.environ.get("USER", "ubuntu"), help="--provider local: the SSH account")
    p.add_argument("--ssh-key", type=Path, default=Path("~/.ssh/id_ed25519").expanduser(),
                   help="--provider local: the SSH private key (its account's authorized key on every machine)")
    args, ray_args = p.parse_known_args(argv)
    if args.command == "mlflow-auth":
        check_account(dict(os.environ), "environment (cluster.env)")
        if not args.path:
            raise ConfigError("mlflow-auth needs the path of the configuration to write")
        write_mlflow_auth(Path(args.path), os.environ["MLFLOW_TRACKING_USERNAME"], os.environ["MLFLOW_TRACKING_PASSWORD"],
                          os.environ.get("MLFLOW_BACKEND_STORE_URI"))
        return 0
    if args.command == "backup-db":
        if not (args.path and args.uri):
            raise ConfigError("backup-db needs the database and the s3:// location: backup-db PATH s3://bucket/key")
        print(aws_call("backing up the MLflow database", backup, Path(args.path), args.uri, region_of(args.config)))
        return 0
    if args.command == "tunnel":
        rendered = rendered_path(args.config)
        if not rendered.is_file():
            raise ConfigError(f"no {rendered}: start the cluster with python -m platform.cluster up first")
        return tunnel(rendered, args.port)
    if args.command in ("node-env", "restore-db", "pgpass"):  # on a node: with what up learnt
        values = node_settings(args.env_file)
    else:
        values = read_settings(args.env_file, provider_of(args))
    if args.command == "node-env":
        sys.stdout.write(node_env(values, args.role, args.head_ip, Path.home()))
        return 0
    if args.command == "pgpass":
        print(write_pgpass(values, region_of(args.config), Path.home()))
        return 0
    if args.command == "restore-db":
        if on_head(values.get("MLFLOW_BACKEND_STORE_URI")):
            print(aws_call("restoring the MLflow database", restore, Path(args.path or HEAD_DB), db_backup_uri(values),
                           region_of(args.config)))
        return 0
    return launch(args, ray_args, values)


def launch(args, ray_args: list[str], values: dict[str, str]) -> int:
    """``up``, ``down`` and ``render``: the launcher's config rendered for the provider, then Ray's launcher."""
    if args.backup_to:
        s3_location(args.backup_to, "--backup-to")
    if shutil.which("ray") is None:
        raise ConfigError("the ray command is not on PATH: install the project's dependencies")
    rendered = rendered_path(args.config)
    if args.command == "down" and rendered.is_file():
        return down(rendered, values, ray_args, args.backup_to, args.discard_mlflow_db)
    if args.command == "down" and args.provider == "aws" and mlflow_db(values) != "head":
        # Nothing rendered here and no database on a head to back up: Ray's launcher is not needed
        # (and rendering would make the cluster's database just to tear it down).
        region = region_of(args.config)
        print(f"no {rendered} here: terminating the instances {values['CLUSTER_NAME']} has in {region}")
        terminate_all(values, region)
        return 0
    if args.provider == "local":
        render_local(args.config, args.env_file, rendered, local_hosts(args))
    else:
        render(args.config, args.env_file, rendered, provision_for(args.config, values, args.refresh_images))
    print(f"rendered {rendered}")
    if args.command == "render":
        return 0
    if args.command == "down":
        return down(rendered, values, ray_args, args.backup_to, args.discard_mlflow_db)
    env = dict(os.environ)
    if provider_of(args) == "local":
        # Ray's autoscaler v2 (what `ray up` starts since Ray 2.50) has no on-premise provider: its
        # head never sets the workers up (ray-project/ray#57153). v1 does.
        env["RAY_UP_enable_autoscaler_v2"] = "0"
    return subprocess.call(["ray", args.command, str(rendered), *ray_args], env=env)


if __name__ == "__main__":
    raise SystemExit(main())
