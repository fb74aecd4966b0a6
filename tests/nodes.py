"""Machines that start as a fresh OS image, made on this machine for Ray's cluster launcher.

Each node is a copy-on-write overlay of one Debian image (``debootstrap``, cached in ``IMAGE_DIR``
outside the repository, rebuilt when missing), with its own network namespace on a bridge this
module makes (the only addresses the nodes and this machine reach each other by), its own
process, mount, host-name and IPC namespaces, its own ``/tmp``, ``/run`` and ``/dev/shm``, and an
``sshd`` as its first process: Ray's launcher reaches it over SSH as it reaches a cloud instance.

The image is what an Ubuntu cloud image gives a launcher, on Debian: ``python3`` without
``python3-venv``, ``sudo`` without a password for the ``ubuntu`` account, ``openssh-server``,
``rsync``. ``DIFFERENCES`` lists every way a node differs from a fresh AWS instance.

Needs root (namespaces, mounts, chroot, bridges): ``available()`` says why not where it cannot.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import ipaddress
import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
IMAGE_DIR = Path(os.environ.get("PLATFORM_NODE_IMAGE_DIR", "/var/cache/platform-nodes"))
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
# What an Ubuntu cloud image has that Debian's minimal base lacks (python3-venv left out, as there).
PACKAGES = ("openssh-server", "sudo", "python3", "procps", "iproute2", "ca-certificates", "rsync", "curl")
HOST_TOOLS = {"debootstrap": "debootstrap", "rsync": "rsync", "patchelf": "patchelf", "apt-ftparchive": "apt-utils",
              "ssh": "openssh-client", "ip": "iproute2"}
LOCK = ("requirements/uv.txt", "requirements/torch-cpu.txt", "requirements/cpu.txt")
USER = "ubuntu"
# Inside a node: the offline package sources (read-only binds of this machine's caches).
NODE_WHEELS = "/var/cache/platform-wheels"
NODE_PYTHON = "/var/cache/platform-python"
NODE_DEBS = "/var/lib/platform-debs"

DIFFERENCES = (
    "Debian 12 (bookworm, debootstrap minbase) stands for Ubuntu 22.04; both lack python3-venv and have python3, "
    "sudo, openssh-server and rsync",
    "Ray's on-premise provider (platform.cluster --provider local) launches the nodes, not its AWS provider; "
    "the AWS calls (roles, group, database) are checked on moto by tests/platform/cluster/test_cluster_aws.py",
    "one worker type (Ray's on-premise provider has one); the GPU type's CUDA lock is not installed (no GPU, "
    "and its wheels are 3 GB): its branch of the one worker list runs in tests/platform/cluster/test_cluster_config.py",
    "the nodes reach no registry: apt reads a local source holding python3-venv and its dependencies, pip and uv "
    "read a local folder of the lock's wheels (hash-checked as from PyPI)",
    "uv's Python download (python-build-standalone's CPython 3.11.18, from GitHub) is replaced by this machine's "
    "CPython 3.11 build packed in the same layout, served from a local downloads list (UV_PYTHON_DOWNLOADS_JSON_URL) "
    "under its own release, which cluster.env's NODE_PYTHON names",
    "S3 is moto's server on this machine (AWS_ENDPOINT_URL in cluster.env, ~/.aws on the nodes) and the data "
    "come from a loopback mirror (PLATFORM_DATA_MIRROR)",
    "sshd's PAM session skips pam_loginuid (a namespace cannot set the audit login id)",
    "a node's own name resolves from /etc/hosts, not the VPC's DNS resolver; nothing else resolves",
    "no systemd, cloud-init, apt timers or unattended-upgrades: a process started at boot (APT_BUSY) holds apt's "
    "locks until the node's first apt-get has waited on them, as they do on a fresh Ubuntu",
    "Ray's autoscaler v1 (platform.cluster sets RAY_UP_enable_autoscaler_v2=0 for --provider local: v2 has no "
    "on-premise provider), where ray up on AWS starts v2; v2's reading of the bootstrapped config is checked in "
    "tests/platform/cluster/test_cluster_aws.py, and its launcher's launch, stop and reuse of a worker on the emulator",
    "MLflow's database is SQLite on the head (MLFLOW_DB=head), not the default RDS PostgreSQL whose password the "
    "head reads from SSM through its role (tests/platform/cluster/test_cluster_aws.py and tests/platform/tracking/test_postgres.py check those parts)",
    "the nodes' AWS credentials are static keys in ~/.aws, not the instance profiles' temporary ones over IMDSv2",
    "the image's python3, which only bootstraps uv, is Debian's 3.11, not Ubuntu 22.04's 3.10",
    "no node is stopped and started again (cache_stopped_nodes): Ray's on-premise provider never stops one",
    "one node type, so the head's resources: {CPU: 0, GPU: 0} is not applied: the head offers no CPU because "
    "your own head keeps HEAD_RESERVED_CPUS (4) of its 2 for the driver and MLflow (platform.cluster.render_local)",
    "one address per node, where an AWS node has a public one (the launcher's) and a private one (the cluster's)",
)


def available() -> str | None:
    """None when nodes can be made here, else why not."""
    if os.geteuid() != 0:
        return "fresh-OS nodes need root (namespaces, mounts, chroot, a bridge)"
    why = install_missing(HOST_TOOLS)
    if why:
        return why
    probe = subprocess.run(["unshare", "--mount", "--pid", "--net", "--fork", "--", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"namespaces are not permitted here ({probe.stderr.strip() or probe.returncode})"
    return None


def install_missing(tools: dict[str, str]) -> str | None:
    """Debian's packages for the ``{tool: package}`` not on ``PATH``; None when all are there, else
    why not. The suite's processes install at once on a fresh machine (the boot rehearsal's tools
    beside Slurm's): one at a time under a file lock. Another apt-get's hold on dpkg's lock is
    waited out (``DPkg::Lock::Timeout``, which ``apt-get update``'s lists lock does not honour)."""
    with open("/tmp/platform-tests-apt.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        missing = sorted({pkg for tool, pkg in tools.items() if shutil.which(tool) is None})
        if not missing:
            return None
        wait = "-o DPkg::Lock::Timeout=300"
        proc = subprocess.run(["bash", "-c", f"apt-get {wait} update -qq && DEBIAN_FRONTEND=noninteractive apt-get "
                               f"{wait} install -y -qq {' '.join(missing)}"], capture_output=True, text=True)
    return f"could not install {' '.join(missing)}: {proc.stderr.strip()[-300:]}" if proc.returncode != 0 else None


def _run(*cmd: str, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)[:200]} exited {proc.returncode}: {proc.stderr[-2000:]}")
    return proc


# -- the image and the caches nodes read ----------------------------------------------------------

def image() -> Path:
    """The node image, built once (about a minute and 300 MB)."""
    done = IMAGE_DIR / "image" / ".complete"
    if done.is_file():
        return done.parent
    IMAGE_DIR.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="image.", dir=IMAGE_DIR))
    try:
        _run("debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE, str(tmp), MIRROR)
        _configure(tmp)
        (tmp / ".complete").write_text(f"{SUITE} {' '.join(PACKAGES)}\n")
        shutil.rmtree(IMAGE_DIR / "image", ignore_errors=True)
        tmp.rename(IMAGE_DIR / "image")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return done.parent


def _configure(root: Path) -> None:
    """What cloud-init does on a first boot (the account, its sudo), and the offline sources."""
    chroot = ("chroot", str(root))
    _run(*chroot, "useradd", "--create-home", "--shell", "/bin/bash", "--groups", "sudo", USER)
    (root / "etc/sudoers.d/90-cloud-init-users").write_text(f"{USER} ALL=(ALL) NOPASSWD:ALL\n")
    # python3-venv and what it needs, for this image's versions, as a local package source.
    _run(*chroot, "apt-get", "clean")
    _run(*chroot, "apt-get", "install", "--download-only", "-y", "-qq", "python3-venv")
    debs = root / NODE_DEBS.lstrip("/")
    debs.mkdir(parents=True)
    for deb in (root / "var/cache/apt/archives").glob("*.deb"):
        shutil.move(deb, debs / deb.name)
    (debs / "Packages").write_text(_run("apt-ftparchive", "packages", ".", cwd=debs).stdout)
    for sources in [root / "etc/apt/sources.list", *(root / "etc/apt/sources.list.d").glob("*")]:
        sources.unlink(missing_ok=True)
    (root / "etc/apt/sources.list").write_text(f"deb [trusted=yes] file:{NODE_DEBS} ./\n")
    _run(*chroot, "apt-get", "clean")
    shutil.rmtree(root / "var/lib/apt/lists", ignore_errors=True)
    (root / "var/lib/apt/lists/partial").mkdir(parents=True)
    (root / "etc/pip.conf").write_text(f"[global]\nno-index = true\nfind-links = {NODE_WHEELS}\n")
    (root / "etc/environment").write_text(
        f"UV_PYTHON_DOWNLOADS_JSON_URL=file://{NODE_PYTHON}/downloads.json\nUV_FIND_LINKS={NODE_WHEELS}\nUV_OFFLINE=1\n")
    pam = root / "etc/pam.d/sshd"
    pam.write_text("\n".join(line for line in pam.read_text().splitlines() if "pam_loginuid" not in line) + "\n")
    (root / "run/sshd").mkdir(parents=True, exist_ok=True)


@functools.cache
def _uid() -> int:
    """The node account's user id in the image."""
    return int(_run("chroot", str(image()), "id", "-u", USER).stdout)


def wheels() -> Path:
    """The lock's wheels (and the seed packages uv gives a venv), downloaded once per lock."""
    digest = hashlib.sha256(b"".join((ROOT / f).read_bytes() for f in LOCK)).hexdigest()[:16]
    folder = IMAGE_DIR / f"wheels-{digest}"
    if (folder / ".complete").is_file():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    pip = (sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(folder))
    for lock in LOCK:
        _run(*pip, "--require-hashes", "-r", str(ROOT / lock))
    _run(*pip, "pip", "setuptools", "wheel")
    (folder / ".complete").write_text(digest + "\n")
    return folder


def python_standin(version: str) -> Path:
    """This machine's CPython 3.11 (the interpreter running this) packed as uv's python-build-standalone
    download of ``version``: ``python/install/{bin,lib,include}``, relocatable, without site-packages,
    with a downloads list naming it that uv reads instead of its own."""
    folder = IMAGE_DIR / f"python-{version}"
    if (folder / "downloads.json").is_file():
        return folder
    base = Path(sys.base_prefix)
    minor = f"python{sys.version_info.major}.{sys.version_info.minor}"
    folder.mkdir(parents=True, exist_ok=True)
    archive = folder / "cpython.tar.gz"
    with tempfile.TemporaryDirectory() as tmp:
        install = Path(tmp) / "python" / "install"
        skip = shutil.ignore_patterns("site-packages", "test", "__pycache__", "idlelib", "tkinter")
        shutil.copytree(base / "lib" / minor, install / "lib" / minor, ignore=skip, symlinks=True)
        (install / "lib" / minor / "site-packages").mkdir()
        for lib in (base / "lib").glob("libpython*.so*"):
            shutil.copy2(lib, install / "lib" / lib.name, follow_symlinks=False)
        shutil.copytree(base / "include", install / "include", symlinks=True)
        (install / "bin").mkdir()
        shutil.copy2(base / "bin" / minor, install / "bin" / minor)
        _run("patchelf", "--set-rpath", "$ORIGIN/../lib", str(install / "bin" / minor))
        for name in ("python3", "python"):
            (install / "bin" / name).symlink_to(minor)
        with tarfile.open(archive, "w:gz") as tar:
            tar.add(Path(tmp) / "python", arcname="python")
    major, minor_n, patch = (int(x) for x in version.split("."))
    key = f"cpython-{version}-linux-x86_64-gnu"
    entry = {"name": "cpython", "arch": {"family": "x86_64", "variant": None}, "os": "linux", "libc": "gnu",
             "major": major, "minor": minor_n, "patch": patch, "prerelease": "", "variant": None, "build": "standin",
             "url": f"file://{NODE_PYTHON}/cpython.tar.gz", "sha256": hashlib.sha256(archive.read_bytes()).hexdigest()}
    (folder / "downloads.json").write_text(json.dumps({key: entry}))
    return folder


# -- the network and the nodes --------------------------------------------------------------------

class Network:
    """A bridge on this machine with ``/24`` of addresses for nodes; this machine is ``.1``. A subnet
    outside the private ranges (``198.18.0.0/15``, set aside for tests) puts the nodes where a
    university's machines often are: on addresses MLflow's Host check does not let through unasked."""

    def __init__(self, tag: str, subnet: str = "10.213.7"):
        self.tag, self.subnet = tag, subnet
        self.bridge = f"pbr{tag}"
        self.host = f"{subnet}.1"

    def up(self) -> "Network":
        self._check()
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        _run("ip", "addr", "add", f"{self.host}/24", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        return self

    def down(self) -> None:
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)

    def _check(self) -> None:
        """The subnet shadows nothing this machine reaches: no route of its own already covers it, and
        none of the package registries' addresses is in it (a bridge on it would take their traffic,
        and every install beside the rehearsal would fail)."""
        subnet = ipaddress.ip_network(f"{self.subnet}.0/24")
        routes = subprocess.run(["ip", "-4", "route", "show"], capture_output=True, text=True).stdout.splitlines()
        taken = [r for r in routes if not r.startswith("default") and
                 ipaddress.ip_network(r.split()[0], strict=False).overlaps(subnet)]
        reached = []
        for host in ("deb.debian.org", "pypi.org", "files.pythonhosted.org", "registry.npmjs.org"):
            try:
                reached += [a[4][0] for a in socket.getaddrinfo(host, 80, socket.AF_INET)]
            except OSError:  # not resolvable here: nothing to shadow
                pass
        inside = sorted({a for a in reached if ipaddress.ip_address(a) in subnet})
        if taken or inside:
            raise RuntimeError(f"the rehearsal's subnet {subnet} would shadow {', '.join(taken + inside)}: choose another")


# What a fresh Ubuntu's cloud-init, apt timers and unattended-upgrades do after boot, as a node's
# first process beside sshd: apt's locks held from boot until an apt-get has waited on them 10 s
# (the package lists' lock) and 20 s (dpkg's); what it saw is written to APT_BUSY_LOG.
APT_BUSY_LOG = "/var/log/apt-busy.log"
APT_BUSY = f"""
import fcntl, os, time
def held(*paths):
    files = [open(p, "a") for p in paths]
    for f in files:
        fcntl.lockf(f, fcntl.LOCK_EX)
    return files
def apt_get_running():
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if open(f"/proc/{{pid}}/comm").read().strip() == "apt-get":
                return True
        except OSError:
            pass
lists = held("/var/lib/apt/lists/lock")
dpkg = held("/var/lib/dpkg/lock-frontend", "/var/lib/dpkg/lock")
booted = time.monotonic()
while not apt_get_running():
    time.sleep(0.02)
seen = time.monotonic() - booted
time.sleep(10)
for f in lists: f.close()
time.sleep(10)
for f in dpkg: f.close()
open("{APT_BUSY_LOG}", "w").write(f"apt-get ran {{seen:.0f}} s after boot while apt's locks were held; released 10 and 20 s later\\n")
"""


class Node:
    """One machine: ``start()`` boots it (sshd answering, apt's locks held as ``APT_BUSY`` does),
    ``stop()`` ends every process in it and removes what it wrote."""

    def __init__(self, name: str, number: int, network: Network, base: Path, caches: dict[str, Path],
                 authorized_key: str, files: dict[str, str] | None = None):
        self.name, self.network = name, network
        self.ip = f"{network.subnet}.{number}"
        self.netns = f"p{network.tag}{name}"
        self.veth = f"v{network.tag}{number}"
        self.base = base / name
        self.caches, self.authorized_key, self.files = caches, authorized_key, files or {}
        self.proc: subprocess.Popen | None = None

    @property
    def root(self) -> Path:
        return self.base / "root"

    def _home_file(self, relative: str, text: str, mode: int = 0o644) -> None:
        """A file in the account's home, written into the node's own layer before it boots."""
        path = self.base / "upper" / "home" / USER / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(mode)
        uid = _uid()
        for p in [path, *path.relative_to(self.base / "upper" / "home" / USER).parents]:
            os.chown(self.base / "upper" / "home" / USER / p, uid, uid)

    def start(self, timeout: float = 60) -> "Node":
        for sub in ("upper", "work", "root"):
            (self.base / sub).mkdir(parents=True, exist_ok=True)
        self._home_file(".ssh/authorized_keys", self.authorized_key + "\n", 0o600)
        (self.base / "upper" / "home" / USER / ".ssh").chmod(0o700)
        for relative, text in self.files.items():
            self._home_file(relative, text, 0o600)
        # Names resolve as in a VPC: the node's own, at once (no DNS server answers here; a lookup
        # that waits for one costs Ray's processes seconds each, past ray start's 30 s).
        etc = self.base / "upper" / "etc"
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "hosts").write_text(f"127.0.0.1 localhost\n{self.ip} {self.name}\n")
        (etc / "resolv.conf").write_text("# no resolver: names come from /etc/hosts\n")
        (self.base / "upper" / "usr" / "local" / "sbin").mkdir(parents=True, exist_ok=True)
        (self.base / "upper" / "usr" / "local" / "sbin" / "apt-busy").write_text(APT_BUSY)
        _run("ip", "netns", "add", self.netns)
        _run("ip", "link", "add", self.veth, "type", "veth", "peer", "name", "eth0", "netns", self.netns)
        _run("ip", "link", "set", self.veth, "master", self.network.bridge, "up")
        for cmd in (("addr", "add", f"{self.ip}/24", "dev", "eth0"), ("link", "set", "eth0", "up"),
                    ("link", "set", "lo", "up"), ("route", "add", "default", "via", self.network.host)):
            _run("ip", "-n", self.netns, *cmd)
        binds = "".join(f"mkdir -p {self.root}{inside}; mount --bind {outside} {self.root}{inside}; "
                        f"mount -o remount,bind,ro {self.root}{inside}; " for inside, outside in self.caches.items())
        script = (
            "set -e; mount --make-rprivate /; "
            f"mount -t overlay overlay -o lowerdir={image()},upperdir={self.base}/upper,workdir={self.base}/work {self.root}; "
            f"mount -t proc proc {self.root}/proc; mount -t sysfs sysfs {self.root}/sys; "
            f"mount --rbind /dev {self.root}/dev; mount -t tmpfs -o size=8g tmpfs {self.root}/dev/shm; "
            f"mount -t tmpfs -o mode=1777 tmpfs {self.root}/tmp; mount -t tmpfs -o mode=755 tmpfs {self.root}/run; "
            f"mkdir -p {self.root}/run/sshd; {binds}"
            f"chroot {self.root} python3 /usr/local/sbin/apt-busy > /dev/null 2>&1 & "
            f"hostname {self.name}; exec chroot {self.root} /usr/sbin/sshd -D -e"
        )
        log = open(self.base / "node.log", "w")
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", self.netns, "unshare", "--mount", "--pid", "--uts", "--ipc", "--fork", "--kill-child",
             "--", "sh", "-c", script], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"node {self.name} exited {self.proc.returncode}: {self.log()[-2000:]}")
            probe = subprocess.run(["bash", "-c", f"exec 3<>/dev/tcp/{self.ip}/22"], capture_output=True, timeout=5)
            if probe.returncode == 0:
                return self
            time.sleep(0.5)
        raise TimeoutError(f"node {self.name}'s sshd not answering after {timeout:.0f} s: {self.log()[-2000:]}")

    def log(self) -> str:
        return (self.base / "node.log").read_text(errors="replace") if (self.base / "node.log").is_file() else ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()  # unshare --kill-child: the node's init, so every process in it
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        subprocess.run(["ip", "netns", "del", self.netns], capture_output=True)
        subprocess.run(["ip", "link", "del", self.veth], capture_output=True)
        shutil.rmtree(self.base, ignore_errors=True)


def ssh_key(folder: Path) -> tuple[Path, str]:
    """A fresh key pair: ``(private key path, public key line)``."""
    key = folder / "id_ed25519"
    _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "rehearsal", "-f", str(key))
    return key, (folder / "id_ed25519.pub").read_text().strip()
