"""A real Slurm on this machine: Debian's ``slurmctld`` here and one ``slurmd`` in each of two node
namespaces, with ``munge`` for their authentication.

Each node has its own network namespace on a bridge (``tests/nodes.py``'s ``Network``), its own
process, mount and host-name namespaces, its own ``/tmp`` and ``/dev/shm`` (its local disk) and a
hosts file naming every node; the rest of this machine's filesystem is what every node shares (a
site's NFS home and project folders). ``DIFFERENCES`` lists every way this differs from a site's Slurm.

Needs root (namespaces, mounts, bridges) and Debian's ``slurm-wlm`` and ``munge``, which
``available()`` installs where they are missing.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from tests.nodes import Network, install_missing

PACKAGES = {"slurmctld": "slurm-wlm", "slurmd": "slurm-wlm", "munged": "munge"}
DIFFERENCES = (
    "Slurm 22.05 (Debian 12's slurm-wlm); sites run 22.05 to 25.x",
    "no cgroups: proctrack/linuxproc and task/none, so a job's processes are found by their parents and "
    "nothing confines a task to its CPUs or memory",
    "no GRES: --gpus-per-node is rendered into the script but no GPU is given (CUDA_VISIBLE_DEVICES unset)",
    "one munge key made by Debian's package on this machine, shared by the controller and both nodes",
    "accounting off (no slurmdbd): sacct and fair share are not there",
    "jobs run as root, the account that submits them here; a site runs them as the user",
    "the shared filesystem is this machine's own disk seen from both nodes, not NFS (no attribute caching "
    "or locking differences); each node's /tmp and /dev/shm are its own",
    "both nodes share this machine's 2 cores (each offers the CPUs the test names, 3 in the sweep's rehearsal) and its "
    "memory (each says it has what the test names)",
    "the nodes' addresses are on a bridge of this machine; the sweep's rehearsal gives them addresses in 198.18.7.0/24 "
    "(of the benchmarking range 198.18.0.0/15), outside the private ranges, as a university's public node addresses "
    "are; a subnet that holds an address this machine reaches (the package registries') or has a route is refused",
    "a node can be made slow to start Ray (slow_ray: its ray command sleeps first), so that a job is seen to "
    "wait for every node; a site's nodes are slow by chance",
    "the walltime warning is sent with scancel --signal=USR1 --batch, as Slurm's --signal=B:USR1 sends it, "
    "not by waiting for the time limit",
    "no container runtime: Apptainer and pyxis cannot be installed here, so apptainer is a stand-in that checks "
    "the call and its mounts and runs the process on the host, and pyxis is shown only refused",
)


def available() -> str | None:
    """None when a Slurm can be started here, else why not."""
    if os.geteuid() != 0:
        return "a Slurm with node namespaces needs root"
    return install_missing(PACKAGES)


class Slurm:
    """A controller on this machine and ``nodes`` slurmd nodes of ``cpus`` CPUs each, in one partition."""

    def __init__(self, base: Path, nodes: int = 2, cpus: int = 2, tag: str = "s", subnet: str = "10.213.9",
                 slow_ray: dict[str, float] | None = None, memory_mb: int | None = None):
        """``slow_ray``: node -> seconds its ``ray`` command waits before it starts (a slow node: a
        cold shared filesystem, a busy machine), so that a job's first Ray node is up well before it."""
        self.base = Path(base)
        self.slow_ray = dict(slow_ray or {})
        self.network = Network(tag, subnet)
        self.subnet = subnet
        self.names = [f"n{i}" for i in range(1, nodes + 1)]
        self.ips = {name: f"{subnet}.{i + 2}" for i, name in enumerate(self.names)}  # .1 is this machine
        self.cpus, self.tag, self.memory_mb = cpus, tag, memory_mb
        self.conf = self.base / "slurm.conf"
        self.procs: dict[str, subprocess.Popen] = {}
        self.munged_pid: int | None = None

    @property
    def env(self) -> dict[str, str]:
        """What a login shell of this cluster has: Slurm's commands find its configuration."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def _write_config(self) -> None:
        host = socket.gethostname().split(".")[0]
        state = self.base / "state"
        state.mkdir(parents=True, exist_ok=True)
        memory = f" RealMemory={self.memory_mb}" if self.memory_mb else ""
        nodes = "\n".join(f"NodeName={n} NodeAddr={ip} CPUs={self.cpus}{memory} State=UNKNOWN" for n, ip in self.ips.items())
        self.conf.write_text(f"""ClusterName=rehearsal
SlurmctldHost={host}({self.network.host})
SlurmUser=root
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
AuthType=auth/munge
StateSaveLocation={state}
SlurmdSpoolDir=/tmp/slurmd
SlurmctldPidFile={self.base}/slurmctld.pid
SlurmdPidFile=/tmp/slurmd.pid
SlurmctldLogFile={self.base}/slurmctld.log
SlurmdLogFile={self.base}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
JobRequeue=1
SlurmdParameters=config_overrides
SlurmdTimeout=300
InactiveLimit=0
KillWait=30
{nodes}
PartitionName=main Nodes={','.join(self.names)} Default=YES MaxTime=INFINITE State=UP
""")
        # Debian's slurmd loads a cgroup plugin even with proctrack/linuxproc; this machine's cgroups are
        # v1 (tmpfs at the mount point), which autodetection misses.
        (self.base / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\nCgroupAutomount=no\n")
        hosts = f"127.0.0.1 localhost\n{self.network.host} {host}\n" + "".join(f"{ip} {n}\n" for n, ip in self.ips.items())
        (self.base / "hosts").write_text(hosts)

    def start(self, timeout: float = 60) -> "Slurm":
        self.base.mkdir(parents=True, exist_ok=True)
        self.network.up()
        self._write_config()
        run_dir = Path("/run/munge")
        run_dir.mkdir(parents=True, exist_ok=True)
        shutil.chown(run_dir, "munge", "munge")
        if subprocess.run(["pgrep", "-x", "munged"], capture_output=True).returncode != 0:
            subprocess.run(["runuser", "-u", "munge", "--", "munged"], check=True)
            self.munged_pid = int(Path("/run/munge/munged.pid").read_text())  # ended by stop(): it started it
        self.procs["slurmctld"] = subprocess.Popen(["slurmctld", "-D", "-f", str(self.conf)], stdout=subprocess.DEVNULL,
                                                   stderr=subprocess.STDOUT, start_new_session=True)
        for name, ip in self.ips.items():
            self._start_node(name, ip)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            out = self.run("sinfo", "-h", "-N", "-o", "%N %T").stdout.split("\n")
            states = dict(line.split() for line in out if line.strip())
            if all(states.get(n, "").rstrip("*") in ("idle", "mixed", "allocated") for n in self.names):
                return self
            time.sleep(1)
        raise TimeoutError(f"the nodes did not come up: {states}; {self.log()[-2000:]}")

    def _start_node(self, name: str, ip: str) -> None:
        netns, veth = f"p{self.tag}{name}", f"v{self.tag}{name}"
        subprocess.run(["ip", "netns", "add", netns], check=True)
        subprocess.run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", netns], check=True)
        subprocess.run(["ip", "link", "set", veth, "master", self.network.bridge, "up"], check=True)
        for cmd in (("addr", "add", f"{ip}/24", "dev", "eth0"), ("link", "set", "eth0", "up"), ("link", "set", "lo", "up"),
                    ("route", "add", "default", "via", self.network.host)):
            subprocess.run(["ip", "-n", netns, *cmd], check=True)
        script = (f"set -e; mount --make-rprivate /; mount -t proc proc /proc; mount -t tmpfs -o mode=1777 tmpfs /tmp; "
                  f"mount -t tmpfs -o size=4g tmpfs /dev/shm; mount --bind {self.base}/hosts /etc/hosts; "
                  f"{self._slow_ray(name)}mkdir -p /tmp/slurmd; hostname {name}; exec slurmd -D -N {name} -f {self.conf}")
        log = open(self.base / f"node-{name}.log", "w")
        self.procs[name] = subprocess.Popen(
            ["ip", "netns", "exec", netns, "unshare", "--mount", "--pid", "--uts", "--fork", "--kill-child", "--",
             "sh", "-c", script], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def _slow_ray(self, name: str) -> str:
        """The node's mount of a ``ray`` that waits ``slow_ray[name]`` seconds first, over the venv's
        own (seen by that node only), as a shell command; nothing for other nodes."""
        if name not in self.slow_ray:
            return ""
        ray = Path(sys.executable).parent / "ray"
        wrapper = self.base / f"ray-{name}"
        wrapper.write_text(f"#!/bin/sh\nsleep {self.slow_ray[name]:g}\nexec {sys.executable} -c 'import sys; "
                           "from ray.scripts.scripts import main; sys.argv[0] = \"ray\"; sys.exit(main())' \"$@\"\n")
        wrapper.chmod(0o755)
        return f"mount --bind {wrapper} {ray}; "

    def run(self, *cmd: str, check: bool = False) -> subprocess.CompletedProcess:
        return subprocess.run(cmd, capture_output=True, text=True, env=self.env, check=check)

    def pids(self, name: str) -> list[int]:
        """The processes in node ``name`` (its network namespace), slurmd's included."""
        out = subprocess.run(["ip", "netns", "pids", f"p{self.tag}{name}"], capture_output=True, text=True).stdout
        return [int(p) for p in out.split()]

    def log(self) -> str:
        return "".join(p.read_text(errors="replace")[-3000:] for p in sorted(self.base.glob("*.log")))

    def stop(self) -> None:
        self.run("scancel", "--full", "--user", "root")
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()  # unshare --kill-child: every process in the node goes with its slurmd
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    pass
        for name in self.names:
            for pid in self.pids(name):
                try:
                    os.kill(pid, 9)
                except ProcessLookupError:
                    pass
            subprocess.run(["ip", "netns", "del", f"p{self.tag}{name}"], capture_output=True)
            subprocess.run(["ip", "link", "del", f"v{self.tag}{name}"], capture_output=True)
        self.network.down()
        if self.munged_pid is not None:
            try:
                os.kill(self.munged_pid, 15)
            except ProcessLookupError:
                pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]
