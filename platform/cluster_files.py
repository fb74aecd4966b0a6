"""The files a cluster's settings and nodes share: ``cluster.env`` read as the launcher and the
Slurm job read it, and the owner-only files a node writes (MLflow's basic-auth configuration)."""

from __future__ import annotations

import os
from pathlib import Path

from platform.errors import ConfigError
from platform.tracking.store import DATABASE_SCHEMES


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


def write_private(path: Path, text: str) -> Path:
    """``text`` at ``path``, readable by its owner only from the start (it holds a password)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    return path


# How long the MLflow server trusts a password it has checked. Without it every request (each
# batch of a trial's points, each poll, each UI call) re-derives the stored hash: ~0.4 CPU-s per
# request on a 2-core VM, a core's worth for every two or three requests a second (benchmark case mlflow-auth).
# MLflow drops an account's entry when it is changed through the server that serves it; another
# worker process of that server may accept an old password for up to this long (MLflow's
# basic_auth.ini suggests 60).
AUTH_CACHE_TTL_S = 60


def write_mlflow_auth(path: Path, username: str, password: str, database_uri: str | None = None,
                      cache_ttl_s: int = AUTH_CACHE_TTL_S) -> Path:
    """MLflow's basic-auth configuration: ``username`` is the admin, other accounts have no
    permission until granted. The accounts live in ``database_uri`` when it is a server database
    (MLflow's tracking database: its auth tables and migrations are its own), else in SQLite
    beside ``path``, which goes with the disk it is on. Checked passwords are remembered for
    ``cache_ttl_s`` seconds (0: MLflow's default, never)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if not (database_uri and database_uri.split(":", 1)[0].split("+", 1)[0] in DATABASE_SCHEMES):
        database_uri = f"sqlite:///{path.parent.resolve() / 'basic_auth.db'}"
    text = ("[mlflow]\n"
            "default_permission = NO_PERMISSIONS\n"
            f"database_uri = {ini(database_uri)}\n"
            f"admin_username = {ini(username)}\n"
            f"admin_password = {ini(password)}\n"
            "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
            f"auth_cache_ttl_seconds = {cache_ttl_s}\n")
    return write_private(path, text)


def ini(value: str) -> str:
    """``value`` written so that MLflow's reader of ``basic_auth.ini`` (``configparser.ConfigParser()``,
    which interpolates) returns it as it is: a ``%`` doubled (check_account refuses what an INI
    value cannot hold: surrounding blanks, line breaks)."""
    return value.replace("%", "%%")
