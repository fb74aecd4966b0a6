"""Starting or joining Ray so that workers can import this repository's ``platform`` package.

Which Ray, by Ray's own convention: ``RAY_ADDRESS`` (``local``: a new private instance), else the
cluster this machine belongs to (what ``ray start`` recorded in Ray's temp folder, ``$RAY_TMPDIR``
or ``/tmp/ray``), else a new local instance with the machine's CPUs. Ray workers import the
standard library's ``platform`` before they see the driver's directory, so the job ships the
repository as its ``working_dir``; inside a ``ray job submit`` job the job's runtime environment is
the platform's, and only what it lacks is added.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
import types
from pathlib import Path

from platform import settings
from platform.console import drop_notes
from platform.errors import ClusterError, one_line, stopping
from platform.storage import REPO_ROOT, cache_root
from platform.tracking.recorder import abandon_open_runs
from platform.tracking.store import git_commit


EXCLUDES = [".venv/", "venv/", ".git/", "mlruns/", "runs/", "outputs/", ".cache/", ".cluster/", "**/__pycache__/", "*.parquet", ".whl/", ".gl/", ".dev/"]

# A stopped fit's group is removed by Ray Train's own cleaner (it polls its controller every
# second) about a second after the controller ends, seen at a sweep's end.
CLEANER_GRACE_S = 5.0


def worker_env() -> dict[str, str]:
    # Workers run in a copy of the repository, where the default cache would be a new, empty
    # one: they read the driver's, so statistics and generated columns are made once. The tracking
    # server's credentials travel as MLflow reads them (a URI with a password is refused:
    # platform.tracking.store); storage credentials are the nodes' own (instance role, environment).
    env = {"TOKENIZERS_PARALLELISM": "false", settings.CACHE_DIR: str(cache_root()), settings.GIT_COMMIT: git_commit()}
    for key in settings.FORWARDED:
        value = settings.get(key)
        if value:
            env[key] = str(Path(value).resolve()) if key in settings.PATHS else value
    return env


def find_cluster() -> tuple[str | None, str]:
    """``(address, how it was found)``; the address is None for a new local instance."""
    from ray._common.utils import get_ray_address_file

    address = (settings.get(settings.RAY_ADDRESS) or "").strip()
    if address == "local":
        return None, "RAY_ADDRESS=local"
    if address:
        return address, "RAY_ADDRESS"
    recorded = Path(get_ray_address_file(None))
    try:
        address = recorded.read_text(encoding="utf-8").strip()
    except OSError:
        return None, "no cluster recorded on this machine"
    if not address:
        return None, "no cluster recorded on this machine"
    try:
        check_reachable(address)
    except ClusterError:
        # A `ray start` that ended without `ray stop` (a crash, a killed head): Ray's own
        # ray.init() would fail on it; the command says so on its Ray line and runs locally.
        return None, f"the cluster `ray start` recorded ({address}) does not answer"
    return address, f"recorded by `ray start` in {recorded}"


def job_runtime_env() -> dict | None:
    """The runtime environment of the ``ray job submit`` job this driver runs in (None outside one)."""
    raw = settings.get(settings.RAY_JOB_CONFIG)
    if raw is None:
        return None
    return dict(json.loads(raw).get("runtime_env") or {})


def missing_from(job_env: dict, ours: dict) -> dict:
    """What of ``ours`` the job's runtime environment lacks: Ray refuses a driver that declares a
    field or a variable the job already set ("Failed to merge the Job's runtime env")."""
    added = {k: v for k, v in ours.items() if k not in job_env and k != "env_vars"}
    if "working_dir" in job_env:
        added.pop("excludes", None)  # the job's working copy was packed by the job's own rules
    env_vars = {k: v for k, v in ours.get("env_vars", {}).items() if k not in job_env.get("env_vars", {})}
    if env_vars:
        added["env_vars"] = env_vars
    return added


# Whether this process started the Ray it is connected to: a private local instance, on which
# nothing but this command's own work is scheduled (``platform.run.final_evaluation.on_device``).
_started_here = False


def started_here() -> bool:
    """Whether the Ray this process uses is the local instance it started itself."""
    import ray

    return _started_here and ray.is_initialized()


def init_ray(num_cpus: int | None = None) -> None:
    global _started_here
    try:
        import ray
    except ImportError:  # a GPU box with torch alone: the process runtime is what runs there
        raise ClusterError("Ray is not installed in this Python (pip install '.' installs it); on a machine without "
                           "Ray, train with --set runtime=process") from None
    if ray.is_initialized():
        return
    settings.apply_defaults()
    address, found = find_cluster()  # a recorded address is reachable already
    if found == "RAY_ADDRESS":
        # Left to Ray, an address nothing listens on is retried for minutes, then a traceback.
        check_reachable(address)
    job_env = job_runtime_env()
    on_sigterm = signal.getsignal(signal.SIGTERM)
    for attempt in range(1, LOCAL_START_TRIES + 1):
        before = _descendants()
        env, port, context, exc = _start(ray, address, num_cpus, job_env)
        if exc is None:
            _started_here = address is None
            break
        if address or attempt == LOCAL_START_TRIES or "timed out during startup" not in str(exc):
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            where = f"joining the cluster at {address} ({found})" if address else "starting a local Ray"
            raise ClusterError(f"Ray failed {where}: {type(exc).__name__}: {first}") from None
        ended = end_failed_start(before)
        print(f"Ray: the local start timed out (its raylet did not register within Ray's 30 s: a busy machine); "
              f"{ended} process(es) of it ended, starting again", flush=True)
    if port is not None and ray.get_runtime_context().gcs_address != env["RAY_ADDRESS"]:
        raise RuntimeError(f"Ray's GCS started at {ray.get_runtime_context().gcs_address}, "
                           f"not at the address given to its workers ({env['RAY_ADDRESS']})")
    # ray.init takes SIGTERM (its handler exits with status 15; its core worker's dumps a stack
    # and aborts): the command's own (SIGTERM as Ctrl-C, platform.errors) is put back.
    if callable(on_sigterm):
        signal.signal(signal.SIGTERM, on_sigterm)
    print(f"Ray: {describe(address, found, job_env is not None)}, "
          f"{int(ray.cluster_resources().get('CPU', 0))} CPUs"
          + (f", dashboard http://{context.dashboard_url}" if getattr(context, "dashboard_url", None) else ""), flush=True)
    watch_cluster(ray.get_runtime_context().gcs_address)


# Ray gives a new local node a hard-coded 30 s for its raylet to register with its GCS
# (ray/_private/node.py); on a machine whose cores are all busy (seen on a 2-core CI VM under the
# test suite) it can miss that once. A local start that timed out is ended and made again.
LOCAL_START_TRIES = 2

# A raylet starts one worker per CPU when its node's first driver connects, whether or not a task
# ever takes them, and ends those left idle once the job's own workers run; Ray 2.60's worker now
# and then aborts in that exit (an abseil "Mutex corrupt" check, SIGABRT), and log_to_driver puts
# its "Fatal Python error" on the command's console. The job's tasks and actors start their own.
# Read-only: ray.init writes its session's spilling folder into the dict it is given, which a later
# start in the same process (a retried one) would then inherit; each start gets a copy.
RAYLET_CONFIG = types.MappingProxyType({"prestart_worker_first_driver": False})


def raylet_env() -> dict[str, str]:
    """:data:`RAYLET_CONFIG` as the environment a ``ray start`` reads it from."""
    return {f"RAY_{name}": str(int(value)) for name, value in RAYLET_CONFIG.items()}


def _start(ray, address: str | None, num_cpus: int | None, job_env: dict | None):
    """One ``ray.init``: ``(the workers' env, the local GCS port or None, Ray's context, None)``, or
    its exception last (nothing has been written yet: the commands start Ray before any run)."""
    env = worker_env()
    port = None
    if not address:
        # Ray's state API inside the job (Ray Train's placement-group cleaner) finds its cluster
        # through RAY_ADDRESS, else whichever Ray the machine last started: the local GCS gets a
        # port chosen here (or the user's) and the job's processes its address.
        port = int(settings.get(settings.GCS_PORT) or free_port())
        env[settings.RAY_ADDRESS] = f"{ray.util.get_node_ip_address()}:{port}"
    runtime_env = {"working_dir": str(REPO_ROOT), "excludes": EXCLUDES, "env_vars": env}
    if job_env is not None:
        runtime_env = missing_from(job_env, runtime_env)
    try:
        drop_notes(DRIVER_NOTES)
        with settings.scoped(settings.GCS_PORT, None if port is None else str(port)):  # read by the head ray.init starts
            context = ray.init(
                # "local" starts a new instance even when another Ray runs on this machine.
                address=address or "local",
                num_cpus=None if address else num_cpus,
                dashboard_host="127.0.0.1",
                log_to_driver=True,
                logging_level=logging.WARNING,  # its start-up and packaging notes: one line of ours below
                runtime_env=runtime_env,
                _system_config=None if address else dict(RAYLET_CONFIG),
            )
    except Exception as exc:
        return env, port, None, exc
    return env, port, context, None


def _descendants() -> set[int]:
    import psutil

    return {p.pid for p in psutil.Process().children(recursive=True)}


def end_failed_start(before: set[int]) -> int:
    """End what a failed local start left (its GCS, raylet, dashboard, monitors: this process's
    descendants that were not there ``before`` it) and Ray's state in this process; how many ended."""
    import psutil
    import ray

    with contextlib.suppress(Exception):
        ray.shutdown()
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    for p in left:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(left, timeout=10)
    return len(left)


# Ray's core worker aborts the whole process once its GCS has not answered for 60 s
# (gcs_rpc_server_reconnect_timeout_s): no Python runs then, and the command's runs would stay
# RUNNING. A GCS that refuses connections this long is gone (a head that died, `ray stop`).
LOST_AFTER_S = 10.0


def watch_cluster(gcs_address: str, interval: float = 1.0, lost_after: float = LOST_AFTER_S) -> threading.Thread:
    """Watch the GCS at ``gcs_address`` from a daemon thread; once it has refused connections for
    ``lost_after`` seconds: the runs this process works in end FAILED (MLflow alone: Ray cannot
    be asked anything), one error line says to ``--resume``, and the process exits 2; a command that
    was stopping (SIGTERM: a scheduler that takes the cluster down with it) ends them KILLED and exits 130."""
    import atexit

    import ray

    host, _, port = gcs_address.rpartition(":")
    done = threading.Event()
    atexit.register(done.set)  # after this, Ray's own shutdown may take its GCS down (a local instance)

    def watch() -> None:
        last_seen = time.monotonic()
        while not done.wait(interval):
            try:  # this process left that Ray (ray.shutdown, another ray.init): nothing to watch
                if not ray.is_initialized() or ray.get_runtime_context().gcs_address != gcs_address:
                    return
            except Exception:
                return
            if answers(host, int(port), timeout=2) is None:
                last_seen = time.monotonic()
            elif time.monotonic() - last_seen >= lost_after:
                cluster_lost(gcs_address, time.monotonic() - last_seen)

    thread = threading.Thread(target=watch, name="ray-cluster-watch", daemon=True)
    thread.start()
    return thread


def await_loss(seconds: float = LOST_AFTER_S + 5.0, gcs_address: str | None = None) -> bool:
    """A stopping command whose cluster is going away with it (Slurm's preemption signals Ray's
    nodes as it signals the command) waits here, at most ``seconds``, for the watch to end it: a
    trial process still dying may open or write its run after the command closed the open ones, and
    the watch ends the runs left RUNNING once the cluster is silent. Returns at once when the
    cluster answers (a stop that leaves it up) or this process is in none (``gcs_address``: that
    cluster's, default this process's). False when it waited out ``seconds``."""
    import ray

    if gcs_address is None:
        try:
            gcs_address = ray.get_runtime_context().gcs_address if ray.is_initialized() else ""
        except Exception:  # noqa: BLE001 - no Ray to ask
            gcs_address = ""
    host, _, port = gcs_address.rpartition(":")
    if not port:
        return True
    deadline = time.monotonic() + seconds
    while answers(host, int(port), timeout=1) is not None:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.5)
    return True


def cluster_lost(gcs_address: str, silent_s: float) -> None:
    """The end of a command whose Ray cluster went away (see ``watch_cluster``)."""
    reason = f"the Ray cluster at {gcs_address} went away (its GCS silent for {silent_s:.0f} s)"
    if stopping():  # a scheduler took the cluster down as it stopped this command (Slurm's preemption)
        reason += " while the command was stopping"
    ended: list[str] = []
    try:
        ended = abandon_open_runs(reason, "interrupted" if stopping() else "failed")
        runs = f"; run {', '.join(ended)} ended {'KILLED' if stopping() else 'FAILED'}" if ended else ""
    except Exception as exc:  # the tracking server went with it (it runs on the head)
        runs = f"; its runs stay RUNNING in MLflow, which did not answer ({one_line(exc, 100)})"
    command = Path(sys.argv[0]).stem if sys.argv else "train"
    again = f"--resume {ended[0]}" if command == "train" and ended else "--resume and the same arguments"
    print(f"error: {reason}{runs}; once a cluster is up, continue with: python -m platform.{command} {again}",
          file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(130 if stopping() else 2)


ACTOR_END_WAIT_S = 60.0  # a stopped trial's actor and workers: Ray ends them within seconds


def actor_id(actor) -> str:
    """A Ray actor handle's id ("" for None), without keeping the handle (which keeps the actor)."""
    return actor._actor_id.hex() if actor is not None else ""


def await_actor_end(actor: str, seconds: float) -> bool:
    """Wait, at most ``seconds``, until Ray's GCS has the actor ``actor`` ("": none) neither alive
    nor still to start; whether it has (False too where the GCS did not answer)."""
    import ray
    from ray.util.state import list_actors

    if not actor:
        return True
    deadline, gcs = time.monotonic() + seconds, ray.get_runtime_context().gcs_address
    try:
        while list_actors(address=gcs, filters=[("actor_id", "=", actor), ("state", "!=", "DEAD")],
                          raise_on_missing_output=False):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.5)
    except Exception:  # noqa: BLE001 - a GCS that does not answer: the caller goes on as it would have
        return False
    return True


def free_reservations(settle_s: float = 20.0, grace_s: float = CLEANER_GRACE_S, say: bool = False) -> list[str]:
    """Once a sweep's trials have ended: remove the placement groups its job still holds on the
    cluster; the ids removed. A trial stopped while Ray Train restarts its worker group can leave
    that group reserved after the job ends, holding a node's resources for good. The job's Train
    controllers are given ``settle_s`` to end first, so that none places a group after this; then
    Ray Train's own cleaner is given ``grace_s`` (within ``settle_s``) to remove their groups, so
    that only what outlives it is removed here and reported (``say``: in a line on the console)."""
    import ray
    from ray.util.placement_group import PlacementGroup, remove_placement_group
    from ray.util.state import list_actors, list_placement_groups

    if not ray.is_initialized():
        return []
    gcs, job = ray.get_runtime_context().gcs_address, ray.get_runtime_context().get_job_id()

    def held() -> list[str]:
        return [g.placement_group_id for g in list_placement_groups(
            address=gcs, filters=[("creator_job_id", "=", job)], detail=True) if g.state != "REMOVED"]

    released = []
    try:
        deadline = time.monotonic() + settle_s
        while time.monotonic() < deadline and list_actors(
                address=gcs, filters=[("job_id", "=", job), ("state", "=", "ALIVE"), ("class_name", "=", "TrainController")]):
            time.sleep(0.5)
        grace, groups = min(deadline, time.monotonic() + grace_s), held()
        while groups and time.monotonic() < grace:
            time.sleep(0.5)
            groups = held()
        for group_id in groups:
            remove_placement_group(PlacementGroup(ray.PlacementGroupID(bytes.fromhex(group_id))))
            released.append(group_id)
    except Exception as exc:  # noqa: BLE001 - the command has ended; its exit is not to be held up or changed
        logging.getLogger(__name__).warning("could not check the cluster for placement groups left by this job: %s", exc)
    if say and released:
        print(f"note: released {len(released)} placement group(s) that stopped trials left reserved on the cluster",
              flush=True)
    return released


def describe(address: str | None, found: str, in_job: bool) -> str:
    """Which Ray the command uses, for its ``Ray:`` line."""
    import ray

    if not address:
        return "a local instance" + (f" ({found})" if found.startswith(("RAY_ADDRESS", "the cluster")) else "")
    gcs = ray.get_runtime_context().gcs_address
    if in_job:
        return f"job {ray.get_runtime_context().get_job_id()} of the cluster at {gcs}"
    if found == "RAY_ADDRESS":
        return f"the cluster at {gcs} (RAY_ADDRESS)"
    return f"the cluster this machine belongs to, at {gcs} (RAY_ADDRESS=local for a private one)"


# The driver's share of a quiet console: Ray's notice that a local instance uses token authentication
# (its default), Ray Data's notes around a dataset's progress bar and the progress it logs in its
# place when stdout is no terminal, and Tune's timing of the sweep's callback.
DRIVER_NOTES = {
    "ray._private.authentication.authentication_token_setup": ("Token authentication is enabled for this Ray cluster",),
    "ray.data._internal.execution.streaming_executor": ("Starting execution of Dataset", "Execution plan of Dataset",
                                                        "execution finished in"),
    "ray.data._internal.progress": ("Progress bars for operators disabled", "[dataset]: A new progress UI",
                                    "Progress will be logged because stdout"),
    # Its progress, logged in place of the bar when stdout is no terminal: every record ("" is in each).
    "ray.data._internal.progress.logging_progress": ("",),
    # Tune timing the sweep's own callback, whose calls only queue work for the trials' writers.
    "ray.tune.utils.util": ("`callbacks.on_step_begin` operation took",),
}


def check_reachable(address: str, timeout: float = 5.0) -> None:
    """A ``host:port`` (or ``ray://host:port``) cluster address must accept a connection."""
    target = address.split("://", 1)[-1].rstrip("/")
    if target in ("auto", "local"):
        return
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        raise ClusterError(f"RAY_ADDRESS={address!r} is not host:port (e.g. 10.0.0.5:6379), 'auto' or ray://host:port")
    refused = answers(host, int(port), timeout)
    if refused is not None:
        raise ClusterError(f"RAY_ADDRESS={address}: nothing answers there ({refused.strerror or refused}); start the "
                           "cluster (`python -m platform.cluster up`, or `ray start --head` on this machine) or "
                           "unset RAY_ADDRESS for a local Ray") from None


def answers(host: str, port: int, timeout: float) -> OSError | None:
    """None when ``host:port`` (``[::1]`` too) takes a TCP connection within ``timeout`` seconds, else why not."""
    try:
        with socket.create_connection((host.strip("[]"), port), timeout=timeout):
            return None
    except OSError as exc:
        return exc


def node_hours(since_s: float, until_s: float | None = None) -> dict[str, float]:
    """What the cluster's nodes cost while a sweep ran, from Ray's node table (each node's raylet
    start and end, as the GCS records them, clipped to ``[since_s, until_s]``): nodes seen,
    node-hours (the head included), hours of nodes with GPUs and GPU-hours they offered. A node's
    instance is billed from its launch, minutes of boot and setup earlier (docs/cluster.md, costs)."""
    import ray
    from ray.util.state import list_nodes

    until_s = until_s or time.time()
    gcs = ray.get_runtime_context().gcs_address  # not Ray's guess: several Rays may run on this machine
    totals = {"nodes_seen": 0.0, "node_hours": 0.0, "gpu_node_hours": 0.0,
              "gpu_hours_offered": 0.0}
    for node in list_nodes(address=gcs, detail=True, limit=10_000, raise_on_missing_output=False):
        start = (node.start_time_ms or 0) / 1000
        end = (node.end_time_ms or 0) / 1000 or until_s
        hours = max(0.0, min(end, until_s) - max(start, since_s)) / 3600
        if hours <= 0:
            continue
        gpus = float((node.resources_total or {}).get("GPU", 0))
        totals["nodes_seen"] += 1
        totals["node_hours"] += hours
        if gpus:
            totals["gpu_node_hours"] += hours
            totals["gpu_hours_offered"] += hours * gpus
    return totals


def free_port() -> int:
    """A TCP port nothing listens on now (on any interface)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]
