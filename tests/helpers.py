"""What several test modules share: running the commands as a user does, reading what they wrote
to MLflow, slow reference computations of the losses, and a copy of the repository with an
ingredient added the way ``docs/recipes.md`` says (its own file plus one registry line)."""

from __future__ import annotations

import hashlib
import math
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


# ------------------------------------------------------------------------------------------------
# Running the commands


def run_cli(module: str, *args: str, env: dict | None = None, timeout: int = 600, cwd: Path = ROOT
            ) -> subprocess.CompletedProcess:
    """Run ``python -m platform.<module> ...`` from the repository root, as a user would. A command
    still running after ``timeout`` seconds fails the test with what it printed and where each of
    its threads waits (its stacks, dumped on SIGUSR2), then is stopped as ``kill`` stops it."""
    import signal

    proc = start_cli(module, *args, env=env, cwd=cwd)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGUSR2)
        time.sleep(2)
        proc.terminate()  # SIGTERM: the command closes its runs as on Ctrl-C
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            kill_group(proc)
            out, err = proc.communicate()
        kill_group(proc)
        raise AssertionError(f"`python -m platform.{module} {' '.join(args)}` still ran after {timeout} s; its threads "
                             f"then, and what it printed:\n--- stdout (last 40 lines) ---\n{_tail(out, 40)}\n"
                             f"--- stderr (last 120 lines) ---\n{_tail(err, 120)}") from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _tail(text: str | None, lines: int) -> str:
    return "\n".join((text or "").splitlines()[-lines:])


def run_main(module: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """``platform.<module>.main(argv)`` in this process, as ``python -m`` calls it, for commands
    that start no Ray (the process runtime, errors before Ray): an interpreter start costs ~5 s.
    The result looks like ``run_cli``'s; the environment is restored afterwards."""
    import contextlib
    import importlib
    import io

    import ray

    saved = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update({k: str(v) for k, v in (env or {}).items()})
    out, err = io.StringIO(), io.StringIO()
    try:
        main = importlib.import_module("platform.data.fetch" if module == "data" else f"platform.{module}").main
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(args)) or 0
            except SystemExit as exc:
                code = exc.code
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    assert not ray.is_initialized(), "this command started Ray: test it with run_cli"
    return subprocess.CompletedProcess([module, *args], code, out.getvalue(), err.getvalue())


def start_cli(module: str, *args: str, env: dict | None = None, cwd: Path = ROOT) -> subprocess.Popen:
    """The same command in the background (to be signalled), its output in pipes, in a process
    group of its own (``kill_group`` ends what a killed driver leaves behind)."""
    return subprocess.Popen([sys.executable, "-m", f"platform.{module}", *args], cwd=cwd,
                            env={**os.environ, **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL to the command's process group: it and whatever of its local Ray outlived it."""
    import signal

    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def sets(**values) -> list[str]:
    """``--set key=value`` arguments."""
    return [a for k, v in values.items() for a in ("--set", f"{k}={v}")]


def assert_user_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    """Exit code 2, one 'error:' line on stderr naming the problem, no traceback."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, proc.stderr[-2000:]
    for needle in needles:
        assert needle in lines[0], lines[0]


def corpus_head(corpus: Path, n: int, folder: Path) -> Path:
    """The first ``n`` sentences of ``corpus``, as a corpus file of their own in ``folder``."""
    path = folder / f"first{n}.txt"
    path.write_text("\n".join(corpus.read_text(encoding="utf-8").split("\n")[:n]) + "\n", encoding="utf-8")
    return path


def new_mlflow_db(template: Path, path: Path) -> str:
    """A fresh store at ``path`` (a copy of an empty one); its ``sqlite:///`` URI."""
    shutil.copyfile(template, path)
    return f"sqlite:///{path}"


def wait_for(what: str, condition, timeout: float = 300.0, proc: subprocess.Popen | None = None):
    """Poll ``condition()`` until it returns something true (returned); fail after ``timeout`` or
    when ``proc`` exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        if proc is not None and proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"the command ended (exit {proc.returncode}) before {what}: {err[-3000:]}")
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


class Server:
    """A data mirror (``PLATFORM_DATA_MIRROR``) on ``host``: serves ``files`` with HF-style sha256
    ETags and Range support; ``mode`` injects faults."""

    def __init__(self, files: dict[str, bytes], host: str = "127.0.0.1"):
        self.files, self.mode, self.ranges, self.heads = files, "ok", [], 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_HEAD(self):
                outer.heads += 1
                self.do_GET(head=True)

            def do_GET(self, head=False):
                name = self.path.split("/", 2)[-1]  # the path under the mirror's base
                if name not in outer.files:
                    self.send_error(404)
                    return
                data = outer.files[name]
                start = 0
                if "Range" in self.headers:
                    start = int(self.headers["Range"].split("=")[1].split("-")[0])
                    outer.ranges.append(start)
                if start >= len(data):  # as real servers answer: no body, no checksum
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{len(data)}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = data[start:]
                self.send_response(206 if start else 200)
                etag = hashlib.sha256(data).hexdigest() if outer.mode != "bad_etag" else "0" * 64
                if outer.mode != "no_etag":
                    self.send_header("X-Linked-Etag", f'"{etag}"')
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if head:
                    return
                if outer.mode == "truncate":
                    self.wfile.write(body[: len(body) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer((host, 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}/datasets-for-simcse"

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


# ------------------------------------------------------------------------------------------------
# MLflow


def runs_of(uri: str, experiment: str = "simcse"):
    """``(client, runs)`` of an experiment (no runs when it does not exist)."""
    from mlflow.tracking import MlflowClient

    c = MlflowClient(uri)
    exp = c.get_experiment_by_name(experiment)
    return c, ([] if exp is None else c.search_runs([exp.experiment_id]))


def steps_of(client, run_id: str, key: str) -> list[int]:
    return sorted(m.step for m in client.get_metric_history(run_id, key))


def check_seed_means(parent, seed_runs) -> None:
    """The parent's scores are the seeds' mean and sample std, computed here directly."""
    import pytest

    for task in ["STS12", "STS13", "STS14", "STS15", "STS16", "STSBenchmark", "SICKRelatedness", "avg"]:
        values = [r.data.metrics[f"sts_{task}"] for r in seed_runs]
        assert parent.data.metrics[f"sts_{task}"] == pytest.approx(statistics.mean(values), abs=1e-6)
        assert parent.data.metrics[f"sts_{task}_std"] == pytest.approx(statistics.stdev(values), abs=1e-6)
    devs = [r.data.metrics["best_stsb_dev_spearman"] for r in seed_runs]
    assert parent.data.metrics["best_stsb_dev_spearman"] == pytest.approx(statistics.mean(devs), abs=1e-6)
    assert parent.data.metrics["best_stsb_dev_spearman_std"] == pytest.approx(statistics.stdev(devs), abs=1e-6)


# ------------------------------------------------------------------------------------------------
# Spawned gloo workers


def leave_process_group() -> None:
    """The end of a spawned gloo worker: every rank meets (none leaves while another still uses the
    store), the group goes, and the process exits at once. At interpreter finalization gloo's
    threads can abort the process ('terminate called without an active exception', SIGABRT: seen
    once in a suite run), which spawn reports as a failed worker after its results were saved."""
    import torch.distributed as dist

    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# ------------------------------------------------------------------------------------------------
# Slow references of the losses


def slow_info_nce(z1, z2, tau, negatives=None):
    """Gao et al. (2021) Eq. 1, one term at a time with explicit cosines."""
    def cos(a, b):
        return float(a @ b) / (math.sqrt(float(a @ a)) * math.sqrt(float(b @ b)))

    n = z1.shape[0]
    cols = [z2[j] for j in range(n)] + ([negatives[k] for k in range(negatives.shape[0])] if negatives is not None else [])
    total = 0.0
    for i in range(n):
        num = math.exp(cos(z1[i], z2[i]) / tau)
        den = sum(math.exp(cos(z1[i], c) / tau) for c in cols)
        total += -math.log(num / den)
    return total / n


def slow_hince(z1, z2, z3, t1, t2, w=1.0, valid=None):
    """HiNCE (Cai et al., Eq. 2) term by term with explicit cosines."""
    def cos(a, b):
        return float(a @ b) / (math.sqrt(float(a @ a)) * math.sqrt(float(b @ b)))

    n, total = len(z1), 0.0
    for i in range(n):
        terms = [math.exp(cos(z1[i], z2[j]) / t1) for j in range(n)]
        terms += [(w if j == i else 1.0) * math.exp(cos(z1[i], z3[j]) / t2) for j in range(n) if valid is None or valid[j]]
        total += -math.log(math.exp(cos(z1[i], z2[i]) / t1) / sum(terms))
    return total / n


def slow_neighbourhood_loss(q, p, negs, tau):
    """VaSCL's neighbourhood loss (Zhang et al., Eq. 2) one instance at a time with explicit dot
    products of unit vectors."""
    total = 0.0
    for i in range(len(q)):
        pos = math.exp(float(q[i] @ p[i]) / tau)
        den = pos + sum(math.exp(float(q[i] @ n) / tau) for n in negs[i])
        total += -math.log(pos / den)
    return total / len(q)


def slow_nt_xent(rows, partner, tau):
    """NT-Xent (SimCLR, Eq. 1): row i against every other row, its positive ``partner[i]``."""
    import torch

    total = 0.0
    for i, zi in enumerate(rows):
        sims = [float(torch.nn.functional.cosine_similarity(zi, zj, dim=0)) / tau for zj in rows]
        den = sum(math.exp(v) for j, v in enumerate(sims) if j != i)
        total += -(sims[partner[i]] - math.log(den))
    return total / len(rows)


# ------------------------------------------------------------------------------------------------
# The repository with an ingredient added (docs/recipes.md): its own file plus one registry line


def repo_with_ingredient(folder: Path, module: str, source: str, registry_line: str) -> Path:
    """A copy of the repository's code in ``folder`` with ``methods/<module>.py`` holding
    ``source`` and ``registry_line`` added to ``methods/registry.py``'s list; the commands run
    from it as from the repository (its Ray workers get this copy)."""
    files = subprocess.run(["git", "ls-files", "platform", "methods", "tune_spaces"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.split()
    for rel in files:
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, folder / rel)
    (folder / "methods" / f"{module}.py").write_text(source, encoding="utf-8")
    registry = folder / "methods" / "registry.py"
    text = registry.read_text(encoding="utf-8")
    last = '    "methods.augcse:AugCSE",\n'
    assert last in text, "methods/registry.py no longer ends its list with AugCSE"
    registry.write_text(text.replace(last, last + registry_line.rstrip("\n") + "\n"), encoding="utf-8")
    return folder


BARRIER_SOURCE = ROOT / "tests" / "barrier.py"


def commits_step(snapshot: str | bytes, step: int) -> bool:
    """Whether a Ray Train controller's ``checkpoint_manager_snapshot.json`` (its text) has committed
    the checkpoint of ``step``: a fit resumes from those only. (The points of an evaluation reach
    MLflow live, before the commit: they say nothing of it.) False for a snapshot being written."""
    import json

    try:
        results = json.loads(snapshot)["checkpoint_results"]
    except (ValueError, KeyError, TypeError):
        return False
    return any(r.get("metrics", {}).get("step") == step for r in results)


def release_barrier(folder: Path, kill_held: bool = True) -> None:
    """Let runs past the barrier again; with ``kill_held`` the processes it holds are killed first
    (a driver killed with SIGKILL leaves its local Ray's workers running for a moment: here they
    die with it, as the whole machine would)."""
    import signal

    blocked = folder / "blocked"
    if kill_held and blocked.exists():
        for pid in {int(line) for line in blocked.read_text().split()}:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            wait_for(f"process {pid} to exit", lambda pid=pid: not Path(f"/proc/{pid}").exists() or
                     Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z", timeout=30)
    (folder / "armed").unlink()


def repo_with_barrier(folder: Path) -> Path:
    """The repository with ``aux=barrier`` (``tests/barrier.py``): a run that blocks at a step while
    a file says so, so that a test interrupts it mid-fit, at a known point, every time."""
    return repo_with_ingredient(folder, "barrier", BARRIER_SOURCE.read_text(encoding="utf-8"),
                                '    "methods.barrier:Barrier",')


# ------------------------------------------------------------------------------------------------
# Servers a test starts for real: MLflow's tracking server, PostgreSQL


class MlflowServer:
    """``mlflow server`` on a fixed port over ``backend`` (artifacts in ``base/artifacts``), that
    can be stopped and started again on the same port (a tracking outage). ``account``: basic
    authentication with that admin (``MLFLOW_TRACKING_USERNAME``/``PASSWORD`` values)."""

    def __init__(self, base: Path, backend: str, account: dict | None = None, env: dict | None = None):
        from tests.topology import MLFLOW_SERVER_ENV, free_port

        self.base, self.backend, self.account = Path(base), backend, account
        self.port, self.proc = free_port(), None
        self.env = {**os.environ, **MLFLOW_SERVER_ENV, **(env or {})}
        self.base.mkdir(parents=True, exist_ok=True)

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 120) -> "MlflowServer":
        import secrets
        import urllib.request

        args = []
        env = dict(self.env)
        if self.account:
            from platform.cluster import write_mlflow_auth

            # As cluster.yaml's head: the accounts in the tracking database when it is a server's.
            auth = write_mlflow_auth(self.base / "basic_auth.ini", self.account["MLFLOW_TRACKING_USERNAME"],
                                     self.account["MLFLOW_TRACKING_PASSWORD"], self.backend)
            args = ["--app-name", "basic-auth"]
            env.update({"MLFLOW_AUTH_CONFIG_PATH": str(auth), "MLFLOW_FLASK_SERVER_SECRET_KEY": secrets.token_hex(16)})
        log = open(self.base / "server.log", "a")
        self.proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "mlflow"), "server", *args, "--host", "127.0.0.1", "--port", str(self.port),
             "--workers", "1", "--backend-store-uri", self.backend, "--artifacts-destination", (self.base / "artifacts").as_uri()],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(self.uri + "/health", timeout=2):
                    return self
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"mlflow server did not start: {(self.base / 'server.log').read_text()[-2000:]}") from None
                time.sleep(0.5)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            import signal

            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=30)
        self.proc = None


class Postgres:
    """A PostgreSQL server of Debian's ``postgresql`` package on a temporary folder and a free port,
    password-protected (``password``); as root, its processes run as the ``postgres`` user, in a
    folder of the system's temporary directory it can reach (pytest's are root's alone)."""

    def __init__(self, user: str = "mlflow", password: str = "pg-pass-for-tests"):
        import glob
        import tempfile

        from tests.topology import free_port

        self.base, self.user, self.password, self.port = Path(tempfile.mkdtemp(prefix="pg-")), user, password, free_port()
        found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
        self.bin = Path(found[-1]).parent if found else Path(shutil.which("initdb") or "initdb").parent
        self.data = self.base / "data"

    def available(self) -> str | None:
        return None if (self.bin / "initdb").exists() else "PostgreSQL's initdb is not installed (apt install postgresql)"

    def _run(self, *args: str) -> None:
        prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        subprocess.run([*prefix, *args], check=True, capture_output=True, text=True,
                       env={**os.environ, "PGPASSWORD": self.password})

    def start(self) -> "Postgres":
        self.base.mkdir(parents=True, exist_ok=True)
        pwfile = self.base / "pw"
        pwfile.write_text(self.password + "\n")
        if os.geteuid() == 0:
            shutil.chown(self.base, "postgres")
            shutil.chown(pwfile, "postgres")
        self._run(str(self.bin / "initdb"), "-D", str(self.data), "-U", self.user, "--auth=scram-sha-256",
                  f"--pwfile={pwfile}", "--no-sync")
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.base / "log"), "-w", "start",
                  "-o", f"-p {self.port} -k {self.base} -c listen_addresses=127.0.0.1")
        self._run(str(self.bin / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", self.user, "mlflow")
        return self

    @property
    def uri(self) -> str:
        """Without the password: it goes in ``PGPASSWORD``, as the platform requires."""
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/mlflow"

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")
        shutil.rmtree(self.base, ignore_errors=True)


class RayHead:
    """``ray start --head --block`` on this machine, as a user (or ``cluster.yaml``) starts one: in
    its own Ray temp folder (``tmp``, where ``ray start`` records the machine's cluster), with
    ``env`` added to the environment its jobs' drivers and workers inherit. Stopped by its process
    group and the processes that name its GCS port, never by ``ray stop`` (which would end every
    Ray on the machine)."""

    def __init__(self, tmp: Path, env: dict | None = None, args: list[str] | None = None):
        from tests.topology import free_port

        self.tmp, self.args = Path(tmp), list(args or [])
        self.port, self.dashboard_port = free_port(), free_port()
        # Ports Ray otherwise fixes (52365, 10001): a second head on this machine could not start its agent.
        self.agent_port, self.client_port = free_port(), free_port()
        bin_dir = str(Path(sys.executable).parent)  # a job's `python` is the venv's, as on the cluster's nodes
        self.env = {**os.environ, "RAY_TMPDIR": str(self.tmp), "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}",
                    **(env or {})}
        self.env.pop("RAY_ADDRESS", None)
        self.proc = None

    @property
    def dashboard(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    def start(self, timeout: float = 120) -> "RayHead":
        import json
        import urllib.request

        from tests.topology import STARTING_NICE, autogroup_nice

        self.tmp.mkdir(parents=True, exist_ok=True)
        log = open(self.tmp / "head.log", "w")
        self.proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "ray"), "start", "--head", "--block", "--port", str(self.port),
             "--dashboard-host", "127.0.0.1", "--dashboard-port", str(self.dashboard_port), "--disable-usage-stats",
             "--dashboard-agent-listen-port", str(self.agent_port), "--ray-client-server-port", str(self.client_port),
             *self.args], env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        autogroup_nice(self.proc.pid, STARTING_NICE)  # Ray's 30 s for its raylet, on shared cores (tests/topology.py)

        def up() -> bool:
            """The dashboard answers and the head's raylet has registered (an ALIVE node)."""
            if self.proc.poll() is not None:
                raise AssertionError(f"ray start --head exited: {(self.tmp / 'head.log').read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(self.dashboard + "/api/v0/nodes", timeout=5) as resp:
                    nodes = json.loads(resp.read())["data"]["result"]["result"]
            except (OSError, ValueError, KeyError):
                return False
            return any(n.get("state") == "ALIVE" for n in nodes)

        wait_for("the Ray head", up, timeout=timeout)
        autogroup_nice(self.proc.pid, 0)
        return self

    def stop(self) -> None:
        import signal

        from tests.topology import _kill_leftover_ray

        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        _kill_leftover_ray(self.port)
        self.proc = None


def cluster_head(tmp_path_factory, empty_db, name: str, args_for, fake: bool = False,
                 env: dict | None = None) -> RayHead:
    """A head as cluster.yaml starts it: MLFLOW_TRACKING_URI and PLATFORM_DATA_DIR exported before
    ``ray start``, so every driver and job on it inherits them; a HOME of its own, where a job's
    caches go."""
    import tempfile

    base = tmp_path_factory.mktemp(name)
    uri = new_mlflow_db(empty_db, base / "mlflow.db")
    ray_tmp = Path(tempfile.mkdtemp(prefix="rayc-"))  # short: Ray's socket paths live under it
    home = base / "home"
    home.mkdir()
    head_env = {"MLFLOW_TRACKING_URI": uri, "HOME": str(home), "PLATFORM_DATA_DIR": os.environ["PLATFORM_DATA_DIR"],
                **(env or {})}
    if fake:
        head_env["RAY_FAKE_CLUSTER"] = "1"
    head = RayHead(ray_tmp, env=head_env)
    head.args = args_for(head, base)
    head.uri, head.home = uri, home
    return head.start()


def tiny_run_args(tiny_model, small_corpus, output: Path) -> list[str]:
    """A run of a few steps of the tiny model on one worker: what the cluster tests train."""
    return sets(model=tiny_model, corpus=small_corpus, batch_size=8, max_steps=4, eval_steps=2, log_steps=2,
                num_workers=1, use_gpu="false", output_dir=output)


def code_map() -> dict[str, str]:
    """The the Code map (docs/development.md): ``{file: its job}``, from its numbered lines ``N. `file` — job``."""
    import re

    section = (ROOT / "docs" / "development.md").read_text(encoding="utf-8").split("## Code map", 1)[1].split("\n## ", 1)[0]
    items = re.findall(r"^\d+\. `([\w/]+\.py)` — (.+(?:\n   .+)*)", section, flags=re.M)
    return {path: " ".join(job.split()) for path, job in items}


def throwaway_head(tmp_path: Path, rendered: dict, extra_env: dict | None = None) -> tuple[Path, dict]:
    """A HOME laid out as the head's after setup: the image's skeleton ``.bashrc`` and
    ``.profile`` (Debian's, as Ubuntu's: an interactive-only guard near the top), the synced
    repository with its cluster.env, and ``~/venv/bin/python`` (this interpreter). Then the
    rendered setup commands that touch ``~/.bashrc`` and the start commands that write the node's
    environment, run by bash as the launcher runs them (no network, nothing else started).
    ``extra_env``: what the instance itself would give (its role's credentials: an emulator's here)."""
    home = tmp_path / "home"
    (home / "platform").mkdir(parents=True)
    for name in (".bashrc", ".profile"):
        shutil.copy(Path("/etc/skel") / name, home / name)
    for package in ("platform", "methods"):
        (home / "platform" / package).symlink_to(ROOT / package)
    shutil.copy(tmp_path / "cluster.env", home / "platform" / "cluster.env")  # the synced repository's
    (home / "venv" / "bin").mkdir(parents=True)
    python = home / "venv" / "bin" / "python"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    env = {"HOME": str(home), "PATH": "/usr/local/bin:/usr/bin:/bin", "TERM": "dumb", **(extra_env or {})}
    steps = [c for c in rendered["setup_commands"] if ".bashrc" in c or "platform-up.env" in c]
    steps += [c for c in rendered["head_start_ray_commands"] if "platform-up.env" in c or "node-env" in c]
    assert len(steps) >= 4, steps
    for command in steps:
        proc = subprocess.run(["bash", "-c", command], cwd=home, env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, (command, proc.stderr[-2000:])
    return home, env
