"""The cluster of ``cluster.yaml`` reproduced on one machine, with nothing shared but the network.

- an S3-compatible object store on 127.0.0.1 (moto's server mode), holding ``output_dir`` and the
  MLflow artifacts;
- an MLflow tracking server (``mlflow server``, SQLite backend, ``--artifacts-destination s3://...``)
  with basic authentication (its own admin account), as ``cluster.yaml`` runs it;
- a Ray head started with ``--num-cpus 0`` (it runs the driver and the trials' coordinators, no
  training work);
- worker nodes, each ``ray start --address ...`` inside its own mount namespace (``unshare
  --mount``) in which the data folder, the repository's ``runs/``, ``mlruns/`` and ``.cache/``, the
  platform cache and the MLflow server's folder are hidden: an empty folder is bound over each, so
  a worker that reads or writes the head's disk finds nothing there (or writes into its own).

Contributors::

    sudo -E python -m tests.topology up        # prints the variables to export, Ctrl-C stops it

``tests/platform/cluster/test_multinode.py`` runs the platform's commands against it (what a sweep took on it:
``benchmarks/results/topology.jsonl``). Mount namespaces need root
(or CAP_SYS_ADMIN): ``available()`` says why they cannot be used where they cannot.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from platform.cluster import write_mlflow_auth
from platform.run.ray_env import free_port

ROOT = Path(__file__).resolve().parent.parent
BUCKET = "platform"
ACCESS = {"AWS_ACCESS_KEY_ID": "topology", "AWS_SECRET_ACCESS_KEY": "topology", "AWS_DEFAULT_REGION": "us-east-1"}


# A killed node is declared dead after ~3 s instead of Ray's default ~15 s (health checks).
FAST_FAILURE_DETECTION = {"RAY_health_check_period_ms": "1000", "RAY_health_check_timeout_ms": "1000",
                          "RAY_health_check_failure_threshold": "3"}


# The MLflow server's job runner (huey consumer processes, for server-side jobs this platform does
# not use) would take CPU from the nodes sharing this machine.
MLFLOW_SERVER_ENV = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


def available() -> str | None:
    """None when a mount namespace with bind mounts can be made here, else why not."""
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "--", "mount", "--bind", "/tmp", "/tmp"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        return f"unshare --mount is not permitted here ({probe.stderr.strip() or probe.returncode})"
    return None


def _bin(name: str) -> str:
    return str(Path(sys.executable).with_name(name))


def _wait(what: str, ok, timeout: float = 60.0, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            if ok():
                return
        except Exception:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{what} not ready after {timeout:.0f} s")


def _http_ok(url: str, token: str | None = None) -> bool:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    with urllib.request.urlopen(request, timeout=2) as resp:
        return resp.status < 400


PLACEMENT_GROUPS = "placement_groups?limit=100&detail=1"


class Topology:
    """Start with ``up()``, stop with ``down()`` (or use as a context manager)."""

    def __init__(self, base: Path | None = None, workers: int = 2, cpus_per_worker: int = 2,
                 hide: list[Path] | None = None):
        self.base = Path(base or tempfile.mkdtemp(prefix="topology-"))
        self.workers, self.cpus_per_worker = workers, cpus_per_worker
        self.s3_port, self.mlflow_port, self.gcs_port, self.dashboard_port = (free_port() for _ in range(4))
        self.mlflow_dir = self.base / "mlflow"
        data = os.environ.get("PLATFORM_DATA_DIR")
        cache = os.environ.get("PLATFORM_CACHE_DIR") or ROOT / ".cache"
        self.hidden = [Path(p).resolve() for p in (hide or [])]
        self.hidden += [ROOT / "runs", ROOT / "mlruns", ROOT / ".cache", Path(cache).resolve(), self.mlflow_dir]
        if data:
            self.hidden.append(Path(data).resolve())
        # A folder inside another hidden one is hidden with it (and could not be mounted over).
        self.hidden = [p for p in dict.fromkeys(self.hidden)
                       if not any(p != q and p.is_relative_to(q) for q in self.hidden)]
        self.procs: dict[str, subprocess.Popen] = {}
        # Ray's token authentication, as a cluster should run: this topology's own token, which
        # every node and driver is given (nothing read from ~/.ray).
        self.ray_token = secrets.token_hex(32)
        # MLflow's basic authentication, as cluster.yaml runs it: this topology's own admin account.
        self.mlflow_account = {"MLFLOW_TRACKING_USERNAME": "platform", "MLFLOW_TRACKING_PASSWORD": secrets.token_urlsafe(18)}

    # -- what clients need ----------------------------------------------------------------------

    @property
    def ray_address(self) -> str:
        return f"127.0.0.1:{self.gcs_port}"

    @property
    def dashboard(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    @property
    def tracking_uri(self) -> str:
        return f"http://127.0.0.1:{self.mlflow_port}"

    @property
    def s3_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.s3_port}"

    def storage(self, prefix: str = "runs") -> str:
        return f"s3://{BUCKET}/{prefix}"

    def s3_env(self) -> dict[str, str]:
        return {**ACCESS, "AWS_ENDPOINT_URL": self.s3_endpoint}

    def s3_client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.s3_endpoint, **_boto(ACCESS))

    def ray_env(self) -> dict[str, str]:
        return {**self.s3_env(), "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": self.ray_token}

    def client_env(self) -> dict[str, str]:
        """What a driver on the head exports (README, "On a cluster")."""
        return {**self.ray_env(), **self.mlflow_account, "RAY_ADDRESS": self.ray_address,
                "MLFLOW_TRACKING_URI": self.tracking_uri}

    # -- start and stop -------------------------------------------------------------------------

    def _start(self, name: str, cmd: list[str], env: dict[str, str]) -> subprocess.Popen:
        log = open(self.base / f"{name}.log", "w")
        proc = subprocess.Popen(cmd, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT, cwd=self.base,
                                start_new_session=True)
        self.procs[name] = proc
        return proc

    def up(self) -> "Topology":
        self.base.mkdir(parents=True, exist_ok=True)
        self.mlflow_dir.mkdir(exist_ok=True)
        try:
            self._up()
        except BaseException:
            self.down()
            raise
        return self

    def _up(self) -> None:
        s3 = self._start("s3", [_bin("moto_server"), "-H", "127.0.0.1", "-p", str(self.s3_port)], {})
        _wait("S3 server", lambda: _http_ok(self.s3_endpoint + "/moto-api/"), proc=s3)
        self.s3_client().create_bucket(Bucket=BUCKET)
        auth = write_mlflow_auth(self.mlflow_dir / "basic_auth.ini", *self.mlflow_account.values())
        mlflow = self._start("mlflow", [
            _bin("mlflow"), "server", "--app-name", "basic-auth", "--host", "127.0.0.1", "--port", str(self.mlflow_port),
            "--workers", "1", "--backend-store-uri", f"sqlite:///{self.mlflow_dir / 'mlflow.db'}",
            "--artifacts-destination", f"s3://{BUCKET}/mlflow",
        ], {**self.s3_env(), "MLFLOW_S3_ENDPOINT_URL": self.s3_endpoint, **MLFLOW_SERVER_ENV,
            "MLFLOW_AUTH_CONFIG_PATH": str(auth), "MLFLOW_FLASK_SERVER_SECRET_KEY": secrets.token_hex(32)})
        _wait("MLflow server", lambda: _http_ok(self.tracking_uri + "/health"), timeout=120, proc=mlflow)
        head = self._start("head", [
            _bin("ray"), "start", "--head", "--block", "--num-cpus", "0", "--num-gpus", "0",
            "--port", str(self.gcs_port), "--dashboard-host", "127.0.0.1", "--dashboard-port", str(self.dashboard_port),
            "--disable-usage-stats",
        ], {**self.ray_env(), **FAST_FAILURE_DETECTION})
        autogroup_nice(head.pid, STARTING_NICE)
        _wait("Ray head", lambda: _http_ok(self.dashboard + "/api/version", self.ray_token), timeout=120, proc=head)
        for i in range(self.workers):  # one at a time: nodes starting together on one machine race for ports
            self.join_worker(i, i + 2)

    # `ray start` gives a node's raylet 30 s to register with the GCS (hard-coded in Ray's Node): on
    # CI's two busy cores a worker once missed it ("The current node timed out during startup") and
    # exited, and every test of the module failed at setup.
    JOIN_ATTEMPTS = 3

    def join_worker(self, i: int, count: int, timeout: float = 120.0) -> None:
        """Start worker ``i`` and wait until ``count`` nodes are alive; a start that exits is tried
        again, up to ``JOIN_ATTEMPTS`` times. The head and the worker start at ``STARTING_NICE`` and
        run at the default priority once the worker has joined."""
        for attempt in range(1, self.JOIN_ATTEMPTS + 1):
            proc = self.start_worker(i)
            autogroup_nice(proc.pid, STARTING_NICE)
            autogroup_nice(self.procs["head"].pid, STARTING_NICE)
            try:
                _wait(f"{count} Ray nodes", lambda: len(self.alive_nodes()) >= count, timeout=timeout, proc=proc)
                for started in (proc, self.procs["head"]):
                    autogroup_nice(started.pid, 0)
                return
            except RuntimeError:  # the start exited: Ray's own timeout, or a port taken meanwhile
                log = (self.base / f"worker{i}.log").read_text(errors="replace").strip().splitlines()
                for pid, _ in processes():  # what it started (its raylet, agents) goes with it: one node per worker
                    if _sid(pid) == proc.pid:
                        try:
                            os.kill(pid, signal.SIGKILL)
                        except OSError:
                            pass
                if attempt == self.JOIN_ATTEMPTS:
                    raise RuntimeError(f"worker{i} did not join in {attempt} starts; its last:\n" + "\n".join(log[-5:])) from None

    def start_worker(self, i: int) -> subprocess.Popen:
        """Worker ``i`` in its own mount namespace; its empty folders are its own disk."""
        binds = []
        for path, empty in self.worker_disks(i).items():
            empty.mkdir(parents=True, exist_ok=True)
            path.mkdir(parents=True, exist_ok=True)
            binds.append(shlex.join(["mount", "--bind", str(empty), str(path)]))
        ray = shlex.join([_bin("ray"), "start", "--block", "--address", self.ray_address,
                        "--num-cpus", str(self.cpus_per_worker), "--num-gpus", "0", "--disable-usage-stats",
                        # Nodes on one machine: each its own range of worker ports.
                        "--min-worker-port", str(20000 + 1000 * i), "--max-worker-port", str(20999 + 1000 * i),
                        "--resources", json.dumps({f"worker{i}": 1})])
        script = " && ".join([*binds, f"exec {ray}"])
        return self._start(f"worker{i}", ["unshare", "--mount", "--propagation", "private", "--", "bash", "-c", script],
                           self.ray_env())

    def worker_disks(self, i: int) -> dict[Path, Path]:
        """Each hidden folder of the head -> the empty folder worker ``i`` sees in its place."""
        return {path: self.base / f"worker{i}" / f"disk{k}" for k, path in enumerate(self.hidden)}

    def _dashboard_get(self, path: str, timeout: float = 5) -> dict:
        request = urllib.request.Request(f"{self.dashboard}/{path}", headers={"Authorization": f"Bearer {self.ray_token}"})
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return json.loads(resp.read())["data"]

    def alive_nodes(self) -> list[dict]:
        summary = self._dashboard_get("nodes?view=summary")["summary"]
        return [n for n in summary if n.get("raylet", {}).get("state") == "ALIVE"]

    def _rows(self, query: str) -> list[dict]:
        """The rows of one of Ray's state API listings (``api/v0/<query>``)."""
        return self._dashboard_get(f"api/v0/{query}", timeout=10)["result"]["result"]

    def state(self) -> str:
        """Ray's view of the cluster (nodes, placement groups, live actors) for a failure message."""
        lines = []
        for kind, query in (("nodes", "nodes?limit=100"), ("placement_groups", PLACEMENT_GROUPS),
                            ("actors", "actors?limit=200&detail=1")):
            try:
                rows = self._rows(query)
            except Exception as exc:  # noqa: BLE001 - a diagnostic never hides the failure it explains
                lines.append(f"{kind}: unreadable ({exc})")
                continue
            keep = ("node_id", "state", "class_name", "name", "resources_total", "bundles", "strategy", "death_cause")
            lines += [f"{kind}: " + json.dumps({k: r[k] for k in keep if r.get(k) not in (None, "", [])}, default=str)[:600]
                      for r in rows if kind != "actors" or r.get("state") != "DEAD"]
        return "\n".join(lines)

    def reserved(self) -> list[dict]:
        """The placement groups that hold (or wait for) resources: neither removed nor done."""
        return [r for r in self._rows(PLACEMENT_GROUPS) if r.get("state") != "REMOVED"]

    def wait_for_nodes(self, count: int, timeout: float = 120.0) -> None:
        _wait(f"{count} Ray nodes", lambda: len(self.alive_nodes()) >= count, timeout=timeout)

    def node_of(self, pid: int) -> int | None:
        """Which worker node a process runs on (by its mount namespace), None for the head."""
        mine = os.readlink(f"/proc/{pid}/ns/mnt")
        for i in range(self.workers):
            try:
                if os.readlink(f"/proc/{self.raylet_pid(i)}/ns/mnt") == mine:
                    return i
            except (LookupError, OSError):
                pass
        return None

    def raylet_pid(self, i: int) -> int:
        """The raylet of worker ``i`` (in its ``ray start --block``'s session)."""
        session = os.getsid(self.procs[f"worker{i}"].pid)
        for pid, cmd in processes():
            if "/raylet" in cmd.split(" ")[0] and _sid(pid) == session:
                return pid
        raise LookupError(f"worker{i} has no raylet")

    def down(self) -> None:
        for name in reversed(list(self.procs)):
            proc = self.procs.pop(name)
            if proc.poll() is None:
                try:
                    # Ray nodes go at once (a SIGTERM'd `ray start --block` drains for 30 s).
                    os.killpg(proc.pid, signal.SIGKILL if name.startswith(("worker", "head")) else signal.SIGTERM)
                    proc.wait(timeout=30)
                except (subprocess.TimeoutExpired, ProcessLookupError):
                    try:
                        os.killpg(proc.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    proc.wait()
        _kill_leftover_ray(self.gcs_port)
        _forget_address(self.gcs_port)

    def __enter__(self) -> "Topology":
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()


# The topology's nodes share this machine's cores with whatever else runs (the suite's other
# process, its Ray instances), where a cluster's nodes have their own. A raylet registers with the
# GCS only once its agents, Python processes importing much of Ray, are up: with the cores shared
# by a dozen sessions (Linux divides CPU time between sessions first: autogroup scheduling), that
# took a CI worker more than Ray's 30 s three times running. While nodes start, their sessions run
# at this nice value (the autogroup's: a process's own nice only weighs within its session).
STARTING_NICE = -10


def autogroup_nice(pid: int, nice: int) -> None:
    """Set the scheduling priority of ``pid``'s session (its autogroup), where the kernel allows it."""
    try:
        Path(f"/proc/{pid}/autogroup").write_text(str(nice))
    except OSError:  # no autogroup scheduling in this kernel, or not root: the default priority
        pass


def _boto(access: dict[str, str]) -> dict[str, str]:
    return {"aws_access_key_id": access["AWS_ACCESS_KEY_ID"], "aws_secret_access_key": access["AWS_SECRET_ACCESS_KEY"],
            "region_name": access["AWS_DEFAULT_REGION"]}


def processes() -> list[tuple[int, str]]:
    """(pid, command line) of every process on this machine, read from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                found.append((int(entry.name), (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")))
            except OSError:
                pass
    return found


def _sid(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:
        return None


def _forget_address(gcs_port: int) -> None:
    """What `ray stop` does after killing its nodes: the file in which `ray start --head` recorded
    this cluster as the machine's current one goes (when it still names this cluster). Left
    behind, Ray's state API in a later job on this machine would ask this dead cluster."""
    from ray._common.utils import get_ray_address_file

    path = Path(get_ray_address_file(None))
    try:
        if path.read_text().strip().endswith(f":{gcs_port}"):
            path.unlink()
    except OSError:
        pass


def _kill_leftover_ray(gcs_port: int) -> None:
    """Ray's processes of this cluster that outlived their ``ray start --block`` (worker processes
    whose raylet was killed by a test), found by the GCS port in their command lines."""
    mark = f":{gcs_port}"
    for pid, cmd in processes():
        if mark in cmd and pid != os.getpid():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def _up(args) -> int:
    with Topology(workers=args.workers) as topo:
        print("topology up; in another shell:")
        for key, value in topo.client_env().items():
            print(f"  export {key}={value}")
        print(f"  python -m platform.tune una --set output_dir={topo.storage()}")
        print(f"logs: {topo.base}; Ctrl-C stops it")
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.topology", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start the topology and wait")
    up.add_argument("--workers", type=int, default=2)
    args = p.parse_args(argv)
    why = available()
    if why:
        print(f"error: {why}", file=sys.stderr)
        return 1
    return _up(args)


if __name__ == "__main__":
    raise SystemExit(main())
