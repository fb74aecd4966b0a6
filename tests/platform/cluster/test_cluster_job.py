"""The README's ``ray job submit`` line (``--working-dir .`` and the commit in ``env_vars``),
submitted to a real ``ray start --head`` on this machine: its run ends FINISHED with that commit,
its caches outside the job's temporary copy; a job that would write into that copy is refused with
one line. (A plain head: the fake provider's nodes of ``tests/platform/cluster/test_cluster_join.py`` share one
session folder on this machine, where each node's runtime-env agent manages the same unpacked job
copies, so a job's copy can vanish under its driver there, never on real nodes.)
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers import ROOT, runs_of, tiny_run_args
from tests.services import cluster_head

pytestmark = pytest.mark.scenario


@pytest.fixture(scope="module")
def job_head(tmp_path_factory, _empty_mlflow_db):
    """A plain ``ray start --head`` with this machine's CPUs."""
    head = cluster_head(tmp_path_factory, _empty_mlflow_db, "job-head", lambda head, base: ["--num-cpus", "2"])
    try:
        yield head
    finally:
        head.stop()
        shutil.rmtree(head.tmp, ignore_errors=True)


def _readme_job_submit() -> str:
    """The README's ``ray job submit`` command up to its entrypoint (``--``), lines joined."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    match = re.search(r"^ray job submit .*?(?<!\\)$", text, re.M | re.S)
    assert match, "README shows no ray job submit command"
    command = match.group(0).replace("\\\n", " ")
    return command.split(" -- ", 1)[0]


def _submit(head, entrypoint: list[str], env_vars: dict | None = None, wait: bool = True) -> subprocess.CompletedProcess:
    command = _readme_job_submit().replace("http://127.0.0.1:8265", head.dashboard)
    assert head.dashboard in command
    if env_vars:  # a job-specific variable beside the README's commit
        command = command.replace('{\\"env_vars\\": {', "{\\\"env_vars\\\": {" + "".join(
            f'\\"{k}\\": \\"{v}\\", ' for k, v in env_vars.items()), 1)
    full = f"{command} {'' if wait else '--no-wait '}-- {shlex.join(entrypoint)}"
    env = {**os.environ, "RAY_TMPDIR": str(head.tmp)}
    for key in ("RAY_ADDRESS", "RAY_OVERRIDE_RUNTIME_ENV_DEFAULT_EXCLUDES"):  # a user's shell has neither
        env.pop(key, None)
    deadline = time.monotonic() + 90
    while True:
        proc = subprocess.run(["bash", "-c", full], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
        # A head just started answers before its job agent registers, and says to try again.
        if "No available agent to submit job" not in proc.stderr or time.monotonic() > deadline:
            return proc
        time.sleep(2)


def test_ray_job_submit_as_the_readme_writes_it(job_head, tiny_model, small_corpus, tmp_path):
    """The job carries the repository (--working-dir .) and the commit (env_vars); the platform
    adds only what the job lacks. Its run ends FINISHED with the submitted commit, and the
    caches it made are in the node's cache folder, not in the job's temporary copy."""
    head = job_head
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    proc = _submit(head, ["python", "-m", "platform.train", "simcse", *tiny_run_args(tiny_model, small_corpus, tmp_path / "runs")])
    assert proc.returncode == 0 and "succeeded" in proc.stdout + proc.stderr, (proc.stdout + proc.stderr)[-4000:]
    assert re.search(r"Ray: job \S+ of the cluster at ", proc.stdout), proc.stdout[-3000:]
    _, runs = runs_of(head.uri, "simcse")
    (run,) = runs
    assert run.info.status == "FINISHED" and run.data.tags["git_commit"] == commit
    assert Path(run.data.tags["best_checkpoint"]).is_relative_to(tmp_path / "runs")
    cache = head.home / ".cache" / "contrastive-platform"
    assert any(cache.iterdir())
    copies = [c for c in head.tmp.glob("ray/session_*/runtime_resources/working_dir_files/_ray_pkg_*") if c.is_dir()]
    # (Empty folders of the submitting checkout travel in the copy; nothing may be written into them.)
    written = [f for c in copies for name in (".cache", "runs", "mlruns") for f in (c / name).rglob("*") if f.is_file()]
    assert copies and not written, written


@pytest.mark.parametrize("entry,env_vars,needle", [
    (["--set", "num_workers=1"], {}, "would be inside the job's temporary copy"),
    (["--set", "output_dir=/tmp"], {"MLFLOW_TRACKING_URI": ""}, "MLFLOW_TRACKING_URI is unset"),
])
def test_a_job_that_would_write_into_its_temporary_copy_is_refused(job_head, entry, env_vars, needle):
    head = job_head
    proc = _submit(head, ["python", "-m", "platform.train", "simcse", *entry], env_vars=env_vars)
    assert proc.returncode != 0
    # Ray's CLI prints the job's log as it runs and again in its failure status: one line, twice.
    errors = sorted({line for line in (proc.stdout + proc.stderr).splitlines() if line.startswith("error: ")})
    assert len(errors) == 1 and needle in errors[0] and "Traceback" not in proc.stdout + proc.stderr, proc.stdout[-3000:]
