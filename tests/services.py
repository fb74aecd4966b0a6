"""Servers a test starts for real: an HTTP file server (a mirror), MLflow's tracking server,
PostgreSQL, a `ray start --head` (and a cluster head over a rendered config)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from tests.helpers import ROOT, new_mlflow_db, wait_for


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


class SlowProxy:
    """An HTTP proxy in front of ``upstream`` that holds every request ``delay`` seconds before it
    forwards it: a tracking server that answers, late (a loaded or distant MLflow)."""

    def __init__(self, upstream: str, delay: float = 2.0):
        import http.client
        from urllib.parse import urlsplit

        target = urlsplit(upstream)
        self.requests = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def forward(self):
                outer.requests += 1
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                time.sleep(delay)
                conn = http.client.HTTPConnection(target.hostname, target.port, timeout=120)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                conn.request(self.command, self.path, body=body or None, headers=headers)
                answer = conn.getresponse()
                data = answer.read()
                self.send_response(answer.status)
                for k, v in answer.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                conn.close()

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = forward

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


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
    steps = [c for c in rendered["head_setup_commands"] if ".bashrc" in c or "platform-up.env" in c]
    steps += [c for c in rendered["head_start_ray_commands"] if "platform-up.env" in c or "node-env" in c]
    assert len(steps) >= 4, steps
    for command in steps:
        proc = subprocess.run(["bash", "-c", command], cwd=home, env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, (command, proc.stderr[-2000:])
    return home, env
