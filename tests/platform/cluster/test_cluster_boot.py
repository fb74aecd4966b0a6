"""The boot rehearsal: ``ray up`` as a user runs it, on machines that start as a fresh OS image.

Ray's own launcher (``python -m platform.cluster up --provider local``, which runs ``ray up``)
reaches a head and a worker (``tests/nodes.py``: Debian images, each with its own sshd, network,
process space and ``/tmp``) over SSH and runs every command of cluster.yaml, unmodified and
complete, in its order and wrappers; the head's autoscaler sets the worker up over SSH in turn.
Then the user's path: the data fetched with ``ray exec``, a model copied with ``ray rsync-up``, a
sweep typed into the shell ``ray attach`` opens, a sweep submitted with ``ray job submit`` through
``ray dashboard``'s forward, MLflow through ``platform.cluster tunnel``, ``ray up`` again (a
re-run restarts MLflow and Ray on the head), and ``platform.cluster down``, which backs MLflow's
database up to the bucket first. Every run is on
the head's MLflow server, every checkpoint in the bucket. The head keeps 4 cores for its driver and
MLflow: on a machine of 4 cores or fewer it offers none, so there every trial and the generation
run on the worker.

What differs from AWS is ``tests.nodes.DIFFERENCES`` (and docs/cluster.md, "Not verified here").
These tests need root; where they cannot run they skip with the reason, except under
``PLATFORM_REQUIRE_MULTINODE=1`` (``.ci/run``), where they fail.
"""

from __future__ import annotations

import gzip
import io
import os
import re
import secrets
import shlex
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from tests import nodes
from platform.run.ray_env import free_port
from tests.helpers import ROOT, kill_group, wait_for
from tests.services import Server

pytestmark = pytest.mark.scenario

BUCKET = "platform"
ACCOUNT = {"MLFLOW_TRACKING_USERNAME": "platform",
           # A % in it: MLflow's reader of basic_auth.ini interpolates.
           "MLFLOW_TRACKING_PASSWORD": f"rehearsal-100%-{secrets.token_hex(6)}"}
# The nodes' CPython: this machine's build, packed as uv's download of its own release (tests/nodes.py).
PYTHON = sys.version.split()[0]
SWEEP = " ".join(f"--set {kv}" for kv in ("model={model}", "corpus=$HOME/data/corpus/wiki1m_for_simcse.txt", "batch_size=8",
                                          "max_steps=4", "eval_steps=2", "log_steps=2", "num_workers=1", "use_gpu=false"))


def _copy_of_the_repository(folder: Path) -> Path:
    """The working tree's files (what a user's clone holds), committed, as the launcher syncs it."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        if (ROOT / name).is_file():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, folder / name)
    for cmd in (["init", "-q"], ["add", "-A"], ["-c", "user.name=r", "-c", "user.email=r@r", "commit", "-qm", "copy"]):
        subprocess.run(["git", *cmd], cwd=folder, check=True, capture_output=True)
    return folder


def _mirror_files(data_root: Path) -> dict[str, bytes]:
    """What ``platform.data fetch senteval`` and ``wiki1m`` download: SentEval's layout from the
    shared data, and 2,048 real sentences as the corpus."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(data_root / "downstream", arcname="SentEval/data/downstream")
    with gzip.open(data_root / "corpus" / "wiki1m_for_simcse.first11914.txt.gz", "rt", encoding="utf-8") as f:
        corpus = "".join(line for _, line in zip(range(2048), f))
    return {"senteval.tar": buf.getvalue(), "wiki1m_for_simcse.txt": corpus.encode()}


def _answers(url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(url + "/moto-api/", timeout=2):
            return True
    except OSError:
        return False


class Rehearsal:
    """The machines, the services they reach on this one, and the user's commands."""

    def __init__(self, base: Path, data_root: Path):
        self.base = base
        tag = secrets.token_hex(2)
        # Public-range addresses (not 10.x): the head's MLflow must let their Host header through.
        self.network = nodes.Network(tag, subnet=f"198.18.{int(tag, 16) % 200 + 20}")
        self.repo = _copy_of_the_repository(base / "repo")
        self.rendered = self.repo / ".cluster" / "cluster.yaml"
        self.name = f"rehearsal-{tag}"
        self.procs: list[subprocess.Popen] = []
        self.data_root = data_root
        self.nodes: list[nodes.Node] = []

    @property
    def head(self) -> nodes.Node:
        return self.nodes[0]

    def up(self) -> "Rehearsal":
        self.network.up()
        host = self.network.host
        self.s3_port = free_port()
        s3 = subprocess.Popen([str(Path(sys.executable).with_name("moto_server")), "-H", host, "-p", str(self.s3_port)],
                              stdout=open(self.base / "s3.log", "w"), stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(s3)
        self.s3_url = f"http://{host}:{self.s3_port}"
        wait_for("S3 server", lambda: _answers(self.s3_url), timeout=60)
        self.s3().create_bucket(Bucket=BUCKET)
        self.mirror = Server(_mirror_files(self.data_root), host=host)
        access = {"AWS_ACCESS_KEY_ID": "rehearsal", "AWS_SECRET_ACCESS_KEY": "rehearsal", "AWS_DEFAULT_REGION": "us-east-1"}
        settings = {"CLUSTER_NAME": self.name, **ACCOUNT, "MLFLOW_ARTIFACTS_DESTINATION": f"s3://{BUCKET}/mlflow",
                    "RUNS_URI": f"s3://{BUCKET}/runs", "MLFLOW_DB": "head", "AWS_ENDPOINT_URL": self.s3_url,
                    "MLFLOW_S3_ENDPOINT_URL": self.s3_url, **access, "PLATFORM_DATA_MIRROR": self.mirror.url,
                    "NODE_PYTHON": PYTHON}
        (self.repo / "cluster.env").write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
        aws_config = f"[default]\nregion = us-east-1\nendpoint_url = {self.s3_url}\n"
        aws_credentials = "[default]\naws_access_key_id = rehearsal\naws_secret_access_key = rehearsal\n"
        self.key, public = nodes.ssh_key(self.base)
        caches = {nodes.NODE_WHEELS: nodes.wheels(), nodes.NODE_PYTHON: nodes.python_standin(PYTHON)}
        for number, name in ((2, "head"), (3, "worker")):
            node = nodes.Node(name, number, self.network, self.base / "nodes", caches, public,
                              {".aws/config": aws_config, ".aws/credentials": aws_credentials})
            self.nodes.append(node)
            node.start()
        return self

    def s3(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.s3_url, aws_access_key_id="rehearsal",
                            aws_secret_access_key="rehearsal", region_name="us-east-1")

    def env(self) -> dict[str, str]:
        env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "C": str(self.rendered)}
        for key in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI", "AWS_ENDPOINT_URL", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN"):
            env.pop(key, None)  # a user's laptop has none of the test suite's
        return env

    def run(self, command: str, timeout: float = 1800, stdin: str | None = None) -> subprocess.CompletedProcess:
        """``command`` in a shell in the repository, as the user types it (``$C`` the rendered config)."""
        proc = subprocess.run(["bash", "-c", command], cwd=self.repo, env=self.env(), capture_output=True, text=True,
                              timeout=timeout, input=stdin)
        with open(self.base / "commands.log", "a") as log:
            log.write(f"$ {command}\n[rc {proc.returncode}]\n{proc.stdout}\n{proc.stderr}\n")
        return proc

    def cluster_up(self) -> subprocess.CompletedProcess:
        worker = self.nodes[1].ip
        return self.run(f"python -m platform.cluster up --provider local --head {self.head.ip} --workers {worker} "
                        f"--ssh-user {nodes.USER} --ssh-key {self.key} -y", timeout=2400)

    def on_head(self, command: str, timeout: float = 600) -> subprocess.CompletedProcess:
        return self.run(f"ray exec $C {shlex.quote(command)}", timeout=timeout)

    def alive_nodes(self) -> int:
        """Nodes ``ray status`` on the head lists active or idle (the head is one: Ray's on-premise
        provider has one node type)."""
        status = self.on_head("ray status").stdout
        alive = status.split("Active:", 1)[-1].split("Pending:", 1)[0]
        return sum(int(n) for n in re.findall(r"(\d+) local\.cluster\.node", alive))

    def mlflow(self):
        from mlflow.tracking import MlflowClient

        os.environ.update(ACCOUNT)  # the client reads the account from the environment
        return MlflowClient(f"http://{self.head.ip}:5000")

    def down(self) -> None:
        for proc in self.procs:
            kill_group(proc)
        if getattr(self, "mirror", None):
            self.mirror.stop()
        for node in self.nodes:
            node.stop()
        self.network.down()
        for path in Path("/tmp").glob(f"cluster-{self.name}.*"):  # Ray's on-premise provider's state
            path.unlink(missing_ok=True)
        for key in ACCOUNT:
            os.environ.pop(key, None)


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory, data_root):
    why = nodes.available()
    if why:
        if os.environ.get("PLATFORM_REQUIRE_MULTINODE") == "1":
            pytest.fail(f"the boot rehearsal is required here, but: {why}")
        pytest.skip(why)
    r = Rehearsal(tmp_path_factory.mktemp("boot"), data_root)
    try:
        r.up()
        started = time.monotonic()
        r.booted = r.cluster_up()
        r.boot_s = time.monotonic() - started
        yield r
    finally:
        r.down()


def _log(r) -> str:
    text = (r.base / "commands.log").read_text(errors="replace") if (r.base / "commands.log").is_file() else ""
    return text[-6000:]


def test_ray_up_boots_a_fresh_head_and_its_worker(rehearsal):
    """``ray up`` ends 0 on the fresh head (its python3 lacks python3-venv: the setup installs it,
    waiting for apt's locks that a process holds from boot); the head's autoscaler sets up the worker
    over SSH and it joins; MLflow answers with the account at the head's address, which is outside the
    private ranges MLflow lets through by default (cluster.yaml's ``--allowed-hosts`` names it)."""
    r = rehearsal
    assert r.booted.returncode == 0, _log(r)
    assert "python3-venv" in r.booted.stdout + r.booted.stderr  # the guard fired on the fresh image
    wait_for("the worker to join", lambda: r.alive_nodes() == 2, timeout=1500)
    # Each node's setup met apt's locks held since boot (as cloud-init and apt's timers hold them) and waited.
    for node in r.nodes:
        busy = node.base / "upper" / nodes.APT_BUSY_LOG.lstrip("/")
        assert busy.is_file() and "while apt's locks were held" in busy.read_text(), node.name
    status = r.on_head("ray status").stdout
    # The worker offers every core (nproc: this machine's, which the nodes share); the head keeps
    # HEAD_RESERVED_CPUS for the driver and MLflow and offers the rest (none on a 2-core machine).
    from platform.cluster import HEAD_RESERVED_CPUS

    cores = len(os.sched_getaffinity(0))
    assert f"0.0/{cores + max(cores - HEAD_RESERVED_CPUS, 0)}.0 CPU" in status, status
    assert r.mlflow().search_experiments() is not None
    print(f"ray up: {r.boot_s:.0f} s")


def test_the_data_and_a_model_reach_the_nodes_through_the_launcher(rehearsal, tiny_model):
    r = rehearsal
    fetch = r.run('ray exec $C "cd ~/platform && python -m platform.data fetch senteval --data-dir ~/data && '
                  'python -m platform.data fetch wiki1m --data-dir ~/data"')
    assert fetch.returncode == 0, _log(r)
    copy = r.run(f"ray rsync-up $C {tiny_model}/ /home/{nodes.USER}/tiny-bert/")
    assert copy.returncode == 0, _log(r)
    # Nodes share no disk: a model that is a folder, not a hub name, must be on the machine that
    # trains too (Ray's on-premise launcher knows no workers the head started: the user copies it).
    ssh = f"ssh -i {r.key} -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o IdentitiesOnly=yes"
    copy = r.run(f"rsync -a -e {shlex.quote(ssh)} {tiny_model}/ {nodes.USER}@{r.nodes[1].ip}:tiny-bert/")
    assert copy.returncode == 0, _log(r)
    ls = r.on_head("ls ~/data/downstream/STS ~/tiny-bert")
    assert "STSBenchmark" in ls.stdout and "config.json" in ls.stdout, _log(r)


def test_a_sweep_typed_into_ray_attach_lands_on_the_heads_mlflow_and_the_bucket(rehearsal):
    r = rehearsal
    typed = (f"cd ~/platform && python -m platform.tune una --num-samples 2 "
             f"{SWEEP.format(model='$HOME/tiny-bert')}; echo sweep-exit=$?; exit\n")
    proc = r.run("ray attach $C", stdin=typed, timeout=1800)
    assert "sweep-exit=0" in proc.stdout, _log(r)
    _check_runs(r, "una", trials=2)


def test_a_sweep_submitted_with_ray_job_submit(rehearsal):
    """The README's lines: the token read with ``ray exec`` (its pty's ``\\r`` removed), the
    dashboard forwarded by ``ray dashboard``, ``ray job submit`` from the repository."""
    r = rehearsal
    port = free_port()
    forward = subprocess.Popen(["ray", "dashboard", "-p", str(port), str(r.rendered)], cwd=r.repo, env=r.env(),
                               stdout=open(r.base / "dashboard.log", "w"), stderr=subprocess.STDOUT,
                               start_new_session=True)
    r.procs.append(forward)
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    token = re.search(r"^export RAY_AUTH_MODE=token RAY_AUTH_TOKEN=.*$", text, re.M).group(0)
    submit = re.search(r"^ray job submit .*?(?<!\\)$", text, re.M | re.S).group(0).replace("\\\n", " ")
    submit = submit.replace("http://127.0.0.1:8265", f"http://127.0.0.1:{port}").split(" -- ", 1)[0]
    entry = f"python -m platform.tune simcse --num-samples 1 {SWEEP.format(model=f'/home/{nodes.USER}/tiny-bert')}"
    entry = entry.replace("$HOME", f"/home/{nodes.USER}")
    proc = r.run(f"{token} && {submit} -- {entry}", timeout=1800)
    assert proc.returncode == 0 and "succeeded" in proc.stdout + proc.stderr, _log(r)
    _check_runs(r, "simcse", trials=1)


def test_the_tunnel_reaches_mlflow_on_the_heads_address(rehearsal):
    """``platform.cluster tunnel`` (the docs' way to MLflow's UI): the head's address read with
    ``ray exec`` (its ``\r`` removed), the launcher's key and account, a local port answering."""
    import urllib.request

    r = rehearsal
    port = free_port()
    forward = subprocess.Popen(["python", "-m", "platform.cluster", "tunnel", "--port", str(port)], cwd=r.repo,
                               env=r.env(), stdout=open(r.base / "tunnel.log", "w"), stderr=subprocess.STDOUT,
                               start_new_session=True)
    r.procs.append(forward)

    def health() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as resp:
                return resp.read().strip() == b"OK"
        except OSError:
            return False

    wait_for("MLflow through the tunnel", health, timeout=120)
    assert forward.poll() is None, (r.base / "tunnel.log").read_text()


def test_ray_up_again_restarts_mlflow_and_ray_and_keeps_the_runs(rehearsal):
    """The start commands run again on a live head (every ``ray up`` does): the old MLflow server is
    stopped by its pidfile, not by a pattern that matched the command's own shell, and the new one
    serves the runs. (Ray's on-premise provider forgets the workers its head set up: after this
    the worker stays out until ``down`` and ``up``; docs/cluster.md says so.)"""
    r = rehearsal
    server = "cat ~/mlflow/server.pid"
    old = r.on_head(server).stdout.strip().splitlines()[-1].strip()
    again = r.cluster_up()
    assert again.returncode == 0, _log(r)
    new = r.on_head(server).stdout.strip().splitlines()[-1].strip()
    assert new != old, _log(r)
    # The old server's processes (its session) are gone; the new one's serve (not one that failed to bind).
    sessions = r.on_head(f"echo old=$(pgrep -s {old} | wc -l) new=$(pgrep -s {new} | wc -l)").stdout
    assert re.search(r"old=0 new=[1-9]", sessions), (sessions, _log(r))
    servers = r.on_head("ps -eo args | grep -c '^/home/ubuntu/venv/bin/python[0-9.]* /home/ubuntu/venv/bin/mlflow server'")
    assert servers.stdout.strip().splitlines()[-1].strip() == "1", _log(r)
    _check_runs(r, "una", trials=2)


def _mlflow_on(node: nodes.Node) -> list[str]:
    """The MLflow server processes running in ``node`` (its network namespace's)."""
    found = []
    for pid in subprocess.run(["ip", "netns", "pids", node.netns], capture_output=True, text=True).stdout.split():
        try:
            found += [pid] if b"mlflow server" in Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ") else []
        except OSError:  # ended meanwhile
            pass
    return found


def test_down_backs_the_mlflow_database_up_to_the_bucket_and_stops_mlflow(rehearsal):
    """Your own machines keep running after ``down``: their MLflow server stops with Ray."""
    r = rehearsal
    assert _mlflow_on(r.head)
    proc = r.run("python -m platform.cluster down -y", timeout=900)
    assert proc.returncode == 0, _log(r)
    keys = [o["Key"] for o in r.s3().list_objects_v2(Bucket=BUCKET).get("Contents", [])]
    assert any(k.endswith("mlflow.db") for k in keys), keys
    wait_for("MLflow to stop on the head", lambda: not _mlflow_on(r.head), timeout=90)


def _check_runs(r, experiment: str, trials: int) -> None:
    client = r.mlflow()
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id])
    done = [run for run in runs if run.data.tags.get("trial_id") and run.info.status == "FINISHED"]
    assert len(done) >= trials, [(run.info.run_name, run.info.status) for run in runs]
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=r.repo, capture_output=True, text=True).stdout.strip()
    keys = {o["Key"] for o in r.s3().list_objects_v2(Bucket=BUCKET, Prefix="runs/").get("Contents", [])}
    for run in done:
        assert run.data.tags["git_commit"] == commit
        best = run.data.tags["best_checkpoint"]
        assert best.startswith(f"s3://{BUCKET}/runs/"), best
        assert any(k.startswith(best[len(f"s3://{BUCKET}/"):]) for k in keys), best
