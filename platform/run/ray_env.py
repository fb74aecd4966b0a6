"""Starting (or joining) Ray so that workers can import this repository's ``platform`` package.

Ray workers import the standard library's ``platform`` before they see the driver's directory, so
the job ships the repository as its ``working_dir``. Locally this starts a Ray with
the machine's CPUs; with ``RAY_ADDRESS`` set (a cluster, ``ray job submit``) it joins that one.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

# Ray folds console lines that differ only in words with digits into "[repeated Nx across
# cluster]": every trial's per-evaluation line (platform.run.loop.progress_line) would vanish into
# one. Ray reads this when it is imported, so this module is imported before Ray is.
os.environ.setdefault("RAY_DEDUP_LOGS_ALLOW_REGEX", r"step \d+/\d+  loss ")
EXCLUDES = [".venv/", ".git/", "mlruns/", "runs/", "outputs/", ".cache/", "**/__pycache__/", "*.parquet", ".whl/", ".gl/"]

# Passed through to workers; paths are made absolute since workers run in the shipped copy.
FORWARDED_ENV = ("PLATFORM_DATA_DIR", "MLFLOW_TRACKING_URI", "HF_HOME", "HF_HUB_OFFLINE", "NLTK_DATA", "TRANSFORMERS_OFFLINE",
                 "AWS_ENDPOINT_URL", "AWS_DEFAULT_REGION", "AWS_REGION")


def worker_env() -> dict[str, str]:
    # Workers run in a copy of the repository (the job's working_dir), where the default cache
    # folder would be a new, empty one: they read the driver's cache, so corpus statistics and
    # generated columns are made once (on another node the folder is created and filled there).
    from platform.data.cache import cache_root
    from platform.tracking import GIT_COMMIT_ENV, git_commit

    env = {"TOKENIZERS_PARALLELISM": "false", "PLATFORM_CACHE_DIR": str(cache_root()), GIT_COMMIT_ENV: git_commit()}
    for key in FORWARDED_ENV:
        value = os.environ.get(key)
        if value:
            env[key] = str(Path(value).resolve()) if key in ("PLATFORM_DATA_DIR", "HF_HOME", "NLTK_DATA") else value
    return env


def init_ray(num_cpus: int | None = None) -> None:
    import ray

    if ray.is_initialized():
        return
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    address = os.environ.get("RAY_ADDRESS")
    ray.init(
        # "local": a new instance even when another Ray runs on this machine (left to itself,
        # ray.init() would join the last one `ray start` made, refusing num_cpus).
        address=address or "local",
        num_cpus=None if address else num_cpus,
        dashboard_host="127.0.0.1",
        log_to_driver=True,
        runtime_env={"working_dir": str(REPO_ROOT), "excludes": EXCLUDES, "env_vars": worker_env()},
    )
