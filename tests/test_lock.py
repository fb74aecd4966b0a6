"""The lock every Python of the project installs from (requirements/, made by
requirements/update.sh): the README's venv and CI (torch-cpu.txt, cpu.txt), the cluster's head
(the same) and its GPU workers (cuda.txt), all for the one interpreter the nodes state in
cluster.yaml. A lock that cannot install there fails here, not at a node's setup."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from tests.helpers import ROOT

LOCKS = ROOT / "requirements"
NODE = {**default_environment(), "python_version": "3.11", "python_full_version": "3.11.18", "sys_platform": "linux",
        "platform_system": "Linux", "platform_machine": "x86_64", "implementation_name": "cpython"}


def pins(path: Path) -> dict[str, tuple[str, list[str]]]:
    """``{name: (version, hashes)}`` of a hashed requirements file."""
    text = path.read_text(encoding="utf-8").replace("\\\n", " ")
    found = {}
    for line in text.splitlines():
        match = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)(.*)$", line)
        if match:
            found[canonicalize_name(match[1])] = (match[2], re.findall(r"--hash=sha256:([0-9a-f]{64})", match[3]))
    return found


def _node_python() -> str:
    versions = set(re.findall(r"--python (3\.\d+\.\d+)", (ROOT / "cluster.yaml").read_text(encoding="utf-8")))
    assert len(versions) == 1, versions
    return versions.pop()


def test_the_locks_pin_one_set_with_hashes_and_name_torchs_builds():
    cpu, cuda, torch_cpu, uv = (pins(LOCKS / f) for f in ("cpu.txt", "cuda.txt", "torch-cpu.txt", "uv.txt"))
    for lock in (cpu, cuda, torch_cpu, uv):
        assert lock and all(hashes for _, hashes in lock.values())
    assert cpu["torch"][0].endswith("+cpu") and "+" not in cuda["torch"][0]
    assert cpu["torch"][0].split("+")[0] == cuda["torch"][0]
    assert torch_cpu == {"torch": cpu["torch"]} and "--find-links https://download.pytorch.org/whl/torch/" in (
        LOCKS / "torch-cpu.txt").read_text()
    assert "--find-links" not in (LOCKS / "cpu.txt").read_text()  # pip would ask it for every project
    shared = (set(cpu) & set(cuda)) - {"torch"}
    assert {n: (cpu[n][0], cuda[n][0]) for n in shared if cpu[n][0] != cuda[n][0]} == {}
    assert not any(n.startswith("nvidia-c") for n in cpu)  # no CUDA libraries on the head or in CI
    assert uv == {"uv": cpu["uv"]}


def test_the_locks_satisfy_pyproject_and_the_nodes_python():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    python = _node_python()
    assert python.startswith("3.11.") and SpecifierSet(project["requires-python"]).contains(python)
    for lock_name, wanted in (("cpu.txt", project["dependencies"] + project["optional-dependencies"]["dev"]),
                              ("cuda.txt", project["dependencies"])):
        lock = pins(LOCKS / lock_name)
        for line in wanted:
            req = Requirement(line)
            if req.marker and not req.marker.evaluate(NODE):
                continue
            name = canonicalize_name(req.name)
            assert name in lock, f"{lock_name} lacks {name}: run bash requirements/update.sh"
            assert req.specifier.contains(lock[name][0], prereleases=True), (lock_name, line, lock[name][0])


def test_this_python_runs_what_the_lock_installs():
    """The suite's own environment is the README's install from the lock (CI makes it so)."""
    wrong = {}
    for name, (version, _) in pins(LOCKS / "cpu.txt").items():
        try:
            have = metadata.version(name)
        except metadata.PackageNotFoundError:
            have = None
        if have != version and name not in ("pip", "setuptools"):
            wrong[name] = (version, have)
    assert wrong == {}, f"installed differs from requirements/cpu.txt (locked, installed): {wrong}"


def _dry_run(python_version: str) -> subprocess.CompletedProcess:
    uv = Path(sys.executable).parent / "uv"
    return subprocess.run([str(uv), "pip", "install", "--dry-run", "--no-config", "--python-version", python_version,
                           "--python-platform", "x86_64-manylinux_2_28", "--require-hashes", "--target",
                           "/nonexistent-dry-run", "-r", str(LOCKS / "cuda.txt")], capture_output=True, text=True,
                          timeout=300)


@pytest.mark.e2e
def test_the_gpu_workers_lock_resolves_for_the_nodes_python_and_not_for_the_images():
    """uv resolves cuda.txt from PyPI, as a GPU worker's setup installs it, for the Python the nodes
    state (wheels for CPython 3.11 on manylinux x86_64, every dependency pinned with its hashes);
    for Ubuntu 22.04's own python3 (3.10) it does not, which is why the nodes state theirs.
    (cpu.txt is what this suite's own environment was installed from.)"""
    ok = _dry_run(_node_python())
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert re.search(r"Would install \d+ packages", ok.stderr + ok.stdout), ok.stderr[-2000:]
    old = _dry_run("3.10")
    assert old.returncode != 0 and "No solution found" in old.stderr, old.stderr[-2000:]
