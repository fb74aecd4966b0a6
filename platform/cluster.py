"""``python -m platform.cluster up|down|render [ray options]``: ``cluster.yaml`` with the settings of
``cluster.env``, closed by default.

``cluster.yaml`` cannot read ``cluster.env`` (Ray's launcher substitutes nothing): the SSH rule's
source range is a placeholder there, so ``ray up cluster.yaml`` on its own is refused by AWS rather
than opening SSH to the internet. ``render`` writes ``.cluster/cluster.yaml`` with
``SSH_ALLOWED_CIDR`` put in (and the repository's absolute path as the synced folder); ``up`` and
``down`` render, then run ``ray up`` / ``ray down`` on it with the remaining options.

The settings are checked first, each mistake one line: an SSH range of the whole internet is
refused unless ``SSH_ALLOW_ANYWHERE=yes`` says it is meant; the MLflow server's account
(``MLFLOW_TRACKING_USERNAME`` and ``MLFLOW_TRACKING_PASSWORD``, at least 12 characters) and its
artifact store (``MLFLOW_ARTIFACTS_DESTINATION``) must be set.

``mlflow-auth PATH`` writes MLflow's basic-auth configuration (the admin account from those
variables, the permissions database beside PATH, readable by its owner only): the head runs it
before ``mlflow server --app-name basic-auth``, as ``platform/topology.py`` does.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import shutil
import subprocess
from pathlib import Path

import yaml

from platform.errors import ConfigError, cli_main

ROOT = Path(__file__).resolve().parent.parent
CIDR_PLACEHOLDER = "${SSH_ALLOWED_CIDR}"
RENDERED = ROOT / ".cluster" / "cluster.yaml"
REQUIRED = {
    "SSH_ALLOWED_CIDR": "the address range allowed to SSH to the head (your network, e.g. 198.51.100.0/24)",
    "MLFLOW_TRACKING_USERNAME": "the MLflow server's admin account",
    "MLFLOW_TRACKING_PASSWORD": "the MLflow server's admin password",
    "MLFLOW_ARTIFACTS_DESTINATION": "an s3:// location for MLflow's artifacts",
}
MIN_PASSWORD = 12


def read_env(path: Path) -> dict[str, str]:
    """``KEY=value`` lines of a shell file (comments, blanks and ``export`` allowed; quotes stripped)."""
    if not path.is_file():
        raise ConfigError(f"{path} not found: copy cluster.env.example to cluster.env and fill it in")
    values = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.removeprefix("export ").partition("=")
        if not sep or not key.strip().isidentifier():
            raise ConfigError(f"{path}:{number}: expected KEY=value")
        values[key.strip()] = value.split(" #", 1)[0].strip().strip("'\"")
    return values


def check_settings(values: dict[str, str], source: str) -> None:
    for key, what in REQUIRED.items():
        if not values.get(key):
            raise ConfigError(f"{source}: set {key} ({what})")
    try:
        network = ipaddress.ip_network(values["SSH_ALLOWED_CIDR"], strict=False)
    except ValueError:
        raise ConfigError(f"{source}: SSH_ALLOWED_CIDR={values['SSH_ALLOWED_CIDR']!r} is not an address range "
                          "(e.g. 198.51.100.7/32)") from None
    if network.prefixlen == 0 and values.get("SSH_ALLOW_ANYWHERE") != "yes":
        raise ConfigError(f"{source}: SSH_ALLOWED_CIDR={network} opens SSH to the whole internet; give your network's "
                          "range, or set SSH_ALLOW_ANYWHERE=yes if that is meant")
    check_account(values, source)
    if not values["MLFLOW_ARTIFACTS_DESTINATION"].startswith("s3://"):
        raise ConfigError(f"{source}: MLFLOW_ARTIFACTS_DESTINATION must be an s3:// location")


def check_account(values: dict[str, str], source: str) -> None:
    for key in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        if not values.get(key):
            raise ConfigError(f"{source}: set {key} ({REQUIRED[key]})")
    if len(values["MLFLOW_TRACKING_PASSWORD"]) < MIN_PASSWORD:
        raise ConfigError(f"{source}: MLFLOW_TRACKING_PASSWORD must have at least {MIN_PASSWORD} characters")


def render(config: Path, env_file: Path, out: Path) -> Path:
    """``config`` with the SSH range of ``env_file`` and the repository's absolute path, at ``out``."""
    values = read_env(env_file)
    check_settings(values, str(env_file))
    cfg = yaml.safe_load(config.read_text(encoding="utf-8"))
    rules = cfg["provider"]["security_group"]["IpPermissions"]
    for rule in rules:
        for ip_range in rule.get("IpRanges", []):
            if ip_range.get("CidrIp") == CIDR_PLACEHOLDER:
                ip_range["CidrIp"] = str(ipaddress.ip_network(values["SSH_ALLOWED_CIDR"], strict=False))
    cfg["file_mounts"] = {remote: str((config.parent / local).resolve()) for remote, local in cfg["file_mounts"].items()}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("# Rendered by python -m platform.cluster from cluster.yaml and cluster.env; do not edit.\n"
                   + yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")
    return out


def write_mlflow_auth(path: Path, username: str, password: str) -> Path:
    """MLflow's basic-auth configuration: ``username`` is the admin, other accounts have no
    permission until granted, the permissions database is beside ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = ("[mlflow]\n"
            "default_permission = NO_PERMISSIONS\n"
            f"database_uri = sqlite:///{path.parent.resolve() / 'basic_auth.db'}\n"
            f"admin_username = {username}\n"
            f"admin_password = {password}\n"
            "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    return path


@cli_main
def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m platform.cluster", description=__doc__.splitlines()[0])
    p.add_argument("command", choices=["up", "down", "render", "mlflow-auth"])
    p.add_argument("path", nargs="?", help="mlflow-auth: where to write the configuration")
    p.add_argument("--config", type=Path, default=ROOT / "cluster.yaml")
    p.add_argument("--env-file", type=Path, default=ROOT / "cluster.env")
    args, ray_args = p.parse_known_args(argv)
    if args.command == "mlflow-auth":
        check_account(dict(os.environ), "environment (cluster.env)")
        if not args.path:
            raise ConfigError("mlflow-auth needs the path of the configuration to write")
        write_mlflow_auth(Path(args.path), os.environ["MLFLOW_TRACKING_USERNAME"], os.environ["MLFLOW_TRACKING_PASSWORD"])
        return 0
    rendered = render(args.config, args.env_file, RENDERED)
    print(f"rendered {rendered}")
    if args.command == "render":
        return 0
    if shutil.which("ray") is None:
        raise ConfigError("the ray command is not on PATH: install the project's dependencies")
    return subprocess.call(["ray", args.command, str(rendered), *ray_args])


if __name__ == "__main__":
    raise SystemExit(main())
