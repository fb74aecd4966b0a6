"""A cluster that goes away under a running command (its head killed: the GCS, the raylet and
the Train workers with it): the command ends its MLflow run FAILED and says ``--resume`` in one
line, instead of Ray's "Failed to connect to GCS" abort a minute later with the run left RUNNING.
A command told to stop (SIGTERM) as its cluster goes (Slurm's preemption takes both down) ends its
run KILLED, to be resumed, not FAILED."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from tests.helpers import ROOT, runs_of, sets
from tests.services import cluster_head

pytestmark = pytest.mark.scenario


@pytest.mark.parametrize("stopping", [False, True], ids=["lost", "stopping"])
def test_a_train_whose_cluster_goes_away_ends_failed_in_one_line(stopping, tmp_path_factory, _empty_mlflow_db,
                                                                  tiny_model, small_corpus, tmp_path):
    head = cluster_head(tmp_path_factory, _empty_mlflow_db, "lost-head", lambda head, base: ["--num-cpus", "2"])
    try:
        env = {**os.environ, "RAY_ADDRESS": f"127.0.0.1:{head.port}", "RAY_TMPDIR": str(head.tmp),
               "MLFLOW_TRACKING_URI": head.uri, "PLATFORM_CACHE_DIR": str(tmp_path / "cache")}
        args = sets(model=tiny_model, corpus=small_corpus, batch_size=8, max_steps=100000, eval_steps=2, log_steps=2,
                    num_workers=1, use_gpu="false", output_dir=tmp_path / "runs")
        proc = subprocess.Popen([sys.executable, "-m", "platform.train", "simcse", *args], cwd=ROOT, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        deadline = time.monotonic() + 240
        while True:  # training: its first evaluations are in MLflow
            _, runs = runs_of(head.uri, "simcse")
            if runs and runs[0].data.metrics.get("stsb_dev_spearman") is not None:
                break
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
            time.sleep(1)
        lost_at = time.monotonic()
        if stopping:
            proc.send_signal(signal.SIGTERM)
        head.stop()
        out, err = proc.communicate(timeout=180)
        took = time.monotonic() - lost_at
    finally:
        head.stop()
        shutil.rmtree(head.tmp, ignore_errors=True)
    if stopping:  # the run ended KILLED, by the interrupt or by the lost cluster's watch, whichever came first
        assert proc.returncode == 130 and "Traceback" not in err, (proc.returncode, err[-3000:])
        assert took < 45, took
        _, runs = runs_of(head.uri, "simcse")
        assert [r.info.status for r in runs] == ["KILLED"], (runs[0].data.tags, err[-3000:])
        return
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert proc.returncode == 2 and len(errors) == 1 and "Traceback" not in err, (proc.returncode, err[-3000:])
    assert "went away" in errors[0] and "--resume" in errors[0], errors[0]
    assert took < 45, took  # before Ray's own abort (60 s without its GCS)
    _, runs = runs_of(head.uri, "simcse")
    assert [r.info.status for r in runs] == ["FAILED"]
    assert runs[0].data.tags.get("platform.end_reason", "").startswith("the Ray cluster"), runs[0].data.tags
