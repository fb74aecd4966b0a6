"""A trial the scheduler stops ends quietly: the sweep's console holds the platform's lines, and
no worker's abort (no "Fatal Python error", no signal report, no stack), even when the stop lands
in the middle of a backward pass. Each step's backward pass here sleeps (``barrier_backward_s``,
``tests/barrier.py``), so ASHA's decision reaches the stopped trial's worker inside one."""

from __future__ import annotations

import re

import pytest

from tests.helpers import ASHA_GRID_SPACE, repo_with_barrier, run_cli, runs_of, sets

ABORT = re.compile(r"SIGABRT|Fatal Python error|Aborted|\*\*\* .* received|Traceback|Stack \(most recent")


@pytest.mark.scenario  # a 2-minute sweep: with the other sweeps, not in the test command
def test_a_trial_stopped_mid_backward_prints_no_abort(tiny_model, small_corpus, tmp_path, mlflow_uri):
    repo = repo_with_barrier(tmp_path / "repo")
    space = tmp_path / "space.yaml"
    space.write_text(ASHA_GRID_SPACE)
    # 16 steps, STS-B dev every 2: ASHA stops the second trial at its second evaluation (it falls
    # far below the first), while its worker trains on through 0.4 s backward passes. No final
    # evaluation: the command ends right after the stop, while the stopped trial's processes end.
    args = sets(model=tiny_model, corpus=small_corpus, batch_size=16, max_steps=16, eval_steps=2, log_steps=1,
                seed=42, num_workers=2, cpus_per_worker=0.5, data_pipeline="local", output_dir=tmp_path / "runs", aux="barrier",
                barrier_dir=tmp_path, barrier_backward_s=0.4, final_eval="false")
    proc = run_cli("tune", "simcse", "--space", str(space), *args, env={"MLFLOW_TRACKING_URI": mlflow_uri}, cwd=repo)
    assert proc.returncode == 0, proc.stderr[-3000:]
    _, runs = runs_of(mlflow_uri, "simcse")
    stopped = [r for r in runs if r.data.tags.get("stopped_by_scheduler") == "true"]
    assert len(stopped) == 1 and stopped[0].info.status == "FINISHED", [r.data.tags for r in runs]
    assert "stopped early by the scheduler" in proc.stdout
    found = [line for line in (proc.stdout + proc.stderr).splitlines() if ABORT.search(line)]
    assert not found, "\n".join(found[:40])
    # Off a terminal the worker's lines are the platform's own, without Ray's coloured prefix.
    assert "\x1b[" not in proc.stdout and "RayTrainWorker pid=" not in proc.stdout, proc.stdout[-2000:]


# Ray's SIGTERM handler raises SystemExit wherever the main thread is; here it is raised from a
# finalizer (a weakref's callback) as when the signal lands in one, beside another error there.
KILLED_IN_A_FINALIZER = """
import weakref
from platform.run.loop import quiet_when_killed

class Thing:
    pass

def raising(exc):
    def callback(_):
        raise exc
    return callback

quiet_when_killed()
quiet_when_killed()  # a second trial in the same actor process
kept = []
for exc in (SystemExit(1), ValueError("a finalizer's own error")):
    thing = Thing()
    kept.append(weakref.ref(thing, raising(exc)))
    del thing
print("went on")
"""


def test_a_kill_that_lands_in_a_finalizer_prints_no_traceback():
    """A trial's actor killed by ASHA's stop (SIGTERM) while its main thread ran a weakref callback
    printed "Exception ignored in ... Traceback ... SystemExit" on the sweep's console. With
    ``quiet_when_killed`` that SystemExit prints nothing; any other error in a finalizer prints."""
    import subprocess
    import sys

    from tests.helpers import ROOT

    proc = subprocess.run([sys.executable, "-c", KILLED_IN_A_FINALIZER], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and "went on" in proc.stdout, proc.stderr[-3000:]
    assert "SystemExit" not in proc.stderr, proc.stderr
    assert "ValueError: a finalizer's own error" in proc.stderr and proc.stderr.count("Traceback") == 1, proc.stderr
