"""Every environment variable the platform reads or sets, each with its reason in a line: the one
place they are named (docs/development.md, "Environment variables"). Importing this module sets nothing;
``apply_defaults()`` does, when a command starts (``platform.errors.cli_main``) and before Ray starts
(``platform.run.ray_env.init_ray``). A user's own value is always kept. (``cluster.env``'s keys are
the cluster launcher's, read by ``platform.cluster``.)
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterator

# -- read: what a user (or the cluster's setup) sets --------------------------------------------
DATA_DIR = "PLATFORM_DATA_DIR"  # evaluation data (SentEval layout), corpora, nltk_data
CACHE_DIR = "PLATFORM_CACHE_DIR"  # generated columns, statistics, embeddings, local models (default <repo>/.cache/platform)
DATA_MIRROR = "PLATFORM_DATA_MIRROR"  # `platform.data fetch` from a mirror folder or URL instead of the sources
EMBEDDING_CACHE_GB = "PLATFORM_EMBEDDING_CACHE_GB"  # the embedding store's size bound (default 4)
TRACKING_WAIT = "PLATFORM_TRACKING_WAIT"  # seconds a fit's end waits for an absent tracking server (default 600)
STALL_MINUTES = "PLATFORM_STALL_MINUTES"  # minutes a running trial may report nothing before its sweep fails (default 30)
STORAGE_TIMEOUT = "PLATFORM_STORAGE_TIMEOUT"  # seconds the output_dir check waits for object storage (default 30)
GIT_COMMIT = "PLATFORM_GIT_COMMIT"  # the driver's commit, for workers running in a copy without .git
OUTPUT_DIR = "PLATFORM_OUTPUT_DIR"  # output_dir's default (the cluster's RUNS_URI on its head)
SWEEP_RECORD = "PLATFORM_SWEEP_RECORD"  # a file where tune writes the folder of the sweep it begins (a Slurm job resumes exactly it)
SLURM_LINEAGE = "PLATFORM_SLURM_LINEAGE"  # set by a Slurm job on the job it submits to continue it: the first job's id
CLUSTER = "PLATFORM_CLUSTER"  # set on a cluster's nodes (their name): local MLflow stores are refused there
TRACKING_URI = "MLFLOW_TRACKING_URI"  # MLflow's store (default sqlite:///<repo>/mlruns/mlflow.db)
TRACKING_CREDENTIALS = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN")  # MLflow's own
SYSTEM_METRICS_INTERVAL = "MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL"  # MLflow's: seconds between system/* samples (10)
RAY_ADDRESS = "RAY_ADDRESS"  # Ray's: the cluster to join (`local`: a private instance)
RAY_JOB_CONFIG = "RAY_JOB_CONFIG_JSON_ENV_VAR"  # Ray's: set inside a `ray job submit` job, its runtime env
HF_OFFLINE = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")  # Hugging Face's: no downloads (forwarded to workers; MTEB's hub tasks refused)
HF_HOME = "HF_HOME"  # Hugging Face's model cache (forwarded to workers, made absolute)
NLTK_DATA = "NLTK_DATA"  # NLTK's data folder (default $PLATFORM_DATA_DIR/nltk_data)
AWS_REGIONS = ("AWS_REGION", "AWS_DEFAULT_REGION")  # boto3's and pyarrow's region, the first set wins
AWS = ("AWS_ENDPOINT_URL", *AWS_REGIONS)  # and S3's endpoint: forwarded to workers
AUTOSCALING_CONFIG = "PLATFORM_AUTOSCALING_CONFIG"  # the launcher config the head runs: how far generation pools grow
LOCAL_RANK = "LOCAL_RANK"  # torchrun's: the GPU of this process, for the loop run without Ray
OMP_THREADS = "OMP_NUM_THREADS"  # OpenMP's (Ray sets it for each task, by its CPUs): end-of-run tasks' threads; unset on cluster nodes

# The values the platform uses when a variable it reads is unset (docs/development.md names each;
# tests/test_docs.py compares them).
READ_DEFAULTS = {
    EMBEDDING_CACHE_GB: 4.0,
    TRACKING_WAIT: 600.0,
    STALL_MINUTES: 30.0,
    STORAGE_TIMEOUT: 30.0,
    SYSTEM_METRICS_INTERVAL: 10.0,
    AUTOSCALING_CONFIG: "~/ray_bootstrap_config.yaml",  # where `ray up` leaves the launcher config on the head
}

# -- set: defaults in the platform's own processes (a user's own value kept) ---------------------
GCS_PORT = "RAY_GCS_SERVER_PORT"  # a local Ray's GCS on a free port (set while ray.init starts it; ray_env)
TRAIN_POLL = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"
URL_PRINTS = "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"
DEFAULTS = {
    # Ray's log dedup would fold every trial's per-evaluation line into one (read when Ray is imported).
    "RAY_DEDUP_LOGS_ALLOW_REGEX": r"step \d+/\d+  loss ",
    # Lines of Ray's own processes that are not the user's to act on (they stay in Ray's log files):
    # worker-group placement, Ray Data's execution notes, Ray-internal deprecations, ray#53727's
    # actor-restart caveat, the raylet's hint about the fractional CPUs the platform asks for, and
    # abseil's note that a lock waited long (a loaded machine, not a fault).
    "RAY_DEDUP_LOGS_SKIP_REGEX": "|".join([
        r"Requesting resources: ", r"Attempting to start training worker group", r"Started training worker group",
        r"world_rank=\d+, local_rank=\d+", r"Setting up process group for",
        r"has constructor arguments in the object store", r"Detected that the Ray Train controller actor \S+ is dead",
        r"RayDeprecationWarning", r"self\.exclude_resources = exclude_resources", r"Starting execution of Dataset",
        r"Execution plan of Dataset", r"Progress bars (for operators )?disabled", r"A new progress UI is available",
        r"Dataset \S+ execution finished in", r"PYTHON worker processes have been started on node",
        r"RAW: Lock blocking",
    ]),
    # The workers' lines name their trial or run themselves: Ray's "(RayTrainWorker pid=...)" prefix,
    # colour codes in a log file, adds nothing a reader needs.
    "RAY_DISABLE_WORKER_LOG_PREFIX": "1",
    # Without a terminal Ray Data logs progress as a block of lines: once a minute, not every 10 s.
    "RAY_DATA_NON_TTY_PROGRESS_LOG_INTERVAL": "60",
    # Ray warns about each of its default working_dir excludes that exists; ray_env.EXCLUDES names them all.
    "RAY_OVERRIDE_RUNTIME_ENV_DEFAULT_EXCLUDES": "",
    # A worker's report waits for Ray Train's controller poll (2 s by default) at every evaluation.
    TRAIN_POLL: "0.5",
    # Tune's newer console prints its configuration box even at verbose=0; the classic one is silent.
    "RAY_AIR_NEW_OUTPUT": "0",
    # Tokenizers' thread pool after a fork (Ray's workers, DataLoader) deadlocks or warns.
    "TOKENIZERS_PARALLELISM": "false",
    # MLflow prints two "View run" lines whenever a run on a tracking server ends (every seed and
    # trial of a sweep), with links that open its UI in GenAI mode; the commands print their own.
    URL_PRINTS: "true",
}

# Passed through to Ray workers (paths made absolute: workers run in a copy of the repository).
FORWARDED = (TRAIN_POLL, URL_PRINTS, DATA_DIR, TRACKING_URI, HF_HOME, *HF_OFFLINE, NLTK_DATA, *AWS, *TRACKING_CREDENTIALS)
PATHS = (DATA_DIR, HF_HOME, NLTK_DATA, CACHE_DIR)


@contextlib.contextmanager
def scoped(name: str, value: str | None) -> Iterator[None]:
    """``name=value`` inside the block when the user has not set it (``value`` None: nothing)."""
    ours = value is not None and name not in os.environ
    if ours:
        os.environ[name] = value
    try:
        yield
    finally:
        if ours:
            os.environ.pop(name, None)


def apply_defaults() -> None:
    """The platform's defaults in this process's environment, where the user has set nothing."""
    for key, value in DEFAULTS.items():
        os.environ.setdefault(key, value)


def get(name: str, default: str | None = None) -> str | None:
    """A variable's value; unset and empty are the same."""
    return os.environ.get(name) or default


def number(name: str, default: float | None = None) -> float:
    """The variable as a number; unset (or not a number): ``default``, else its ``READ_DEFAULTS``."""
    fallback = READ_DEFAULTS[name] if default is None else default
    try:
        return float(get(name) or fallback)
    except ValueError:
        return float(fallback)
